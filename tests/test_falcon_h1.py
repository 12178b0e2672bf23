"""Falcon-H1 (issue 28), by hand: every layer runs attention and a Mamba-2 mixer side by side on one norm's output,
then an MLP. The HF mapping, the field checks, the parallel layer's ledger, the measured records (validation/hybrid,
mamba-ssm's fused mixer emulated), the inference state, vLLM's and SGLang's state pages, the roofline, the planner."""

import json
import math
from pathlib import Path

import pytest

from estimator import Architecture, ConfigError, estimate_config
from estimator.models.hf_config import architecture_from_hf_config
from estimator.models.loading import load_config

DATA = Path(__file__).parent / "data"
SEVEN_B = json.loads((DATA / "hf_configs" / "falcon-h1-7b-instruct.json").read_text())
RECORDS = sorted((DATA / "measured").glob("falcon-h1-*.json"))
h, d, n, heads, g = 3072, 3072, 256, 24, 1  # the 7B's hidden size and Mamba-2 mixer


def falcon(**changes) -> Architecture:
    fields = dict(hidden_size=h, num_layers=44, num_attention_heads=12, num_kv_heads=2, head_dim=128,
                  vocab_size=130_049, intermediate_size=12_288, parallel_mamba=True, mamba_num_heads=heads,
                  mamba_head_dim=128, mamba_state_size=n, mamba_num_groups=g, mamba_chunk_size=256)
    return Architecture(**{**fields, **changes})


def test_the_hf_mapping_reads_the_config():
    arch, ignored = architecture_from_hf_config(SEVEN_B)
    assert ignored == [] and arch == falcon(name=arch.name)
    assert arch.kinds == ("attention_mamba",) and arch.is_hybrid and arch.mamba_gated_norm
    # mamba_d_head "auto" is mamba_d_ssm / mamba_n_heads; no mamba_d_ssm: mamba_expand x hidden (FalconH1Config)
    auto, _ = architecture_from_hf_config(dict(SEVEN_B, mamba_d_head="auto"))
    assert auto.mamba_head_dim == 128
    wide, _ = architecture_from_hf_config(dict(SEVEN_B, mamba_d_ssm=None, mamba_d_head="auto", mamba_n_heads=48))
    assert wide.mamba_head_dim * wide.mamba_num_heads == 2 * h
    plain, _ = architecture_from_hf_config(dict(SEVEN_B, mamba_rms_norm=False))
    assert not plain.mamba_gated_norm  # no gated norm: d weights fewer per layer
    from estimator.spec.architecture import parameter_counts
    assert parameter_counts(arch).total - parameter_counts(plain).total == 44 * d


def test_heads_that_do_not_tile_the_width_are_refused():
    with pytest.raises(ConfigError) as caught:
        architecture_from_hf_config(dict(SEVEN_B, mamba_d_head=100))
    assert caught.value.field == "model.mamba_d_head" and "3072 / 24" in str(caught.value)


@pytest.mark.parametrize("changes, field", [
    ({"mamba_num_heads": None}, "model.mamba_num_heads"),
    ({"mamba_num_groups": 5}, "model.mamba_num_groups"),
    ({"num_experts": 8, "num_experts_per_token": 2, "moe_intermediate_size": 1024}, "model.num_experts"),
    ({"full_attention_interval": 4, "linear_num_key_heads": 16, "linear_num_value_heads": 32,
      "linear_key_head_dim": 128, "linear_value_head_dim": 128}, "model.parallel_mamba"),
    ({"sliding_window": 4096}, "model.sliding_window"),
])
def test_checks_name_the_field(changes, field):
    with pytest.raises(ConfigError) as caught:
        falcon(**changes)
    assert caught.value.field == field


def test_the_parallel_layer_by_hand():
    """The mixers of one layer at 4,096 tokens in bf16 (memory/activations/hybrid.py parallel_hybrid_entries), per
    token: the norm's fp32 upcast (4 h), rsqrt (4) and normalised output (2 h); q, k, v's input (the norm's output x
    attention_in_multiplier, 2 h), q, k, v kept by flash (2 x (1,536 + 2 x 256)), its fp32 log-sum-exp (4 x 12 heads)
    and output (2 x 1,536); in_proj's input (the norm's output x ssm_in_multiplier, 2 h), in_proj's output times the
    muP vector (2 x (2 d + 2 g n + H)), the scan output (2 d) and the gated norm's fp32 rstd (4 g)."""
    from estimator.memory.activations.hybrid import parallel_hybrid_entries
    from estimator.spec.parallel import Parallel
    from estimator.spec.training import Training

    per_token = (4 * h + 4 + 2 * h + 2 * h + 2 * (1536 + 2 * 256) + 4 * 12 + 2 * 1536 + 2 * h
                 + 2 * (2 * d + 2 * g * n + heads) + 2 * d + 4 * g)
    entries = parallel_hybrid_entries(falcon(), Training(seq_len=4096, micro_batch_size=1, framework="hf"), Parallel())
    assert sum(e.elements * e.bytes_per_element for e in entries) == 4096 * per_token
    assert per_token == 57_448
    plain = parallel_hybrid_entries(falcon(mamba_gated_norm=False), Training(seq_len=4096, framework="hf"), Parallel())
    assert sum(e.elements * e.bytes_per_element for e in plain) == 4096 * (per_token - 4 * g)  # no rstd


def test_under_megatron_the_mixer_norms_outside_the_kernel():
    """Megatron-Core 0.16.1 ssm/mamba_mixer.py _ssm_training: the fused kernel gates the scan output itself, then
    `self.norm` (with rmsnorm) keeps that output and out_proj the normalised one; without rmsnorm out_proj keeps the
    gated output alone: one (s, H p) tensor fewer, and no rstd either way."""
    from estimator.memory.activations.hybrid import mamba_mixer_entries
    from estimator.spec.parallel import Parallel
    from estimator.spec.training import Training

    training = Training(seq_len=4096, micro_batch_size=1, framework="megatron")

    def total(arch):
        return sum(e.elements * e.bytes_per_element for e in mamba_mixer_entries(arch, training, Parallel(), "input"))

    assert total(falcon()) - total(falcon(mamba_gated_norm=False)) == 4096 * d * 2
    assert total(falcon()) == 4096 * (2 * h + 2 * (2 * d + 2 * g * n + heads) + 3 * 2 * d)


def test_the_records_are_there():
    assert [p.stem for p in RECORDS] == [
        "falcon-h1-0.5b-bf16-adamw-norecompute-sdpa-s4096-b2", "falcon-h1-0.5b-bf16-adamw-recompute-sdpa-s16384-b1",
        "falcon-h1-34b-bf16-adamw-recompute-sdpa-s4096-b1", "falcon-h1-7b-bf16-adamw-norecompute-sdpa-s16384-b1",
        "falcon-h1-7b-bf16-adamw-norecompute-sdpa-s2048-b2", "falcon-h1-7b-bf16-adamw-norecompute-sdpa-s4096-b1",
        "falcon-h1-7b-bf16-adamw-recompute-sdpa-s8192-b1"]


@pytest.mark.parametrize("path", RECORDS, ids=lambda p: p.stem)
def test_the_measured_forward_within_half_a_percent(path):
    """The harness's Falcon-H1 runs (7B from 2,048 x 2 to 16,384 tokens and with full recompute, 34B with full
    recompute, 0.5B, whose mixer has no gated norm, at 4,096 x 2 and 16,384 with recompute): the end of forward, every layer's saved tensors beside the logits and the model states; where the
    step peaks in backward, that peak too."""
    from validation.core.report import GPU_ONLY

    record = json.loads(path.read_text())
    result = estimate_config(record["config"])
    stage = result.stages[result.peak_stage]

    def tensors(phase):  # what a fake-tensor harness sees: no library workspace (validation/core/report.py)
        p = next(p for p in stage.phases if p.name == phase)
        return p.allocated_bytes - sum(c.bytes for c in p.components if c.key in GPU_ONLY)

    assert tensors("forward") == pytest.approx(record["measured"]["phases"]["forward"]["total"], rel=0.005)
    if record["measured"]["peak_phase"] == "backward":
        assert tensors("backward") == pytest.approx(record["measured"]["peak_bytes"], rel=0.005)


def test_inference_keeps_kv_in_every_layer_and_a_constant_state_beside_it():
    def parts(seq):
        config = {"model": "falcon-h1-7b", "training": {"mode": "inference", "seq_len": seq, "micro_batch_size": 8}}
        return {c.key: c.bytes for c in estimate_config(config).stages[0].phases[0].components}

    short, long = parts(32768), parts(65536)
    assert short["kv_cache"] == 2 * 2 * 128 * 32768 * 8 * 44 * 2  # every layer attends: 2 KV heads of 128
    # per layer and sequence (vLLM mamba2_state_shape): conv 3 x (d + 2 g n) and state H x p x n, both in bf16
    # (falcon_h1.py: mamba_ssm_cache_dtype "auto" is the model's dtype)
    assert short["recurrent_state"] == long["recurrent_state"] == 8 * 44 * (3 * (d + 2 * g * n) + heads * 128 * n) * 2
    assert short["recurrent_state"] == 561_217_536
    assert long["kv_cache"] == 2 * short["kv_cache"]


def test_vllm_registers_an_attention_and_a_state_page_per_layer():
    """One token's attention page is 2 x 2 KV heads x 128 x 2 B = 1 KiB; a state page (3 x 3,584 + 24 x 128 x 256)
    x 2 B = 1,594,368 B, so the block is 16 x cdiv(1,594,368, 16 KiB) = 1,568 tokens. 44 attention layers and 44
    Mamba layers make one group each; 8,192 tokens take cdiv(8192, 1568) = 6 attention blocks and one state block."""
    from estimator.serving.kv_cache import kv_groups, layer_specs
    from estimator.serving.service import serving_config

    def serve(max_model_len, tp=1):
        return serving_config(load_config({"model": "falcon-h1-7b", "parallel": {"tp": tp},
                                           "serving": {"engine": "vllm", "max_model_len": max_model_len,
                                                       "prefix_caching": False}}))  # no aligned state pages

    result = serve(8192)
    assert result.resolved.block_size == 16 * math.ceil((3 * 3584 + 24 * 128 * 256) * 2 / (16 * 1024)) == 1568
    assert result.capacity.blocks_per_request == 6 + 1
    assert serve(32768).capacity.blocks_per_request == 21 + 1
    groups = kv_groups(layer_specs(falcon(), 1, 1568, 2), (0, 11))
    assert [(spec.kind, len(idx)) for spec, idx in groups.members] == [("full", 44), ("recurrent", 44)]
    assert groups.block_bytes_on(range(44)) == 44 * 1568 * 1024


def test_vllm_011s_own_accounting_of_the_two_caches():
    """validation/vllm/kv_records.py runs vLLM 0.11's get_kv_cache_configs on CPU over 44 FullAttentionSpecs and 44
    MambaSpecs (vLLM's state calculators, the page padded to the attention page) with the memory our estimate
    leaves: the blocks, tokens and concurrency are ours exactly, and so is the block size its hybrid rule gives."""
    from estimator.serving.service import serving_config

    data = json.loads((DATA / "serving" / "vllm-0.11.0.json").read_text())
    records = [r for r in data["records"] if r["case"]["model"] == "falcon-h1-7b"]
    assert len(records) == 2 and "--append-hybrid" in data["hybrid_command"]
    for r in records:
        case = r["case"]
        ours = serving_config(load_config({"model": "falcon-h1-7b", "parallel": {"tp": case["tp"]},
                                           "serving": dict(case["serving"], engine="vllm")}))
        assert ours.resolved.block_size == r["vllm"]["block_size"] == r["given"]["block_size"] == 1568
        assert r["vllm"]["num_groups"] == 2
        assert (ours.capacity.num_blocks, ours.capacity.tokens) == (r["vllm"]["num_blocks"], r["vllm"]["kv_cache_tokens"])
        assert ours.capacity.max_concurrency == pytest.approx(r["vllm"]["max_concurrency"], rel=1e-12)


def test_sglang_keeps_a_state_slot_of_every_layer():
    """SGLang 0.5.23 configs/falcon_h1.py: attention and Mamba on every layer; the conv state in bf16, the SSM state
    in fp32 (mamba_utils.mamba2_state_dtype's default)."""
    from estimator.serving.service import serving_config

    result = serving_config(load_config({"model": "falcon-h1-7b", "serving": {"engine": "sglang"}}))
    pool = next(c for c in result.stages[0].components if c.key == "recurrent_state")
    per_slot = 44 * (3 * 3584 * 2 + 24 * 128 * 256 * 4)
    assert per_slot == 139_358_208 and f"x {per_slot:,} B per slot" in pool.formula_text


def test_the_roofline_attends_and_scans_in_every_layer():
    from estimator.speed.roofline import roofline_config

    ops = roofline_config(load_config({"model": "falcon-h1-7b", "training": {"framework": "hf",
                                                                             "seq_len": 4096}})).operations
    core = [op for op in ops if op.name.startswith("attention core") and op.phase == "forward"]
    scans = [op for op in ops if op.name.startswith("chunked SSD scan") and op.phase == "forward"]
    assert core and scans and all(op.count == 44 for op in core + scans)
    assert not [op for op in ops if op.name == "Mamba norm"]  # the mixer reads the attention's norm
    assert all(op.flops == 4096 * 2 * (g * 256 * n + heads * (256 * 128 + 2 * n * 128)) for op in scans)


def test_the_planner_and_the_default_estimate_answer():
    from estimator.search.planner import plan

    cfg = load_config({"model": "falcon-h1-7b", "training": {"framework": "megatron", "seq_len": 4096,
                                                             "global_batch_size": 64}})
    result = plan(cfg.architecture, cfg.training, cfg.hardware, 8, limit=5)
    assert result.layouts and all(lay.parallel.cp == 1 for lay in result.layouts)
    default = estimate_config({"model": "falcon-h1-7b"})  # Megatron-Core: said in the notes
    assert any("hybrid layers under megatron" in note for note in default.notes)
