"""validation/gpu/hf_history.py's reading of the caching allocator's history (the GPU run itself needs a GPU):
rows from a snapshot's device trace, the replay's events, and the cuBLAS workspaces found by the marker."""

from estimator.memory.allocator import replay
from validation.gpu.hf_history import ALLOC, FREE, MARKER_BYTES, SEGMENT, events, rows, workspaces

MiB = 1 << 20


def test_a_device_trace_as_rows_events_and_workspaces():
    trace = [
        {"action": "segment_alloc", "addr": 0, "size": 20 * MiB},
        {"action": "alloc", "addr": 0, "size": 4 * MiB},  # a weight
        {"action": "segment_alloc", "addr": 1 << 40, "size": 32 * MiB},
        {"action": "alloc", "addr": 1 << 40, "size": 32 * MiB},  # a workspace
        {"action": "alloc", "addr": 4 * MiB, "size": 2 * MiB},  # an activation
        {"action": "free_requested", "addr": 4 * MiB, "size": 2 * MiB},
        {"action": "free_completed", "addr": 4 * MiB, "size": 2 * MiB},
        {"action": "alloc", "addr": 4 * MiB, "size": 3 * MiB},  # the same address, a new tensor
        {"action": "segment_alloc", "addr": 2 << 40, "size": 20 * MiB},
        {"action": "alloc", "addr": 2 << 40, "size": MARKER_BYTES},
        {"action": "free_completed", "addr": 2 << 40, "size": MARKER_BYTES},
        {"action": "free_completed", "addr": 1 << 40, "size": 32 * MiB},  # clearCublasWorkspaces
        {"action": "alloc", "addr": 2 << 40, "size": MARKER_BYTES},
        {"action": "free_completed", "addr": 2 << 40, "size": MARKER_BYTES},
        {"action": "free_completed", "addr": 0, "size": 4 * MiB},  # the model's, at the end
    ]
    history = rows(trace)
    assert [r[0] for r in history] == [SEGMENT, ALLOC, SEGMENT, ALLOC, ALLOC, FREE, ALLOC, SEGMENT, ALLOC, FREE,
                                       FREE, ALLOC, FREE, FREE]
    ev = events(history)
    assert ev == [(1, 4 * MiB), (2, 32 * MiB), (3, 2 * MiB), (3, -2 * MiB), (4, 3 * MiB), (5, MARKER_BYTES),
                  (5, -MARKER_BYTES), (2, -32 * MiB), (6, MARKER_BYTES), (6, -MARKER_BYTES), (1, -4 * MiB)]
    assert workspaces(history) == [1]
    allocator = replay(ev)
    # 20 + 32 MiB: the activations and the markers fit the first segment (this made-up trace maps a third)
    assert (allocator.reserved_peak, allocator.segments) == (52 * MiB, 2)
