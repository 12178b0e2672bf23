"""Where a step's time goes: a stacked bar written as a Vega-Lite spec (as ui/charts.py writes its
specs directly), for the Roofline page."""

from __future__ import annotations

from . import charts


def step_parts(step: dict) -> list[dict]:
    """The step's time split into compute, recompute, exposed communication by group, bubble and
    optimizer, in seconds (the roofline's `step` JSON)."""
    parts = [("compute", step.get("compute_s", 0.0)), ("recompute", step.get("recompute_s", 0.0))]
    parts += [(f"exposed {group}", s) for group, s in sorted(step.get("exposed_comm_by_group_s", {}).items())]
    parts += [("pipeline bubble", step.get("bubble_s", 0.0)), ("optimizer", step.get("optimizer_s", 0.0))]
    return [{"part": name, "seconds": s, "order": i} for i, (name, s) in enumerate(parts) if s > 0]


def step_time_spec(step: dict, name: str = "step", height: int = 40) -> dict:
    """One horizontal bar, one segment per part of the step (`name`: "step", or "prefill" in inference),
    the part's seconds in the tooltip; the
    legend below it in the columns the width holds (`charts.legend`: at its right, in a chart 90 px
    high, it was clipped after three parts)."""
    parts = step_parts(step)
    return {
        "$schema": "https://vega.github.io/schema/vega-lite/v5.json",
        "data": {"values": parts},
        "mark": {"type": "bar"},
        "height": height,
        "autosize": dict(charts.AUTOSIZE),
        "encoding": {
            "x": {"field": "seconds", "type": "quantitative", "stack": "zero", "title": f"seconds per {name}"},
            "color": {"field": "part", "type": "nominal", "sort": {"field": "order"}, "title": None,
                      "legend": charts.legend(p["part"] for p in parts)},
            "order": {"field": "order", "type": "quantitative"},
            "tooltip": [{"field": "part", "type": "nominal"},
                        {"field": "seconds", "type": "quantitative", "format": ".3f"}],
        },
    }
