"""The estimator against the recorded fine-tuning steps. The adapter, where the estimator cannot
express it, is dropped and the row is flagged, so the table shows what a user would be told today."""

from __future__ import annotations

import copy

from ..core.report import peak_report


def without_adapter(config: dict) -> tuple[dict, str]:
    """Full fine-tuning of the same model, as the HF records configure it (bf16 parameters,
    gradients and AdamW states, no master copy): what the estimator says when the adapter is
    ignored."""
    config = copy.deepcopy(config)
    training = config["training"]
    if training.pop("adapter", None) is None:
        return config, ""
    training.update(grad_dtype=training["param_dtype"], optimizer_dtype=training["param_dtype"])
    return config, "adapter dropped: full fine-tuning"


def report(records: list[dict]) -> int:
    return peak_report(records, without_adapter)
