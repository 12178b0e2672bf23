"""The estimator against the recorded fine-tuning steps. Fields the estimator cannot express yet
(the adapter, torchtune's savers) are dropped and the row is flagged, so the table shows what a
user would be told today."""

from __future__ import annotations

import copy

from ..summary import tensors_peak

GiB = 2**30


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


def estimate(config: dict, fallback=without_adapter):
    """The estimate of the config as recorded, or of its fallback when the estimator refuses a
    field; returns (result, flag)."""
    from estimator import estimate_config

    try:
        return estimate_config(config), ""
    except Exception:  # noqa: BLE001 -- an unknown field today; the fallback names what it drops
        reduced, flag = fallback(config)
        if not flag:
            raise
        return estimate_config(reduced), flag


def _error(estimated: int, measured: int) -> str:
    return f"{100 * (estimated - measured) / measured:+.1f}%" if measured else "n/a"


def rows(records: list[dict], fallback=without_adapter) -> list[dict]:
    out = []
    for r in records:
        m = r["measured"]
        try:
            result, flag = estimate(r["config"], fallback)
            peak = tensors_peak(result.stages[result.peak_stage])
            error = _error(peak, m["peak_bytes"])
        except Exception as e:  # one bad case must not hide the others
            peak, error, flag = None, "", f"estimator failed: {e}"
        out.append({"id": r["id"], "phase": m["peak_phase"], "measured": m["peak_bytes"],
                    "estimated": peak, "error": error, "flag": flag})
    return out


def report(records: list[dict], fallback=without_adapter) -> int:
    try:
        import estimator  # noqa: F401
    except ImportError as e:
        print(f"cannot compare: `import estimator` failed ({e}).")
        return 1
    print("| case | peak phase | measured GiB | estimated GiB | error | note |")
    print("|---|---|---:|---:|---:|---|")
    for row in rows(records, fallback):
        est = f"{row['estimated'] / GiB:.2f}" if row["estimated"] is not None else ""
        print(f"| {row['id']} | {row['phase']} | {row['measured'] / GiB:.2f} | {est} | {row['error']} | {row['flag']} |")
    print(f"\n{len(records)} cases.")
    return 0
