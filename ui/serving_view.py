"""The Serving page's glue: cached serving estimates and plans, the memory-split chart, the tables.

Every number comes from `estimator.serving` (the CLI's `serve` and `serve-plan`); this module only
caches them by the configuration's JSON text and lays them out.
"""

from __future__ import annotations

import json

import streamlit as st

from estimator import ConfigError, load_config

from .compute import Result

GiB = 1024**3


@st.cache_resource(max_entries=256, show_spinner=False)
def _serving(config_json: str):
    from estimator.serving.service import serving_config
    return serving_config(load_config(json.loads(config_json)))


def serving(config_json: str) -> Result:
    try:
        return Result(value=_serving(config_json))
    except ConfigError as exc:
        return Result(error=exc)


@st.cache_resource(max_entries=64, show_spinner=False)
def _plan(config_json: str, users: int, context: int):
    from estimator.serving.planner import serve_plan
    from estimator.serving.service import checkpoint_of
    from estimator.spec.serving import Serving
    cfg = load_config(json.loads(config_json))
    return serve_plan(cfg.architecture, cfg.serving or Serving(), cfg.hardware, users, context, checkpoint_of(cfg.model))


def plan(config_json: str, users: int, context: int) -> Result:
    try:
        return Result(value=_plan(config_json, users, context))
    except ConfigError as exc:
        return Result(error=exc)


def split_rows(result) -> list[dict]:
    """The limiting GPU's memory, term by term, for the chart and its table: inside the engine's budget
    (weights, activations, non-torch, CUDA graphs when the version counts them there, KV cache, what the
    blocks leave unused), then outside it (CUDA graphs on top of the budget, the CUDA context)."""
    s = result.limiting
    rows = [{"term": c.label, "GiB": c.bytes / GiB, "formula": c.formula} for c in s.components if c.bytes]
    rows.append({"term": "KV cache", "GiB": result.capacity.kv_cache_bytes / GiB,
                 "formula": f"{result.capacity.num_blocks:,} blocks"})
    unused = result.budget_bytes - sum(c.bytes for c in s.components if "on top" not in c.label
                                       and "outside" not in c.label) - result.capacity.kv_cache_bytes
    if unused > 0:
        rows.append({"term": "Budget left over (less than a block)", "GiB": unused / GiB, "formula": "remainder"})
    rows.append({"term": "CUDA context (outside the budget)", "GiB": result.context_bytes / GiB,
                 "formula": "driver context and library handles"})
    return rows


def split_chart_spec(rows: list[dict]) -> dict:
    """One bar per term, in the order of the table (the budget's terms first, then what lies outside it)."""
    values = [{"term": r["term"], "GiB": round(r["GiB"], 3), "order": i} for i, r in enumerate(rows)]
    return {"data": {"values": values}, "mark": {"type": "bar", "tooltip": True},
            "encoding": {"y": {"field": "term", "type": "nominal", "sort": {"field": "order"}, "title": None,
                               "axis": {"labelLimit": 320}},
                         "x": {"field": "GiB", "type": "quantitative", "title": "GiB on the limiting GPU"},
                         "color": {"field": "term", "type": "nominal", "legend": None}},
            "height": {"step": 26}}
