"""Cached calls into the estimator, keyed on the configuration's JSON text.

The estimator is pure, so an estimate is a function of the config alone: Streamlit's caches keep
the results across reruns and sessions. Errors are returned, not raised, so that a bad config
is a message next to the inputs and never a traceback.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import streamlit as st

from estimator import ConfigError, estimate_config, load_config
from estimator.spec.wording import verdict_word


@dataclass(frozen=True)
class Result:
    value: Any = None
    error: ConfigError | None = None

    @property
    def ok(self) -> bool:
        return self.error is None and self.value is not None


@st.cache_resource(max_entries=512, show_spinner=False)
def _estimate(config_json: str):
    """One shared Estimate per configuration, not a pickled copy per call (`st.cache_data`).

    An Estimate is immutable (frozen dataclasses, tuples, named tuples), so sharing it between
    reruns and sessions is safe; and its components may hold a function that writes their formula
    when first read, which pickle cannot copy. Reading it back also costs nothing, where a
    pickled copy cost about 0.7 ms to read, twice a rerun (the sidebar's check and the page)."""
    return estimate_config(json.loads(config_json))


@st.cache_data(max_entries=512, show_spinner=False)
def _roofline(config_json: str):
    from estimator.speed.roofline import roofline_config
    return roofline_config(load_config(json.loads(config_json)))


@st.cache_resource(max_entries=128, show_spinner=False)
def _advice(config_json: str) -> tuple[tuple, tuple]:
    """(the plan to fit, the single changes) as (description, Config, bytes, verdict, GPUs).

    The `Config` itself, shared rather than pickled (it is frozen): its dict for the Apply button
    (`Config.to_dict`, about a millisecond each, a third of the advice) is written when the button
    is clicked, not on every rerun after a change."""
    from estimator.search.advice import plan_to_fit, suggestions
    cfg = load_config(json.loads(config_json))

    def rows(found):
        return tuple((s.description, s.config, s.device_total_bytes, s.verdict, s.gpus) for s in found)
    # the planner's search takes seconds: the Memory page links to the Planner page instead
    return rows(plan_to_fit(cfg, use_planner=False)), rows(suggestions(cfg))


def advice(config_json: str) -> Result:
    return _guarded(_advice, config_json, "the advisor")


def _guarded(compute, config_json: str, what: str) -> Result:
    """The estimator's answer, or its ConfigError; a bug becomes one line, never a traceback."""
    try:
        return Result(value=compute(config_json))
    except ConfigError as exc:
        return Result(error=exc)
    except Exception as exc:
        return Result(error=ConfigError("config", type(exc).__name__, f"a configuration {what} can handle",
                                        f"internal error: {exc}"))


def estimate(config_json: str) -> Result:
    return _guarded(_estimate, config_json, "the estimator")


def roofline(config_json: str) -> Result:
    return _guarded(_roofline, config_json, "the roofline model")


@st.cache_data(ttl=3600, max_entries=64, show_spinner=False)
def fetch_hub_model(hub_id: str) -> dict:
    """A Hub model's canonical architecture and counts (a dict, so it caches); raises ConfigError."""
    from estimator.spec.config import architecture_to_dict
    from estimator.models.hub import fetch_model

    model = fetch_model(hub_id)
    return {
        "repo_id": model.repo_id,
        "arch": architecture_to_dict(model.architecture),
        "stored_count": model.stored_count,
        "computed_total": model.computed_total,
        "computed_active": model.computed_active,
        "mismatch": model.mismatch,
        "count_note": model.count_note,
        "ignored": list(model.ignored),
    }


# --- ready answers: common serving setups (the Guide page) -------------------------------------------

SERVING_MODELS = ("llama-3.1-8b", "qwen3-32b", "llama-3.1-70b")
SERVING_CONTEXTS = (4096, 32768, 131072)
SERVING_BATCHES = (1, 8, 32)
SERVING_KV_DTYPES = ("bf16", "fp8")


def serving_config(model: str, context: int, batch: int, kv_dtype: str, gpu: str) -> dict:
    """The contract's config of one serving scenario: one GPU (TP 1), bf16 weights, `batch`
    sequences whose prompt fills `context` tokens, the KV cache in `kv_dtype`."""
    return {"model": model,
            "training": {"mode": "inference", "seq_len": context, "micro_batch_size": batch,
                         "kv_cache_dtype": kv_dtype},
            "hardware": {"gpu": gpu}}


@st.cache_data(max_entries=32, show_spinner=False)
def serving_scenarios(models: tuple[str, ...], gpu: str) -> list[dict]:
    """One row per model x context x batch x KV-cache dtype, every number from `estimate_config`
    (a scenario the estimator rejects is a row that says why)."""
    rows = []
    for model in models:
        for context in SERVING_CONTEXTS:
            for batch in SERVING_BATCHES:
                for kv_dtype in SERVING_KV_DTYPES:
                    row = {"Model": model, "Context (tokens)": context, "Batch": batch, "KV cache dtype": kv_dtype}
                    try:
                        est = estimate_config(serving_config(model, context, batch, kv_dtype, gpu))
                    except Exception as exc:  # ConfigError or a bug: one row, never a traceback
                        row.update({"Verdict": f"not estimated: {getattr(exc, 'reason', '') or exc}"})
                        rows.append(row)
                        continue
                    stage = est.stages[est.peak_stage]
                    part = {c.key: c.bytes for c in stage.components}
                    row.update({"Weights (GiB)": part.get("parameters", 0) / 1024**3,
                                "KV cache (GiB)": part.get("kv_cache", 0) / 1024**3,
                                "Total per GPU (GiB)": est.device_total_bytes / 1024**3,
                                "Use": est.fit.utilization,
                                "Verdict": verdict_word(est.fit.verdict)})
                    rows.append(row)
    return rows


# --- the planner (the Planner page) -------------------------------------------------------------------

def plan_config(config: dict) -> dict:
    """What the planner reads of a configuration: the model, the training setup, the GPU, and of the
    layout only `comm_overlap` (the planner sets every other parallel field itself). One cache
    entry, and one search, serves every layout of the same run."""
    out = {k: v for k, v in config.items() if k != "parallel"}
    overlap = (config.get("parallel") or {}).get("comm_overlap")
    if overlap is not None:
        out["parallel"] = {"comm_overlap": overlap}
    return out


def _amount(value: float, unit: str) -> str:
    if unit == "bytes":
        return f"{value / 1024**3:,.2f} GiB ({value / 1e9:,.2f} GB)"
    if unit == "parameters":
        return f"{value / 1e9:,.2f}B"
    return f"{value:,.1f}"


@st.cache_data(max_entries=1, show_spinner=False)
def reference_comparisons() -> list[dict]:
    """The worked examples of other calculators and of the practical guide against this estimator
    (estimator/memory/references.py): one table per source, every number from the estimator or from the
    source's own arithmetic."""
    from estimator.memory.references import comparisons

    out = []
    for c in comparisons():
        rows = [{"Item": r.item, "As printed": r.printed, "Their arithmetic": r.arithmetic,
                 "Theirs": _amount(r.theirs, r.unit), "This estimate": _amount(r.ours, r.unit),
                 "Reproduced": r.reproduced, "What this estimate counts": r.ours_text, "Why they differ": r.why}
                for r in c.rows]
        out.append({"title": c.title, "source": c.source, "recipe": c.recipe, "notes": list(c.notes), "rows": rows})
    return out
