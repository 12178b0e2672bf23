"""A phase takes the largest of the moments that never coexist (estimator/memory/static_stage.py): a
recomputed layer's DeepSeek Sparse Attention moment (inside its core attention) and its MoE block's (the
combine of its recomputed forward, the experts' backward) come one after the other, not together."""

from __future__ import annotations

from estimator import estimate_config

DSA = "DeepSeek Sparse Attention's quadratic temporaries (a layer's backward)"
RECOMPUTED = "One recomputed layer's activations"
MOE_PARTS = {"permuted tokens sent by the all-to-all (held by MoELayer.forward)", "experts' outputs, concatenated",
             "experts' outputs unsorted by local expert (a copy)", "expert-TP reduce-scatter output",
             "all-to-all output (the tokens back on their rank)"}


def _backward_transient(seq_len: int):
    """DeepSeek-V3.2 under Megatron, full recompute, TP 8 with SP, EP 32, PP 8: a middle stage (MoE layers only)."""
    config = {"model": "deepseek-v3.2",
              "training": {"seq_len": seq_len, "micro_batch_size": 1, "global_batch_size": 512, "recompute": "full"},
              "parallel": {"tp": 8, "pp": 8, "pp_first_stage_layers": 5, "ep": 32, "dp": 32, "sequence_parallel": True},
              "hardware": {"gpu": "h200"}}
    stage = estimate_config(config).stages[1]
    backward = next(p for p in stage.phases if p.name == "backward")
    return next(c for c in backward.components if c.key == "transient")


def _moe_moment(seq_len: int) -> int:
    """The MoE combine's moment by hand: T = s/8 tokens per GPU (sequence parallel), k = 8 routed copies of
    h = 7,168 in bf16; the send buffer, the reduce-scatter output and the all-to-all output one such copy
    each, the experts' outputs and their unsorted copy ETP (= TP = 8) times it before the reduce-scatter."""
    routed = seq_len // 8 * 8 * 7168 * 2
    return (1 + 8 + 8 + 1 + 1) * routed


def test_long_sequence_holds_the_sparse_attention_moment_alone():
    transient = _backward_transient(4096)
    parts = {p.label: p.bytes for p in transient.parts}
    assert set(parts) == {RECOMPUTED, DSA}  # the MoE block's moment is not added beside it
    assert parts[DSA] > _moe_moment(4096) == 1_115_684_864
    assert transient.bytes == parts[RECOMPUTED] + parts[DSA]


def test_short_sequence_holds_the_moe_moment_alone():
    transient = _backward_transient(512)
    parts = {p.label: p.bytes for p in transient.parts}
    assert DSA not in parts and set(parts) == {RECOMPUTED} | MOE_PARTS
    assert sum(parts[label] for label in MOE_PARTS) == _moe_moment(512) == 139_460_608
    assert transient.bytes == parts[RECOMPUTED] + _moe_moment(512)
