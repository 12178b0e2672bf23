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
from contextlib import ExitStack, contextmanager, nullcontext
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


MATRIX_PRODUCTS = ("mm.", "addmm.", "bmm.", "baddbmm.", "addbmm.", "_scaled_mm.")  # cuBLAS calls (a tracker label's op)
WORKSPACES_PLACED = "the forward thread's after the build, the backward thread's at its first matrix product"


def full_trace(run) -> list[tuple[int, int]]:
    """(storage key, +/- bytes) in order, from the model's build to the end of step 2."""
    from .peft.build import LoraRun

    if isinstance(run, LoraRun):
        return _peft_trace(run)
    tracker = StorageTracker()
    backward: list[int] = []  # where step 1's backward starts in the events

    @contextmanager
    def phase(name):
        if name == "backward" and not backward:
            backward.append(len(tracker.events))
        yield

    with FakeTensorMode(), cuda_emulation(tracker), tracker, ExitStack() as stack:
        if run.liger:  # Liger's Triton launches stubbed, its CUDA branches taken (hf/liger.py; as hf/step.py does)
            from .hf.liger import liger_emulation
            stack.enter_context(liger_emulation())
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
    import transformers

    from estimator.memory.allocator import replay

    from .gpu.cases import CASES
    from .gpu.fallback import torch_fallback

    case = CASES[case_id]
    if fallback and tuple(int(x) for x in transformers.__version__.split(".")[:2]) > (5, 17):
        case_id = f"{case_id}-transformers-{'.'.join(transformers.__version__.split('.')[:2])}"
    gpu = json.loads((TRACES.parent / "gpu" / f"{case_id}.json").read_text())
    with torch_fallback() if fallback else nullcontext():
        events = full_trace(case.run)
    expandable = case.allocator == "expandable"
    simulated = replay(events, expandable=expandable)
    record = {"id": case_id, "gpu_record": f"gpu/{case_id}.json", "expandable_segments": expandable,
              "simulated_reserved_bytes": simulated.reserved_peak, "simulated_segments": simulated.segments,
              "gpu_reserved_bytes": gpu["measured"]["reserved_peak_bytes"],
              "method": __doc__.split("\n\n")[0].replace("\n", " "), "workspaces": WORKSPACES_PLACED,
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
