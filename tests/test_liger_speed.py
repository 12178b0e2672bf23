"""training.liger_kernel and Liger's fused linear cross-entropy in the step time: each term by hand from
liger-kernel 0.8.5's source (kernels.LIGER_TRAFFIC, speed/liger_operations.py), then against Liger-Kernel's own
published numbers (tests/data/measured/published/liger: its benchmark CSV at a cited commit, per kernel, liger
against huggingface on an A100; its README's end-to-end LLaMA 3-8B throughput on 8 A100s)."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import pytest

from estimator.models.presets import get_architecture
from estimator.spec.hardware import Hardware
from estimator.spec.parallel import Parallel
from estimator.spec.training import Training
from estimator.speed import kernels
from estimator.speed.roofline import render_roofline_text, roofline

PUBLISHED = Path(__file__).resolve().parent / "data" / "measured" / "published" / "liger"
H100, A100 = Hardware("h100-80"), Hardware("a100-80")
EFF = kernels.BANDWIDTH_EFFICIENCY


def llama_8b():
    return get_architecture("llama-3.1-8b")


def run(arch, hardware=H100, framework="hf", liger=False, loss="standard", seq_len=4096, mb=1, par=None, **kw):
    training = Training(framework=framework, seq_len=seq_len, micro_batch_size=mb, global_batch_size=mb * (
        par.dp if par else 1), liger_kernel=liger, loss=loss, **kw)
    return roofline(arch, training, par or Parallel(), hardware)


def op(result, name, phase="forward"):
    """The operation of that name and phase (a backward one named with " (backward)" or not)."""
    return next(o for o in result.operations if o.name in (name, f"{name} (backward)") and o.phase == phase)


# --- each term by hand ---------------------------------------------------------------------------------

def test_liger_layer_kernels_move_the_fused_bytes_once():
    """Llama-3.1-8B, 4096 tokens on an H100 (3.35 TB/s): transformers' eager LlamaRMSNorm forward moves 9.002x the
    fused bytes in 8 kernels, rotate_half rotary 5.05x in 10, SwiGLU 5/3x in 2 (measured, kernels.EAGER_TRAFFIC);
    Liger's kernels read and write each tensor once, and its RMSNorm backward adds the per-SM dW partials'
    reduction (a second kernel)."""
    eager, liger = run(llama_8b()), run(llama_8b(), liger=True)
    T, h, f, qk = 4096, 4096, 14336, 4096 + 1024
    norm = 2 * T * h * 2  # read and write T x h in bf16
    assert op(liger, "attention norm").expected_time_s == pytest.approx(norm / (EFF * 3.35e12))
    assert op(eager, "attention norm").expected_time_s == pytest.approx(9.002 * norm / (EFF * 3.35e12))
    assert (op(liger, "attention norm").kernels, op(liger, "MLP norm", "backward").kernels) == (1, 2)
    # SwiGLU: forward reads gate and up, writes the product (3 T f); backward reads dc, a, b, writes da, db (5 T f)
    assert op(liger, "SwiGLU activation").bytes * op(liger, "SwiGLU activation").passes == 3 * T * f * 2
    back = op(liger, "SwiGLU activation", "backward")
    assert back.bytes * back.passes == 5 * T * f * 2
    assert op(eager, "SwiGLU activation", "backward").passes == pytest.approx(1.8)  # 9 T f against 5 T f
    # rotary: q and k rotated in place; backward rotates the gradient in place (read and write, no saved input)
    assert op(liger, "rotary embedding").bytes == 2 * T * qk * 2
    assert op(liger, "rotary embedding", "backward").bytes == 2 * T * qk * 2
    assert op(eager, "rotary embedding", "backward").bytes == 3 * T * qk * 2
    # the Liger terms carry their source; GEMMs and attention are unchanged
    assert "liger-kernel 0.8.5" in op(liger, "rotary embedding").to_json()["source"]
    assert op(eager, "rotary embedding").to_json()["source"] == ""
    for name in ("QKV projection", "fc2", "attention core (flash)"):
        assert op(liger, name).expected_time_s == op(eager, name).expected_time_s
    assert liger.step.compute_s < eager.step.compute_s


def test_liger_does_not_touch_configs_without_it():
    """Without liger_kernel transformers' measured eager chains stand (passes, kernels; kernels.EAGER_TRAFFIC)."""
    eager = run(llama_8b())
    for name, passes, launches in (("attention norm", 9.002, 8), ("rotary embedding", 5.05, 10),
                                   ("SwiGLU activation", 1.667, 2)):
        assert (op(eager, name).passes, op(eager, name).kernels) == (passes, launches)
    assert not any("Liger" in n for n in eager.notes)


def test_fused_linear_cross_entropy_head_by_hand():
    """Llama-3.1-8B, 4096 tokens, bf16 weights and gradients: chunk = next_power_of_2(cdiv(4096, cdiv(128256,
    4096) = 32)) = 128 rows, 32 chunks. Each chunk's three GEMMs read the whole 128256 x 4096 weight; the weight
    gradient's addmm also reads and writes the V x h sum; the cross-entropy kernel reads each chunk of logits
    twice and writes its gradient; all in the forward. Backward scales grad_input and grad_weight (read and
    write each) by grad_output = 1 / num_items_in_batch."""
    T, h, V, chunks = 4096, 4096, 128256, 32
    result = run(llama_8b(), loss="chunked")
    head = [o for o in result.operations if o.scope == "head" and "norm" not in o.name]
    assert [(o.name, o.phase) for o in head] == [
        ("LM head (Liger FLCE)", "forward"), ("cross-entropy (Liger kernel)", "forward"),
        ("LM head (Liger FLCE) (input gradient)", "forward"), ("LM head (Liger FLCE) (weight gradient)", "forward"),
        ("LM head gradients x grad_output (Liger element_mul)", "backward")]
    fwd, ce, dgrad, wgrad, scale = head
    assert fwd.flops == dgrad.flops == wgrad.flops == 2 * T * h * V
    assert fwd.bytes == (T * h + chunks * V * h + T * V) * 2
    assert wgrad.bytes == (T * h + T * V + chunks * V * h + chunks * V * h) * 2
    assert ce.bytes == 3 * T * V * 2 and ce.kernels == chunks
    assert scale.bytes == 2 * (T * h + V * h) * 2
    # each GEMM runs at the efficiency of its 128-row chunk: 128 / (128 + 64) of the 4096-row one's share
    standard = run(llama_8b())
    per_row = kernels.GEMM_HALF
    assert fwd.compute_efficiency / op(standard, "LM head").compute_efficiency == pytest.approx(
        (128 / (128 + per_row)) / (T / (T + per_row)))
    assert "fused_linear_cross_entropy_forward" in fwd.source
    assert any("Liger's fused linear cross-entropy" in n for n in result.notes)
    assert "LM head (Liger FLCE)" in render_roofline_text(result)


def test_fused_linear_cross_entropy_under_a_frozen_head_has_no_weight_gradient():
    """A LoRA run: the head's weight does not require grad, so no grad_weight (weight_needs_grad False)."""
    from estimator.spec.adapter import Adapter
    result = run(llama_8b(), loss="chunked", adapter=Adapter(method="lora", rank=16))
    names = [o.name for o in result.operations if o.scope == "head"]
    assert "LM head (Liger FLCE) (weight gradient)" not in names
    scale = op(result, "LM head gradients x grad_output (Liger element_mul)", "backward")
    assert scale.bytes == 2 * 4096 * 4096 * 2 and scale.kernels == 1


def test_chunked_loss_outside_the_trainer_is_not_liger():
    """fsdp2's chunked loss is torchtitan's own: its head stays one GEMM."""
    result = run(llama_8b(), framework="fsdp2", loss="chunked")
    assert op(result, "LM head").flops == 2 * 4096 * 4096 * 128256


# --- Liger-Kernel's published benchmark (A100) -----------------------------------------------------------

def benchmark() -> dict:
    return json.loads((PUBLISHED / "liger-kernel-benchmark-a100.json").read_text())


def published(kernel, provider, mode, x) -> float:
    rows = [r for r in benchmark()["rows"] if (r["kernel"], r["provider"], r["mode"], r["x"]) ==
            (kernel, provider, mode, x)]
    assert len(rows) == 1, (kernel, provider, mode, x)
    return rows[0]["ms_median"] / 1e3


def norm_times(hidden, liger):
    """Our attention norm over the benchmark's 2048 rows of `hidden` (LlamaRMSNorm against LigerRMSNorm)."""
    result = run(dataclasses.replace(llama_8b(), hidden_size=hidden), A100, liger=liger, seq_len=2048)
    return {p: op(result, "attention norm", p).expected_time_s for p in ("forward", "backward")}


def rope_times(tokens, liger):
    """Our rotary embedding on the benchmark's q (32 heads) and k (8 heads) of width 8192 / 32 = 256."""
    arch = dataclasses.replace(llama_8b(), hidden_size=8192, num_attention_heads=32, num_kv_heads=8, head_dim=256)
    result = run(arch, A100, liger=liger, seq_len=tokens)
    return {p: op(result, "rotary embedding", p).expected_time_s for p in ("forward", "backward")}


def test_benchmark_record_cites_its_source():
    record = benchmark()
    assert len(record["source"]["commit"]) == 40 and record["source"]["path"].endswith(".csv")
    assert {r["gpu"] for r in record["rows"]} == {"NVIDIA A100-SXM4-80GB"}


@pytest.mark.parametrize("kernel, x", [("rms_norm", 16384), ("rms_norm", 32768), ("rope", 8192), ("rope", 16384)])
def test_liger_forward_kernels_at_the_bandwidth_they_reach(kernel, x):
    """Our Liger forward kernel against Liger's measured one: ours streams each byte once at 90% of the A100's
    2,039 GB/s; the published row-wise Triton kernels reach 72-89% of it at these 2,048- to 16,384-row shapes
    (0.077 to 0.089 ms per 64 MiB). Held within 25% faster and never slower: a Liger kernel priced at the eager
    record's 4 passes would be 3x too slow, one that skipped the write half too fast."""
    ours = (norm_times if kernel == "rms_norm" else rope_times)(x, True)["forward"]
    ratio = ours / published(kernel, "liger", "forward", x)
    assert 0.75 <= ratio <= 1.0, ratio


@pytest.mark.parametrize("x", [8192, 16384])
def test_liger_rotary_backward_costs_its_forward(x):
    """Liger's rope backward is its forward kernel on the gradient (BACKWARD_PASS): the published backward takes
    the forward's time (0.2100 against 0.2093 ms, 0.4102 against 0.4105 ms); ours moves the same bytes both ways,
    where a fused backward that also read the saved input (out + 2 in) would be 1.5x. Within 5% (the rows'
    own spread between their 20th and 80th percentiles)."""
    ours = rope_times(x, True)
    published_ratio = published("rope", "liger", "backward", x) / published("rope", "liger", "forward", x)
    assert ours["backward"] / ours["forward"] == pytest.approx(published_ratio, rel=0.05)


@pytest.mark.parametrize("tokens", [4096, 8192])
def test_swiglu_mlp_ratio(tokens):
    """LigerSwiGLUMLP against LlamaMLP (4 x tokens, h 4096, f 11008, its three GEMMs included): published 0.991
    and 0.990; ours the same GEMMs with the activation at the fused bytes instead of 5/3 of them, within 1%
    (the activation is 2-3% of the MLP's time here, the GEMMs the rest)."""
    arch = dataclasses.replace(llama_8b(), intermediate_size=11008)
    names = ("fc1 (gate and up)", "SwiGLU activation", "fc2")

    def mlp(liger):
        result = run(arch, A100, liger=liger, seq_len=tokens, mb=4)
        return sum(op(result, n).expected_time_s for n in names)
    ratio = published("swiglu", "liger", "forward", tokens) / published("swiglu", "huggingface", "forward", tokens)
    assert mlp(True) / mlp(False) == pytest.approx(ratio, rel=0.01)


_ROPE_GAP = ("transformers' rotate_half rotary moves 5.05x the fused bytes forward (measured, kernels.EAGER_TRAFFIC: "
             "q * cos, neg and cat of the halves, * sin, add, for q and k) where the published HF / Liger time ratio is "
             "9.2-9.3x: on the A100 HF's ten kernels take 2.1x our time at 90% of the bandwidth (0.48 of the published "
             "time), Liger's 1.15x; what eager elementwise kernels on transposed half-width slices reach is not modelled")


@pytest.mark.parametrize("kernel, x", [
    ("rms_norm", 16384), ("rms_norm", 32768),
    pytest.param("rope", 8192, marks=pytest.mark.xfail(strict=True, reason=_ROPE_GAP)),
    pytest.param("rope", 16384, marks=pytest.mark.xfail(strict=True, reason=_ROPE_GAP))])
def test_huggingface_over_liger_forward_ratio(kernel, x):
    """The per-kernel ratio, within 20% (the spread of the published rows across shapes): LlamaRMSNorm's measured
    9.002x the fused bytes in 8 kernels against Liger's one pass: 9.0x ours, 10.35x and 10.53x published."""
    times = norm_times if kernel == "rms_norm" else rope_times
    ours = times(x, False)["forward"] / times(x, True)["forward"]
    theirs = published(kernel, "huggingface", "forward", x) / published(kernel, "liger", "forward", x)
    assert ours == pytest.approx(theirs, rel=0.2)


# --- the README's end-to-end run -------------------------------------------------------------------------

def e2e() -> dict:
    return json.loads((PUBLISHED / "liger-readme-llama3-8b-fsdp1-8xa100.json").read_text())


def e2e_tokens_per_s(seq_len, liger):
    """LLaMA 3-8B, 8 per GPU, bf16, AdamW, gradient checkpointing, FSDP1 on 8 A100s; Liger: its layer kernels and
    fused linear cross-entropy (the Trainer's use_liger_kernel)."""
    kw = dict(liger=True, loss="chunked") if liger else {}
    result = run(llama_8b(), A100, framework="fsdp1", seq_len=seq_len, mb=8, recompute="full",
                 par=Parallel(dp=8, zero_stage=3), **kw)
    return result.step.tokens_per_s_per_gpu


def test_e2e_record_cites_its_source():
    record = e2e()
    assert len(record["source"]["commit"]) == 40 and record["hardware"]["gpus"] == 8
    assert [r["seq_len"] for r in record["measured"]["runs"]] == [1024, 2048]


_E2E_HF = ("with transformers' measured eager traffic (kernels.EAGER_TRAFFIC) our 2048-token run is 2,825 tokens/s "
           "against the bar's 3,270 (-13.6%; 2,972 with the former 4x guess): the bar is 49% MFU, 65% of the A100's "
           "peak counting full recompute's second forward; our GEMMs (82% of our layers' compute) run at the MAMF share times "
           "IN_STEP, and the per-kernel rows above show HF's eager kernels slower than ours, so the gap is not the "
           "elementwise bytes")


@pytest.mark.parametrize("seq_len", [1024, pytest.param(2048, marks=pytest.mark.xfail(strict=True, reason=_E2E_HF))])
def test_e2e_huggingface_throughput(seq_len):
    """Without Liger our tokens/s per GPU is within 12% (issue 22's median goal) of the chart's bar: 2,868 against
    3,170 (the bars read to +-50)."""
    run_ = next(r for r in e2e()["measured"]["runs"] if r["seq_len"] == seq_len)
    assert e2e_tokens_per_s(seq_len, False) == pytest.approx(run_["huggingface"], rel=0.12)


_E2E_SPEEDUP = ("our Liger speed-up is +7.9% and +9.3% (measured eager traffic; +2.5% and +3.9% with the former 4x "
                "guess) against the chart's +14.2% and +15.0%: Liger replaces transformers' norm and rotary chains, "
                "whose A100 kernels take 1.4-2.1x our time at their measured bytes (the per-kernel rows above), so the "
                "saving is still under-counted")


@pytest.mark.xfail(strict=True, reason=_E2E_SPEEDUP)
@pytest.mark.parametrize("seq_len", [1024, 2048])
def test_e2e_speedup_ratio(seq_len):
    """The published speed-up, within 4% (the bars read to +-50 tokens/s: +-2% on each, +-3% on their ratio)."""
    run_ = next(r for r in e2e()["measured"]["runs"] if r["seq_len"] == seq_len)
    ours = e2e_tokens_per_s(seq_len, True) / e2e_tokens_per_s(seq_len, False)
    assert ours == pytest.approx(run_["liger"] / run_["huggingface"], rel=0.04)


def test_flce_chunk_count_follows_the_source_rule():
    """32 chunks for 4096 tokens of Llama 3 (V 128256, h 4096): the chunk rule of the memory model."""
    from estimator.memory.activations.loss import liger_chunk_tokens
    assert math.ceil(4096 / liger_chunk_tokens(4096, 4096, 128256)) == 32
