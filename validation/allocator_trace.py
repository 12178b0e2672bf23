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

A PEFT case (validation/peft/cases.py) is traced as validation/peft/step.py runs it (`_peft_trace`), its cuBLAS
workspaces at each thread's first matrix product, into tests/data/measured/allocator_order/ (the sequences that
show the GPU's order of segment addresses: estimator/memory/allocator.py, tests/test_segment_order.py).
"""

from __future__ import annotations

import gc
import gzip
import json
import sys
from contextlib import nullcontext
from pathlib import Path

import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from .core.emulation import cuda_emulation
from .hf.step import build, train_step
from .core.tracker import StorageTracker, UnwrappingTracker

TRACES = Path(__file__).resolve().parents[1] / "tests" / "data" / "measured" / "allocator"
ORDER_TRACES = TRACES.parent / "allocator_order"
HOPPER_CUBLAS_WORKSPACE = 32 << 20
WORKSPACE_KEYS = (-1, -2)  # the forward's thread's and autograd's backward thread's


def full_trace(run) -> list[tuple[int, int]]:
    """(storage key, +/- bytes) in order, from the model's build to the end of step 2."""
    from contextlib import ExitStack

    from .peft.build import LoraRun

    if isinstance(run, LoraRun):
        return _peft_trace(run)
    tracker = StorageTracker()
    with FakeTensorMode(), cuda_emulation(tracker), tracker, ExitStack() as stack:
        if run.liger:  # Liger's Triton launches stubbed, its CUDA branches taken (hf/liger.py; as hf/step.py does)
            from .hf.liger import liger_emulation
            stack.enter_context(liger_emulation())
        model, opt = build(run)
        ids = torch.randint(0, model.config.vocab_size, (run.micro_batch_size, run.seq_len))
        tracker.events.extend((key, HOPPER_CUBLAS_WORKSPACE) for key in WORKSPACE_KEYS)
        train_step(model, opt, ids, run)
        gc.collect()
        train_step(model, opt, ids, run)
    return tracker.events


def _peft_trace(run) -> list[tuple[int, int]]:
    """A PEFT case's sequence, as validation/peft/step.py runs it (CUDA's fused dropout, clip_grad_norm_, fused
    AdamW), the peft model built on meta outside the fake mode (validation/peft/build.py). The two cuBLAS
    workspaces come where a GPU makes them (`_FirstProducts`), not after the build."""
    from .core.steps import fake_mode
    from .peft.build import build as build_peft, meta_peft_model
    from .peft.step import cuda_dropout, train_step as peft_step

    tracker = _FirstProducts()
    torch.manual_seed(0)
    model = meta_peft_model(run)
    with fake_mode(True), cuda_emulation(tracker), cuda_dropout(), tracker:
        model, opt = build_peft(model, run)
        ids = torch.randint(0, model.config.vocab_size, (run.micro_batch_size, run.seq_len))
        tracker.pending.append(WORKSPACE_KEYS[0])
        peft_step(model, opt, ids, tracker.phase)
        gc.collect()
        peft_step(model, opt, ids, tracker.phase)
    return tracker.events


def _first_products():
    aten = torch.ops.aten
    return {aten.mm.default, aten.bmm.default, aten.addmm.default, aten.baddbmm.default, aten.addbmm.default}


class _FirstProducts(UnwrappingTracker):
    """A tracker that puts each thread's cuBLAS workspace at its first matrix product, after the product's output
    (aten/src/ATen/cuda/CublasHandlePool.cpp getCurrentCUDABlasHandle: a new (handle, stream) pair's workspace is
    made when a kernel first asks for the handle, once the structured op has made its output): the forward thread's
    at the first product after the build, autograd's backward thread's at the first product of the first backward
    (on the CPU the backward runs on the calling thread: `phase("backward")` arms it)."""

    def __init__(self):
        super().__init__()
        self.pending: list[int] = []
        self.products = _first_products()
        self.backward_armed = False

    def register_outputs(self, func, args, out) -> None:
        super().register_outputs(func, args, out)
        if self.pending and func in self.products:
            self.events.append((self.pending.pop(0), HOPPER_CUBLAS_WORKSPACE))

    def phase(self, name: str):
        if name == "backward" and not self.backward_armed:
            self.backward_armed = True
            self.pending.append(WORKSPACE_KEYS[1])
        return nullcontext()


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
    expandable = case.allocator == "expandable"
    simulated = replay(events, expandable=expandable)
    record = {"id": case_id, "gpu_record": f"gpu/{case_id}.json", "expandable_segments": expandable,
              "simulated_reserved_bytes": simulated.reserved_peak, "simulated_segments": simulated.segments,
              "gpu_reserved_bytes": gpu["measured"]["reserved_peak_bytes"],
              "method": __doc__.split("\n\n")[0].replace("\n", " "),
              **({"transformers": transformers.__version__, "ssm_kernels": gpu["config"]["training"]["ssm_kernels"]}
                 if fallback else {}),
              "events": events}
    from .peft.build import LoraRun
    folder = TRACES
    if isinstance(case.run, LoraRun):
        folder = ORDER_TRACES
        record["simulated_descending_reserved_bytes"] = replay(events, expandable, descending=True).reserved_peak
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{case_id}.json.gz"
    with gzip.open(path, "wt") as f:
        json.dump(record, f, separators=(",", ":"))
    return path


if __name__ == "__main__":
    fallback = sys.argv[1:2] == ["--fallback"]
    for case_id in sys.argv[1 + fallback:]:
        print(write_trace(case_id, fallback))
