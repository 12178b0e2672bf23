"""The activation receive buffers of torch.distributed.pipelining (torchtitan's pipeline parallelism, framework
fsdp2 with PP > 1) and the input gradients kept on them, moment by moment.

A stage with a predecessor makes one receive buffer of its input (the previous stage's output) per micro-batch
of the step when the schedule first runs, and keeps them all for its life (RECEIVE_SOURCE). The buffer itself
is the stage's input: while a micro-batch is in flight it is its first layer's stored input, counted with the
activations; the others (not received yet, or past their backward) are held beside them. Autograd accumulates
the input gradient into the buffer's ``.grad``; torch 2.6, 2.8 and 2.9 keep it until the next step's
clear_runtime_states, torch 2.10 on drops it once read (pytorch#164329; titan_releases.pp_recv_grads_kept).
So at any moment a receiving chunk holds (m - its micro-batches in flight) buffers and, where kept, one
``.grad`` per backward it ran. Under 1F1B the estimate's moment (k in flight beside every gradient) is at
latest the first backward after the 1B1F loop, m - k backwards done; interleaved ranks are replayed
(pp_interleaved_moments.py, which weighs these bytes when it picks the largest moment).
"""

from __future__ import annotations

from functools import lru_cache
from typing import NamedTuple

from ..spec.architecture import Architecture
from ..spec.parallel import Parallel
from ..spec.training import Training
from .components import Component, component
from .pp_buffers import stage_input
from .pp_interleaved_moments import counted_operations, counts_at_top, most_received, rank_operations
from .sharding import StageParameters
from .titan_releases import titan_rules

# the wheels read (torch/version.py git_version): 2.6.0 2236df17, 2.8.0 a1cb3cc0, 2.9.0 0fabc3ba, 2.10.0 449b1768,
# 2.13.0 cf30153c
RECEIVE_SOURCE = ("torch 2.6.0 distributed/pipelining/stage.py _prepare_forward_infra (1425-1433: one receive "
                  "buffer per micro-batch, made at the first step and kept in args_recv_info), "
                  "_retrieve_recv_activations (the buffer itself, requires_grad_, is the stage's input), "
                  "clear_runtime_states (507-525: each buffer's .grad set to None at the next step's start), "
                  "_backward.py stage_backward (torch.autograd.backward accumulates the input gradient into "
                  "the buffer's .grad); the same in torch 2.8.0 and 2.9.0 (stage.py 1460, 1523; 521, 520); "
                  "torch 2.10.0 _backward.py 376 and 2.13.0 450 (pytorch#164329) set .grad to None once read; "
                  "torch 2.13.0 stage.py 2243-2270 _setup_forward_recv_info still one buffer per micro-batch "
                  "(pytorch#196463, just-in-time buffers, unmerged); schedules.py Schedule1F1B (warm-up "
                  "min(m, p - stage) forwards, then a backward before each further forward) and "
                  "ScheduleInterleaved1F1B")
BUFFERS = "Pipeline activation receive buffers of the micro-batches not in flight"
GRADS = "Input gradients kept on the receive buffers (.grad) until the next step"


class Receiving(NamedTuple):
    """What a rank's chunks receive: `receives[c]` whether local chunk c has a predecessor (every stage but
    the first), `hidden` one buffer's bytes (`formula`), `m` the step's micro-batches."""

    hidden: float
    formula: str
    m: int
    receives: tuple[bool, ...]
    grads_kept: bool

    def counts(self, in_flight: tuple[int, ...], done: tuple[int, ...]) -> tuple[int, int]:
        """(buffers not in flight, .grad kept) over the receiving chunks; `in_flight[c]`, `done[c]`: chunk c's
        micro-batches forwarded and not yet backwarded, and backwarded."""
        idle = sum(self.m - f for f, r in zip(in_flight, self.receives) if r)
        grads = sum(b for b, r in zip(done, self.receives) if r) if self.grads_kept else 0
        return idle, grads

    def bytes(self, in_flight: tuple[int, ...], done: tuple[int, ...]) -> float:
        return self.hidden * sum(self.counts(in_flight, done))

    def along(self, rank: int, p: int, v: int) -> tuple[float, ...]:
        """The bytes at each of rank `rank`'s operations in torch's interleaved order (the replay's `received`)."""
        return _along(self.hidden, rank, p, v, self.m, self.receives, self.grads_kept)

    def rounded(self, in_flight: tuple[int, ...], done: tuple[int, ...]) -> int:
        """The bytes of `parts`, each rounded as a component is."""
        return sum(int(round(n * self.hidden)) for n in self.counts(in_flight, done))

    def parts(self, in_flight: tuple[int, ...], done: tuple[int, ...], when: str) -> tuple[Component, ...]:
        """The buffers and gradients of a moment as components (key "buffers"), the empty ones left out."""
        idle, grads = self.counts(in_flight, done)
        chunks = sum(self.receives)
        of = f"{chunks} x {self.m}" if chunks > 1 else f"{self.m}"
        out = (component("buffers", BUFFERS, idle * self.hidden,
                         f"{idle} of {of} micro-batches' buffers x {self.formula} ({when})", RECEIVE_SOURCE),
               component("buffers", GRADS, grads * self.hidden,
                         f"{grads} backwards run x {self.formula} ({when})", RECEIVE_SOURCE))
        return tuple(c for c in out if c.bytes)


@lru_cache(maxsize=64)
def _along(hidden: float, rank: int, p: int, v: int, m: int, receives: tuple[bool, ...],
           kept: bool) -> tuple[float, ...]:
    """`Receiving.along` (remembered: the estimates of a search's shape ask for the same ranks' bytes, twice each)."""
    return tuple(hidden * n for n in _op_counts(rank, p, v, m, receives, kept))


@lru_cache(maxsize=1024)
def _op_counts(rank: int, p: int, v: int, m: int, receives: tuple[bool, ...], kept: bool) -> tuple[int, ...]:
    """Buffers not in flight + .grad kept at each operation of the rank (remembered: each estimate asks again)."""
    rx = Receiving(1.0, "", m, receives, kept)
    return tuple(sum(rx.counts(f, b)) for _, _, f, b in counted_operations(rank_operations(rank, p, v, m), v))


def receiving(arch: Architecture, training: Training, par: Parallel, stage: StageParameters,
              microbatches: int) -> Receiving | None:
    """A torchtitan training rank's receiving chunks under 1F1B or interleaved 1F1B (rank r's chunk c is stage
    r + c x PP); None elsewhere (no pipeline, other schedules: not modelled) or where no chunk receives."""
    return on_rank(step_receiving(arch, training, par, microbatches), par, stage)


def step_receiving(arch: Architecture, training: Training, par: Parallel, microbatches: int) -> Receiving | None:
    """`receiving`'s part common to every rank of a step (its `receives` left empty), or None."""
    rules = titan_rules(training)
    if rules is None or par.pp == 1 or training.mode != "training" or par.schedule not in ("1f1b", "interleaved"):
        return None
    hidden, formula = stage_input(arch, training, par)
    return Receiving(hidden, formula, microbatches, (), rules.pp_recv_grads_kept)


def on_rank(step: Receiving | None, par: Parallel, stage: StageParameters) -> Receiving | None:
    """`step` (`step_receiving`) on a rank: its chunks' `receives`; None where none receives."""
    if step is None:
        return None
    chunks = len(stage.chunks)
    if not (chunks == 1 if par.schedule == "1f1b" else chunks == par.vpp) or (chunks == 1 and stage.stage == 0):
        return None
    receives = (stage.stage > 0,) + (True,) * (chunks - 1)  # chunk c >= 1 is stage rank + c x PP > 0
    return Receiving(step.hidden, step.formula, step.m, receives, step.grads_kept)


class ReceiveBuffers(NamedTuple):
    """A stage's receive buffers beyond its counted layer inputs at its forward peak, at its backward peak
    (interleaved: empty here, the schedule's replay adds them at its moment, pp_first_backward) and once every
    backward ran (its backward's last moments and the optimizer step: every buffer, every .grad)."""

    forward: tuple[Component, ...] = ()
    backward: tuple[Component, ...] = ()
    settled: tuple[Component, ...] = ()


Counts = tuple[tuple[int, ...], tuple[int, ...]]  # (in flight, backwarded) of each chunk


def _moments(rx: Receiving, par: Parallel, stage: StageParameters, inflight: float,
             replayed: bool) -> tuple[Counts, Counts | None, Counts]:
    """The counts at the forward peak, the backward peak (None: the schedule's replay adds them at its moment) and
    once every backward ran. 1F1B: k = `inflight` in flight and m - k backwards run at both peaks (the latest
    moments with k in flight). Interleaved: the forward with the most inputs held, its latest
    (pp_interleaved_moments.counts_at_top); where the replay does not run (`replayed` False: pp_first_backward
    .interleaved_applies), the backward start with the most buffers and .grad."""
    chunks, m = len(rx.receives), rx.m
    settled = ((0,) * chunks, (m,) * chunks)
    if par.schedule != "interleaved":
        k = min(m, int(inflight))
        return ((k,), (m - k,)), ((k,), (m - k,)), settled
    ops, along = rank_operations(stage.stage, par.pp, par.vpp, m), rx.along(stage.stage, par.pp, par.vpp)
    top = counts_at_top(ops, tuple(len(c) for c in stage.chunks), along)
    if replayed:
        return top, None, settled
    latest = most_received(ops, chunks, along)
    return top, (latest.in_flight, latest.done), settled


def receive_buffers(rx: Receiving | None, par: Parallel, stage: StageParameters, inflight: float,
                    replayed: bool = True) -> ReceiveBuffers:
    """`rx`'s buffers at a rank's peaks as components (`_moments`)."""
    if rx is None:
        return ReceiveBuffers()
    forward, backward, settled = _moments(rx, par, stage, inflight, replayed)
    if par.schedule == "interleaved":
        ahead, behind = "at the latest forward holding the most inputs", "at the backward start holding the most"
    else:
        ahead = behind = f"{forward[0][0]} in flight, {forward[1][0]} backwards run"
    return ReceiveBuffers(rx.parts(*forward, ahead), rx.parts(*backward, behind) if backward else (),
                          rx.parts(*settled, "every backward ran"))


def receive_bytes(rx: Receiving | None, par: Parallel, stage: StageParameters, inflight: float,
                  replayed: bool = True) -> tuple[int, int, int]:
    """`receive_buffers`' three totals without building its components (the estimate's numbers; the components
    are built when shown)."""
    if rx is None:
        return 0, 0, 0
    forward, backward, settled = _moments(rx, par, stage, inflight, replayed)
    return rx.rounded(*forward), rx.rounded(*backward) if backward else 0, rx.rounded(*settled)


def received_parts(rx: Receiving | None, moment, when: str) -> tuple[Component, ...]:
    """`rx`'s parts at a replayed moment (pp_interleaved_moments.Moment, its `in_flight` and `done`)."""
    if rx is None or moment is None or not moment.in_flight:
        return ()
    return rx.parts(moment.in_flight, moment.done, when)
