"""One operation of the step and its roofline: FLOPs, bytes moved, the bound it hits; the GEMM and
elementwise builders and the context they share.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from functools import cached_property

from . import collectives, fp8, kernels
from ..memory.activations.entries import fused_kernels, tokens_per_gpu
from ..spec.dtypes import bytes_per_element
from ..spec.gpus import GPU
from ..memory.resolved import Resolved
from ..spec.training import Training

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


SOURCES = (ROOFLINE, PALM, NARAYANAN, FLASH2, KORTHIKANTI, RING, collectives.NCCL_TESTS, collectives.RING_NICS,
           collectives.ALL_TO_ALL, *collectives.OVERLAP_SOURCES,
           *kernels.SOURCES, *fp8.SOURCES)


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
    source: str = ""  # the kernel's implementation where it is not the default one (Liger-Kernel's Triton kernels)

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

    # the two times are read again and again (a planner's search sums an operation table's operations
    # for every layout it times): worked out once per operation, kept on it (the fields are frozen)
    @cached_property
    def time_s(self) -> float:
        """Time at the roof: max(flops / peak, bytes / bandwidth)."""
        return max(self.flops / self.peak_flops, self.bytes / self.bandwidth)

    @property
    def total_time_s(self) -> float:
        return self.time_s * self.count

    @cached_property
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
            "bandwidth": self.bandwidth, "formula": self.formula, "modules": list(self.modules), "source": self.source,
        }


@dataclass(frozen=True)
class Bound:
    """The step at the roofs: every operation at its roof, every link at its line rate, all
    overlappable traffic hidden behind compute: what no run of this layout can beat."""

    time_s: float
    tokens_per_s_per_gpu: float
    mfu: float

    def to_json(self) -> dict:
        return dataclasses.asdict(self)


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
    # how norms, rotary and gated activations run (kernels.traffic): "eager" PyTorch ops, "fused" (TransformerEngine's
    # kernels or torch.compile's) or "liger" (Liger-Kernel's Triton kernels)
    elementwise: str
    eager_code: str  # whose eager model code runs them (kernels.eager_code); "" under Megatron (always fused)
    frozen: frozenset = frozenset()  # scopes whose weights are frozen (an adapter run): no weight gradient
    # FP8 training's casts (fp8.py): (bytes per element, kernels) of casting an input or an output gradient, and of
    # a weight in each micro-batch (0 under TE, which casts once per step); None where the GEMMs are not FP8
    fp8_activation_cast: tuple[float, int] | None = None
    fp8_weight_cast: tuple[float, int] | None = None


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
                         modules, kernels.gemm_efficiency(ctx.gpu, *shape, fp8=ctx.mm_peak > ctx.peak),
                         kernels.BANDWIDTH_EFFICIENCY)

    fwd = op(name, "forward", M * K * ctx.mm_in + W * ctx.weight + M * N * ctx.B, (rows, K, N),
             formula or f"2*M*K*N, M={M:g} K={K:g} N={N:g}")
    if not ctx.training:
        return [fwd]
    casts = _fp8_casts(ctx, scope, name, M * K, M * N, W, count, modules)
    if scope in ctx.frozen or ("layer" in scope and "layer" in ctx.frozen):
        # a frozen weight gets no gradient: dW is not computed (adapters.py)
        return [fwd, op(f"{name} (input gradient)", "backward", M * N * ctx.mm_in + W * ctx.mm_in + M * K * ctx.B,
                        (rows, N, K), "dX = dY W^T: 2*M*K*N (frozen weight: no dW)")] + casts
    dgrad = op(f"{name} (input gradient)", "backward", M * N * ctx.mm_in + W * ctx.mm_in + M * K * ctx.B,
               (rows, N, K), "dX = dY W^T: 2*M*K*N")
    wgrad = op(f"{name} (weight gradient)", "backward", M * K * ctx.mm_in + M * N * ctx.mm_in + W * ctx.grad,
               (K, rows, N), "dW = X^T dY: 2*M*K*N")
    return [fwd, dgrad, wgrad] + casts


def _fp8_casts(ctx: _Context, scope: str, name: str, inputs: float, output_grads: float, weights: float, count: int,
               modules: tuple[str, ...]) -> list[Operation]:
    """The memory-bound casts of an FP8 linear layer (fp8.py): its input in forward, its output
    gradient in backward and, under torchao, its weight (counted in forward: its forward and backward
    casts together)."""
    if ctx.fp8_activation_cast is None:
        return []
    source = fp8.TE_SOURCE if ctx.framework == "megatron" else fp8.TORCHAO_SOURCE

    def cast(role, phase, elements, per_element, launches):
        return Operation(f"{name}: fp8 cast of the {role}", phase, scope, "elementwise", elements,
                         elements * per_element, ctx.peak, ctx.bandwidth, count,
                         f"{per_element:g} bytes per element read and written ({source})", modules, 1.0,
                         kernels.BANDWIDTH_EFFICIENCY, 1.0, launches)

    per_element, launches = ctx.fp8_activation_cast
    ops = [cast("input", "forward", inputs, per_element, launches),
           cast("output gradient", "backward", output_grads, per_element, launches)]
    per_element, launches = ctx.fp8_weight_cast
    if per_element:
        ops.append(cast("weight", "forward", weights, per_element, launches))
    return ops


def bf16_matmuls(ctx: _Context) -> _Context:
    """The context of a matmul that FP8 training leaves in bf16: the LM head (torchtitan's float8
    converter skips the `output` linear, torchtitan/float8.py module_filter_fn at 9dec370; Megatron-Core's
    output_layer is a tensor_parallel.ColumnParallelLinear, not a TransformerEngine module, unless MXFP8
    output projection is asked for) and the MoE router (Megatron-Core's TopKRouter: a plain matmul)."""
    if ctx.fp8_activation_cast is None:
        return ctx
    return dataclasses.replace(ctx, mm_peak=ctx.peak, mm_in=ctx.B, weight=ctx.B, fp8_activation_cast=None,
                               fp8_weight_cast=None)


def _elementwise(ctx: _Context, scope: str, name: str, elements_in: float, elements_out: float,
                 flops_per_element: float, count: int, formula: str, modules: tuple[str, ...] = (),
                 group: str = "") -> list[Operation]:
    """A memory-bound kernel. Its backward reads the output gradient and the saved input and
    writes the input gradient: (out + 2*in) elements. `group` ("norm", "layernorm", "rope", "activation", "gelu")
    names the eager op sequence it runs as without fused kernels (kernels.EAGER_TRAFFIC), and the Liger kernel
    that replaces it (kernels.LIGER_TRAFFIC)."""
    liger = ctx.elementwise == "liger" and group in kernels.LIGER_TRAFFIC[kernels.LIGER_RELEASE]

    def op(label, phase, flops, moved):
        passes, launches = kernels.traffic(group, ctx.elementwise, phase, ctx.eager_code)
        fewer = passes < 1  # a kernel that moves less than the fused one (Liger's rotary backward): its bytes are its own
        moved, passes = (moved * passes, 1.0) if fewer else (moved, passes)
        text = formula + (f"; Liger's Triton {group} kernel ({launches} launch{'es' if launches > 1 else ''}"
                          f"{', in place on the gradient: no saved input read' if fewer else ''})" if liger else "")
        return Operation(label, phase, scope, "elementwise", flops, moved, ctx.peak, ctx.bandwidth, count, text,
                         modules, 1.0, kernels.BANDWIDTH_EFFICIENCY, passes, launches,
                         kernels.LIGER_SOURCE if liger else "")

    fwd = op(name, "forward", flops_per_element * elements_in, (elements_in + elements_out) * ctx.B)
    if not ctx.training:
        return [fwd]
    return [fwd, op(f"{name} (backward)", "backward", 2 * flops_per_element * elements_in,
                    (elements_out + 2 * elements_in) * ctx.B)]


def _tagged(ops: list[Operation], *modules: str) -> list[Operation]:
    """The operations marked as part of these selective-recompute modules."""
    return [dataclasses.replace(op, modules=modules) for op in ops]


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
            notes.append("fp8: every linear layer's GEMMs (forward and backward) at the fp8 peak and its measured "
                         "FP8 matmul efficiency, with 1-byte inputs and weights and the casts that make them "
                         f"({training.fp8_recipe}); the LM head, the router, attention, norms and the loss in bf16")
    weight = (bytes_per_element(training.param_dtype) if not fp8 else 1.0) if training.mode == "inference" else mm_in
    casts = _fp8_cast_bytes(cfg) if mm_peak > peak and cfg.is_training else (None, None)
    T = tokens_per_gpu(training, par)
    ctx = _Context(
        B=bytes_per_element(compute), mm_in=mm_in, weight=weight, grad=bytes_per_element(cfg.recipe.grad_dtype),
        mm_peak=mm_peak, peak=peak, bandwidth=gpu.memory_bandwidth, training=cfg.is_training,
        T=T, T_sp=T / par.tp if par.sequence_parallel else T, t=par.tp, gpu=gpu, framework=training.framework,
        elementwise=elementwise_kernels(training),
        eager_code=kernels.eager_code(training.framework, training.framework_version)
        if training.framework in kernels.EAGER_CODE else "", frozen=_frozen_scopes(training), fp8_activation_cast=casts[0],
        fp8_weight_cast=casts[1])
    return ctx, notes


def _fp8_cast_bytes(cfg: Resolved) -> tuple[tuple[float, int], tuple[float, int]]:
    """(activation cast, weight cast per micro-batch) of an FP8 training run (fp8.py). A weight cast
    under torchao with float8 all-gather covers the local shard only (torchao casts the FSDP2 shard
    before gathering it); TE casts once per step (optimizer_time)."""
    training, par = cfg.training, cfg.parallel
    activation = fp8.activation_cast(training.framework, training.fp8_recipe, training.compile)
    if training.framework == "megatron":
        return activation, (0.0, 0)
    per_element, launches = fp8.weight_cast(training.framework, training.fp8_recipe)
    shards = par.dp * par.cp if training.fp8_all_gather else 1
    return activation, (per_element / shards, launches)


def speed_fused(training: Training) -> bool:
    """Whether norms, rotary embeddings and gated activations run as one kernel each (one read of the
    input, one write of the output): TransformerEngine's fused kernels under Megatron, and
    torch.compile's, whose Inductor fuses each chain of pointwise ops and its reduction into one
    generated kernel (torch/_inductor/scheduler.py fuses nodes that share reads; torchtitan, torchtune
    and the HF Trainer compile each transformer block) where eager PyTorch runs each op as its own kernel
    (kernels.EAGER_TRAFFIC)."""
    return fused_kernels(training) or training.compile


def elementwise_kernels(training: Training) -> str:
    """How norms, rotary embeddings and gated activations run (kernels.traffic): "fused" (`speed_fused`),
    "liger" where Liger-Kernel patched the model (training.liger_kernel; memory/liger.py refuses it with compile
    and outside the Trainer's frameworks), else "eager"."""
    if speed_fused(training):
        return "fused"
    return "liger" if training.liger_kernel else "eager"


def _frozen_scopes(training: Training) -> frozenset:
    """An adapter run freezes every layer's weights, and the head unless it is trained."""
    if training.adapter is None:
        return frozenset()
    return frozenset({"layer"} | (set() if training.adapter.trainable_embeddings else {"head"}))
