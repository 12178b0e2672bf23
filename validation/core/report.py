"""The estimator against a harness's records: the tables `python -m validation... report` prints.
They read the recorded JSON and the estimator only (no torch, no framework)."""

from __future__ import annotations

GiB = 2**30


# The components only a real GPU allocates: the math libraries' workspaces (estimator/memory/workspaces.py)
# and TransformerEngine's cached dummy weight gradients (estimator/memory/wgrad_cache.py; the harnesses run
# without TransformerEngine)
GPU_ONLY = ("workspace", "wgrad_cache")


def tensors_peak(stage) -> int:
    """What a fake-tensor harness can measure of a stage's allocated peak: all of it but the GPU_ONLY
    components, which no tensor of the step owns; the real-GPU records (tests/data/measured/gpu) show a
    GPU's peak is the fake peak plus those workspaces."""
    return stage.allocated_peak_bytes - sum(c.bytes for key in GPU_ONLY if (c := stage.component(key)))


def percent(estimated: float, measured: float, digits: int = 1) -> str:
    """The estimate's signed error against the measurement."""
    if measured == 0:
        return "exact" if estimated == 0 else "n/a"
    return f"{100 * (estimated - measured) / measured:+.{digits}f}%"


def estimator_missing() -> bool:
    """Say so when the estimator cannot be imported."""
    try:
        import estimator  # noqa: F401
    except ImportError as e:
        print(f"cannot compare: `import estimator` failed ({e}).")
        return True
    return False


def estimate_reduced(config: dict, reduce=None):
    """(result, notes): the estimate of `config`; while the estimator refuses it (a field it
    cannot express yet), of `reduce(config)` -> (reduced config, a note naming what it dropped),
    until `reduce` has nothing left to drop (an empty note)."""
    from estimator import estimate_config

    notes = []
    while True:
        try:
            return estimate_config(config), notes
        except Exception:  # noqa: BLE001 -- a refused field; `reduce` names what it drops
            if reduce is None:
                raise
            config, note = reduce(config)
            if not note:
                raise
            notes.append(note)


def optimizer_step(stage) -> dict:
    """Bytes per component of the estimate at the optimizer step."""
    return {c.key: c.bytes for c in next(p for p in stage.phases if p.name == "optimizer").components}


def state_table(records: list[dict], digits: int, reduce=None) -> list[float]:
    """Print the allocated peak and the model states at the optimizer step (parameters, gradients,
    optimizer states with any master copy), measured against estimated, a row per record; with
    `reduce`, a column flags the fields dropped. Returns the |peak errors|."""
    flags = reduce is not None
    print("| case | peak phase | measured GiB | estimated GiB | peak error | params | grads | optimizer |"
          + (" flag |" if flags else ""))
    print("|---|---|---:|---:|---:|---:|---:|---:|" + ("---|" if flags else ""))
    errors = []
    for r in records:
        m = r["measured"]
        try:
            result, dropped = estimate_reduced(r["config"], reduce)
        except Exception as e:  # one bad case must not hide the others
            print(f"| {r['id']} | {m['peak_phase']} | {m['peak_bytes'] / GiB:.2f} | estimator failed: {e} | | | |"
                  + (" | |" if flags else " |"))
            continue
        stage = result.stages[result.peak_stage]
        step, ms = optimizer_step(stage), m["phases"]["optimizer"]
        peak = tensors_peak(stage)
        errors.append(abs(peak - m["peak_bytes"]) / m["peak_bytes"])
        cells = [percent(step["parameters"], ms["parameters"], digits),
                 percent(step["gradients"], ms["gradients"], digits),
                 percent(step["optimizer_states"] + step.get("master_weights", 0), ms["optimizer_states"], digits)]
        flag = f" {'estimated without ' + ', '.join(dropped) if dropped else ''} |" if flags else ""
        print(f"| {r['id']} | {m['peak_phase']} | {m['peak_bytes'] / GiB:.2f} | {peak / GiB:.2f} | "
              f"{percent(peak, m['peak_bytes'], digits)} | " + " | ".join(cells) + " |" + flag)
    return errors


def peak_report(records: list[dict], reduce) -> int:
    """The allocated peak, measured against estimated, a row per record, noting what `reduce`
    dropped for the estimator to accept the configuration."""
    if estimator_missing():
        return 1
    print("| case | peak phase | measured GiB | estimated GiB | error | note |")
    print("|---|---|---:|---:|---:|---|")
    for r in records:
        m = r["measured"]
        try:
            result, notes = estimate_reduced(r["config"], reduce)
            peak = tensors_peak(result.stages[result.peak_stage])
            estimated, error, note = f"{peak / GiB:.2f}", percent(peak, m["peak_bytes"]), ", ".join(notes)
        except Exception as e:  # one bad case must not hide the others
            estimated, error, note = "", "", f"estimator failed: {e}"
        print(f"| {r['id']} | {m['peak_phase']} | {m['peak_bytes'] / GiB:.2f} | {estimated} | {error} | {note} |")
    print(f"\n{len(records)} cases.")
    return 0
