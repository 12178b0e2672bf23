"""A published record through our Megatron importer and the estimate, against what the GPU allocated.

Each record holds a launch script (``launch``: exported environment + the torchrun command line) and
the GPU it ran on; the estimate is of the stage the measured rank holds (``measured_stage``): the
last pipeline stage for Megatron's golden values (the tensorboard rank), the record's stage where
the source gives each rank.
"""

from __future__ import annotations

import json
import statistics
from dataclasses import dataclass
from pathlib import Path

PUBLISHED = Path(__file__).resolve().parents[2] / "tests" / "data" / "measured" / "published"
SOURCES = ("megatron_golden", "simumax_b200")


def records(source: str) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted((PUBLISHED / source).glob("*.json"))]


def imported(record: dict):
    from estimator.importers import import_config

    return import_config(record["launch"], "megatron", gpu=record["gpu"])


@dataclass(frozen=True)
class Replay:
    id: str
    estimated: int  # the allocated peak of the measured rank's stage
    measured: int
    stage: int

    @property
    def error(self) -> float:
        return self.estimated / self.measured - 1


def measured_stage(record: dict, result) -> int:
    """The pipeline stage of the measured rank: the record's, else the last (Megatron's logging rank)."""
    return record.get("stage", len(result.stages) - 1)


def replay(record: dict) -> Replay:
    from estimator import estimate_config

    result = estimate_config(imported(record).config)
    index = measured_stage(record, result)
    stage = next(s for s in result.stages if s.stage == index)
    return Replay(record["id"], stage.allocated_peak_bytes, record["measured"]["max_allocated_bytes"], index)


def distinct(rows: list[Replay], recs: list[dict]) -> list[Replay]:
    """One row per distinct run: records marked ``duplicate_of`` (the same imported configuration
    and GPU as another case) are left out of the statistics."""
    dupes = {r["id"] for r in recs if r.get("duplicate_of")}
    return [row for row in rows if row.id not in dupes]


def summary(rows: list[Replay]) -> tuple[float, float]:
    """(median |error|, worst under-estimate as a negative fraction, 0 if none)."""
    return statistics.median(abs(r.error) for r in rows), min(0.0, min(r.error for r in rows))


def table(source: str) -> str:
    recs = records(source)
    rows = [replay(r) for r in recs]
    lines = [f"{'case':<78} {'stage':>5} {'measured':>9} {'estimate':>9} {'error':>7}"]
    for row in sorted(rows, key=lambda r: r.error):
        lines.append(f"{row.id:<78} {row.stage:>5} {row.measured / 2**30:>9.3f} {row.estimated / 2**30:>9.3f} "
                     f"{row.error:>+7.1%}")
    kept = distinct(rows, recs)
    median, worst = summary(kept)
    lines.append(f"{len(kept)} distinct runs of {len(rows)} records: median |error| {median:.1%}, "
                 f"worst under-estimate {worst:+.1%}")
    return "\n".join(lines)
