"""The planner: every valid parallel layout of a model on N GPUs, which of them fit, which are fastest.

Given a model, a training setup (sequence, global batch, precision, optimizer, framework), a GPU
and a number of GPUs, `plan` enumerates the layouts and the memory knobs around them:

- TP within a node (divisors of the GPUs per node that divide the heads, KV heads and MLP width),
  always with sequence parallelism;
- PP, with VPP (interleaving), and uneven first/last stages when the layer count needs them: the
  middle stages take ceil(L / PP) layers and the two end stages share the rest (Llama 3 405B's
  126 layers on PP 16 are 7 + 8 x 14 + 7, Grattafiori et al. 2024, section 3.3.2);
- CP (ring attention over flash kernels, at least 1,024 tokens per GPU), and DP = N / (TP PP CP);
- EP (dividing the experts) and expert TP (1 or TP) for MoE models;
- the ZeRO stage each framework runs (`parallel.py`; `states.resolve_zero_stage`): Megatron and
  DeepSpeed 0-3, FSDP2 0/2/3, the HF Trainer 0; above 0 only where there is a group to shard over;
- recompute: none, selective, or full on n = 1 ... (the most layers of a stage) layers per stage;
- micro-batch: powers of two dividing the global batch per DP rank, at most 128k tokens each;
- loss: standard, fused, chunked.

It returns the `limit` fastest layouts that fit (utilization at most `margin`, the estimator's
"fits" verdict by default) and the memory-versus-throughput Pareto front of all fitting layouts,
each with its numbers from a full `estimate()` and `roofline()`; when none fits, the smallest power
of two of these GPUs, and of every catalog GPU, at which some layout fits.

Speed: a full estimate of a layout not seen before costs about 110 us (Llama-3.1-405B on 16
stages; bench/bench_estimate.py) and the roofline's step about as much (`roofline.expected_step`:
the roofline's numbers without its operation list, over operation tables shared by every layout
with the same TP, CP, EP and micro-batch), so the search judges most layouts without either, by
exact rules, each checked against brute force on random small cases (tests/test_planner.py). Memory, from the estimator's phases (memory.py):

1. states floor: a stage's peak is at least its optimizer-step phase (model states, gradients,
   optimizer temporaries), which no recompute, micro-batch or loss changes, so when it is over
   the budget no variant of the shape fits. It depends on the split only: cached by (TP, PP, VPP,
   split, EP, ETP, ZeRO, CP > 1) (DP x CP is N / (TP PP) for all of them); it falls with the ZeRO
   stage, and with EP from 2 up (experts spread wider, their sharded states over the same GPUs).
2. recompute: selective keeps a subset of what none keeps (Megatron's modules; not torchtitan's
   operator-level policy under fsdp2, whose none is bounded on its own); full recompute of more
   layers keeps less; so the least memory of a mode is its most frugal setting.
3. micro-batch: no setting needs less memory with a larger micro-batch, but where one micro-batch
   and no pipeline leave gradients unallocated in forward (non-Megatron frameworks); that one is
   treated apart. With rule 2: full recompute of n layers over the budget at one micro-batch is
   over it, for every n' <= n, at every larger one (judged without an estimate).

Speed, from the roofline's step (roofline.py):

4. ceilings: one roofline without recompute bounds every recompute setting of its shape and
   micro-batch from above (`Speeds`), and with the smallest bubble every micro-batch.
5. dominance: ZeRO 0 under Megatron or DeepSpeed with DP x CP > 1 loses to ZeRO 1 on both counts;
   the standard loss to the fused one (it keeps more and moves more bytes; under Megatron the native
   fused cross-entropy holds 4 B per logit more than standard at backward's start, its compiled
   backward's fp32 copy of the softmax, so there standard is set aside for its speed alone, and a
   layout that fits only with it is not offered); fused and chunked
   losses run at the same speed, so the one that needs more memory loses; full recompute of more
   layers is never faster.

A set of layouts is skipped whole when its ceiling is below the current top list and a layout
already found needs no more memory than its floor at no less speed: nothing in it can enter the
answer. The ceilings of rule 4 are bounds over every stage and can be twice a layout's speed, so
the search tightens them with exact speeds where one roofline settles many layouts: at a shape
and micro-batch, the speed without recompute caps every recompute setting (rule 4), and, where the
ceilings are that loose (an MoE model's expert traffic), a range of full recompute settings
n = lo ... hi - 1 is capped by the exact speed of n = lo, its fastest (rule 5), found before the
range's memory is estimated. Every layout enumerated is judged, by its own estimate (its device
total, `memory.device_total`) or by these rules; `Plan.searched` counts them, `Plan.estimates` and
`Plan.rooflines` the full evaluations, `Plan.pruned` the rules. A `Watch` (estimator/watch.py)
follows a search and may halt it between shapes: the plan then lists the best of what it searched.
"""

from __future__ import annotations

import bisect
import dataclasses
import functools
import gc
import heapq
import json
import math
import time
from collections import Counter
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Iterator, NamedTuple

from .pipeline import interleaved_filling_microbatches, interleaved_microbatches_error
from .act_recompute import op_level
from .architecture import Architecture
from .errors import ConfigError
from .gpus import GPUS
from .hardware import Hardware
from .result import TIGHT_FRACTION, Estimate
from .memory import device_total, estimate, step_floors
from .parallel import Parallel
from .roofline import Timing, expected_step, selective_recompute_s
from .training import Training
from .watch import Progress, Watch

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

    def within(self, device_bytes: float) -> bool:
        """The estimator's verdict rule (memory.fit_on) with this margin: utilization <= margin."""
        return device_bytes / self._capacity <= self.margin

    @functools.cached_property
    def _capacity(self) -> int:
        return self.hardware.device.capacity_bytes


@dataclass(frozen=True)
class Layout:
    """One fitting layout with its numbers, each from a full `estimate()` and `roofline()`."""

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


def _expert_splits(arch: Architecture, tp: int, per_stage: int) -> list[tuple[int, int]]:
    """EP dividing the experts and, with expert TP, the GPUs of a stage; expert TP = TP (Megatron-
    Core's default) or 1 (the usual choice for fine-grained experts, as DeepSeek-V3 runs)."""
    if not arch.is_moe:
        return [(1, tp)]
    return [(ep, etp) for etp in sorted({1, tp}) if arch.moe_intermediate_size % etp == 0
            for ep in divisors(arch.num_experts) if per_stage % (ep * etp) == 0]


def _zero_stages(framework: str, shards: bool) -> tuple[int, ...]:
    """The ZeRO stages each framework runs (parallel.py); above 0 only with a group to shard over."""
    stages = {"megatron": (0, 1, 2, 3), "deepspeed": (0, 1, 2, 3), "fsdp2": (0, 2, 3), "hf": (0,),
              "torchtune": (0, 2, 3), "fsdp1": (3,)}[framework]
    return stages if shards or framework == "fsdp1" else (0,)  # FSDP1 is modelled FULL_SHARD only (fsdp1.py)


# Shape fields by the name of the parallel field they set
FIXABLE = {"tp": "tp", "pp": "pp", "vpp": "vpp", "pp_first_stage_layers": "first", "pp_last_stage_layers": "last",
           "cp": "cp", "dp": "dp", "ep": "ep", "etp": "etp", "zero_stage": "zero"}


def shapes(req: Request) -> Iterator[Shape]:
    """Every valid shape, those with the request's fixed fields only."""
    fixed = [(FIXABLE[name], value) for name, value in req.fixed]
    return (s for s in _all_shapes(req) if all(getattr(s, f) == value for f, value in fixed))


def _all_shapes(req: Request) -> Iterator[Shape]:
    arch, tr, n = req.architecture, req.training, req.gpus
    gbs = tr.global_batch_size
    for tp in (t for t in divisors(req.gpus_per_node) if n % t == 0 and _tp_ok(arch, t)):
        for pp in (p for p in divisors(n // tp) if p <= arch.num_layers):
            for v, first, last in pipeline_splits(arch.num_layers, pp):
                for cp in (c for c in divisors(n // (tp * pp)) if _cp_ok(tr, tp, c)):
                    dp = n // (tp * pp * cp)
                    if gbs is not None and gbs % dp:
                        continue
                    for ep, etp in _expert_splits(arch, tp, tp * cp * dp):
                        shards = dp * cp > 1 or tp * cp * dp // (ep * etp) > 1
                        for zero in _zero_stages(tr.framework, shards):
                            shape = Shape(tp, pp, v, first, last, cp, dp, ep, etp, zero)
                            if shape_micro_batches(tr, shape):  # a micro-batch the schedule runs
                                yield shape


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


def variants_per_micro_batch(arch: Architecture, s: Shape) -> int:
    """3 losses x (none, selective and full on 1 ... most layers of a stage)."""
    return len(LOSSES) * (2 + most_stage_layers(arch, s))


# --- evaluation: full estimates and rooflines, remembered by what each depends on -----------------

class Point(NamedTuple):
    memory: int
    throughput: float


class _Evaluator:
    """Runs the estimator and the roofline's step (`expected_step`) for the search, each at most once
    per distinct input. A layout is judged by its device total (`memory.device_total`: the
    estimate's own number, without its stages' records); a full `estimate()` is run for the states
    floor (it reads the stages) and for the layouts returned."""

    def __init__(self, req: Request):
        self.req = req
        self.memory: dict[tuple, int | None] = {}  # device totals
        self.speed: dict[tuple, Timing] = {}
        self.floors: dict[tuple, int | None] = {}
        self.estimates = 0
        self.rooflines = 0
        self.judged: Counter = Counter()  # valid layouts estimated, by shape and by (shape, micro-batch)
        self.judged_layouts = 0  # valid layouts estimated, in all
        # (shape, micro-batch) -> the recompute_layers of each full recompute pair member estimated
        # (None: every layer), so the search counts what a pruned range already judged at once
        self.full_layers: dict[tuple[Shape, int], list[int | None]] = {}
        self.stage_params: dict[tuple, tuple[int, ...]] = {}  # parameters on one GPU of each stage
        self._parallels: dict[Shape, Parallel] = {}
        self._trainings: dict[Variant, Training] = {}

    def parallel(self, s: Shape) -> Parallel:
        # built once per shape: the dataclass checks every field on creation
        if s not in self._parallels:
            self._parallels[s] = Parallel(tp=s.tp, pp=s.pp, vpp=s.vpp, pp_first_stage_layers=s.first,
                                          pp_last_stage_layers=s.last, cp=s.cp, dp=s.dp, ep=s.ep, etp=s.etp,
                                          zero_stage=s.zero, comm_overlap=self.req.comm_overlap)
        return self._parallels[s]

    def training(self, v: Variant) -> Training:
        if v not in self._trainings:
            tr = self.req.training
            selective = v.recompute == "selective" and tr.recompute == "selective"
            self._trainings[v] = dataclasses.replace(
                tr, micro_batch_size=v.micro_batch, recompute=v.recompute, recompute_layers=v.layers, loss=v.loss,
                recompute_modules=tr.recompute_modules if selective else ("core_attn",))
        return self._trainings[v]

    def total(self, s: Shape, v: Variant) -> int | None:
        """The layout's device total (the peak stage's); None when the estimator refuses the layout."""
        key = (s, v)
        if key not in self.memory:
            try:
                total = device_total(self.req.architecture, self.training(v), self.parallel(s), self.req.hardware)
            except ConfigError:
                total = None
            self._record(key, total)
        return self.memory[key]

    def estimate(self, s: Shape, v: Variant) -> Estimate:
        """The full estimate of a layout judged to fit (the answer's records)."""
        return estimate(self.req.architecture, self.training(v), self.parallel(s), self.req.hardware)

    def _record(self, key: tuple, total: int | None) -> None:
        """A layout judged by its own estimate: its device total (None: refused), counted."""
        s, v = key
        self.memory[key] = total
        if total is not None:
            self.judged[s] += 1
            self.judged[s, v.micro_batch] += 1
            self.judged_layouts += 1
        self.estimates += 1
        if v.recompute == "full" and v.loss in ("fused", "chunked"):
            self.full_layers.setdefault((s, v.micro_batch), []).append(v.layers)

    def roofline(self, s: Shape, v: Variant) -> Timing:
        """The roofline's expected step (roofline.expected_step: its numbers without the operation list)."""
        # the roofline runs the fused and the chunked loss alike (roofline.head_operations), never
        # reads the recompute modules, and under Megatron and DeepSpeed ZeRO 2 gathers the
        # parameters once a step as ZeRO 1 does: one roofline serves both
        if s.zero == 2 and self.req.training.framework in ("megatron", "deepspeed"):
            s = s._replace(zero=1)
        key = (s, v._replace(loss="fused") if v.loss == "chunked" else v)
        if key not in self.speed:
            self.speed[key] = expected_step(self.req.architecture, self.training(v), self.parallel(s),
                                            self.req.hardware)
            self.rooflines += 1
        return self.speed[key]

    @staticmethod
    def floor_key(s: Shape) -> tuple:
        # DP x CP is N / (TP PP) for every shape of a key, and expert DP N / (PP EP ETP)
        return (s.tp, s.pp, s.vpp, s.first, s.last, s.ep, s.etp, s.zero, s.cp > 1)

    def floor(self, s: Shape) -> int | None:
        """The states floor of every variant of the shape (rule 1): its stages' most at their
        optimizer step (`memory.step_floors`, the static parts alone); None when the estimator
        refuses the shape."""
        key = self.floor_key(s)
        if key not in self.floors:
            try:
                floors = step_floors(self.req.architecture, self.training(Variant(1, "full", None, "fused")),
                                     self.parallel(s), self.req.hardware)
            except ConfigError:
                self.floors[key] = None
            else:
                self.floors[key] = max(f.device_bytes for f in floors)
                self.stage_params[key] = tuple(f.parameters_per_gpu for f in floors)
        return self.floors[key]

    def shape_speeds(self, s: Shape) -> Speeds:
        """Ceilings over every micro-batch of the shape (rule 4): those of the largest micro-batch
        (no GEMM is slower per token with a larger one; everything else per token is the same or
        falls with it) with the bubble of the most micro-batches."""
        micro = shape_micro_batches(self.req.training, s)
        speed = self.speeds(s, max(micro))
        most = self.microbatches(s, min(micro))
        return speed._replace(bubble=(s.pp - 1) / (s.vpp * most))

    def speeds(self, s: Shape, b: int) -> Speeds:
        return speeds(self.req, self.roofline(s, Variant(b, "none", None, "fused")), self.stage_layers(s),
                      self.stage_params[self.floor_key(s)])

    def microbatches(self, s: Shape, b: int) -> int:
        tr = self.req.training
        if tr.global_batch_size is None:  # the estimator's default fills the pipeline
            return 1 if s.pp == 1 else (s.pp if s.vpp == 1 else
                                        interleaved_filling_microbatches(s.pp, tr.microbatch_group_size or s.pp))
        return tr.global_batch_size // (b * s.dp)

    def stage_layers(self, s: Shape) -> tuple[int, ...]:
        return stage_layer_counts(self.req.architecture, s)


class Speeds(NamedTuple):
    """Ceilings on tokens/s per GPU of one shape and micro-batch, by recompute setting, from its
    roofline without recompute (rule 4).

    The roofline's expected step (roofline.py) is I (1 + bubble) + exposed DP and PP traffic (at
    least H - min(overlap H, I): each framework's overlap rule hides a unit's traffic behind no more
    than the compute there is) + exposed TP, EP, CP traffic + optimizer, where I = m max over stages
    (operations + recompute, expected times), H is the DP and PP traffic, and full recompute of n layers re-runs min(n, L_r) / L_r of stage
    r's layer forwards (and repeats their TP collectives), selective recompute their attention
    core. The step grows with I, H and each term, so taking for each a value no stage goes below
    gives a time no variant goes below: I from the roofline's own stage (the max is at least any
    stage), traffic and optimizer scaled to the stage with the fewest layers (TP, CP: per layer;
    EP: per MoE layer) or parameters (DP and the optimizer, dense models)."""

    tokens_per_step: int
    gpus: int
    compute_s: float  # the operations of every micro-batch, no recompute, on the roofline's stage
    forward_s: float  # its layers' forward operations (what full recompute repeats)
    attention_s: float  # what selective recompute repeats (the attention core; torchtitan's policy: more)
    layers: int  # on the roofline's stage
    fewest_layers: int  # on any stage
    bubble: float  # (p - 1) / (v m)
    overlap: float  # parallel.comm_overlap
    tp_per_layer_pass_s: float  # one TP pass of one layer for every micro-batch
    fixed_s: float  # EP and CP traffic and the optimizer no stage goes below
    hideable_s: float  # DP and PP traffic no stage goes below
    unhideable_s: float = 0.0  # DP traffic no compute hides (last buckets, first prefetch units), no stage below
    cap: float = math.inf  # the exact speed without recompute, where known: no recompute setting is faster

    def ceiling(self, recompute: str, n: int | None = None) -> float:
        again, tp_passes = 0.0, 2.0 * self.fewest_layers  # forward and backward, per layer
        if recompute == "selective":
            again = self.attention_s
        elif recompute == "full":
            again = self.forward_s * min(n or self.layers, self.layers) / self.layers
            tp_passes += min(n or self.fewest_layers, self.fewest_layers)
        ideal = self.compute_s + again
        exposed = max(self.hideable_s - min(self.overlap * self.hideable_s, ideal), self.unhideable_s)
        time_s = ideal * (1 + self.bubble) + exposed + tp_passes * self.tp_per_layer_pass_s + self.fixed_s
        return min(self.tokens_per_step / time_s / self.gpus, self.cap)


def speeds(req: Request, r: Timing, stage_layers: tuple[int, ...], stage_params: tuple[int, ...]) -> Speeds:
    step, arch = r.step, req.architecture
    # each layer forward operation's seconds per step (Operation.total_expected_s)
    layer_forward = [(op, op.expected_time_s * count) for op, count in r.layer_forward]
    # what selective recompute re-runs in the variants the search builds (_Evaluator.training), by
    # the roofline's own rule
    again_s = selective_recompute_s(_selective(req.training), arch, layer_forward)
    here, fewest = stage_layers[r.stage], min(stage_layers)
    per_layer = {"CP": 0.0 if arch.sliding_window else fewest / here,  # windows make attention uneven
                 "EP": max(0, fewest - (arch.num_layers - arch.num_moe_layers)) / here}
    # DP traffic and the update scale with the stage's parameters (for MoE dense and expert parts
    # scale apart, and only their sum is known: counted as 0)
    per_param = 0.0 if arch.is_moe else min(stage_params) / stage_params[r.stage] * (1 - 1e-9)
    traffic: dict[str, float] = {}
    for c in step.communication:
        traffic[c.group] = traffic.get(c.group, 0.0) + (c.time_s if c.group in ("DP", "expert DP", "PP")
                                                          else c.exposed_s)
    tp = traffic.get("TP", 0.0) / (2 * here)
    fixed = (traffic.get("CP", 0.0) * per_layer["CP"] + traffic.get("EP", 0.0) * per_layer["EP"]
             + step.optimizer_s * per_param)
    hideable = traffic.get("PP", 0.0) + (traffic.get("DP", 0.0) + traffic.get("expert DP", 0.0)) * per_param
    unhideable = sum(c.unhideable_s for c in step.communication if c.group in ("DP", "expert DP")) * per_param
    return Speeds(step.tokens_per_step, req.gpus, step.compute_s, sum(seconds for _, seconds in layer_forward),
                  again_s, here, fewest, step.bubble_fraction, req.comm_overlap, tp,
                  fixed, hideable, unhideable)


@functools.lru_cache(maxsize=64)
def _selective(training: Training) -> Training:
    """The search's selective recompute setting of a request (_Evaluator.training): the user's
    modules where the user asked for selective recompute, else the core attention (built once per
    request: a Training checks every field on creation)."""
    if training.recompute == "selective":
        return training
    return dataclasses.replace(training, recompute="selective", recompute_modules=("core_attn",))


# --- the answer so far: the fastest fitting layouts and the Pareto front --------------------------

class _Answer:
    """Fitting layouts found so far: a top-`limit` by throughput and the memory/throughput front."""

    def __init__(self, limit: int, pareto: bool = True):
        self.limit = limit
        self.pareto = pareto
        # min-heap of (throughput, -memory, order found, key): the order breaks ties, never the key
        self.top: list[tuple[float, int, int, tuple]] = []
        self.front: list[tuple[int, float, tuple]] = []  # (memory, throughput, key), memory ascending
        self.points: dict[tuple, Point] = {}

    def add(self, key: tuple, point: Point) -> None:
        if key in self.points:
            return
        self.points[key] = point
        entry = (point.throughput, -point.memory, -len(self.points), key)
        if len(self.top) < self.limit:
            heapq.heappush(self.top, entry)
        elif entry[:3] > self.top[0][:3]:
            heapq.heapreplace(self.top, entry)
        self._add_to_front(key, point)

    def _add_to_front(self, key: tuple, p: Point) -> None:
        if not self.pareto or self.dominated(p.memory, p.throughput):
            return
        self.front = [f for f in self.front if not (f[0] >= p.memory and f[1] <= p.throughput)]
        self.front.append((p.memory, p.throughput, key))
        self.front.sort(key=lambda f: f[0])

    def dominated(self, memory: float, throughput: float) -> bool:
        """Some layout found has no more memory and at least this throughput (an equal one counts:
        layouts with identical numbers are listed once). Without a front, everything counts as such."""
        if not self.pareto:
            return True
        # the front rises: memory ascending, throughput strictly so (a point matched or beaten on
        # both counts leaves it), so the best within `memory` is the last point within it
        within = bisect.bisect_right(self.front, memory, key=lambda f: f[0])
        return within > 0 and self.front[within - 1][1] >= throughput

    def threshold(self) -> float:
        return self.top[0][0] if len(self.top) >= self.limit else -1.0

    def hopeless(self, floor: float, ceiling: float) -> bool:
        """No layout with at least `floor` memory and at most `ceiling` throughput can be in the
        answer: it is below the top list and dominated."""
        return ceiling < self.threshold() and self.dominated(floor, ceiling)

    def keys(self) -> tuple[set, set]:
        return {e[-1] for e in self.top}, {f[-1] for f in self.front}


# --- the search ------------------------------------------------------------------------------------

class _Search:
    """Branch and bound over shapes, micro-batches, recompute settings and losses (module docstring)."""

    def __init__(self, req: Request, watch: Watch | None = None):
        self.req = req
        self.ev = _Evaluator(req)
        self.answer = _Answer(req.limit, req.pareto)
        self.searched = 0
        self.pruned = {"states floor": 0, "least memory": 0, "dominated": 0, "bound": 0, "monotone recompute": 0}
        self.watch = watch or Watch()
        self.total = 0  # layouts to judge (less those the estimator refuses, as they are found)
        self.ceiling_left: float | None = None  # halted: a speed no layout left unjudged exceeds

    @property
    def judged(self) -> int:
        return self.searched + self.ev.judged_layouts

    def _go_on(self) -> bool:
        """Between two shapes: a progress report when one is due; False when the watch halts the search."""
        if self.watch.due():
            best = max(self.answer.top, default=None)
            self.watch.report(Progress(self.judged, self.total, self.watch.seconds(),
                                       self._layout(best[-1], False).to_json() if best else None))
        return self.watch.halted() is None

    def run(self) -> None:
        alive, over = [], {}
        # larger EP and ZeRO stages first: a states floor over the budget is over it for every
        # smaller EP (>= 2) and ZeRO stage of the same split too (rule 1)
        ordered = sorted(shapes(self.req), key=lambda s: (s._replace(ep=0, zero=0), -s.ep, -s.zero))
        self.total = sum(self._count(s) for s in ordered)
        for s in ordered:
            if not self._go_on():
                return
            count = self._count(s)
            if self._dominated_zero(s):  # its ZeRO 1 twin came first: judged unless the estimator refused it
                if self.ev.floors.get(self.ev.floor_key(s._replace(zero=1)), 0) is not None:
                    self._judge(count - self.ev.judged[s], "dominated")
                else:
                    self.total -= count
                continue
            group = over.setdefault(s._replace(ep=0, zero=0), [])
            if any(z >= s.zero and (e == s.ep or e >= s.ep >= 2) for e, z in group) and self._floors_fall(s):
                self._judge(count - self.ev.judged[s], "states floor")
                continue
            floor = self.ev.floor(s)
            if floor is None:
                self.total -= count  # the estimator refuses the layout: not a layout
                continue
            if not self.req.within(floor):
                group.append((s.ep, s.zero))
                self._judge(count - self.ev.judged[s], "states floor")
                continue
            alive.append((s, floor, count))
        tops = {s: self.ev.shape_speeds(s) for s, _, _ in alive}
        for s, floor, count in sorted(alive, key=lambda x: -tops[x[0]].ceiling("none")):
            if not self._go_on():
                self.ceiling_left = tops[s].ceiling("none")  # the shapes left are in falling order of it
                return
            self._shape(s, floor, tops[s], count)

    def _floors_fall(self, s: Shape) -> bool:
        """The states floor falls (or stays) with the ZeRO stage, and with EP from 2 up: experts
        split over more GPUs while their sharded states spread over the same TP x CP x DP. Not with
        DeepEP, whose buffers depend on EP."""
        return self.req.training.moe_dispatcher != "deepep"

    def _micro(self, s: Shape) -> tuple[int, ...]:
        return shape_micro_batches(self.req.training, s)

    def _count(self, s: Shape) -> int:
        return len(self._micro(s)) * variants_per_micro_batch(self.req.architecture, s)

    def _out(self, floor: float, ceiling: float) -> bool:
        """No layout with at least `floor` memory and at most `ceiling` throughput can be in the
        answer: none fits, or each is hopeless (`_Answer.hopeless`)."""
        return not self.req.within(floor) or self.answer.hopeless(floor, ceiling)

    def _judge(self, count: int, rule: str | None = None) -> None:
        self.searched += count
        if rule:
            self.pruned[rule] += count

    def _dominated_zero(self, s: Shape) -> bool:
        """Rule 5: ZeRO 0 loses to ZeRO 1 on both counts where there is a DP x CP group."""
        return s.zero == 0 and self.req.training.framework in ("megatron", "deepspeed") and s.dp * s.cp > 1

    def _shape(self, s: Shape, floor: int, top: Speeds, count: int) -> None:
        if self.answer.hopeless(floor, top.ceiling("none")):
            self._judge(count - self.ev.judged[s], "bound")
            return
        least = self._least(s)
        # none keeps all that selective keeps (rule 2, not for torchtitan's operator-level policy),
        # and no mode needs less with a larger micro-batch
        modes = {"none": least.get("none", least["selective"]), "selective": least["selective"], "full": least["full"]}
        open_ = {m: self.req.within(lb) and not self.answer.hopeless(lb, top.ceiling(m, 1)) for m, lb in modes.items()}
        if not any(open_.values()):
            fits = any(self.req.within(lb) for lb in modes.values())
            self._judge(count - self.ev.judged[s], "bound" if fits else "least memory")
            return
        below = dict(modes)  # the least memory of each mode at this micro-batch and above (rule 3)
        full_below: dict[int, float] = {}  # ... of full recompute of n layers, by n, where estimated
        for b in self._micro(s):
            if not self._gradients_alive(s, b) and self._gradients_alive(s, 1):
                below = dict(modes)  # one micro-batch, no pipeline: gradients not yet alive, memory may fall
                full_below = {}
            self._micro_batch(s, b, below, open_, full_below, top)

    def _gradients_alive(self, s: Shape, b: int) -> bool:
        """Whether gradients exist during forward and backward (memory.py): Megatron's buffer,
        accumulation over micro-batches, or a pipeline."""
        return (self.req.training.framework == "megatron" or s.pp > 1
                or self.ev.microbatches(s, b) > 1)

    def _least(self, s: Shape) -> dict[str, float]:
        """The least memory of selective and of full recompute over the shape's micro-batches and
        recompute layers: at micro-batch 1 (and where gradients vanish), recomputing every layer,
        the smaller of fused and chunked loss (rules 2, 3, 5)."""
        sizes = [1] + [b for b in self._micro(s) if not self._gradients_alive(s, b) and self._gradients_alive(s, 1)][:1]
        modes = ("selective", "full") if self._selective_within_none() else ("none", "selective", "full")
        return {mode: min(self._pair(s, Variant(b, mode, None, "fused"))[0] for b in sizes) for mode in modes}

    def _selective_within_none(self) -> bool:
        """Rule 2's first half: Megatron's selective recompute drops tensors from what none keeps;
        torchtitan's operator-level policy (fsdp2) saves tensors of its own (a row-parallel matmul's
        whole output under TP), which can exceed what none keeps."""
        return not op_level(_selective(self.req.training))

    def _micro_batch(self, s: Shape, b: int, below: dict, open_: dict, full_below: dict[int, float],
                     top: Speeds) -> None:
        most = most_stage_layers(self.req.architecture, s)
        per_mode = {"none": 2, "selective": 2, "full": 2 * most}  # fused and chunked (standard: rule 5)
        alive = [m for m in open_ if open_[m]]
        self._judge(sum(per_mode.values()) // 2, "dominated")  # the standard loss (rule 5)
        # the shape's ceilings hold at every micro-batch (rule 4): no roofline of this one is needed
        if self._out(min(below[m] for m in alive), max(top.ceiling(m, 1) for m in alive)):
            alive = []
        if alive:
            fastest = self.ev.roofline(s, Variant(b, "none", None, "fused")).step.tokens_per_s_per_gpu
            speed = self.ev.speeds(s, b)._replace(cap=fastest)  # recompute only adds work (rule 4)
            ceilings = {"none": fastest, "selective": speed.ceiling("selective"), "full": speed.ceiling("full", 1)}
            if self._out(min(below[m] for m in alive), max(ceilings[m] for m in alive)):
                alive = []
        for mode in [m for m in per_mode if m not in alive]:
            self._judge(per_mode[mode] - self._estimated_mode(s, b, mode, most), "bound")
        if "selective" in alive:
            memory = self._candidate(s, Variant(b, "selective", None, "fused"), below["selective"],
                                     ceilings["selective"])
            below["selective"] = max(below["selective"], memory or 0)
        if "none" in alive:
            lower = max(below["none"], below["selective"]) if self._selective_within_none() else below["none"]
            memory = self._candidate(s, Variant(b, "none", None, "fused"), lower, fastest, exact=True)
            below["none"] = max(lower, memory or 0)
        if "full" in alive:
            below["full"] = max(below["full"], self._full_family(s, b, below["full"], speed, full_below))

    def _estimated_mode(self, s: Shape, b: int, mode: str, most: int) -> int:
        if mode == "full":
            return self._estimated_full(s, b, range(1, most + 1), most)
        return sum(1 for loss in ("fused", "chunked") if (s, Variant(b, mode, None, loss)) in self.ev.memory)

    def _pair(self, s: Shape, v: Variant) -> tuple[float, Variant]:
        """Rule 5's pair: the fused and the chunked loss run alike; the one that needs less memory
        stands for both. (memory, variant); memory is inf when the estimator refuses both."""
        best = (math.inf, v)
        for loss in ("fused", "chunked"):
            key = (s, v._replace(loss=loss))
            total = self.ev.total(*key)
            if total is not None and total < best[0]:
                best = (total, key[1])
        return best

    def _candidate(self, s: Shape, v: Variant, lower: float, upper: float, exact: bool = False,
                   speeds: dict[int, float] | None = None) -> float | None:
        """Judges one recompute setting's pair: skipped when a memory it cannot go below is over the
        budget or (that memory, a speed it cannot exceed) is hopeless, else estimated; a fitting one
        gets its roofline and joins the answer unless hopeless on its own memory. `exact`: `upper`
        is its speed. Its memory, None when skipped; a roofline's speed is noted in `speeds` under
        the recompute layers (full recompute)."""
        if self._out(lower, upper):
            self._judge(2 - sum(1 for loss in ("fused", "chunked") if (s, v._replace(loss=loss)) in self.ev.memory),
                        "bound")
            return None
        memory, variant = self._pair(s, v)
        if self.req.within(memory) and not self.answer.hopeless(memory, upper):
            speed = upper if exact else self.ev.roofline(s, variant).step.tokens_per_s_per_gpu
            if speeds is not None:
                speeds[v.layers or most_stage_layers(self.req.architecture, s)] = speed
            self.answer.add((s, variant), Point(memory, speed))
        return memory

    def _full_family(self, s: Shape, b: int, lower: float, speed: Speeds, known: dict[int, float]) -> float:
        """Full recompute of n = 1 ... most layers per stage (rules 2 and 5: memory and speed fall as
        n grows). `known`: n -> its memory at a smaller micro-batch (rule 3: a lower bound here),
        to which what is estimated here is added. Returns a lower bound on the memory of n = most (its
        memory when estimated)."""
        most = most_stage_layers(self.req.architecture, s)
        if self._out(lower, speed.ceiling("full", 1)):
            self._judge(2 * most - self._estimated_full(s, b, range(1, most + 1), most), "bound")
            return lower
        full = _FullSpeeds(speed)
        if most > 1 and full.loose:  # the family's fastest setting, exactly: a ceiling for every n (rule 5)
            one = self._speed(s, self._full(b, 1, most))
            if one is not None:
                full.exact[1] = one
                if self._out(lower, one):
                    self._judge(2 * most - self._estimated_full(s, b, range(1, most + 1), most), "bound")
                    return lower
        top = self._candidate(s, self._full(b, most, most), lower, full.ceiling(most))
        if top is not None:
            known[most] = top
        if top is not None and not self.req.within(top):
            self._judge(2 * (most - 1) - self._estimated_full(s, b, range(1, most), most), "monotone recompute")
        else:
            self._interval(s, b, 1, most, lower if top is None else top, full, known)
        return lower if top is None else top

    def _speed(self, s: Shape, v: Variant) -> float | None:
        """The expected tokens/s per GPU of a layout (None: the roofline refuses it)."""
        try:
            return self.ev.roofline(s, v).step.tokens_per_s_per_gpu
        except ConfigError:
            return None

    def _full(self, b: int, n: int, most: int) -> Variant:
        return Variant(b, "full", None if n == most else n, "fused")

    def _estimated_full(self, s: Shape, b: int, ns: range, most: int) -> int:
        """Fused and chunked full recompute settings with n in `ns` already estimated (or refused)."""
        return sum(1 for n in self.ev.full_layers.get((s, b), ()) if (most if n is None else n) in ns)

    def _interval(self, s: Shape, b: int, lo: int, hi: int, lower: float, speed: _FullSpeeds,
                  known: dict[int, float]) -> None:
        """n in [lo, hi - 1], none of them judged, all needing at least `lower` (the memory of n = hi
        or a bound on it) and, at each n, what any n' >= n needed at this or a smaller micro-batch
        (`known`; rules 2 and 3): those up to the largest n' over the budget are over it; the rest
        skipped when (their least bound, the speed ceiling at lo) is hopeless, else split at a
        middle n, estimated."""
        if lo >= hi:
            return
        most = most_stage_layers(self.req.architecture, s)
        over = max((n for n, memory in known.items() if n >= lo and not self.req.within(memory)), default=0)
        if over >= lo:
            last_over = min(over, hi - 1)
            self._judge(2 * (last_over + 1 - lo) - self._estimated_full(s, b, range(lo, last_over + 1), most),
                        "monotone recompute")
            lo = last_over + 1
            if lo >= hi:
                return
        floor = max(lower, _at_least(known, hi - 1))
        if speed.loose and not self._out(floor, speed.ceiling(lo)) and lo not in speed.exact:
            exact = self._speed(s, self._full(b, lo, most))  # the range's fastest, exactly (rule 5)
            if exact is not None:
                speed.exact[lo] = exact
        if self._out(floor, speed.ceiling(lo)):
            self._judge(2 * (hi - lo) - self._estimated_full(s, b, range(lo, hi), most), "bound")
            return
        mid = (lo + hi - 1) // 2
        memory = self._candidate(s, self._full(b, mid, most), max(lower, _at_least(known, mid)),
                                 speed.ceiling(mid), speeds=speed.exact)
        if memory is not None:
            known[mid] = memory
        if memory is not None and not self.req.within(memory):  # nor does any n below it
            self._judge(2 * (mid - lo) - self._estimated_full(s, b, range(lo, mid), most), "monotone recompute")
        else:
            self._interval(s, b, lo, mid, lower if memory is None else memory, speed, known)
        self._interval(s, b, mid + 1, hi, lower, speed, known)

    def layouts(self) -> tuple[Layout, ...]:
        top, front = self.answer.keys()
        out = [self._layout(key, key in front) for key in top | front]
        # ties on speed and memory in the layout's own fields, so the order never depends on the
        # iteration order of a set (the CLI and the app rank alike)
        return tuple(sorted(out, key=lambda x: (-x.tokens_per_s_per_gpu, x.device_total_bytes,
                                                json.dumps(x.changes(), sort_keys=True))))

    def _layout(self, key: tuple, pareto: bool) -> Layout:
        s, v = key
        e, r = self.ev.estimate(s, v), self.ev.roofline(s, v)
        return Layout(parallel=e.parallel, training=e.training, device_total_bytes=e.device_total_bytes,
                      peak_stage=e.peak_stage, utilization=e.fit.utilization, step_time_s=r.step.time_s,
                      tokens_per_s_per_gpu=r.step.tokens_per_s_per_gpu, mfu=r.step.mfu, pareto=pareto)


LOOSE = 1.2  # a ceiling this far above the exact speed: exact speeds of full recompute pay (_FullSpeeds)


class _FullSpeeds:
    """Ceilings on the speed of full recompute of n layers at one shape and micro-batch: the
    shape's (`Speeds`), and the exact speed of any n' <= n found so far (`exact`, n' -> tokens/s
    per GPU): recomputing more layers is never faster (rule 5)."""

    def __init__(self, speeds: Speeds):
        self.speeds = speeds
        self.exact: dict[int, float] = {}
        # whether exact speeds are worth their rooflines: where the shape's ceiling without recompute
        # is well above the exact speed (an MoE model's expert traffic, which the ceiling scales to
        # the stage with the fewest MoE layers); a choice of cost, never of the answer
        self.loose = speeds._replace(cap=math.inf).ceiling("none") > LOOSE * speeds.cap

    def ceiling(self, n: int) -> float:
        return min([self.speeds.ceiling("full", n)] + [v for k, v in self.exact.items() if k <= n])


def _at_least(known: dict[int, float], n: int) -> float:
    """A lower bound on the memory of full recompute of n layers from `known` (n' -> memory at this
    or a smaller micro-batch): recomputing fewer layers never needs less (rule 2), nor does a larger
    micro-batch (rule 3)."""
    return max((memory for k, memory in known.items() if k >= n), default=0.0)


# --- entry points --------------------------------------------------------------------------------------

def plan(arch: Architecture, training: Training, gpu: str | Hardware, gpus: int, gpus_per_node: int = 8,
         margin: float = TIGHT_FRACTION, *, comm_overlap: float = 1.0, limit: int = 50, pareto: bool = True,
         fixed: dict[str, int | None] | None = None, max_gpus: int = 16384, watch: Watch | None = None) -> Plan:
    """The layouts of `arch` trained as `training` on `gpus` GPUs that fit under `margin` of the
    GPU's memory: the `limit` fastest and (with `pareto`) the memory/throughput Pareto front,
    fastest first. `fixed` holds parallel fields (tp, pp, vpp, pp_first_stage_layers,
    pp_last_stage_layers, cp, dp, ep, etp, zero_stage) at the given values. `watch` follows the
    search and may halt it (estimator/watch.py)."""
    hardware = gpu if isinstance(gpu, Hardware) else Hardware(gpu=gpu)
    req = _request(arch, training, hardware, gpus, gpus_per_node, margin, comm_overlap, limit, pareto,
                   tuple(sorted((fixed or {}).items())), max_gpus)
    return search(req, watch)


def _request(arch, training, hardware, gpus, gpus_per_node, margin, comm_overlap, limit, pareto, fixed,
             max_gpus) -> Request:
    for name, value in fixed:
        if name not in FIXABLE:
            raise ConfigError(f"plan.fixed.{name}", value, "one of " + ", ".join(FIXABLE))
    checks = (("gpus", gpus, gpus >= 1), ("gpus_per_node", gpus_per_node, gpus_per_node >= 1),
              ("margin", margin, 0 < margin <= 1), ("limit", limit, limit >= 1))
    for name, value, ok in checks:
        if not ok:
            raise ConfigError(f"plan.{name}", value, "a positive integer" if name != "margin" else "0 < margin <= 1")
    if training.mode != "training":
        raise ConfigError("training.mode", training.mode, "'training'", "the planner lays out training runs")
    return Request(arch, training, hardware, gpus, gpus_per_node, margin, comm_overlap, limit, pareto, fixed,
                   max_gpus)


def search(req: Request, watch: Watch | None = None) -> Plan:
    """The plan of `req`; `watch` follows the search and may halt it (a request to stop, a time
    budget), whereupon the plan holds the best layouts of those searched and says what was not."""
    watch = watch or Watch()
    with _cyclic_gc_paused():
        start = time.perf_counter()
        run = _Search(req, watch)
        run.run()
        layouts = run.layouts()
        seconds = time.perf_counter() - start  # the layout search; the no-fit answer below is a search of its own
        smallest = None if layouts or watch.halted() else smallest_fit(req, watch)
        answer = Plan(request=req, layouts=layouts, searched=run.judged, estimates=run.ev.estimates,
                      rooflines=run.ev.rooflines, seconds=seconds, pruned=dict(run.pruned), smallest_fit=smallest,
                      stopped=watch.describe() or None, not_searched=run.total - run.judged if watch.reason else 0,
                      not_searched_ceiling=run.ceiling_left)
        del run  # its memos freed before the collector is back: its first collection need not walk them
    return answer


@contextmanager
def _cyclic_gc_paused():
    """Python's cyclic garbage collector off for the search. The search makes millions of
    short-lived records without reference cycles (reference counting frees them) while its memos
    grow, and every collection walks all of them again: about 40% of a plan's time (Llama-3.1-70B on
    64 GPUs: 3.4 s -> 2.0 s of CPU). Switched back on only if it was on, so that nested or
    concurrent searches (the app's sessions run in threads) never leave it off."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


# --- when nothing fits: how many GPUs would -----------------------------------------------------------

class _Halted(Exception):
    """The watch halted the search for the fewest GPUs that fit."""


def least_memory(req: Request, watch: Watch | None = None) -> int | None:
    """The smallest device total of any layout on `req.gpus` GPUs (None: no valid layout). Each
    shape's least is at micro-batch 1 with full recompute of every layer or selective recompute,
    fused or chunked loss (rules 2 and 3, and memory never falls with the micro-batch but where
    the last micro-batch size leaves one micro-batch and no pipeline, so that one is tried too);
    shapes whose states floor is above the least found are skipped (rule 1). Raises `_Halted` when
    `watch` halts it."""
    ev, best = _Evaluator(req), None
    floors = []
    for s in shapes(req):
        _check(watch, req)
        floors.append((ev.floor(s), s))
    for floor, s in sorted((x for x in floors if x[0] is not None), key=lambda x: x[0]):
        if best is not None and floor >= best:
            break
        _check(watch, req)
        for v in _frugal_variants(req, s):
            total = ev.total(s, v)
            if total is not None and (best is None or total < best):
                best = total
    return best


def _frugal_variants(req: Request, s: Shape) -> list[Variant]:
    micro = shape_micro_batches(req.training, s)
    sizes = {min(micro)}
    if req.training.framework != "megatron" and s.pp == 1:
        sizes.add(max(micro))  # one micro-batch per step: no gradients alive in forward
    return [Variant(b, mode, None, loss) for b in sorted(sizes) for mode in ("full", "selective")
            for loss in ("fused", "chunked")]


def _check(watch: Watch | None, req: Request) -> None:
    if watch is None:
        return
    if watch.due():
        watch.report(Progress(req.gpus, req.max_gpus, watch.seconds(), phase="fewest GPUs"))
    if watch.halted():
        raise _Halted


def smallest_fit(req: Request, watch: Watch | None = None) -> dict:
    """For the request's GPU and every catalog GPU: the fewest GPUs, a power of two, on which some
    layout fits under the margin; None where none does up to `req.max_gpus`, or (other GPUs) up to
    4 x the request's GPU's answer, where the search stops. The memory of a layout does not depend
    on which catalog GPU runs it (memory.Estimate.fits; DeepEP's buffers aside, sized here for the
    request's GPU), so one search per GPU count answers every GPU. When `watch` halts it, the
    counts found so far (the others None)."""
    own = req.hardware.gpu
    answer: dict[str, int | None] = {own: None, **{g: None for g in GPUS if g != own}}
    n = 1
    while n <= req.max_gpus and None in answer.values() and (answer[own] is None or n <= 4 * answer[own]):
        try:
            least = least_memory(dataclasses.replace(req, gpus=n), watch)
        except _Halted:
            return answer
        for g in answer:
            if answer[g] is None and least is not None and least / GPUS[g].capacity_bytes <= req.margin:
                answer[g] = n  # the verdict rule of Request.within, on GPU g
        n *= 2
    return answer


# --- text ------------------------------------------------------------------------------------------------

GiB = 1024**3


def _pipeline(par: Parallel) -> str:
    text = str(par.pp)
    if par.pp_first_stage_layers is not None:
        text += f" ({par.pp_first_stage_layers}|..|{par.pp_last_stage_layers})"
    return text + (f" x{par.vpp}" if par.vpp > 1 else "")


def _recompute(tr: Training) -> str:
    if tr.recompute == "full":
        return f"full {tr.recompute_layers}" if tr.recompute_layers else "full all"
    return tr.recompute


def _row(rank: int, x: Layout) -> str:
    p, t = x.parallel, x.training
    expert = f"{p.ep}/{p.etp}" if p.ep > 1 or p.etp != p.tp else "-"
    return (f"{rank:>4} {'*' if x.pareto else ' '} {p.tp:>3} {_pipeline(p):>14} {p.cp:>3} {p.dp:>5} {expert:>7} "
            f"{p.zero_stage:>4} {t.micro_batch_size:>4} {_recompute(t):>10} {t.loss:>8} "
            f"{x.device_total_bytes / GiB:8.2f} {x.utilization:6.1%} {x.tokens_per_s_per_gpu:10,.0f} {x.mfu:6.1%} "
            f"{x.step_time_s:8.3f}")


def render_plan_text(result: Plan) -> str:
    req = result.request
    lines = [f"Plan for {req.architecture.name} on {req.gpus} x {req.hardware.gpu} ({req.gpus_per_node} per node): "
             f"layouts using at most {req.margin:.0%} of {req.hardware.device.capacity_bytes / GiB:.1f} GiB",
             f"Searched {result.searched:,} layouts in {result.seconds:.2f} s ({result.estimates:,} full estimates, "
             f"{result.rooflines:,} rooflines; the rest judged by exact rules: "
             + ", ".join(f"{k} {v:,}" for k, v in result.pruned.items()) + ")"]
    if result.stopped:
        lines.append(result.note())
    if not result.layouts:
        return "\n".join(lines + ["No fitting layout found." if result.not_searched else "No layout fits."])
    front = sum(x.pareto for x in result.layouts)
    lines += [f"Listed: the {min(req.limit, len(result.layouts))} fastest fitting layouts and the Pareto front "
              f"({front} layouts, marked *) of memory against throughput; {len(result.layouts)} in all.", "",
              f"{'rank':>4}   {'TP':>3} {'PP':>14} {'CP':>3} {'DP':>5} {'EP/ETP':>7} {'ZeRO':>4} {'mbs':>4} "
              f"{'recompute':>10} {'loss':>8} {'GiB':>8} {'util':>6} {'tok/s/GPU':>10} {'MFU':>6} {'step s':>8}"]
    lines += [_row(i, x) for i, x in enumerate(result.layouts, 1)]
    lines += ["", "PP a|..|b: uneven first and last stages; xV: interleaved virtual stages. Numbers are the "
              "estimator's (estimate, roofline) for each layout; speeds are the step-time model's expected figures "
              "(achieved kernel efficiency, measured NCCL bandwidth, each framework's overlap), as the app shows them."]
    return "\n".join(lines)


def no_fit_text(result: Plan) -> str:
    """One line: where no layout fits, the fewest GPUs that would fit, of this GPU and the others."""
    req, found = result.request, result.smallest_fit or {}
    if result.not_searched:
        return (f"no fitting layout found on {req.gpus} x {req.hardware.gpu} under {req.margin:.0%} in the "
                f"{result.searched:,} layouts searched before the search stopped at {result.stopped}")
    head = f"no layout fits on {req.gpus} x {req.hardware.gpu} under {req.margin:.0%}"
    own = found.get(req.hardware.gpu)
    head += (f"; the fewest that fit: {own} x {req.hardware.gpu}" if own
             else f"; none fits on up to {req.max_gpus:,} x {req.hardware.gpu}")
    others = [f"{n} x {g}" for g, n in found.items() if g != req.hardware.gpu and n]
    return head + ("; other GPUs: " + ", ".join(others) if others else "") + " (powers of two)"
