"""`python -m validation report` reads the recorded measurements only: it must run without torch."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from validation.core.record import MEASURED
from validation.core.report import tensors_peak

ROOT = Path(__file__).resolve().parents[1]


def test_report_runs_where_torch_and_transformers_cannot_be_imported(tmp_path):
    for name in ("torch", "transformers"):  # shadow the installed packages with ones that fail
        (tmp_path / name).mkdir()
        (tmp_path / name / "__init__.py").write_text(f"raise ImportError('{name} is not installed here')\n")
    path = os.pathsep.join(filter(None, [str(tmp_path), str(ROOT), os.environ.get("PYTHONPATH")]))
    run = subprocess.run([sys.executable, "-m", "validation", "report"], capture_output=True, text=True,
                         cwd=ROOT, env={**os.environ, "PYTHONPATH": path}, timeout=300)
    assert run.returncode == 0, run.stderr
    lines = run.stdout.splitlines()
    assert lines[0].startswith("| case | peak phase | measured GiB |")
    records = [p.stem for p in sorted(MEASURED.glob("*.json"))]  # the files in order, as the report reads them
    assert records and [line.split("|")[1].strip() for line in lines[2:2 + len(records)]] == records
    assert f"{len(records)} cases; worst peak error" in run.stdout


def test_summary_counts_every_record_and_its_bound():
    """`python -m validation summary` (the README's per-framework table): one row per framework, its case
    count the number of record files, and a case within 5% exactly when its peak error, computed here
    independently from the record and the estimate, is within 5%."""
    import json

    from estimator import estimate_config
    from validation.core.summary import FRAMEWORKS, records, summarize

    for framework in FRAMEWORKS:
        paths = records(framework)
        row = summarize(framework)
        errors = []
        for p in paths:
            record = json.loads(p.read_text())
            result = estimate_config(record["config"])
            stage = result.stages[record.get("stage", result.peak_stage)]
            errors.append(tensors_peak(stage) / record["measured"]["peak_bytes"] - 1)
        assert row.cases == len(paths) > 0
        assert row.within == sum(abs(e) <= 0.05 for e in errors)
        assert abs(row.worst) == pytest.approx(max(abs(e) for e in errors), rel=1e-12)
