"""The planner's request, its answer, and the layouts it walks: shapes (TP, PP, CP, EP, ZeRO), their
pipeline splits and micro-batch counts.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field
from typing import Iterator, NamedTuple

from ..memory.pipeline import interleaved_microbatches_error
from ..spec.architecture import Architecture
from ..spec.hardware import Hardware
from ..memory.result import TIGHT_FRACTION
from ..spec.parallel import Parallel
from ..spec.training import Training
from .stacks import Stack, stack as stack_of

LOSSES = ("standard", "fused", "chunked")
MIN_CP_TOKENS = 1024  # below this per GPU the ring exchange has nothing to hide behind
MAX_MICROBATCH_TOKENS = 131072  # more tokens a micro-batch than torchtitan's 16 x 8,192 are not what runs use


# --- inputs and results ----------------------------------------------------------------------------

@dataclass(frozen=True)
class Request:
    """What to plan: a model and its training setup on `gpus` GPUs of type `hardware.gpu`."""

    architecture: Architecture
    training: Training
    hardware: Hardware
    gpus: int
    gpus_per_node: int = 8
    margin: float = TIGHT_FRACTION  # largest share of the GPU's memory a layout may use
    comm_overlap: float = 1.0  # parallel.comm_overlap of every layout (roofline)
    limit: int = 50  # fastest fitting layouts returned (plus the Pareto front)
    pareto: bool = True  # also find the memory/throughput front (False: the fastest `limit` only, much sooner)
    fixed: tuple[tuple[str, int | None], ...] = ()  # parallel fields held at a value, e.g. (("tp", 8),)
    max_gpus: int = 16384  # how far the no-fit answer looks

    @functools.cached_property
    def stack(self) -> Stack:
        """The layouts the framework runs (stacks.py), resolved once for the whole search."""
        return stack_of(self.training)

    def within(self, device_bytes: float) -> bool:
        """The estimator's verdict rule (memory.fit_on) with this margin: utilization <= margin."""
        return device_bytes / self._capacity <= self.margin

    @functools.cached_property
    def _capacity(self) -> int:
        return self.hardware.device.capacity_bytes


@dataclass(frozen=True)
class Layout:
    """One fitting layout with its numbers, each from a full `estimate()` and `roofline()` (the estimate with
    the flat share of allocator cache the search judges by, `estimate(..., replay=False)`)."""

    parallel: Parallel
    training: Training
    device_total_bytes: int  # the peak stage's
    peak_stage: int
    utilization: float
    step_time_s: float
    tokens_per_s_per_gpu: float
    mfu: float
    pareto: bool = False

    def changes(self) -> dict:
        """The fields the planner chose: applied to the input config they give this layout."""
        par, tr = self.parallel, self.training
        parallel = {k: getattr(par, k) for k in ("tp", "pp", "vpp", "cp", "dp", "ep", "etp", "zero_stage")}
        parallel["sequence_parallel"] = par.sequence_parallel
        for k in ("pp_first_stage_layers", "pp_last_stage_layers"):
            if getattr(par, k) is not None:
                parallel[k] = getattr(par, k)
        training = {"micro_batch_size": tr.micro_batch_size, "recompute": tr.recompute, "loss": tr.loss}
        if tr.recompute == "full":
            training["recompute_layers"] = tr.recompute_layers
        if tr.recompute == "selective":
            training["recompute_modules"] = list(tr.recompute_modules)
        return {"parallel": parallel, "training": training}

    def to_json(self) -> dict:
        return {**self.changes(), "device_total_bytes": self.device_total_bytes, "peak_stage": self.peak_stage,
                "utilization": round(self.utilization, 6), "step_time_s": self.step_time_s,
                "tokens_per_s_per_gpu": self.tokens_per_s_per_gpu, "mfu": self.mfu, "pareto": self.pareto}


@dataclass(frozen=True)
class Plan:
    request: Request
    layouts: tuple[Layout, ...]  # fitting: the `limit` fastest and the Pareto front, fastest first
    searched: int  # valid layouts judged, by a full estimate or an exact rule
    estimates: int  # full estimates run
    rooflines: int  # full rooflines run
    seconds: float
    pruned: dict = field(default_factory=dict)  # layouts judged by each rule, without their own estimate
    smallest_fit: dict | None = None  # no layout fits: GPU id -> the fewest GPUs that fit (None: not within max_gpus)
    # a search its watch halted (watch.Watch: a request to stop, its time budget): why, in words;
    # the layouts it did not judge, and a speed none of them exceeds (None: not bounded)
    stopped: str | None = None
    not_searched: int = 0
    not_searched_ceiling: float | None = None

    @property
    def pareto(self) -> tuple[Layout, ...]:
        return tuple(x for x in self.layouts if x.pareto)

    def to_json(self) -> dict:
        out = {"layouts": [x.to_json() for x in self.layouts], "searched": self.searched,
               "seconds": self.seconds, "estimates": self.estimates, "rooflines": self.rooflines,
               "pruned": dict(self.pruned)}
        if self.smallest_fit is not None:
            out["smallest_fit"] = self.smallest_fit
        if self.stopped:
            out.update(stopped=self.stopped, not_searched=self.not_searched,
                       not_searched_ceiling=self.not_searched_ceiling, note=self.note())
        return out

    def note(self) -> str:
        """What a halted search left out, in one sentence ("" when it ran to its end)."""
        if not self.stopped:
            return ""
        total = self.searched + self.not_searched
        if not self.not_searched and not self.layouts:
            return (f"Every layout was judged and none fits; the search for the fewest GPUs that fit stopped at "
                    f"{self.stopped}: the counts given are those it found before.")
        text = (f"The search stopped at {self.stopped} after {self.searched:,} of {total:,} layouts: "
                f"{self.not_searched:,} not searched")
        if self.not_searched and self.not_searched_ceiling is not None:
            text += f", none of which runs faster than {self.not_searched_ceiling:,.0f} tokens/s per GPU (a bound)"
        elif self.not_searched:
            text += " (it stopped before their speeds were bounded)"
        return text + "; the layouts listed are the best of those searched."


# --- the space -------------------------------------------------------------------------------------

class Shape(NamedTuple):
    """A layout's split of the model over the GPUs (the parallel fields the planner sets)."""

    tp: int
    pp: int
    vpp: int
    first: int | None  # pp_first_stage_layers
    last: int | None  # pp_last_stage_layers
    cp: int
    dp: int
    ep: int
    etp: int
    zero: int


class Variant(NamedTuple):
    """The training knobs on top of a shape."""

    micro_batch: int
    recompute: str  # "none", "selective", "full"
    layers: int | None  # full recompute: layers per stage; None = all of them
    loss: str


def divisors(n: int) -> list[int]:
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    return small + [n // d for d in reversed(small) if d * d != n]


def _tp_ok(arch: Architecture, tp: int) -> bool:
    """Megatron-Core's divide() asserts (validation.py): heads, KV heads, MLP width."""
    if arch.num_attention_heads % tp or (not arch.uses_mla and arch.num_kv_heads % tp):
        return False
    return not (arch.intermediate_size and arch.num_dense_layers and arch.intermediate_size % tp)


def pipeline_splits(layers: int, pp: int) -> list[tuple[int, int | None, int | None]]:
    """(vpp, first, last) for PP stages: an even split with every VPP dividing a stage's layers;
    else (the count needs it) middle stages of ceil(L / PP) layers and first + last sharing the
    rest, each at least VPP and at most a middle stage (Megatron's --decoder-first/last-pipeline-
    num-layers; VPP must divide the middle stages)."""
    if pp == 1:
        return [(1, None, None)]
    if layers % pp == 0:
        return [(v, None, None) for v in divisors(layers // pp)]
    if pp == 2:
        a = -(-layers // 2)
        return [(1, x, layers - x) for x in (a, layers - a)]
    mid = -(-layers // pp)
    rest = layers - mid * (pp - 2)
    out = []
    for v in divisors(mid):
        out += [(v, a, rest - a) for a in range(v, mid + 1) if v <= rest - a <= mid]
    return out


def _cp_ok(training: Training, tp: int, cp: int) -> bool:
    seq = training.seq_len
    if cp > 1 and (seq % (2 * cp) or training.attention != "flash" or seq // cp < MIN_CP_TOKENS):
        return False
    return tp == 1 or (seq // cp) % tp == 0  # sequence parallelism splits each CP chunk over TP


def _expert_splits(arch: Architecture, tp: int, per_stage: int, splits_experts: bool = True) -> list[tuple[int, int]]:
    """EP dividing the experts and, with expert TP, the GPUs of a stage; expert TP = TP (Megatron-
    Core's default) or 1 (the usual choice for fine-grained experts, as DeepSeek-V3 runs).
    `splits_experts`: the framework runs EP (stacks.py)."""
    if not arch.is_moe or not splits_experts:
        return [(1, tp)]
    return [(ep, etp) for etp in sorted({1, tp}) if arch.moe_intermediate_size % etp == 0
            for ep in divisors(arch.num_experts) if per_stage % (ep * etp) == 0]


def _zero_stages(st: Stack, framework: str, shards: bool) -> tuple[int, ...]:
    """The ZeRO stages the framework runs (stacks.py); above 0 only with a group to shard over."""
    # FSDP1: its default FULL_SHARD is searched; its other strategies (fsdp_sharding_strategy) are estimated only
    return st.zero_stages if shards or framework == "fsdp1" else (0,)


# Shape fields by the name of the parallel field they set
FIXABLE = {"tp": "tp", "pp": "pp", "vpp": "vpp", "pp_first_stage_layers": "first", "pp_last_stage_layers": "last",
           "cp": "cp", "dp": "dp", "ep": "ep", "etp": "etp", "zero_stage": "zero"}


def shapes(req: Request) -> Iterator[Shape]:
    """Every valid shape, those with the request's fixed fields only."""
    fixed = [(FIXABLE[name], value) for name, value in req.fixed]
    return (s for s in _all_shapes(req) if all(getattr(s, f) == value for f, value in fixed))


def _all_shapes(req: Request) -> Iterator[Shape]:
    arch, tr, n, st = req.architecture, req.training, req.gpus, req.stack
    gbs = tr.global_batch_size
    split = _splits(st)
    for tp in (t for t in split("tp", divisors(req.gpus_per_node)) if n % t == 0 and _tp_ok(arch, t)):
        for pp in (p for p in split("pp", divisors(n // tp)) if p <= arch.num_layers):
            for v, first, last in _pipeline_splits(st, arch.num_layers, pp):
                for cp in (c for c in split("cp", divisors(n // (tp * pp))) if _cp_ok(tr, tp, c)):
                    dp = n // (tp * pp * cp)
                    if gbs is not None and gbs % dp:
                        continue
                    for ep, etp in _expert_splits(arch, tp, tp * cp * dp, "ep" in st.splits):
                        shards = dp * cp > 1 or tp * cp * dp // (ep * etp) > 1
                        for zero in _zero_stages(st, tr.framework, shards):
                            shape = Shape(tp, pp, v, first, last, cp, dp, ep, etp, zero)
                            if shape_micro_batches(tr, shape):  # a micro-batch the schedule runs
                                yield shape


def _splits(st: Stack):
    """The sizes of a split the framework runs (stacks.py): all of them, or 1 where it has no such split."""
    return lambda name, sizes: sizes if name in st.splits else [1]


def _pipeline_splits(st: Stack, layers: int, pp: int) -> list[tuple[int, int | None, int | None]]:
    return [x for x in pipeline_splits(layers, pp) if x[0] == 1 or st.interleaved]


def micro_batches(training: Training, dp: int) -> tuple[int, ...]:
    """Powers of two up to 128k tokens a micro-batch (torchtitan runs 16 x 8,192) that divide the
    global batch per DP rank."""
    per_rank = training.global_batch_size // dp if training.global_batch_size else None
    out, b = [], 1
    while b == 1 or b * training.seq_len <= MAX_MICROBATCH_TOKENS:
        if per_rank is None or per_rank % b == 0:
            out.append(b)
        b *= 2
        if per_rank is not None and b > per_rank:
            break
    return tuple(out)


def shape_micro_batches(training: Training, s: Shape) -> tuple[int, ...]:
    """`micro_batches` that the shape's pipeline schedule runs: Megatron's interleaved schedule
    refuses micro-batch counts that leave a group short (activations.interleaved_microbatches_error)."""
    micro = micro_batches(training, s.dp)
    if training.framework != "megatron" or s.vpp == 1 or training.global_batch_size is None:
        return micro
    group = training.microbatch_group_size or s.pp
    return tuple(b for b in micro if not interleaved_microbatches_error(
        s.pp, training.global_batch_size // (b * s.dp), group))


def most_stage_layers(arch: Architecture, s: Shape) -> int:
    return max(stage_layer_counts(arch, s))


def stage_layer_counts(arch: Architecture, s: Shape) -> tuple[int, ...]:
    """Layers on each pipeline rank (sharding.layers_per_stage): an even split, or the first and
    last given and the middle ranks sharing the rest."""
    if s.first is None:
        return (arch.num_layers // s.pp,) * s.pp
    middle = (arch.num_layers - s.first - s.last) // (s.pp - 2) if s.pp > 2 else 0
    return (s.first,) + (middle,) * (s.pp - 2) + (s.last,)


def variants_per_micro_batch(st: Stack, arch: Architecture, s: Shape) -> int:
    """The framework's losses x its recompute settings (none, selective and full on 1 ... most layers of a
    stage where it runs them: stacks.py)."""
    most = most_stage_layers(arch, s)
    return len(st.losses) * sum(st.settings(m, most) for m in ("none", "selective", "full"))
