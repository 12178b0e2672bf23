"""Megatron-Core's 1F1B (pipeline_parallel/schedules.py forward_backward_pipelining_without_interleaving) replayed
through the caching allocator, micro-batch by micro-batch, for megatron_replay.py: pp - rank - 1 warm-up forwards,
then a forward and the oldest micro-batch's backward by turns, then the cool-down backwards.

A long pipeline (64 or 128 micro-batches on each of 8 to 16 stages) makes hundreds of thousands of requests, so
the replay takes these short cuts, none of which changes what it finds (the peaks and the segments):
- once the walk makes the same requests for every micro-batch, a forward and a backward are recorded and replayed
  from the record (replay_trace.py), each run of requests all freed again within it (a layer recomputed, its
  tensors dropped) as one step whose effect follows from the free blocks' sizes (allocator.closed);
- the steady state repeats: where the allocator's free blocks and the waiting micro-batches' blocks are as they
  were some pairs ago, the replay is deterministic and repeats that cycle, reaching no new peak: whole cycles are
  skipped;
- the two pools (requests of at most 1 MiB, the rest: allocator.py) never share a block, so each repeats on its
  own: once the large pool repeats, the cycles left are replayed in the small pool alone. What the skipped large
  requests would add is known: the large pool ends each cycle as it began, its segments and its allocated bytes
  along the cycle as in the one just replayed; a small block is exactly its request (any rest of 512 bytes or
  more is split off), so the small pool's allocated bytes follow the requests, the same in every pair. The
  allocated peak of a skipped cycle is the replayed cycle's; only the small pool's segments can differ, and that
  pool is replayed. Once the small pool repeats too, what is left of the skipped cycles is skipped.
"""

from __future__ import annotations

from operator import itemgetter

from .replay_trace import Recorder, Trace, folded, live, matches, run

NO_PEAK = float("inf")  # the allocated peak while only the small pool is replayed: it sets none


class _Batch:
    """A micro-batch between its forward and its backward: the walk's state (None when replayed from a record)
    and its blocks in the record's places (None when the walk ran it unrecorded)."""

    __slots__ = ("state", "blocks")

    def __init__(self, state, blocks):
        self.state, self.blocks = state, blocks


class Schedule:
    """The micro-batches of a stage's steps, by the walk until a forward and a backward are recorded, then from
    the records."""

    def __init__(self, walk):
        self.walk = walk
        self.allocator = walk.program.allocator
        self.forward_trace: Trace | None = None
        self.backward_trace: Trace | None = None
        self.valid = True  # False: a record could not be replayed; the walk runs every micro-batch
        self._small: tuple | None = None  # the small pool's ops of a forward and a backward (`Trace.only`)
        self._live: dict[bool, tuple[int, ...]] = {}  # pool -> the places of a forward's blocks its backward frees
        self._held: dict = {}  # pool -> a micro-batch's blocks -> those of `_live` (`_picker`)
        self._template = None  # the walk's state of a recorded forward, its blocks as their places (`_template`)

    @property
    def recorded(self) -> bool:
        return self.backward_trace is not None

    def _made_once(self) -> tuple:
        """What the walk makes only once and has yet to make: from here on, are its requests the same each time?"""
        walk = self.walk
        return len(walk.pending), sum(len(d) for d in walk.dummies.values())

    def forward(self) -> _Batch:
        walk = self.walk
        if self.recorded or self.valid and self._template is not None:  # the backward's walk can take its state
            trace = self.forward_trace
            return _Batch(None, run(self.allocator, trace.program, [], trace.groups))
        if not self.valid or self._made_once()[0]:
            return _Batch(walk.forward(), None)
        with Recorder(walk.program) as recorder:
            state = walk.forward()
        trace, kept = recorder.trace()
        if not recorder.valid or (self.forward_trace is not None and trace.ops != self.forward_trace.ops):
            self.valid = False
            return _Batch(state, None)
        blocks = [recorder.blocks[i] for i in kept]
        if self.forward_trace is None:
            self.forward_trace = folded(trace, 0)
            self._template = _template(state, {b: i for i, b in enumerate(blocks)})
        return _Batch(state, blocks)

    def _state(self, batch: _Batch):
        """The walk's state of a micro-batch (rebuilt from its blocks where a record made it)."""
        return batch.state if batch.state is not None else _filled(self._template, batch.blocks)

    def backward(self, batch: _Batch) -> None:
        walk = self.walk
        if batch.blocks is not None and self.recorded:
            trace = self.backward_trace
            run(self.allocator, trace.program, list(batch.blocks), trace.groups)
            return
        if batch.blocks is None or not self.valid:
            walk.backward(self._state(batch))
            return
        before = self._made_once()
        state = self._state(batch)
        with Recorder(walk.program, batch.blocks) as recorder:
            walk.backward(state)
        trace, _ = recorder.trace()
        if self._made_once() != before:  # it made what is made once (TE's dummy gradients): the next may differ
            return
        if not recorder.valid or not matches(self.forward_trace, trace):
            self.valid = False
        else:  # made nothing once (nor will a later one): the next ones are the same
            forward = self.forward_trace
            self.backward_trace = folded(trace, len(forward.small))
            self._small = (forward.only(True), trace.only(True, forward.small))
            self._live = {pool: tuple(i for i in live(forward) if forward.small[i] == pool) for pool in (True, False)}
            self._held = {pool: _picker(places) for pool, places in self._live.items()}

    # --- the steady state -----------------------------------------------------------------------------------------
    def steady(self, waiting: list, pairs: int, key) -> None:
        """`pairs` forwards each followed by the oldest micro-batch's backward, whole cycles skipped. `key(waiting)`
        says what the walk's micro-batches hold (the original whole-allocator comparison, used until every waiting
        micro-batch is recorded)."""
        seen: dict = {}
        by_pools = False
        while pairs:
            waiting.append(self.forward())
            self.backward(waiting.pop(0))
            pairs -= 1
            if by_pools or self.recorded and all(b.blocks is not None for b in waiting):
                if not by_pools:  # from here on the large pool is compared alone
                    by_pools = True
                    seen.clear()
                now = self._pool_state(False, waiting)
                if now in seen:
                    cycle = seen[now] - pairs
                    self._small_pool_only(waiting, pairs - pairs % cycle)
                    pairs %= cycle
                    seen.clear()
            else:
                now = (self.walk.program.state(), key(waiting))
                if now in seen:
                    pairs %= seen[now] - pairs
                    seen.clear()
            seen[now] = pairs

    def _pool_state(self, small: bool, waiting: list) -> tuple:
        """One pool's free blocks and the waiting micro-batches' blocks in it: equal twice, the pool is as it was
        (its other blocks are those made before the steady state, never freed, and the segments around them: a
        segment made since holds only blocks named here)."""
        held = self._held[small]
        return tuple(self.allocator._free[small]), tuple([held(b.blocks) for b in waiting])

    def _small_pool_only(self, waiting: list, pairs: int) -> None:
        """`pairs` (whole cycles of the large pool) replayed in the small pool alone; the large blocks of the waiting
        micro-batches are then those they were (the cycles end where they began)."""
        if not pairs:
            return
        allocator, (forward, backward) = self.allocator, self._small
        large = [b.blocks for b in waiting]
        peak, allocator.allocated_peak = allocator.allocated_peak, NO_PEAK
        try:
            seen: dict = {}
            while pairs:
                waiting.append(_Batch(None, run(allocator, forward, [])))
                run(allocator, backward, list(waiting.pop(0).blocks))
                pairs -= 1
                now = self._pool_state(True, waiting)
                if now in seen:  # the small pool repeats too: the rest of the cycles is skipped
                    pairs %= seen[now] - pairs
                    seen.clear()
                seen[now] = pairs
        finally:
            allocator.allocated_peak = peak
        for batch, before in zip(waiting, large):
            blocks = batch.blocks
            for i in self._live[False]:
                blocks[i] = before[i]


def _template(state, places: dict):
    """The walk's state of a micro-batch (tuples and lists of blocks) with each block as its place among the
    micro-batch's blocks (`places`: block -> place), or None where one is not among them."""
    if state is None:
        return None
    if isinstance(state, (tuple, list)):
        out = [_template(x, places) if x is not None else None for x in state]
        if any(t is None and x is not None for t, x in zip(out, state)):
            return None
        return out if isinstance(state, list) else tuple(out)
    return (places[state],) if type(state) is int and state in places else None


def _filled(template, blocks: list):
    """The state that `template` stands for, with these blocks in their places."""
    if isinstance(template, list):
        return [_filled(t, blocks) if t is not None else None for t in template]
    if len(template) == 1 and type(template[0]) is int:
        return blocks[template[0]]
    return tuple(_filled(t, blocks) if t is not None else None for t in template)


def _picker(places: tuple[int, ...]):
    """blocks -> the blocks in these places (a tuple; one block alone where there is one place)."""
    return itemgetter(*places) if places else (lambda blocks: ())
