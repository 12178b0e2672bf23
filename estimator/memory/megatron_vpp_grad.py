"""The activation gradients Megatron-Core's interleaved (virtual pipeline) schedule holds at a rank's peak.

Megatron-Core 0.16.1 pipeline_parallel/schedules.py forward_backward_pipelining_with_interleaving runs, on pipeline
rank r of p with v model chunks and m micro-batches in groups of g (get_schedule_table, l. 798), W chunk-forwards of
warm-up (get_pp_rank_microbatches, l. 738: 2(p - r - 1) + (v - 1)g, at most m v), then m v - W steady iterations
(a chunk-forward, then the oldest chunk-backward, l. 1565-1780), then the cool-down's backwards. Every tensor below has
the stage input's shape [s/cp (/tp with sequence parallelism), b, h] in the pipeline dtype (l. 1019-1022,
`tensor_shape`; p2p_communication.py `create_tensor_recv_next`: torch.empty):

- received output gradients: each arrives after a backward for a later backward of the chunk the schedule computes
  (`recv_tensor_from_previous_stage`, l. 1120: the last rank receives for its chunks before the last, p - 1
  backwards behind) and waits in `output_tensor_grads[chunk]` (l. 1711, 1776) until its backward pops it (l. 1269);
  the warm-up's last iteration receives the first (l. 1490, 1560). With --overlap-p2p-communication (Megatron-LM's
  default under a virtual pipeline) the last rank's `bwd_recv_buffer` of g - p + 1 slots (l. 1397-1400) keeps a
  received one after its backward until its slot is cleared (l. 1714: the next slot set to None);
- input gradients (`backward_step` returns the received input's `.grad`, l. 492-499, which lives while the input
  does): the previous backward's, in the schedule's `input_tensor_grad` until the next backward returns (l. 1717,
  1729, 1839); every chunk's model keeps the input of its latest forward (transformer_block.py `set_input_tensor`,
  l. 570: its `input_tensor`), so once that micro-batch's backward ran its gradient stays until the chunk's next
  forward; with --overlap-p2p-communication without its warm-up flush, the warm-up's last receive stays in the
  schedule's `input_tensor` for the whole step (l. 1492: the steady loop of that mode never assigns it again), and
  its gradient with it once its backward ran.

A rank's stored activations are at their most (W + 1 chunks) at each steady forward's end and at the following
backward's start; the rank's peak takes the most gradients any of those moments holds (`held`). When every
chunk-forward runs in the warm-up (W = m v), the peak is the warm-up's last forward (none held) and the first
backward (on a rank before the last, the output gradient received for it, l. 1790, and with the warm-up flush the
next backward's, received ahead, l. 1827). Megatron-Core's own schedule on one fake rank
(validation/megatron/pipeline_trace.py) holds these counts: tests/test_megatron_vpp_grad.py against
tests/data/measured/megatron_pipeline/interleaved.json. The same at core_v0.19.0, the other release offered
(versions.py): its function differs in process groups and a wait on the forward send, backward_step still returns
x.grad and the transformer block still keeps its input (transformer_block.py l. 451), so no version key. Not
counted here: the received inputs the same holders keep after their backward (as large as a gradient each), and
inputs received ahead of their forward.
"""

from __future__ import annotations

from functools import lru_cache
from typing import NamedTuple

from ..spec.architecture import Architecture
from ..spec.parallel import Parallel
from ..spec.training import Training
from .components import Component, component
from .megatron_pp_grad import Held, received_gradients
from .pipeline import interleaved_schedule, interleaved_warmup, microbatch_group
from .pp_buffers import stage_input
from .sharding import StageParameters

SOURCE = ("Megatron-Core 0.16.1 pipeline_parallel/schedules.py forward_backward_pipelining_with_interleaving "
          "(output_tensor_grads queues, l. 1269, 1490, 1560, 1711, 1776; recv_tensor_from_previous_stage l. 1120; "
          "bwd_recv_buffer l. 1397; input_tensor_grad l. 1717-1839; input_tensor l. 1492), backward_step l. 492 "
          "(the input's .grad), get_pp_rank_microbatches l. 738, get_schedule_table l. 798; the model's "
          "set_input_tensor (transformer_block.py l. 570); measured: validation/megatron/pipeline_trace.py (the "
          "schedule on one fake rank, tests/data/measured/megatron_pipeline)")
LABEL = "Output gradients received from the next pipeline stage (held by the interleaved schedule)"
INPUT_LABEL = "Input gradients kept after their backward (held by the interleaved schedule)"


class Counts(NamedTuple):
    """Received output gradients and input gradients alive at a rank's forward peak and at its backward peak."""

    forward: tuple[int, int]
    backward: tuple[int, int]


class _Order(NamedTuple):
    """A rank's chunk-forwards in running order (get_schedule_table) and where its gradients come from."""

    table: list[tuple[int, int]]
    p: int
    v: int
    last: bool

    def backward(self, k: int) -> tuple[int, int]:
        """(micro-batch, chunk) of chunk-backward k: the forward order's micro-batch, the chunk reversed."""
        mb, chunk = self.table[k % len(self.table)]
        return mb, self.v - 1 - chunk

    def received_for(self, k: int) -> tuple[int, int] | None:
        """recv_tensor_from_previous_stage(k, forward=False): (micro-batch, chunk) of the gradient received after
        backward k, or None: a rank before the last receives the next backward's; the last, the first rank's
        gradient of its chunk c for its chunk c - 1, p - 1 backwards behind."""
        if not self.last:
            return self.backward(k + 1)
        if k < self.p - 1:
            return None
        mb, chunk = self.backward(k - (self.p - 1))
        return None if chunk == 0 else (mb, chunk - 1)


@lru_cache(maxsize=1024)
def held(rank: int, p: int, v: int, m: int, group: int, overlap: bool = True, flush: bool = False) -> Counts:
    """Replay the interleaved schedule's holders (the module's note) on rank `rank`: `overlap`
    --overlap-p2p-communication, `flush` --overlap-p2p-communication-warmup-flush (with `overlap`)."""
    order = _Order(interleaved_schedule(m, v, group), p, v, rank == p - 1)
    warmup = interleaved_warmup(rank, p, v, m, group)
    if warmup == m * v:  # the cool-down's first backward: its gradient (l. 1790); with the flush the next's (l. 1827)
        return Counts((0, 0), (0, 0) if order.last else (2 if flush else 1, 0))
    slots = group - p + 1 if order.last else 1
    buffer: list[tuple[int, int] | None] = [None] * slots  # overlap: bwd_recv_buffer
    queue = [] if order.last else [order.backward(0)]  # received, not yet popped (the warm-up's last receive)
    if overlap and not order.last:
        buffer[-1] = order.backward(0)
    done: set[tuple[int, int]] = set()  # chunk-backwards run
    latest = {chunk: (mb, chunk) for mb, chunk in order.table[:warmup]}  # each chunk's model: its latest input
    kept = _warmup_receive(order.table, warmup, rank, p, v) if overlap and not flush else None  # input_tensor
    no_grad = {None} | ({(i, 0) for i in range(m)} if rank == 0 else set())  # the first chunk's embedding input
    last_grad, best = None, (0, 0)  # input_tensor_grad
    for k in range(m * v - warmup):
        mb, chunk = order.table[warmup + k]
        latest[chunk] = (mb, chunk)
        inputs = ({x for x in latest.values() if x in done} | ({kept} & done) | {last_grad}) - no_grad
        received = set(queue) | ({b for b in buffer if b is not None} if overlap else set())
        if len(received) + len(inputs) > sum(best):
            best = (len(received), len(inputs))
        last_grad = order.backward(k)
        if last_grad in queue:  # the last rank's last chunk pops none (its loss starts the backward)
            queue.remove(last_grad)
        done.add(last_grad)
        got = order.received_for(k)
        if got is not None:
            queue.append(got)
        if overlap:
            buffer[k % slots], buffer[(k + 1) % slots] = got, None
    # the forward's end and the next backward's start hold the same (the backward pops its gradient into a local)
    return Counts(best, best)


def _warmup_receive(table: list[tuple[int, int]], warmup: int, rank: int, p: int, v: int) -> tuple[int, int] | None:
    """(micro-batch, chunk) of the input the warm-up's last iteration receives (recv_tensor_from_previous_stage(W - 1,
    forward=True)), or None: rank r > 0 receives the next forward's; rank 0 the output of the last rank's chunk c for
    its chunk c + 1, p - 1 forwards behind."""
    k = warmup - 1
    if rank:
        return table[k + 1] if k + 1 < len(table) else None
    if k < p - 1:
        return None
    mb, chunk = table[k - (p - 1)]
    return None if chunk == v - 1 else (mb, chunk + 1)


def interleaved_gradients(arch: Architecture, training: Training, par: Parallel, sp: StageParameters,
                          m: int) -> Held:
    """The gradients Megatron's interleaved schedule holds at a rank's forward and backward peaks (the module's
    note; training.overlap_p2p_comm and its warm-up flush); none elsewhere."""
    if training.framework != "megatron" or training.mode != "training" or par.pp == 1 \
            or par.schedule != "interleaved" or par.vpp < 2 or m < 1:
        return Held()
    group = microbatch_group(par, training.microbatch_group_size)
    counts = held(sp.stage, par.pp, par.vpp, m, group, training.overlap_p2p_comm,
                  training.overlap_p2p_comm and training.overlap_p2p_comm_warmup_flush)
    hidden, formula = stage_input(arch, training, par)
    where = f"rank {sp.stage} of {par.pp}, {par.vpp} chunks, {m} micro-batches in groups of {group}"

    def listed(pair: tuple[int, int]) -> tuple[Component, ...]:
        out = ()
        if pair[0]:
            out += (component("buffers", LABEL, pair[0] * hidden, f"{pair[0]} x {formula} ({where})", SOURCE),)
        if pair[1]:
            out += (component("buffers", INPUT_LABEL, pair[1] * hidden, f"{pair[1]} x {formula} ({where})",
                              SOURCE),)
        return out
    return Held(listed(counts.forward), listed(counts.backward))


def schedule_gradients(arch: Architecture, training: Training, par: Parallel, sp: StageParameters, m: int) -> Held:
    """What Megatron's pipeline schedule holds of activation gradients at a stage's forward and backward peaks:
    1F1B's (megatron_pp_grad.py) or the interleaved schedule's (this module)."""
    one = received_gradients(arch, training, par, sp, m)
    two = interleaved_gradients(arch, training, par, sp, m)
    return Held(one.forward + two.forward, one.backward + two.backward)


def schedule_bytes(arch: Architecture, training: Training, par: Parallel, sp: StageParameters,
                   m: int) -> tuple[int, int]:
    """`schedule_gradients`' bytes (forward, backward)."""
    gradients = schedule_gradients(arch, training, par, sp, m)
    return sum(c.bytes for c in gradients.forward), sum(c.bytes for c in gradients.backward)
