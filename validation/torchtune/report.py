"""What the estimator cannot express yet in a torchtune record, dropped for today's estimate."""

from __future__ import annotations

import copy

UNSUPPORTED = ("optimizer_in_backward", "offload_activations")


def without_unsupported(config: dict) -> tuple[dict, str]:
    """The config less the fields the estimator refuses today (the savers, the adapter: full
    fine-tuning of the same model), and a note naming them."""
    config = copy.deepcopy(config)
    dropped = [f for f in (*UNSUPPORTED, "adapter") if config["training"].pop(f, None) is not None]
    return config, f"dropped: {', '.join(dropped)}" if dropped else ""
