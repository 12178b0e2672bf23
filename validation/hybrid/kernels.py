"""The CUDA-only kernels of hybrid models, emulated for a CPU measurement.

On a GPU with the kernel packages installed, transformers 5.23 calls them in place of its PyTorch
fallbacks (`integrations.hub_kernels.use_kernel_func_from_hub_with_fallback`: the package's function
when it imports, else the torch path):

- Qwen3-Next's Gated DeltaNet layer (`Qwen3NextGatedDeltaNet.forward`): `causal_conv1d_fn` from
  causal-conv1d on the concatenated q, k, v, then `chunk_gated_delta_rule` from
  flash-linear-attention (`fla.ops.gated_delta_rule`) with `use_qk_l2norm_in_kernel=True`.
- Nemotron-H's Mamba-2 mixer in training (`NemotronHMamba2Mixer.forward`, `self.training` and no
  cache): `mamba_split_conv1d_scan_combined` from mamba-ssm, which fuses the causal conv, the chunked
  SSD scan, the gated RMSNorm and the output projection in one autograd Function.
- Jamba's Mamba-1 mixer (`JambaMambaMixer.forward`): `causal_conv1d_fn` on x, then mamba-ssm's
  `selective_scan_fn` (emulated in mamba1.py).
- Falcon-H1's Mamba-2 mixer in training (`FalconH1Mixer.forward`): the same fused
  `mamba_split_conv1d_scan_combined` as Nemotron-H, on in_proj's output scaled by the muP vector.

The torch fallbacks save other tensors (the eager chunk loop keeps fp32 copies of everything), so a
CPU run of the fallback measures a different model. Each kernel is emulated here as the harness
emulates FlashAttention-2 (validation/emulation.py): an autograd Function that allocates what the
kernel's Python wrapper allocates, in its order, keeps for backward exactly what its
`ctx.save_for_backward` keeps, and frees its temporaries where the wrapper's locals die. The values
of a real CPU run come from transformers' own torch fallback, computed where the tracker does not
look (`tracker.hidden()`) and copied into the buffers; under fake tensors there are no values.

Kernel sources read (the allocations cited per function below):
- flash-linear-attention, fla-org/flash-linear-attention@bc3b101 (v0.5.2-47):
  fla/ops/gated_delta_rule/chunk.py `ChunkGatedDeltaRuleFunction`, chunk_fwd.py, wy_fast.py,
  fla/ops/common/chunk_delta_h.py, chunk_o.py, fla/modules/l2norm.py, fla/ops/utils/cumsum.py,
  fla/utils/_decorators.py `input_guard`.
- causal-conv1d, Dao-AILab/causal-conv1d@0d2252d (v1.6.1.post4): causal_conv1d_interface.py
  `CausalConv1dFn`, cpp_functions.py.
- mamba-ssm, state-spaces/mamba@e9594ce (v2.3.2.post1-9): mamba_ssm/ops/triton/ssd_combined.py
  `MambaSplitConv1dScanCombinedFn`, `_mamba_chunk_scan_combined_fwd/_bwd`, ssd_chunk_state.py,
  ssd_state_passing.py, ssd_bmm.py, ssd_chunk_scan.py, layernorm_gated.py.

Workspaces of a few bytes per head or per chunk (dD partials, per-head reductions) are left out:
they are below the allocator's 512-byte block for the sizes measured, or a few kB at most.
"""

from __future__ import annotations

import math
from contextlib import contextmanager

import torch
import torch.nn.functional as F
from torch._subclasses.fake_tensor import FakeTensor

FLA_CHUNK = 64  # chunk_gated_delta_rule's default chunk_size (fla chunk.py)
HOPPER_SMS = 132  # H100 SXM multiprocessors: mamba-ssm sizes some workspaces by the device's SM count


def _fake(t: torch.Tensor) -> bool:
    return isinstance(t, FakeTensor)


def _next_pow2(n: int) -> int:
    return 1 << (n - 1).bit_length()


def _grads(fn, inputs, grad_out, hidden):
    """The reference path's gradients of `fn(*inputs)` (None for inputs that are None), computed
    where the tracker does not look."""
    with hidden(), torch.enable_grad():
        leaves = [None if t is None else t.detach().requires_grad_() for t in inputs]
        out = fn(*leaves)
        wanted = [t for t in leaves if t is not None]
        found = iter(torch.autograd.grad(out, wanted, grad_out, allow_unused=True))
        return [None if t is None else next(found) for t in leaves]


# --- causal-conv1d ------------------------------------------------------------------------------


class CausalConv1d(torch.autograd.Function):
    """causal-conv1d's `CausalConv1dFn` (causal_conv1d_interface.py): x (batch, dim, seqlen), weight
    (dim, width), optional bias; SiLU fused. Forward: `x.contiguous()` only when neither the channel
    nor the time stride is 1, `out = torch.empty_like(x)` (cpp_functions.causal_conv1d_fwd_function,
    so x's layout), saves (x, weight, bias). Backward: dout made contiguous under the same rule,
    `dx = torch.empty_like(x)`, dweight and dbias as fp32 zeros then `type_as` the weight."""

    @staticmethod
    def forward(ctx, x, weight, bias, activation, hidden, reference):
        if x.stride(2) != 1 and x.stride(1) != 1:
            x = x.contiguous()
        out = torch.empty_like(x)
        if not _fake(x):
            with hidden(), torch.no_grad():
                out.copy_(reference(x, weight, bias, activation))
        ctx.save_for_backward(x, weight, bias)
        ctx.activation, ctx.hidden, ctx.reference = activation, hidden, reference
        return out

    @staticmethod
    def backward(ctx, dout):
        x, weight, bias = ctx.saved_tensors
        if dout.stride(2) != 1 and dout.stride(1) != 1:
            dout = dout.contiguous()
        dx = torch.empty_like(x)
        dweight = torch.zeros_like(weight, dtype=torch.float32)
        dbias = torch.zeros_like(bias, dtype=torch.float32) if bias is not None else None
        if not _fake(x):
            ref = _grads(lambda x_, w_, b_: ctx.reference(x_, w_, b_, ctx.activation), (x, weight, bias), dout,
                         ctx.hidden)
            for buf, g in zip((dx, dweight, dbias), ref):
                if buf is not None:
                    buf.copy_(g)
        dweight = dweight.type_as(weight)
        dbias = dbias.type_as(bias) if bias is not None else None
        return dx, dweight, dbias, None, None, None


def causal_conv1d_fn(hidden, reference):
    """transformers' `causal_conv1d_fn(hidden_states, weight, bias, activation, **kwargs)` as the
    causal-conv1d package answers it (no packed sequences: `seq_idx` is None in these runs)."""

    def fn(hidden_states, weight, bias=None, activation=None, seq_idx=None, **kwargs):
        if seq_idx is not None or kwargs.get("initial_states") is not None:
            raise NotImplementedError("only the unpacked, stateless training call is emulated")
        return CausalConv1d.apply(hidden_states, weight, bias, activation, hidden, reference)

    return fn


# --- flash-linear-attention: chunked gated delta rule ------------------------------------------


class ChunkGatedDeltaRule(torch.autograd.Function):
    """fla's `ChunkGatedDeltaRuleFunction` with `use_qk_l2norm_in_kernel=True`, no initial state, no
    final state, chunk 64. q, k (B, T, H, K); v (B, T, HV, V), HV a multiple of H (grouped value
    heads); g (log decay) and beta (B, T, HV).

    Forward (chunk.py `forward` under `input_guard`, which makes every tensor argument contiguous
    and holds those copies until forward returns):
      l2norm_fwd(q), l2norm_fwd(k): y = empty_like(x), rstd fp32 (B*T*H,)   (l2norm.py)
      chunk_local_cumsum(g): fp32 copy of g                                   (cumsum.py)
      chunk_gated_delta_rule_fwd_intra: A zeros (B, T, HV, 64) in k's dtype;
        recompute_w_u_fwd: w (B, T, HV, K), u = empty_like(v)                (chunk_fwd.py, wy_fast.py)
      chunk_gated_delta_rule_fwd_h: h (B, NT, HV, K, V) in k's dtype, v_new = empty_like(u)
      chunk_fwd_o: o = empty_like(v_new)                                      (chunk_o.py)
      saved: q and k normalised, their rstd, v, the cumulated g, beta, A.
    Backward (chunk.py `chunk_gated_delta_rule_bwd`): w, u, h, v_new recomputed; dv (local); dh
    (B, NT, HV, K, V) and dv2 (chunk_delta_h.py); dq, dk (B, T, HV, K), dg fp32 (NK, B, T, HV), dw,
    dq and dk summed over each group of value heads into (B, T, H, K) (chunk_o.py
    `chunk_bwd_dqkwg`); prepare_wy_repr_bwd: dk2 (B, T, HV, K) summed likewise, dv, dg2, db;
    dg's reverse cumsum (a new fp32 tensor); l2norm_bwd: dx = empty_like(y) for q and k."""

    @staticmethod
    def forward(ctx, q, k, v, g, beta, hidden, reference):
        q_c, k_c, v_c, g_c, beta_c = (t.contiguous() for t in (q, k, v, g, beta))  # input_guard
        B, T, H, K = k.shape
        HV, V = v.shape[2], v.shape[3]
        nt = -(-T // FLA_CHUNK)
        q_n, q_rstd = torch.empty_like(q_c), q_c.new_empty((B * T * H,), dtype=torch.float32)
        k_n, k_rstd = torch.empty_like(k_c), k_c.new_empty((B * T * H,), dtype=torch.float32)
        g_cum = torch.empty_like(g_c, dtype=torch.float32)
        A = torch.zeros(B, T, HV, FLA_CHUNK, dtype=k_n.dtype, device=k_n.device)
        w, u = k_n.new_empty(B, T, HV, K), torch.empty_like(v_c)
        h, v_new = k_n.new_empty(B, nt, HV, K, V), torch.empty_like(u)
        o = torch.empty_like(v_new)
        del w, u, h, v_new
        if not _fake(q):
            with hidden(), torch.no_grad():
                o.copy_(reference(q, k, v, g, beta))
        ctx.save_for_backward(q_n, q_rstd, k_n, k_rstd, v_c, g_cum, beta_c, A)
        ctx.inputs = None
        if not _fake(q):  # the reference's inputs for its gradients, copied where the tracker does not look
            with hidden():
                ctx.inputs = tuple(t.detach().clone() for t in (q, k, v, g, beta))
        ctx.hidden, ctx.reference = hidden, reference
        del q_c, k_c, g_c  # input_guard's copies die with the call
        return o

    @staticmethod
    def backward(ctx, do):
        q_n, q_rstd, k_n, k_rstd, v, g_cum, beta, A = ctx.saved_tensors
        do = do.contiguous()
        B, T, H, K = k_n.shape
        HV, V = v.shape[2], v.shape[3]
        nt = -(-T // FLA_CHUNK)
        w, u = k_n.new_empty(B, T, HV, K), torch.empty_like(v)  # recompute_w_u_fwd
        h, v_new = k_n.new_empty(B, nt, HV, K, V), torch.empty_like(u)  # chunk_gated_delta_rule_fwd_h
        dv = torch.empty_like(do)  # chunk_bwd_dv_local
        dh, dv2 = q_n.new_empty(B, nt, HV, K, V), torch.empty_like(dv)  # chunk_gated_delta_rule_bwd_dhu
        dv = dv2  # `dh, dh0, dv = ...`: the local dv dies here
        del dv2
        # chunk_bwd_dqkwg: BK = min(max(next_pow2(K), 16), 128) on Hopper, NK = ceil(K / BK)
        nk = -(-K // min(max(_next_pow2(K), 16), 128))
        dq, dk = q_n.new_empty(B, T, HV, K), k_n.new_empty(B, T, HV, K)
        dg = torch.empty(nk, B, T, HV, dtype=torch.float32, device=g_cum.device)
        dw = torch.empty_like(w)
        if H != HV:
            dq = dq.view(B, T, H, HV // H, K).sum(3)
            dk = dk.view(B, T, H, HV // H, K).sum(3)
        dg = dg.sum(0)
        dk2, dv_w = k_n.new_empty(B, T, HV, K), torch.empty_like(v)  # prepare_wy_repr_bwd
        dg2, db = torch.empty_like(g_cum), torch.empty_like(beta)
        if H != HV:
            dk2 = dk2.view(B, T, H, HV // H, K).sum(3)
        dv = dv_w
        dk.add_(dk2)
        dg.add_(dg2)
        dg = torch.empty_like(dg, dtype=torch.float32)  # chunk_local_cumsum(dg, reverse=True)
        del w, u, h, v_new, dh, dw, dk2, dg2
        dq = torch.empty_like(q_n.view(-1, K)).view(B, T, H, K)  # l2norm_bwd
        dk = torch.empty_like(k_n.view(-1, K)).view(B, T, H, K)
        if ctx.inputs is not None:
            q, k, v_in, g, beta_in = ctx.inputs
            ref = _grads(ctx.reference, (q, k, v_in, g, beta_in), do, ctx.hidden)
            for buf, r in zip((dq, dk, dv, dg, db), ref):
                buf.copy_(r.reshape(buf.shape))
        ctx.inputs = None
        return dq, dk, dv, dg, db, None, None


def chunk_gated_delta_rule(hidden, reference):
    """transformers' call `torch_chunk_gated_delta_rule(q, k, v, g=g, beta=beta, initial_state=None,
    output_final_state=False, use_qk_l2norm_in_kernel=True, cu_seqlens=None)` as fla answers it."""

    def fn(query, key, value, g, beta, initial_state=None, output_final_state=False,
           use_qk_l2norm_in_kernel=False, cu_seqlens=None, **kwargs):
        if initial_state is not None or output_final_state or cu_seqlens is not None \
                or not use_qk_l2norm_in_kernel:
            raise NotImplementedError("only the training call (l2-normalised q/k, no state, unpacked) is emulated")

        def ref(q, k, v, g_, b_):
            return reference(q, k, v, g=g_, beta=b_, use_qk_l2norm_in_kernel=True)[0]

        return ChunkGatedDeltaRule.apply(query, key, value, g, beta, hidden, ref), None

    return fn


# --- mamba-ssm: the fused Mamba-2 mixer --------------------------------------------------------


def _dense_like(t: torch.Tensor) -> torch.Tensor:
    """`torch.empty_like` of a strided slice: a dense tensor in the slice's dimension order."""
    return torch.empty_like(t)


class MambaSplitConv1dScanCombined(torch.autograd.Function):
    """mamba-ssm's `MambaSplitConv1dScanCombinedFn` as Nemotron-H calls it in training: d_nonssm 0,
    RMSNorm gated after the scan (norm_before_gate False), the output projection fused, no initial
    state, no final state. zxbcdt (b, s, dim + conv_dim + h) is the in_proj output, dim = h * p,
    conv_dim = dim + 2 * g * n; c = ceil(s / chunk) chunks of l = chunk tokens.

    Forward (ssd_combined.py): the causal conv of xBC (causal_conv1d_fwd_function: empty_like of the
    channels-last view), then `_mamba_chunk_scan_combined_fwd`: dt_out and dA_cumsum fp32 (b, h, c, l)
    (_chunk_cumsum_fwd), chunk states fp32 (b, c, h, p, n) (_chunk_state_fwd, states_in_fp32), the
    passed states (b, c, h, p * n) in C's dtype and the final states fp32 (b, h, p * n)
    (_state_passing_fwd; the fp32 chunk states die when the name is rebound), CB fp32 (b, c, g, l, l)
    (_bmm_chunk_fwd), the scan output out_x (b, s, h, p) (_chunk_scan_fwd); then the gated RMSNorm
    (layernorm_gated._layer_norm_fwd: out = empty_like(x), rstd fp32 (g * b * s,)) and F.linear with
    the output projection. Saved: zxbcdt, conv weight and bias, out_x, A, D, dt_bias, the norm
    weight, rstd, the projection weight; everything else dies with the call.

    Backward: out_recompute (b, s, dim); the conv recomputed; dzxbcdt = empty_like(zxbcdt); dxBC
    (b, s, conv_dim); dout through the projection's transpose (b, s, dim, alive to the end through
    its (b s) view); _layer_norm_bwd: dx (b s, dim), fp32 dw partials (ceil(SMs / g), dim); then
    `_mamba_chunk_scan_combined_bwd` writing dx, ddt, dB, dC into the given buffers: dt cloned,
    dA_cumsum and dt fp32 (b, h, c, l), CB fp32, chunk states fp32 and their passing in fp32,
    dstates fp32 (b, c, h, p, n), _state_passing_bwd's bf16 dstates and states (b, c, h, p * n),
    ddt fp32 (b, h, c, l), dB and dC fp32 (b, s, nsplits, g, n) summed over the splits, ddA
    workspaces fp32 (b, h, c, l), dCB fp32 (b, c, nsplits, g, l, l) summed, ddA_prev's flip/cumsum/
    flip; the projection's weight gradient (hidden, dim); the conv's fp32 dweight and dbias.

    Without the norm's weight (Falcon-H1 with mamba_rms_norm false) z goes to the scan: _chunk_scan_fwd
    allocates the gated `out` and `out_x` (b, s, h, p) side by side, out_x is saved, no rstd; in backward
    _chunk_scan_bwd_dz takes the place of _layer_norm_bwd with outz (the gated output recomputed, the
    projection's gradient reads it; out_recompute stays unused) and dout_x = empty_like(dout)."""

    @staticmethod
    def forward(ctx, zxbcdt, conv_w, conv_b, dt_bias, A, D, rms_w, out_w, meta):
        hidden, chunk, p, g = meta["hidden"], meta["chunk"], meta["headdim"], meta["ngroups"]
        b, s, _ = zxbcdt.shape
        h = D.shape[0]
        dim, c = h * p, -(-s // chunk)
        n = (conv_w.shape[0] - dim) // g // 2
        xBC = zxbcdt[..., dim:2 * dim + 2 * g * n]
        if xBC.stride(1) % 8:  # ensure_stride
            xBC = xBC.contiguous()
        xBC_conv = torch.empty_like(xBC.transpose(1, 2)).transpose(1, 2)  # causal_conv1d_fwd_function
        dt_out = torch.empty(b, h, c, chunk, dtype=torch.float32, device=zxbcdt.device)  # _chunk_cumsum_fwd
        dA_cumsum = torch.empty(b, h, c, chunk, dtype=torch.float32, device=zxbcdt.device)
        states32 = torch.empty(b, c, h, p, n, dtype=torch.float32, device=zxbcdt.device)  # _chunk_state_fwd
        states = torch.empty(b, c, h, p * n, dtype=zxbcdt.dtype, device=zxbcdt.device)  # _state_passing_fwd
        final = torch.empty(b, h, p * n, dtype=torch.float32, device=zxbcdt.device)
        del states32
        cb = torch.empty(b, c, g, chunk, chunk, dtype=torch.float32, device=zxbcdt.device)  # _bmm_chunk_fwd
        if rms_w is None:  # z given to _chunk_scan_fwd: out = empty(b, s, h, p), then out_x beside it, gated
            normed = torch.empty(b * s, dim, dtype=zxbcdt.dtype, device=zxbcdt.device)
            out_x = torch.empty(b, s, h, p, dtype=zxbcdt.dtype, device=zxbcdt.device)
            rstd = None
        else:
            out_x = torch.empty(b, s, h, p, dtype=zxbcdt.dtype, device=zxbcdt.device)  # _chunk_scan_fwd
        del cb
        if rms_w is not None:
            normed = torch.empty(b * s, dim, dtype=zxbcdt.dtype, device=zxbcdt.device)  # _layer_norm_fwd
            rstd = torch.empty(g * b * s, dtype=torch.float32, device=zxbcdt.device)
        real = not _fake(zxbcdt)
        if real:
            with hidden(), torch.no_grad():
                y, z = meta["scan_reference"](zxbcdt, conv_w, conv_b, dt_bias, A, D)
                out_x.copy_(y.view(b, s, h, p))
                normed.copy_(meta["norm_reference"](y, z, rms_w).reshape(b * s, dim))
        out = F.linear(normed.view(b, s, dim), out_w)
        del xBC_conv, dt_out, dA_cumsum, states, final, normed
        ctx.save_for_backward(zxbcdt, conv_w, conv_b, out_x, A, D, dt_bias, rms_w, rstd, out_w)
        ctx.meta = meta
        return out

    @staticmethod
    def backward(ctx, dout):
        zxbcdt, conv_w, conv_b, out_x, A, D, dt_bias, rms_w, rstd, out_w = ctx.saved_tensors
        meta = ctx.meta
        chunk, p, g = meta["chunk"], meta["headdim"], meta["ngroups"]
        b, s, _ = zxbcdt.shape
        h = D.shape[0]
        dim, c = h * p, -(-s // chunk)
        n = (conv_w.shape[0] - dim) // g // 2
        dev, f32 = zxbcdt.device, torch.float32
        alive = []  # the locals of the kernel's backward, alive until it returns

        def keep(t):
            alive.append(t)
            return t

        keep(torch.empty(b, s, dim, dtype=out_x.dtype, device=dev))  # out_recompute
        xBC = zxbcdt[..., dim:2 * dim + 2 * g * n]
        if xBC.stride(1) % 8:
            xBC = keep(xBC.contiguous())
        keep(torch.empty_like(xBC.transpose(1, 2)))  # the conv recomputed
        dzxbcdt = torch.empty_like(zxbcdt)
        keep(_dense_like(xBC))  # dxBC: dx, dB, dC are written into it
        keep(F.linear(dout, out_w.t()))  # dout through the projection, alive through dy_rms
        if rms_w is None:
            # _chunk_scan_bwd_dz (ssd_chunk_scan.py): dz written into dzxbcdt, outz = empty_like(x) (the gated output
            # recomputed for the projection's gradient; out_recompute above stays unused), dout_x = empty_like(dout)
            keep(torch.empty(b, s, h, p, dtype=out_x.dtype, device=dev))  # outz
            keep(torch.empty(b, s, h, p, dtype=out_x.dtype, device=dev))  # dout_x
            drms_w = None
        else:
            keep(torch.empty(b * s, dim, dtype=out_x.dtype, device=dev))  # _layer_norm_bwd dx
            # layernorm_gated._layer_norm_bwd: BLOCK_N = next_pow2(dim / g) capped at 64 kB of fp32... warps
            # = min(max(BLOCK_N // 256, 1), 8); partial dw rows = ceil(SMs * ceil(4 / warps) / g)
            block_n = min(65536 // 4, _next_pow2(dim // g))
            warps = min(max(block_n // 256, 1), 8)
            dw_partial = torch.empty(math.ceil(HOPPER_SMS * math.ceil(4 / warps) / g), dim, dtype=f32, device=dev)
            drms_w = dw_partial.sum(0).to(rms_w.dtype)
            del dw_partial
        # _mamba_chunk_scan_combined_bwd
        keep(torch.empty(b, s, h, dtype=zxbcdt.dtype, device=dev))  # dt_in = dt.clone()
        keep(torch.empty(b, h, c, chunk, dtype=f32, device=dev))  # dA_cumsum
        keep(torch.empty(b, h, c, chunk, dtype=f32, device=dev))  # dt
        keep(torch.empty(b, c, g, chunk, chunk, dtype=f32, device=dev))  # CB
        states32 = torch.empty(b, c, h, p, n, dtype=f32, device=dev)
        states = torch.empty(b, c, h, p * n, dtype=f32, device=dev)  # _state_passing_fwd, out_dtype None
        del states32
        dstates32 = torch.empty(b, c, h, p, n, dtype=f32, device=dev)  # _chunk_scan_bwd_dstates
        keep(torch.empty(b, c, h, p * n, dtype=zxbcdt.dtype, device=dev))  # _state_passing_bwd dstates
        keep(torch.empty(b, c, h, p * n, dtype=zxbcdt.dtype, device=dev))  # states converted
        del dstates32, states
        keep(torch.empty(b, h, c, chunk, dtype=f32, device=dev))  # ddt (bwd_dx)
        nsplits = math.ceil((h // g) / max(min(math.ceil(b * c * h / HOPPER_SMS), h // g), 1))
        dda_next = keep(torch.empty(b, h, c, chunk, dtype=f32, device=dev))  # ddA_next (bwd_db)
        db_split = torch.empty(b, s, nsplits, g, n, dtype=f32, device=dev)
        keep(db_split.sum(2))
        del db_split
        keep(torch.empty(b, h, c, chunk, dtype=f32, device=dev))  # ddA_cumsum_prev (bwd_dC)
        dc_split = torch.empty(b, s, nsplits, g, n, dtype=f32, device=dev)
        keep(dc_split.sum(2))
        del dc_split
        dcb_split = torch.empty(b, c, nsplits, g, chunk, chunk, dtype=f32, device=dev)
        keep(dcb_split.sum(2))
        del dcb_split
        prev = torch.empty(b, h, c, chunk, dtype=f32, device=dev)
        dda_prev = keep(prev.flip([-1]).cumsum(dim=-1).flip([-1]))  # ddA_prev
        del prev
        dda = keep(torch.empty(b, h, c, chunk, dtype=f32, device=dev))  # _chunk_scan_bwd_ddAcs_stable
        dda += dda_next + dda_prev
        dA, ddt_bias = torch.empty(h, dtype=f32, device=dev), torch.empty(h, dtype=f32, device=dev)
        dD = torch.empty(h, dtype=D.dtype, device=dev)
        dout_w = torch.empty(out_w.shape, dtype=out_w.dtype, device=dev)  # einsum("bso,bsd->od")
        dconv_w = torch.zeros_like(conv_w, dtype=f32)  # causal_conv1d_bwd_function
        dconv_b = torch.zeros_like(conv_b, dtype=f32) if conv_b is not None else None
        if not _fake(zxbcdt):
            ref = _grads(lambda *t: meta["reference"](*t),
                         (zxbcdt, conv_w, conv_b, dt_bias, A, D, rms_w, out_w), dout, meta["hidden"])
            for buf, r in zip((dzxbcdt, dconv_w, dconv_b, ddt_bias, dA, dD, drms_w, dout_w), ref):
                if buf is not None:
                    buf.copy_(r)
        dconv_w = dconv_w.type_as(conv_w)
        dconv_b = dconv_b.type_as(conv_b) if conv_b is not None else None
        del alive, dda, dda_next, dda_prev
        return dzxbcdt, dconv_w, dconv_b, ddt_bias, dA, dD, drms_w, dout_w, None


def _gated_rmsnorm(y, z, weight, group_size, eps):
    """NemotronHRMSNormGated.forward (transformers 5.23): y * silu(z) in fp32, normalised per group."""
    dtype = y.dtype
    x = y.float() * F.silu(z.float())
    grouped = x.view(*x.shape[:-1], x.shape[-1] // group_size, group_size)
    grouped = grouped * torch.rsqrt(grouped.pow(2).mean(-1, keepdim=True) + eps)
    return weight * grouped.view(x.shape).to(dtype)


def mamba_split_conv1d_scan_combined(hidden, conv_reference, scan_reference):
    """transformers' `mamba2_split_conv1d_scan_combined(...)` as mamba-ssm answers it; the values of
    a real run from the torch fallbacks (the conv, `mamba2_chunk_scan`, the gated norm, F.linear)."""

    def fn(zxbcdt, conv1d_weight, conv1d_bias, dt_bias, A, D, chunk_size, initial_states=None, seq_idx=None,
           dt_limit=(0.0, float("inf")), return_final_states=False, activation="silu", rmsnorm_weight=None,
           rmsnorm_eps=1e-6, outproj_weight=None, outproj_bias=None, headdim=None, ngroups=1,
           norm_before_gate=True, **kwargs):
        if initial_states is not None or seq_idx is not None or return_final_states or norm_before_gate \
                or outproj_weight is None or outproj_bias is not None or activation != "silu":
            raise NotImplementedError("only Nemotron-H's and Falcon-H1's training call is emulated")
        h = D.shape[0]
        dim = h * headdim

        def scan(zxbcdt_, conv_w, conv_b, dt_bias_, A_, D_):
            b, s, _ = zxbcdt_.shape
            n = (conv_w.shape[0] - dim) // ngroups // 2
            z, xBC, dt = zxbcdt_.split([dim, dim + 2 * ngroups * n, h], dim=-1)
            xBC = conv_reference(xBC.transpose(1, 2), conv_w, conv_b, activation=activation).transpose(1, 2)
            x, B, C = xBC.split([dim, ngroups * n, ngroups * n], dim=-1)
            y = scan_reference(x.reshape(b, s, h, headdim), dt, A_, B.reshape(b, s, ngroups, n),
                               C.reshape(b, s, ngroups, n), chunk_size=chunk_size, D=D_, dt_bias=dt_bias_,
                               dt_softplus=True, dt_limit=dt_limit)
            return y.reshape(b, s, dim), z

        def norm(y, z, weight):
            if weight is None:  # no gated norm (Falcon-H1's mamba_rms_norm false): the kernel gates the scan output
                return y * F.silu(z)
            return _gated_rmsnorm(y, z, weight, dim // ngroups, rmsnorm_eps)

        def reference(zxbcdt_, conv_w, conv_b, dt_bias_, A_, D_, rms_w, out_w):
            y, z = scan(zxbcdt_, conv_w, conv_b, dt_bias_, A_, D_)
            return F.linear(norm(y, z, rms_w).to(zxbcdt_.dtype), out_w)  # out_proj(scan_output.to(dtype))

        meta = {"hidden": hidden, "chunk": chunk_size, "headdim": headdim, "ngroups": ngroups,
                "scan_reference": scan, "norm_reference": norm, "reference": reference}
        return MambaSplitConv1dScanCombined.apply(zxbcdt, conv1d_weight, conv1d_bias, dt_bias, A, D,
                                                  rmsnorm_weight, outproj_weight, meta)

    return fn


# --- patching transformers ---------------------------------------------------------------------


@contextmanager
def hybrid_kernels(tracker):
    """Make transformers' hybrid layers call the emulated kernels for the duration of a measurement:
    the module-level names the layers' forward looks up at call time."""
    from transformers.models.nemotron_h import modeling_nemotron_h as nemotron
    from transformers.models.qwen3_next import modeling_qwen3_next as qwen

    saved = {(qwen, "causal_conv1d_fn"): qwen.causal_conv1d_fn,
             (qwen, "torch_chunk_gated_delta_rule"): qwen.torch_chunk_gated_delta_rule,
             (nemotron, "mamba2_split_conv1d_scan_combined"): nemotron.mamba2_split_conv1d_scan_combined}
    qwen.causal_conv1d_fn = causal_conv1d_fn(tracker.hidden, saved[qwen, "causal_conv1d_fn"])
    qwen.torch_chunk_gated_delta_rule = chunk_gated_delta_rule(tracker.hidden,
                                                               saved[qwen, "torch_chunk_gated_delta_rule"])
    nemotron.mamba2_split_conv1d_scan_combined = mamba_split_conv1d_scan_combined(
        tracker.hidden, nemotron.causal_conv1d_fn, nemotron.mamba2_chunk_scan)
    # Falcon-H1's mixer (FalconH1Mixer.forward, training without a cache) makes the same fused call, the gated
    # norm's weight only with mamba_rms_norm, norm_before_gate False whatever its config says
    from transformers.models.falcon_h1 import modeling_falcon_h1 as falcon

    saved[falcon, "mamba2_split_conv1d_scan_combined"] = falcon.mamba2_split_conv1d_scan_combined
    falcon.mamba2_split_conv1d_scan_combined = mamba_split_conv1d_scan_combined(
        tracker.hidden, falcon.causal_conv1d_fn, falcon.mamba2_chunk_scan)
    from .mamba1 import jamba_patches  # Jamba's Mamba-1 layers (mamba1.py)

    for module, name, emulation in jamba_patches(tracker, causal_conv1d_fn):
        saved[module, name] = getattr(module, name)
        setattr(module, name, emulation)
    try:
        yield
    finally:
        for (module, name), value in saved.items():
            setattr(module, name, value)
