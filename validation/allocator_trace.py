"""The whole allocation sequence of an HF case under fake tensors (model build, step 1, step 2),
saved to replay through estimator/allocator.py against the real GPU's max_memory_reserved.

`validation/hf/step.py` logs only the measured step; the caching allocator's reserved memory depends on
everything before it (segments are never given back), so here the tracker records from the model's
build on. PyTorch's two cuBLAS workspaces (32 MiB each on Hopper, allocated through the caching
allocator at the first matmul of the forward's thread and of autograd's backward thread:
aten/src/ATen/cuda/CublasHandlePool.cpp, one per (handle, stream), a handle per thread) are put in, the
forward's after the build, the backward thread's where that thread makes its first matrix product, just after
its output (`place_workspaces`): the head's weight gradient in step 1. All 31 traces are recorded so (2026-11-27,
transformers 5.23 here; the 29 recorded before then had both after the build, and their sequences were 3-6%
longer: the stack's changes since; with both after the build the new ones replay within 0.07% of the old). With
both after the build GPT-2 medium under autocast with SDPA replays to -9.2%, with the backward's at its first
product to the H200's reserved bytes exactly (8,495,562,752 B, its 98 segments); Qwen3-8B SGD with recompute
(-7.7% before), Qwen3-8B with recompute at s8192 (-5.1%) and Llama-3.1-8B with recompute at s4096 b1 (-4.9%)
to within 0.01%, and 24 of the 31 are within 1% (20 of 29 before); Llama-3.2-1B under autocast goes from +0.6%
to +3.5% and Llama-3.1-8B eager from +1.9% to +2.6%. The forward's at its first matrix product instead of after
the build put Llama-3.2-1B with recompute at +0.59% (exact after the build) and Llama-3.1-8B with recompute at
s4096 b2 at -4.5% (validation/README.md, item 5).

    python -m validation.allocator_trace CASE_ID...   # writes tests/data/measured/allocator/<id>.json.gz
"""

from __future__ import annotations

import gc
import gzip
import json
import sys
from contextlib import contextmanager
from pathlib import Path

import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from .core.emulation import cuda_emulation
from .hf.step import build, train_step
from .core.tracker import StorageTracker

TRACES = Path(__file__).resolve().parents[1] / "tests" / "data" / "measured" / "allocator"
HOPPER_CUBLAS_WORKSPACE = 32 << 20
WORKSPACE_KEYS = (-1, -2)  # the forward's thread's and autograd's backward thread's


MATRIX_PRODUCTS = ("mm.", "addmm.", "bmm.", "baddbmm.", "addbmm.", "_scaled_mm.")  # cuBLAS calls (a tracker label's op)
WORKSPACES_PLACED = "the forward thread's after the build, the backward thread's at its first matrix product"


def full_trace(run) -> list[tuple[int, int]]:
    """(storage key, +/- bytes) in order, from the model's build to the end of step 2."""
    tracker = StorageTracker()
    backward: list[int] = []  # where step 1's backward starts in the events

    @contextmanager
    def phase(name):
        if name == "backward" and not backward:
            backward.append(len(tracker.events))
        yield

    with FakeTensorMode(), cuda_emulation(tracker), tracker:
        model, opt = build(run)
        built = len(tracker.events)
        ids = torch.randint(0, model.config.vocab_size, (run.micro_batch_size, run.seq_len))
        train_step(model, opt, ids, run, phase)
        gc.collect()
        train_step(model, opt, ids, run)
    return place_workspaces(tracker.events, tracker.labels, built, backward[0])


def place_workspaces(events: list, labels: dict, built: int, backward: int) -> list:
    """`events` with the two cuBLAS workspaces put in: the forward thread's at `built` (the build's end), autograd's
    backward thread's after the first matrix product's output from `backward` (step 1's backward) on, or at
    `backward` where there is none."""
    back = next((i + 1 for i in range(backward, len(events)) if events[i][1] > 0
                 and labels.get(events[i][0], "").startswith(MATRIX_PRODUCTS)), backward)
    out = list(events)
    out.insert(back, (WORKSPACE_KEYS[1], HOPPER_CUBLAS_WORKSPACE))
    out.insert(built, (WORKSPACE_KEYS[0], HOPPER_CUBLAS_WORKSPACE))
    return out


def write_trace(case_id: str) -> Path:
    from estimator.memory.allocator import replay

    from .gpu.cases import CASES

    case = CASES[case_id]
    gpu = json.loads((TRACES.parent / "gpu" / f"{case_id}.json").read_text())
    events = full_trace(case.run)
    simulated = replay(events, expandable=case.allocator == "expandable")
    record = {"id": case_id, "gpu_record": f"gpu/{case_id}.json", "expandable_segments": case.allocator == "expandable",
              "simulated_reserved_bytes": simulated.reserved_peak, "simulated_segments": simulated.segments,
              "gpu_reserved_bytes": gpu["measured"]["reserved_peak_bytes"],
              "method": __doc__.split("\n\n")[0].replace("\n", " "), "workspaces": WORKSPACES_PLACED,
              "events": events}
    TRACES.mkdir(parents=True, exist_ok=True)
    path = TRACES / f"{case_id}.json.gz"
    with gzip.open(path, "wt") as f:
        json.dump(record, f, separators=(",", ":"))
    return path


if __name__ == "__main__":
    for case_id in sys.argv[1:]:
        print(write_trace(case_id))
