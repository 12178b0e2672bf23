"""The operations of the hybrid mixers (issue 28, estimator/spec/hybrid.py): a Gated DeltaNet layer and
a Mamba-2 block. No s^2 attention work: their token mixing is a chunked recurrence whose cost grows
linearly with the sequence.

Chunked recurrences, per token and head, from the matmuls the kernels run (one chunk of C tokens at a
time, the state carried between chunks):
- Gated DeltaNet (fla-org/flash-linear-attention@bc3b101 chunk.py `chunk_gated_delta_rule_fwd`, chunk C
  = 64, key width K, value width V per value head): k k^T in the chunk (C K) and its triangular solve,
  w = A (beta k) (C K), u = A (beta v) (C V), the state's read w h and write k^T v_new (2 K V),
  the output q h (K V) and the masked (q k^T) v_new (C K + C V): 2 (3 C K + 2 C V + 3 K V) FLOPs; its
  backward recomputes w, u and h, then runs about twice the forward's matmuls (chunk.py
  `chunk_gated_delta_rule_bwd`): 2.5 x the forward, as flash attention's.
- Mamba-2 SSD (Dao & Gu 2024, arXiv 2405.21060 section 6; state-spaces/mamba@e9594ce ssd_combined.py
  `_mamba_chunk_scan_combined_fwd`: _bmm_chunk_fwd C B^T per group, _chunk_state_fwd B^T x, the state
  passing, _chunk_scan_fwd's intra-chunk (L o C B^T) x and inter-chunk C h; chunk Q, state N, head
  width P): 2 (Q N / heads_per_group + Q P + 2 N P) FLOPs; its backward 2.5 x the forward (the scan and
  the conv recomputed, then the gradients' matmuls).
- Mamba-1 selective scan (Gu & Dao 2023, arXiv 2312.00752 section 3.3; state-spaces/mamba@e9594ce
  csrc/selective_scan: one pass over the sequence per channel, no matmul): per token, channel and state
  exp(delta A), delta B u, the state update and C h, 8 FLOPs, on the CUDA cores; per token and channel the
  softplus of delta, the D skip and the SiLU gate, about 10. It reads u, delta, z, B, C and writes the gated
  output; its backward re-runs the scan chunk by chunk from the saved chunk states and writes du, ddelta, dz,
  dB, dC: 2.5 x the forward's work, twice its traffic.
"""

from __future__ import annotations

from ..spec.architecture import Architecture
from ..spec.parallel import Parallel
from .operations import NORM_FLOPS, NORM_MODULE, Operation, SWIGLU_FLOPS, _Context, _elementwise, _gemm
from . import kernels

FLA_CHUNK = 64
# The CUDA cores' fp32 rate over the dense bf16 tensor-core rate (NVIDIA A100 datasheet 19.5 of 312 TFLOP/s,
# H100 SXM datasheet 67 of 989): the selective scan's arithmetic runs on them
CUDA_CORE_SHARE = 1 / 16


def gated_delta_net_core_flops(arch: Architecture) -> float:
    """Forward FLOPs per token of the chunked gated delta rule, all value heads (module docstring)."""
    K, V, C = arch.linear_key_head_dim, arch.linear_value_head_dim, FLA_CHUNK
    return arch.linear_num_value_heads * 2 * (3 * C * K + 2 * C * V + 3 * K * V)


def ssd_core_flops(arch: Architecture) -> float:
    """Forward FLOPs per token of Mamba-2's chunked scan, all heads (module docstring)."""
    H, P, N, Q = arch.mamba_num_heads, arch.mamba_head_dim, arch.mamba_state_size, arch.mamba_chunk_size
    return 2 * (arch.mamba_num_groups * Q * N + H * (Q * P + 2 * N * P))


def _core(ctx: _Context, scope: str, name: str, flops: float, moved: float, count: int, formula: str) -> list[Operation]:
    fwd = Operation(name, "forward", scope, "attention", flops, moved, ctx.peak, ctx.bandwidth, count, formula, (),
                    kernels.gemm_efficiency(ctx.gpu, FLA_CHUNK, 128, 128), kernels.BANDWIDTH_EFFICIENCY)
    if not ctx.training:
        return [fwd]
    bwd = Operation(f"{name} (backward)", "backward", scope, "attention", 2.5 * flops, 2 * moved, ctx.peak,
                    ctx.bandwidth, count, "2.5 x forward (the chunk quantities recomputed, then the gradients)", (),
                    kernels.gemm_efficiency(ctx.gpu, FLA_CHUNK, 128, 128), kernels.BANDWIDTH_EFFICIENCY)
    return [fwd, bwd]


def gated_delta_net_operations(ctx: _Context, arch: Architecture, par: Parallel, scope: str,
                               count: int) -> list[list[Operation]]:
    """A Gated DeltaNet mixer (transformers Qwen3NextGatedDeltaNet): norm, in_proj_qkvz and in_proj_ba, the
    causal conv over q, k, v, the chunked delta rule, the gated RMSNorm, out_proj, the residual add."""
    h, t, T = arch.hidden_size, par.tp, ctx.T
    qk = arch.linear_num_key_heads * arch.linear_key_head_dim
    v = arch.linear_num_value_heads * arch.linear_value_head_dim
    conv = (2 * qk + v) / t
    kernel = arch.linear_conv_kernel_dim
    return [
        _elementwise(ctx, scope, "linear attention norm", ctx.T_sp * h, ctx.T_sp * h, NORM_FLOPS[arch.norm], count,
                     "read and write s*b*h", NORM_MODULE, kernels.norm_group(arch.norm)),
        _gemm(ctx, scope, "in_proj (q, k, v, z, b, a)", T, h, (2 * qk + 2 * v + 2 * arch.linear_num_value_heads) / t,
              count),
        _elementwise(ctx, scope, "causal conv1d over q, k, v (+ SiLU)", T * conv, T * conv, 2 * kernel + 4, count,
                     f"read and write s*b*(2*Hk*K + Hv*V)/t, {kernel} taps"),
        _core(ctx, scope, "chunked gated delta rule (fla)", T * gated_delta_net_core_flops(arch) / t,
              T * (2 * 2 * qk + 3 * v) / t * ctx.B, count, "2*(3*C*K + 2*C*V + 3*K*V) per token and value head, C=64"),
        _elementwise(ctx, scope, "gated RMSNorm", 2 * T * v / t, T * v / t, NORM_FLOPS["rmsnorm"] + SWIGLU_FLOPS, count,
                     "read the output and the gate z, write s*b*Hv*V/t", group="norm"),
        _gemm(ctx, scope, "out_proj", T, v / t, h, count),
        _elementwise(ctx, scope, "residual add (linear attention)", 2 * ctx.T_sp * h, ctx.T_sp * h, 0.5, count,
                     "read 2*s*b*h, write s*b*h"),
    ]


def mamba_operations(ctx: _Context, arch: Architecture, par: Parallel, scope: str, count: int,
                     beside_attention: bool = False) -> list[list[Operation]]:
    """A Mamba-2 block (mamba-ssm's fused split-conv1d-scan as Nemotron-H trains): norm, in_proj, the causal
    conv over x, B, C, the chunked scan, the gated RMSNorm, out_proj, the residual add. `beside_attention`:
    Falcon-H1's mixer, which reads the attention's norm and adds its output to the attention's (no norm of its own)."""
    h, t, T = arch.hidden_size, par.tp, ctx.T
    H, g, n = arch.mamba_num_heads, arch.mamba_num_groups, arch.mamba_state_size
    d = H * arch.mamba_head_dim
    conv = (d + 2 * g * n) / t
    norm = [] if beside_attention else [
        _elementwise(ctx, scope, "Mamba norm", ctx.T_sp * h, ctx.T_sp * h, NORM_FLOPS[arch.norm], count,
                     "read and write s*b*h", NORM_MODULE, kernels.norm_group(arch.norm))]
    return norm + [
        _gemm(ctx, scope, "in_proj (z, x, B, C, dt)", T, h, (2 * d + 2 * g * n + H) / t, count),
        _elementwise(ctx, scope, "causal conv1d over x, B, C (+ SiLU)", T * conv, T * conv, 2 * arch.mamba_conv_kernel + 4,
                     count, f"read and write s*b*(H*p + 2*g*n)/t, {arch.mamba_conv_kernel} taps"),
        _core(ctx, scope, "chunked SSD scan (mamba-ssm)", T * ssd_core_flops(arch) / t, T * (3 * d + 2 * g * n) / t * ctx.B,
              count, "2*(g*Q*N + H*(Q*P + 2*N*P)) per token, Q = chunk"),
        _elementwise(ctx, scope, "gated RMSNorm", 2 * T * d / t, T * d / t, NORM_FLOPS["rmsnorm"] + SWIGLU_FLOPS, count,
                     "read the scan output and z, write s*b*H*p/t", group="norm"),
        _gemm(ctx, scope, "out_proj", T, d / t, h, count),
        _elementwise(ctx, scope, "Mamba output added to the attention's" if beside_attention else "residual add (Mamba)",
                     2 * ctx.T_sp * h, ctx.T_sp * h, 0.5, count,
                     "read 2*s*b*h, write s*b*h"),
    ]


def selective_scan_flops(arch: Architecture) -> float:
    """Forward FLOPs per token of Mamba-1's selective scan, all channels (module docstring)."""
    return arch.mamba_expand * arch.hidden_size * (8 * arch.mamba_state_size + 10)


def mamba1_operations(ctx: _Context, arch: Architecture, par: Parallel, scope: str, count: int) -> list[list[Operation]]:
    """A Mamba-1 mixer with Jamba's inner norms (transformers JambaMambaMixer): norm, in_proj (x, z), the causal
    conv over x, x_proj (dt, B, C) and their norms, dt_proj, the selective scan, out_proj, the residual add."""
    h, t, T = arch.hidden_size, par.tp, ctx.T
    d, n, r = arch.mamba_expand * arch.hidden_size, arch.mamba_state_size, arch.mamba_dt_rank
    kernel = arch.mamba_conv_kernel
    scan_moved = T * (4 * d / t + 2 * n) * ctx.B

    def scan(label, phase, work, moved, formula):
        return Operation(label, phase, scope, "elementwise", work, moved, ctx.peak, ctx.bandwidth, count, formula, (),
                         CUDA_CORE_SHARE, kernels.BANDWIDTH_EFFICIENCY)

    flops = T * selective_scan_flops(arch) / t
    core = [scan("selective scan (mamba-ssm)", "forward", flops, scan_moved, "d*(8*n + 10) per token, CUDA cores")]
    if ctx.training:
        core.append(scan("selective scan (backward)", "backward", 2.5 * flops, 2 * scan_moved,
                         "2.5 x forward (the chunks re-scanned, then the gradients)"))
    return [
        _elementwise(ctx, scope, "Mamba norm", ctx.T_sp * h, ctx.T_sp * h, NORM_FLOPS[arch.norm], count,
                     "read and write s*b*h", NORM_MODULE, kernels.norm_group(arch.norm)),
        _gemm(ctx, scope, "in_proj (x, z)", T, h, 2 * d / t, count),
        _elementwise(ctx, scope, "causal conv1d over x (+ SiLU)", T * d / t, T * d / t, 2 * kernel + 4, count,
                     f"read and write s*b*d/t, {kernel} taps"),
        _gemm(ctx, scope, "x_proj (dt, B, C)", T, d / t, r + 2 * n, count),
        _elementwise(ctx, scope, "dt, B, C norms", T * (r + 2 * n), T * (r + 2 * n), NORM_FLOPS["rmsnorm"], count,
                     "read and write s*b*(r + 2n)", group="norm"),
        _gemm(ctx, scope, "dt_proj", T, r, d / t, count),
        core,
        _gemm(ctx, scope, "out_proj", T, d / t, h, count),
        _elementwise(ctx, scope, "residual add (Mamba)", 2 * ctx.T_sp * h, ctx.T_sp * h, 0.5, count,
                     "read 2*s*b*h, write s*b*h"),
    ]
