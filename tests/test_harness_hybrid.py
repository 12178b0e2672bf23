"""The hybrid models' harness (validation/hybrid): each emulated CUDA kernel gives transformers' eager
(torch fallback) numbers on tiny real CPU runs, allocates and saves by hand what its kernel's source
does, and the fake-tensor measurement equals a real CPU run byte for byte. Needs torch, transformers."""

import json
import math
from contextlib import nullcontext

import pytest

torch = pytest.importorskip("torch", reason="the measuring harness needs torch (the [validate] extra)")
pytest.importorskip("transformers", reason="the measuring harness needs transformers (the [validate] extra)")

from validation.core.record import MEASURED  # noqa: E402
from validation.core.tracker import StorageTracker, cuda_block_bytes  # noqa: E402
from validation.hf.cases import CASES, contract_config  # noqa: E402
from validation.hf.step import Run, build, measure  # noqa: E402
from validation.hybrid.kernels import (CausalConv1d, ChunkGatedDeltaRule, MambaSplitConv1dScanCombined,  # noqa: E402
                                       hybrid_kernels)
from validation.hybrid.models import HYBRID_RUNS, MODELS  # noqa: E402

TINY = ["tiny-qwen3-next", "tiny-nemotron-h", "tiny-jamba", "tiny-falcon-h1", "tiny-falcon-h1-plain"]


def loss_and_grads(model_id: str, emulated: bool):
    """A tiny model's loss and parameter gradients on one real CPU batch, with the emulated kernels or
    with transformers' torch fallbacks (what the emulations must reproduce)."""
    torch.manual_seed(0)
    run = Run(model_id, 48, 2)
    tracker = StorageTracker()
    with hybrid_kernels(tracker) if emulated else nullcontext():
        model, _ = build(run)
        model.float()  # fp32 so that equality is a statement about the maths, not bf16 rounding
        ids = torch.randint(0, model.config.vocab_size, (2, 48), generator=torch.Generator().manual_seed(1))
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
    return loss.detach(), {n: p.grad for n, p in model.named_parameters()}


@pytest.mark.parametrize("model_id", TINY)
def test_emulated_kernels_give_the_eager_numbers(model_id):
    eager_loss, eager_grads = loss_and_grads(model_id, emulated=False)
    loss, grads = loss_and_grads(model_id, emulated=True)
    assert torch.equal(loss, eager_loss)
    assert grads.keys() == eager_grads.keys()
    for name, g in grads.items():
        assert g is not None and torch.allclose(g, eager_grads[name], rtol=1e-5, atol=1e-6), name


@pytest.mark.parametrize("run", [Run("tiny-qwen3-next", 64, 2), Run("tiny-qwen3-next", 64, 2, recompute="full"),
                                 Run("tiny-nemotron-h", 64, 2), Run("tiny-nemotron-h", 64, 2, recompute="full"),
                                 Run("tiny-jamba", 64, 2), Run("tiny-jamba", 64, 2, recompute="full"),
                                 Run("tiny-falcon-h1", 64, 2), Run("tiny-falcon-h1", 64, 2, recompute="full"),
                                 Run("tiny-falcon-h1-plain", 64, 2)],
                         ids=lambda r: f"{r.model}-{r.recompute}")
def test_fake_measurement_equals_real_cpu_run(run):
    assert measure(run, fake=True) == measure(run, fake=False)


def test_falcon_h1_runs_its_mixer_through_the_fused_kernel():
    """Falcon-H1's training forward takes the fused call (emulated), not the torch fallback's chunk loop."""
    calls = []
    original = MambaSplitConv1dScanCombined.forward

    def counted(ctx, *args):
        calls.append(args[0].shape)
        return original(ctx, *args)

    MambaSplitConv1dScanCombined.forward = staticmethod(counted)
    try:
        loss_and_grads("tiny-falcon-h1", emulated=True)
    finally:
        MambaSplitConv1dScanCombined.forward = staticmethod(original)
    # one call per layer on the muP-scaled in_proj output: z, x (64 each), B, C (2 groups x 8), dt (4 heads)
    assert calls == [(2, 48, 2 * 64 + 2 * 2 * 8 + 4)] * 3


def new_bytes(fn, *inputs):
    """Bytes that a call leaves alive (its saved tensors and output), inputs already registered."""
    tracker = StorageTracker()
    with tracker:
        for t in inputs:
            if torch.is_tensor(t):
                tracker.adopt(t)
        before = sum(tracker.live_at(len(tracker.events)).values())
        out = fn(tracker)
        after = sum(tracker.live_at(len(tracker.events)).values())
    return after - before, out


def test_gated_delta_rule_saves_what_fla_saves():
    # B, T, H, K key heads; HV value heads of V (grouped value attention)
    B, T, H, K, HV, V = 1, 128, 2, 32, 4, 32
    bf16 = torch.bfloat16
    q, k = (torch.randn(B, T, H, K, dtype=bf16, requires_grad=True) for _ in range(2))
    v = torch.randn(B, T, HV, V, dtype=bf16, requires_grad=True)
    g = -torch.rand(B, T, HV, requires_grad=True)
    beta = torch.rand(B, T, HV, dtype=bf16, requires_grad=True)
    from transformers.models.qwen3_next.modeling_qwen3_next import torch_chunk_gated_delta_rule as reference

    def ref(q_, k_, v_, g_, b_):
        return reference(q_, k_, v_, g=g_, beta=b_, use_qk_l2norm_in_kernel=True)[0]

    alive, out = new_bytes(lambda t: ChunkGatedDeltaRule.apply(q, k, v, g, beta, t.hidden, ref), q, k, v, g, beta)
    blk = cuda_block_bytes
    # l2-normalised q and k with their fp32 rstd, the fp32 chunk-cumulated g, A (B, T, HV, 64) in bf16
    # (v and beta were contiguous: input_guard's copies are the inputs themselves), and the output o
    saved = 2 * (blk(B * T * H * K * 2) + blk(B * T * H * 4)) + blk(B * T * HV * 4) + blk(B * T * HV * 64 * 2)
    assert alive == saved + blk(B * T * HV * V * 2)
    assert out.shape == (B, T, HV, V) and out.dtype == bf16
    assert torch.equal(out, ref(q, k, v, g, beta))


def test_causal_conv1d_saves_its_input_and_keeps_the_layout():
    x = torch.randn(2, 40, 96, dtype=torch.bfloat16).transpose(1, 2)  # (b, d, s) channels-last, as transformers
    w = torch.randn(96, 4, dtype=torch.bfloat16, requires_grad=True)
    from transformers.models.qwen3_next.modeling_qwen3_next import causal_conv1d_fn as reference

    alive, out = new_bytes(lambda t: CausalConv1d.apply(x, w, None, "silu", t.hidden, reference), x, w)
    assert alive == cuda_block_bytes(2 * 40 * 96 * 2)  # only the output: x and the weight are saved as they are
    assert out.stride() == x.stride()  # empty_like(x)
    assert torch.equal(out, reference(x, w, None, "silu"))


def test_mamba_fused_mixer_saves_its_input_scan_output_and_rstd():
    b, s, h, p, g, n, hidden, chunk = 1, 64, 4, 16, 2, 16, 32, 16
    dim, conv_dim = h * p, h * p + 2 * g * n
    bf16 = torch.bfloat16
    zxbcdt = torch.randn(b, s, dim + conv_dim + h, dtype=bf16, requires_grad=True)
    conv_w = torch.randn(conv_dim, 4, dtype=bf16, requires_grad=True)
    conv_b = torch.randn(conv_dim, dtype=bf16, requires_grad=True)
    dt_bias, D = (torch.rand(h, dtype=bf16, requires_grad=True) for _ in range(2))
    A = -torch.rand(h, requires_grad=True)
    rms_w = torch.ones(dim, dtype=bf16, requires_grad=True)
    out_w = torch.randn(hidden, dim, dtype=bf16, requires_grad=True)
    from transformers.models.nemotron_h import modeling_nemotron_h as nemotron

    from validation.hybrid.kernels import mamba_split_conv1d_scan_combined
    tensors = (zxbcdt, conv_w, conv_b, dt_bias, A, D, rms_w, out_w)

    def call(tracker):
        fn = mamba_split_conv1d_scan_combined(tracker.hidden, nemotron.causal_conv1d_fn, nemotron.mamba2_chunk_scan)
        return fn(zxbcdt, conv_w, conv_b, dt_bias, A, D=D, chunk_size=chunk, rmsnorm_weight=rms_w,
                  rmsnorm_eps=1e-5, outproj_weight=out_w, headdim=p, ngroups=g, norm_before_gate=False)

    alive, out = new_bytes(call, *tensors)
    blk = cuda_block_bytes
    # saved: zxbcdt and the weights as they are, the scan output out_x (b, s, h, p) and the norm's fp32
    # rstd per group and token; the output (b, s, hidden)
    assert alive == blk(b * s * dim * 2) + blk(g * b * s * 4) + blk(b * s * hidden * 2)
    # the eager path: the mixer's torch fallbacks (conv, chunk scan, gated norm, projection)
    z, xBC, dt = zxbcdt.split([dim, conv_dim, h], dim=-1)
    xBC = nemotron.causal_conv1d_fn(xBC.transpose(1, 2), conv_w, conv_b, activation="silu").transpose(1, 2)
    x, B, C = xBC.split([dim, g * n, g * n], dim=-1)
    y = nemotron.mamba2_chunk_scan(x.reshape(b, s, h, p), dt, A, B.reshape(b, s, g, n), C.reshape(b, s, g, n),
                                   chunk_size=chunk, D=D, dt_bias=dt_bias, dt_softplus=True)
    norm = nemotron.NemotronHRMSNormGated(dim, group_size=dim // g, eps=1e-5).to(bf16)
    expected = torch.nn.functional.linear(norm(y.reshape(b, s, dim), z).to(bf16), out_w)
    assert torch.equal(out, expected)
    assert MambaSplitConv1dScanCombined.__name__ in type(out.grad_fn).__name__


def test_selective_scan_saves_what_mamba_ssm_saves():
    """Jamba's call: u the conv output (b, d, l) contiguous, delta from dt_proj's matmul, B and C (b, n, l) views of
    (b, l, n) tensors, z a channel slice of the transposed in_proj output. Kept: contiguous copies of B, C and z,
    `out = empty_like(delta)`, x (b, d, chunks, 2n) fp32, and the returned out_z; u, delta, A, D and delta_bias as
    they are. Over 2048 tokens the kernel keeps one more chunk state."""
    from transformers.models.jamba.modeling_jamba import mamba_selective_scan as reference

    from validation.hybrid.mamba1 import SelectiveScan, selective_scan_fn

    b, d, n, bf16 = 1, 32, 4, torch.bfloat16
    blk = cuda_block_bytes
    for l, chunks in ((64, 1), (2049, 2)):
        u = torch.randn(b, d, l, dtype=bf16, requires_grad=True)
        delta = torch.rand(b, d, l, dtype=bf16, requires_grad=True)
        A = -torch.rand(d, n, requires_grad=True)
        B, C = (torch.randn(b, l, n, dtype=bf16, requires_grad=True) for _ in range(2))
        z = torch.randn(b, l, 2 * d, dtype=bf16, requires_grad=True)
        D, bias = torch.rand(d, requires_grad=True), torch.rand(d, requires_grad=True)
        gate = z.transpose(1, 2)[:, d:]

        def call(tracker):
            fn = selective_scan_fn(tracker.hidden, reference)
            return fn(u, delta, A, B.transpose(1, 2), C.transpose(1, 2), D=D, z=gate, delta_bias=bias,
                      delta_softplus=True)

        alive, out = new_bytes(call, u, delta, A, B, C, z, D, bias)
        assert alive == 2 * blk(b * n * l * 2) + 3 * blk(b * d * l * 2) + blk(b * d * chunks * 2 * n * 4)
        assert SelectiveScan.__name__ in type(out.grad_fn).__name__
        if l == 64:  # the values: transformers' torch fallback
            expected = reference(u, delta, A, B.transpose(1, 2), C.transpose(1, 2), D=D, z=gate, delta_bias=bias,
                                 delta_softplus=True)
            assert torch.equal(out, expected.to(bf16))  # the fallback computes in fp32; out_z is z's dtype


def test_records_are_complete():
    hybrid = {case for case, run in CASES.items() if run.model in MODELS}
    records = [json.loads((MEASURED / f"{case}.json").read_text()) for case in sorted(hybrid)]
    assert len(records) == len(HYBRID_RUNS) >= 6
    for r in records:
        assert r["config"] == contract_config(CASES[r["id"]])
        m = r["measured"]
        assert m["peak_bytes"] == sum(m[c] for c in ("parameters", "gradients", "optimizer_states", "activations"))
        assert r["command"] == f"python -m validation measure --case {r['id']}"
        model = MODELS[CASES[r["id"]].model]
        # every parameter in bf16, once as weights and once as gradients at the optimizer's peak
        assert m["phases"]["optimizer"]["gradients"] == m["parameters"]
        assert math.isclose(m["optimizer_states"], 2 * m["parameters"], rel_tol=1e-9), model.id


def test_gpu_comparison_counts_the_saved_tensors_by_hand():
    # validation/hybrid/gpu_fla.py's emulated side, for Qwen3-Next's layer at 4096 tokens: q and k
    # normalised (bf16) with fp32 rstd, v copied contiguous (a view of the conv output), fp32 cumulated g,
    # A (T, HV, 64) bf16, and the output o; beta is a contiguous leaf (no copy)
    from validation.hybrid.gpu_fla import emulated

    T, H, K, HV, V = 4096, 16, 128, 32, 128
    saved = 2 * (T * H * K * 2 + T * H * 4) + T * HV * V * 2 + T * HV * 4 + T * HV * 64 * 2
    assert emulated((1, T, H, K, HV, V))["forward_alive"] == saved + T * HV * V * 2 == 118_489_088
