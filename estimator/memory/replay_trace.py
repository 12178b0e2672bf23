"""A micro-batch's forward or backward, recorded once as the allocator requests it makes and replayed from that
record: what a pipeline's replay repeats 64 or 128 times per stage and step (megatron_replay.py).

A walk over the ledger (megatron_replay._Walk) makes the same requests in the same order for every micro-batch
once what it makes only once is made (the global memory buffer at the first forward, TE's dummy weight gradients
at the first backward): its choices depend on the configuration, never on the addresses the allocator returns. So
one forward and one backward are recorded as they run (the sizes asked for; each block freed named by its place
among the micro-batch's requests) and the rest replayed from the record: the allocator sees the same calls in the
same order, without the walk's work around them. A request freed at once (`free(malloc(n))`) is replayed as the
allocator's `transient`, and a run of requests that frees all it requests and nothing else, each pool's requests
before its frees (a layer recomputed and its tensors dropped), as its `closed` (`fold`): the same effect on the
allocator's lists, segments and peaks, without the walk through each block.

A record names each block by its place in the micro-batch's list of blocks: the forward's requests, then the
backward's own. `Trace.ops`: a size (> 0) to request and append; `~place` (< 0) to free; `TRANSIENT + size` a
request freed at once.
"""

from __future__ import annotations

from typing import NamedTuple

from .allocator import SMALL_SIZE, TRANSIENT, Closed, closed_group

GROUP = 1 << 57  # `GROUP + i`: the trace's i-th closed group of requests (`Trace.groups`)
SHORTEST_GROUP = 3  # requests a group holds at least (a shorter one costs more as a group than as it is)


class Trace(NamedTuple):
    """One recorded forward or backward: its ops, and which pool (small or large) each block it appends lives in;
    `program`: the ops with each closed group of requests (`fold`) as one `GROUP + i`, `groups[i]` its steps (the
    allocator's `closed`) and the places its requests take."""

    ops: tuple[int, ...]
    small: tuple[bool, ...]  # per block the trace appends, in order: a request of at most 1 MiB (the small pool)
    program: tuple[int, ...] = ()
    groups: tuple[tuple[Closed, tuple[None, ...]], ...] = ()

    def only(self, small: bool, before: tuple[bool, ...] = ()) -> tuple[int, ...]:
        """The ops of one pool (its pool's blocks: `before`, the forward's, then this trace's); another pool's request
        keeps its place in the list as 0 (`run` appends None for it)."""
        pools = before + self.small
        out = []
        for op in self.ops:
            if op < 0:
                if pools[~op] == small:
                    out.append(op)
            elif op >= TRANSIENT:
                if (op - TRANSIENT <= SMALL_SIZE) == small:
                    out.append(op)
            else:
                out.append(op if (op <= SMALL_SIZE) == small else 0)
        return tuple(out)


def run(allocator, ops, blocks: list, groups: tuple = ()) -> list:
    """Replay `ops` (a Trace's ops, or its program with its groups) through the allocator; the blocks they make are
    appended to `blocks` (returned)."""
    malloc, free, transient, append = allocator.malloc, allocator.free, allocator.transient, blocks.append
    for op in ops:
        if op < 0:
            free(blocks[~op])
        elif op == 0:
            append(None)  # another pool's block (`Trace.only`)
        elif op < TRANSIENT:
            append(malloc(op))
        elif op < GROUP:
            transient(op - TRANSIENT)
        else:
            group, places = groups[op - GROUP]
            allocator.closed(group)
            blocks += places  # freed within the group: no later op names them
    return blocks


def folded(trace: Trace, first: int) -> Trace:
    """The trace with its program and groups (`fold`); `first`: the place its first request takes."""
    return trace._replace(**dict(zip(("program", "groups"), fold(trace.ops, first))))


def fold(ops: tuple[int, ...], first: int) -> tuple[tuple[int, ...], tuple]:
    """(program, groups) of a trace whose first request takes place `first`: each run of ops that frees all it
    requests and nothing else, each pool's requests before its frees (allocator.closed), made one op."""
    pools, place = {}, first  # place -> small pool?
    freed = {~op for op in ops if op < 0}
    for op in ops:
        if 0 < op < TRANSIENT:
            pools[place] = op <= SMALL_SIZE if place in freed else None  # None: held past the trace
            place += 1
    program: list[int] = []
    groups: list = []
    place, k = first, 0
    while k < len(ops):
        steps = _closed(ops, k, place, pools) if 0 < ops[k] < TRANSIENT else None
        if steps is None:
            program.append(ops[k])
            place += 0 < ops[k] < TRANSIENT
            k += 1
            continue
        kept = sum(1 for op in steps if 0 < op < TRANSIENT)
        program.append(GROUP + len(groups))
        groups.append((closed_group(steps), (None,) * kept))
        place += kept
        k += len(steps)
    return tuple(program), tuple(groups)


def _closed(ops, k: int, place: int, pools: dict) -> tuple[int, ...] | None:
    """The steps of the closed group that starts at ops[k] (its places renumbered from 0), or None."""
    local: dict[int, int] = {}  # place -> the group's own number
    steps: list[int] = []
    open_, freed = set(), set()  # places held; pools that have freed
    for op in ops[k:]:
        if op < 0:
            if ~op not in open_:
                return None
            open_.discard(~op)
            freed.add(pools[~op])
            steps.append(~local[~op])
        else:
            size = op if op < TRANSIENT else op - TRANSIENT
            if (size <= SMALL_SIZE) in freed:  # a request after its pool's frees: sizes alone do not decide it
                return None
            if op < TRANSIENT:
                if pools[place] is None:  # held past the trace: no group around it closes
                    return None
                local[place] = len(local)
                open_.add(place)
                place += 1
            steps.append(op)
        if not open_:
            requests = sum(1 for s in steps if s > 0)
            return tuple(steps) if requests >= SHORTEST_GROUP else None
    return None


class Recorder:
    """Records what a program (reserved._Program) asks of its allocator while a forward or backward runs:
    `with Recorder(program, held) as r: walk.backward(...)`; `held`: the blocks the micro-batch holds from its
    forward, in their places. `valid` is False where the record cannot be replayed (a request on another stream,
    or a free of a block the micro-batch does not hold)."""

    def __init__(self, program, held: list | None = None):
        self.program = program
        self.held = len(held or ())
        self.blocks = list(held or ())
        self._where = {b: i for i, b in enumerate(self.blocks)}  # the later place wins: an address used again
        self.ops: list[int] = []
        self.valid = True

    def __enter__(self) -> Recorder:
        program = self.program
        self._saved = program._malloc, program._free
        malloc, free = self._saved

        def recorded_malloc(nbytes: int, stream: int = 0) -> int:
            if stream:
                self.valid = False
            block = malloc(nbytes, stream)
            self._where[block] = len(self.blocks)
            self.blocks.append(block)
            self.ops.append(nbytes)
            return block

        def recorded_free(block: int) -> None:
            place = self._where.get(block)
            if place is None:
                self.valid = False
            else:
                self.ops.append(~place)
            free(block)

        program._malloc, program._free = recorded_malloc, recorded_free
        return self

    def __exit__(self, *exc) -> None:
        self.program._malloc, self.program._free = self._saved

    def trace(self) -> tuple[Trace, list[int]]:
        """The record as a Trace (each request freed at once a `transient`, the others numbered after the held
        blocks), and the recorded places of the blocks it keeps (the micro-batch's list of blocks is the held ones,
        then `[recorder.blocks[i] for i in kept]`)."""
        raw, ops, kept, small = self.ops, [], [], []
        renumber = list(range(self.held))  # recorded place -> the trace's place (-1: freed at once)
        made = self.held  # the recorded place of the next request
        k = 0
        while k < len(raw):
            op = raw[k]
            if op > 0 and k + 1 < len(raw) and raw[k + 1] == ~made:  # requested and freed at once
                ops.append(TRANSIENT + op)
                renumber.append(-1)
                k += 2
            elif op > 0:
                renumber.append(self.held + len(kept))
                kept.append(made)
                small.append(op <= SMALL_SIZE)
                ops.append(op)
                k += 1
            else:
                place = renumber[~op]
                self.valid = self.valid and place >= 0  # a block freed twice: not a walk's record
                ops.append(~place)
                k += 1
            made += op > 0
        return Trace(tuple(ops), tuple(small)), kept


def live(forward: Trace) -> tuple[int, ...]:
    """The places of the forward's blocks still held when it ends (what its backward frees)."""
    freed = {~op for op in forward.ops if op < 0}
    return tuple(i for i in range(len(forward.small)) if i not in freed)


def matches(forward: Trace, backward: Trace) -> bool:
    """The backward frees exactly what the forward left held and all it makes itself: a micro-batch leaves nothing
    behind (else a steady state would grow, and the pipeline's replay could not take it as repeating)."""
    made = len(forward.small)
    freed = [~op for op in backward.ops if op < 0]
    own = set(range(made, made + len(backward.small)))
    return len(freed) == len(set(freed)) and set(freed) == set(live(forward)) | own
