"""RL with a colocated rollout engine on the Memory page: one bar per phase of the step, stacked by
component, and each phase's components with their formulas. Every number is the estimator's
(`Estimate.rl_phases`)."""

from __future__ import annotations

from . import charts

GiB = 1024**3


def phase_rows(est) -> list[dict]:
    """One row per (phase, component) with its GiB, in the phases' order."""
    rows = []
    for order, phase in enumerate(est.rl_phases):
        for c in phase.components:
            if c.bytes:
                rows.append({"phase": phase.name, "order": order, "component": c.label, "GiB": c.bytes / GiB})
    return rows


def phases_spec(est) -> dict:
    """Stacked horizontal bars (a Vega-Lite spec written directly, as ui/charts.py does); the legend
    below them in the columns the width holds (`charts.legend`: on a phone, at its right, it took the
    whole width and cut its entries)."""
    capacity = est.fit.capacity_bytes / GiB
    rows = phase_rows(est)
    return {
        "$schema": "https://vega.github.io/schema/vega-lite/v5.json",
        "height": {"step": 40},
        "autosize": dict(charts.AUTOSIZE),
        "layer": [
            {"data": {"values": rows}, "mark": {"type": "bar"},
             "encoding": {"y": {"field": "phase", "type": "nominal", "sort": {"field": "order"}, "title": None,
                                "axis": {"labelOverlap": False}},
                          "x": {"field": "GiB", "type": "quantitative", "stack": "zero", "title": "GiB per GPU"},
                          "color": {"field": "component", "type": "nominal", "title": None,
                                    "scale": {"scheme": "tableau20"},
                                    "legend": charts.legend(dict.fromkeys(r["component"] for r in rows))},
                          "tooltip": [{"field": "phase", "type": "nominal"}, {"field": "component", "type": "nominal"},
                                      {"field": "GiB", "type": "quantitative", "format": ".2f"}]}},
            {"data": {"values": [{"capacity": capacity}]}, "mark": {"type": "rule", "color": "red"},
             "encoding": {"x": {"field": "capacity", "type": "quantitative"}}},
        ],
    }


def show(est) -> None:
    import streamlit as st
    if not est.rl_phases:
        return
    rl = est.training.rl
    st.subheader(f"RL phases ({rl.algorithm}, {rl.engine} colocated)")
    peak = max(est.rl_phases, key=lambda p: p.device_total_bytes)
    st.caption(f"Each GPU passes through these phases every step; the {peak.name} phase is the largest and decides "
               "the fit. The red line is the GPU's capacity. The stage chart below shows the training phase.")
    st.vega_lite_chart(phases_spec(est), width="stretch")
    for phase in est.rl_phases:
        with st.expander(f"{phase.name}: {phase.device_total_bytes / GiB:,.2f} GiB"):
            st.table([{"component": c.label, "GiB": round(c.bytes / GiB, 3), "formula": c.formula}
                      for c in phase.components])
