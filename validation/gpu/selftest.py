"""The real-GPU script's measuring code, run on the CPU with tiny models (CI has no GPU): the same
build, the same two steps, the same model-state count as a GPU run."""

from __future__ import annotations

from ..peft.build import LoraRun
from ..hf.step import Run
from .kernels import KernelRun, measure_kernel
from .measure import measure

TINY_RUNS = (("hf", Run("tiny-llama", 64, 2)), ("peft", LoraRun("tiny-llama", 64, rank=4, alpha=8)))
TINY_KERNEL = KernelRun("megatron-cross-entropy", 16, 2, 512)


def selftest() -> dict:
    out = {f"{harness}:{run.model}": measure(harness, run, "cpu") for harness, run in TINY_RUNS}
    out["hf:tiny-llama:accelerate"] = measure("hf", TINY_RUNS[0][1], "cpu", "accelerate")
    out[TINY_KERNEL.id] = measure_kernel(TINY_KERNEL, "cpu")
    return out
