"""Accuracy of the estimator against the measured records."""

from __future__ import annotations

from .record import load_all
from .summary import tensors_peak

GiB = 2**30


def _error(estimated: int, measured: int) -> str:
    if measured == 0:
        return "   exact" if estimated == 0 else "     n/a"
    return f"{100 * (estimated - measured) / measured:+7.2f}%"


def report() -> int:
    """The README's accuracy table: the same measures tests/test_accuracy.py bounds (the allocated
    peak; parameters, all gradients and optimizer states at the optimizer step)."""
    try:
        from estimator import estimate_config
    except ImportError as e:
        print(f"cannot compare: `from estimator import estimate_config` failed ({e}).")
        return 1
    records = load_all()
    print("| case | peak phase | measured GiB | estimated GiB | peak error | params | grads | optimizer |")
    print("|---|---|---:|---:|---:|---:|---:|---:|")
    worst = 0.0
    for r in records:
        m = r["measured"]
        try:
            result = estimate_config(r["config"])
        except Exception as e:  # one bad case must not hide the others
            print(f"| {r['id']} | | {m['peak_bytes'] / GiB:.2f} | estimator failed: {e} | | | | |")
            continue
        stage = result.stages[result.peak_stage]
        step = {c.key: c.bytes for c in next(p for p in stage.phases if p.name == "optimizer").components}
        ms = m["phases"]["optimizer"]
        peak = tensors_peak(stage)
        worst = max(worst, abs(peak - m["peak_bytes"]) / m["peak_bytes"])
        cells = [_error(step["parameters"], ms["parameters"]), _error(step["gradients"], ms["gradients"]),
                 _error(step["optimizer_states"] + step.get("master_weights", 0), ms["optimizer_states"])]
        print(f"| {r['id']} | {m['peak_phase']} | {m['peak_bytes'] / GiB:.2f} | {peak / GiB:.2f} | "
              f"{_error(peak, m['peak_bytes']).strip()} | " + " | ".join(c.strip() for c in cells) + " |")
    print(f"\n{len(records)} cases; worst peak error {100 * worst:.2f}%.")
    return 0
