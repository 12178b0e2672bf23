"""The README's accuracy table: per framework, how many measured cases the estimate meets.

    python -m validation summary

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

MEASURED = Path(__file__).resolve().parent.parent / "tests" / "data" / "measured"
FRAMEWORKS = ("hf", "torchtitan", "megatron", "peft", "torchtune")  # "hf": the top-level records
BOUND = 0.05  # the allocated peak within 5%


class Row(NamedTuple):
    framework: str
    cases: int
    within: int
    median: float  # of |error|
    worst: float  # signed error of the case with the largest |error|
    worst_case: str


def records(framework: str) -> list[Path]:
    folder = MEASURED if framework == "hf" else MEASURED / framework
    return sorted(folder.glob("*.json"))


def peak_error(record: dict) -> float:
    """(estimate - measured) / measured of the allocated peak of the measured stage."""
    from estimator import estimate_config

    result = estimate_config(record["config"])
    stage = result.stages[record.get("stage", result.peak_stage)]
    measured = record["measured"]["peak_bytes"]
    return (stage.allocated_peak_bytes - measured) / measured


def summarize(framework: str) -> Row:
    errors = {p.stem: peak_error(json.loads(p.read_text())) for p in records(framework)}
    worst = max(errors, key=lambda k: abs(errors[k]))
    return Row(framework, len(errors), sum(abs(e) <= BOUND for e in errors.values()),
               statistics.median(abs(e) for e in errors.values()), errors[worst], worst)


def summary() -> int:
    print("| framework | cases | within 5% | median error | worst |")
    print("|---|---:|---:|---:|---|")
    for framework in FRAMEWORKS:
        r = summarize(framework)
        print(f"| {r.framework} | {r.cases} | {r.within} | {100 * r.median:.1f}% | "
              f"{100 * r.worst:+.1f}% ({r.worst_case}) |")
    return 0
