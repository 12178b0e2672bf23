"""Pipeline schedules (parallel.pp_schedule) and Megatron's uneven splits (pp_account_for_*, pp_layout).

Sources: deepseek-ai/DualPipe (dualpipe.py, dualpipev.py step(); the README's table: activation per
device PP + 1 stage micro-batches, parameters 2x for DualPipe); Qi et al. 2023 (ZB-H1, Table 1
M_W = 32sbh of M_B = 34sbh); Megatron-Core get_transformer_layer_offset and
PipelineParallelLayerLayout; Megatron-Bridge's DeepSeek-V3 and Llama-3.1-405B recipes.
"""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from estimator.memory.pipeline import ZB_W_SHARE, in_flight_chunks
from estimator.memory.memory import estimate_config
from estimator.spec.errors import ConfigError
from estimator.spec.parallel import Parallel
from estimator.models.presets import get_architecture, get_recipe
from estimator.speed.operation_table import StageWork
from estimator.speed.roofline import pipeline_bubble_s
from estimator.memory.sharding import layers_per_stage, parse_layout, stage_layer_chunks, stage_parameters


def dualpipe_ops(n: int, k: int, c: int) -> list[tuple]:
    """deepseek-ai/DualPipe dualpipev.py step() for rank k of n with c micro-batches, op by op
    (dualpipe.py is the same with n = p/2, k = min(r, p-1-r), c = m/2): (F, phase), (B, phase, zb), (W,)."""
    ops = [("F", 0)] * (2 * (n - k - 1))
    ops += [("F", 0), ("F", 1)] * (k + 1)
    ops += [("B", 1, True), ("W",), ("F", 1)] * (n - k - 1)
    ops += [("F", 0), ("B", 1, False), ("F", 1), ("B", 0, False)] * (c - 2 * n + k + 1)  # F&B pairs, F first
    ops += [("B", 1, False), ("F", 1), ("B", 0, False)] * (n - k - 1)
    zb = False
    for i in range(k + 1):
        zb = zb or (i == (k + 1) // 2 and k % 2 == 1)
        ops.append(("B", 1, zb))
        zb = zb or (i == (k + 1) // 2 and k % 2 == 0)
        ops.append(("B", 0, zb))
    ops += [("W",), ("B", 0, True)] * (n - k - 1)
    return ops + [("W",)] * (k + 1)


def peak_chunks(ops, share=(1.0, 1.0), w_share=ZB_W_SHARE) -> float:
    """The most chunk activations alive at once; a zero-bubble B leaves w_share until its W."""
    alive = best = 0.0
    deferred = []
    for op in ops:
        if op[0] == "F":
            alive += share[op[1]]
        elif op[0] == "B":
            alive -= share[op[1]] * (1 - w_share if op[2] else 1)
            if op[2]:
                deferred.append(op[1])
        else:
            alive -= share[deferred.pop(0)] * w_share
        best = max(best, alive)
    assert abs(alive) < 1e-9 and not deferred  # every forward freed
    return best


@pytest.mark.parametrize("p", [2, 4, 8, 16])
@pytest.mark.parametrize("factor", [2, 4, 6])
def test_dualpipe_holds_pp_plus_one_stages_on_every_rank(p, factor):
    m = factor * p
    for r in range(p):
        k = min(r, p - 1 - r)
        brute = peak_chunks(dualpipe_ops(p // 2, k, m // 2))
        assert brute == p + 1  # the DualPipe README: PP + 1 stage activations per device
        got = in_flight_chunks(r, Parallel(pp=p, pp_schedule="dualpipe"), m)
        assert got == (p + 1) / 2  # in units of the rank's two stages


@pytest.mark.parametrize("p", [2, 4, 8])
def test_dualpipev_holds_2p_plus_one_half_stages(p):
    for r in range(p):
        assert peak_chunks(dualpipe_ops(p, r, 2 * p)) == 2 * p + 1  # README: PP + 1 with PP = 2 x devices
        assert in_flight_chunks(r, Parallel(pp=p, pp_schedule="dualpipev"), 2 * p) == p + 0.5


def test_unequal_dualpipe_chunks_are_weighed_by_their_layers():
    # DeepSeek-V3 on PP 16 (first stage 4 layers, last 1): rank 0 runs stage 0 (4 layers) in phase 0
    # and stage 15 (1 layer) in phase 1: 16 x 4/5 + 1 x 1/5 = 13 stacks; rank 15 runs them swapped
    par = Parallel(pp=16, pp_first_stage_layers=4, pp_last_stage_layers=1, pp_schedule="dualpipe")
    chunks = stage_layer_chunks(get_architecture("deepseek-v3"), par)
    assert chunks[0] == (range(0, 4), range(60, 61)) and chunks[15] == (range(60, 61), range(0, 4))
    share = (4 / 5, 1 / 5)
    assert peak_chunks(dualpipe_ops(8, 0, 60), share) == pytest.approx(13.0)
    assert in_flight_chunks(0, par, 120, chunks[0]) == pytest.approx(13.0)
    assert in_flight_chunks(15, par, 120, chunks[15]) == pytest.approx(13.0)


def test_zero_bubble_h1_defers_weight_gradients_on_later_ranks():
    par = Parallel(pp=4, pp_schedule="zero_bubble")
    z = 32 / 34  # Qi et al. Table 1: M_W / M_B
    assert [in_flight_chunks(r, par, 8) for r in range(4)] == [4, 3 + z, 2 + 2 * z, 1 + 3 * z]
    assert [in_flight_chunks(r, par, 2) for r in range(4)] == [2, 2, 2, 1 + z]  # only rank 3 reaches its steady state
    assert max(in_flight_chunks(r, par, 8) for r in range(4)) == 4  # 1F1B's peak


def test_dualpipe_doubles_the_parameters_and_shares_a_tied_head():
    arch = get_architecture("llama-3.2-1b")  # 16 layers, tied embeddings
    one = stage_parameters(arch, Parallel(pp=4), "megatron")
    two = stage_parameters(arch, Parallel(pp=4, pp_schedule="dualpipe"), "megatron")
    assert [s.num_layers for s in two] == [8, 8, 8, 8]
    assert two[1].local == one[1].local + one[2].local == 2 * one[1].local
    # rank 0 holds stages 0 and 3 but one embedding matrix: 1F1B's last stage keeps a tied copy
    vocab_rows = arch.vocab_size * arch.hidden_size
    assert two[0].local == one[0].local + one[3].local - vocab_rows
    assert (two[0].first, two[0].last, two[3].first, two[3].last, two[1].first) == (True, True, True, True, False)


def test_dualpipev_puts_both_ends_on_rank_zero():
    arch = get_architecture("llama-3.2-1b")
    par = Parallel(pp=4, pp_schedule="dualpipev")
    assert stage_layer_chunks(arch, par)[0] == (range(0, 2), range(14, 16))
    stages = stage_parameters(arch, par, "megatron")
    assert [(s.first, s.last) for s in stages] == [(True, True), (False, False), (False, False), (False, False)]


def test_llama_405b_pp8_vpp8_accounts_for_embedding_and_loss():
    # Megatron-Core get_transformer_layer_offset: (126 + 2) / (8 x 8) = 2 layers per virtual stage,
    # the first and last one fewer
    arch = get_architecture("llama-3.1-405b")
    par = Parallel(tp=8, pp=8, vpp=8, pp_account_for_embedding=True, pp_account_for_loss=True)
    assert layers_per_stage(arch, par) == [15] + [16] * 6 + [15]
    chunks = stage_layer_chunks(arch, par)
    assert chunks[0][:2] == (range(0, 1), range(15, 17)) and chunks[7][-1] == range(125, 126)
    same = Parallel(tp=8, pp=8, vpp=8, pp_layout="Et|(t*2|)*62,tL")  # the layout string for the same split
    assert stage_layer_chunks(arch, same) == chunks


def test_the_deepseek_layout_string_is_the_first_last_split():
    arch = get_architecture("deepseek-v3")
    layout = Parallel(pp=16, pp_layout="Et*4|(t*4|)*14tmL")  # Megatron-Bridge deepseek_v3 (16, 1)
    uneven = Parallel(pp=16, pp_first_stage_layers=4, pp_last_stage_layers=1)
    assert stage_parameters(arch, layout, "megatron") == stage_parameters(arch, uneven, "megatron")
    assert parse_layout("Et*2|(tt|)*2,mL") == ["Ett", "tt", "tt", "mL"]


@pytest.mark.parametrize("par, field, words", [
    (dict(pp=3, pp_schedule="dualpipe"), "parallel.pp", "an even number"),
    (dict(pp=4, vpp=2, pp_schedule="zero_bubble"), "parallel.pp_schedule", "'interleaved' when vpp > 1"),
    (dict(pp=4, pp_schedule="interleaved"), "parallel.pp_schedule", "or vpp > 1"),
    (dict(pp=1, pp_schedule="dualpipev"), "parallel.pp_schedule", "'1f1b' when pp is 1"),
    (dict(pp=4, pp_account_for_loss=True, pp_first_stage_layers=3), "parallel.pp_account_for_loss", "false when"),
])
def test_bad_layouts_name_the_field(par, field, words):
    with pytest.raises(ConfigError) as e:
        Parallel(**par)
    assert e.value.field == field and words in str(e.value)


@pytest.mark.parametrize("par, field, words", [
    (dict(pp=16, pp_layout="Et*4|(t*4|)*14tL"), "parallel.pp_layout", "1 m (mtp_layers)"),
    (dict(pp=16, pp_layout="Et*4|(t*4|)*13tmL"), "parallel.pp_layout", "16 groups"),
    (dict(pp=16, pp_layout="Et*4|(t*4|)*14tmLx"), "parallel.pp_layout", "unknown symbol 'x'"),
    (dict(pp=16, pp_layout="(t*99999|)*99999"), "parallel.pp_layout", "unrolls past"),
    (dict(pp=16, pp_account_for_embedding=True), "parallel.pp_account_for_embedding", "62 divides by the 16"),
    (dict(pp=16, pp_schedule="dualpipev"), "parallel.pp", "2 x pp divides num_layers (61)"),
])
def test_bad_splits_name_the_field(par, field, words):
    with pytest.raises(ConfigError) as e:
        layers_per_stage(get_architecture("deepseek-v3"), Parallel(**par))
    assert e.value.field == field and words in str(e.value)


def test_dualpipe_needs_twice_pp_micro_batches():
    config = {"model": "llama-3.2-1b", "training": {"global_batch_size": 6},
              "parallel": {"pp": 4, "pp_schedule": "dualpipe"}}
    with pytest.raises(ConfigError) as e:
        estimate_config(config)
    assert e.value.field == "training.global_batch_size" and "at least 2 x pp = 8" in str(e.value)


def test_bubbles_per_schedule():
    # one micro-batch: F = 1 s, B = 2 s (W = 1 s), no recompute; the DualPipe README's formulas
    work = StageWork(0, {}, 1.0, 2.0, 0.0, 0.0)
    assert pipeline_bubble_s(Parallel(pp=4), work) == 3 * 3  # (p-1)(F+B)
    assert pipeline_bubble_s(Parallel(pp=4, pp_schedule="zero_bubble"), work) == 3 * 1  # (p-1)(F+B-2W)
    # DualPipe, p = 8: chunks of F = 0.5, B = 1, W = 0.5: (8/2 - 1)(F&B + B - 3W) = 3 x (1.5 + 1 - 1.5)
    assert pipeline_bubble_s(Parallel(pp=8, pp_schedule="dualpipe"), work) == 3.0
    # DualPipeV on 4 ranks has 8 stages: the same (8/2 - 1) x 1.0
    assert pipeline_bubble_s(Parallel(pp=4, pp_schedule="dualpipev"), work) == 3.0


def test_deepseek_v3_recipe_runs_dualpipe():
    config = get_recipe("deepseek-v3-as-reported").config
    assert config["parallel"]["pp_schedule"] == "dualpipe"
    dual = estimate_config(config)
    one = estimate_config({**config, "parallel": {**config["parallel"], "pp_schedule": "1f1b"}})
    middle, rank1 = dual.stages[1], one.stages[1]
    assert middle.layers == 8 and middle.in_flight_microbatches == 8.5  # stages 1 and 14, (16 + 1) / 2
    assert middle.parameters_per_gpu == one.stages[1].parameters_per_gpu + one.stages[14].parameters_per_gpu
    acts = {c.key: c.bytes for c in middle.components}["activations"]
    one_acts = {c.key: c.bytes for c in rank1.components}["activations"]  # 15 micro-batches of 4 MoE layers
    assert acts == pytest.approx(one_acts * (8.5 * 8) / (15 * 4), abs=2)


def test_cli_takes_the_new_fields(tmp_path):
    path = tmp_path / "c.json"
    path.write_text(json.dumps({"model": "llama-3.2-1b", "parallel": {"pp": 4}}))
    run = [sys.executable, "-m", "estimator", "estimate", "--config", str(path), "--json"]
    root = Path(__file__).parents[1]
    out = subprocess.run(run + ["--pp-schedule", "dualpipev"], capture_output=True, text=True, cwd=root)
    assert out.returncode == 0, out.stderr
    assert [s["in_flight_microbatches"] for s in json.loads(out.stdout)["stages"]] == [4.5] * 4
    bad = subprocess.run(run + ["--pp-schedule", "gpipe"], capture_output=True, text=True, cwd=root)
    assert bad.returncode == 2 and "parallel.pp_schedule" in bad.stderr and "'dualpipe'" in bad.stderr
    layout = subprocess.run(run + ["--pp-layout", "Et*4|(t*4|)*2,t*4L"], capture_output=True, text=True, cwd=root)
    assert layout.returncode == 0, layout.stderr


def test_the_app_takes_the_new_fields_from_the_url():
    from streamlit.testing.v1 import AppTest

    layout = "Et*3|t*5|t*5|t*3L"  # 3, 5, 5, 3 layers where pp 4 alone splits 4 each
    query = {"model": "llama-3.2-1b", "pp": "4", "pp_schedule": "dualpipe", "pp_layout": layout,
             "global_batch_size": "8"}
    at = AppTest.from_file(str(Path(__file__).parents[1] / "app.py"), default_timeout=60)
    for key, value in query.items():
        at.query_params[key] = value
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    assert not at.sidebar.warning, [w.value for w in at.sidebar.warning]
    assert at.selectbox(key="pp_schedule").value == "dualpipe"
    assert at.text_input(key="pp_layout").value == layout

    def shown(parallel):
        est = estimate_config({"model": "llama-3.2-1b", "training": {"global_batch_size": 8},
                               "parallel": {"pp": 4, "pp_schedule": "dualpipe", **parallel}})
        return f"{est.device_total_bytes / 2**30:,.2f} GiB"
    assert shown({"pp_layout": layout}) != shown({})
    assert next(m.value for m in at.metric if m.label == "Device total per GPU") == shown({"pp_layout": layout})
    at.text_input(key="pp_layout").set_value("").run()  # emptied: back to the split pp gives
    assert not at.exception, [e.value for e in at.exception]
    assert next(m.value for m in at.metric if m.label == "Device total per GPU") == shown({})
