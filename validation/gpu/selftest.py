"""The real-GPU script's measuring code, run on the CPU with tiny models (CI has no GPU): the same
build, the same two steps, the same model-state count as a GPU run; and the experiments' code against
the CPU stand-in (tests/test_gpu_experiments.py runs them through the command line)."""

from __future__ import annotations

from ..peft.build import LoraRun
from ..hf.step import Run
from .context import measure_context
from .graphs import GraphRun, measure_graphs
from .kernels import KernelRun, measure_kernel
from .measure import measure

TINY_RUNS = (("hf", Run("tiny-llama", 64, 2)), ("peft", LoraRun("tiny-llama", 64, rank=4, alpha=8)))
TINY_KERNEL = KernelRun("megatron-cross-entropy", 16, 2, 512)
TINY_GRAPHS = GraphRun("mixed", 6, 4)


def selftest() -> dict:
    out = {f"{harness}:{run.model}": measure(harness, run, "cpu") for harness, run in TINY_RUNS}
    out["hf:tiny-llama:accelerate"] = measure("hf", TINY_RUNS[0][1], "cpu", "accelerate")
    out[TINY_KERNEL.id] = measure_kernel(TINY_KERNEL, "cpu")
    # the experiments against the CPU stand-in (validation/gpu/devices.py)
    out["cuda-graphs:" + TINY_GRAPHS.id] = measure_graphs(TINY_GRAPHS, "cpu", 60)
    out["cuda-context"] = measure_context("cpu")
    return out
