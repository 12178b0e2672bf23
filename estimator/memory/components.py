"""The records an estimate is made of, and their public constructors.

A stage's memory is a list of `Component`s (bytes, formula, source) per `Phase` of the step; a
`StageEstimate` holds the stage's totals, computed with the estimate, and builds its phases and
components only when someone reads them (a layout search needs the numbers alone). Training
stages (memory.py) and inference stages (inference.py) are both made here, with one
representation.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, NamedTuple

from .activations.entries import Entry
from ..spec.hardware import Hardware
from ..spec.parallel import Parallel

# Components that are not tensors in PyTorch's allocator
# "managed": cudaMallocManaged memory (bitsandbytes' paged optimizer states, paged.py)
NON_ALLOCATOR = ("communication", "runtime", "fragmentation", "managed")  # not in max_memory_allocated
OUTSIDE_ALLOCATOR = ("communication", "runtime", "managed")  # not in max_memory_reserved either
# Components a phase lists even at zero bytes (the contract's keys)
ALWAYS = ("parameters", "gradients", "optimizer_states", "activations")


class Component(NamedTuple):
    """One slice of a stage's memory: its bytes, the formula that gave them and its source.
    (An immutable record like the dataclasses around it; a NamedTuple because every estimate
    makes dozens and it costs a third of a frozen dataclass.)"""

    key: str
    label: str
    bytes: int
    formula_text: str | Callable[[], str]  # the text, or a function that writes it when first read
    source: str
    parts: tuple["Component", ...] = ()

    @property
    def formula(self) -> str:
        """Numbers are what a layout search needs; a formula is written only when someone reads it."""
        return self.formula_text() if callable(self.formula_text) else self.formula_text


@dataclass(frozen=True)
class Phase:
    name: str  # "forward", "backward", "optimizer"
    allocated_bytes: int
    components: tuple[Component, ...]


class StageDetail(NamedTuple):
    """How the phases and the components outside the allocator of a group of stages are made:
    `build(stage)`, for one stage of the group when first asked for, kept by stage number. The
    stages that share their static part (every middle stage of a pipeline) share one, so an
    estimate makes one per group rather than one per stage."""

    build: Callable[["StageEstimate"], tuple[tuple[Phase, ...], tuple[Component, ...]]]
    memo: dict

    def built(self, stage: "StageEstimate") -> tuple[tuple[Phase, ...], tuple[Component, ...]]:
        if stage.stage not in self.memo:
            self.memo[stage.stage] = self.build(stage)
        return self.memo[stage.stage]


class StageEstimate(NamedTuple):
    """One pipeline stage. The totals are computed with the estimate; the components and phases
    (with their formulas and sources) are built on first access, so a search over many layouts
    pays only for the numbers. (An immutable record; a NamedTuple because an estimate makes one
    per stage.)"""

    stage: int
    layers: int
    parameters_per_gpu: int  # this stage's parameters on one GPU before ZeRO sharding
    in_flight_microbatches: float
    peak_phase: str
    allocated_peak_bytes: int
    device_total_bytes: int
    phase_totals: tuple[tuple[str, int], ...]  # (phase, allocated bytes) through one step
    detail: StageDetail  # shared by the stages of its group
    host: tuple[Component, ...] = ()  # what this GPU's process keeps in host memory (offload)
    nvme: tuple[Component, ...] = ()  # ... and on NVMe
    cache: Component | None = None  # the allocator's cache replayed (reserved.py); None: the flat share

    @property
    def host_bytes(self) -> int:
        return sum(c.bytes for c in self.host)

    @property
    def nvme_bytes(self) -> int:
        return sum(c.bytes for c in self.nvme)

    @property
    def phases(self) -> tuple[Phase, ...]:
        return self.detail.built(self)[0]

    @property
    def components(self) -> tuple[Component, ...]:
        """At the peak, the non-allocator components (communication, runtime, fragmentation) last."""
        phases, outside = self.detail.built(self)
        return next(p for p in phases if p.name == self.peak_phase).components + outside

    def component(self, key: str) -> Component | None:
        return next((c for c in self.components if c.key == key), None)

    @property
    def outside_allocator(self) -> tuple[Component, ...]:
        """What the device holds outside PyTorch's caching allocator (CUDA context, NCCL buffers):
        nvidia-smi counts it, `max_memory_reserved` does not."""
        return tuple(c for c in self.detail.built(self)[1] if c.key in OUTSIDE_ALLOCATOR)

    @property
    def reserved_peak_bytes(self) -> int:
        """What `torch.cuda.max_memory_reserved()` reports: the allocated peak plus the allocator's
        cached, unused segments (the fragmentation component: replayed or a flat share, reserved.py)."""
        return self.device_total_bytes - sum(c.bytes for c in self.outside_allocator)


def built_stage(stage: int, layers: int, parameters_per_gpu: int, phases: tuple[Phase, ...],
                outside: tuple[Component, ...]) -> StageEstimate:
    """A stage whose phases are built already (inference): its peak is its largest phase, and the
    device holds that plus the components outside the allocator."""
    peak = max(phases, key=lambda p: p.allocated_bytes)
    return StageEstimate(
        stage=stage, layers=layers, parameters_per_gpu=parameters_per_gpu, in_flight_microbatches=1.0,
        peak_phase=peak.name, allocated_peak_bytes=peak.allocated_bytes,
        device_total_bytes=peak.allocated_bytes + sum(c.bytes for c in outside),
        phase_totals=tuple((p.name, p.allocated_bytes) for p in phases),
        detail=StageDetail(lambda _: (phases, outside), {}))


def once(build: Callable[[], object]) -> Callable[[], object]:
    """`build`, called at most once: what an estimate shows (formulas, components) is made when
    first read and then kept. (Lighter than functools.cache, which an estimate would wrap anew for
    every stage.)"""
    memo: list = []

    def get():
        if not memo:
            memo.append(build())
        return memo[0]
    return get


def total_bytes(components) -> int:
    """The bytes of components together (each already rounded to whole bytes)."""
    return sum(c.bytes for c in components)


def component(key: str, label: str, value: float, formula: str | Callable[[], str], source: str,
              parts: tuple[Component, ...] = ()) -> Component:
    return Component(key, label, int(round(value)), formula, source, parts)


def entries_component(key: str, label: str, entries: list[Entry], par: Parallel, times: float,
                      source: str) -> Component:
    """Ledger entries (activations, loss tensors) as one component with a part per entry."""
    parts = tuple(component(key, e.name, e.bytes(par) * times, e.shown_formula(par), source) for e in entries)
    formula = " + ".join(p.formula for p in parts) if entries else "0"
    if times != 1:
        formula = f"({formula}) x {times:g}"
    return Component(key, label, sum(p.bytes for p in parts), formula, source, parts)


def fold(transients: list[Component]) -> Component:
    """A phase's transients fold into one ``transient`` component whose parts are the pieces."""
    if not transients:
        return Component("transient", "Transient buffers", 0, "none in this phase", "")
    parts = tuple(p for t in transients for p in (t.parts or (t,)))
    return Component("transient", "Transient buffers", sum(p.bytes for p in parts),
                     " + ".join(t.label for t in transients), "see each part", parts)


def phase(name: str, kept: tuple[Component, ...], transient: Component) -> Phase:
    out = tuple(c for c in kept if c.bytes or c.key in ALWAYS) + (transient,)
    return Phase(name, sum(c.bytes for c in out), out)


# Reserved minus allocated at the peak, as a share of the allocated peak, measured on real GPU runs of
# the HF and PEFT cases (tests/data/measured/gpu, H200, torch 2.11): 0.6% to 40%, median 8.5%, over 39
# runs with default segments; the largest where a recompute or a wide vocabulary frees and re-requests
# blocks of many sizes. expandable_segments: 1.5% and 3.9% where the same runs measured 8.5% and 9.9% with
# default segments, but 18.8% where they measured 8.8% (full recompute, micro-batch 2). A flat share is a
# stand-in where the allocator's replay over the step's allocations (reserved.py) does not apply.
FRAGMENTATION_SOURCE = ("measured max_memory_reserved / max_memory_allocated - 1 on real H200 runs "
                        "(tests/data/measured/gpu): 0.6-40%, median 8.5% with default segments; with "
                        "expandable segments 1.5-19% on three runs")


def fragmentation_fraction(hardware: Hardware) -> float:
    """Reserved minus allocated at the peak, as a share of the allocated peak (see
    FRAGMENTATION_SOURCE); ``expandable_segments`` halves it."""
    return 0.05 if hardware.expandable_segments else 0.10


def fragmentation(allocated: int, hardware: Hardware, why: str = "",
                  cached: Component | tuple[Component, ...] | None = None) -> Component:
    """The flat share of the allocated peak, plus `cached`: segments known mechanisms keep reserved
    beyond it (tp_copies.plain_tp_reserved, pp_buffers.reduce_scatter_pool); `why`: why the allocator's
    replay (reserved.py) does not stand in its place, said in the formula."""
    fraction = fragmentation_fraction(hardware)
    segments = "expandable_segments" if hardware.expandable_segments else "default segments"
    reason = f"; flat share, no allocator replay: {why}" if why else ""
    share = component("fragmentation", "Allocator cache and fragmentation (reserved, unused)", allocated * fraction,
                      f"{fraction:.0%} of the allocated peak ({segments}){reason}", FRAGMENTATION_SOURCE)
    cached = (cached,) if isinstance(cached, Component) else tuple(cached or ())
    if not cached:
        return share
    return Component("fragmentation", share.label, share.bytes + sum(c.bytes for c in cached),
                     " + ".join([share.formula] + [f"{c.formula} ({c.label})" for c in cached]),
                     "; ".join([FRAGMENTATION_SOURCE] + [c.source for c in cached]), (share, *cached))
