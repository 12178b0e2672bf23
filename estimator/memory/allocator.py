"""PyTorch's CUDA caching allocator, replayed: the reserved memory (`max_memory_reserved`) that a
sequence of allocations and frees leaves, segment by segment.

The rules are those of c10/cuda/CUDACachingAllocator.cpp with its constants in
c10/core/AllocatorConfig.h (torch 2.11 to 2.13, the default configuration: no max_split_size, no
roundup_power2_divisions):
- every request is rounded up to a multiple of 512 bytes (`round_size`, kMinBlockSize);
- requests up to 1 MiB (kSmallSize) are served from the small pool, whose segments are 2 MiB
  (kSmallBuffer); larger ones from the large pool (`get_pool`);
- a new large segment is 20 MiB (kLargeBuffer) for a request under 10 MiB (kMinLargeAlloc), else the
  request rounded up to 2 MiB (kRoundLarge) (`get_allocation_size`);
- a request takes the smallest cached free block that holds it, the lowest address among equals
  (`get_free_block`: `pool.blocks.lower_bound`, blocks ordered by stream, size, address); only when
  none does is a new segment allocated (cudaMalloc: reserved grows);
- a block larger than the request is split when the rest is at least 512 bytes (small pool) or more
  than 1 MiB (large pool) (`should_split`); otherwise the whole block is handed out;
- a freed block merges with its free neighbours in the same segment (`try_merge_blocks`); segments
  are never given back (only `empty_cache` or an out-of-memory retry does that);
- each CUDA stream has blocks of its own: a request takes only a free block made on its stream
  (`get_free_block`: the pool's `lower_bound` on the search key (stream, size), then `(*it)->stream !=
  p.stream()` gives up), and a block freed goes back to the stream that made it (`free_block`), so
  another stream's requests never reuse it (`malloc(nbytes, stream)`: 0 is the current stream; the
  replays of expandable segments run on one stream).
With expandable segments (PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True), as the same file reads at pytorch
commit 001074d2 (torch 2.13's c10/core/AllocatorConfig.h keeps the constants and names the large page
`large_segment_size()`, 20 MiB by default; the three H200 runs of torch 2.11 replay to the byte:
tests/test_allocator.py):
- each pool (the small one too) of a stream has one segment, a range of virtual addresses reserved once
  (`find_expandable_block`: 1 1/8 of the GPU's memory) and backed by physical pages as it grows, in pages of
  2 MiB (kSmallBuffer) in the small pool and 20 MiB (kLargeBuffer) in the large one, whatever the GPU
  (`ExpandableSegment::map`: one cuMemCreate handle of `segment_size_` per page; Note [Expandable Segments]:
  the GPU's own pages are 2 MiB, which both sizes are multiples of); only mapped pages count as reserved
  (`map_block`: reserved_bytes);
- a request no free block holds maps the pages it lacks at the segment's lowest unmapped address, its end,
  merged with the free block before it (`alloc_block` -> `try_allocate_expandable_block(p.size())`: the
  rounded request, not `get_allocation_size`'s, page by page with `map_block`);
- any block, in either pool, is split when at least 512 bytes are left (`should_split`: `is_small ||
  expandable_segments()`), not only when more than 1 MiB is;
- best fit counts the free block at the segment's end as the size it can grow to (`get_free_block`:
  `expandable_size`, its size plus the unmapped rest), so a request it holds takes the next larger free
  block when there is one;
- pages are unmapped only by `empty_cache` or an out-of-memory retry (`release_blocks` -> `unmap_block`),
  neither of which a replay runs.
Where cudaMalloc puts a segment decides which of two free blocks of one size a request takes (the lower address).
The replay's segments lie in the order they are made (`_new_segment`), each above the last; with `descending`,
each below the last. The H200 (driver 580, torch 2.11) gave a run's activation segments descending addresses:
torch.cuda.memory_snapshot() lists segments by address (CUDACachingAllocator.cpp `snapshot`: sorted by
`address`), and LoRA on Llama-3.2-1B with recompute and eager attention lists its segments of 1 GiB and more as
2048, 2048, 2004, 2048, 2048, 2048, 1024, 1024 MiB, the reverse of the order in which the fake harness's recorded
sequence makes them with descending addresses (tests/data/measured/allocator_order); so replayed, that sequence
reaches the GPU's reserved peak to the byte on that run and its attention-dropout twin (-12.1% and -0.3%
ascending), and the 39 recorded HF sequences with default segments (tests/data/measured/allocator) within 4.2% (12.7% ascending;
tests/test_segment_order.py). The H200's own allocator histories of 21 HF runs (validation/gpu/hf_history.py,
tests/data/measured/gpu_history) confirm it: each segment of 1 GiB and more below the one made before, and the
GPU's own requests replayed descending (with `empty_cache` where the run called it) reach its reserved peak to the
byte on 19 (two 2 MiB under), where ascending eight miss by more than 1%. The estimate's replays keep ascending
addresses: their sequences are not the recorded ones, and descending addresses move them as much either way
(memory/reserved.py's note).
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections import OrderedDict
from typing import NamedTuple

MIN_BLOCK = 512  # kMinBlockSize
SMALL_SIZE = 1 << 20  # kSmallSize
SMALL_BUFFER = 2 << 20  # kSmallBuffer
LARGE_BUFFER = 20 << 20  # kLargeBuffer
MIN_LARGE_ALLOC = 10 << 20  # kMinLargeAlloc
ROUND_LARGE = 2 << 20  # kRoundLarge
# a free block in its pool's sorted list: size << KEY_SHIFT | address, one int (ordered as (size, address), the
# order `get_free_block` searches, and compared faster than a pair); addresses stay below 2**64
KEY_SHIFT = 64
ADDRESS = (1 << KEY_SHIFT) - 1
# `closed`'s steps: a size (> 0) requested and kept, `~i` (< 0) the i-th kept one freed, TRANSIENT + size a size
# requested and freed at once
TRANSIENT = 1 << 56


def round_size(size: int) -> int:
    return max(MIN_BLOCK, -(-size // MIN_BLOCK) * MIN_BLOCK)


def allocation_size(size: int) -> int:
    """The size of the segment cudaMalloc'd for a request no cached block holds."""
    if size <= SMALL_SIZE:
        return SMALL_BUFFER
    if size < MIN_LARGE_ALLOC:
        return LARGE_BUFFER
    return -(-size // ROUND_LARGE) * ROUND_LARGE


def should_split(block_size: int, size: int, small: bool, expandable: bool = False) -> bool:
    rest = block_size - size
    return rest >= MIN_BLOCK if small or expandable else rest > SMALL_SIZE


class _Block:
    __slots__ = ("addr", "size", "free", "prev", "next", "small")

    def __init__(self, addr: int, size: int, small):
        self.addr, self.size, self.small = addr, size, small  # small: the pool's key (`_pool_key`)
        self.free, self.prev, self.next = True, None, None


class CachingAllocator:
    """Replays malloc/free; `reserved_peak` and `allocated_peak` as torch.cuda's statistics count them."""

    def __init__(self, expandable: bool = False, descending: bool = False):
        self.expandable = expandable
        self.descending = descending  # each new segment below the last (module docstring)
        # pool -> sorted keys (size << KEY_SHIFT | addr) of free blocks; the pool of the current stream is keyed by
        # small?, another stream's by (small?, stream)
        self._free = {True: [], False: []}
        self._blocks: dict[int, _Block] = {}  # addr -> block
        self._tail = {True: None, False: None}  # expandable: the last block of each pool's segment
        self._next_addr = 0
        self.reserved = self.allocated = 0
        self.reserved_peak = self.allocated_peak = 0
        self.segments = 0

    # --- the free lists ---------------------------------------------------------------------------
    def pools(self) -> tuple:
        """The free blocks of every pool, in a fixed order: (key, ((size, addr), ...))."""
        return tuple((str(key), tuple((k >> KEY_SHIFT, k & ADDRESS) for k in blocks))
                     for key, blocks in sorted(self._free.items(), key=str))

    def _insert(self, block: _Block) -> None:
        insort(self._free[block.small], block.size << KEY_SHIFT | block.addr)

    def _remove(self, block: _Block) -> None:
        pool = self._free[block.small]
        del pool[bisect_left(pool, block.size << KEY_SHIFT | block.addr)]

    # --- segments ---------------------------------------------------------------------------------
    def _new_segment(self, size: int, small: bool) -> _Block:
        if self.descending:  # below the last, from the top of the addresses a key holds
            self._next_addr -= size + (1 << 40)
            block = _Block((1 << 63) + self._next_addr, size, small)
        else:
            block = _Block(self._next_addr, size, small)
            self._next_addr += size + (1 << 40)  # segments are not contiguous
        self._blocks[block.addr] = block
        self.segments += 1
        self._grow(size)
        return block

    def empty_cache(self) -> None:
        """torch.cuda.empty_cache: every free block that is a whole segment is given back to the driver
        (CUDACachingAllocator.cpp release_cached_blocks -> release_blocks: blocks with neither prev nor next); a
        segment holding any live block stays, split as it is. Default segments only (expandable segments unmap
        their free pages instead: not replayed)."""
        if self.expandable:
            raise ValueError("empty_cache is replayed for default segments only")
        for key, pool in self._free.items():
            kept = []
            for k in pool:
                block = self._blocks[k & ADDRESS]
                if block.prev is None and block.next is None:
                    del self._blocks[block.addr]
                    self.reserved -= block.size
                    self.segments -= 1
                else:
                    kept.append(k)
            self._free[key] = kept

    def _grow(self, size: int) -> None:
        self.reserved += size
        self.reserved_peak = max(self.reserved_peak, self.reserved)

    def _expand(self, size: int, small: bool) -> _Block:
        """Expandable segments: map pages at the pool's segment end; the free block there grows."""
        page = SMALL_BUFFER if small else LARGE_BUFFER
        tail = self._tail[small]
        if tail is not None and tail.free:
            self._remove(tail)
            need = size - tail.size
            pages = -(-need // page) * page
            tail.size += pages
            self._grow(pages)
            return tail
        pages = -(-size // page) * page
        if tail is None:
            block = self._new_segment(pages, small)
        else:
            block = _Block(tail.addr + tail.size, pages, small)
            self._blocks[block.addr] = block
            block.prev, tail.next = tail, block
            self._grow(pages)
        self._tail[small] = block
        return block

    def _past_the_end(self, pool: list, i: int, small: bool) -> int:
        """Expandable segments: the best fit `pool[i]`, unless it is the free block at the segment's end and a
        larger free block follows (`get_free_block`: the end block's `expandable_size` is its size plus the
        unmapped rest of the segment, more than any other block's)."""
        tail = self._tail[small]
        if tail is not None and pool[i] & ADDRESS == tail.addr and i + 1 < len(pool):
            return i + 1
        return i

    # --- malloc and free --------------------------------------------------------------------------
    def malloc(self, nbytes: int, stream: int = 0) -> int:
        # `round_size` and `_best_fit` written out: a replay makes thousands of requests
        size = MIN_BLOCK if nbytes <= MIN_BLOCK else -(-nbytes // MIN_BLOCK) * MIN_BLOCK
        small = size <= SMALL_SIZE
        if stream:
            if self.expandable:
                raise ValueError("the replay of expandable segments runs on one stream")
            small = (small, stream)  # the key of that stream's pool; as a flag below, true
            pool = self._free.setdefault(small, [])
        else:
            pool = self._free[small]
        i = bisect_left(pool, size << KEY_SHIFT)
        if i < len(pool):
            if self.expandable:
                i = self._past_the_end(pool, i, small)
            block = self._blocks[pool.pop(i) & ADDRESS]
        elif self.expandable:
            block = self._expand(size, small)
        else:
            block = self._new_segment(allocation_size(size), small)
        rest_size = block.size - size
        tiny = small if not stream else small[0]
        if rest_size >= MIN_BLOCK if tiny or self.expandable else rest_size > SMALL_SIZE:  # `should_split`
            rest = _Block(block.addr + size, rest_size, small)
            after = block.next
            rest.prev, rest.next = block, after
            if after is not None:
                after.prev = rest
            block.next, block.size = rest, size
            self._blocks[rest.addr] = rest
            insort(pool, rest_size << KEY_SHIFT | rest.addr)
            if self.expandable and self._tail.get(small) is block:
                self._tail[small] = rest
        block.free = False
        self.allocated += block.size
        if self.allocated > self.allocated_peak:
            self.allocated_peak = self.allocated
        return block.addr

    def free(self, addr: int) -> None:
        # `_remove`, `_merge` and `_insert` written out, as in malloc
        blocks = self._blocks
        block = blocks[addr]
        block.free = True
        self.allocated -= block.size
        before, after = block.prev, block.next
        pool = self._free[block.small]
        if before is not None and before.free:
            del pool[bisect_left(pool, before.size << KEY_SHIFT | before.addr)]
            block = self._merge(before, block) if self.expandable else _joined(blocks, before, block)
        if after is not None and after.free:
            del pool[bisect_left(pool, after.size << KEY_SHIFT | after.addr)]
            block = self._merge(block, after) if self.expandable else _joined(blocks, block, after)
        insort(pool, block.size << KEY_SHIFT | block.addr)

    def transient(self, nbytes: int) -> None:
        """`free(malloc(nbytes))` with nothing between, on the current stream, without the two walks of the lists
        (a replay makes thousands). Free blocks never touch (a free merges with its free neighbours), so the block
        the request takes has taken neighbours; the request's split-off rest is free and merges back as the request
        is freed: the lists end as they were, but for a segment the request made (left free, whole). What the pair
        leaves is that, and the allocated peak of the moment between (the block's size, or the request's where
        `should_split` splits it)."""
        if self.expandable:
            self.free(self.malloc(nbytes))
            return
        size = MIN_BLOCK if nbytes <= MIN_BLOCK else -(-nbytes // MIN_BLOCK) * MIN_BLOCK
        small = size <= SMALL_SIZE
        pool = self._free[small]
        i = bisect_left(pool, size << KEY_SHIFT)
        if i < len(pool):
            held = pool[i] >> KEY_SHIFT
        else:
            block = self._new_segment(allocation_size(size), small)
            self._insert(block)
            held = block.size
        rest = held - size
        if rest >= MIN_BLOCK if small else rest > SMALL_SIZE:
            held = size
        if self.allocated + held > self.allocated_peak:
            self.allocated_peak = self.allocated + held

    def run_steps(self, steps: tuple) -> None:
        """A closed group's steps one by one (`closed_group`'s encoding: a size, TRANSIENT + a size, or ~i to free the
        i-th block taken)."""
        kept: list = []
        for op in steps:
            if op < 0:
                self.free(kept[~op])
            elif op < TRANSIENT:
                kept.append(self.malloc(op))
            else:
                self.transient(op - TRANSIENT)

    def closed(self, group: Closed) -> None:
        """Requests that are all freed again (`Closed`), each pool's before its frees. Every block they take is carved
        from a free block (free blocks never touch), so once all are freed each such free block is whole again and
        the lists are as they were, but for the segments the requests made (each free, whole). Which of two free
        blocks of one size a request takes changes neither what is split off nor whether a later request fits: the
        sizes alone decide those, and only of the free blocks as large as the pool's smallest request. So what the
        group leaves, its new segments and the allocated peak along it (`_closed_effect`), follows from those sizes,
        and is remembered by them (a pipeline's layers and micro-batches meet the same ones again and again)."""
        if self.expandable:  # `_expand` grows the segment's end block: replayed as it is
            self.run_steps(group.steps)
            return
        key = [group.steps]
        for small, floor in group.floors:
            pool = self._free[small]
            if small and pool and pool[-1] >> KEY_SHIFT >= group.small_room:
                key.append(ROOMY)
            else:
                key.append(tuple([k >> KEY_SHIFT for k in pool[bisect_left(pool, floor):]]))
        made, top = _remembered_effect(group, tuple(key))
        for block, small in made:
            self._insert(self._new_segment(block, small))
        if self.allocated + top > self.allocated_peak:
            self.allocated_peak = self.allocated + top

    def _merge(self, first: _Block, second: _Block) -> _Block:
        """`second` (the block after `first`) joins `first`; the segment's end moves with it."""
        _joined(self._blocks, first, second)
        if self._tail.get(first.small) is second:
            self._tail[first.small] = first
        return first


def _joined(blocks: dict, first: _Block, second: _Block) -> _Block:
    """`second` (the block after `first`) joins `first`."""
    first.size += second.size
    after = first.next = second.next
    if after is not None:
        after.prev = first
    del blocks[second.addr]
    return first


class Closed(NamedTuple):
    """Requests that are all freed again, each pool's before its frees (`CachingAllocator.closed`): `steps`, a size
    (> 0) requested and kept, `~i` (< 0) the i-th kept one freed, TRANSIENT + size requested and freed at once;
    `floors`: per pool it asks of, (small?, its smallest request's key: size << KEY_SHIFT); `table`: the steps as
    (kind, bytes or the kept one's number, the pool's place in `floors`), kind FREE, KEEP or TRANSIENT_STEP."""

    steps: tuple[int, ...]
    floors: tuple[tuple[bool, int], ...]
    table: tuple[tuple[int, int, int], ...]
    small_room: int  # a free small block this large holds all the group's small requests (`ROOMY`)


FREE, KEEP, TRANSIENT_STEP = 0, 1, 2  # `Closed.table`'s kinds
# The small pool's free sizes as a group's key where its largest free block holds all the group's small requests
# (`Closed.small_room`: those it keeps and the largest again): until its frees, which come after, each request
# takes the low end of the free block it splits, so that block's free end is one piece at least as large as the
# next request, and none makes a segment; a small block is exactly its request (any rest of 512 bytes or more is
# split off), so which blocks they take changes nothing the group leaves. One block of this size stands for them.
ROOMY = (1 << 62,)


def closed_group(steps: tuple[int, ...]) -> Closed:
    """`steps` as a Closed group, each request's bytes rounded as malloc rounds them (`round_size`: the same
    blocks)."""
    rounded: list[int] = []
    floors: dict[bool, int] = {}
    for op in steps:
        if op > 0:
            transient = op >= TRANSIENT
            size = round_size(op - TRANSIENT if transient else op)
            floors[size <= SMALL_SIZE] = min(floors.get(size <= SMALL_SIZE, size), size)
            op = TRANSIENT + size if transient else size
        rounded.append(op)
    pools = sorted(floors)
    table = tuple((FREE, ~op, 0) if op < 0 else
                  (TRANSIENT_STEP, op - TRANSIENT, pools.index(op - TRANSIENT <= SMALL_SIZE)) if op >= TRANSIENT else
                  (KEEP, op, pools.index(op <= SMALL_SIZE)) for op in rounded)
    smalls = [size for kind, size, _ in table if kind != FREE and size <= SMALL_SIZE]
    room = sum(size for kind, size, _ in table if kind == KEEP and size <= SMALL_SIZE) + max(smalls, default=0)
    return Closed(tuple(rounded), tuple((small, floors[small] << KEY_SHIFT) for small in pools), table, room)


CLOSED_EFFECTS = 4096  # the groups' effects remembered, least recently used out first (each a few hundred bytes)
_EFFECTS: OrderedDict = OrderedDict()  # (steps, each pool's free sizes from its floor) -> _closed_effect


def _remembered_effect(group: Closed, key: tuple) -> tuple:
    """`_closed_effect` of `group` on the free sizes of `key`, remembered (least recently used out first). Threads
    may share it: a value is the same whoever computed it, and an entry another thread dropped is no error."""
    effect = _EFFECTS.get(key)
    if effect is None:
        effect = _EFFECTS[key] = _closed_effect(group, [list(sizes) for sizes in key[1:]])
        while len(_EFFECTS) > CLOSED_EFFECTS:
            try:
                _EFFECTS.popitem(last=False)
            except KeyError:
                break
    else:
        try:
            _EFFECTS.move_to_end(key)
        except KeyError:
            pass
    return effect


def _closed_effect(group: Closed, pools: list[list[int]]) -> tuple[tuple[tuple[int, bool], ...], int]:
    """(the new segments in order: (bytes, small?), the most the group holds at once) of `group` on free blocks of
    these sizes (sorted, per pool of `group.floors`), as `CachingAllocator.malloc` would take them (the group's
    sizes are rounded: `closed_group`)."""
    made: list = []
    held: list = []  # each kept request's bytes (its block's)
    live = top = 0
    for kind, size, pool in group.table:
        if kind == FREE:
            live -= held[size]
            continue
        sizes = pools[pool]
        i = bisect_left(sizes, size)
        if i < len(sizes):
            block = sizes.pop(i)
        else:
            block = allocation_size(size)
            made.append((block, size <= SMALL_SIZE))
        rest = block - size
        used = size if (rest >= MIN_BLOCK if size <= SMALL_SIZE else rest > SMALL_SIZE) else block  # `should_split`
        if kind == TRANSIENT_STEP:  # back whole at once
            insort(sizes, block)
            if live + used > top:
                top = live + used
            continue
        if used == size and rest:
            insort(sizes, rest)
        held.append(used)
        live += used
        if live > top:
            top = live
    return tuple(made), top


EMPTY_CACHE = None  # replay's event key for torch.cuda.empty_cache()


def replay(events, expandable: bool = False, descending: bool = False) -> CachingAllocator:
    """Replay (key, +bytes) / (key, -bytes) events: a key's first + allocates it, a later + grows it
    (a storage `resize_`d: freed and allocated again at its new size), its - frees it; the key EMPTY_CACHE
    empties the cache. Returns the allocator with its peaks. `descending`: segments' addresses (module
    docstring)."""
    allocator = CachingAllocator(expandable, descending)
    live: dict[int, tuple[int, int]] = {}  # key -> (address, bytes)
    for key, delta in events:
        if key is EMPTY_CACHE:
            allocator.empty_cache()
            continue
        addr, size = live.pop(key, (None, 0))
        if addr is not None:
            allocator.free(addr)
        size += delta
        if size > 0:
            live[key] = (allocator.malloc(size), size)
    return allocator
