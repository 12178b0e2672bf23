"""The estimator against the HF Trainer + Accelerate FSDP2 records: peak, and model states at the optimizer step."""

from __future__ import annotations

from ..core.report import state_table


def report(records: list[dict]) -> int:
    errors = sorted(state_table(records, digits=1))
    if errors:
        print(f"\n{len(records)} cases; median peak error {100 * errors[len(errors) // 2]:.1f}%, "
              f"worst {100 * errors[-1]:.1f}%.")
    return 0
