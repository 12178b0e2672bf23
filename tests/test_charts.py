"""The charts the pages draw are written as Vega-Lite dicts directly (`ui.charts.*_spec`, cached
per configuration in `ui.view`); Altair's builders, with its schema validation, are the
reference. These tests hold the fast path to the validated one, value for value and type for
type, and check that what Streamlit is handed carries the same data."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

pytest.importorskip("streamlit")
import altair as alt  # noqa: E402
import pandas as pd  # noqa: E402
import pyarrow as pa  # noqa: E402
from streamlit.testing.v1 import AppTest  # noqa: E402

from estimator import estimate_config, load_config  # noqa: E402
from estimator.speed.roofline import roofline_config  # noqa: E402
from ui import charts, view  # noqa: E402
from ui.fields import config_key  # noqa: E402

APP = str(Path(__file__).resolve().parent.parent / "app.py")

CONFIGS = {
    "pipeline-interleaved": {"model": "llama-3.1-70b", "training": {"seq_len": 8192, "recompute": "selective"},
                             "parallel": {"tp": 8, "pp": 4, "vpp": 5, "dp": 2}},
    "moe-expert-parallel": {"model": "mixtral-8x7b", "parallel": {"tp": 2, "pp": 4, "dp": 2, "ep": 2}},
    "inference": {"model": "llama-3.1-8b",
                  "training": {"mode": "inference", "seq_len": 32768, "micro_batch_size": 8}},
    "one-gpu-oom-hf": {"model": "qwen3-32b",
                       "training": {"optimizer": "adam8bit", "framework": "hf", "attention": "eager"}},
}


def _text(spec: dict) -> str:
    """The spec as JSON: equal texts mean equal values and equal types (1 is not 1.0, True is not 1)."""
    return json.dumps(spec, sort_keys=True)


def _roofline_inputs(config: dict) -> tuple[list[dict], list[float], float]:
    ops = roofline_config(load_config(config)).to_json()["operations"]
    peaks = sorted({op["peak_flops"] for op in ops if op.get("peak_flops")})
    bandwidth = next(op["bandwidth"] for op in ops if op.get("bandwidth"))
    return ops, peaks, bandwidth


def _validated(kind: str, config: dict) -> dict:
    """What the Altair builder gives, validated against the Vega-Lite schema."""
    if kind == "roofline":
        return charts.roofline_chart(*_roofline_inputs(config)).to_dict(validate=True)
    est = estimate_config(config)
    if kind == "stages":
        return charts.stage_chart(est, est.fit.capacity_bytes).to_dict(validate=True)
    return charts.phase_chart(est.stages[est.peak_stage]).to_dict(validate=True)


@pytest.mark.parametrize("kind", ["stages", "phases", "roofline"])
@pytest.mark.parametrize("name", list(CONFIGS))
def test_the_cached_spec_is_the_validated_altair_spec(name, kind):
    spec = view.chart_spec(kind, config_key(CONFIGS[name]))
    assert _text(spec) == _text(_validated(kind, CONFIGS[name]))


@pytest.mark.parametrize("kind", ["stages", "phases", "roofline"])
def test_what_streamlit_is_handed_carries_the_validated_data(kind):
    """The cached chart's datasets are Arrow bytes; read back, they are the validated rows."""
    config = CONFIGS["moe-expert-parallel"]
    wire = view._chart_wire(kind, config_key(config))
    validated = _validated(kind, config)
    datasets = validated.pop("datasets")
    assert _text({k: v for k, v in wire.items() if k != "datasets"}) == _text(validated)
    assert set(wire["datasets"]) == set(datasets)
    for name, blob in wire["datasets"].items():
        assert isinstance(blob, bytes)
        assert pa.ipc.open_stream(blob).read_all().to_pylist() == datasets[name]


def test_the_memory_page_draws_the_cached_charts():
    """Streamlit takes the Arrow bytes as they are: the page's two charts carry the datasets the
    validated specs name, with their rows."""
    config = CONFIGS["pipeline-interleaved"]
    at = AppTest.from_file(APP, default_timeout=60)
    for key, value in {"model": "llama-3.1-70b", "tp": "8", "pp": "4", "vpp": "5", "dp": "2",
                       "seq_len": "8192", "recompute": "selective"}.items():
        at.query_params[key] = value
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    drawn = at.get("arrow_vega_lite_chart") or at.get("vega_lite_chart")
    assert len(drawn) == 2
    for element, kind in zip(drawn, ["stages", "phases"]):
        expected = _validated(kind, config)["datasets"]
        got = {d.name: pa.ipc.open_stream(d.data.data).read_all().to_pylist() for d in element.proto.datasets}
        assert got == expected
        spec = json.loads(element.proto.spec)
        assert [layer["data"]["name"] for layer in spec["layer"]] == \
            [layer["data"]["name"] for layer in _validated(kind, config)["layer"]]


def test_rows_are_inlined_as_altair_inlines_a_dataframe():
    """Mixed ints and floats, gaps, NaN and infinities: the names and values Altair would give."""
    rows = [{"a": 1, "b": 2.5, "c": "x", "d": True, "e": 3},
            {"a": 2, "b": float("nan"), "c": "y", "d": False},
            {"a": 3, "b": float("inf"), "c": "z", "d": True, "e": 4.5}]
    expected = alt.utils.data.to_values(pd.DataFrame(rows))["values"]
    got = charts._records(rows)
    assert _text(got) == _text(expected)
    assert charts._dataset_name(got) == alt.Chart(pd.DataFrame(rows)).mark_point().to_dict()["data"]["name"]


def test_a_roofline_with_odd_operations_matches_altair():
    """Operations with no time, no bytes, an infinite intensity or a missing field are kept or
    dropped exactly as the Altair builder keeps or drops them."""
    ops, peaks, bandwidth = _roofline_inputs(CONFIGS["pipeline-interleaved"])
    odd = [dict(ops[0], time_s=0.0), dict(ops[1], bytes=0.0, arithmetic_intensity=math.inf),
           {k: v for k, v in ops[2].items() if k != "count"}, dict(ops[3], bound="latency")] + ops[4:]
    assert _text(charts.roofline_spec(odd, peaks, bandwidth)) == \
        _text(charts.roofline_chart(odd, peaks, bandwidth).to_dict(validate=True))
    assert _text(charts.roofline_spec([], peaks, bandwidth)) == \
        _text(charts.roofline_chart([], peaks, bandwidth).to_dict(validate=True))
