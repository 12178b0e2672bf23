"""The pipeline replay's short cuts change nothing it finds: 1F1B replayed from recorded micro-batches, whole cycles
skipped and the small pool replayed alone (memory/one_f_one_b_replay.py, memory/replay_trace.py) give each stage's
cache and segments exactly as the walk over every micro-batch does; the allocator's `transient` leaves what
`free(malloc(n))` leaves, and its `closed` what the requests and frees of the group leave."""

from __future__ import annotations

import dataclasses

import pytest

from estimator import Parallel, Training, estimate
from estimator.memory import megatron_replay, one_f_one_b_replay
from estimator.memory.allocator import TRANSIENT, CachingAllocator, closed_group
from estimator.models.presets import get_architecture


def _walked(schedule, pp: int, rank: int, microbatches: int) -> None:
    """1F1B with every micro-batch run by the walk, nothing recorded or skipped (the reference)."""
    walk = schedule.walk
    warmup = min(pp - rank - 1, microbatches)
    waiting = [walk.forward() for _ in range(warmup)]
    for _ in range(microbatches - warmup):
        waiting.append(walk.forward())
        walk.backward(waiting.pop(0))
    for state in waiting:
        walk.backward(state)


def _caches(model: str, training: Training, parallel: Parallel) -> list[tuple[float, str]]:
    """Each stage's fragmentation component (bytes, formula: the segments), on a new architecture object."""
    result = estimate(dataclasses.replace(get_architecture(model)), training, parallel)
    out = []
    for stage in result.stages:
        c = next(c for c in stage.components if c.key == "fragmentation")
        assert "Megatron-Core's initialisation and two steps" in c.formula  # the replay ran
        out.append((c.bytes, c.formula))
    return out


CASES = [
    ("llama-3.2-1b", Training(seq_len=4096, global_batch_size=32, recompute="none"), Parallel(pp=4)),
    ("llama-3.2-1b", Training(seq_len=4096, global_batch_size=32, recompute="full"), Parallel(pp=4, dp=2,
                                                                                              zero_stage=1)),
    ("llama-3.1-405b", Training(seq_len=8192, global_batch_size=64, recompute="full"),
     Parallel(tp=8, pp=9, zero_stage=1)),
    ("qwen3-30b-a3b", Training(seq_len=2048, global_batch_size=32, moe_dispatcher="alltoall", moe_grouped_gemm=True),
     Parallel(tp=2, pp=2, ep=2, dp=2)),  # MoE under the all-to-all dispatcher (megatron_moe_replay.py's order)
]


@pytest.mark.parametrize("model,training,parallel", CASES)
def test_short_cuts_give_the_walks_caches(monkeypatch, model, training, parallel):
    skipped = []
    small_only = one_f_one_b_replay.Schedule._small_pool_only

    def counted(self, waiting, pairs):
        skipped.append(pairs)
        return small_only(self, waiting, pairs)

    monkeypatch.setattr(one_f_one_b_replay.Schedule, "_small_pool_only", counted)
    fast = _caches(model, training, parallel)
    assert sum(skipped) > 0  # the small pool alone replayed whole cycles of the large one
    monkeypatch.setattr(megatron_replay, "_one_f_one_b", _walked)
    assert fast == _caches(model, training, parallel)


def _twins(sizes: list[int], steps: int, spread: int):
    """Two allocators walked alike: a free 5.5 MiB block between taken ones (5 MiB takes it whole, 1 MiB or less is
    left), then at each step a request of `sizes` (plus up to `spread` - 1 times 512 B) kept, and every third step
    one of those freed; yields (a, b) after each step."""
    a, b = CachingAllocator(), CachingAllocator()
    for x in (a, b):
        gap = x.malloc(11 << 19)
        x.malloc(2 << 20)
        x.free(gap)
    held = ([], [])
    for step in range(steps):
        n = sizes[step % len(sizes)] + 512 * (step % spread)
        for x, kept in zip((a, b), held):
            kept.append(x.malloc(n))
            if step % 3 == 2:
                x.free(kept.pop(step % len(kept)))
        yield a, b


def _state(x: CachingAllocator) -> tuple:
    return x.pools(), x.allocated, x.allocated_peak, x.reserved, x.segments


def test_a_transient_leaves_what_malloc_and_free_leave():
    """Requests kept and freed in a mixed order (both pools, splits and whole blocks, new segments), with a
    transient of each size tried at every step against free(malloc()) on a twin allocator."""
    sizes = [300, 4 << 20, 700_000, 25 << 20, 1 << 20, 9 << 20, 512, (20 << 20) - 4096, 1_500_000, 64 << 20, 5 << 20]
    for a, b in _twins(sizes, 60, 7):
        for t in sizes:
            a.free(a.malloc(t))
            b.transient(t)
            assert _state(a) == _state(b)
    assert a.segments > 5  # new segments were made along the way, some by a transient


GROUPS = [  # a recompute's layer (the forward's, then the backward's shape: a transient before the frees)
    (33554432, 33554432, 37748736, 35651584, 524288, 33554432, 218103808, 109051904, ~0, ~1, ~2, ~3, ~4, ~5, ~6, ~7),
    (33554432, 37748736, 300_000, 218103808, TRANSIENT + 109051904, TRANSIENT + 4096, ~3, ~2, ~1, ~0),
    (5 << 20, 700_000, 5 << 20, TRANSIENT + (9 << 20), 3 << 20, ~0, ~3, ~1, ~2),  # 20 MiB segments, split and not
]


def test_a_closed_group_leaves_what_its_requests_and_frees_leave():
    """Each group on allocators that hold and have freed blocks of many sizes (so best fit splits some blocks,
    takes others whole and makes new segments), against the same requests and frees one by one."""
    sizes = [300, 4 << 20, 700_000, 25 << 20, 1 << 20, 9 << 20, 512, 33554432, 1_500_000, 64 << 20, 37748736]
    made = 0
    for a, b in _twins(sizes, 50, 5):
        for steps in GROUPS:
            before = a.segments
            a.run_steps(steps)
            made += a.segments - before
            b.closed(closed_group(steps))
            assert _state(a) == _state(b)
    assert made > 3  # some groups made segments
