"""Jamba's Mamba-1 hybrid (issue 28; estimator/spec/hybrid.py): the fields and their checks, the HF mapping,
the layer kinds, the Mamba-1 ledger against the harness's records, inference and vLLM state, the roofline,
the planner. Numbers by hand from AI21-Jamba-1.5-Mini's config.json (tests/data/hf_configs/)."""

import json
import math
from pathlib import Path

import pytest

from estimator import Architecture, ConfigError, estimate_config
from estimator.models.hf_config import architecture_from_hf_config
from estimator.models.loading import load_config

DATA = Path(__file__).parent / "data"
CONFIG = json.loads((DATA / "hf_configs" / "ai21-jamba-1.5-mini.json").read_text())
RECORDS = sorted((DATA / "measured").glob("jamba-mini-1.5-*.json"))
h, d, n, r, V = 4096, 8192, 16, 256, 65536  # hidden, inner width (2 h), state, dt rank, vocabulary


def jamba(**changes) -> Architecture:
    arch, _ = architecture_from_hf_config(CONFIG)
    fields = {f: getattr(arch, f) for f in ("hidden_size", "num_layers", "num_attention_heads", "num_kv_heads",
                                            "vocab_size", "intermediate_size", "position_embedding", "num_experts",
                                            "num_experts_per_token", "moe_intermediate_size", "first_dense_layers",
                                            "moe_layer_frequency", "attention_layer_period", "attention_layer_offset",
                                            "mamba_expand", "mamba_state_size", "mamba_dt_rank")}
    return Architecture(**{**fields, **changes})


def test_the_hf_mapping_reads_the_published_config():
    arch, ignored = architecture_from_hf_config(CONFIG)
    assert ignored == []
    assert (arch.attention_layer_period, arch.attention_layer_offset) == (8, 4)
    assert (arch.first_dense_layers, arch.moe_layer_frequency, arch.num_experts) == (1, 2, 16)
    assert (arch.mamba_expand, arch.mamba_state_size, arch.mamba_dt_rank, arch.mamba_conv_kernel) == (2, 16, 256, 4)
    assert arch.moe_intermediate_size == arch.intermediate_size == 14336 and arch.position_embedding == "none"
    # "auto" is ceil(hidden / 16) (JambaConfig.__post_init__); one expert is the plain MLP (layers_num_experts)
    auto, _ = architecture_from_hf_config({**CONFIG, "mamba_dt_rank": "auto", "hidden_size": 4104,
                                              "num_attention_heads": 8})
    assert auto.mamba_dt_rank == 257  # 4104 / 16 = 256.5
    dense, _ = architecture_from_hf_config({**CONFIG, "num_experts": 1})
    assert dense.num_experts == 0 and dense.kinds == ("dense", "mamba1_dense")


def test_layer_kinds_follow_the_periods():
    arch = jamba()
    kinds = arch.layer_kinds()
    assert [i for i, k in enumerate(kinds) if k in ("dense", "moe")] == [4, 12, 20, 28]  # i % 8 == 4
    assert [i for i, k in enumerate(kinds) if k.endswith("moe")] == list(range(1, 32, 2))  # i % 2 == 1
    assert arch.kind_counts() == (("dense", 4), ("mamba1_dense", 12), ("mamba1_moe", 16))
    assert arch.kind_counts(0, 16) == (("dense", 2), ("mamba1_dense", 6), ("mamba1_moe", 8))
    assert arch.kind_counts(5, 13) == (("dense", 1), ("mamba1_dense", 3), ("mamba1_moe", 4))


@pytest.mark.parametrize("changes, field", [
    ({"attention_layer_offset": 8}, "model.attention_layer_offset"),
    ({"mamba_dt_rank": None}, "model.mamba_dt_rank"),
    ({"mamba_expand": None}, "model.mamba_expand"),
    ({"full_attention_interval": 4, "linear_num_key_heads": 16, "linear_num_value_heads": 32,
      "linear_key_head_dim": 128, "linear_value_head_dim": 128}, "model.attention_layer_period"),
    ({"sliding_window": 4096}, "model.sliding_window"),
])
def test_checks_name_the_field(changes, field):
    with pytest.raises(ConfigError) as caught:
        jamba(**changes)
    assert caught.value.field == field


def test_tp_must_divide_the_inner_channels():
    with pytest.raises(ConfigError) as caught:
        estimate_config({"model": "jamba-mini-1.5", "parallel": {"tp": 3}})
    assert caught.value.field == "parallel.tp"


def test_the_mamba1_layer_by_hand():
    """One Mamba-1 mixer at 4,096 tokens in bf16 (memory/activations/hybrid.py mamba1_entries): per token the
    norm's fp32 upcast (4 h), rsqrt (4) and normalised output (2 h), in_proj's input (2 h), its output x, z (2 x 2 d),
    the conv output and x_proj's copy (2 x 2 d), the dt/B/C norms (4 + 2) (r + 2 n) + 3 x 4, the normed dt (2 r), B and
    C copies (2 x 2 n), delta, z, out and out_proj's copy (4 x 2 d); per sequence the fp32 state at the end of
    each 2,048 tokens (4 x d x 2 x 2 n) and A twice, D and the dt bias in fp32."""
    from estimator.memory.activations.hybrid import mamba1_entries
    from estimator.spec.parallel import Parallel
    from estimator.spec.training import Training

    s = 4096
    per_token = 4 * h + 4 + 2 * h + 2 * h + 4 * d + 4 * d + 6 * (r + 2 * n) + 12 + 2 * r + 4 * n + 8 * d
    per_layer = 4 * d * 2 * 2 * n + 4 * (2 * d * n + 2 * d)
    entries = mamba1_entries(jamba(), Training(seq_len=s, micro_batch_size=1, framework="hf"), Parallel())
    assert sum(e.elements * e.bytes_per_element for e in entries) == s * per_token + per_layer
    assert per_token == 166_160  # bytes a token, about 40 x h


@pytest.mark.parametrize("path", RECORDS, ids=lambda p: p.stem)
def test_the_measured_forward_within_half_a_percent(path):
    """The harness's Jamba runs (validation/hybrid, mamba-ssm's selective scan emulated): the end of forward,
    every layer's saved tensors beside the logits and the model states, from 2,048 x 2 to 32,768 tokens and with
    full recompute; at 32,768 tokens the step's peak is in backward."""
    record = json.loads(path.read_text())
    result = estimate_config(record["config"])
    stage = result.stages[result.peak_stage]
    forward = next(p for p in stage.phases if p.name == "forward")
    assert forward.allocated_bytes == pytest.approx(record["measured"]["phases"]["forward"]["total"], rel=0.005)
    if record["measured"]["peak_phase"] == "backward":
        backward = next(p for p in stage.phases if p.name == "backward")
        assert backward.allocated_bytes == pytest.approx(record["measured"]["peak_bytes"], rel=0.005)


def test_inference_keeps_kv_for_attention_layers_and_a_constant_state_for_the_others():
    def parts(seq):
        config = {"model": "jamba-mini-1.5", "training": {"mode": "inference", "seq_len": seq, "micro_batch_size": 8}}
        return {c.key: c.bytes for c in estimate_config(config).stages[0].phases[0].components}

    short, long = parts(32768), parts(65536)
    assert short["kv_cache"] == 2 * 8 * 128 * 32768 * 8 * 4 * 2  # 4 attention layers of 32
    # per Mamba-1 layer and sequence (vLLM mamba1_state_shape): conv 3 x d and state d x n, in bf16
    assert short["recurrent_state"] == long["recurrent_state"] == 8 * 28 * (3 * d + d * n) * 2 == 69_730_304
    assert long["kv_cache"] == 2 * short["kv_cache"]


def test_vllm_sizes_the_attention_block_to_hold_a_mamba1_state_page():
    """TP 2: one token's attention page is 2 x 4 KV heads x 128 x 2 B = 2 KiB; a Mamba-1 state (3 x 4096 + 4096 x
    16) x 2 B = 155,648 B, so the block is 16 x cdiv(155,648, 32 KiB) = 80 tokens. 4 attention layers and 28
    Mamba-1 ones make groups of 4: one attention group and 7 state groups; 8,192 tokens take cdiv(8192, 80) = 103
    attention blocks and one state block in each state group."""
    from estimator.serving.service import serving_config

    def serve(max_model_len):
        return serving_config(load_config({"model": "jamba-mini-1.5", "parallel": {"tp": 2},
                                           "serving": {"engine": "vllm", "max_model_len": max_model_len,
                                                       "prefix_caching": False}}))  # no aligned state pages

    result = serve(8192)
    assert result.resolved.block_size == 16 * math.ceil((3 * 4096 + 4096 * 16) * 2 / (16 * 2048)) == 80
    assert result.capacity.blocks_per_request == 103 + 7
    assert serve(16384).capacity.blocks_per_request == 205 + 7


def test_the_roofline_scans_in_mamba1_layers_and_attends_in_four():
    from estimator.speed.roofline import roofline_config

    ops = roofline_config(load_config({"model": "jamba-mini-1.5", "training": {"framework": "hf",
                                                                               "seq_len": 4096}})).operations
    core = [op for op in ops if op.name.startswith("attention core")]
    assert core and all(op.count == 4 for op in core)
    scans = [op for op in ops if op.name.startswith("selective scan") and op.phase == "forward"]
    assert sorted(op.count for op in scans) == [12, 16]  # the Mamba-1 layers with an MLP, with a MoE
    assert all(op.flops == d * (8 * n + 10) * 4096 for op in scans)


def test_the_planner_and_the_default_estimate_answer():
    from estimator.search.planner import plan

    cfg = load_config({"model": "jamba-mini-1.5", "training": {"framework": "megatron", "seq_len": 4096,
                                                               "global_batch_size": 64}})
    result = plan(cfg.architecture, cfg.training, cfg.hardware, 16, limit=5)
    assert result.layouts and all(lay.parallel.cp == 1 for lay in result.layouts)
    default = estimate_config({"model": "jamba-mini-1.5"})  # Megatron-Core: said in the notes
    assert any("no Mamba-1 mixer" in note for note in default.notes)
