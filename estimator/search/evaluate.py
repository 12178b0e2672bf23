"""Judging one layout: its memory (a full estimate, or an exact rule), its speed (the roofline), and
the answer's records.
"""

from __future__ import annotations

import bisect
import dataclasses
import functools
import heapq
import math
from collections import Counter
from typing import NamedTuple

from ..memory.pipeline import interleaved_filling_microbatches
from ..spec.errors import ConfigError
from ..memory.result import Estimate
from ..memory.memory import device_total, estimate, step_floors
from ..spec.parallel import Parallel
from ..speed.liger_operations import runs_liger_flce
from ..speed.roofline import Timing, expected_step
from ..speed.operation_table import selective_recompute_s
from ..spec.training import Training
from .layouts import Request, Shape, Variant, shape_micro_batches, stage_layer_counts


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
        self._speeds: dict[tuple[Shape, int], Speeds] = {}
        self._tops: dict[Shape, Speeds] = {}
        self.losses = req.stack.searched  # the losses the search estimates (stacks.py)

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
        """The full estimate of a layout judged to fit (the answer's records), with the flat share of
        allocator cache it was judged by (`memory.device_total`; the reported estimate may replay the
        allocator instead, memory/reserved.py)."""
        return estimate(self.req.architecture, self.training(v), self.parallel(s), self.req.hardware, replay=False)

    def _record(self, key: tuple, total: int | None) -> None:
        """A layout judged by its own estimate: its device total (None: refused), counted."""
        s, v = key
        self.memory[key] = total
        if total is not None:
            self.judged[s] += 1
            self.judged[s, v.micro_batch] += 1
            self.judged_layouts += 1
        self.estimates += 1
        if v.recompute == "full" and v.loss in self.losses:
            self.full_layers.setdefault((s, v.micro_batch), []).append(v.layers)

    def roofline(self, s: Shape, v: Variant) -> Timing:
        """The roofline's expected step (roofline.expected_step: its numbers without the operation list)."""
        # the roofline runs the fused and the chunked loss alike (roofline.head_operations), never
        # reads the recompute modules, and under Megatron and DeepSpeed ZeRO 2 gathers the
        # parameters once a step as ZeRO 1 does: one roofline serves both
        if s.zero == 2 and self.req.training.framework in ("megatron", "deepspeed"):
            s = s._replace(zero=1)
        key = (s, v._replace(loss="fused") if v.loss == "chunked" and not self.losses_apart else v)
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
                floors = step_floors(self.req.architecture, self.training(Variant(1, "full", None, self.losses[0])),
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
        falls with it) with the bubble of the most micro-batches. Remembered by shape."""
        if s not in self._tops:
            micro = shape_micro_batches(self.req.training, s)
            speed = self.uncapped_speeds(s, max(micro))
            self._tops[s] = speed._replace(bubble=self.bubble(s, min(micro)))
        return self._tops[s]

    def micro_batch_ceilings(self, s: Shape, b: int) -> Speeds:
        """Ceilings at micro-batch b without a roofline of its own: `shape_speeds` with the bubble
        of b's micro-batches, (p - 1) / (v m), the roofline's own for the schedules the planner
        searches (roofline.pipeline_bubble_s: 1F1B and interleaved)."""
        return self.shape_speeds(s)._replace(bubble=self.bubble(s, b))

    def bubble(self, s: Shape, b: int) -> float:
        return (s.pp - 1) / (s.vpp * self.microbatches(s, b))

    def uncapped_speeds(self, s: Shape, b: int) -> Speeds:
        """`Speeds` of the shape at micro-batch b from its roofline without recompute."""
        return self.speeds(s, b)._replace(cap=math.inf)

    @functools.cached_property
    def losses_apart(self) -> bool:
        """Whether the searched pair of losses (stacks.py) run at speeds of their own: Megatron's standard and fused
        cross-entropy; the chunked loss where it is Liger's fused linear cross-entropy, under the Trainer's
        frameworks (speed/liger_operations.py); elsewhere the roofline runs fused and chunked alike."""
        if len(self.losses) < 2:
            return False
        liger = Variant(1, "none", None, "chunked")
        return self.losses != ("fused", "chunked") or runs_liger_flce(self.training(liger))

    @functools.cached_property
    def ceiling_losses(self) -> tuple[str, ...]:
        """The losses whose rooflines bound every searched loss's speed: one where the pair runs alike; Megatron's
        fused cross-entropy, which the standard loss never outruns (rule 5: it moves more bytes); both of Liger's."""
        if not self.losses_apart:
            return self.losses[:1]
        return ("fused",) if self.losses == ("standard", "fused") else self.losses

    def speeds(self, s: Shape, b: int) -> Speeds:
        """`Speeds` at micro-batch b capped by its exact speed without recompute (no recompute setting
        is faster, rule 4), remembered by (shape, micro-batch); where the losses run apart, the faster
        of the two in every term, so that it bounds both."""
        key = (s, b)
        if key not in self._speeds:
            losses = self.ceiling_losses
            each = []
            for loss in losses:
                r = self.roofline(s, Variant(b, "none", None, loss))
                each.append(speeds(self.req, r, self.stage_layers(s), self.stage_params[self.floor_key(s)]
                                   )._replace(cap=r.step.tokens_per_s_per_gpu))
            self._speeds[key] = each[0] if len(each) == 1 else each[0].fastest(each[1])
        return self._speeds[key]

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

    def fastest(self, other: "Speeds") -> "Speeds":
        """Term by term the faster of two losses' speeds (the same shape and micro-batch): every ceiling
        falls as a time grows, so this one bounds both."""
        times = ("compute_s", "forward_s", "attention_s", "tp_per_layer_pass_s", "fixed_s", "hideable_s",
                 "unhideable_s")
        return self._replace(cap=max(self.cap, other.cap),
                             **{f: min(getattr(self, f), getattr(other, f)) for f in times})

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
    per_layer = {"CP": 0.0 if arch.local_attention else fewest / here,  # windows make attention uneven
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
