"""The real-GPU script's measuring code, run on the CPU with tiny models (CI has no GPU): the same
build, the same two steps, the same model-state count as a GPU run."""

from __future__ import annotations

from ..peft.build import LoraRun
from ..hf.step import Run
from .measure import measure

TINY_RUNS = (("hf", Run("tiny-llama", 64, 2)), ("peft", LoraRun("tiny-llama", 64, rank=4, alpha=8)))


def selftest() -> dict:
    return {f"{harness}:{run.model}": measure(harness, run, "cpu") for harness, run in TINY_RUNS}
