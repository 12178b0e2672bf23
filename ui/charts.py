"""Altair charts (no Streamlit here): the same builders serve the pages and the PDF report.

Every memory component has one fixed colour and one name, shared by all pages and the PDF;
`.streamlit/config.toml` lists the same colours, in the same order, as the chart palette of both
themes. Numbers are taken from the estimator's objects as they are; charts only convert bytes to
GiB for the axis.
"""

from __future__ import annotations

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
    "logits": ("Logits and loss", "#B279A2"),
    "kv_cache": ("KV cache", "#9D755D"),
    "transient": ("Transient buffers", "#EECA3B"),
    "communication": ("NCCL buffers", "#FF9DA6"),
    "runtime": ("CUDA context", "#8C8C8C"),
    "fragmentation": ("Fragmentation", "#BAB0AC"),
}
_EXTRA_COLOURS = ("#17BECF", "#BCBD22", "#7F7F7F", "#AEC7E8", "#FFBB78", "#98DF8A")
VERDICT_COLOURS = {"fits": "#2E9E5B", "tight": "#E3A21A", "oom": "#D64545"}
BOUND_COLOURS = {"compute": "#4C78A8", "memory": "#F58518", "communication": "#E45756", "latency": "#8C8C8C"}
PALETTE = [colour for _, colour in COMPONENTS.values()]


def component_name(key: str, label: str = "") -> str:
    return COMPONENTS[key][0] if key in COMPONENTS else (label or key.replace("_", " ").capitalize())


def _scale(keys: Iterable[str], labels: dict[str, str] | None = None) -> tuple[list[str], alt.Scale]:
    """The colour scale for the components present, in the fixed order."""
    present = list(dict.fromkeys(keys))
    ordered = [k for k in COMPONENTS if k in present] + [k for k in present if k not in COMPONENTS]
    names, colours = [], []
    extra = 0
    for key in ordered:
        names.append(component_name(key, (labels or {}).get(key, "")))
        if key in COMPONENTS:
            colours.append(COMPONENTS[key][1])
        else:
            colours.append(_EXTRA_COLOURS[extra % len(_EXTRA_COLOURS)])
            extra += 1
    return names, alt.Scale(domain=names, range=colours)


def _order(key: str) -> int:
    keys = list(COMPONENTS)
    return keys.index(key) if key in keys else len(keys)


def stage_frame(estimate) -> pd.DataFrame:
    rows = []
    for s in estimate.stages:
        stage = f"Stage {s.stage}"
        for c in s.components:
            rows.append({"stage": stage, "stage_index": s.stage, "key": c.key,
                         "component": component_name(c.key, c.label), "bytes": c.bytes, "GiB": c.bytes / GiB,
                         "order": _order(c.key), "peak": s.stage == estimate.peak_stage,
                         "peak_phase": s.peak_phase})
    return pd.DataFrame(rows)


def _stacked_bars(df: pd.DataFrame, x: str, order: list[str], x_title: str, y_title: str,
                  tooltip: list) -> alt.Chart:
    """Components stacked in their fixed colours and order, one bar per `x` category."""
    names, scale = _scale(df["key"], dict(zip(df["key"], df["component"])))
    return alt.Chart(df).mark_bar().encode(
        x=alt.X(f"{x}:N", sort=order, title=x_title, axis=alt.Axis(labelAngle=0)),
        y=alt.Y("sum(GiB):Q", title=y_title, stack="zero"),
        color=alt.Color("component:N", scale=scale, sort=names, title="Component",
                        legend=alt.Legend(orient="bottom", columns=4)),
        order=alt.Order("order:Q"),
        tooltip=tooltip,
    )


def _peak_label(x: str, category: str, gib: float, text: str, order: list[str]) -> alt.Chart:
    marker = pd.DataFrame([{x: category, "GiB": gib, "text": text}])
    return alt.Chart(marker).mark_text(dy=-8, fontWeight="bold", color="#D64545").encode(
        x=alt.X(f"{x}:N", sort=order), y="GiB:Q", text="text:N")


def stage_chart(estimate, capacity_bytes: int | None = None, height: int = 360) -> alt.Chart:
    """A stacked bar per pipeline stage, the peak stage marked, the GPU's capacity as a rule."""
    df = stage_frame(estimate)
    order = [f"Stage {s.stage}" for s in estimate.stages]
    bars = _stacked_bars(df, "stage", order, "Pipeline stage", "GiB per GPU",
                         [alt.Tooltip("stage:N"), alt.Tooltip("component:N"),
                          alt.Tooltip("GiB:Q", format=".2f"), alt.Tooltip("bytes:Q", format=",")])
    peak = estimate.stages[estimate.peak_stage]
    layers = [bars, _peak_label("stage", f"Stage {peak.stage}", peak.device_total_bytes / GiB,
                                f"peak ({peak.peak_phase})", order)]
    if capacity_bytes:
        cap = pd.DataFrame([{"GiB": capacity_bytes / GiB, "text": f"GPU capacity {capacity_bytes / GiB:.1f} GiB"}])
        layers.append(alt.Chart(cap).mark_rule(strokeDash=[6, 4], color="#D64545").encode(y="GiB:Q"))
        layers.append(alt.Chart(cap).mark_text(align="left", dy=-6, x=4, color="#D64545").encode(
            y="GiB:Q", text="text:N"))
    return alt.layer(*layers).properties(height=height)


def phase_frame(stage) -> pd.DataFrame:
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
    return pd.DataFrame(rows)


def phase_chart(stage, height: int = 300) -> alt.Chart:
    """Live tensors through one step of a stage: forward, backward, optimizer step."""
    df = phase_frame(stage)
    order = [p.name for p in stage.phases]
    bars = _stacked_bars(df, "phase", order, "Phase of the step", "Allocated GiB",
                         [alt.Tooltip("phase:N"), alt.Tooltip("component:N"), alt.Tooltip("GiB:Q", format=".2f")])
    peak = next(p for p in stage.phases if p.name == stage.peak_phase)
    label = _peak_label("phase", peak.name, peak.allocated_bytes / GiB, "peak", order)
    return alt.layer(bars, label).properties(height=height)


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
                          alt.Tooltip("GiB:Q", format=".2f")]).properties(height=height)


def roofline_chart(operations: list[dict], peaks: list[float], bandwidth: float, height: int = 420) -> alt.Chart:
    """Log-log roofline: the GPU's compute roof(s) and its bandwidth roof, one point per operation
    at its attained FLOP/s (colour: what bounds it; shape: forward or backward)."""
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
        tooltip = [alt.Tooltip("name:N"), alt.Tooltip("phase:N"), alt.Tooltip("bound:N"),
                   alt.Tooltip("arithmetic_intensity:Q", format=",.1f", title="FLOP/byte"),
                   alt.Tooltip("TFLOP/s:Q", format=",.1f"), alt.Tooltip("time_s:Q", format=".3e", title="time (s)")]
        layers.append(alt.Chart(ops).mark_point(size=90, filled=True, opacity=0.85).encode(
            x=x, y=y,
            color=alt.Color("bound:N", scale=alt.Scale(domain=bounds, range=colours), title="Bound by"),
            shape=alt.Shape("phase:N", title="Phase", scale=alt.Scale(domain=["forward", "backward"],
                                                                       range=["circle", "triangle-down"]),
                            legend=alt.Legend(symbolFillColor="#888888", symbolStrokeColor="#888888")),
            tooltip=tooltip))
    return alt.layer(*layers).properties(height=height)
