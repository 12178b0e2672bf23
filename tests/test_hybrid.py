"""Hybrid models (issue 28): the fields and their checks, the layer kinds, parameters, the activation ledger,
the roofline, inference and vLLM serving of Qwen3-Next (Gated DeltaNet) and Nemotron-H (Mamba-2), by hand."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from estimator.memory.activations.layer import layer_entries
from estimator.memory.memory import estimate_config
from estimator.models.hf_config import architecture_from_hf_config
from estimator.models.presets import get_architecture
from estimator.spec.architecture import Architecture, parameter_counts
from estimator.spec.errors import ConfigError
from estimator.spec.parallel import Parallel
from estimator.spec.training import Training

HF_CONFIGS = Path(__file__).parent / "data" / "hf_configs"
QWEN = get_architecture("qwen3-next-80b-a3b")
NEMOTRON = get_architecture("nemotron-h-8b")
HF_BF16 = Training(mode="training", framework="hf", seq_len=4096, param_dtype="bf16", grad_dtype="bf16",
                   master_weights=False, optimizer_dtype="bf16", compute_dtype="bf16")


def hybrid(**changes) -> Architecture:
    return dataclasses.replace(NEMOTRON, **changes)


# --- the fields and their checks -------------------------------------------------------------------


@pytest.mark.parametrize("changes, field", [
    (dict(hybrid_override_pattern="M-X" + "M-" * 24 + "-"), "model.hybrid_override_pattern"),  # not M * - E
    (dict(hybrid_override_pattern="M-*"), "model.hybrid_override_pattern"),  # 3 characters for 52 layers
    (dict(mamba_num_groups=3), "model.mamba_num_groups"),  # 128 heads are not in groups of 3
    (dict(mamba_state_size=None), "model.mamba_state_size"),
    (dict(full_attention_interval=4), "model.full_attention_interval"),  # a pattern and an interval
    (dict(sliding_window=4096), "model.sliding_window"),
])
def test_pattern_checks_name_the_field(changes, field):
    with pytest.raises(ConfigError) as caught:
        hybrid(**changes)
    assert caught.value.field == field


def test_linear_attention_checks_name_the_field():
    with pytest.raises(ConfigError) as caught:
        dataclasses.replace(QWEN, linear_num_value_heads=24)  # not a multiple of the 16 key heads
    assert caught.value.field == "model.linear_num_value_heads" and "multiple of linear_num_key_heads (16)" in \
        caught.value.allowed
    with pytest.raises(ConfigError) as caught:
        dataclasses.replace(QWEN, linear_key_head_dim=None)
    assert caught.value.field == "model.linear_key_head_dim"


@pytest.mark.parametrize("training, parallel, field", [
    (dict(framework="hf", compile=True), {}, "training.compile"),
    (dict(framework="hf"), dict(cp=2), "parallel.cp"),
])
def test_what_is_not_modelled_is_refused(training, parallel, field):
    with pytest.raises(ConfigError) as caught:
        estimate_config({"model": "nemotron-h-8b", "training": training, "parallel": parallel})
    assert caught.value.field == field


def test_other_frameworks_say_what_is_modelled():
    result = estimate_config({"model": "nemotron-h-8b"})  # megatron, the default
    assert any("hybrid layers under megatron" in note for note in result.notes)
    hf = estimate_config({"model": "nemotron-h-8b", "training": {"framework": "hf"}})
    assert not any("hybrid layers" in note for note in hf.notes)


def test_the_hf_mapping_reads_the_published_configs():
    for name, preset in (("qwen3-next-80b-a3b-instruct", QWEN), ("nemotron-h-8b-base-8k", NEMOTRON)):
        arch, ignored = architecture_from_hf_config(json.loads((HF_CONFIGS / f"{name}.json").read_text()))
        assert ignored == [] and dataclasses.replace(arch, name=preset.name) == preset
    # Qwen3-Next's layer_types, regular: every 4th layer is full attention
    config = json.loads((HF_CONFIGS / "qwen3-next-80b-a3b-instruct.json").read_text())
    config["layer_types"] = ["linear_attention", "full_attention"] * 24
    assert architecture_from_hf_config(config)[0].full_attention_interval == 2
    config["layer_types"][4] = "full_attention"  # layers 3, 4, 5 full: no period
    with pytest.raises(ConfigError) as caught:
        architecture_from_hf_config(config)
    assert caught.value.field == "model.layer_types"


# --- layer kinds and parameters ---------------------------------------------------------------------


def test_layer_kinds_follow_the_interval_and_the_pattern():
    assert QWEN.kind_counts() == (("linear_moe", 36), ("moe", 12))
    assert QWEN.kind_counts(0, 6) == (("linear_moe", 5), ("moe", 1))  # layers 0-5: full attention at 3
    assert [QWEN.layer_kind(i) for i in range(4)] == ["linear_moe"] * 3 + ["moe"]
    assert NEMOTRON.kind_counts() == (("attention", 4), ("mamba", 24), ("mlp", 24))
    assert NEMOTRON.kind_counts(0, 9) == (("attention", 1), ("mamba", 4), ("mlp", 4))  # M-M-M-M*


def test_parameters_by_hand():
    # Gated DeltaNet (h 2048, 16 key heads and 32 value heads of 128, conv 4): in_proj_qkvz and _ba, conv,
    # dt_bias and A_log, the gated norm, out_proj
    h, qk, v, hv = 2048, 16 * 128, 32 * 128, 32
    gdn = (2 * qk + 2 * v + 2 * hv) * h + (2 * qk + v) * 4 + 2 * hv + 128 + v * h
    # gated attention: q_proj doubled, k and v of 2 heads of 256, o_proj, the q and k norms
    attention = 2 * 16 * 256 * h + 2 * 2 * 256 * h + 16 * 256 * h + 2 * 256
    moe = 512 * h + 512 * 3 * 512 * h + 3 * 512 * h + h  # router, experts, shared expert and its gate
    counts = parameter_counts(QWEN)
    assert counts.per_layer == {"linear_moe": gdn + moe + 2 * h, "moe": attention + moe + 2 * h}
    assert counts.total == 79_674_391_296  # what transformers builds (tests/test_hybrid_parameters.py)
    # Mamba-2 (h 4096, 128 heads of 64, 8 groups, state 128, conv 4 with bias): in_proj, conv and its bias,
    # dt_bias, A_log and D, the gated norm, out_proj, the block's norm
    h, d, gn = 4096, 128 * 64, 8 * 128
    mamba = (2 * d + 2 * gn + 128) * h + (d + 2 * gn) * 5 + 3 * 128 + d + h * d + h
    assert parameter_counts(NEMOTRON).per_layer["mamba"] == mamba
    assert parameter_counts(NEMOTRON).total == 8_100_852_736


# --- activations -----------------------------------------------------------------------------------


def per_token(arch, kind, training=HF_BF16) -> float:
    return sum(e.bytes(Parallel()) for e in layer_entries(arch, training, Parallel(), kind)) / training.seq_len


def test_mamba_block_keeps_its_input_in_proj_output_scan_output_and_rstd():
    """The block's fp32-scaled norm (fp32 upcast, rsqrt, fp32 normalised, bf16 output), then what mamba-ssm's
    fused mixer saves: zxbcdt, out_x and the gated norm's rstd per group (measured: 94,500 bytes a token)."""
    h, d, gn, H = 4096, 8192, 1024, 128
    norm = 4 * h + 4 + 4 * h + 2 * h
    assert per_token(NEMOTRON, "mamba") == norm + 2 * (2 * d + 2 * gn + H) + 2 * d + 4 * 8 == 94_500


def test_gated_delta_net_layer_by_hand():
    """Qwen3-Next's linear-attention layer (measured 285,775 bytes a token in a 2-layer run; the estimate
    charges the router's fp32 logits and probabilities, 2 KiB, where the layer keeps its probabilities and
    the int64 routing indices, 0.4 KiB)."""
    h, qk, v, hv, hk = 2048, 2048, 4096, 32, 16
    norm = 4 * h + 4 + 4 * h + 2 * h
    mixer = (2 * (2 * qk + v) + 2 * 2 * qk + 4 * 2 * hk + 2 * v + 4 * hv + 2 * hv + 2 * 64 * hv + 4 * 2 * hv
             + 4 * v + 4 * hv + 2 * v + 2 * v + 4 * 2 * v + 2 * v)
    moe = norm + 4 * 2 * 512 + 2 * 10 * h + 2 * 10 * 2 * 512 + 2 * 2 * 10 * 512 + 2 * 10 * h \
        + 2 * 2 * 512 + 2 * 2 * 512 + 2 + 2 * h  # shared expert and its gate
    estimate = per_token(QWEN, "linear_moe")
    assert estimate == norm + mixer + moe
    assert estimate == pytest.approx(285_775, rel=0.01)


def test_recurrent_layers_keep_nothing_per_context_token_in_inference():
    inference = Training(mode="inference", seq_len=32768, micro_batch_size=8)
    stage = estimate_config({"model": "nemotron-h-8b", "training": {"mode": "inference", "seq_len": 32768,
                                                                    "micro_batch_size": 8}}).stages[0]
    parts = {c.key: c.bytes for c in stage.phases[0].components}
    assert parts["kv_cache"] == 2 * 8 * 128 * 32768 * 8 * 4 * 2  # 4 attention layers of 52
    # per Mamba layer and sequence: conv window 3 x (8192 + 2 x 8 x 128) in bf16, state 128 x 64 x 128 in fp32
    assert parts["recurrent_state"] == 8 * 24 * (3 * 10240 * 2 + 128 * 64 * 128 * 4)
    longer = estimate_config({"model": "nemotron-h-8b", "training": {"mode": "inference", "seq_len": 65536,
                                                                     "micro_batch_size": 8}}).stages[0]
    assert {c.key: c.bytes for c in longer.phases[0].components}["recurrent_state"] == parts["recurrent_state"]
    assert inference.seq_len == 32768


# --- serving (vLLM) --------------------------------------------------------------------------------


def serve(model: str, tp: int, max_model_len: int):
    """Without prefix caching: vLLM 0.33 turns it on for hybrids by default, and then aligns the state pages
    (tests/test_serving_prefix_default.py holds that mode)."""
    from estimator.serving.service import serving_config
    from estimator.models.loading import load_config

    return serving_config(load_config({"model": model, "parallel": {"tp": tp},
                                       "serving": {"engine": "vllm", "max_model_len": max_model_len,
                                                   "prefix_caching": False}}))


def test_vllm_sizes_the_attention_block_to_hold_a_state_page():
    """Qwen3-Next at TP 4: one token's attention page is 2 x 1 KV head x 256 x 2 B = 1 KiB; a Gated DeltaNet
    state 3 x 8192/4 x 2 B + 8 x 128 x 128 x 2 B = 274,432 B, so the block is 16 x cdiv(274,432, 16 KiB) = 272
    tokens. 12 attention layers and 36 recurrent ones make 4 groups of 12; a request of 8,192 tokens takes
    cdiv(8192, 272) = 31 attention blocks and one state block in each of the 3 recurrent groups."""
    result = serve("qwen3-next-80b-a3b", 4, 8192)
    assert result.resolved.block_size == 272
    assert result.capacity.blocks_per_request == 31 + 3
    # twice the context: more attention blocks, the same states
    assert serve("qwen3-next-80b-a3b", 4, 16384).capacity.blocks_per_request == 61 + 3


def test_sglang_sizes_a_hybrid_model_state_pool():
    """SGLang keeps a hybrid's recurrent states in a pool of their own (serving/sglang_pools.py, held to SGLang
    0.5.23 in tests/test_serving_sglang.py): Nemotron-H-8B's 24 Mamba-2 layers, (128 x 64 + 2 x 8 x 128) x 3 x
    2 B + 128 x 64 x 128 x 4 B each, per slot; the KV pool counts its 4 attention layers only."""
    from estimator.serving.service import serving_config
    from estimator.models.loading import load_config

    result = serving_config(load_config({"model": "nemotron-h-8b", "serving": {"engine": "sglang"}}))
    state = next(c for c in result.limiting.components if c.key == "recurrent_state")
    assert state.formula.endswith(f"x {24 * ((128 * 64 + 2 * 8 * 128) * 3 * 2 + 128 * 64 * 128 * 4):,} B per slot")
    assert result.capacity.kv_cache_bytes == result.capacity.tokens * 4 * 8 * 256 * 2


# --- roofline --------------------------------------------------------------------------------------


def test_only_attention_layers_do_attention_work():
    from estimator.models.loading import load_config
    from estimator.speed.roofline import roofline_config

    config = load_config({"model": "nemotron-h-8b", "training": {"framework": "hf", "seq_len": 4096}})
    ops = roofline_config(config).operations
    core = [op for op in ops if op.name.startswith("attention core")]
    assert core and all(op.count == 4 for op in core)  # the 4 attention blocks of 52
    scans = [op for op in ops if op.name.startswith("chunked SSD scan")]
    assert scans and all(op.count == 24 for op in scans)
    # forward FLOPs of the scan per token: 2 (g Q N + H (Q P + 2 N P)), Q = 128
    per_token = 2 * (8 * 128 * 128 + 128 * (128 * 64 + 2 * 128 * 64))
    assert next(op for op in scans if op.phase == "forward").flops == per_token * 4096


def test_the_planner_answers_for_both_presets():
    from estimator.models.loading import load_config
    from estimator.search.planner import plan

    # under Megatron, whose stack has context parallelism (search/stacks.py), which the hybrids refuse
    for model, gpus in (("qwen3-next-80b-a3b", 32), ("nemotron-h-8b", 16)):
        cfg = load_config({"model": model, "training": {"framework": "megatron", "seq_len": 4096,
                                                        "global_batch_size": 64}})
        result = plan(cfg.architecture, cfg.training, cfg.hardware, gpus, limit=5)
        assert result.layouts and all(lay.parallel.cp == 1 for lay in result.layouts)
