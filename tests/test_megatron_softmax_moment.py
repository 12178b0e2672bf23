"""Megatron-Core's own unfused attention (the local spec's DotProductAttention) under full recompute: the recomputed
layer peaks at its softmax, and the attention's baddbmm input lives in the global memory buffer 'mpu'
(estimator/memory/megatron_softmax_moment.py, activations/moe.global_memory_buffer). Numbers by hand from the
Megatron-Core 0.16.1 source, and the fake-tensor harness's record of the same run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from estimator import estimate_config
from estimator.memory.megatron_softmax_moment import recomputed_softmax_moment
from validation.core.report import tensors_peak

RECORD = Path(__file__).parent / "data" / "measured" / "megatron" / \
    "llama-3.1-8b-tp1-pp1-only-s4096-b1-full-uniform1-unfused.json"
MOMENT = "Recomputed layer at its attention softmax (kept so far, scores and their softmax copies)"
BUFFER = "global memory buffer 'mpu' (the unfused attention's baddbmm input; allocated once, kept)"

# Llama-3.1-8B's layers: h 4096, 32 heads of 128, 8 KV heads; 4096 tokens, micro-batch 1, bf16
S, H, A, D = 4096, 4096, 32, 128
SCORES = A * S * S  # b * a/t * s^2 elements at TP 1


def config(**training) -> dict:
    cfg = json.loads(RECORD.read_text())["config"]
    cfg["training"].update(training)
    return cfg


def walk(components):
    for c in components:
        yield c
        yield from walk(c.parts)


def phase(result, name: str):
    return next(p for p in result.stages[0].phases if p.name == name)


def labelled(result, phase_name: str, label: str):
    """The phase's components of that label; a phase's transients fold into one whose formula names them."""
    return [c for c in walk(phase(result, phase_name).components)
            if c.label == label or (c.key == "transient" and c.formula == label)]


def test_the_recomputed_layer_at_its_torch_softmax_and_its_backward():
    """Kept before the softmax: the norm's input and the QKV projection's (2 B s h each), q and k with the keys
    expanded to every head (2 x 2 B s a d), the fp32 softmax (4 a s^2), its bf16 cast (2 a s^2), the causal mask
    (s^2 bools), v expanded (2 B s a d); beside them the bf16 baddbmm scores (2 a s^2) and their fp32 copy, the
    torch softmax's input (4 a s^2). No MLP tensor exists yet. Larger still, later in the same layer's backward:
    its softmax backward (softmax_backward.py) beside the whole layer's ledger (3,858,759,680 B): the fp32
    gradient of the probabilities, CUDA's tmp and the fp32 gradient of the scores less the bf16 cast freed,
    (3 x 4 - 2) a s^2."""
    kept = 2 * S * H + 2 * S * H + 2 * 2 * S * A * D + 4 * SCORES + 2 * SCORES + S * S + 2 * S * A * D
    assert kept == 3_405_774_848
    result = estimate_config(config())
    assert softmax_moment(result).bytes == kept + 2 * SCORES + 4 * SCORES == 6_627_000_320
    parts = {c.label: c.bytes for c in walk(phase(result, "backward").components)}
    backward = sum(parts[label] for label in (
        "fp32 gradient of the probabilities (the cast's backward)",
        "CUDA softmax backward's temporary (tmp = grad * output)",
        "fp32 gradient of the scores (the softmax's backward output)",
        "The 16-bit tensor scores x V kept, freed by its backward"))
    assert backward == (3 * 4 - 2) * SCORES == 5_368_709_120
    layer = parts["One recomputed layer's activations"]
    assert layer == 3_858_759_680 and layer + backward > 6_627_000_320
    assert not labelled(result, "backward", MOMENT)


def test_the_baddbmm_input_is_a_kept_buffer_of_the_scores_shape():
    """get_tensor((b*a/t, s, s), bf16, 'mpu'): 2 B x 32 x 4096^2, alive from the first step on, in every phase."""
    result = estimate_config(config())
    for name in ("forward", "backward", "optimizer"):
        [buffer] = labelled(result, name, BUFFER)
        assert buffer.bytes == 2 * SCORES == 1_073_741_824


def test_the_harness_measures_the_moment():
    """The fake-tensor harness's peak of the same Setup, with CUDA's softmax-backward temporary counted
    (validation/core/emulation.py), is the recomputed layer's softmax backward (44,672,231,424 B: the states, the
    4 checkpointed layer inputs, the buffer, the layer's tensors and its softmax backward); the estimate was 9.1%
    under the record before it (42,549,913,600 B) while it charged the recomputed layer's full ledger and no
    buffer, and 0.85% over while it left in the layer's MLP tensors, attention output and v, freed by their
    backward before its softmax backward (2 B s h + 2 B s 3f/2 + 2 x 2 B s a d = 486,539,264 B), now taken out, less
    the two hidden-sized gradients alive then (2 x 2 B s h = 67,108,864 B; softmax_backward.py
    _layer_parts). Under by 0.09% (38.1 MiB): RoPE's cos and sin of the recomputed layer (4 x 2 B s d =
    4 MiB), the rotary table (4 B s d = 2 MiB) and one more hidden-sized tensor the H200 run shows too (peak_blocks
    of tests/data/measured/gpu/megatron/*-full-uniform1-*) are not modelled."""
    record = json.loads(RECORD.read_text())
    assert record["measured"]["peak_phase"] == "backward" and record["measured"]["peak_bytes"] == 44_672_231_424
    peak = tensors_peak(estimate_config(record["config"]).stages[0])
    assert peak - record["measured"]["peak_bytes"] == 379_484_160 - 486_539_264 + 67_108_864 == -39_946_240
    assert peak == pytest.approx(record["measured"]["peak_bytes"], rel=0.01)


def softmax_moment(result):
    r = result.config
    return recomputed_softmax_moment(r.architecture, r.training, r.parallel)


def test_the_fused_softmax_kernel_makes_no_fp32_copy():
    """With the fused kernel (scaled_upper_triang_masked_softmax: 4096 tokens, 32 heads) the layer keeps the bf16
    probabilities alone (no mask), and only the bf16 scores stand beside them; still above the layer's ledger
    (3,858,759,680 - 4 a s^2 - s^2 = 1,694,498,816 B). (The loss's backward moment is the larger here.)"""
    result = estimate_config(config(attention_softmax_fusion=True))
    kept = 2 * S * H + 2 * S * H + 2 * 2 * S * A * D + 2 * SCORES + 2 * S * A * D
    assert softmax_moment(result).bytes == kept + 2 * SCORES == 2_315_255_808
    assert sum(line.bytes for line in result.activation_ledger) == 1_694_498_816


def test_the_full_layer_stays_where_the_scores_are_narrow():
    """At 512 tokens the scores' two transients (6 a s^2 = 50,331,648 B) are smaller than what the layer keeps
    after its softmax (the attention output 2 B s a d, the MLP's 2 B s (2 h + 2 f + f)): the moment (2 B s h x 2 +
    6 B s a d + 6 a s^2 + s^2 + 6 a s^2 = 121,896,960 B) stays below the layer's full ledger, which remains the
    recompute moment. It overtakes the ledger from about s = (h + f) / a tokens per head a GPU holds."""
    result = estimate_config(config(seq_len=512))
    s, scores = 512, A * 512 * 512
    moment = 4 * s * H + 6 * s * A * D + 6 * scores + s * s + 6 * scores
    after = 2 * s * A * D + 2 * s * (2 * H + 2 * 14336 + 14336)
    assert softmax_moment(result).bytes == moment == 121_896_960
    ledger = sum(line.bytes for line in result.activation_ledger)
    assert ledger == moment - 6 * scores + after == 128_188_416 and ledger > moment


def test_transformer_engines_unfused_attention_is_not_megatrons():
    """--attention-backend unfused under the TE spec runs TransformerEngine's UnfusedDotProductAttention, which
    allocates its own scores tensor instead of asking Megatron's global buffer: neither term applies."""
    result = estimate_config(config(transformer_impl="transformer_engine"))
    assert softmax_moment(result) is None and not labelled(result, "backward", MOMENT)
    assert not labelled(result, "optimizer", BUFFER)


SELECTIVE = RECORD.with_name("llama-3.1-8b-tp1-pp1-only-s4096-b1-sel-core_attn-unfused.json")
SELECTIVE_MOMENT = ("The last layer's recomputed core attention at its softmax backward (selective recompute, "
                    "unfused softmax)")


def test_selective_core_attention_recompute_peaks_at_the_last_layers_recomputed_softmax_backward():
    """Selective recompute of core_attn, the same layers: the ledger keeps none of the core's tensors (no fp32
    softmax, bf16 cast or mask: 4 a s^2 + 2 a s^2 + s^2 fewer per layer), and the last layer's backward reruns
    its core attention and differentiates it: the recomputed fp32 softmax output (4 a s^2) and causal mask (s^2),
    the fp32 gradient of the probabilities, CUDA's tmp and the fp32 gradient of the scores (3 x 4 a s^2), the
    bf16 scores, their fp32 copy and the bf16 probabilities freed by then. The harness's backward peak there
    (`traced_step` of the case: 2 x 4,096 MiB _softmax_backward_data, 2,048 MiB _softmax, 2,048 MiB _to_copy
    fp32, 16 MiB of mask beside the kept tensors); the estimate was 10.9% under it with the loss's moment as the
    peak (41,392,185,344 B), then +0.64% with the last layer's tensors freed by then left in. The same trace: the
    recomputed k expanded to the 32 heads is kept by QK^T (one 4,096 x 8 x 4 x 128 clone: 2 B x s h); autograd has
    run the last layer's MLP and output projection, which released what they saved (1 of 4 fc1 outputs and SwiGLU
    outputs left, 7 of 8 norm outputs: its attention output, MLP norm input, fc1 input, fc1 output 2 x 2 B x s x
    14,336 and SwiGLU output 2 B x s x 14,336, 452,984,832 B, gone) but not v, the checkpointed core's input; three
    2 B x s h gradients are alive (an add.Tensor, an mm and a bmm: the residual stream's, the core output's, v's).
    The estimate is 19.1 MB (0.04%) under the record now."""
    record = json.loads(SELECTIVE.read_text())
    result = estimate_config(record["config"])
    [moment] = labelled(result, "backward", SELECTIVE_MOMENT)
    h, f = 4_096, 14_336
    freed = 3 * 2 * S * h + 2 * 2 * S * f + 2 * S * f
    assert freed == 452_984_832
    assert moment.bytes == 16 * SCORES + S * S + 2 * S * h - freed + 3 * 2 * S * h == 8_287_944_704
    training = {k: v for k, v in record["config"]["training"].items() if k != "recompute_modules"}
    plain = estimate_config(dict(record["config"], training=dict(training, recompute="none")))
    assert not labelled(plain, "backward", SELECTIVE_MOMENT)
    kept = [next(c.bytes for c in phase(r, "backward").components if c.key == "activations") for r in (plain, result)]
    assert kept[0] - kept[1] == 4 * (4 * SCORES + 2 * SCORES + S * S)  # 4 layers built
    assert record["measured"]["peak_phase"] == "backward" and record["measured"]["peak_bytes"] == 46_480_076_800
    peak = tensors_peak(result.stages[0])
    assert peak - record["measured"]["peak_bytes"] == -19_075_072
    # the fused softmax kernel and TransformerEngine's attention: not Megatron's torch softmax, not modelled here
    for change in ({"attention_softmax_fusion": True}, {"transformer_impl": "transformer_engine"}):
        other = estimate_config(dict(record["config"], training=dict(record["config"]["training"], **change)))
        assert not labelled(other, "backward", SELECTIVE_MOMENT)
