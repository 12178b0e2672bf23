"""What is alive at each phase's peak of a traced LoRA step, activations grouped by the op, dtype and
shape that allocated them, largest first (validation/explain.py's `explain_trace`)."""

from __future__ import annotations

from ..explain import explain_trace


def explain(run) -> str:
    from .step import traced_step

    tracker, category, _, _ = traced_step(run)
    return explain_trace(tracker, category, top=30)
