"""The caching allocator's own history of an HF case on a GPU: every request and free, in order, from CUDA's
start to the end of step 2, for what the fake harness's sequence (validation/allocator_trace.py) cannot settle,
such as where each cuBLAS workspace is made.

The case runs as `measure.py` measures it (the same `measure` call), with
`torch.cuda.memory._record_memory_history` on from just after CUDA's initialisation; the record keeps the
allocator's trace as [action, address, bytes] rows (ALLOC: the requested bytes, c10/cuda/CUDACachingAllocator.cpp
`record_trace(TraceEntry::ALLOC, ..., orig_size)`; FREE: `free_completed`, when the block goes back to its pool;
SEGMENT: a new segment's bytes). Replayed through estimator/memory/allocator.py (`events`) it gives the run's
max_memory_reserved; the cuBLAS workspaces are the requests clearCublasWorkspaces frees after step 2, right after a
marker request and before another (`workspaces`).

    python -m validation.gpu.hf_history --out DIR CASE_ID...   # on the GPU: DIR/<id>.history.json.gz
    python -m validation.gpu.hf_history --show FILE...          # here: the replay and the workspaces' places
"""

from __future__ import annotations

import argparse
import gzip
import json
import sys
from pathlib import Path

ALLOC, FREE, SEGMENT = 1, -1, 2
MARKER_BYTES = 1_536_512  # a request of a size no model makes, just before clearCublasWorkspaces
ACTIONS = {"alloc": ALLOC, "free_completed": FREE, "segment_alloc": SEGMENT}
MAX_ENTRIES = 2_000_000


def rows(trace: list[dict]) -> list[list[int]]:
    """A snapshot's device trace as [action, address, bytes] rows (the actions in ACTIONS, in order)."""
    return [[ACTIONS[e["action"]], int(e["addr"]), int(e["size"])] for e in trace if e["action"] in ACTIONS]


def events(history: list[list[int]]) -> list[tuple[int, int]]:
    """The rows as estimator.memory.allocator.replay's (key, +/- bytes): a request keyed by its address until
    freed (an address taken again later is a new key)."""
    out, live, serial = [], {}, 0
    for action, addr, size in history:
        if action == ALLOC:
            serial += 1
            live[addr] = (serial, size)
            out.append((serial, size))
        elif action == FREE and addr in live:
            key, size = live.pop(addr)
            out.append((key, -size))
    return out


def workspaces(history: list[list[int]]) -> list[int]:
    """The indices (into `events(history)`) of the cuBLAS workspaces' requests: those freed between the two marker
    requests (`MARKER_BYTES`, each made and freed at once) around clearCublasWorkspaces."""
    ev = events(history)
    first, second = [i for i, (_, delta) in enumerate(ev) if delta == MARKER_BYTES][-2:]
    made = {key: i for i, (key, delta) in enumerate(ev) if delta > 0}
    return sorted(made[key] for key, delta in ev[first + 2:second] if delta < 0)


def record(case_id: str, out: Path) -> Path:
    import torch

    from .cases import CASES

    from . import measure as measuring

    case = CASES[case_id]
    clear = measuring.freed_cublas_workspaces

    def marked() -> int:
        torch.empty(MARKER_BYTES, dtype=torch.uint8, device="cuda")  # made and freed at once, before and after
        freed = clear()
        torch.empty(MARKER_BYTES, dtype=torch.uint8, device="cuda")
        return freed

    measuring.freed_cublas_workspaces = marked
    torch.cuda.init()
    torch.cuda.memory._record_memory_history("all", context="alloc", stacks="python", max_entries=MAX_ENTRIES)
    measured = measuring.measure(case.harness, case.run, "cuda", case.wrapper)
    snapshot = torch.cuda.memory._snapshot()
    torch.cuda.memory._record_memory_history(None)
    history = rows(snapshot["device_traces"][0])
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{case_id}.history.json.gz"
    with gzip.open(path, "wt") as f:
        json.dump({"id": case_id, "reserved_peak_bytes": measured["reserved_peak_bytes"],
                   "peak_bytes": measured["peak_bytes"], "segments": measured.get("segments"),
                   "max_entries": MAX_ENTRIES, "history": history}, f, separators=(",", ":"))
    return path


def show(path: Path) -> str:
    from estimator.memory.allocator import replay

    with gzip.open(path, "rt") as f:
        record = json.load(f)
    history = record["history"]
    ev = events(history)
    allocator = replay(ev)
    made = sum(1 for action, _, _ in history if action == SEGMENT)
    lines = [f"{record['id']}: {len(ev)} events, replayed reserved {allocator.reserved_peak:,} B against "
             f"max_memory_reserved {record['reserved_peak_bytes']:,} B; {allocator.segments} segments replayed, "
             f"{made} mapped"]
    for i in workspaces(history):
        before = [delta for _, delta in ev[max(0, i - 6):i]]
        lines.append(f"  a cuBLAS workspace ({ev[i][1]:,} B) requested at event {i}; the six before it: {before}")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m validation.gpu.hf_history")
    parser.add_argument("--out", type=Path)
    parser.add_argument("--show", type=Path, nargs="+")
    parser.add_argument("cases", nargs="*")
    args = parser.parse_args(argv)
    for path in args.show or []:
        print(show(path))
    for case_id in args.cases:
        print(record(case_id, args.out), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
