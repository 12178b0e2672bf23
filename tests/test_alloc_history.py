"""validation/gpu/alloc_history.py: a GPU allocator history turned into the fake harness's (key, +/- bytes) events,
so that both replay through estimator/memory/allocator.py alike."""

from validation.gpu.alloc_history import requests


def test_a_reused_address_is_a_new_block_and_only_completed_frees_count():
    """torch.cuda.memory._snapshot()'s device trace (torch 2.x: alloc, free_requested, free_completed,
    segment_alloc): two blocks at one address one after the other are two keys; a free counts when completed."""
    MiB = 1 << 20
    record = {"events": [
        ["segment_alloc", 0, 2048 * MiB, 0, []],
        ["alloc", 0, 1024 * MiB, 0, []],
        ["alloc", 1024 * MiB, 32 * MiB, 0, []],
        ["free_requested", 0, 1024 * MiB, 0, []],
        ["free_completed", 0, 1024 * MiB, 0, []],
        ["alloc", 0, 512 * MiB, 0, []],  # the address again: a new block
        ["free_completed", 0, 512 * MiB, 0, []],
    ]}
    assert requests(record) == [(0, 1024 * MiB), (1, 32 * MiB), (0, -1024 * MiB), (2, 512 * MiB), (2, -512 * MiB)]


def test_the_summary_replays_the_history_both_ways_and_lists_the_segments_made():
    """Two 2 MiB requests, the first freed, a 20 MiB segment for a 3 MiB request below the first segment: both
    address orders reserve 22 MiB; one segment of two lies below the one before."""
    from validation.gpu.alloc_history import summary

    MiB = 1 << 20
    record = {"reserved_peak_bytes": 22 * MiB, "events": [
        ["segment_alloc", 0x7F0000000000, 2 * MiB, 0, []],
        ["alloc", 0x7F0000000000, 1 * MiB, 0, []],
        ["free_completed", 0x7F0000000000, 1 * MiB, 0, []],
        ["segment_alloc", 0x7E0000000000, 20 * MiB, 0, []],
        ["alloc", 0x7E0000000000, 3 * MiB, 0, []],
    ]}
    assert summary(record) == {"reserved_peak_bytes": 22 * MiB, "replayed_ascending": 22 * MiB,
                               "replayed_descending": 22 * MiB, "segments_made": 2, "each_below_the_last": 1,
                               "large_segments_made_mib": []}
