"""The estimator against the HF records: the README's accuracy table, the same measures
tests/test_accuracy.py bounds (the allocated peak; parameters, all gradients and optimizer states
at the optimizer step)."""

from __future__ import annotations

from ..core.report import estimator_missing, state_table


def report(records: list[dict]) -> int:
    if estimator_missing():
        return 1
    errors = state_table(records, digits=2)
    print(f"\n{len(records)} cases; worst peak error {100 * max(errors, default=0.0):.2f}%.")
    return 0
