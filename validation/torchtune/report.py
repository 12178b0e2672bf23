"""The estimator against the torchtune records. What it cannot express yet in a record (the savers,
the adapter) is dropped for today's estimate and the row is flagged."""

from __future__ import annotations

import copy

from ..core.report import peak_report

UNSUPPORTED = ("optimizer_in_backward", "offload_activations")


def without_unsupported(config: dict) -> tuple[dict, str]:
    """The config less the fields the estimator refuses today (the savers, the adapter: full
    fine-tuning of the same model), and a note naming them."""
    config = copy.deepcopy(config)
    dropped = [f for f in (*UNSUPPORTED, "adapter") if config["training"].pop(f, None) is not None]
    return config, f"dropped: {', '.join(dropped)}" if dropped else ""


def report(records: list[dict]) -> int:
    return peak_report(records, without_unsupported)
