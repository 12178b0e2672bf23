"""Accuracy of the estimator against the measured records."""

from __future__ import annotations

from .record import load_all

GiB = 2**30
# Tensor components of the estimator that are not parameters, gradients or optimizer states:
# everything the measurement files under "activations".
NOT_TENSORS = {"communication", "runtime", "fragmentation"}
OWN = {"parameters": ("parameters",), "gradients": ("gradients",),
       "optimizer_states": ("optimizer_states", "master_weights")}


def estimated_categories(components: dict) -> dict:
    out = {c: sum(components.get(k, 0) for k in keys) for c, keys in OWN.items()}
    owned = {k for keys in OWN.values() for k in keys}
    out["activations"] = sum(v for k, v in components.items() if k not in owned | NOT_TENSORS)
    return out


def _error(estimated: int, measured: int) -> str:
    if measured == 0:
        return "   exact" if estimated == 0 else "     n/a"
    return f"{100 * (estimated - measured) / measured:+7.2f}%"


def report() -> int:
    try:
        from estimator import estimate_config
    except ImportError as e:
        print(f"cannot compare: `from estimator import estimate_config` failed ({e}).")
        print("The estimator must provide estimate_config(config_dict) -> result with .to_json().")
        return 1
    records = load_all()
    head = f"{'case':62s} {'measured':>9s} {'estimated':>9s} {'error':>8s}  " \
           f"{'params':>8s} {'grads':>8s} {'optim':>8s} {'activ':>8s}"
    print(head + "\n" + "-" * len(head))
    worst = 0.0
    for r in records:
        m = r["measured"]
        try:
            est = estimate_config(r["config"]).to_json()
        except Exception as e:  # one bad case must not hide the others
            print(f"{r['id']:62s} {m['peak_bytes'] / GiB:8.2f}G  estimator failed: {e}")
            continue
        stage = est["stages"][est.get("peak_stage", 0)]
        cats = estimated_categories(stage["components"])
        peak = est["allocated_peak_bytes"]
        worst = max(worst, abs(peak - m["peak_bytes"]) / m["peak_bytes"])
        print(f"{r['id']:62s} {m['peak_bytes'] / GiB:8.2f}G {peak / GiB:8.2f}G "
              f"{_error(peak, m['peak_bytes'])}  "
              + " ".join(_error(cats[c], m[c]) for c in ("parameters", "gradients",
                                                         "optimizer_states", "activations")))
    print(f"\n{len(records)} cases; worst peak error {100 * worst:.1f}%. Per-category errors compare "
          "the measured categories at the measured peak with the estimate's components.")
    return 0
