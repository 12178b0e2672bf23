"""Export builders: CSV of the breakdown, the configuration as JSON, a PDF report. No Streamlit.

Every number is read from the estimator's `Estimate`; these functions only format it.

- `breakdown_csv(estimate)`: one row per pipeline stage and component (bytes and GiB); the bytes
  of a stage add up to its ``device_total_bytes``.
- `config_json(config)`: the contract's JSON, loadable by ``python -m estimator estimate --config``
  and by the app's import.
- `report_pdf(...)` / `compare_pdf(...)`: fpdf2 with the bundled DejaVu Sans (Unicode), the stacked
  bar chart rendered to PNG by vl-convert (no browser).
"""

from __future__ import annotations

import datetime as _dt
import io
import json
from pathlib import Path

import pandas as pd

from . import charts

GiB = 1024**3
FONT_DIR = Path(__file__).resolve().parent.parent / "assets" / "fonts"
VERDICT_WORDS = {"fits": "fits", "tight": "tight (over 80%)", "oom": "out of memory"}


# --- CSV ------------------------------------------------------------------------------------------

def breakdown_frame(estimate, scenario: str | None = None) -> pd.DataFrame:
    rows = []
    for s in estimate.stages:
        for c in s.components:
            row = {
                "stage": s.stage,
                "layers": s.layers,
                "peak_stage": s.stage == estimate.peak_stage,
                "peak_phase": s.peak_phase,
                "component": c.key,
                "label": c.label,
                "bytes": c.bytes,
                "GiB": round(c.bytes / GiB, 6),
                "share_of_device_total": round(c.bytes / s.device_total_bytes, 6) if s.device_total_bytes else 0.0,
                "formula": c.formula,
                "source": c.source,
            }
            if scenario is not None:
                row = {"scenario": scenario, **row}
            rows.append(row)
    return pd.DataFrame(rows)


def breakdown_csv(estimate) -> str:
    return breakdown_frame(estimate).to_csv(index=False)


def compare_csv(scenarios: list[tuple[str, object]]) -> str:
    frames = [breakdown_frame(est, name) for name, est in scenarios]
    return pd.concat(frames, ignore_index=True).to_csv(index=False) if frames else ""


# --- JSON -----------------------------------------------------------------------------------------

def config_json(config: dict) -> str:
    return json.dumps(config, indent=2) + "\n"


# --- chart images ---------------------------------------------------------------------------------

def chart_png(chart, scale: float = 2.0) -> bytes | None:
    """An Altair chart as PNG (vl-convert, no browser); None when vl-convert is not installed."""
    try:
        import vl_convert as vlc
    except ImportError:
        return None
    spec = chart.properties(width=520).to_dict()
    spec.setdefault("config", {}).setdefault("font", "DejaVu Sans")
    return vlc.vegalite_to_png(spec, scale=scale)


# --- PDF ------------------------------------------------------------------------------------------

def _gib(n: int | float) -> str:
    return f"{n / GiB:,.2f} GiB"


def _pct(x: float) -> str:
    return f"{x:.0%}"


def _new_pdf(title: str):
    from fpdf import FPDF

    pdf = FPDF(orientation="P", unit="mm", format="A4")
    pdf.set_auto_page_break(auto=True, margin=15)
    pdf.set_margins(15, 15, 15)
    pdf.add_font("DejaVu", "", str(FONT_DIR / "DejaVuSans.ttf"))
    pdf.add_font("DejaVu", "B", str(FONT_DIR / "DejaVuSans-Bold.ttf"))
    pdf.set_title(title)
    pdf.set_creator("LLM GPU memory estimator")
    pdf.add_page()
    pdf.set_font("DejaVu", "B", 16)
    pdf.multi_cell(0, 8, title, new_x="LMARGIN", new_y="NEXT")
    pdf.set_font("DejaVu", "", 8)
    pdf.cell(0, 5, f"Generated {_dt.datetime.now(_dt.timezone.utc):%Y-%m-%d %H:%M UTC} by the LLM GPU memory "
             "estimator. 1 GiB = 1024³ bytes.", new_x="LMARGIN", new_y="NEXT")
    pdf.ln(2)
    return pdf


def _image(pdf, png: bytes, title: str, width: float = 160) -> None:
    """A PNG under its heading, both moved to a new page when they do not fit."""
    from PIL import Image

    with Image.open(io.BytesIO(png)) as im:
        height = width * im.height / im.width
    if pdf.get_y() + height + 12 > pdf.page_break_trigger:
        pdf.add_page()
    _heading(pdf, title)
    pdf.image(io.BytesIO(png), w=width, x=(pdf.w - width) / 2)


def _heading(pdf, text: str) -> None:
    pdf.ln(2)
    pdf.set_font("DejaVu", "B", 12)
    pdf.cell(0, 7, text, new_x="LMARGIN", new_y="NEXT")
    pdf.set_font("DejaVu", "", 9)


def _table(pdf, rows: list[list[str]], widths: tuple[float, ...], font_size: float = 8.5,
           align: tuple[str, ...] | None = None) -> None:
    from fpdf.fonts import FontFace

    pdf.set_font("DejaVu", "", font_size)
    with pdf.table(col_widths=widths, text_align=align or "LEFT", line_height=4.6,
                   headings_style=FontFace(emphasis="BOLD"), first_row_as_headings=True) as table:
        for r in rows:
            row = table.row()
            for cell in r:
                row.cell(str(cell))
    pdf.ln(2)


def _inputs_rows(config: dict, estimate) -> list[list[str]]:
    rows = [["Setting", "Value"]]
    model = config.get("model")
    rows.append(["Model", model if isinstance(model, str) else f"custom: {estimate.architecture.name}"])
    arch = estimate.architecture
    rows.append(["Architecture", f"{arch.num_layers} layers, hidden {arch.hidden_size}, {arch.num_attention_heads} "
                                 f"heads ({arch.num_kv_heads} KV), vocab {arch.vocab_size:,}"
                                 + (f", {arch.num_experts} experts (top-{arch.num_experts_per_token})"
                                    if arch.num_experts else "")])
    par, tr = estimate.parallel, estimate.training
    rows.append(["Layout", f"TP {par.tp} × PP {par.pp} × CP {par.cp} × DP {par.dp} = {par.gpus} GPUs; VPP {par.vpp}, "
                           f"EP {par.ep}, ZeRO {estimate.zero_stage}, sequence parallel "
                           f"{'on' if par.sequence_parallel else 'off'}"])
    rows.append(["Run", f"{tr.mode}, {tr.framework}, seq {tr.seq_len:,}, micro-batch {tr.micro_batch_size}, "
                        f"{estimate.microbatches} micro-batches per step"])
    r = estimate.recipe
    rows.append(["Precision", f"weights {r.param_dtype}, gradients {r.grad_dtype}, optimizer {tr.optimizer} in "
                              f"{r.optimizer_dtype}, master weights {'yes' if r.master_weights else 'no'}, "
                              f"compute {r.compute_dtype}{', fp8' if tr.fp8 else ''}"])
    rows.append(["Memory savers", f"recompute {tr.recompute}, {tr.attention} attention, loss {tr.loss}"])
    rows.append(["GPU", f"{estimate.hardware.device.name} ({_gib(estimate.hardware.device.capacity_bytes)})"])
    for section in ("training", "parallel", "hardware"):
        for name, value in (config.get(section) or {}).items():
            rows.append([f"{section}.{name}", json.dumps(value)])
    return rows


def _totals_rows(estimate) -> list[list[str]]:
    fit = estimate.fit
    peak = estimate.stages[estimate.peak_stage]
    return [
        ["Total", "Value"],
        ["Device total (peak stage)", _gib(estimate.device_total_bytes)],
        ["Allocated peak (peak stage)", _gib(estimate.allocated_peak_bytes)],
        ["Peak stage / phase", f"stage {estimate.peak_stage} of {len(estimate.stages)}, {peak.peak_phase}"],
        ["GPU capacity", f"{_gib(fit.capacity_bytes)} ({fit.gpu})"],
        ["Verdict", f"{VERDICT_WORDS.get(fit.verdict, fit.verdict)}: {_pct(fit.utilization)} of capacity"],
        ["Parameters (total / active)", f"{estimate.parameters_total:,} / {estimate.parameters_active:,}"],
        ["Parameters per GPU (peak stage)", f"{peak.parameters_per_gpu:,}"],
    ]


def report_pdf(estimate, config: dict, title: str = "GPU memory estimate", chart: bytes | None = None) -> bytes:
    """The Memory page as a PDF: inputs, totals, chart, breakdown, fit verdicts, formulas, sources."""
    pdf = _new_pdf(title)
    _heading(pdf, "Inputs")
    _table(pdf, _inputs_rows(config, estimate), (45, 135))
    _heading(pdf, "Totals")
    _table(pdf, _totals_rows(estimate), (70, 110))
    if chart:
        _image(pdf, chart, "Memory per pipeline stage")
    peak = estimate.stages[estimate.peak_stage]
    _heading(pdf, f"Breakdown of the peak stage (stage {peak.stage}, {peak.layers} layers, peak in {peak.peak_phase})")
    rows = [["Component", "GiB", "Share", "Bytes"]]
    for c in peak.components:
        share = c.bytes / peak.device_total_bytes if peak.device_total_bytes else 0
        rows.append([charts.component_name(c.key, c.label), f"{c.bytes / GiB:,.2f}", _pct(share), f"{c.bytes:,}"])
    rows.append(["Allocated peak", f"{peak.allocated_peak_bytes / GiB:,.2f}", "", f"{peak.allocated_peak_bytes:,}"])
    rows.append(["Device total", f"{peak.device_total_bytes / GiB:,.2f}", "100%", f"{peak.device_total_bytes:,}"])
    _table(pdf, rows, (70, 30, 25, 55), align=("LEFT", "RIGHT", "RIGHT", "RIGHT"))
    if len(estimate.stages) > 1:
        _heading(pdf, "Every pipeline stage")
        rows = [["Stage", "Layers", "Peak phase", "Allocated peak", "Device total"]]
        for s in estimate.stages:
            rows.append([f"{s.stage}{' (peak)' if s.stage == estimate.peak_stage else ''}", str(s.layers),
                         s.peak_phase, _gib(s.allocated_peak_bytes), _gib(s.device_total_bytes)])
        _table(pdf, rows, (30, 20, 35, 47, 48))
    _heading(pdf, "Fit on every GPU of the catalog")
    rows = [["GPU", "Name", "Capacity", "Use", "Verdict"]]
    from estimator.hardware import GPUS
    for f in estimate.fits():
        rows.append([f.gpu, GPUS[f.gpu].name, _gib(f.capacity_bytes), _pct(f.utilization),
                     VERDICT_WORDS.get(f.verdict, f.verdict)])
    _table(pdf, rows, (22, 68, 30, 20, 40), font_size=7.5)
    _heading(pdf, "Formulas and sources (peak stage)")
    rows = [["Component", "Formula", "Source"]]
    for c in peak.components:
        rows.append([charts.component_name(c.key, c.label), c.formula, c.source])
        for p in c.parts:
            rows.append([f"  · {p.label}", p.formula, p.source])
    _table(pdf, rows, (38, 72, 70), font_size=7)
    if estimate.notes:
        _heading(pdf, "Notes")
        for note in estimate.notes:
            pdf.multi_cell(0, 5, f"• {note}", new_x="LMARGIN", new_y="NEXT")
    return bytes(pdf.output())


def compare_pdf(scenarios: list[tuple[str, dict, object]], chart: bytes | None = None,
                title: str = "GPU memory: scenario comparison") -> bytes:
    """Several named scenarios: their settings, totals, fit and the peak-stage components."""
    pdf = _new_pdf(title)
    _heading(pdf, "Totals and fit")
    rows = [["Scenario", "Model", "GPUs", "Device total", "Allocated peak", "GPU", "Verdict"]]
    for name, config, est in scenarios:
        model = config.get("model")
        rows.append([name, model if isinstance(model, str) else est.architecture.name, str(est.parallel.gpus),
                     _gib(est.device_total_bytes), _gib(est.allocated_peak_bytes), est.fit.gpu,
                     f"{VERDICT_WORDS.get(est.fit.verdict, est.fit.verdict)} ({_pct(est.fit.utilization)})"])
    _table(pdf, rows, (30, 28, 12, 27, 27, 18, 38), font_size=7.5)
    if chart:
        _image(pdf, chart, "Peak-stage components")
    _heading(pdf, "Settings")
    for name, config, est in scenarios:
        pdf.set_font("DejaVu", "B", 9)
        pdf.cell(0, 5, name, new_x="LMARGIN", new_y="NEXT")
        _table(pdf, _inputs_rows(config, est), (45, 135), font_size=7.5)
    _heading(pdf, "Peak-stage breakdown (GiB)")
    keys = list(dict.fromkeys(c.key for _, _, est in scenarios for c in est.stages[est.peak_stage].components))
    rows = [["Component"] + [name for name, _, _ in scenarios]]
    for key in keys:
        row = [charts.component_name(key)]
        for _, _, est in scenarios:
            comp = est.stages[est.peak_stage].component(key)
            row.append(f"{comp.bytes / GiB:,.2f}" if comp else "–")
        rows.append(row)
    width = 120 / max(1, len(scenarios))
    _table(pdf, rows, (60,) + (width,) * len(scenarios), font_size=7.5)
    return bytes(pdf.output())
