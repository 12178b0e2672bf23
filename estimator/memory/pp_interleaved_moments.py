"""torch.distributed.pipelining's interleaved 1F1B over FSDP2: a rank's layer inputs and unsharded
gradients, moment by moment, replayed from the schedule's own order.

ScheduleInterleaved1F1B (torch 2.6.0 and 2.13 schedules.py) runs a rank's chunk-forwards in rounds of
`microbatches_per_round` micro-batches through its chunks 0 .. v - 1, its chunk-backwards in the same
rounds through the chunks v - 1 .. 0; a warm-up of min((v - 1) x round + 2(p - 1 - rank), m v)
chunk-forwards (_get_warmup_ops), then a forward and a backward each step (_get_1f1b_rank_ops), then the
remaining backwards. FSDP2 under a pipeline makes a chunk's unsharded gradients (reduce dtype) at that
chunk's first backward (pp_first_backward.SOURCE): with one round (m = p, torchtitan's default) every
backward of the last chunk comes before the first of the earlier chunks, so while the rank holds its most
layer inputs only the last chunk's gradients exist, and by the time every gradient exists most inputs are
gone. The largest moment is the rank's backward peak, below in-flight inputs + every gradient.
The last rank (the loss's) is replayed too (pp_last_rank.py), its loss's moments left to
pp_unbegun.gradients_after_the_loss. Each moment also weighs the activation receive buffers and their .grad
held beyond the counted inputs (pp_receive.py), from each chunk's micro-batches in flight and backwarded.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Callable, NamedTuple

from .components import Component

SOURCE = ("torch 2.6.0 and 2.13 distributed/pipelining/schedules.py ScheduleInterleaved1F1B "
          "(_calculate_single_rank_operations, _get_warmup_ops, _get_1f1b_rank_ops)")


def rank_operations(rank: int, p: int, v: int, m: int) -> list[tuple[str, int]]:
    """(“F” or “B”, local chunk) of each of rank r's operations in running order, as torch's
    ScheduleInterleaved1F1B orders them (the idle slots left out). A new list each call, of the order
    remembered: a search asks for the same rank's order in every estimate of its shape."""
    return list(_rank_operations_once(rank, p, v, m))


@lru_cache(maxsize=1024)
def _rank_operations_once(rank: int, p: int, v: int, m: int) -> tuple[tuple[str, int], ...]:
    rounds = max(1, m // p)
    per_round = m // rounds
    warmup = min((v - 1) * per_round + 2 * (p - 1 - rank), m * v)  # _get_warmup_ops, multiply_factor 2
    steady = m * v - warmup

    forwards, backwards = [("F", c) for c in range(v)], [("B", c) for c in range(v)]  # one of each, shared

    def forward(step: int) -> tuple[str, int]:
        return forwards[(step // per_round) % v]

    def backward(step: int) -> tuple[str, int]:
        return backwards[v - 1 - ((step - warmup) // per_round) % v]

    ops = [forward(step) for step in range(warmup)]
    for step in range(warmup, warmup + steady):  # one forward, then one backward
        ops += [forward(step), backward(step)]
    ops += [backward(step) for step in range(warmup + steady, warmup + steady + warmup)]
    return tuple(ops)


class Moment(NamedTuple):
    """The rank's largest moment: its bytes (stored activations + unsharded gradients) and what it is."""

    bytes: float
    layers_held: int  # layers' inputs held, over the micro-batches
    chunks_begun: tuple[int, ...]  # chunks whose gradients exist
    what: str
    received: float = 0.0  # the receive buffers and .grad beyond the counted inputs (pp_receive.py)
    in_flight: tuple[int, ...] = ()  # each chunk's micro-batches forwarded, not yet backwarded
    done: tuple[int, ...] = ()  # ... and backwarded


def counted_operations(ops: list[tuple[str, int]], v: int) -> tuple[tuple[str, int, tuple, tuple], ...]:
    """Each operation with the chunks' counts while it runs: (kind, chunk, in_flight, done); a forward's
    micro-batch is in flight, a backward's too until it ends (remembered: every estimate replays the same)."""
    return _counted_once(tuple(ops), v)


@lru_cache(maxsize=1024)
def _counted_once(ops: tuple[tuple[str, int], ...], v: int) -> tuple[tuple[str, int, tuple, tuple], ...]:
    in_flight, done, out = [0] * v, [0] * v, []
    for kind, c in ops:
        if kind == "F":
            in_flight[c] += 1
            out.append((kind, c, tuple(in_flight), tuple(done)))
        else:
            out.append((kind, c, tuple(in_flight), tuple(done)))
            in_flight[c] -= 1
            done[c] += 1
    return tuple(out)


def counts_at_top(ops: list[tuple[str, int]], sizes: tuple[int, ...],
                  received: tuple[float, ...]) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(in flight, backwarded) per chunk at the forward that holds the most layers' inputs and, of those, the most
    receive buffers and .grad (`received`: their bytes at each operation, pp_receive.Receiving.along)."""
    layers, best, at = 0, (-1, -1.0), ((), ())
    for (kind, c, in_flight, done), rx in zip(counted_operations(ops, len(sizes)), received):
        layers += sizes[c] if kind == "F" else -sizes[c]
        if kind == "F" and (layers, rx) > best:
            best, at = (layers, rx), (in_flight, done)
    return at


def most_received(ops: list[tuple[str, int]], v: int, received: tuple[float, ...],
                  chunk: int | None = None) -> Moment:
    """The backward start (of `chunk`'s backwards, or any) whose receive buffers and .grad (`received`, as
    `counts_at_top`'s) are the most: where the charged moment is not replayed (the loss's, on the last rank)."""
    best = Moment(0.0, 0, (), "", -1.0)
    for (kind, c, in_flight, done), rx in zip(counted_operations(ops, v), received):
        if kind == "B" and chunk in (None, c) and rx > best.received:
            best = Moment(0.0, 0, (), f"chunk {c}'s backward", rx, in_flight, done)
    return best


def largest_moment(ops: list[tuple[str, int]], sizes: tuple[int, ...], held: Callable[[float], int],
                   layer_grad: float, chunk_grads: tuple[float, ...], root_grad: float,
                   head_grad: float = 0.0, received: tuple[float, ...] | None = None) -> tuple[Moment, int]:
    """The largest of a rank's moments and the most layers' inputs it holds at once. `held(x)`: the stored
    activations of x whole stacks; `chunk_grads`: each chunk's unsharded gradients, the root unit's
    (`root_grad`, the embedding's: chunk 0 of rank 0) included, made at the end of the chunk's first backward;
    `layer_grad`: one unit's, made at the first backward's start; `head_grad`: the last rank's root unit's (final
    norm and head, in the last chunk's `chunk_grads`), made at that chunk's first backward's start, before its
    layers' (autograd runs the head's backward first). `received`: the receive buffers' and .grad's bytes at each
    operation
    held beyond the counted inputs (pp_receive.Receiving.along), weighed in each moment; none when None."""
    total = sum(sizes)
    layers, begun, top = 0, set(), 0
    best = Moment(0.0, 0, (), "")
    counts: tuple = ((), ())
    rx = 0.0  # the receive buffers' bytes while the operation runs
    # a search replays thousands of operations per rank: `held` of each layer count is asked once (it is a pure
    # function of the count), the begun chunks' gradients summed when a chunk begins, and a moment's words
    # written only for the largest so far; the sums are the same, term for term, as at every operation
    held_at: dict[int, int] = {}
    begun_grads = sum(chunk_grads[c] for c in begun)

    def at(n: int, chunks: set, grads: float, extra: float, what: str, c: int) -> None:
        nonlocal best
        inputs = held_at.get(n)
        if inputs is None:
            inputs = held_at[n] = held(n / total)
        size = inputs + grads + extra + rx
        if size > best.bytes:
            best = Moment(size, n, tuple(sorted(chunks)), what.format(c), rx, *counts)

    for i, (kind, c, in_flight, done) in enumerate(counted_operations(ops, len(sizes))):
        rx = received[i] if received else 0.0
        if kind == "F" or c in begun:  # most operations: `at` with no extra, written out (a search runs millions)
            if kind == "F":
                layers += sizes[c]
                if layers > top:
                    top = layers
            inputs = held_at.get(layers)
            if inputs is None:
                inputs = held_at[layers] = held(layers / total)
            size = inputs + begun_grads + 0.0 + rx
            if size > best[0]:  # best.bytes
                what = f"chunk {c}'s forward" if kind == "F" else f"chunk {c}'s backward"
                best = Moment(size, layers, tuple(sorted(begun)), what, rx, in_flight, done)
            if kind == "B":
                layers -= sizes[c]
            continue
        # its first backward: one unit's gradient at the start; at the end every layer's, the root's not yet
        counts = (in_flight, done)
        head = head_grad if c == len(sizes) - 1 else 0.0
        at(layers, begun, begun_grads, layer_grad + head, "chunk {}'s first backward, at its start", c)
        ended = begun | {c}
        at(layers - sizes[c] + 1, ended, sum(chunk_grads[k] for k in ended), -root_grad if c == 0 else 0.0,
           "chunk {}'s first backward, at its first layer", c)
        begun.add(c)
        begun_grads = sum(chunk_grads[k] for k in begun)
        layers -= sizes[c]
    return best, top


def replayed_saving(G: float, par, sp, m: int, inflight: float, held: Callable[[float], int],
                    grads: tuple[float, ...], root_grad: float = 0.0, head_grad: float = 0.0,
                    received: tuple[float, ...] | None = None) -> tuple[Moment, int, int, int] | None:
    """A rank's largest replayed moment and what the charge (`inflight` micro-batches' inputs beside every
    unsharded gradient, `G` bytes an element) holds beyond it: (the moment, the layer inputs, the gradients, the
    most layers' inputs held at once); None where that most is not the in-flight count's (a micro-batch group
    other than torch's rounds). `grads`, `root_grad`, `head_grad`, `received` as `largest_moment`'s (the
    moment's receive buffers, `Moment.received`, are outside the charge)."""
    sizes = tuple(len(c) for c in sp.chunks)
    total = sum(sizes)
    ops = rank_operations(sp.stage, par.pp, par.vpp, m)
    moment, top = largest_moment(ops, sizes, held, G * sp.largest_layer_local, grads, root_grad, head_grad,
                                 received)
    if top != round(inflight * total):
        return None
    at_moment = held(moment.layers_held / total)
    not_made = int(round(G * sp.local - (moment.bytes - moment.received - at_moment)))
    return moment, held(inflight) - at_moment, not_made, top


def saving_parts(moment: Moment, inputs: int, not_made: int, top: int, total: int, where: str,
                 source: str) -> tuple[Component, ...]:
    """`replayed_saving`'s inputs and gradients as negative parts (keys "activations", "transient"), the empty
    ones left out; `where`: the moment, as the formulas name it."""
    begun = ", ".join(str(c) for c in moment.chunks_begun) or "none"
    parts = (Component("activations", "Layer inputs freed before the largest moment (interleaved schedule replayed)",
                       -inputs, f"-{inputs / 2**30:,.2f} GiB: {where} {moment.layers_held} of {top} layers' inputs "
                       f"are held ({moment.layers_held / total:g} micro-batches of the stack)", source),
             Component("transient", "Unsharded gradients not made by the largest moment (interleaved schedule "
                       "replayed)", -not_made, f"-{not_made / 2**30:,.2f} GiB: {where} the gradients of chunks "
                       f"{begun} exist", source))
    return tuple(c for c in parts if c.bytes)
