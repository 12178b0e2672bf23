"""The estimator against the torchtitan records: peak, and model states at the optimizer step."""

from __future__ import annotations

import copy

from ..core.report import state_table

# Contract additions the estimator may not know yet, dropped one by one (in this order) until
# it accepts the configuration; a row estimated that way is flagged.
DROPPABLE = ("fp8_all_gather", "fp8_recipe", "fp8", "recompute_every")


def without_next_droppable(config: dict) -> tuple[dict, str]:
    """The config less the first droppable field it has, and that field's name ("" when none)."""
    left = [f for f in DROPPABLE if f in config["training"]]
    if not left:
        return config, ""
    config = copy.deepcopy(config)
    config["training"].pop(left[0])
    return config, left[0]


def report(records: list[dict]) -> int:
    errors = sorted(state_table(records, digits=1, reduce=without_next_droppable))
    if errors:
        print(f"\n{len(records)} cases; median peak error {100 * errors[len(errors) // 2]:.1f}%, "
              f"worst {100 * errors[-1]:.1f}%.")
    return 0
