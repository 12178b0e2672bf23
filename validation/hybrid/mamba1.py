"""mamba-ssm's Mamba-1 selective scan, emulated for a CPU measurement (issue 28: Jamba).

On a GPU with mamba-ssm installed, transformers 5.23's `JambaMambaMixer.forward` calls the package's
`selective_scan_fn` (through `use_kernel_func_from_hub_with_fallback("selective_scan_fn", "mamba_ssm")`, which
keeps only the keyword arguments the package's function takes) after causal-conv1d's `causal_conv1d_fn`
(emulated in kernels.py). Its torch fallback keeps fp32 copies of every discretised tensor per token and
state, so a CPU run of it measures a different model; the kernel is emulated here as kernels.py emulates
the others: an autograd Function that allocates what the kernel allocates, keeps what its
`ctx.save_for_backward` keeps, and on a real CPU run takes its values from transformers' torch fallback,
computed where the tracker does not look.

Source read: state-spaces/mamba@e9594ce (v2.3.2.post1-9), mamba_ssm/ops/selective_scan_interface.py
`SelectiveScanFn` and csrc/selective_scan/selective_scan.cpp `selective_scan_fwd` / `selective_scan_bwd`.
"""

from __future__ import annotations

import torch

from .kernels import _fake, _grads

SCAN_CHUNK = 2048  # selective_scan.cpp: n_chunks = (seqlen + 2048 - 1) / 2048


class SelectiveScan(torch.autograd.Function):
    """`SelectiveScanFn` with a gate z, as Jamba calls it: u, delta, z (b, d, l); A (d, n) fp32; B, C
    (b, n, l), variable per token; D and delta_bias fp32 (d,).

    Forward (selective_scan_interface.py): u, delta, B, C and z made contiguous when their last stride
    is not 1, D made contiguous, B and C viewed as (b, 1, n, l); selective_scan_fwd allocates
    `out = torch::empty_like(delta)`, `x = torch::empty({b, d, n_chunks, 2 n}, fp32)` (the state at each
    2048-token chunk's end) and `out_z = torch::empty_like(z)`; saved: (u, delta, A, B, C, D, z,
    delta_bias, x, out); returned: out_z.
    Backward: dout made contiguous when its last stride is not 1; selective_scan_bwd allocates
    `du = empty_like(u)`, `ddelta = empty_like(delta)`, `dA = zeros_like(A)`, dB and dC fp32 zeros
    (variable B, C), dD and ddelta_bias zeros like D and delta_bias, `dz = empty_like(z)`, and returns
    `dB.to(B.dtype())`, `dC.to(C.dtype())` (new tensors: the fp32 ones die when it returns)."""

    @staticmethod
    def forward(ctx, u, delta, A, B, C, D, z, delta_bias, delta_softplus, hidden, reference):
        inputs = (u, delta, A, B, C, D, z, delta_bias)
        if u.stride(-1) != 1:
            u = u.contiguous()
        if delta.stride(-1) != 1:
            delta = delta.contiguous()
        D = D.contiguous()
        if B.stride(-1) != 1:
            B = B.contiguous()
        if C.stride(-1) != 1:
            C = C.contiguous()
        if z.stride(-1) != 1:
            z = z.contiguous()
        B4, C4 = B.unsqueeze(1), C.unsqueeze(1)  # rearrange "b dstate l -> b 1 dstate l"
        b, d, l = u.shape
        n_chunks = -(-l // SCAN_CHUNK)
        out = torch.empty_like(delta)
        x = torch.empty(b, d, n_chunks, 2 * A.shape[1], dtype=torch.float32, device=u.device)
        out_z = torch.empty_like(z)
        if not _fake(u):
            with hidden(), torch.no_grad():
                out_z.copy_(reference(*inputs, delta_softplus))
        ctx.save_for_backward(u, delta, A, B4, C4, D, z, delta_bias, x, out)
        ctx.delta_softplus, ctx.hidden, ctx.reference = delta_softplus, hidden, reference
        return out_z

    @staticmethod
    def backward(ctx, dout):
        u, delta, A, B4, C4, D, z, delta_bias, x, out = ctx.saved_tensors
        if dout.stride(-1) != 1:
            dout = dout.contiguous()
        du, ddelta = torch.empty_like(u), torch.empty_like(delta)
        dA = torch.zeros_like(A)
        dB32 = torch.zeros_like(B4, dtype=torch.float32)
        dC32 = torch.zeros_like(C4, dtype=torch.float32)
        dD = torch.zeros_like(D)
        ddelta_bias = torch.zeros_like(delta_bias)
        dz = torch.empty_like(z)
        if not _fake(u):
            ref = _grads(lambda *t: ctx.reference(*t, ctx.delta_softplus),
                         (u, delta, A, B4.squeeze(1), C4.squeeze(1), D, z, delta_bias), dout, ctx.hidden)
            for buf, r in zip((du, ddelta, dA, dB32, dC32, dD, dz, ddelta_bias), ref):
                buf.copy_(r.reshape(buf.shape))
        dB, dC = dB32.to(B4.dtype), dC32.to(C4.dtype)
        del dB32, dC32
        return du, ddelta, dA, dB.squeeze(1), dC.squeeze(1), dD, dz, ddelta_bias, None, None, None


def selective_scan_fn(hidden, reference):
    """transformers' `mamba_selective_scan(u, delta, A, B, C, D=, z=, delta_bias=, delta_softplus=True)`
    as mamba-ssm's `selective_scan_fn` answers it (training: no last state)."""

    def fn(u, delta, A, B, C, D=None, z=None, delta_bias=None, delta_softplus=False, return_last_state=False,
           **kwargs):
        if return_last_state or D is None or z is None or delta_bias is None or B.dim() != 3 or C.dim() != 3:
            raise NotImplementedError("only Jamba's training call (gate z, D, delta_bias, variable B and C) is emulated")

        def ref(u_, delta_, A_, B_, C_, D_, z_, bias_, softplus):
            return reference(u_, delta_, A_, B_, C_, D=D_, z=z_, delta_bias=bias_, delta_softplus=softplus)

        return SelectiveScan.apply(u, delta, A, B, C, D, z, delta_bias, delta_softplus, hidden, ref)

    return fn


def jamba_patches(tracker, causal_conv1d_fn):
    """(module, name, emulation) for Jamba's kernels: causal-conv1d and the selective scan."""
    from transformers.models.jamba import modeling_jamba as jamba

    return [(jamba, "causal_conv1d_fn", causal_conv1d_fn(tracker.hidden, jamba.causal_conv1d_fn)),
            (jamba, "mamba_selective_scan", selective_scan_fn(tracker.hidden, jamba.mamba_selective_scan))]
