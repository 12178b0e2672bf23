"""Speed: a roofline per operation, and the time of one step built from them.

The roofline model (Williams, Waterman and Patterson 2009, "Roofline: an insightful visual
performance model", CACM 52(4)) bounds the time of an operation by whichever the GPU runs out of
first, arithmetic or memory traffic:

    time = max(flops / peak_flops, bytes / memory_bandwidth)

An operation's arithmetic intensity is flops / bytes; where it exceeds the GPU's ridge point,
peak_flops / memory_bandwidth, the operation is compute-bound, otherwise memory-bound. Real
kernels reach 60-85% of either roof, so every time here is a lower bound and every throughput an
upper bound on what a run can achieve.

What is counted, per GPU after TP/CP/EP sharding, for one micro-batch:

- every operation of a transformer layer (norms, the Q/K/V projections or MLA's down/up
  projections, rotary embedding, the attention core, the output projection, the MLP or the
  router with routed experts as grouped GEMMs and shared experts, residual adds), counted once
  per kind of layer and multiplied by the number of such layers on the stage;
- the embedding on the first stage, the final norm, LM head and loss on the last;
- backward as separate operations: for a linear layer the input-gradient (dX = dY W^T) and the
  weight-gradient (dW = X^T dY) matmuls, each with the forward's FLOPs (Narayanan et al. 2021,
  section 5.1: backward = 2 x forward); for flash attention 2.5 x the forward's FLOPs, since its
  backward recomputes the scores: five matmuls against two (Dao 2023, FlashAttention-2; the
  flash-attn repository's benchmarks/benchmark_flash_attention.py counts it the same way).

Notation: s = tokens of a sequence on this GPU (seq_len / CP), b = micro-batch, T = s*b, h =
hidden, a = query heads, g = KV heads, d = head width, f = MLP width, V = (padded) vocabulary,
t = TP, B = bytes of the compute dtype. A GEMM of an (M x K) input by a (K x N) weight does 2MKN
FLOPs and moves M*K + K*N + M*N elements (each read or written once: the ideal reuse a tiled
kernel approaches).

The step (`Step`) adds, on the slowest pipeline stage: the operations of every micro-batch,
recomputation, the pipeline bubble, the optimizer update and the communication that compute does
not hide. See `roofline` for each term and its source.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from .architecture import Architecture
from .dtypes import bytes_per_element
from .hardware import GPU, Hardware
from .parallel import Parallel
from .sharding import stage_layer_indices
from .states import optimizer_state_bytes
from .training import Recipe, Training

ROOFLINE = "Williams, Waterman & Patterson 2009, Roofline (CACM 52(4))"
PALM = "Chowdhery et al. 2022, PaLM (arXiv 2204.02311), appendix B"
NARAYANAN = "Narayanan et al. 2021, Efficient Large-Scale Language Model Training on GPU Clusters (arXiv 2104.04473)"
FLASH2 = "Dao 2023, FlashAttention-2 (arXiv 2307.08691)"
KORTHIKANTI = "Korthikanti et al. 2022, Reducing Activation Recomputation (arXiv 2205.05198)"
RING = "Patarasuk & Yuan 2009, bandwidth-optimal all-reduce; NCCL ring algorithm"

# Elementwise FLOPs per element (they run on the vector units and never decide the bound, but the
# intensity is shown): an RMSNorm squares, sums, scales and multiplies by its weight; a LayerNorm
# also subtracts the mean; SiLU(gate) x up is a sigmoid, two multiplies; softmax is max, subtract,
# exp, sum and divide.
NORM_FLOPS = {"rmsnorm": 4, "layernorm": 7}
SWIGLU_FLOPS = 4
GELU_FLOPS = 8
SOFTMAX_FLOPS = 5
ROPE_FLOPS = 3  # x*cos + rotate(x)*sin per element


SOURCES = (ROOFLINE, PALM, NARAYANAN, FLASH2, KORTHIKANTI, RING)


# --- results ---------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Operation:
    """One kernel (or one fused group of kernels) of a step, on one GPU, for one micro-batch and,
    for layer operations, one layer. `count` is how often the stage runs it per step."""

    name: str
    phase: str  # "forward" or "backward"
    scope: str  # "layer (dense)", "layer (moe)", "... sliding window", "embedding", "head"
    kind: str  # "matmul", "attention" or "elementwise"
    flops: float
    bytes: float
    peak_flops: float  # the roof for this operation's dtype
    bandwidth: float  # bytes/s of device memory
    count: int
    formula: str

    @property
    def arithmetic_intensity(self) -> float:
        return self.flops / self.bytes if self.bytes else float("inf")

    @property
    def ridge_point(self) -> float:
        """FLOPs per byte at which the two roofs meet (Williams et al. 2009)."""
        return self.peak_flops / self.bandwidth

    @property
    def bound(self) -> str:
        return "compute" if self.arithmetic_intensity >= self.ridge_point else "memory"

    @property
    def time_s(self) -> float:
        """Time at the roof: max(flops / peak, bytes / bandwidth)."""
        return max(self.flops / self.peak_flops, self.bytes / self.bandwidth)

    @property
    def total_time_s(self) -> float:
        return self.time_s * self.count

    def to_json(self) -> dict:
        return {
            "name": self.name, "phase": self.phase, "flops": self.flops, "bytes": self.bytes,
            "arithmetic_intensity": self.arithmetic_intensity, "bound": self.bound, "time_s": self.time_s,
            "scope": self.scope, "kind": self.kind, "count": self.count, "total_time_s": self.total_time_s,
            "ridge_point": self.ridge_point, "peak_flops": self.peak_flops, "bandwidth": self.bandwidth,
            "formula": self.formula,
        }


@dataclass(frozen=True)
class Communication:
    """One collective of the step on one GPU: its total time and the part compute does not hide."""

    name: str
    group: str  # "TP", "CP", "EP", "DP", "expert DP", "PP"
    size: int  # ranks in the group
    link: str  # "intra-node" or "inter-node"
    bandwidth: float  # bytes/s, one direction, per GPU
    bytes: float  # bytes one GPU sends per step (ring factors applied)
    time_s: float
    exposed_s: float
    formula: str

    def to_json(self) -> dict:
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class Step:
    time_s: float
    tokens_per_s_per_gpu: float
    mfu: float
    bubble_fraction: float  # (p - 1) / (v m): the bubble relative to the ideal time (Narayanan 2021)
    exposed_comm_s: float
    compute_s: float  # the operations of all micro-batches
    recompute_s: float
    bubble_s: float
    optimizer_s: float
    microbatches: int
    tokens_per_step: int  # over all GPUs
    model_flops_per_token: float
    mfu_peak_flops: float
    communication: tuple[Communication, ...]

    @property
    def bubble_share_of_step(self) -> float:
        """The share of the step the GPU idles in the pipeline bubble (bubble_s / time_s)."""
        return self.bubble_s / self.time_s if self.time_s else 0.0

    def to_json(self) -> dict:
        out = {k: getattr(self, k) for k in (
            "time_s", "tokens_per_s_per_gpu", "mfu", "bubble_fraction", "bubble_share_of_step", "exposed_comm_s",
            "compute_s",
            "recompute_s", "bubble_s", "optimizer_s", "microbatches", "tokens_per_step",
            "model_flops_per_token", "mfu_peak_flops")}
        out["communication"] = [c.to_json() for c in self.communication]
        return out


@dataclass(frozen=True)
class Roofline:
    mode: str  # "training" or "inference" (a prefill of seq_len tokens)
    gpu: str
    stage: int  # the pipeline stage shown: the slowest one, which sets the step time
    stage_times_s: tuple[float, ...]  # ideal compute + recompute per step, every stage
    operations: tuple[Operation, ...]
    step: Step
    notes: tuple[str, ...]

    def to_json(self) -> dict:
        return {
            "operations": [op.to_json() for op in self.operations],
            "step": self.step.to_json(),
            "mode": self.mode, "gpu": self.gpu, "stage": self.stage,
            "stage_times_s": list(self.stage_times_s), "notes": list(self.notes), "sources": list(SOURCES),
        }


# --- building blocks ---------------------------------------------------------------------------------

@dataclass(frozen=True)
class _Context:
    """What every operation of a configuration shares: dtypes, roofs, token counts."""

    B: float  # bytes per activation element (compute dtype)
    mm_in: float  # bytes per matmul input and weight element (1 under FP8)
    weight: float  # bytes per weight element the forward matmuls read
    grad: float  # bytes per weight-gradient element written
    mm_peak: float  # FLOP/s of the matmuls
    peak: float  # FLOP/s of the compute dtype (attention core, elementwise)
    bandwidth: float
    training: bool
    T: float  # tokens per micro-batch on this GPU: s*b with s = seq_len / CP
    T_sp: float  # tokens a norm or residual add sees: T / t with sequence parallelism
    t: int


def _gemm(ctx: _Context, scope: str, name: str, M: float, K: float, N: float, count: int,
          weights: float = 1, formula: str = "") -> list[Operation]:
    """Forward, input-gradient and weight-gradient matmuls of y (M x N) = x (M x K) @ W (K x N).
    `weights` > 1 is a grouped GEMM over that many expert matrices with M tokens in total."""
    W = K * N * weights
    flops = 2 * M * K * N
    fwd = Operation(name, "forward", scope, "matmul", flops,
                    M * K * ctx.mm_in + W * ctx.weight + M * N * ctx.B,
                    ctx.mm_peak, ctx.bandwidth, count, formula or f"2*M*K*N, M={M:g} K={K:g} N={N:g}")
    if not ctx.training:
        return [fwd]
    dgrad = Operation(f"{name} (input gradient)", "backward", scope, "matmul", flops,
                      M * N * ctx.mm_in + W * ctx.mm_in + M * K * ctx.B,
                      ctx.mm_peak, ctx.bandwidth, count, "dX = dY W^T: 2*M*K*N")
    wgrad = Operation(f"{name} (weight gradient)", "backward", scope, "matmul", flops,
                      M * K * ctx.mm_in + M * N * ctx.mm_in + W * ctx.grad,
                      ctx.mm_peak, ctx.bandwidth, count, "dW = X^T dY: 2*M*K*N")
    return [fwd, dgrad, wgrad]


def _elementwise(ctx: _Context, scope: str, name: str, elements_in: float, elements_out: float,
                 flops_per_element: float, count: int, formula: str) -> list[Operation]:
    """A memory-bound kernel. Its backward reads the output gradient and the saved input and
    writes the input gradient: (out + 2*in) elements."""
    fwd = Operation(name, "forward", scope, "elementwise", flops_per_element * elements_in,
                    (elements_in + elements_out) * ctx.B, ctx.peak, ctx.bandwidth, count, formula)
    if not ctx.training:
        return [fwd]
    bwd = Operation(f"{name} (backward)", "backward", scope, "elementwise", 2 * flops_per_element * elements_in,
                    (elements_out + 2 * elements_in) * ctx.B, ctx.peak, ctx.bandwidth, count, formula)
    return [fwd, bwd]


def _windowed(arch: Architecture, index: int) -> bool:
    """Sliding-window layers (as in inference.py): all of them with pattern 0, else every
    pattern-th layer is global."""
    return bool(arch.sliding_window) and (
        arch.sliding_window_pattern == 0 or (index + 1) % arch.sliding_window_pattern != 0)


def attended_keys(seq_len: int, window: int | None, causal: bool = True) -> float:
    """Keys a query attends to on average. Causal: (1/s) sum_i min(i, w) = w - w^2/(2s) for a
    window w <= s, which is s/2 for full attention (the causal half)."""
    w = min(window or seq_len, seq_len)
    if not causal:
        return float(w)
    return w - w * w / (2 * seq_len)


def _attention_widths(arch: Architecture) -> tuple[int, int, int]:
    """(query/key width per head, value width per head, key/value heads that move in memory)."""
    if arch.uses_mla:
        # MLA: the shared rope key is broadcast and the latent expanded to every head
        return arch.qk_nope_head_dim + arch.qk_rope_head_dim, arch.v_head_dim, arch.num_attention_heads
    return arch.head_dim, arch.head_dim, arch.num_kv_heads


def _attention_core(ctx: _Context, arch: Architecture, training: Training, par: Parallel, scope: str,
                    window: int | None, count: int) -> list[Operation]:
    """softmax(Q K^T / sqrt(d)) V for the a/t heads of this GPU.

    QK^T and AV each cost 2*b*s_q*s_k*d per head. Flash attention skips the masked half of a
    causal mask; with CP each GPU holds s/CP queries against all s keys, the same causal half
    after Megatron's load-balanced split. Eager attention computes the full s_q x s_k scores,
    writes them, reads them for the softmax, writes the probabilities and reads them again."""
    a_t = arch.num_attention_heads / par.tp
    d_qk, d_v, kv_heads = _attention_widths(arch)
    b, seq = training.micro_batch_size, training.seq_len
    s_q = seq / par.cp
    io = ctx.T * (a_t * (d_qk + d_v) + kv_heads / par.tp * (d_qk + d_v)) * ctx.B  # q, o; k, v
    if training.attention == "flash":
        keys = attended_keys(seq, window)
        flops = 2 * b * a_t * s_q * keys * (d_qk + d_v)
        fwd = Operation("attention core (flash)", "forward", scope, "attention", flops,
                        io + ctx.T * a_t * 4, ctx.peak, ctx.bandwidth, count,
                        "2*b*(a/t)*(s/cp)*keys*(d_qk + d_v), keys = causal average")
        if not ctx.training:
            return [fwd]
        # backward reads q, k, v, o, dO, lse and writes dq, dk, dv
        bwd = Operation("attention core (flash) (backward)", "backward", scope, "attention", 2.5 * flops,
                        2 * io + ctx.T * a_t * (d_v * ctx.B + 4), ctx.peak, ctx.bandwidth, count,
                        "2.5 x forward (FlashAttention-2: 5 matmuls against 2, the scores recomputed)")
        return [fwd, bwd]
    keys = float(min(window or seq, seq))  # eager: the mask is applied after the full matmul
    scores = b * a_t * s_q * keys
    qk = Operation("attention scores QK^T (eager)", "forward", scope, "attention", 2 * scores * d_qk,
                   ctx.T * a_t * d_qk * ctx.B + ctx.T * kv_heads / par.tp * d_qk * ctx.B + scores * ctx.B,
                   ctx.peak, ctx.bandwidth, count, "2*b*(a/t)*s*s*d, scores written")
    sm = Operation("attention softmax (eager)", "forward", scope, "elementwise", SOFTMAX_FLOPS * scores,
                   2 * scores * ctx.B, ctx.peak, ctx.bandwidth, count, "read and write b*(a/t)*s*s")
    av = Operation("attention probabilities x V (eager)", "forward", scope, "attention", 2 * scores * d_v,
                   scores * ctx.B + ctx.T * kv_heads / par.tp * d_v * ctx.B + ctx.T * a_t * d_v * ctx.B,
                   ctx.peak, ctx.bandwidth, count, "2*b*(a/t)*s*s*d_v, probabilities read")
    ops = [qk, sm, av]
    if ctx.training:
        ops += [
            Operation("attention probabilities x V (eager) (backward)", "backward", scope, "attention",
                      2 * av.flops, av.bytes + scores * ctx.B, ctx.peak, ctx.bandwidth, count,
                      "dP = dO V^T, dV = P^T dO"),
            Operation("attention softmax (eager) (backward)", "backward", scope, "elementwise",
                      2 * sm.flops, 3 * scores * ctx.B, ctx.peak, ctx.bandwidth, count, "read P, dP; write dS"),
            Operation("attention scores QK^T (eager) (backward)", "backward", scope, "attention",
                      2 * qk.flops, qk.bytes + scores * ctx.B, ctx.peak, ctx.bandwidth, count,
                      "dQ = dS K, dK = dS^T Q"),
        ]
    return ops


def _mlp(ctx: _Context, arch: Architecture, scope: str, prefix: str, M: float, width: float,
         count: int, weights: float = 1) -> list[Operation]:
    """fc1 (gate and up fused for a gated MLP), the activation, fc2; width is already per GPU."""
    h = arch.hidden_size
    fc1 = 2 * width if arch.gated_mlp else width
    act = ("SwiGLU", SWIGLU_FLOPS, 2 * M * width) if arch.gated_mlp else ("GELU", GELU_FLOPS, M * width)
    return (_gemm(ctx, scope, f"{prefix}fc1{' (gate and up)' if arch.gated_mlp else ''}", M, h, fc1, count, weights)
            + _elementwise(ctx, scope, f"{prefix}{act[0]} activation", act[2], M * width, act[1], count,
                           f"read {'2*' if arch.gated_mlp else ''}M*f, write M*f")
            + _gemm(ctx, scope, f"{prefix}fc2", M, width, h, count, weights))


def layer_operations(ctx: _Context, arch: Architecture, training: Training, par: Parallel, kind: str,
                     window: int | None, count: int) -> tuple[list[Operation], list[Operation]]:
    """(forward operations in order, backward operations in reverse order) of one layer."""
    scope = f"layer ({kind}{', sliding window' if window else ''})"
    h, t, T, T_sp = arch.hidden_size, par.tp, ctx.T, ctx.T_sp
    norm_flops = NORM_FLOPS[arch.norm]
    norm_formula = f"read and write {'s*b*h/t' if par.sequence_parallel else 's*b*h'} (sequence parallel: /t)"
    groups: list[list[Operation]] = []
    groups.append(_elementwise(ctx, scope, "attention norm", T_sp * h, T_sp * h, norm_flops, count, norm_formula))
    # --- attention projections (column-parallel: output width / t)
    if arch.uses_mla:
        a = arch.num_attention_heads
        qk_head = arch.qk_nope_head_dim + arch.qk_rope_head_dim
        if arch.q_lora_rank:
            groups.append(_gemm(ctx, scope, "q down-projection (MLA, replicated)", T, h, arch.q_lora_rank, count))
            groups.append(_elementwise(ctx, scope, "q latent norm", T * arch.q_lora_rank, T * arch.q_lora_rank,
                                       norm_flops, count, "read and write s*b*q_lora_rank"))
            groups.append(_gemm(ctx, scope, "q up-projection (MLA)", T, arch.q_lora_rank, a * qk_head / t, count))
        else:
            groups.append(_gemm(ctx, scope, "q projection (MLA)", T, h, a * qk_head / t, count))
        groups.append(_gemm(ctx, scope, "kv down-projection (MLA, replicated)", T, h,
                            arch.kv_lora_rank + arch.qk_rope_head_dim, count))
        groups.append(_elementwise(ctx, scope, "kv latent norm", T * arch.kv_lora_rank, T * arch.kv_lora_rank,
                                   norm_flops, count, "read and write s*b*kv_lora_rank"))
        groups.append(_gemm(ctx, scope, "kv up-projection (MLA)", T, arch.kv_lora_rank,
                            a * (arch.qk_nope_head_dim + arch.v_head_dim) / t, count))
        rope_elements = T * (a / t + 1) * arch.qk_rope_head_dim
    else:
        qkv = arch.q_width + 2 * arch.kv_width
        groups.append(_gemm(ctx, scope, "QKV projection", T, h, qkv / t, count,
                            formula=f"2*T*h*(a + 2g)*d/t, M={T:g} K={h} N={qkv / t:g}"))
        if arch.qk_norm:
            qk = T * (arch.q_width + arch.kv_width) / t
            groups.append(_elementwise(ctx, scope, "q and k norms", qk, qk, norm_flops, count,
                                       "read and write s*b*(a + g)*d/t"))
        rope_elements = T * (arch.q_width + arch.kv_width) / t
    if arch.position_embedding == "rope":
        groups.append(_elementwise(ctx, scope, "rotary embedding", rope_elements, rope_elements, ROPE_FLOPS, count,
                                   "read and write q and k (rope part)"))
    groups.append(_attention_core(ctx, arch, training, par, scope, window, count))
    groups.append(_gemm(ctx, scope, "output projection", T, arch.attention_output_width / t, h, count))
    groups.append(_elementwise(ctx, scope, "residual add (attention)", 2 * T_sp * h, T_sp * h, 0.5, count,
                               "read 2*s*b*h, write s*b*h (/t with sequence parallelism)"))
    groups.append(_elementwise(ctx, scope, "MLP norm", T_sp * h, T_sp * h, norm_flops, count, norm_formula))
    # --- MLP
    if kind == "dense":
        groups.append(_mlp(ctx, arch, scope, "", T, arch.intermediate_size / t, count))
    else:
        e, k, phi = arch.num_experts, arch.num_experts_per_token, training.moe_capacity_factor
        # the router sees the sequence-parallel shard of the tokens (Megatron-Core TopKRouter)
        groups.append(_gemm(ctx, scope, "router", T_sp, h, e, count))
        groups.append(_elementwise(ctx, scope, "router softmax and top-k", T_sp * e, T_sp * e, SOFTMAX_FLOPS, count,
                                   "read and write s*b*E/t"))
        # Per GPU the routed tokens are k*phi*T/t in expert-TP groups of etp (activations.py):
        # M = k*phi*T*etp/t tokens through the e/ep local experts at width f_e/etp.
        routed = k * phi * T * par.etp / t
        groups.append(_elementwise(ctx, scope, "token permute (dispatch)", routed * h, routed * h, 0, count,
                                   "read and write k*phi*s*b*h*etp/t"))
        groups.append(_mlp(ctx, arch, scope, "experts: ", routed, arch.moe_intermediate_size / par.etp, count,
                           weights=e / par.ep))
        groups.append(_elementwise(ctx, scope, "token unpermute and weighted combine", routed * h, T_sp * h, 2, count,
                                   "read k*phi*s*b*h*etp/t, write s*b*h/t"))
        if arch.num_shared_experts:
            width = arch.shared_expert_intermediate_size * arch.num_shared_experts
            groups.append(_mlp(ctx, arch, scope, "shared experts: ", T, width / t, count))
    groups.append(_elementwise(ctx, scope, "residual add (MLP)", 2 * T_sp * h, T_sp * h, 0.5, count,
                               "read 2*s*b*h, write s*b*h (/t with sequence parallelism)"))
    forward = [op for g in groups for op in g if op.phase == "forward"]
    backward = [op for g in reversed(groups) for op in reversed(g) if op.phase == "backward"]
    return forward, backward


def embedding_operations(ctx: _Context, arch: Architecture, count: int) -> list[Operation]:
    """Vocabulary-parallel lookup: gather T rows of h, write T x h; backward scatter-adds the
    gradient rows into the table (read the gradient, read and write the rows)."""
    T, h = ctx.T, arch.hidden_size
    ops = [Operation("embedding lookup", "forward", "embedding", "elementwise", 0, 2 * T * h * ctx.B,
                     ctx.peak, ctx.bandwidth, count, "read s*b*h rows, write s*b*h")]
    if ctx.training:
        ops.append(Operation("embedding lookup (backward)", "backward", "embedding", "elementwise", T * h,
                             T * h * ctx.B + 2 * T * h * ctx.grad, ctx.peak, ctx.bandwidth, count,
                             "scatter-add s*b*h gradient rows"))
    return ops


def head_operations(ctx: _Context, arch: Architecture, training: Training, par: Parallel, vocab: int,
                    count: int) -> tuple[list[Operation], list[Operation]]:
    """Final norm, LM head (column-parallel over the vocabulary) and cross-entropy. Inference
    (prefill) computes the logits of the last token of each sequence only, as servers do."""
    h, t = arch.hidden_size, par.tp
    groups = [_elementwise(ctx, "head", "final norm", ctx.T_sp * h, ctx.T_sp * h, NORM_FLOPS[arch.norm], count,
                           "read and write s*b*h (/t with sequence parallelism)")]
    rows = ctx.T if ctx.training else training.micro_batch_size
    groups.append(_gemm(ctx, "head", "LM head", rows, h, vocab / t, count,
                        formula=f"2*T*h*V/t, M={rows:g} K={h} N={vocab / t:g}"))
    if ctx.training:
        logits = ctx.T * vocab / t
        B = ctx.B
        if training.loss == "standard":
            # upcast to fp32 and softmax, kept for backward (Korthikanti section 4.3); frameworks
            # without a fused kernel make a separate fp32 copy first
            fwd_bytes = logits * (B + 4) + (0 if training.framework == "megatron" else logits * 8)
            bwd_bytes = logits * (4 + B)
        else:  # fused in place, or chunked (Liger's chunks still pass through memory)
            fwd_bytes, bwd_bytes = 2 * logits * B, 2 * logits * B
        groups.append([
            Operation("cross-entropy loss", "forward", "head", "elementwise", SOFTMAX_FLOPS * logits, fwd_bytes,
                      ctx.peak, ctx.bandwidth, count, f"softmax over s*b*V/t logits ({training.loss})"),
            Operation("cross-entropy loss (backward)", "backward", "head", "elementwise", 2 * logits, bwd_bytes,
                      ctx.peak, ctx.bandwidth, count, "softmax - one-hot, in the compute dtype"),
        ])
    forward = [op for g in groups for op in g if op.phase == "forward"]
    backward = [op for g in reversed(groups) for op in reversed(g) if op.phase == "backward"]
    return forward, backward


# --- model FLOPs (for MFU) ---------------------------------------------------------------------------

def matmul_parameters(arch: Architecture) -> float:
    """N of the MFU: the weights of the matrix multiplications one token passes through, i.e.
    every layer's 2-D hidden matrices (routed experts: the top-k it is sent to, shared experts,
    routers, MLA's projections) plus the LM head (V x h, also when tied to the embedding). The
    embedding lookup, norms and biases are not matmuls and are left out. Layer index i's kind
    decides its weights; MTP modules are left out."""
    total = 0.0
    for kind, n_layers in arch.kind_counts():
        per_layer = 0.0
        for tensor in arch.layer_tensors(kind):
            if tensor.role != "hidden_matrix":
                continue
            if tensor.is_expert:
                per_layer += tensor.numel / tensor.copies * arch.num_experts_per_token
            else:
                per_layer += tensor.numel
        total += n_layers * per_layer
    return total + arch.vocab_size * arch.hidden_size


def model_flops_per_token(arch: Architecture, seq_len: int, training: bool = True) -> float:
    """PaLM appendix B: 6N + 12*L*H*Q*T per token for training, with N = `matmul_parameters`,
    H heads of width Q and T = seq_len. We halve the attention term for the causal mask (the keys
    a query attends to, s/2 on average, or w - w^2/(2s) with a sliding window w), the work flash
    attention actually does; PaLM, Megatron-LM and torchtitan quote the unhalved term, so our MFU
    of the same run is a little lower than theirs. With MLA, 2Q = d_qk + d_v. Inference (a
    prefill): 2N + the forward third of the attention term, the LM head counted for one token of
    each sequence (2*V*h / seq_len per token)."""
    d_qk, d_v, _ = _attention_widths(arch)
    attention = sum(2 * arch.num_attention_heads * (d_qk + d_v)
                    * attended_keys(seq_len, arch.sliding_window if _windowed(arch, i) else None)
                    for i in range(arch.num_layers))
    n = matmul_parameters(arch)
    if training:
        return 6 * n + 3 * attention
    head = arch.vocab_size * arch.hidden_size
    return 2 * (n - head) + attention + 2 * head / seq_len


# --- communication -----------------------------------------------------------------------------------

def _link(gpu: GPU, size: int, stride: int) -> tuple[str, float]:
    """A group of `size` ranks `stride` apart stays in one node when size*stride <= gpus_per_node
    (ranks are laid out TP innermost, then CP, then DP, PP outermost, as Megatron-Core orders
    them; the expert grid is expert-TP, EP, expert-DP)."""
    if size * stride <= gpu.gpus_per_node:
        return "intra-node", gpu.intra_node_bandwidth
    return "inter-node", gpu.inter_node_bandwidth


def _ring(n: int, all_reduce: bool = False) -> float:
    """Share of a buffer each GPU sends in a ring collective: (n-1)/n for an all-gather or a
    reduce-scatter, 2(n-1)/n for an all-reduce."""
    return (2 if all_reduce else 1) * (n - 1) / n


# --- the step ----------------------------------------------------------------------------------------

def _context(arch: Architecture, training: Training, recipe: Recipe, par: Parallel, gpu: GPU) -> tuple[_Context, list[str]]:
    notes = []
    compute = training.compute_dtype
    peak = gpu.bf16_flops / 2 if compute == "fp32" else gpu.bf16_flops
    if compute == "fp32":
        notes.append("fp32 compute runs as TF32 on tensor cores, half the bf16 rate (A100/H100 datasheets)")
    fp8 = training.fp8 or (training.mode == "inference" and training.param_dtype == "fp8")
    mm_peak, mm_in = peak, bytes_per_element(compute)
    if fp8:
        if gpu.fp8_flops is None:
            notes.append(f"{gpu.id} has no fp8 tensor cores: matmuls at the bf16 rate")
        else:
            mm_peak, mm_in = gpu.fp8_flops, 1.0
            notes.append("fp8: every linear layer's GEMMs (forward and backward) at the fp8 peak with 1-byte "
                         "inputs and weights (TransformerEngine recipe); attention, norms and the loss in bf16")
    if training.mode == "inference":
        weight = bytes_per_element(training.param_dtype) if not fp8 else 1.0
    else:
        weight = mm_in
    T = training.seq_len / par.cp * training.micro_batch_size
    ctx = _Context(
        B=bytes_per_element(compute), mm_in=mm_in, weight=weight, grad=bytes_per_element(recipe.grad_dtype),
        mm_peak=mm_peak, peak=peak, bandwidth=gpu.memory_bandwidth, training=training.mode == "training",
        T=T, T_sp=T / par.tp if par.sequence_parallel else T, t=par.tp)
    return ctx, notes


def roofline_config(cfg) -> Roofline:
    """The roofline of a loaded `config.Config`."""
    return roofline(cfg.architecture, cfg.training, cfg.parallel, cfg.hardware)


def roofline(arch: Architecture, training: Training | None = None, par: Parallel | None = None,
             hardware: Hardware | None = None) -> Roofline:
    """Operations of the slowest pipeline stage and the time of one step (training: forward,
    backward and optimizer over every micro-batch; inference: one forward prefill of the batch).

    step time = compute                  the operations' roof times x micro-batches
              + recompute                full: each recomputed layer's forward again; selective:
                                         the attention core again (Korthikanti et al. 2022)
              + bubble                   (p - 1) / (v m) x (compute + recompute) (Narayanan 2021)
              + exposed communication    TP and EP in full; CP beyond the attention core it
                                         overlaps; DP/FSDP and PP less `parallel.comm_overlap`
                                         of their time, hidden behind at most the compute
              + optimizer update         memory-bound: read and write states, master, gradient
    """
    from .resolved import resolve

    training = training or Training()
    par = par or Parallel()
    hardware = hardware or Hardware()
    # the memory model's rules and resolution; the FP8 recipe is modelled here, so its memory-side
    # refusal is skipped (the recipe and the ZeRO stage do not depend on it)
    cfg = resolve(arch, dataclasses.replace(training, fp8=False), par, hardware)
    is_training = training.mode == "training"
    zero = cfg.zero_stage if is_training else 0
    gpu = hardware.device
    recipe = cfg.recipe
    ctx, notes = _context(arch, training, recipe, par, gpu)
    m = cfg.microbatches
    p, v, t = par.pp, par.vpp, par.tp
    vocab = cfg.padded_vocab
    h, B = arch.hidden_size, ctx.B

    # --- operations of every layer variant, once (each with count 1 for now)
    kinds = arch.layer_kinds()
    variants = {(kinds[i], arch.sliding_window if _windowed(arch, i) else None) for i in range(arch.num_layers)}
    per_variant = {var: layer_operations(ctx, arch, training, par, var[0], var[1], 1) for var in variants}
    embed = embedding_operations(ctx, arch, 1)
    head_fwd, head_bwd = head_operations(ctx, arch, training, par, vocab, 1)

    def time_of(ops: list[Operation]) -> float:
        return sum(op.time_s for op in ops)

    stages = stage_layer_indices(arch, par)
    stage_info = []
    for rank, layers in enumerate(stages):
        counts: dict[tuple, int] = {}
        for i in layers:
            var = (kinds[i], arch.sliding_window if _windowed(arch, i) else None)
            counts[var] = counts.get(var, 0) + 1
        per_mb = sum(n * (time_of(per_variant[var][0]) + time_of(per_variant[var][1])) for var, n in counts.items())
        # recomputation: full re-runs each recomputed layer's forward; selective re-runs the core
        # attention (Korthikanti et al. 2022, sections 5 and 6)
        recompute, recompute_fraction = 0.0, 0.0
        if is_training and training.recompute == "full" and layers:
            recomputed = min(training.recompute_layers or len(layers), len(layers))
            recompute_fraction = recomputed / len(layers)
            recompute = recompute_fraction * sum(n * time_of(per_variant[var][0]) for var, n in counts.items())
        elif is_training and training.recompute == "selective":
            recompute = sum(n * time_of([op for op in per_variant[var][0] if op.kind == "attention"
                                         or op.name.startswith("attention softmax")])
                            for var, n in counts.items())
        if rank == 0:
            per_mb += time_of(embed)
        if rank == p - 1:
            per_mb += time_of(head_fwd) + time_of(head_bwd)
        stage_info.append((per_mb, recompute, counts, recompute_fraction))
    slowest = max(range(p), key=lambda r: stage_info[r][0] + stage_info[r][1])
    per_mb, recompute_mb, counts, recompute_fraction = stage_info[slowest]
    stage_layers = sum(counts.values())

    # --- the operations of the slowest stage with their counts per step
    operations: list[Operation] = []
    if slowest == 0:
        operations += [dataclasses.replace(op, count=m) for op in embed if op.phase == "forward"]
    for var in sorted(counts, key=lambda var: (var[0], var[1] or 0)):
        operations += [dataclasses.replace(op, count=counts[var] * m) for op in per_variant[var][0]]
    if slowest == p - 1:
        operations += [dataclasses.replace(op, count=m) for op in head_fwd + head_bwd]
    for var in sorted(counts, key=lambda var: (var[0], var[1] or 0), reverse=True):
        operations += [dataclasses.replace(op, count=counts[var] * m) for op in per_variant[var][1]]
    if slowest == 0:
        operations += [dataclasses.replace(op, count=m) for op in embed if op.phase == "backward"]

    compute_s = m * per_mb
    recompute_s = m * recompute_mb
    ideal = compute_s + recompute_s
    # pipeline bubble: (p - 1) / (v m) of the ideal time (Narayanan et al. 2021, section 2.2)
    bubble_fraction = (p - 1) / (v * m)
    bubble_s = bubble_fraction * ideal

    # --- communication of the slowest stage, per step
    comms: list[Communication] = []
    directions = 2 if is_training else 1

    def add(name, group, size, stride, bytes_, formula, exposed_fraction=1.0, hide_behind=0.0):
        if size <= 1 or bytes_ <= 0:
            return
        link, bw = _link(gpu, size, stride)
        time = bytes_ / bw
        exposed = exposed_fraction * time if not hide_behind else max(0.0, time - hide_behind)
        comms.append(Communication(name, group, size, link, bw, bytes_, time, exposed, formula))

    T = ctx.T
    recompute_passes = recompute_fraction  # full recompute re-runs the forward's collectives
    # TP: 2 all-reduces per layer forward and 2 backward (Shoeybi et al. 2019, section 3), or with
    # sequence parallelism 2 all-gathers + 2 reduce-scatters moving the same bytes (Korthikanti
    # section 4.2.2); each of s*b*h*B bytes with the ring factor 2(t-1)/t. Full recompute repeats
    # the forward's. Exposed: the next GEMM needs the result (--tp-comm-overlap / async TP not modelled).
    tp_bytes = (2 * (directions + recompute_passes) * _ring(t, all_reduce=True) * T * h * B
                * stage_layers * m)
    add("tensor-parallel all-reduce (or all-gather + reduce-scatter)", "TP", t, 1, tp_bytes,
        "2 per layer per direction x 2(t-1)/t x s*b*h*B x layers x m")
    # CP: ring attention passes each rank's K/V chunk around the ring, cp - 1 hops; backward passes
    # K/V and their gradients. Overlapped with the attention core of the chunk in hand
    # (Megatron-Core context parallelism docs), so only the excess over that compute is exposed.
    if par.cp > 1:
        d_qk, d_v, kv_heads = _attention_widths(arch)
        kv = T * kv_heads / t * (d_qk + d_v) * B
        per_layer = (par.cp - 1) * kv * (1 + 2 * (directions - 1))
        attn_time = sum(n * time_of([op for op in per_variant[var][0] + per_variant[var][1] if op.kind == "attention"])
                        for var, n in counts.items())
        add("context-parallel ring exchange of K and V", "CP", par.cp, t, per_layer * stage_layers * m,
            "(cp-1) x s*b*g*(d_k + d_v)/t*B per layer forward, x2 more in backward (K/V and their gradients)",
            hide_behind=attn_time * m)
    # EP: an all-to-all dispatches the k routed copies of each token and another combines them,
    # forward and backward (Megatron-Core alltoall token dispatcher); (ep-1)/ep of them leave the GPU.
    moe_layers = sum(n for var, n in counts.items() if var[0] == "moe")
    if moe_layers and par.ep > 1:
        k, phi = arch.num_experts_per_token, training.moe_capacity_factor
        per_layer = 2 * (directions + recompute_passes) * (par.ep - 1) / par.ep * k * phi * ctx.T_sp * h * B
        add("expert-parallel all-to-all (dispatch and combine)", "EP", par.ep, par.etp, per_layer * moe_layers * m,
            "2 per MoE layer per direction x (ep-1)/ep x k*phi*s*b*h/t*B")

    # DP / FSDP (training only): gradients reduced once per step (accumulated over micro-batches);
    # ZeRO-1/2 reduce-scatter them and all-gather the updated parameters, ZeRO-3/FSDP all-gather
    # the parameters before each micro-batch's forward and again for its backward (Rajbhandari et
    # al. 2020, section 7: 1.5x the all-reduce volume), FSDP2 shard-grad-op once per micro-batch.
    sp = cfg.stages[slowest]
    if is_training:
        G, P = bytes_per_element(recipe.grad_dtype), bytes_per_element(recipe.param_dtype)
        if training.framework == "fsdp2":
            P = B  # fully_shard gathers the bf16 compute copy (MixedPrecisionPolicy)
        for label, group, n, stride, params in (
                ("", "DP", par.dp * par.cp, t, sp.dense_local),
                ("expert ", "expert DP", max(1, par.expert_data_parallel), par.ep * par.etp, sp.expert_local)):
            if n <= 1 or not params:
                continue
            if zero == 0:
                add(f"{label}gradient all-reduce", group, n, stride, _ring(n, True) * params * G,
                    "2(n-1)/n x params x grad bytes, once per step")
            else:
                add(f"{label}gradient reduce-scatter", group, n, stride, _ring(n) * params * G,
                    "(n-1)/n x params x grad bytes, once per step")
                gathers = {1: 1, 2: (m if training.framework == "fsdp2" else 1), 3: 2 * m}[zero]
                add(f"{label}parameter all-gather", group, n, stride, gathers * _ring(n) * params * P,
                    f"{gathers} x (n-1)/n x params x param bytes" + (" (forward and backward, every micro-batch)"
                                                                     if zero == 3 else ""))
    # PP: each micro-batch sends its activations (s*b*h*B, /t with Megatron's scatter-gather over
    # TP) to the next stage and its gradient back, once per virtual chunk.
    if p > 1:
        hop = T * h * B / (t if par.sequence_parallel else 1)
        add("pipeline send/receive of activations", "PP", p, par.gpus_per_stage, directions * v * hop * m,
            "directions x v x s*b*h*B (/t with sequence parallelism) x m")
    # Overlap: `parallel.comm_overlap` of the DP/FSDP and PP communication hides behind compute
    # (never more than the compute there is); TP and EP stay exposed, CP as computed above.
    hideable = [c for c in comms if c.group in ("DP", "expert DP", "PP")]
    budget = ideal  # compute time there is to hide behind
    rest = []
    for c in comms:
        if any(c is x for x in hideable):
            hidden = min(par.comm_overlap * c.time_s, budget)
            budget -= hidden
            c = dataclasses.replace(c, exposed_s=c.time_s - hidden)
        rest.append(c)
    comms = rest
    exposed_comm_s = sum(c.exposed_s for c in comms)

    # --- optimizer update: memory-bound, over the parameters this GPU updates (ZeRO >= 1 shards them)
    optimizer_s = 0.0
    if is_training:
        # the update reads and writes the gradient once, the master copy and the parameter, and every
        # optimizer state (states.optimizer_state_bytes, from the optimizer's record)
        per_param = (bytes_per_element(recipe.grad_dtype) + (8 if recipe.master_weights else 0)
                     + 2 * bytes_per_element(recipe.param_dtype))
        traffic = [n * per_param + 2 * optimizer_state_bytes(sp.total, training.optimizer, recipe.optimizer_dtype,
                                                             experts) for n, experts in
                   ((sp.dense_local, False), (sp.expert_local, True))]
        if zero >= 1:
            traffic = [traffic[0] / (par.dp * par.cp), traffic[1] / max(1, par.expert_data_parallel)]
        optimizer_s = sum(traffic) / gpu.memory_bandwidth

    time_s = ideal + bubble_s + exposed_comm_s + optimizer_s
    tokens_per_step = cfg.global_batch_size * training.seq_len
    tokens_per_s_per_gpu = tokens_per_step / time_s / par.gpus
    flops_per_token = model_flops_per_token(arch, training.seq_len, is_training)
    mfu = tokens_per_s_per_gpu * flops_per_token / ctx.peak

    notes += [
        f"stage {slowest} shown: the slowest pipeline stage, which sets the step time",
        "times are at the roof, max(flops/peak, bytes/bandwidth): a lower bound on time, an upper bound on speed",
        "MFU: PaLM appendix B's 6N + 12*L*H*Q*T per token with the attention term halved for the causal mask, "
        "N = matmul weights a token passes through (top-k experts) including the LM head, without the "
        "embedding; against the compute dtype's peak (bf16 also under fp8)",
        f"communication overlap {par.comm_overlap:g} applies to DP/FSDP and PP traffic; TP and EP collectives "
        "are exposed (on the critical path between dependent GEMMs); CP hides behind the attention core",
        "left out: biases, dropout, MTP modules, kernel launch gaps, the embedding's TP all-reduce",
    ]
    if not is_training:
        notes.append("inference: one prefill of seq_len tokens per sequence, forward only, no optimizer; "
                     "the LM head runs on the last token of each sequence; time_s covers the global batch")
    step = Step(
        time_s=time_s, tokens_per_s_per_gpu=tokens_per_s_per_gpu, mfu=mfu, bubble_fraction=bubble_fraction,
        exposed_comm_s=exposed_comm_s, compute_s=compute_s, recompute_s=recompute_s, bubble_s=bubble_s,
        optimizer_s=optimizer_s, microbatches=m, tokens_per_step=tokens_per_step,
        model_flops_per_token=flops_per_token, mfu_peak_flops=ctx.peak, communication=tuple(comms))
    return Roofline(mode=training.mode, gpu=gpu.id, stage=slowest,
                    stage_times_s=tuple(m * (a + r) for a, r, _, _ in stage_info),
                    operations=tuple(operations), step=step, notes=tuple(notes))


# --- text ----------------------------------------------------------------------------------------------

def _si(x: float, unit: str = "") -> str:
    for scale, prefix in ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(x) >= scale:
            return f"{x / scale:.2f} {prefix}{unit}"
    return f"{x:.2f} {unit}".rstrip()


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.3f}"


def render_roofline_text(result: Roofline) -> str:
    step = result.step
    lines = [f"Roofline on {result.gpu} ({result.mode}), pipeline stage {result.stage} "
             f"(the slowest); one execution = one layer, one micro-batch, one GPU"]
    header = (f"  {'operation':<52}{'phase':<10}{'FLOPs':>12}{'bytes':>12}{'FLOP/B':>9}{'ridge':>7}"
              f"  {'bound':<8}{'ms each':>9}{'count':>7}{'ms total':>10}")
    scope = None
    for op in result.operations:
        if op.scope != scope:
            scope = op.scope
            lines += ["", f"{scope}:", header]
        lines.append(f"  {op.name[:51]:<52}{op.phase:<10}{_si(op.flops):>12}{_si(op.bytes, 'B'):>12}"
                     f"{op.arithmetic_intensity:>9.1f}{op.ridge_point:>7.0f}  {op.bound:<8}{_ms(op.time_s):>9}"
                     f"{op.count:>7}{_ms(op.total_time_s):>10}")
    lines += ["", "Communication per step:"]
    if not step.communication:
        lines.append("  none")
    for c in step.communication:
        lines.append(f"  {c.name:<60}{c.group:<10} n={c.size:<4}{c.link:<11}{_si(c.bytes, 'B'):>11}"
                     f"  {_ms(c.time_s):>9} ms, exposed {_ms(c.exposed_s)} ms")
    lines += [
        "",
        f"Step ({step.microbatches} micro-batches): {step.time_s:.4f} s = compute {step.compute_s:.4f}"
        f" + recompute {step.recompute_s:.4f} + bubble {step.bubble_s:.4f} (fraction {step.bubble_fraction:.3f})"
        f" + exposed communication {step.exposed_comm_s:.4f} + optimizer {step.optimizer_s:.4f}",
        f"Throughput: {step.tokens_per_s_per_gpu:,.0f} tokens/s per GPU; MFU {step.mfu:.1%} "
        f"({_si(step.model_flops_per_token)}FLOP per token against {_si(step.mfu_peak_flops)}FLOP/s)",
        "",
    ]
    lines += [f"Note: {n}" for n in result.notes]
    return "\n".join(lines)
