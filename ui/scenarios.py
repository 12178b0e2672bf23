"""Named scenarios (Compare page) and user presets (Presets page): their JSON form and tables.
No Streamlit here.

Both are lists of ``{"name": str, "config": <the contract's JSON>}``; a file holds
``{"scenarios": [...]}`` or ``{"presets": [...]}``. Importing also accepts a bare config (one
entry) and a bare list.
"""

from __future__ import annotations

import json
import uuid

import pandas as pd

from estimator.spec.errors import ConfigError
from estimator.spec.wording import verdict_word

from .fields import ALL_FIELDS, LABELS, ui_values_from_config

MAX_SCENARIOS = 6
GiB = 1024**3


def new_entry(name: str, config: dict) -> dict:
    return {"id": uuid.uuid4().hex[:8], "name": name, "config": json.loads(json.dumps(config))}


def dump(entries: list[dict], kind: str) -> str:
    return json.dumps({kind: [{"name": e["name"], "config": e["config"]} for e in entries]}, indent=2) + "\n"


def parse(text: str, kind: str) -> list[dict]:
    """Entries from an exported file (or one bare config); raises ConfigError with a clear message."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError("file", "JSON", "a JSON file exported from this app",
                          f"invalid JSON at line {exc.lineno} column {exc.colno}: {exc.msg}") from None
    if isinstance(data, dict) and "model" in data:
        items = [{"name": "Imported", "config": data}]
    elif isinstance(data, dict) and isinstance(data.get(kind), list):
        items = data[kind]
    elif isinstance(data, list):
        items = data
    else:
        raise ConfigError("file", type(data).__name__, f'{{"{kind}": [{{"name": ..., "config": ...}}]}} or a config')
    out = []
    for i, item in enumerate(items):
        if not isinstance(item, dict) or not isinstance(item.get("config"), dict) or "model" not in item["config"]:
            raise ConfigError(f"{kind}[{i}]", "entry", '{"name": ..., "config": {"model": ..., ...}}')
        ui_values_from_config(item["config"])  # unknown fields and bad values raise here
        out.append(new_entry(str(item.get("name") or f"Imported {i + 1}"), item["config"]))
    return out


def _model_text(config: dict) -> str:
    model = config.get("model")
    if isinstance(model, str):
        return model
    if isinstance(model, dict):
        return f"custom ({model.get('name', 'architecture')})"
    return str(model)


def settings_diff(entries: list[dict]) -> pd.DataFrame:
    """The settings that differ between the entries: one row per setting, one column per entry."""
    rows = {"Model": [_model_text(e["config"]) for e in entries]}
    values = [ui_values_from_config(e["config"]) for e in entries]
    for f in ALL_FIELDS:
        row = [v.get(f.name) for v in values]
        rows[LABELS.get(f.name, f.name)] = ["auto" if x is None else x for x in row]
    names = [e["name"] for e in entries]
    df = pd.DataFrame.from_dict(rows, orient="index", columns=names)
    if len(entries) > 1:
        df = df[df.astype(str).nunique(axis=1) > 1]
    return df.astype(str)


def totals_frame(named: list[tuple[str, object]]) -> pd.DataFrame:
    """Totals and fit per scenario, from the estimator's numbers."""
    rows = []
    for name, est in named:
        peak = est.stages[est.peak_stage]
        rows.append({
            "Scenario": name,
            "Device total (GiB)": est.device_total_bytes / GiB,
            "Allocated peak (GiB)": est.allocated_peak_bytes / GiB,
            "Peak stage": f"{est.peak_stage} ({peak.peak_phase})",
            "GPU": est.fit.gpu,
            "Capacity (GiB)": est.fit.capacity_bytes / GiB,
            "Use": est.fit.utilization,
            "Verdict": verdict_word(est.fit.verdict),
            "GPUs": est.parallel.gpus,
            "Parameters": est.parameters_total,
            "Active": est.parameters_active,
            "Trainable": est.parameters_trainable,
        })
    return pd.DataFrame(rows)


def read_upload(upload, kind: str) -> tuple[list[dict], str]:
    """The entries of an uploaded JSON file of `kind` ("scenarios" or "presets"), or [] and the
    message that says why it could not be read."""
    from .fields import friendly_message
    try:
        return parse(upload.getvalue().decode("utf-8", errors="replace"), kind), ""
    except ConfigError as exc:
        return [], f"Could not import {upload.name}: {friendly_message(exc)}"
