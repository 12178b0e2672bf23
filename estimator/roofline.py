"""Speed: a roofline per operation, the time each is expected to take, and one step built from them.

The roofline model (Williams, Waterman and Patterson 2009, "Roofline: an insightful visual
performance model", CACM 52(4)) bounds the time of an operation by whichever the GPU runs out of
first, arithmetic or memory traffic:

    roof time = max(flops / peak_flops, bytes / memory_bandwidth)

An operation's arithmetic intensity is flops / bytes; where it exceeds the GPU's ridge point,
peak_flops / memory_bandwidth, the operation is compute-bound, otherwise memory-bound.

Real kernels reach only part of either roof, so each operation also carries what it is expected
to achieve (`kernels.py`: GEMMs at the measured maximum achievable matmul FLOPS less what small
dimensions lose, flash attention at its measured TFLOP/s by sequence length and head width,
memory-bound kernels at achieved bandwidth with the extra passes of unfused eager kernels, and a
launch floor per kernel):

    expected time = max(flops / (peak x compute efficiency), bytes x passes / (bandwidth x 0.9),
                        kernels x launch gap)

The step's `time_s`, `tokens_per_s_per_gpu` and `mfu` are the expected figures; `upper_bound`
holds the same three with every operation at its roof, every link at its line rate and all
overlappable traffic hidden.

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
not hide (`collectives.py`: NCCL bus bandwidths as nccl-tests measures them, and what each
framework overlaps). See `roofline` for each term and its source.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import NamedTuple

from . import collectives, kernels
from .act_entries import fused_kernels, tokens_per_gpu
from .act_recompute import op_level, op_level_recomputed_matmul_share, recomputed_layer_count, recomputed_modules
from .architecture import Architecture
from .dtypes import bytes_per_element
from .gpus import GPU
from .hardware import Hardware
from .parallel import Parallel
from .resolved import Resolved, resolve, training_with
from .sharding import split_key
from .states import fsdp2_gathered_block_bytes, optimizer_state_bytes
from .choices import FSDP_FRAMEWORKS
from .training import Training

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

# The selective-recompute modules an operation belongs to (Megatron-Core --recompute-modules, the
# names the memory model's ledger uses in activations.py): recomputing a module re-runs its forward.
CORE_ATTN = ("core_attn",)
NORM_MODULE = ("layernorm",)
UP_PROJ_MODULE = ("mla_up_proj",)
MOE_MODULE = ("moe",)


SOURCES = (ROOFLINE, PALM, NARAYANAN, FLASH2, KORTHIKANTI, RING, collectives.NCCL_TESTS, *collectives.OVERLAP_SOURCES,
           *kernels.SOURCES)


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
    modules: tuple[str, ...] = ()  # the selective-recompute modules (training.RECOMPUTE_MODULES) it belongs to
    compute_efficiency: float = 1.0  # fraction of peak_flops the kernel reaches (kernels.py)
    memory_efficiency: float = 1.0  # fraction of bandwidth it reaches
    passes: float = 1.0  # its traffic over `bytes` (unfused eager kernels re-read and re-write)
    kernels: int = 1  # kernel launches (each at least kernels.LAUNCH_GAP_S)

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

    @property
    def expected_time_s(self) -> float:
        """Time at what the kernel achieves: each roof scaled by its efficiency, the traffic by the
        passes an unfused kernel makes, and at least one launch gap per kernel."""
        return max(self.flops / (self.peak_flops * self.compute_efficiency),
                   self.bytes * self.passes / (self.bandwidth * self.memory_efficiency),
                   self.kernels * kernels.LAUNCH_GAP_S)

    @property
    def total_expected_s(self) -> float:
        return self.expected_time_s * self.count

    @property
    def achieved_fraction(self) -> float:
        """Share of its roof the operation reaches: roof time / expected time."""
        return self.time_s / self.expected_time_s

    def to_json(self) -> dict:
        return {
            "name": self.name, "phase": self.phase, "flops": self.flops, "bytes": self.bytes,
            "arithmetic_intensity": self.arithmetic_intensity, "bound": self.bound, "time_s": self.expected_time_s,
            "roof_time_s": self.time_s, "achieved_fraction": self.achieved_fraction,
            "scope": self.scope, "kind": self.kind, "count": self.count, "total_time_s": self.total_expected_s,
            "roof_total_time_s": self.total_time_s, "ridge_point": self.ridge_point, "peak_flops": self.peak_flops,
            "bandwidth": self.bandwidth, "formula": self.formula, "modules": list(self.modules),
        }


class Communication(NamedTuple):
    """One collective of the step on one GPU: its total time and the part compute does not hide.
    (An immutable record built and revised several times in every step: a NamedTuple's `_replace`
    costs a fraction of `dataclasses.replace`.)"""

    name: str
    group: str  # "TP", "CP", "EP", "DP", "expert DP", "PP"
    size: int  # ranks in the group
    link: str  # "intra-node" or "inter-node"
    bandwidth: float  # bytes/s, one direction, per GPU: the bus bandwidth NCCL reaches (collectives.py)
    bytes: float  # bytes one GPU sends per step (ring factors applied)
    time_s: float
    exposed_s: float
    formula: str
    line_bandwidth: float = 0.0  # the link's one-way line rate per GPU (the catalog's)
    calls: float = 0.0  # collective calls per step (each costs a latency)
    unhideable_s: float = 0.0  # exposed whatever the compute: a last bucket, a first prefetch unit

    def to_json(self) -> dict:
        return self._asdict()


@dataclass(frozen=True)
class Bound:
    """The step at the roofs: every operation at its roof, every link at its line rate, all
    overlappable traffic hidden behind compute: what no run of this layout can beat."""

    time_s: float
    tokens_per_s_per_gpu: float
    mfu: float

    def to_json(self) -> dict:
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class Step:
    time_s: float
    tokens_per_s_per_gpu: float
    mfu: float
    bubble_fraction: float  # bubble / (compute + recompute); 1F1B: (p - 1) / (v m) (Narayanan 2021)
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
    upper_bound: Bound | None = None

    @property
    def bubble_share_of_step(self) -> float:
        """The share of the step the GPU idles in the pipeline bubble (bubble_s / time_s)."""
        return self.bubble_s / self.time_s if self.time_s else 0.0

    def exposed_by_group(self) -> dict[str, float]:
        """Exposed communication seconds by group (TP, CP, EP, DP, expert DP, PP)."""
        out: dict[str, float] = {}
        for c in self.communication:
            out[c.group] = out.get(c.group, 0.0) + c.exposed_s
        return out

    def to_json(self) -> dict:
        out = {k: getattr(self, k) for k in (
            "time_s", "tokens_per_s_per_gpu", "mfu", "bubble_fraction", "bubble_share_of_step", "exposed_comm_s",
            "compute_s",
            "recompute_s", "bubble_s", "optimizer_s", "microbatches", "tokens_per_step",
            "model_flops_per_token", "mfu_peak_flops")}
        out["communication"] = [c.to_json() for c in self.communication]
        out["exposed_comm_by_group_s"] = self.exposed_by_group()
        if self.upper_bound is not None:
            out["upper_bound"] = self.upper_bound.to_json()
        return out


@dataclass(frozen=True)
class Roofline:
    mode: str  # "training" or "inference" (a prefill of seq_len tokens)
    gpu: str
    stage: int  # the pipeline stage shown: the slowest one, which sets the step time
    stage_times_s: tuple[float, ...]  # expected compute + recompute per step, every stage
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
    gpu: GPU
    framework: str
    fused: bool  # fused norm/rotary/activation kernels (Megatron's TransformerEngine) rather than eager ops
    frozen: frozenset = frozenset()  # scopes whose weights are frozen (an adapter run): no weight gradient


def _gemm(ctx: _Context, scope: str, name: str, M: float, K: float, N: float, count: int,
          weights: float = 1, formula: str = "", modules: tuple[str, ...] = ()) -> list[Operation]:
    """Forward, input-gradient and weight-gradient matmuls of y (M x N) = x (M x K) @ W (K x N).
    `weights` > 1 is a grouped GEMM over that many expert matrices with M tokens in total (each
    expert's GEMM sees M / weights rows). Each runs at `kernels.gemm_efficiency` of its shape: the
    input gradient is (M x N) @ (N x K), the weight gradient (K x M) @ (M x N)."""
    W = K * N * weights
    flops = 2 * M * K * N
    rows = M / weights

    def op(label, phase, moved, shape, text):
        return Operation(label, phase, scope, "matmul", flops, moved, ctx.mm_peak, ctx.bandwidth, count, text,
                         modules, kernels.gemm_efficiency(ctx.gpu, *shape), kernels.BANDWIDTH_EFFICIENCY)

    fwd = op(name, "forward", M * K * ctx.mm_in + W * ctx.weight + M * N * ctx.B, (rows, K, N),
             formula or f"2*M*K*N, M={M:g} K={K:g} N={N:g}")
    if not ctx.training:
        return [fwd]
    if scope in ctx.frozen or ("layer" in scope and "layer" in ctx.frozen):
        # a frozen weight gets no gradient: dW is not computed (adapters.py)
        return [fwd, op(f"{name} (input gradient)", "backward", M * N * ctx.mm_in + W * ctx.mm_in + M * K * ctx.B,
                        (rows, N, K), "dX = dY W^T: 2*M*K*N (frozen weight: no dW)")]
    dgrad = op(f"{name} (input gradient)", "backward", M * N * ctx.mm_in + W * ctx.mm_in + M * K * ctx.B,
               (rows, N, K), "dX = dY W^T: 2*M*K*N")
    wgrad = op(f"{name} (weight gradient)", "backward", M * K * ctx.mm_in + M * N * ctx.mm_in + W * ctx.grad,
               (K, rows, N), "dW = X^T dY: 2*M*K*N")
    return [fwd, dgrad, wgrad]


def _elementwise(ctx: _Context, scope: str, name: str, elements_in: float, elements_out: float,
                 flops_per_element: float, count: int, formula: str, modules: tuple[str, ...] = (),
                 group: str = "") -> list[Operation]:
    """A memory-bound kernel. Its backward reads the output gradient and the saved input and
    writes the input gradient: (out + 2*in) elements. `group` ("norm", "rope", "activation")
    names the eager op sequence it runs as without fused kernels (kernels.EAGER_TRAFFIC)."""
    passes, launches = kernels.eager_traffic(group, ctx.fused)

    def op(label, phase, flops, moved):
        return Operation(label, phase, scope, "elementwise", flops, moved, ctx.peak, ctx.bandwidth, count, formula,
                         modules, 1.0, kernels.BANDWIDTH_EFFICIENCY, passes, launches)

    fwd = op(name, "forward", flops_per_element * elements_in, (elements_in + elements_out) * ctx.B)
    if not ctx.training:
        return [fwd]
    return [fwd, op(f"{name} (backward)", "backward", 2 * flops_per_element * elements_in,
                    (elements_out + 2 * elements_in) * ctx.B)]


def _tagged(ops: list[Operation], *modules: str) -> list[Operation]:
    """The operations marked as part of these selective-recompute modules."""
    return [dataclasses.replace(op, modules=modules) for op in ops]


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
        # the kernel sees blocks of s/cp queries (ring attention runs one block per step), at most the window
        span = min(window or s_q, s_q)

        def efficiency(direction):
            return kernels.attention_efficiency(ctx.gpu, ctx.framework, direction, span, d_qk)

        fwd = Operation("attention core (flash)", "forward", scope, "attention", flops,
                        io + ctx.T * a_t * 4, ctx.peak, ctx.bandwidth, count,
                        "2*b*(a/t)*(s/cp)*keys*(d_qk + d_v), keys = causal average", CORE_ATTN,
                        efficiency("forward"), kernels.BANDWIDTH_EFFICIENCY)
        if not ctx.training:
            return [fwd]
        # backward reads q, k, v, o, dO, lse and writes dq, dk, dv
        bwd = Operation("attention core (flash) (backward)", "backward", scope, "attention", 2.5 * flops,
                        2 * io + ctx.T * a_t * (d_v * ctx.B + 4), ctx.peak, ctx.bandwidth, count,
                        "2.5 x forward (FlashAttention-2: 5 matmuls against 2, the scores recomputed)", CORE_ATTN,
                        efficiency("backward"), kernels.BANDWIDTH_EFFICIENCY)
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
    if ctx.training:  # eager attention: unfused batched GEMMs of head width d, at the GEMM rate of that shape
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
    gemm = kernels.gemm_efficiency(ctx.gpu, s_q, d_qk, keys)
    return [dataclasses.replace(op, modules=CORE_ATTN, compute_efficiency=gemm if op.kind == "attention" else 1.0,
                                memory_efficiency=kernels.BANDWIDTH_EFFICIENCY) for op in ops]


def _mlp(ctx: _Context, arch: Architecture, scope: str, prefix: str, M: float, width: float,
         count: int, weights: float = 1, modules: tuple[str, ...] = ("mlp",),
         act_modules: tuple[str, ...] = ("mlp",)) -> list[Operation]:
    """fc1 (gate and up fused for a gated MLP), the activation, fc2; width is already per GPU."""
    h = arch.hidden_size
    fc1 = 2 * width if arch.gated_mlp else width
    act = ("SwiGLU", SWIGLU_FLOPS, 2 * M * width) if arch.gated_mlp else ("GELU", GELU_FLOPS, M * width)
    return (_gemm(ctx, scope, f"{prefix}fc1{' (gate and up)' if arch.gated_mlp else ''}", M, h, fc1, count, weights,
                  modules=modules)
            + _elementwise(ctx, scope, f"{prefix}{act[0]} activation", act[2], M * width, act[1], count,
                           f"read {'2*' if arch.gated_mlp else ''}M*f, write M*f", act_modules, "activation")
            + _gemm(ctx, scope, f"{prefix}fc2", M, width, h, count, weights, modules=modules))


def layer_operations(ctx: _Context, arch: Architecture, training: Training, par: Parallel, kind: str,
                     window: int | None, count: int) -> tuple[list[Operation], list[Operation]]:
    """(forward operations in order, backward operations in reverse order) of one layer."""
    scope = f"layer ({kind}{', sliding window' if window else ''})"
    h, t, T, T_sp = arch.hidden_size, par.tp, ctx.T, ctx.T_sp
    norm_flops = NORM_FLOPS[arch.norm]
    norm_formula = f"read and write {'s*b*h/t' if par.sequence_parallel else 's*b*h'} (sequence parallel: /t)"
    groups: list[list[Operation]] = []
    groups.append(_elementwise(ctx, scope, "attention norm", T_sp * h, T_sp * h, norm_flops, count, norm_formula,
                               NORM_MODULE, "norm"))
    # --- attention projections (column-parallel: output width / t)
    if arch.uses_mla:
        a = arch.num_attention_heads
        qk_head = arch.qk_nope_head_dim + arch.qk_rope_head_dim
        if arch.q_lora_rank:
            groups.append(_gemm(ctx, scope, "q down-projection (MLA, replicated)", T, h, arch.q_lora_rank, count))
            groups.append(_elementwise(ctx, scope, "q latent norm", T * arch.q_lora_rank, T * arch.q_lora_rank,
                                       norm_flops, count, "read and write s*b*q_lora_rank"))
            groups.append(_gemm(ctx, scope, "q up-projection (MLA)", T, arch.q_lora_rank, a * qk_head / t, count,
                                modules=UP_PROJ_MODULE))
        else:
            groups.append(_gemm(ctx, scope, "q projection (MLA)", T, h, a * qk_head / t, count))
        groups.append(_gemm(ctx, scope, "kv down-projection (MLA, replicated)", T, h,
                            arch.kv_lora_rank + arch.qk_rope_head_dim, count))
        groups.append(_elementwise(ctx, scope, "kv latent norm", T * arch.kv_lora_rank, T * arch.kv_lora_rank,
                                   norm_flops, count, "read and write s*b*kv_lora_rank"))
        groups.append(_gemm(ctx, scope, "kv up-projection (MLA)", T, arch.kv_lora_rank,
                            a * (arch.qk_nope_head_dim + arch.v_head_dim) / t, count, modules=UP_PROJ_MODULE))
        rope_elements = T * (a / t + 1) * arch.qk_rope_head_dim
    else:
        qkv = arch.q_width + 2 * arch.kv_width
        groups.append(_gemm(ctx, scope, "QKV projection", T, h, qkv / t, count,
                            formula=f"2*T*h*(a + 2g)*d/t, M={T:g} K={h} N={qkv / t:g}"))
        if arch.qk_norm:
            qk = T * (arch.q_width + arch.kv_width) / t
            groups.append(_elementwise(ctx, scope, "q and k norms", qk, qk, norm_flops, count,
                                       "read and write s*b*(a + g)*d/t", group="norm"))
        rope_elements = T * (arch.q_width + arch.kv_width) / t
    if arch.position_embedding == "rope":
        groups.append(_elementwise(ctx, scope, "rotary embedding", rope_elements, rope_elements, ROPE_FLOPS, count,
                                   "read and write q and k (rope part)", UP_PROJ_MODULE if arch.uses_mla else (),
                                   "rope"))
    groups.append(_attention_core(ctx, arch, training, par, scope, window, count))
    groups.append(_gemm(ctx, scope, "output projection", T, arch.attention_output_width / t, h, count))
    groups.append(_elementwise(ctx, scope, "residual add (attention)", 2 * T_sp * h, T_sp * h, 0.5, count,
                               "read 2*s*b*h, write s*b*h (/t with sequence parallelism)"))
    groups.append(_elementwise(ctx, scope, "MLP norm", T_sp * h, T_sp * h, norm_flops, count, norm_formula,
                               NORM_MODULE, "norm"))
    # --- MLP
    if kind == "dense":
        groups.append(_mlp(ctx, arch, scope, "", T, arch.intermediate_size / t, count))
    else:
        e, k, phi = arch.num_experts, arch.num_experts_per_token, training.moe_capacity_factor
        # the router sees the sequence-parallel shard of the tokens (Megatron-Core TopKRouter)
        groups.append(_gemm(ctx, scope, "router", T_sp, h, e, count, modules=MOE_MODULE))
        groups.append(_elementwise(ctx, scope, "router softmax and top-k", T_sp * e, T_sp * e, SOFTMAX_FLOPS, count,
                                   "read and write s*b*E/t", MOE_MODULE))
        # Per GPU the routed tokens are k*phi*T/t in expert-TP groups of etp (activations.py):
        # M = k*phi*T*etp/t tokens through the e/ep local experts at width f_e/etp.
        routed = k * phi * T * par.etp / t
        groups.append(_elementwise(ctx, scope, "token permute (dispatch)", routed * h, routed * h, 0, count,
                                   "read and write k*phi*s*b*h*etp/t", MOE_MODULE))
        groups.append(_mlp(ctx, arch, scope, "experts: ", routed, arch.moe_intermediate_size / par.etp, count,
                           weights=e / par.ep, modules=MOE_MODULE, act_modules=MOE_MODULE + ("moe_act",)))
        groups.append(_elementwise(ctx, scope, "token unpermute and weighted combine", routed * h, T_sp * h, 2, count,
                                   "read k*phi*s*b*h*etp/t, write s*b*h/t", MOE_MODULE))
        if arch.num_shared_experts:
            width = arch.shared_expert_intermediate_size * arch.num_shared_experts
            shared = MOE_MODULE + ("shared_experts",)
            groups.append(_mlp(ctx, arch, scope, "shared experts: ", T, width / t, count, modules=shared,
                               act_modules=shared))
    groups.append(_elementwise(ctx, scope, "residual add (MLP)", 2 * T_sp * h, T_sp * h, 0.5, count,
                               "read 2*s*b*h, write s*b*h (/t with sequence parallelism)"))
    if training.adapter:
        groups += _adapter_operations(ctx, arch, training, scope, kind, count)
    forward = [op for g in groups for op in g if op.phase == "forward"]
    backward = [op for g in reversed(groups) for op in reversed(g) if op.phase == "backward"]
    return forward, backward


def _adapter_operations(ctx: _Context, arch: Architecture, training: Training, scope: str, kind: str,
                        count: int) -> list[list[Operation]]:
    """Each adapted module's LoRA branch (adapters.py): the input cast to the adapters' dtype, then
    lora_A (T x in -> r) and lora_B (T x r -> out), trained (their weight gradients computed)."""
    from .adapters import adapted_modules
    trained = dataclasses.replace(ctx, frozen=frozenset())
    T, r = ctx.T, training.adapter.rank
    groups = []
    for m in adapted_modules(training.adapter, arch, kind):
        rank = r * m.rank_factor
        label = f"{m.name} adapter"
        groups.append(_elementwise(ctx, scope, f"{label}: input cast", T * m.in_features * m.copies,
                                   T * m.in_features * m.copies, 0, count, "read s*b*in, write s*b*in"))
        groups.append(_gemm(trained, scope, f"{label}: lora_A", T, m.in_features, rank * m.copies, count))
        groups.append(_gemm(trained, scope, f"{label}: lora_B", T, rank, m.out_features * m.copies, count))
    return groups


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
    return [dataclasses.replace(op, memory_efficiency=kernels.BANDWIDTH_EFFICIENCY) for op in ops]


def head_operations(ctx: _Context, arch: Architecture, training: Training, par: Parallel, vocab: int,
                    count: int) -> tuple[list[Operation], list[Operation]]:
    """Final norm, LM head (column-parallel over the vocabulary) and cross-entropy. Inference
    (prefill) computes the logits of the last token of each sequence only, as servers do."""
    h, t = arch.hidden_size, par.tp
    groups = [_elementwise(ctx, "head", "final norm", ctx.T_sp * h, ctx.T_sp * h, NORM_FLOPS[arch.norm], count,
                           "read and write s*b*h (/t with sequence parallelism)", group="norm")]
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
        groups.append([dataclasses.replace(op, memory_efficiency=kernels.BANDWIDTH_EFFICIENCY) for op in [
            Operation("cross-entropy loss", "forward", "head", "elementwise", SOFTMAX_FLOPS * logits, fwd_bytes,
                      ctx.peak, ctx.bandwidth, count, f"softmax over s*b*V/t logits ({training.loss})"),
            Operation("cross-entropy loss (backward)", "backward", "head", "elementwise", 2 * logits, bwd_bytes,
                      ctx.peak, ctx.bandwidth, count, "softmax - one-hot, in the compute dtype"),
        ]])
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
    attention = sum(n * 2 * arch.num_attention_heads * (d_qk + d_v)
                    * attended_keys(seq_len, arch.sliding_window if windowed else None)
                    for (_, windowed), n in arch.variant_counts().items())
    n = matmul_parameters(arch)
    if training:
        return 6 * n + 3 * attention
    head = arch.vocab_size * arch.hidden_size
    return 2 * (n - head) + attention + 2 * head / seq_len


# --- the configuration's shared context ------------------------------------------------------------

def _context(cfg: Resolved) -> tuple[_Context, list[str]]:
    training, par, gpu = cfg.training, cfg.parallel, cfg.gpu
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
    weight = (bytes_per_element(training.param_dtype) if not fp8 else 1.0) if training.mode == "inference" else mm_in
    T = tokens_per_gpu(training, par)
    ctx = _Context(
        B=bytes_per_element(compute), mm_in=mm_in, weight=weight, grad=bytes_per_element(cfg.recipe.grad_dtype),
        mm_peak=mm_peak, peak=peak, bandwidth=gpu.memory_bandwidth, training=cfg.is_training,
        T=T, T_sp=T / par.tp if par.sequence_parallel else T, t=par.tp, gpu=gpu, framework=training.framework,
        fused=fused_kernels(training), frozen=_frozen_scopes(training))
    return ctx, notes


def _frozen_scopes(training: Training) -> frozenset:
    """An adapter run freezes every layer's weights, and the head unless it is trained."""
    if training.adapter is None:
        return frozenset()
    return frozenset({"layer"} | (set() if training.adapter.trainable_embeddings else {"head"}))


# --- the work of each pipeline stage -----------------------------------------------------------------

Variant = tuple[str, bool]  # (layer kind, sliding window), as Architecture.variant_counts names them


def _time(ops, roof: bool) -> float:
    """Seconds of these operations (once each): at the roof, or as expected."""
    return sum(op.time_s if roof else op.expected_time_s for op in ops)


def variant_operations(ctx: _Context, cfg: Resolved) -> dict[Variant, tuple[list[Operation], list[Operation]]]:
    """(forward, backward) operations of one layer of each variant the model has, count 1."""
    arch = cfg.architecture
    return {v: layer_operations(ctx, arch, cfg.training, cfg.parallel, v[0], arch.sliding_window if v[1] else None, 1)
            for v in arch.variant_counts()}


@dataclass(frozen=True)
class OperationTable:
    """What one micro-batch runs, whatever the pipeline split, DP, ZeRO stage or recompute: the
    shared context, one layer of each variant, the embedding and the head (count 1), the seconds
    of each list at the roof and as expected, and the model FLOPs per token (for MFU). Built once
    per `_table_key` and remembered on the architecture, so a layout search and an app rerun
    read it back."""

    ctx: _Context
    notes: tuple[str, ...]
    variants: dict[Variant, tuple[list[Operation], list[Operation]]]
    ends: tuple[list[Operation], list[Operation], list[Operation]]  # embedding, head forward, head backward
    seconds: dict[tuple, float]  # (variant, "embedding" or "head"; "forward", "backward" or "attention"; roof)
    timed: dict[tuple, tuple[tuple[Operation, float], ...]]  # (variant, roof): its forward operations and seconds
    flops_per_token: float


# Fields that only the step reads (recompute, the batch, the pipeline split, DP, ZeRO, overlap): the
# operations of a micro-batch are the same whatever their values. Every other field is in the key.
_STEP_TRAINING_FIELDS = {"recompute", "recompute_layers", "recompute_every", "recompute_modules", "global_batch_size"}
_STEP_PARALLEL_FIELDS = {"pp", "vpp", "pp_first_stage_layers", "pp_last_stage_layers", "dp", "zero_stage",
                         "world_size", "comm_overlap", "pp_schedule", "pp_account_for_embedding", "pp_account_for_loss",
                         "pp_layout"}
_TABLE_FIELDS = tuple((section, tuple(f.name for f in dataclasses.fields(section) if f.name not in step))
                      for section, step in ((Training, _STEP_TRAINING_FIELDS), (Parallel, _STEP_PARALLEL_FIELDS)))


def _table_key(cfg: Resolved) -> tuple:
    (_, training), (_, parallel) = _TABLE_FIELDS
    return ("roofline operations", cfg.hardware, tuple(map(vars(cfg.training).get, training)),
            tuple(map(vars(cfg.parallel).get, parallel)))


def operation_table(cfg: Resolved) -> OperationTable:
    """The configuration's `OperationTable` (remembered on its architecture)."""
    return cfg.architecture.cached(_table_key(cfg), lambda: _operation_table(cfg))


def _operation_table(cfg: Resolved) -> OperationTable:
    arch, training, par = cfg.architecture, cfg.training, cfg.parallel
    ctx, notes = _context(cfg)
    variants = variant_operations(ctx, cfg)
    embed = embedding_operations(ctx, arch, 1)
    head_forward, head_backward = head_operations(ctx, arch, training, par, cfg.padded_vocab, 1)
    seconds: dict[tuple, float] = {}
    timed = {(v, roof): tuple((op, op.time_s if roof else op.expected_time_s) for op in variants[v][0])
             for v in variants for roof in (False, True)}
    for roof in (False, True):
        for v, (forward, backward) in variants.items():
            seconds[v, "forward", roof] = _time(forward, roof)
            seconds[v, "backward", roof] = _time(backward, roof)
            seconds[v, "attention", roof] = _time([op for op in forward + backward if op.kind == "attention"], roof)
        for phase in ("forward", "backward"):
            seconds["embedding", phase, roof] = _time([op for op in embed if op.phase == phase], roof)
        seconds["head", "forward", roof] = _time(head_forward, roof)
        seconds["head", "backward", roof] = _time(head_backward, roof)
    return OperationTable(ctx, tuple(notes), variants, (embed, head_forward, head_backward), seconds, timed,
                          _flops_per_token(cfg))


def _flops_per_token(cfg: Resolved) -> float:
    """`model_flops_per_token`; an adapter run skips dW of the frozen weights: the matmuls' 6N becomes
    4N (+ the adapters' own 6 r (in + out)), so MFU counts the work the step does (adapters.py)."""
    arch, training = cfg.architecture, cfg.training
    flops_per_token = model_flops_per_token(arch, training.seq_len, cfg.is_training)
    if training.adapter and cfg.is_training:
        from .adapters import adapter_count
        head = arch.vocab_size * arch.hidden_size if training.adapter.trainable_embeddings else 0
        adapters = adapter_count(training.adapter, arch)
        flops_per_token -= 2 * (matmul_parameters(arch) - head) - 6 * adapters
    return flops_per_token


def stage_variants(cfg: Resolved, rank: int) -> dict[Variant, int]:
    """Layers of each variant on a pipeline rank (over its virtual chunks)."""
    counts: dict[Variant, int] = {}
    for chunk in cfg.stages[rank].chunks:
        for v, n in cfg.architecture.variant_counts(chunk.start, chunk.stop).items():
            counts[v] = counts.get(v, 0) + n
    return counts


def rank_variants(cfg: Resolved) -> tuple[dict[Variant, int], ...]:
    """`stage_variants` of every rank. They depend on the pipeline split alone, so they are
    remembered on the architecture by `sharding.split_key`, as the split itself is."""
    return cfg.architecture.cached(("rank variants",) + split_key(cfg.parallel),
                                   lambda: tuple(stage_variants(cfg, r) for r in range(cfg.parallel.pp)))


@dataclass(frozen=True)
class StageWork:
    """One micro-batch on one pipeline rank: its operations' seconds, at the roof or as expected."""

    rank: int
    counts: dict[Variant, int]
    forward_s: float  # layer forwards, plus the embedding (first rank) and the head's forward (last rank)
    backward_s: float
    recompute_s: float
    recompute_fraction: float  # share of the rank's layers full recompute re-runs (their TP collectives too)

    @property
    def layers(self) -> int:
        return sum(self.counts.values())

    @property
    def per_microbatch_s(self) -> float:
        return self.forward_s + self.backward_s + self.recompute_s


def recompute_time(cfg: Resolved, counts: dict[Variant, int], table: OperationTable,
                   roof: bool) -> tuple[float, float]:
    """(seconds per micro-batch, share of layers fully recomputed). Full recompute re-runs the
    forward of each recomputed layer (Korthikanti et al. 2022, section 5); selective re-runs the
    forward operations of the modules the memory model drops (activations.recomputed_modules:
    the core attention by default, Korthikanti section 6)."""
    tr = cfg.training
    if not cfg.is_training or tr.recompute == "none" or not counts:
        return 0.0, 0.0
    if tr.recompute == "full":
        layers = sum(counts.values())
        fraction = recomputed_layer_count(tr, layers) / layers  # the memory model's rule (activations.py)
        return fraction * sum(n * table.seconds[v, "forward", roof] for v, n in counts.items()), fraction
    return sum(n * selective_recompute_s(tr, cfg.architecture, table.timed[v, roof]) for v, n in counts.items()), 0.0


def selective_recompute_s(tr: Training, arch: Architecture, timed) -> float:
    """Seconds selective recompute adds to these forward operations, given as (operation, its
    seconds) pairs: those of the modules the memory model drops (activations.recomputed_modules),
    or, under torchtitan's operator-level policy, every elementwise operation and its even
    matmuls' share of the matmuls (activations.op_level_gemms), never the attention kernel."""
    if op_level(tr):
        share = op_level_recomputed_matmul_share(arch)
        return sum(seconds * (1.0 if op.kind == "elementwise" else share)
                   for op, seconds in timed if op.kind in ("elementwise", "matmul"))
    modules = recomputed_modules(tr)
    return sum(seconds for op, seconds in timed if modules.intersection(op.modules))


def stage_work(cfg: Resolved, rank: int, table: OperationTable, roof: bool) -> StageWork:
    counts, sp, seconds = rank_variants(cfg)[rank], cfg.stages[rank], table.seconds
    forward = sum(n * seconds[v, "forward", roof] for v, n in counts.items())
    backward = sum(n * seconds[v, "backward", roof] for v, n in counts.items())
    if sp.first:  # rank 0; under DualPipe also rank p - 1 (sharding.rank_virtual_stages)
        forward += seconds["embedding", "forward", roof]
        backward += seconds["embedding", "backward", roof]
    if sp.last:  # rank p - 1; DualPipe also rank 0, DualPipeV rank 0 only
        forward += seconds["head", "forward", roof]
        backward += seconds["head", "backward", roof]
    recompute, fraction = recompute_time(cfg, counts, table, roof)
    return StageWork(rank, counts, forward, backward, recompute, fraction)


def rank_twins(cfg: Resolved) -> tuple[int, ...]:
    """For each rank, the first rank with the same layers of each variant and the same ends (the
    middle ranks of a pipeline are alike): its work is the same. By split, on the architecture."""
    def twins() -> tuple[int, ...]:
        first: dict[tuple, int] = {}
        return tuple(first.setdefault((tuple(counts.items()), sp.first, sp.last), rank)
                     for rank, (counts, sp) in enumerate(zip(rank_variants(cfg), cfg.stages)))
    return cfg.architecture.cached(("rank twins",) + split_key(cfg.parallel), twins)


def stage_works(cfg: Resolved, table: OperationTable, roof: bool) -> list[StageWork]:
    """The work of every rank, computed once for each set of twins (`rank_twins`): a rank's entry is
    its first twin's, so the first rank of the slowest is where `max` finds it."""
    twins = rank_twins(cfg)
    done = {rank: stage_work(cfg, rank, table, roof) for rank in dict.fromkeys(twins)}
    return [done[twin] for twin in twins]


def layer_forward(cfg: Resolved, work: StageWork, table: OperationTable) -> tuple[tuple[Operation, int], ...]:
    """The rank's layer forward operations in running order, each with its count per step."""
    m = cfg.microbatches
    return tuple((op, work.counts[v] * m) for v in sorted(work.counts) for op in table.variants[v][0])


def stage_operations(cfg: Resolved, work: StageWork, table: OperationTable) -> list[Operation]:
    """The operations of a rank with their counts per step, in running order."""
    m = cfg.microbatches
    embed, head_fwd, head_bwd = table.ends
    order = sorted(work.counts)
    ops: list[Operation] = []
    first, last = cfg.stages[work.rank].first, cfg.stages[work.rank].last
    if first:
        ops += [dataclasses.replace(op, count=m) for op in embed if op.phase == "forward"]
    ops += [dataclasses.replace(op, count=n) for op, n in layer_forward(cfg, work, table)]
    if last:
        ops += [dataclasses.replace(op, count=m) for op in head_fwd + head_bwd]
    for v in reversed(order):
        ops += [dataclasses.replace(op, count=work.counts[v] * m) for op in table.variants[v][1]]
    if first:
        ops += [dataclasses.replace(op, count=m) for op in embed if op.phase == "backward"]
    return ops


# --- communication -----------------------------------------------------------------------------------

def _link(gpu: GPU, size: int, stride: int) -> tuple[str, float]:
    return collectives.link_of(gpu, size, stride)


def _ring(n: int, all_reduce: bool = False) -> float:
    return collectives.ring_factor(n, all_reduce)


def _collective(gpu: GPU, roof: bool, name: str, group: str, size: int, stride: int, wire_bytes: float,
                calls: float, formula: str, all_reduce: bool = False) -> Communication | None:
    """A collective of the step, exposed in full until an overlap rule says otherwise. At the roof
    it runs at the link's line rate with no latency; as expected, at nccl-tests' bus bandwidth
    plus a latency per call (collectives.py)."""
    if size <= 1 or wire_bytes <= 0:
        return None
    link, line = _link(gpu, size, stride)
    bandwidth = line if roof else collectives.bus_bandwidth(gpu, link, all_reduce)
    time = wire_bytes / bandwidth + (0.0 if roof else calls * collectives.LATENCY_S[link])
    return Communication(name, group, size, link, bandwidth, wire_bytes, time, time, formula, line, calls)


def _passes(cfg: Resolved, work: StageWork) -> float:
    """Passes over a layer per micro-batch whose collectives run: forward, backward (training) and
    the recomputed forward."""
    return (2.0 if cfg.is_training else 1.0) + work.recompute_fraction


def tensor_parallel(cfg: Resolved, ctx: _Context, work: StageWork, roof: bool) -> list[Communication]:
    """TP: 2 all-reduces per layer forward and 2 backward (Shoeybi et al. 2019, section 3), or with
    sequence parallelism 2 all-gathers + 2 reduce-scatters moving the same bytes (Korthikanti
    section 4.2.2); each of s*b*h*B bytes with the ring factor 2(t-1)/t. Full recompute repeats
    the forward's. Exposed: the next GEMM needs the result (TP comm overlap / async TP not modelled)."""
    par, m, h = cfg.parallel, cfg.microbatches, cfg.architecture.hidden_size
    passes = _passes(cfg, work)
    wire = 2 * passes * _ring(par.tp, all_reduce=True) * ctx.T * h * ctx.B * work.layers * m
    c = _collective(ctx.gpu, roof, "tensor-parallel all-reduce (or all-gather + reduce-scatter)", "TP", par.tp, 1,
                    wire, 2 * passes * work.layers * m, "2 per layer per direction x 2(t-1)/t x s*b*h*B x layers x m",
                    all_reduce=not par.sequence_parallel)
    return [c] if c else []


def context_parallel(cfg: Resolved, ctx: _Context, work: StageWork, table: OperationTable,
                     roof: bool) -> list[Communication]:
    """CP: ring attention passes each rank's K/V chunk around the ring, cp - 1 hops; backward passes
    K/V and their gradients. Overlapped with the attention core of the chunk in hand
    (Megatron-Core context parallelism docs), so only the excess over that compute is exposed."""
    par, m = cfg.parallel, cfg.microbatches
    if par.cp <= 1:
        return []
    d_qk, d_v, kv_heads = _attention_widths(cfg.architecture)
    directions = 2 if cfg.is_training else 1
    kv = ctx.T * kv_heads / par.tp * (d_qk + d_v) * ctx.B
    per_layer = (par.cp - 1) * kv * (1 + 2 * (directions - 1))
    attention = sum(n * table.seconds[v, "attention", roof] for v, n in work.counts.items()) * m
    c = _collective(ctx.gpu, roof, "context-parallel ring exchange of K and V", "CP", par.cp, par.tp,
                    per_layer * work.layers * m, (par.cp - 1) * directions * work.layers * m,
                    "(cp-1) x s*b*g*(d_k + d_v)/t*B per layer forward, x2 more in backward (K/V and their gradients)")
    return [c._replace(exposed_s=max(0.0, c.time_s - attention))] if c else []


def expert_parallel(cfg: Resolved, ctx: _Context, work: StageWork, roof: bool) -> list[Communication]:
    """EP: an all-to-all dispatches the k routed copies of each token and another combines them,
    forward and backward (Megatron-Core alltoall token dispatcher); (ep-1)/ep of them leave the
    GPU. Exposed: the experts wait for their tokens (no overlap modelled)."""
    arch, par, m = cfg.architecture, cfg.parallel, cfg.microbatches
    moe_layers = sum(n for (kind, _), n in work.counts.items() if kind == "moe")
    if not moe_layers or par.ep <= 1:
        return []
    passes = _passes(cfg, work)
    k, phi = arch.num_experts_per_token, cfg.training.moe_capacity_factor
    per_layer = 2 * passes * (par.ep - 1) / par.ep * k * phi * ctx.T_sp * arch.hidden_size * ctx.B
    c = _collective(ctx.gpu, roof, "expert-parallel all-to-all (dispatch and combine)", "EP", par.ep, par.etp,
                    per_layer * moe_layers * m, 2 * passes * moe_layers * m,
                    "2 per MoE layer per direction x (ep-1)/ep x k*phi*s*b*h/t*B")
    return [c] if c else []


def pipeline_parallel(cfg: Resolved, ctx: _Context, roof: bool) -> list[Communication]:
    """PP: each micro-batch sends its activations (s*b*h*B, /t with Megatron's scatter-gather over
    TP) to the next stage and its gradient back, once per virtual chunk."""
    par, m = cfg.parallel, cfg.microbatches
    if par.pp <= 1:
        return []
    directions = 2 if cfg.is_training else 1
    hop = ctx.T * cfg.architecture.hidden_size * ctx.B / (par.tp if par.sequence_parallel else 1)
    c = _collective(ctx.gpu, roof, "pipeline send/receive of activations", "PP", par.pp, par.gpus_per_stage,
                    directions * par.vpp * hop * m, directions * par.vpp * m,
                    "directions x v x s*b*h*B (/t with sequence parallelism) x m")
    return [c] if c else []


# Gradient buckets, in parameters: Megatron-Core DDP max(40M, 1M x DP) (distributed_data_parallel_config
# bucket_size); DeepSpeed reduce_bucket_size 5e8 elements (ZeRO config default; the timing keeps it whatever
# training.reduce_bucket_size says: the memory model reads that field, transients.deepspeed_settings); PyTorch
# DDP 25 MiB (bucket_cap_mb) of gradient bytes.
def _bucket_params(framework: str, n: int, grad_bytes: float) -> float:
    if framework == "megatron":
        return max(40e6, 1e6 * n)
    if framework == "deepspeed":
        return 5e8
    return 25 * 2**20 / grad_bytes


def _sharded_per_unit(cfg: Resolved, zero: int) -> bool:
    """Gathers and reduce-scatters run unit by unit (one layer) in every micro-batch: FSDP2 with
    sharded gradients, and ZeRO-3 in any framework."""
    return zero == 3 or (zero == 2 and cfg.training.framework in FSDP_FRAMEWORKS)


def data_parallel(cfg: Resolved, ctx: _Context, work: StageWork, roof: bool) -> list[Communication]:
    """DP / ZeRO / FSDP traffic of the stage (training only), exposed as each framework overlaps it.

    Gradients are reduced once per step (accumulated over micro-batches: DDP's no_sync, Megatron,
    DeepSpeed ZeRO-1/2) by an all-reduce (ZeRO 0) or a reduce-scatter; ZeRO-1/2 all-gather the
    updated parameters once; ZeRO-3 and FSDP2 gather each layer before its forward and again before
    its backward and reduce-scatter its gradient, in every micro-batch (Rajbhandari et al. 2020,
    section 7: 1.5x the all-reduce volume per micro-batch); FSDP2 shard-grad-op gathers for the
    forward only. Overlap (`collectives.OVERLAP_SOURCES`):

    - bucketed gradient reduction hides behind the last micro-batch's backward but its last bucket;
    - Megatron's parameter all-gather hides behind the next forward but its first bucket; DeepSpeed
      ZeRO-1/2 gathers after the step, exposed;
    - per-unit gathers (FSDP2, ZeRO-3) prefetch one unit: the first waits (FSDP2's root unit,
      embedding and head, gathered at the start of forward), then each shows only where it is
      longer than the unit before's compute; in backward the gather and the reduce-scatter share
      the link, and the last reduce-scatter waits.

    `parallel.comm_overlap` scales what these rules hide (1: all of it, 0: none)."""
    if not cfg.is_training:
        return []
    tr, par, gpu, m, zero = cfg.training, cfg.parallel, ctx.gpu, cfg.microbatches, cfg.zero_stage
    sp = cfg.stages[work.rank]
    G, P = bytes_per_element(cfg.recipe.grad_dtype), bytes_per_element(cfg.recipe.param_dtype)
    if tr.framework in FSDP_FRAMEWORKS:
        P = ctx.B  # fully_shard gathers the bf16 compute copy (MixedPrecisionPolicy)
    per_unit = _sharded_per_unit(cfg, zero)
    layers = max(1, work.layers)
    out: list[Communication] = []
    for label, group, n, stride, params in (
            ("", "DP", par.dp * par.cp, par.tp, sp.dense_local),
            ("expert ", "expert DP", max(1, par.expert_data_parallel), par.ep * par.etp, sp.expert_local)):
        if n <= 1 or not params:
            continue
        buckets = params / _bucket_params(tr.framework, n, G)
        if zero == 0:
            grad = _collective(gpu, roof, f"{label}gradient all-reduce", group, n, stride, _ring(n, True) * params * G,
                               buckets, "2(n-1)/n x params x grad bytes, once per step", all_reduce=True)
            out.append(_bucketed(grad, work.backward_s + work.recompute_s, buckets, par, roof))
            continue
        reductions = m if per_unit else 1
        grad = _collective(gpu, roof, f"{label}gradient reduce-scatter", group, n, stride,
                           reductions * _ring(n) * params * G, reductions * (layers if per_unit else buckets),
                           "(n-1)/n x params x grad bytes" + (", every micro-batch" if per_unit else ", once per step"))
        gathers = (2 * m if zero == 3 else m) if per_unit else 1
        gathered = _gathered_bytes(tr, P, sp, params) if label == "" else P
        gather = _collective(gpu, roof, f"{label}parameter all-gather", group, n, stride,
                             gathers * _ring(n) * params * gathered, gathers * (layers if per_unit else buckets),
                             f"{gathers} x (n-1)/n x params x param bytes" + (
                                 " (forward and backward, every micro-batch)" if zero == 3 else "")
                             + (" (float8 linear weights at 1 B)" if gathered != P else ""))
        if per_unit:
            root = sp.root_local * P * _ring(n) if tr.framework in FSDP_FRAMEWORKS and label == "" else 0.0
            out += _per_unit(grad, gather, work, zero == 3, root, par, roof)
        else:
            out.append(_bucketed(grad, work.backward_s + work.recompute_s, buckets, par, roof))
            exposed_gather = tr.framework == "deepspeed"  # all_gather_dp_groups after the step
            out.append(gather if exposed_gather else _bucketed(gather, work.forward_s, buckets, par, roof))
    return out


def _overlapped(c: Communication, raw_exposed: float, par: Parallel, unhideable_s: float) -> Communication:
    """`parallel.comm_overlap` of what the overlap rule hides stays hidden; at most what is exposed
    of `unhideable_s` is exposed whatever the compute."""
    hidden = (c.time_s - raw_exposed) * par.comm_overlap
    exposed = c.time_s - hidden
    return c._replace(exposed_s=exposed, unhideable_s=min(exposed, unhideable_s))


def _bucketed(c: Communication, compute: float, buckets: float, par: Parallel, roof: bool) -> Communication:
    if roof:
        return c  # the roof hides traffic behind whatever compute is left (hide_behind_compute)
    return _overlapped(c, collectives.bucketed_exposure(c.time_s, compute, buckets), par,
                       c.time_s / max(1.0, buckets))


def _gathered_bytes(training: Training, P: float, sp, params: float) -> float:
    """Bytes per dense parameter FSDP2 gathers: with fp8_all_gather torchao gathers the float8 linears'
    weights at 1 byte (states.fsdp2_gathered_block_bytes), the root unit (embedding, head) at P."""
    if not training.fp8_all_gather or params <= 0:
        return P
    block, _ = fsdp2_gathered_block_bytes(training, P, sp)
    root = min(sp.root_local, params)
    return (block * (params - root) + P * root) / params


def _per_unit(grad: Communication, gather: Communication, work: StageWork, zero3: bool, root_bytes: float,
              par: Parallel, roof: bool) -> list[Communication]:
    """Exposure of FSDP2 / ZeRO-3 traffic, unit (layer) by unit, in each micro-batch (see
    `data_parallel`); split between the gather and the reduce-scatter in proportion to their time."""
    if roof:
        return [grad, gather]
    layers = max(1, work.layers)
    gather_passes = 2 if zero3 else 1
    m_gathers = max(1.0, gather.calls / layers / gather_passes)  # micro-batches
    ag_unit = (gather.time_s / m_gathers / gather_passes) / layers
    rs_unit = grad.time_s / m_gathers / layers
    root = root_bytes / gather.bandwidth if root_bytes else 0.0
    forward = collectives.pipelined_exposure(ag_unit, work.forward_s / layers, layers, first=root + ag_unit)
    backward_comm = rs_unit + (ag_unit if zero3 else 0.0)
    backward = collectives.pipelined_exposure(backward_comm, (work.backward_s + work.recompute_s) / layers, layers)
    backward += rs_unit  # the first layer's reduce-scatter has no compute after it
    total = m_gathers * (forward + backward)
    floor = m_gathers * (root + ag_unit + (ag_unit if zero3 else 0.0) + 2 * rs_unit)  # whatever the compute
    share = gather.time_s / (gather.time_s + grad.time_s)
    out = []
    for c, part in ((gather, share), (grad, 1 - share)):
        out.append(_overlapped(c, min(c.time_s, total * part), par, floor * part))
    return out


def hide_behind_compute(comms: list[Communication], groups: tuple[str, ...], budget: float,
                        overlap: float) -> list[Communication]:
    """`overlap` of the time of these groups' traffic hides behind compute, never more than the
    compute there is (the roof's overlap rule; the expected step's for pipeline sends)."""
    out = []
    for c in comms:
        if c.group in groups:
            hidden = min(overlap * c.exposed_s, budget)
            budget -= hidden
            c = c._replace(exposed_s=c.exposed_s - hidden)
        out.append(c)
    return out


def communication(cfg: Resolved, table: OperationTable, work: StageWork, roof: bool) -> list[Communication]:
    """Every collective of the stage per step, with the part compute does not hide."""
    ctx = table.ctx
    comms = (tensor_parallel(cfg, ctx, work, roof) + context_parallel(cfg, ctx, work, table, roof)
             + expert_parallel(cfg, ctx, work, roof) + data_parallel(cfg, ctx, work, roof)
             + pipeline_parallel(cfg, ctx, roof))
    ideal = cfg.microbatches * (work.per_microbatch_s)
    hidden_groups = ("DP", "expert DP", "PP") if roof else ("PP",)
    if not roof:  # the DP rules above already used the compute they hide behind
        ideal -= sum(c.time_s - c.exposed_s for c in comms if c.group in ("DP", "expert DP"))
    return hide_behind_compute(comms, hidden_groups, max(0.0, ideal), cfg.parallel.comm_overlap)


# --- the optimizer update ------------------------------------------------------------------------------

def optimizer_time(cfg: Resolved, rank: int, roof: bool) -> float:
    """Memory-bound, over the parameters this GPU updates (ZeRO >= 1 shards them): the update
    reads and writes the gradient once, the master copy and the parameter, and every optimizer
    state (states.optimizer_state_bytes, from the optimizer's record); as expected, at achieved
    bandwidth (kernels.BANDWIDTH_EFFICIENCY)."""
    if not cfg.is_training:
        return 0.0
    recipe, par, sp = cfg.recipe, cfg.parallel, cfg.stages[rank]
    per_param = (bytes_per_element(recipe.grad_dtype) + (8 if recipe.master_weights else 0)
                 + 2 * bytes_per_element(recipe.param_dtype))
    traffic = [n * per_param + 2 * optimizer_state_bytes(sp.total, cfg.training.optimizer, recipe.optimizer_dtype,
                                                         experts) for n, experts in
               ((sp.dense_local, False), (sp.expert_local, True))]
    if cfg.zero_stage >= 1:
        traffic = [traffic[0] / (par.dp * par.cp), traffic[1] / max(1, par.expert_data_parallel)]
    bandwidth = cfg.gpu.memory_bandwidth * (1.0 if roof else kernels.BANDWIDTH_EFFICIENCY)
    return sum(traffic) / bandwidth


# --- the step ----------------------------------------------------------------------------------------

def roofline_config(cfg) -> Roofline:
    """The roofline of a loaded `config.Config`."""
    return roofline(cfg.architecture, cfg.training, cfg.parallel, cfg.hardware)


@dataclass(frozen=True)
class _StepTimes:
    compute_s: float
    recompute_s: float
    bubble_s: float
    optimizer_s: float
    communication: tuple[Communication, ...]

    @property
    def exposed_comm_s(self) -> float:
        return sum(c.exposed_s for c in self.communication)

    @property
    def time_s(self) -> float:
        return self.compute_s + self.recompute_s + self.bubble_s + self.exposed_comm_s + self.optimizer_s


def step_times(cfg: Resolved, table: OperationTable, work: StageWork, roof: bool) -> _StepTimes:
    """step time = compute                 the operations' times x micro-batches
                 + recompute               full: each recomputed layer's forward again; selective: the
                                           recomputed modules' forward (Korthikanti et al. 2022)
                 + bubble                  per schedule, `pipeline_bubble_s` (1F1B: (p - 1) / (v m) x
                                           (compute + recompute), Narayanan 2021)
                 + exposed communication   TP and EP in full; CP beyond the attention core; DP/FSDP as
                                           each framework overlaps it; PP behind the compute left
                 + optimizer update        memory-bound: read and write states, master, gradient"""
    par, m = cfg.parallel, cfg.microbatches
    compute = m * (work.forward_s + work.backward_s)
    recompute = m * work.recompute_s
    bubble = pipeline_bubble_s(par, work)
    comms = communication(cfg, table, work, roof)
    return _StepTimes(compute, recompute, bubble, optimizer_time(cfg, work.rank, roof), tuple(comms))


def per_chunk_config(cfg: Resolved) -> Resolved:
    """The configuration a rank's work is timed with: under DualPipe each rank runs each of its two
    stages on half the micro-batches (one direction's; deepseek-ai/DualPipe step() scatters the
    batch into num_chunks / 2 per direction), so its chunks' work counts m / 2 times."""
    if cfg.parallel.schedule != "dualpipe":
        return cfg
    return dataclasses.replace(cfg, microbatches=cfg.microbatches // 2)


def pipeline_bubble_s(par: Parallel, work: StageWork) -> float:
    """The pipeline bubble per step, from one micro-batch's forward F, backward B and recompute R on
    the rank (R runs inside the backward). The weight-gradient pass W is half of B (its GEMMs are
    half the backward's, Narayanan et al. 2021). deepseek-ai/DualPipe README, per chunk:
    1F1B (p - 1)(F + B), interleaved / v (Narayanan 2021); ZB-H1 (p - 1)(F + B - 2W) = (p - 1)(F + R)
    (Qi et al. 2023: a third of 1F1B's when F = B/2 = W); DualPipe and DualPipeV (PP/2 - 1)(F&B + B - 3W),
    F&B = F + B (two chunks overlap communication, not compute), over PP stages of half a rank's
    layers: PP = p under DualPipe, 2p under DualPipeV."""
    f, b, r, p = work.forward_s, work.backward_s, work.recompute_s, par.pp
    schedule = par.schedule
    if schedule == "zero_bubble":
        return (p - 1) * (f + r)
    if schedule in ("dualpipe", "dualpipev"):
        stages = p if schedule == "dualpipe" else 2 * p
        f, b, r = f / 2, b / 2, r / 2  # one chunk of the rank's two
        return max(0, stages // 2 - 1) * ((f + b + r) + (b + r) - 3 * b / 2)
    return (p - 1) / par.vpp * (f + b + r)


def roofline(arch: Architecture, training: Training | None = None, par: Parallel | None = None,
             hardware: Hardware | None = None) -> Roofline:
    """Operations of the slowest pipeline stage and the time of one step (training: forward,
    backward and optimizer over every micro-batch; inference: one forward prefill of the batch),
    as expected (`step`) and at the roofs (`step.upper_bound`); see `step_times` for the terms."""
    training = training or Training()
    par = par or Parallel()
    hardware = hardware or Hardware()
    if training.rl:  # the trainer's update on prompt + response sequences (rl.py); generation is not timed
        from .rl import trainer_training
        resolve(arch, training, par, hardware)  # the RL fields' own checks
        rl_notes = (f"RL ({training.rl.algorithm}): the time of the trainer's update step on "
                    f"{training.rl.sequence_len:,}-token sequences; the rollout's generation and the scoring "
                    "passes are not timed",)
        result = roofline(arch, trainer_training(training), par, hardware)
        return dataclasses.replace(result, notes=tuple(result.notes) + rl_notes)
    cfg, m, table, expected, slowest, times = _expected(arch, training, par, hardware)
    roofs = stage_works(cfg, table, roof=True)
    at_roof = step_times(cfg, table, max(roofs, key=lambda w: w.per_microbatch_s), roof=True)
    return Roofline(mode=training.mode, gpu=table.ctx.gpu.id, stage=slowest,
                    stage_times_s=tuple(cfg.microbatches * w.per_microbatch_s for w in expected),
                    operations=tuple(stage_operations(cfg, expected[slowest], table)),
                    step=_step(cfg, m, table, times, at_roof), notes=table.notes + tuple(_notes(cfg, slowest)))


class Timing(NamedTuple):
    """The expected step of a layout without its operation list or its upper bound (`expected_step`)."""

    step: Step  # `roofline(...).step` with upper_bound None
    stage: int  # the slowest pipeline rank
    layer_forward: tuple[tuple[Operation, int], ...]  # its layer forward operations, each with its count per step


def expected_step(arch: Architecture, training: Training | None = None, par: Parallel | None = None,
                  hardware: Hardware | None = None) -> Timing:
    """`roofline`'s expected step by the same code, for a search over layouts: it skips the step at
    the roofs and the copies of the operations with their counts."""
    training = training or Training()
    par = par or Parallel()
    hardware = hardware or Hardware()
    if training.rl:
        from .rl import trainer_training
        resolve(arch, training, par, hardware)  # the RL fields' own checks
        return expected_step(arch, trainer_training(training), par, hardware)
    cfg, m, table, expected, slowest, times = _expected(arch, training, par, hardware)
    return Timing(_step(cfg, m, table, times, None), slowest, layer_forward(cfg, expected[slowest], table))


def _expected(arch: Architecture, training: Training, par: Parallel, hardware: Hardware):
    """(the configuration as a rank's work is timed, its micro-batches, its operation table, every
    rank's expected work, the slowest rank, that rank's step times as expected)."""
    # the memory model's rules and resolution; the FP8 recipe is modelled here, so its memory-side
    # refusal is skipped (the recipe and the ZeRO stage do not depend on it; FP8 weights belong to it)
    checked = training if not training.fp8 else training_with(
        arch, training, fp8=False, fp8_all_gather=False,  # the float8 all-gather needs fp8: timed here too
        param_dtype="bf16" if training.param_dtype == "fp8" else training.param_dtype)
    cfg = resolve(arch, checked, par, hardware)
    if training.fp8 or not cfg.is_training:
        cfg = dataclasses.replace(cfg, training=training, zero_stage=cfg.zero_stage if cfg.is_training else 0)
    table = operation_table(cfg)
    m, cfg = cfg.microbatches, per_chunk_config(cfg)
    expected = stage_works(cfg, table, roof=False)
    slowest = max(range(par.pp), key=lambda r: expected[r].per_microbatch_s)
    return cfg, m, table, expected, slowest, step_times(cfg, table, expected[slowest], roof=False)


def _step(cfg: Resolved, m: int, table: OperationTable, times: _StepTimes, at_roof: _StepTimes | None) -> Step:
    tokens_per_step = cfg.global_batch_size * cfg.training.seq_len
    gpus, peak = cfg.parallel.gpus, table.ctx.peak

    def throughput(time_s: float) -> tuple[float, float]:
        tokens = tokens_per_step / time_s / gpus
        return tokens, tokens * table.flops_per_token / peak

    tokens, mfu = throughput(times.time_s)
    return Step(
        time_s=times.time_s, tokens_per_s_per_gpu=tokens, mfu=mfu,
        bubble_fraction=times.bubble_s / (times.compute_s + times.recompute_s) if times.compute_s else 0.0,
        exposed_comm_s=times.exposed_comm_s, compute_s=times.compute_s, recompute_s=times.recompute_s,
        bubble_s=times.bubble_s, optimizer_s=times.optimizer_s, microbatches=m, tokens_per_step=tokens_per_step,
        model_flops_per_token=table.flops_per_token, mfu_peak_flops=peak, communication=times.communication,
        upper_bound=None if at_roof is None else Bound(at_roof.time_s, *throughput(at_roof.time_s)))


def _notes(cfg: Resolved, slowest: int) -> list[str]:
    notes = [
        f"stage {slowest} shown: the slowest pipeline stage, which sets the step time",
        "expected times: GEMMs at the measured maximum achievable matmul FLOPS less small-shape losses, flash "
        f"attention at its measured TFLOP/s ({kernels.attention_kernel(cfg.gpu, cfg.training.framework)} kernel), "
        "memory-bound kernels at 90% of bandwidth"
        + ("" if fused_kernels(cfg.training) else " with the extra passes of eager (unfused) norms, rotary and "
                                                  "activations") + "; the roof time of each is its upper bound",
        "MFU: PaLM appendix B's 6N + 12*L*H*Q*T per token with the attention term halved for the causal mask, "
        "N = matmul weights a token passes through (top-k experts) including the LM head, without the "
        "embedding; against the compute dtype's peak (bf16 also under fp8)",
        f"communication at nccl-tests bus bandwidths; overlap {cfg.parallel.comm_overlap:g} of what each framework "
        "hides (DP/FSDP: buckets and one-unit prefetch; PP behind the compute left); TP and EP collectives are "
        "exposed (on the critical path between dependent GEMMs); CP hides behind the attention core",
        "left out: biases, dropout, MTP modules, the embedding's TP all-reduce, compute slowed by concurrent "
        "communication kernels",
    ]
    if not cfg.is_training:
        notes.append("inference: one prefill of seq_len tokens per sequence, forward only, no optimizer; "
                     "the LM head runs on the last token of each sequence; time_s covers the global batch")
    return notes


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
    lines = [f"Step time on {result.gpu} ({result.mode}), pipeline stage {result.stage} "
             f"(the slowest); one execution = one layer, one micro-batch, one GPU; 'roof ms' at the hardware's "
             f"roofs, 'ms each' as the kernels achieve it (estimator/kernels.py)"]
    header = (f"  {'operation':<52}{'phase':<10}{'FLOPs':>12}{'bytes':>12}{'FLOP/B':>9}{'ridge':>7}"
              f"  {'bound':<8}{'roof ms':>9}{'ms each':>9}{'achieved':>9}{'count':>7}{'ms total':>10}")
    scope = None
    for op in result.operations:
        if op.scope != scope:
            scope = op.scope
            lines += ["", f"{scope}:", header]
        lines.append(f"  {op.name[:51]:<52}{op.phase:<10}{_si(op.flops):>12}{_si(op.bytes, 'B'):>12}"
                     f"{op.arithmetic_intensity:>9.1f}{op.ridge_point:>7.0f}  {op.bound:<8}{_ms(op.time_s):>9}"
                     f"{_ms(op.expected_time_s):>9}{op.achieved_fraction:>9.0%}{op.count:>7}"
                     f"{_ms(op.total_expected_s):>10}")
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
        f"Upper bound (every operation at its roof): {step.upper_bound.time_s:.4f} s, "
        f"{step.upper_bound.tokens_per_s_per_gpu:,.0f} tokens/s per GPU, MFU {step.upper_bound.mfu:.1%}",
        "",
    ]
    lines += [f"Note: {n}" for n in result.notes]
    return "\n".join(lines)
