"""The whole allocation sequence of an HF case under fake tensors (model build, step 1, step 2),
saved to replay through estimator/allocator.py against the real GPU's max_memory_reserved.

`validation/hf/step.py` logs only the measured step; the caching allocator's reserved memory depends on
everything before it (segments are never given back), so here the tracker records from the model's
build on. PyTorch's two cuBLAS workspaces (32 MiB each on Hopper, allocated through the caching
allocator at the first matmul of the forward's thread and of autograd's backward thread:
aten/src/ATen/cuda/CublasHandlePool.cpp) are put in after the build.

    python -m validation.allocator_trace CASE_ID...   # writes tests/data/measured/allocator/<id>.json.gz
    python -m validation.allocator_trace --fallback CASE_ID...   # a hybrid on transformers' torch fallback

With --fallback the step runs transformers' torch fallback of the hybrid's SSM kernels (validation/gpu/fallback.py)
under the installed transformers, and the record is the GPU record of that release's fallback (records.fallback_id:
<case>-transformers-<x.y> from 5.18 on); transformers 5.17.0's records were written with 5.17.0 first on the path
(pip install --no-deps --target DIR transformers==5.17.0; PYTHONPATH=DIR:.).
"""

from __future__ import annotations

import gc
import gzip
import json
import sys
from pathlib import Path

import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from .core.emulation import cuda_emulation
from .hf.step import build, train_step
from .core.tracker import StorageTracker

TRACES = Path(__file__).resolve().parents[1] / "tests" / "data" / "measured" / "allocator"
HOPPER_CUBLAS_WORKSPACE = 32 << 20
WORKSPACE_KEYS = (-1, -2)  # the forward's thread's and autograd's backward thread's


def full_trace(run) -> list[tuple[int, int]]:
    """(storage key, +/- bytes) in order, from the model's build to the end of step 2."""
    tracker = StorageTracker()
    with FakeTensorMode(), cuda_emulation(tracker), tracker:
        model, opt = build(run)
        ids = torch.randint(0, model.config.vocab_size, (run.micro_batch_size, run.seq_len))
        tracker.events.extend((key, HOPPER_CUBLAS_WORKSPACE) for key in WORKSPACE_KEYS)
        train_step(model, opt, ids, run)
        gc.collect()
        train_step(model, opt, ids, run)
    return tracker.events


def write_trace(case_id: str, fallback: bool = False) -> Path:
    import contextlib

    import transformers

    from estimator.memory.allocator import replay

    from .gpu.cases import CASES
    from .gpu.fallback import torch_fallback

    case = CASES[case_id]
    if fallback and tuple(int(x) for x in transformers.__version__.split(".")[:2]) > (5, 17):
        case_id = f"{case_id}-transformers-{'.'.join(transformers.__version__.split('.')[:2])}"
    gpu = json.loads((TRACES.parent / "gpu" / f"{case_id}.json").read_text())
    with torch_fallback() if fallback else contextlib.nullcontext():
        events = full_trace(case.run)
    simulated = replay(events, expandable=case.allocator == "expandable")
    record = {"id": case_id, "gpu_record": f"gpu/{case_id}.json", "expandable_segments": case.allocator == "expandable",
              "simulated_reserved_bytes": simulated.reserved_peak, "simulated_segments": simulated.segments,
              "gpu_reserved_bytes": gpu["measured"]["reserved_peak_bytes"],
              "method": __doc__.split("\n\n")[0].replace("\n", " "),
              **({"transformers": transformers.__version__, "ssm_kernels": gpu["config"]["training"]["ssm_kernels"]}
                 if fallback else {}),
              "events": events}
    TRACES.mkdir(parents=True, exist_ok=True)
    path = TRACES / f"{case_id}.json.gz"
    with gzip.open(path, "wt") as f:
        json.dump(record, f, separators=(",", ":"))
    return path


if __name__ == "__main__":
    fallback = sys.argv[1:2] == ["--fallback"]
    for case_id in sys.argv[1 + fallback:]:
        print(write_trace(case_id, fallback))
