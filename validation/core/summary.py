"""The README's accuracy table: per framework, how many measured cases the estimate meets; and the
README's opening count of them (`headline`), which `python -m validation readme` writes.

    python -m validation summary
    python -m validation readme

For each framework's records (tests/data/measured/ for HF transformers, tests/data/measured/<framework>/
for the others): the number of cases, how many have the allocated peak within 5% (the bound
tests/test_accuracy.py holds), the median of the absolute peak errors and the worst signed error
with its case. The peak compared is that of the stage the harness measured (Megatron's records
name it), else the estimate's peak stage, as the tests compare. Reads the recorded JSON only.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import NamedTuple

from .harness import harnesses
from .record import MEASURED
from .report import tensors_peak

FRAMEWORKS = tuple(harnesses())  # every harness, in the README table's order ("hf": the top-level records)
BOUND = 0.05  # the allocated peak within 5%
# each harness's framework as the README names it, in the order its opening sentence lists them
FRAMEWORK_NAMES = {h.name: h.title for h in sorted(harnesses().values(), key=lambda h: h.order[1])}
NUMBER_WORDS = ("no", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten")
README = MEASURED.parents[2] / "README.md"
# the README's sentence between these markers is `headline()`'s, written by `python -m validation readme`
HEADLINE_START, HEADLINE_END = "<!-- measured-steps -->", "<!-- /measured-steps -->"


class Row(NamedTuple):
    framework: str
    cases: int
    within: int
    median: float  # of |error|
    worst: float  # signed error of the case with the largest |error|
    worst_case: str


def records(framework: str) -> list[Path]:
    return sorted(harnesses()[framework].records.glob("*.json"))


def peak_error(record: dict) -> float:
    """(estimate - measured) / measured of the allocated peak of the measured stage."""
    from estimator import estimate_config

    result = estimate_config(record["config"])
    stage = result.stages[record.get("stage", result.peak_stage)]
    measured = record["measured"]["peak_bytes"]
    return (tensors_peak(stage) - measured) / measured


def summarize(framework: str) -> Row:
    errors = {p.stem: peak_error(json.loads(p.read_text())) for p in records(framework)}
    worst = max(errors, key=lambda k: abs(errors[k]))
    return Row(framework, len(errors), sum(abs(e) <= BOUND for e in errors.values()),
               statistics.median(abs(e) for e in errors.values()), errors[worst], worst)


class GpuRow(NamedTuple):
    runs: int
    within: int  # allocated peak within 5%
    allocated: float  # median |error| of max_memory_allocated
    reserved: float  # ... of max_memory_reserved
    nvidia_smi: float  # ... of nvidia-smi's used memory against the device total
    worst: float
    worst_case: str


def gpu_records(folder: str = "") -> list[dict]:
    """The real-GPU runs (validation/gpu), the workspace probe left out; `folder`: a framework step's
    (gpu/megatron, gpu/deepspeed), else the HF and PEFT cases at the top."""
    runs = (json.loads(p.read_text()) for p in sorted((MEASURED / "gpu" / folder).glob("*.json")))
    return [r for r in runs if "config" in r]


def gpu_summary(folder: str = "") -> GpuRow:
    """Real-GPU runs compare the whole allocated peak (workspaces included), the reserved peak and the
    device total against nvidia-smi (a framework step's at the end of step 2)."""
    from estimator import estimate_config

    allocated, reserved, smi = {}, [], []
    for record in gpu_records(folder):
        result, m = estimate_config(record["config"]), record["measured"]
        stage = result.stages[result.peak_stage]
        allocated[record["id"]] = stage.allocated_peak_bytes / m["peak_bytes"] - 1
        reserved.append(abs(stage.reserved_peak_bytes / m["reserved_peak_bytes"] - 1))
        smi.append(abs(stage.device_total_bytes / m.get("nvidia_smi_bytes", m.get("nvidia_smi_used_end_bytes")) - 1))
    worst = max(allocated, key=lambda k: abs(allocated[k]))
    return GpuRow(len(allocated), sum(abs(e) <= BOUND for e in allocated.values()),
                  statistics.median(abs(e) for e in allocated.values()), statistics.median(reserved),
                  statistics.median(smi), allocated[worst], worst)


def headline() -> str:
    """How many measured training steps of how many frameworks the estimator is tested against,
    counted from the records (what tests/test_accuracy.py holds to 5%)."""
    counts = {framework: len(records(framework)) for framework in FRAMEWORK_NAMES}
    names = [FRAMEWORK_NAMES[f] for f in FRAMEWORK_NAMES if counts[f]]
    n = len(names)
    listed = ", ".join(names[:-1]) + " and " + names[-1] if n > 1 else names[0]
    return (f"tested against {sum(counts.values()):,} measured training steps of {NUMBER_WORDS[n]} "
            f"frameworks' own code — {listed}")


def write_readme(path: Path = README) -> bool:
    """Put `headline()` between the README's markers; whether the file changed."""
    text = path.read_text()
    start, end = text.index(HEADLINE_START) + len(HEADLINE_START), text.index(HEADLINE_END)
    new = text[:start] + headline() + text[end:]
    if new != text:
        path.write_text(new)
    return new != text


def summary() -> int:
    print("| framework | cases | within 5% | median error | worst |")
    print("|---|---:|---:|---:|---|")
    for framework in FRAMEWORKS:
        r = summarize(framework)
        print(f"| {r.framework} | {r.cases} | {r.within} | {100 * r.median:.1f}% | "
              f"{100 * r.worst:+.1f}% ({r.worst_case}) |")
    g = gpu_summary()
    print()
    print("| real GPU runs | runs | allocated within 5% | median error: allocated | reserved | nvidia-smi | worst allocated |")
    print("|---|---:|---:|---:|---:|---:|---|")
    print(f"| HF + PEFT on an H200 (`validation/gpu`) | {g.runs} | {g.within} | {100 * g.allocated:.1f}% | "
          f"{100 * g.reserved:.1f}% | {100 * g.nvidia_smi:.1f}% | {100 * g.worst:+.1f}% ({g.worst_case}) |")
    m = gpu_summary("megatron")
    print(f"| Megatron-Core 0.16.1 steps on an H200 (`validation/gpu/megatron_step.py`) | {m.runs} | {m.within} | "
          f"{100 * m.allocated:.1f}% | {100 * m.reserved:.1f}% | {100 * m.nvidia_smi:.1f}% | "
          f"{100 * m.worst:+.1f}% ({m.worst_case}) |")
    d = gpu_summary("deepspeed")
    print(f"| DeepSpeed 0.19.5 ZeRO-2/3 steps on an H200 (`validation/gpu/deepspeed_step.py`) | {d.runs} | {d.within} | "
          f"{100 * d.allocated:.1f}% | {100 * d.reserved:.1f}% | {100 * d.nvidia_smi:.1f}% | "
          f"{100 * d.worst:+.1f}% ({d.worst_case}) |")
    return 0


def readme() -> int:
    """`python -m validation readme`: the README's opening count, written from the records."""
    print(f"{README.name}: {headline()}" + ("" if write_readme() else " (unchanged)"))
    return 0
