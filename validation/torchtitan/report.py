"""The estimator against the torchtitan records: peak, and model states at the optimizer step."""

from __future__ import annotations

import copy

from .record import load_all
from ..summary import tensors_peak

GiB = 2**30

# Contract additions the estimator may not know yet, dropped one by one (in this order) until
# it accepts the configuration; a row estimated that way is flagged.
DROPPABLE = ("fp8_all_gather", "fp8_recipe", "fp8", "recompute_every")


def estimate_flagged(config: dict):
    """(result, dropped field names): the estimate of `config`, with the fields the estimator
    rejects dropped from `training`."""
    from estimator import estimate_config

    config, dropped = copy.deepcopy(config), []
    while True:
        try:
            return estimate_config(config), dropped
        except Exception:
            left = [f for f in DROPPABLE if f in config["training"]]
            if not left:
                raise
            config["training"].pop(left[0])
            dropped.append(left[0])


def _error(estimated: int, measured: int) -> str:
    if measured == 0:
        return "exact" if estimated == 0 else "n/a"
    return f"{100 * (estimated - measured) / measured:+.1f}%"


def report() -> int:
    records = load_all()
    print("| case | peak phase | measured GiB | estimated GiB | peak error | params | grads | optimizer | flag |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---|")
    errors = []
    for r in records:
        m = r["measured"]
        try:
            result, dropped = estimate_flagged(r["config"])
        except Exception as e:  # one bad case must not hide the others
            print(f"| {r['id']} | {m['peak_phase']} | {m['peak_bytes'] / GiB:.2f} | estimator failed: {e} | | | | | |")
            continue
        stage = result.stages[result.peak_stage]
        step = {c.key: c.bytes for c in next(p for p in stage.phases if p.name == "optimizer").components}
        ms = m["phases"]["optimizer"]
        peak = tensors_peak(stage)
        errors.append(abs(peak - m["peak_bytes"]) / m["peak_bytes"])
        cells = [_error(step["parameters"], ms["parameters"]), _error(step["gradients"], ms["gradients"]),
                 _error(step["optimizer_states"] + step.get("master_weights", 0), ms["optimizer_states"])]
        flag = f"estimated without {', '.join(dropped)}" if dropped else ""
        print(f"| {r['id']} | {m['peak_phase']} | {m['peak_bytes'] / GiB:.2f} | {peak / GiB:.2f} | "
              f"{_error(peak, m['peak_bytes'])} | " + " | ".join(cells) + f" | {flag} |")
    if errors:
        errors.sort()
        print(f"\n{len(records)} cases; median peak error {100 * errors[len(errors) // 2]:.1f}%, "
              f"worst {100 * errors[-1]:.1f}%.")
    return 0
