"""Measured Megatron-Core ranks against today's estimate of the same configuration."""

from __future__ import annotations

from ..core.report import optimizer_step, percent, tensors_peak

MiB = 2**20


def estimated_layer_bytes(result, record) -> float:
    """Today's per-layer activation estimate for the record's layer kind and recompute."""
    from estimator.memory.activations.layer import layer_bytes, layer_input_bytes

    training, arch, par = result.training, result.architecture, result.parallel
    if training.recompute == "full":
        return layer_input_bytes(arch, training, par)
    kind = "moe" if record["config"]["model"].get("num_experts") else "dense"
    return layer_bytes(arch, training, par, kind, selective=training.recompute == "selective")


def rows(records: list[dict]) -> list[dict]:
    from estimator import estimate_config

    out = []
    for r in records:
        m = r["measured"]
        row = {"id": r["id"], "not_expressible": r.get("not_expressible", [])}
        try:
            result = estimate_config(r["config"])
        except Exception as e:  # one refused case must not hide the others
            row["error"] = str(e)
            out.append(row)
            continue
        stage = result.stages[r["stage"]]
        phase = optimizer_step(stage)
        layers = m["layer_kept_bytes"]
        # MoE models with leading dense layers: compare the MoE layers (the last ones built)
        layer = layers[-1] if layers else 0
        row.update(
            layer_measured=layer, layer_estimated=estimated_layer_bytes(result, r),
            params=(m["parameters"], phase["parameters"]), grads=(m["gradients"], phase["gradients"]),
            states=(m["optimizer_states"], phase["optimizer_states"] + phase.get("master_weights", 0)),
            peak=(m["peak_bytes"], tensors_peak(stage)),
            in_flight=stage.in_flight_microbatches)
        out.append(row)
    return out


def report(records: list[dict]) -> int:
    try:
        table = rows(records)
    except ImportError as e:
        print(f"cannot compare: {e}")
        return 1
    print("| case | layer act. MiB meas / est | err | params | grads | opt. states | peak GiB meas / est | err | not expressible |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---|")
    for row in table:
        if "error" in row:
            print(f"| {row['id']} | estimator refused: {row['error']} | | | | | | | |")
            continue
        lm, le = row["layer_measured"], row["layer_estimated"]
        pm, pe = row["peak"]
        print(f"| {row['id']} | {lm / MiB:.1f} / {le / MiB:.1f} | {percent(le, lm)} | "
              + " | ".join(percent(e, m) for m, e in (row["params"], row["grads"], row["states"]))
              + f" | {pm / 2**30:.2f} / {pe / 2**30:.2f} | {percent(pe, pm)} | "
              + (", ".join(row["not_expressible"]) or "") + " |")
    print(f"\n{len(table)} cases. Peak: one micro-batch in flight on the measured rank "
          "(global batch = micro-batch x dp).")
    return 0
