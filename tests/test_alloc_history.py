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
