"""The caching allocator's replay (estimator/allocator.py): its rules by hand, then whole training
steps' allocation sequences (recorded by the fake-tensor harness, validation/allocator_trace.py)
replayed against the reserved memory a real H200 reported for the same runs."""

import gzip
import json
from pathlib import Path

import pytest

from estimator.memory.allocator import CachingAllocator, allocation_size, replay, round_size

MiB = 1 << 20
TRACES = sorted((Path(__file__).parent / "data" / "measured" / "allocator").glob("*.json.gz"))


def test_requests_are_rounded_to_512_bytes():
    assert [round_size(n) for n in (1, 512, 513, 4096 + 1)] == [512, 512, 1024, 4608]


def test_segment_sizes():
    """kSmallBuffer for requests up to 1 MiB, kLargeBuffer under 10 MiB, else rounded to 2 MiB."""
    assert allocation_size(MiB) == 2 * MiB
    assert allocation_size(MiB + 512) == 20 * MiB
    assert allocation_size(10 * MiB - 512) == 20 * MiB
    assert allocation_size(10 * MiB) == 10 * MiB
    assert allocation_size(11 * MiB + 1) == 12 * MiB


def test_small_requests_share_a_two_mib_segment():
    a = CachingAllocator()
    for _ in range(4096):  # 4096 x 512 B = 2 MiB: one segment
        a.malloc(100)
    assert (a.reserved, a.segments) == (2 * MiB, 1)
    a.malloc(100)
    assert (a.reserved, a.segments) == (4 * MiB, 2)


def test_a_large_block_is_split_only_when_more_than_1_mib_is_left():
    a = CachingAllocator()
    x = a.malloc(4 * MiB)  # a 20 MiB segment: 4 MiB used, 16 MiB cached
    a.malloc(15 * MiB)  # fits the 16 MiB block; 1 MiB left is not more than kSmallSize: no split
    assert a.reserved == 20 * MiB and a.allocated == 20 * MiB
    a.free(x)
    a.malloc(2 * MiB)  # the freed 4 MiB block, split: 2 MiB left over 1 MiB
    assert a.allocated == (16 + 2) * MiB and a.reserved == 20 * MiB  # the 15 MiB request holds all 16


def test_best_fit_and_merging():
    a = CachingAllocator()
    blocks = [a.malloc(12 * MiB) for _ in range(3)]  # three 12 MiB segments
    a.free(blocks[0])
    a.free(blocks[2])
    a.malloc(12 * MiB)  # a cached 12 MiB block: no new segment
    assert a.reserved == 36 * MiB
    a.malloc(14 * MiB)  # none holds 14 MiB: a new segment
    assert a.reserved == 50 * MiB and a.reserved_peak == 50 * MiB


def test_freed_neighbours_merge_into_one_block():
    a = CachingAllocator()
    x, y = a.malloc(5 * MiB), a.malloc(5 * MiB)  # both in one 20 MiB segment (10 MiB left)
    assert a.reserved == 20 * MiB
    a.free(x)
    a.free(y)
    a.malloc(19 * MiB)  # the whole segment again, merged
    assert a.reserved == 20 * MiB


def test_expandable_segments_grow_in_20_mib_pages():
    a = CachingAllocator(expandable=True)
    x = a.malloc(30 * MiB)
    assert a.reserved == 40 * MiB
    a.free(x)
    a.malloc(50 * MiB)  # the free end block grows by one page
    assert a.reserved == 60 * MiB and a.segments == 1


def test_a_resized_storage_is_freed_and_allocated_again():
    a = replay([(1, 12 * MiB), (1, 2 * MiB), (1, -14 * MiB)])
    assert a.reserved_peak == 26 * MiB and a.allocated == 0


# The replay of the CPU run's sequence misses the GPU's reserved memory by more than 1% on these 8B-class
# runs (their allocated peaks equal the GPU's to the byte): what differs is the sequence, not the rules
# (the order in which the backward frees tensors, a CUDA kernel's temporaries the CPU run does not take,
# the model's initialisation on the GPU); on the small models every replay is within 1%.
KNOWN_REPLAY_GAPS = {
    "gemma-2-9b-bf16-adamw-recompute-eager-s4096-b1": "replay -2.0%",
    "llama-3.1-8b-amp-sgd-recompute-sdpa-s4096-b2": "replay +6.1%",
    "llama-3.1-8b-bf16-adamw-norecompute-eager-s2048-b1": "replay +1.8%",
    "llama-3.1-8b-bf16-adamw-norecompute-sdpa-s2048-b2": "replay -2.4%",
    "llama-3.1-8b-bf16-adamw-norecompute-sdpa-s4096-b1": "replay -2.4%",
    "llama-3.1-8b-bf16-adamw-recompute-sdpa-s4096-b1": "replay -4.9%",
    "qwen3-8b-bf16-adamw-norecompute-eager-s2048-b1": "replay +5.3%",
    "qwen3-8b-bf16-adamw-recompute-sdpa-s8192-b1": "replay -5.1%",
    "qwen3-8b-bf16-sgd-recompute-sdpa-s4096-b2": "replay -7.7%",
}


def load(path: Path) -> dict:
    with gzip.open(path, "rt") as f:
        return json.load(f)


def test_the_traces_are_there():
    """Every HF case run on the GPU with a fake-tensor twin (paged optimizers aside)."""
    assert len(TRACES) == 29
    ids = {p.name.removesuffix(".json.gz") for p in TRACES}
    assert {"llama-3.2-1b-bf16-adamw-recompute-sdpa-s4096-b2-expandable"} <= ids
    assert set(KNOWN_REPLAY_GAPS) <= ids


def test_median_replay_error():
    errors = sorted(abs(load(p)["simulated_reserved_bytes"] / load(p)["gpu_reserved_bytes"] - 1) for p in TRACES)
    assert errors[len(errors) // 2] <= 0.005


@pytest.mark.parametrize("path", TRACES, ids=lambda p: p.name.removesuffix(".json.gz"))
def test_replay_of_a_training_run_reserves_what_the_gpu_reserved(path):
    record = load(path)
    allocator = replay(record["events"], record["expandable_segments"])
    assert allocator.reserved_peak == record["simulated_reserved_bytes"]
    error = allocator.reserved_peak / record["gpu_reserved_bytes"] - 1
    if record["id"] in KNOWN_REPLAY_GAPS:
        assert abs(error) > 0.01, f"{record['id']} now within 1%: take it off KNOWN_REPLAY_GAPS"
    else:
        assert abs(error) <= 0.01


# --- the estimate's own ledger replayed (validation/reserved_replay.py, an experiment for #23) ---------
GPU = Path(__file__).parent / "data" / "measured" / "gpu"


def test_the_ledger_replayed_against_the_gpu_and_the_flat_share():
    """HF full fine-tuning runs measured on an H200: the estimate's allocated peak plus the cache a replay
    of its ledger leaves, against max_memory_reserved, beside the flat 10% the estimate reports. The
    replay is closer in median and under-estimates far less often, and misses by more than 10% on four
    runs (why it is not the estimate's number yet: validation/reserved_replay.py)."""
    import statistics

    from estimator import estimate_config
    from validation.reserved_replay import replayed_reserved

    replayed, flat = {}, {}
    for path in sorted(GPU.glob("*.json")):
        record = json.loads(path.read_text())
        if "probe" in record or record["config"]["training"].get("adapter"):
            continue
        estimate = estimate_config(record["config"])
        measured = record["measured"]["reserved_peak_bytes"]
        replayed[path.stem] = replayed_reserved(estimate) / measured - 1
        flat[path.stem] = estimate.reserved_peak_bytes / measured - 1
    assert len(replayed) == 35
    assert round(statistics.median(map(abs, replayed.values())), 3) == 0.031
    assert round(statistics.median(map(abs, flat.values())), 3) == 0.038
    assert sum(e < -0.05 for e in replayed.values()) == 4 and sum(e < -0.05 for e in flat.values()) == 10
    assert {case for case, e in replayed.items() if abs(e) > 0.10} == {
        "llama-3.1-8b-bf16-adamw-norecompute-eager-s2048-b1", "llama-3.2-1b-bf16-adamw-recompute-sdpa-s4096-b2-expandable",
        "llama-3.2-1b-bf16-adamw-recompute-sdpa-s4096-b2", "qwen2.5-0.5b-amp-adamw-recompute-sdpa-s4096-b1"}
