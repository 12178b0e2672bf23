"""Export builders as plain functions: CSV, the configuration's JSON (through the CLI), PDF."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from estimator import estimate_config
from ui import charts, exports, fields, scenarios

ROOT = Path(__file__).resolve().parent.parent
GiB = 1024**3
CONFIGS = {
    "llama-70b-pp": {"model": "llama-3.1-70b", "training": {"seq_len": 8192, "recompute": "selective"},
                     "parallel": {"tp": 8, "pp": 4, "vpp": 5, "dp": 2}},
    "mixtral-ep": {"model": "mixtral-8x7b", "parallel": {"tp": 2, "pp": 2, "dp": 4, "ep": 4, "zero_stage": 1}},
    "custom": {"model": {"hidden_size": 1024, "num_layers": 8, "num_attention_heads": 16, "vocab_size": 32000,
                         "intermediate_size": 4096, "name": "tiny"},
               "training": {"micro_batch_size": 2}, "hardware": {"gpu": "l4"}},
}


@pytest.fixture(scope="module", params=list(CONFIGS))
def case(request):
    config = CONFIGS[request.param]
    return config, estimate_config(config)


def test_csv_columns_and_sums(case):
    _, est = case
    df = pd.read_csv(io.StringIO(exports.breakdown_csv(est)))
    assert list(df.columns[:8]) == ["stage", "layers", "peak_stage", "peak_phase", "component", "label", "bytes",
                                    "GiB"]
    assert sorted(df["stage"].unique()) == [s.stage for s in est.stages]
    for s in est.stages:
        rows = df[df["stage"] == s.stage]
        assert rows["bytes"].sum() == s.device_total_bytes
        tensors = rows[~rows["component"].isin(["communication", "runtime", "fragmentation"])]
        assert tensors["bytes"].sum() == s.allocated_peak_bytes
        assert rows["share_of_device_total"].sum() == pytest.approx(1.0, abs=1e-4)
    assert (df["GiB"] - df["bytes"] / GiB).abs().max() < 1e-5
    assert df[df["peak_stage"]]["stage"].unique().tolist() == [est.peak_stage]


def test_compare_csv_has_every_scenario(case):
    config, est = case
    text = exports.compare_csv([("a", est), ("b", est)])
    df = pd.read_csv(io.StringIO(text))
    assert df["scenario"].unique().tolist() == ["a", "b"]
    assert df[df["scenario"] == "a"]["bytes"].sum() == sum(s.device_total_bytes for s in est.stages)


def test_config_json_round_trip_through_the_cli(case, tmp_path):
    config, est = case
    path = tmp_path / "config.json"
    path.write_text(exports.config_json(config))
    out = subprocess.run([sys.executable, "-m", "estimator", "estimate", "--config", str(path), "--json"],
                         capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert out.returncode == 0, out.stderr
    cli = json.loads(out.stdout)
    assert cli["device_total_bytes"] == est.device_total_bytes
    assert cli["allocated_peak_bytes"] == est.allocated_peak_bytes
    assert cli["fit"]["verdict"] == est.fit.verdict
    # and the app reads the same file back into the same widget values
    back = json.loads(path.read_text())
    values = fields.ui_values_from_config(back)
    model = fields.ModelChoice(source="preset", preset=back["model"]) if isinstance(back["model"], str) else \
        fields.ModelChoice(source="custom", arch=fields.canonical_arch(back["model"]))
    assert estimate_config(fields.config_dict(model, values)).device_total_bytes == est.device_total_bytes


def _pdf_text(data: bytes) -> str:
    from pypdf import PdfReader

    return "\n".join(page.extract_text() or "" for page in PdfReader(io.BytesIO(data)).pages)


def test_pdf_report_contains_the_totals(case):
    pytest.importorskip("fpdf")
    pytest.importorskip("pypdf")
    config, est = case
    png = exports.chart_png(charts.stage_chart(est, est.fit.capacity_bytes))
    data = exports.report_pdf(est, config, title="GPU memory estimate — test ≈ Δ", chart=png)
    assert data.startswith(b"%PDF")
    text = _pdf_text(data)
    assert f"{est.device_total_bytes / GiB:,.2f} GiB" in text
    assert f"{est.allocated_peak_bytes / GiB:,.2f} GiB" in text
    assert f"{est.parameters_total:,}" in text
    assert "≈ Δ" in text and "1024³" in text  # Unicode survives (bundled DejaVu Sans)
    peak = est.stages[est.peak_stage]
    assert peak.components[0].formula.split()[0] in text
    fits = text[text.index("Fit on every GPU"):]
    for f in est.fits():
        row = fits[fits.index("\n" + f.gpu + "\n" if "\n" + f.gpu + "\n" in fits else "\n" + f.gpu + " "):][:160]
        assert f"{f.utilization:.0%}" in row and exports.VERDICT_WORDS[f.verdict] in row


def test_pdf_without_a_chart_still_renders(case):
    pytest.importorskip("fpdf")
    config, est = case
    assert exports.report_pdf(est, config, chart=None).startswith(b"%PDF")


def test_chart_png_is_a_png(case):
    pytest.importorskip("vl_convert")
    _, est = case
    png = exports.chart_png(charts.stage_chart(est, est.fit.capacity_bytes))
    assert png[:8] == b"\x89PNG\r\n\x1a\n"


def test_compare_pdf_contains_every_scenario():
    pytest.importorskip("fpdf")
    triples = [(name, cfg, estimate_config(cfg)) for name, cfg in CONFIGS.items()]
    png = exports.chart_png(charts.compare_chart([(n, e) for n, _, e in triples]))
    text = _pdf_text(exports.compare_pdf(triples, chart=png))
    for name, _, est in triples:
        assert name in text
        assert f"{est.device_total_bytes / GiB:,.2f} GiB" in text


def test_scenarios_json_round_trip():
    entries = [scenarios.new_entry(name, cfg) for name, cfg in CONFIGS.items()]
    back = scenarios.parse(scenarios.dump(entries, "scenarios"), "scenarios")
    assert [(e["name"], e["config"]) for e in back] == [(e["name"], e["config"]) for e in entries]
    single = scenarios.parse(json.dumps(CONFIGS["mixtral-ep"]), "scenarios")
    assert single[0]["config"] == CONFIGS["mixtral-ep"]
    with pytest.raises(fields.ConfigError):
        scenarios.parse('{"scenarios": [{"name": "x", "config": {"model": "llama-3.1-8b", "training": {"lr": 1}}}]}',
                        "scenarios")
    with pytest.raises(fields.ConfigError):
        scenarios.parse("not json", "scenarios")


def test_settings_diff_lists_only_what_differs():
    entries = [scenarios.new_entry("a", CONFIGS["llama-70b-pp"]),
               scenarios.new_entry("b", {**CONFIGS["llama-70b-pp"], "parallel": {"tp": 4, "pp": 4, "vpp": 5,
                                                                                  "dp": 2}})]
    diff = scenarios.settings_diff(entries)
    assert list(diff.index) == ["Tensor parallel (TP)"]
    assert diff.loc["Tensor parallel (TP)"].tolist() == ["8", "4"]
