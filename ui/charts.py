"""Altair charts (no Streamlit here): the same builders serve the pages and the PDF report.

Every memory component has one fixed colour and one name, shared by all pages and the PDF;
`.streamlit/config.toml` lists the same colours, in the same order, as the chart palette of both
themes. Numbers are taken from the estimator's objects as they are; charts only convert bytes to
GiB for the axis.

Each chart the pages redraw exists twice over the same rows: an Altair builder (`stage_chart`,
`phase_chart`, `roofline_chart`: validated against the Vega-Lite schema, used by the PDF) and a
`*_spec` builder that writes the same Vega-Lite dict directly. Building the Altair objects and
validating them took two thirds of a Memory page rerun; the dicts take about a millisecond.
tests/test_charts.py holds each `*_spec` equal to its Altair twin's validated `to_dict()`.
"""

from __future__ import annotations

import copy
import hashlib
import json
import math
from typing import Iterable

import altair as alt
import pandas as pd

GiB = 1024**3

# key -> (name, colour); the order is the stacking order (model states at the bottom)
COMPONENTS: dict[str, tuple[str, str]] = {
    "parameters": ("Parameters", "#4C78A8"),
    "master_weights": ("Master weights", "#72B7B2"),
    "gradients": ("Gradients", "#F58518"),
    "optimizer_states": ("Optimizer states", "#E45756"),
    "activations": ("Activations", "#54A24B"),
    "mtp": ("Multi-token prediction", "#88D27A"),
    "logits": ("Logits and loss", "#B279A2"),
    "kv_cache": ("KV cache", "#9D755D"),
    "recurrent_state": ("Recurrent and conv state", "#C49C94"),
    "transient": ("Transient buffers", "#EECA3B"),
    "workspace": ("Library workspaces", "#79706E"),
    "wgrad_cache": ("TE dummy weight gradients", "#9ECAE9"),
    "communication": ("NCCL buffers", "#FF9DA6"),
    "runtime": ("CUDA context", "#8C8C8C"),
    "managed": ("Paged optimizer states (managed memory)", "#9467BD"),
    "fragmentation": ("Fragmentation", "#BAB0AC"),
}
_EXTRA_COLOURS = ("#17BECF", "#BCBD22", "#7F7F7F", "#AEC7E8", "#FFBB78", "#98DF8A")
VERDICT_COLOURS = {"fits": "#2E9E5B", "tight": "#E3A21A", "oom": "#D64545"}
BOUND_COLOURS = {"compute": "#4C78A8", "memory": "#F58518", "communication": "#E45756", "latency": "#8C8C8C"}
PALETTE = [colour for _, colour in COMPONENTS.values()]


def component_name(key: str, label: str = "") -> str:
    return COMPONENTS[key][0] if key in COMPONENTS else (label or key.replace("_", " ").capitalize())


def _scale_lists(rows: Iterable[tuple[str, str]]) -> tuple[list[str], list[str]]:
    """The names and colours of the components present (key, name as the rows show it), in the fixed order: each
    name once, several names under one key that COMPONENTS does not name (the "buffers" of a pipeline schedule and
    Megatron's global memory buffer) each with a colour of its own."""
    present = list(dict.fromkeys(rows))
    ordered = [p for k in COMPONENTS for p in present if p[0] == k] + [p for p in present if p[0] not in COMPONENTS]
    names, colours = [], []
    extra = 0
    for key, name in ordered:
        names.append(name)
        if key in COMPONENTS:
            colours.append(COMPONENTS[key][1])
        else:
            colours.append(_EXTRA_COLOURS[extra % len(_EXTRA_COLOURS)])
            extra += 1
    return names, colours


def _scale(rows: Iterable[tuple[str, str]]) -> tuple[list[str], alt.Scale]:
    """The colour scale for the components present, in the fixed order."""
    names, colours = _scale_lists(rows)
    return names, alt.Scale(domain=names, range=colours)


def _order(key: str) -> int:
    keys = list(COMPONENTS)
    return keys.index(key) if key in keys else len(keys)


# A legend sits below the plot, in as many columns as the chart's width holds (a Vega expression, so
# the same spec serves a phone and a desktop), each label cut to its column; the chart grows
# downwards to hold it (`AUTOSIZE`: only the width fits the container, where Streamlit's default
# fits the height too and a legend taller than its room was clipped). The columns follow the
# container's width (Vega's containerSize()), which the layout does not change: counted from the
# plot's own `width`, which shrinks as the legend is laid out, a legend could gain rows after the
# height was settled and be cut off; without a container (an image rendered headless,
# exports.chart_png) they follow the chart's set width. A label is cut to its share of the plot's
# width (the legend starts where the plot does, after the y axis).
_CHART_WIDTH = "(containerSize()[0] > 0 ? containerSize()[0] : width)"
LEGEND_CHAR_PX = 6.5  # about one character of an 11 px legend label
LEGEND_ENTRY_PX = 40  # the symbol and the gaps around a label
LEGEND_MAX_LABEL_PX = 220  # a longer label shares a wide chart's row with others, cut; on a phone it has the width
AUTOSIZE = {"contains": "padding", "type": "fit-x"}


def legend(labels: Iterable[str], title: str | None = None) -> dict:
    """A bottom legend for `labels`: its columns and label limit follow the chart's width."""
    labels = list(labels)
    longest = max((len(text) for text in labels), default=1) * LEGEND_CHAR_PX
    column = round(min(longest, LEGEND_MAX_LABEL_PX) + LEGEND_ENTRY_PX)
    columns = f"max(1, min({max(len(labels), 1)}, floor({_CHART_WIDTH} / {column})))"
    out = {"columns": {"expr": columns},
           "labelLimit": {"expr": f"floor(width / ({columns})) - {LEGEND_ENTRY_PX}"}, "orient": "bottom"}
    return out if title is None else {**out, "title": title}


def capacity_title(capacity_bytes: int) -> dict:
    """The GPU's capacity, named above the plot: a label beside the dashed rule ran into a bar over
    capacity and onto the peak label near it."""
    return {"anchor": "start", "color": "#D64545", "fontSize": 12, "fontWeight": "normal",
            "text": f"Dashed line: GPU capacity {capacity_bytes / GiB:.1f} GiB"}


def peak_label_gib(peak_gib: float, capacity_gib: float | None) -> float:
    """Where the peak label stands: above the peak bar, or above the capacity rule when the rule
    runs just over the bar and would cross the label (within 6% of the axis)."""
    if capacity_gib and 0 <= capacity_gib - peak_gib <= 0.06 * capacity_gib:
        return capacity_gib
    return peak_gib


def stage_rows(estimate) -> list[dict]:
    rows = []
    for s in estimate.stages:
        stage = f"Stage {s.stage}"
        for c in s.components:
            rows.append({"stage": stage, "stage_index": s.stage, "key": c.key,
                         "component": component_name(c.key, c.label), "bytes": c.bytes, "GiB": c.bytes / GiB,
                         "order": _order(c.key), "peak": s.stage == estimate.peak_stage,
                         "peak_phase": s.peak_phase})
    return rows


def stage_frame(estimate) -> pd.DataFrame:
    return pd.DataFrame(stage_rows(estimate))


def _stacked_bars(df: pd.DataFrame, x: str, order: list[str], x_title: str, y_title: str,
                  tooltip: list) -> alt.Chart:
    """Components stacked in their fixed colours and order, one bar per `x` category."""
    names, scale = _scale(zip(df["key"], df["component"]))
    return alt.Chart(df).mark_bar().encode(
        x=alt.X(f"{x}:N", sort=order, title=x_title, axis=alt.Axis(labelAngle=0)),
        y=alt.Y("sum(GiB):Q", title=y_title, stack="zero"),
        color=alt.Color("component:N", scale=scale, sort=names, title="Component", legend=alt.Legend(**legend(names))),
        order=alt.Order("order:Q"),
        tooltip=tooltip,
    )


def _peak_label(x: str, category: str, gib: float, text: str, order: list[str]) -> alt.Chart:
    marker = pd.DataFrame([{x: category, "GiB": gib, "text": text}])
    return alt.Chart(marker).mark_text(dy=-10, fontWeight="bold", color="#D64545").encode(
        x=alt.X(f"{x}:N", sort=order), y="GiB:Q", text="text:N")


def stage_chart(estimate, capacity_bytes: int | None = None, height: int = 360) -> alt.Chart:
    """A stacked bar per pipeline stage, the peak stage marked, the GPU's capacity as a rule."""
    df = stage_frame(estimate)
    order = [f"Stage {s.stage}" for s in estimate.stages]
    bars = _stacked_bars(df, "stage", order, "Pipeline stage", "GiB per GPU",
                         [alt.Tooltip("stage:N"), alt.Tooltip("component:N"),
                          alt.Tooltip("GiB:Q", format=".2f"), alt.Tooltip("bytes:Q", format=",")])
    peak = estimate.stages[estimate.peak_stage]
    at = peak_label_gib(peak.device_total_bytes / GiB, capacity_bytes / GiB if capacity_bytes else None)
    layers = [bars, _peak_label("stage", f"Stage {peak.stage}", at, f"peak ({peak.peak_phase})", order)]
    chart_title = {}
    if capacity_bytes:
        cap = pd.DataFrame([{"GiB": capacity_bytes / GiB}])
        layers.append(alt.Chart(cap).mark_rule(strokeDash=[6, 4], color="#D64545").encode(y="GiB:Q"))
        chart_title = {"title": alt.TitleParams(**capacity_title(capacity_bytes))}
    return alt.layer(*layers).properties(height=height, autosize=AUTOSIZE, **chart_title)


def phase_rows(stage) -> list[dict]:
    rows = []
    for i, phase in enumerate(stage.phases):
        totals: dict[str, int] = {}
        labels: dict[str, str] = {}
        for c in phase.components:
            totals[c.key] = totals.get(c.key, 0) + c.bytes
            labels.setdefault(c.key, c.label)
        for key, value in totals.items():
            rows.append({"phase": phase.name, "phase_order": i, "key": key,
                         "component": component_name(key, labels[key]), "bytes": value, "GiB": value / GiB,
                         "order": _order(key), "allocated_GiB": phase.allocated_bytes / GiB,
                         "peak": phase.name == stage.peak_phase})
    return rows


def phase_frame(stage) -> pd.DataFrame:
    return pd.DataFrame(phase_rows(stage))


def phase_chart(stage, height: int = 300) -> alt.Chart:
    """Live tensors through one step of a stage: forward, backward, optimizer step."""
    df = phase_frame(stage)
    order = [p.name for p in stage.phases]
    bars = _stacked_bars(df, "phase", order, "Phase of the step", "Allocated GiB",
                         [alt.Tooltip("phase:N"), alt.Tooltip("component:N"), alt.Tooltip("GiB:Q", format=".2f")])
    peak = next(p for p in stage.phases if p.name == stage.peak_phase)
    label = _peak_label("phase", peak.name, peak.allocated_bytes / GiB, "peak", order)
    return alt.layer(bars, label).properties(height=height, autosize=AUTOSIZE)


def compare_frame(named_estimates: list[tuple[str, object]]) -> pd.DataFrame:
    rows = []
    for name, est in named_estimates:
        stage = est.stages[est.peak_stage]
        for c in stage.components:
            rows.append({"scenario": name, "key": c.key, "component": component_name(c.key, c.label),
                         "bytes": c.bytes, "GiB": c.bytes / GiB, "order": _order(c.key),
                         "stage": f"Stage {stage.stage}"})
    return pd.DataFrame(rows)


def compare_chart(named_estimates: list[tuple[str, object]], height: int = 380) -> alt.Chart:
    """One stacked bar per scenario: the components of its peak stage."""
    df = compare_frame(named_estimates)
    order = [n for n, _ in named_estimates]
    return _stacked_bars(df, "scenario", order, "Scenario (peak stage)", "GiB per GPU",
                         [alt.Tooltip("scenario:N"), alt.Tooltip("stage:N"), alt.Tooltip("component:N"),
                          alt.Tooltip("GiB:Q", format=".2f")]).properties(height=height, autosize=AUTOSIZE)


def _roofs(operations: list[dict], peaks: list[float], bandwidth: float) -> tuple[list[dict], list[dict]]:
    """The roof lines (80 log-spaced steps spanning the ridges and the operations) and their labels."""
    peaks = sorted({p for p in peaks if p}) or [1.0]
    ais = [op["arithmetic_intensity"] for op in operations
           if op.get("arithmetic_intensity") and 0 < op["arithmetic_intensity"] < float("inf")]
    ridges = [p / bandwidth for p in peaks]
    lo = min([min(ridges) / 100] + [a / 2 for a in ais])
    hi = max([max(ridges) * 100] + [a * 2 for a in ais])
    xs = [lo * (hi / lo) ** (i / 80) for i in range(81)]
    roof_rows, text_rows = [], []
    for p in peaks:
        name = f"roof {p / 1e12:,.0f} TFLOP/s"
        roof_rows += [{"arithmetic_intensity": x, "TFLOP/s": min(p, bandwidth * x) / 1e12, "roof": name} for x in xs]
        text_rows.append({"arithmetic_intensity": hi, "TFLOP/s": p / 1e12, "text": name})
    ridge = ridges[-1]
    text_rows.append({"arithmetic_intensity": ridge, "TFLOP/s": bandwidth * ridge / 1e12 / 4,
                      "text": f"ridge {ridge:,.0f} FLOP/B"})
    return roof_rows, text_rows


_ROOFLINE_TOOLTIP = [("name", "N", {}), ("phase", "N", {}), ("bound", "N", {}),
                     ("arithmetic_intensity", "Q", {"format": ",.1f", "title": "FLOP/byte"}),
                     ("TFLOP/s", "Q", {"format": ",.1f"}), ("time_s", "Q", {"format": ".3e", "title": "time (s)"})]
_PHASE_SHAPES = {"domain": ["forward", "backward"], "range": ["circle", "triangle-down"]}
_PHASE_LEGEND = {"symbolFillColor": "#888888", "symbolStrokeColor": "#888888"}


def roofline_chart(operations: list[dict], peaks: list[float], bandwidth: float, height: int = 420) -> alt.Chart:
    """Log-log roofline: the GPU's compute roof(s) and its bandwidth roof, one point per operation
    at its attained FLOP/s (colour: what bounds it; shape: forward or backward)."""
    roof_rows, text_rows = _roofs(operations, peaks, bandwidth)
    x = alt.X("arithmetic_intensity:Q", scale=alt.Scale(type="log"), title="Arithmetic intensity (FLOP/byte)")
    y = alt.Y("TFLOP/s:Q", scale=alt.Scale(type="log"), title="Attainable TFLOP/s")
    line = alt.Chart(pd.DataFrame(roof_rows)).mark_line(color="#888888", strokeWidth=2).encode(
        x=x, y=y, detail="roof:N")
    labels = alt.Chart(pd.DataFrame(text_rows)).mark_text(align="right", dy=-8, color="#888888").encode(
        x="arithmetic_intensity:Q", y="TFLOP/s:Q", text="text:N")
    layers = [line, labels]
    ops = pd.DataFrame(operations)
    if not ops.empty:
        ops = ops[(ops["flops"] > 0) & (ops["bytes"] > 0) & (ops["time_s"] > 0)].copy()
    if not ops.empty:
        ops["TFLOP/s"] = ops["flops"] / ops["time_s"] / 1e12
        bounds = sorted(ops["bound"].unique())
        colours = [BOUND_COLOURS.get(b, "#17BECF") for b in bounds]
        tooltip = [alt.Tooltip(f"{field}:{t}", **extra) for field, t, extra in _ROOFLINE_TOOLTIP]
        layers.append(alt.Chart(ops).mark_point(size=90, filled=True, opacity=0.85).encode(
            x=x, y=y,
            color=alt.Color("bound:N", scale=alt.Scale(domain=bounds, range=colours), title="Bound by"),
            shape=alt.Shape("phase:N", title="Phase", scale=alt.Scale(**_PHASE_SHAPES),
                            legend=alt.Legend(**_PHASE_LEGEND)),
            tooltip=tooltip))
    return alt.layer(*layers).properties(height=height)


# --- the same charts as Vega-Lite dicts, without Altair ---------------------------------------------
# Each `*_spec` returns exactly what its Altair twin's `to_dict()` returns (tests/test_charts.py):
# the same inline datasets under the same names, the same encodings, Altair's theme config and
# schema URL, so the pages draw the same chart without paying for Altair's objects and validation.

def _records(rows: list[dict]) -> list[dict]:
    """`rows` as Altair inlines a DataFrame made of them (pandas, then Altair's sanitizer): a column
    of numbers holding a float or a gap is float, NaN and infinities become null, a gap is null."""
    columns = list(dict.fromkeys(k for row in rows for k in row))
    floats = []
    for col in columns:
        values = [row.get(col) for row in rows]
        numbers = all(v is None or (isinstance(v, (int, float)) and not isinstance(v, bool)) for v in values)
        if numbers and any(v is None or isinstance(v, float) for v in values):
            floats.append(col)
    if not floats and all(len(row) == len(columns) for row in rows):
        return [dict(row) for row in rows]
    out = []
    for row in rows:
        rec = {col: row.get(col) for col in columns}
        for col in floats:
            v = rec[col]
            rec[col] = float(v) if v is not None and math.isfinite(v) else None
        out.append(rec)
    return out


def _dataset_name(values: list[dict]) -> str:
    """The name Altair gives an inline dataset (altair.vegalite.v6.api._dataset_name)."""
    if values == [{}]:
        return "empty"
    return "data-" + hashlib.sha256(json.dumps(values, sort_keys=True, default=str).encode()).hexdigest()[:32]


def _layered(layers: list[tuple[list[dict], dict]], height: int, **top) -> dict:
    """A layered spec as Altair writes it: each layer's rows become a named top-level dataset;
    `top`: more top-level properties (autosize, title)."""
    datasets: dict[str, list[dict]] = {}
    specs = []
    for rows, layer in layers:
        values = _records(rows)
        name = _dataset_name(values)
        datasets.setdefault(name, values)
        specs.append({"data": {"name": name}, **layer})
    return {**copy.deepcopy(alt.theme.get()()), "layer": specs, "height": height, **top, "$schema": alt.SCHEMA_URL,
            "datasets": datasets}


def _field(name: str, kind: str, **extra) -> dict:
    return {"field": name, "type": {"N": "nominal", "Q": "quantitative"}[kind], **extra}


def _stacked_bars_layer(rows: list[dict], x: str, order: list[str], x_title: str, y_title: str,
                        tooltip: list[dict]) -> dict:
    names, colours = _scale_lists((r["key"], r["component"]) for r in rows)
    return {"mark": {"type": "bar"}, "encoding": {
        "color": _field("component", "N", legend=legend(names), scale={"domain": names, "range": colours}, sort=names,
                        title="Component"),
        "order": _field("order", "Q"),
        "tooltip": tooltip,
        "x": _field(x, "N", axis={"labelAngle": 0}, sort=order, title=x_title),
        "y": _field("GiB", "Q", aggregate="sum", stack="zero", title=y_title)}}


def _peak_label_layer(x: str, category: str, gib: float, text: str, order: list[str]) -> tuple[list[dict], dict]:
    return ([{x: category, "GiB": gib, "text": text}],
            {"mark": {"type": "text", "color": "#D64545", "dy": -10, "fontWeight": "bold"},
             "encoding": {"text": _field("text", "N"), "x": _field(x, "N", sort=order), "y": _field("GiB", "Q")}})


def stage_spec(estimate, capacity_bytes: int | None = None, height: int = 360) -> dict:
    """`stage_chart(...).to_dict()`, written directly."""
    rows = stage_rows(estimate)
    order = [f"Stage {s.stage}" for s in estimate.stages]
    tooltip = [_field("stage", "N"), _field("component", "N"), _field("GiB", "Q", format=".2f"),
               _field("bytes", "Q", format=",")]
    peak = estimate.stages[estimate.peak_stage]
    at = peak_label_gib(peak.device_total_bytes / GiB, capacity_bytes / GiB if capacity_bytes else None)
    layers = [(rows, _stacked_bars_layer(rows, "stage", order, "Pipeline stage", "GiB per GPU", tooltip)),
              _peak_label_layer("stage", f"Stage {peak.stage}", at, f"peak ({peak.peak_phase})", order)]
    top = {"autosize": dict(AUTOSIZE)}
    if capacity_bytes:
        layers.append(([{"GiB": capacity_bytes / GiB}], {"mark": {"type": "rule", "color": "#D64545",
                                                                  "strokeDash": [6, 4]},
                                                         "encoding": {"y": _field("GiB", "Q")}}))
        top["title"] = capacity_title(capacity_bytes)
    return _layered(layers, height, **top)


def phase_spec(stage, height: int = 300) -> dict:
    """`phase_chart(...).to_dict()`, written directly."""
    rows = phase_rows(stage)
    order = [p.name for p in stage.phases]
    tooltip = [_field("phase", "N"), _field("component", "N"), _field("GiB", "Q", format=".2f")]
    peak = next(p for p in stage.phases if p.name == stage.peak_phase)
    return _layered([(rows, _stacked_bars_layer(rows, "phase", order, "Phase of the step", "Allocated GiB", tooltip)),
                     _peak_label_layer("phase", peak.name, peak.allocated_bytes / GiB, "peak", order)], height,
                    autosize=dict(AUTOSIZE))


def roofline_spec(operations: list[dict], peaks: list[float], bandwidth: float, height: int = 420) -> dict:
    """`roofline_chart(...).to_dict()`, written directly."""
    roof_rows, text_rows = _roofs(operations, peaks, bandwidth)

    def x() -> dict:  # a fresh dict per layer: no layer's encoding aliases another's
        return _field("arithmetic_intensity", "Q", scale={"type": "log"}, title="Arithmetic intensity (FLOP/byte)")

    def y() -> dict:
        return _field("TFLOP/s", "Q", scale={"type": "log"}, title="Attainable TFLOP/s")
    layers = [(roof_rows, {"mark": {"type": "line", "color": "#888888", "strokeWidth": 2},
                           "encoding": {"detail": _field("roof", "N"), "x": x(), "y": y()}}),
              (text_rows, {"mark": {"type": "text", "align": "right", "color": "#888888", "dy": -8},
                           "encoding": {"text": _field("text", "N"), "x": _field("arithmetic_intensity", "Q"),
                                        "y": _field("TFLOP/s", "Q")}})]
    # the rows the Altair twin keeps (NaN compares false there, as it does here)
    ops = [dict(op) for op in _records(operations)
           if all(op.get(k) is not None and op[k] > 0 for k in ("flops", "bytes", "time_s"))]
    if ops:
        for op in ops:
            op["TFLOP/s"] = op["flops"] / op["time_s"] / 1e12
        bounds = sorted({op["bound"] for op in ops})
        colours = [BOUND_COLOURS.get(b, "#17BECF") for b in bounds]
        layers.append((ops, {"mark": {"type": "point", "filled": True, "opacity": 0.85, "size": 90}, "encoding": {
            "color": _field("bound", "N", scale={"domain": bounds, "range": colours}, title="Bound by"),
            "shape": _field("phase", "N", legend=dict(_PHASE_LEGEND),
                            scale={k: list(v) for k, v in _PHASE_SHAPES.items()}, title="Phase"),
            "tooltip": [_field(f, t, **extra) for f, t, extra in _ROOFLINE_TOOLTIP],
            "x": x(), "y": y()}}))
    return _layered(layers, height)


# --- the Planner page ----------------------------------------------------------------------------------
# Written directly as a Vega-Lite dict like the `*_spec` builders above (no Altair twin: the PDF
# report does not draw it); tests/test_app.py validates it against Altair's Vega-Lite schema.

PLANNER_SETS = {"Pareto front": "#D64545", "Other layouts": "#4C78A8"}


def planner_spec(rows: list[dict], limit_gib: float | None = None, height: int = 380) -> dict:
    """Memory against speed of the planner's layouts: one point per layout (`rows`: rank, GiB,
    tokens_per_s, mfu, step_s, layout text, set = "Pareto front" or "Other layouts"), the front's
    points joined by a line in order of memory, and the memory limit (`limit_gib`) as a rule."""
    names = [s for s in PLANNER_SETS if any(r["set"] == s for r in rows)]

    def x() -> dict:  # a fresh dict per layer: no layer's encoding aliases another's
        return _field("GiB", "Q", scale={"zero": False}, title="GiB per GPU (peak stage)")

    def y() -> dict:
        return _field("tokens_per_s", "Q", scale={"zero": False}, title="Tokens/s per GPU")
    front = sorted((r for r in rows if r["set"] == "Pareto front"), key=lambda r: (r["GiB"], -r["tokens_per_s"]))
    layers: list[tuple[list[dict], dict]] = []
    if len(front) > 1:
        layers.append((front, {"mark": {"type": "line", "color": PLANNER_SETS["Pareto front"], "strokeWidth": 2},
                               "encoding": {"order": _field("GiB", "Q"), "x": x(), "y": y()}}))
    if rows:
        layers.append((rows, {"mark": {"type": "point", "filled": True, "opacity": 0.85, "size": 80}, "encoding": {
            "color": _field("set", "N", scale={"domain": names, "range": [PLANNER_SETS[s] for s in names]},
                            title="Layouts", legend={"orient": "bottom"}),
            "tooltip": [_field("rank", "Q", title="rank"), _field("layout", "N"),
                        _field("GiB", "Q", format=",.2f", title="GiB per GPU"),
                        _field("tokens_per_s", "Q", format=",.0f", title="tokens/s per GPU"),
                        _field("mfu", "Q", format=".1%", title="MFU"),
                        _field("step_s", "Q", format=",.3f", title="step time (s)")],
            "x": x(), "y": y()}}))
    if limit_gib:
        limit = [{"GiB": limit_gib, "text": f"limit {limit_gib:,.1f} GiB"}]
        layers.append((limit, {"mark": {"type": "rule", "color": "#888888", "strokeDash": [6, 4]},
                               "encoding": {"x": _field("GiB", "Q")}}))
        layers.append((limit, {"mark": {"type": "text", "align": "right", "color": "#888888", "dx": -4, "y": 8},
                               "encoding": {"text": _field("text", "N"), "x": _field("GiB", "Q")}}))
    return _layered(layers, height)
