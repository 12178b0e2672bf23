"""The estimator against every measured training step in tests/data/measured (issue: ground truth).

Each record holds the configuration in the contract's format and the bytes the measuring harness
(`validation/`) saw: per category at each phase's peak, and the overall peak. The bounds are the
project's promise: the allocated peak within 5%, parameters, gradients and optimizer states
within 1%. A failing case is fixed in the model, never by loosening a bound.
"""

import json
from pathlib import Path

import pytest

from estimator import estimate_config

RECORDS = sorted((Path(__file__).parent / "data" / "measured").glob("*.json"))


def load(path):
    return json.loads(path.read_text())


def phase_components(result, name):
    stage = result.stages[result.peak_stage]
    return {c.key: c.bytes for c in next(p for p in stage.phases if p.name == name).components}


def test_there_are_at_least_30_cases():
    assert len(RECORDS) >= 30


@pytest.mark.parametrize("path", RECORDS, ids=lambda p: p.stem)
def test_case_within_bounds(path):
    record = load(path)
    measured = record["measured"]
    result = estimate_config(record["config"])
    peak = result.allocated_peak_bytes
    assert peak == pytest.approx(measured["peak_bytes"], rel=0.05), f"peak {peak} vs {measured['peak_bytes']}"
    step = phase_components(result, "optimizer")
    m_step = measured["phases"]["optimizer"]
    assert step["parameters"] == pytest.approx(m_step["parameters"], rel=0.01)
    # the harness counts master weights (if any) with the optimizer's state
    assert step["optimizer_states"] + step.get("master_weights", 0) == \
        pytest.approx(m_step["optimizer_states"], rel=0.01)
    # every gradient exists at the optimizer step
    assert step["gradients"] == pytest.approx(m_step["gradients"], rel=0.01)
