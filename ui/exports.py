"""Export builders: CSV of the breakdown, the configuration as JSON, a PDF report. No Streamlit.

Every number is read from the estimator's `Estimate`; these functions only format it.

- `breakdown_csv(estimate)` / `compare_csv(scenarios)`: one table (comma-separated, one header row,
  no comment lines, so ``pandas.read_csv`` and ``csv.DictReader`` read it as is). Its first column,
  ``kind``, says what a row is (`compare_csv` puts a ``scenario`` column before it):

  - ``setting``: the configuration the estimate used, one row per field (`resolved_sections`):
    ``component`` is ``model`` or ``section.field`` (``training.seq_len``), ``label`` the app's
    label, ``value`` the value (text as is; booleans, null and lists as JSON).
  - ``estimate``: the run's result on its peak stage (``stage``): ``allocated_peak`` and
    ``device_total`` (``bytes``), ``capacity`` (``bytes``; ``value`` = the GPU id),
    ``utilization`` and ``verdict`` (``value``: fits, tight or oom).
  - ``component``: one row per pipeline stage and component (``bytes``, ``GiB``, share, formula,
    source); a stage's component bytes add up to its ``device_total_bytes``.
  - ``stage_total``: per stage, ``allocated_peak`` and ``device_total``.

  Select one kind before summing (``df[df.kind == "component"]``). Columns a kind does not use are
  empty, so pandas reads ``stage``, ``layers`` and ``bytes`` as floats unless given
  ``dtype={"stage": "Int64", "layers": "Int64", "bytes": "Int64"}``. A text cell that starts with
  ``=``, ``+``, ``-``, ``@``, a tab or a carriage return gets a leading ``'`` (OWASP's defence against
  CSV injection: names come from uploaded files); numbers are written as numbers.
- `config_json(config, estimate)`: the contract's JSON with every field of ``training``,
  ``parallel`` and ``hardware`` at the value the estimate used (defaults resolved), so it
  reproduces the run even after a default changes; loadable by
  ``python -m estimator estimate --config`` and by the app's import.
- `report_pdf(...)` / `compare_pdf(...)`: fpdf2 with the bundled DejaVu Sans (Unicode), the stacked
  bar chart rendered to PNG by vl-convert (no browser). Names are cut to `NAME_MAX` characters,
  characters the font cannot draw become U+FFFD and no table cell is taller than
  `MAX_CELL_LINES` lines, so any name renders.
"""

from __future__ import annotations

import csv
import dataclasses
import datetime as _dt
import functools
import io
import json
import unicodedata
from pathlib import Path

from estimator.spec.parallel import tp_following_defaults

from estimator.spec.wording import counted, verdict_word

from . import charts
from .fields import LABELS, field_label

GiB = 1024**3
FONT_DIR = Path(__file__).resolve().parent.parent / "assets" / "fonts"
FONT_FILES = {"": "DejaVuSans.ttf", "B": "DejaVuSans-Bold.ttf"}
SECTION_TITLES = {"training": "Training", "parallel": "Parallel layout", "hardware": "Hardware"}


# --- the configuration the estimate used -----------------------------------------------------------

def resolved_sections(estimate) -> dict[str, dict]:
    """Every field of training, parallel and hardware with the value the estimate used: a field
    left to its default is written as that default resolved, so the export does not change
    meaning when a default does."""
    return {"training": _resolved_training(estimate), "parallel": _resolved_parallel(estimate),
            "hardware": _fields(estimate.hardware)}


def _fields(obj) -> dict:
    return {f.name: _plain(getattr(obj, f.name)) for f in dataclasses.fields(obj)}


def _plain(value):
    if dataclasses.is_dataclass(value):  # training.adapter, training.rl: objects of their own
        return _fields(value)
    return list(value) if isinstance(value, tuple) else value


def _resolved_training(estimate) -> dict:
    tr, recipe = estimate.training, estimate.recipe
    out = _fields(tr) | {
        "grad_dtype": recipe.grad_dtype, "master_weights": recipe.master_weights,
        "optimizer_dtype": recipe.optimizer_dtype,
        # the batch the micro-batch count came from, not the default that produced it
        "global_batch_size": estimate.microbatches * tr.micro_batch_size * estimate.parallel.dp,
    }
    if tr.mode == "inference":
        out |= {"kv_cache_tokens": tr.kv_cache_tokens or tr.seq_len, "kv_cache_dtype": _kv_cache_dtype(tr)}
    return out


def _kv_cache_dtype(tr) -> str:
    # as estimator.inference.kv_cache_bytes resolves it (the round-trip test holds them equal)
    return tr.kv_cache_dtype or (tr.param_dtype if tr.param_dtype in ("fp32", "bf16", "fp16", "fp8") else "bf16")


def _resolved_parallel(estimate) -> dict:
    out = _fields(estimate.parallel) | {"zero_stage": estimate.zero_stage}
    # world_size only checks tp x pp x cp x dp; written, it would break a later --tp override
    out.pop("world_size", None)
    return out


# --- CSV ------------------------------------------------------------------------------------------

COLUMNS = ("kind", "stage", "layers", "peak_stage", "peak_phase", "component", "label", "bytes", "GiB",
           "share_of_device_total", "value", "formula", "source")
# OWASP "CSV Injection": a cell starting with one of these is a formula to Excel/LibreOffice/Sheets
FORMULA_TRIGGERS = ("=", "+", "-", "@", "\t", "\r")


def breakdown_rows(estimate, scenario: str | None = None) -> list[dict]:
    rows = _setting_rows(estimate) + _estimate_rows(estimate)
    for s in estimate.stages:
        rows += _stage_rows(estimate, s)
    rows += _rl_rows(estimate)
    return rows if scenario is None else [{"scenario": scenario, **r} for r in rows]


def breakdown_csv(estimate) -> str:
    return _csv(breakdown_rows(estimate), COLUMNS)


def compare_csv(scenarios: list[tuple[str, object]]) -> str:
    rows = [r for name, est in scenarios for r in breakdown_rows(est, name)]
    return _csv(rows, ("scenario",) + COLUMNS) if rows else ""


def _csv(rows: list[dict], columns: tuple[str, ...]) -> str:
    out = io.StringIO()
    # RFC 4180's CRLF: Python's writer quotes a field only for the line terminator's characters,
    # so with a bare "\n" a stray carriage return in a name would go out unquoted
    writer = csv.DictWriter(out, fieldnames=columns, lineterminator="\r\n")
    writer.writeheader()
    writer.writerows({k: _neutralise(v) for k, v in r.items()} for r in rows)
    return out.getvalue()


def _neutralise(cell):
    """A text cell a spreadsheet would run as a formula, quoted as OWASP recommends; numbers are
    not text (a negative number stays a number)."""
    if isinstance(cell, str) and cell.startswith(FORMULA_TRIGGERS):
        return "'" + cell
    return cell


def _setting_rows(estimate) -> list[dict]:
    rows = [{"kind": "setting", "component": "model", "label": LABELS["model"], "value": estimate.architecture.name}]
    for section, values in resolved_sections(estimate).items():
        rows += [{"kind": "setting", "component": f"{section}.{name}", "label": field_label(f"{section}.{name}"),
                  "value": _csv_value(value)} for name, value in values.items()]
    return rows


def _csv_value(value):
    return value if isinstance(value, str) or _is_number(value) else json.dumps(value)


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _amount(n: int, stage) -> dict:
    total = stage.device_total_bytes
    return {"bytes": n, "GiB": round(n / GiB, 6), "share_of_device_total": round(n / total, 6) if total else 0.0}


def _where(estimate, s) -> dict:
    return {"stage": s.stage, "layers": s.layers, "peak_stage": s.stage == estimate.peak_stage,
            "peak_phase": s.peak_phase}


def _totals(kind: str, where: dict, s) -> list[dict]:
    return [{"kind": kind, **where, "component": key, "label": label, **_amount(n, s)}
            for key, label, n in (("allocated_peak", "Allocated peak", s.allocated_peak_bytes),
                                  ("device_total", "Device total", s.device_total_bytes))]


def _stage_rows(estimate, s) -> list[dict]:
    where = _where(estimate, s)
    rows = [{"kind": "component", **where, "component": c.key, "label": c.label, **_amount(c.bytes, s),
             "formula": c.formula, "source": c.source} for c in s.components]
    # offloaded states: host memory and NVMe of this stage's processes (not part of the device total)
    rows += [{"kind": kind, **where, "component": c.key, "label": c.label, "bytes": c.bytes,
              "GiB": round(c.bytes / GiB, 6), "formula": c.formula, "source": c.source}
             for kind, parts in (("host", s.host), ("nvme", s.nvme)) for c in parts]
    return rows + _totals("stage_total", where, s)


def _rl_rows(estimate) -> list[dict]:
    """RL: each phase's components and device total on the busiest GPU (kind rl_phase; the phase
    in the peak_phase column)."""
    rows = []
    for p in estimate.rl_phases:
        where = {"peak_phase": p.name}
        rows += [{"kind": "rl_phase", **where, "component": c.key, "label": c.label, "bytes": c.bytes,
                  "GiB": round(c.bytes / GiB, 6), "formula": c.formula, "source": c.source} for c in p.components]
        rows.append({"kind": "rl_phase", **where, "component": "device_total", "label": f"{p.name}: device total",
                     "bytes": p.device_total_bytes, "GiB": round(p.device_total_bytes / GiB, 6)})
    return rows


def _estimate_rows(estimate) -> list[dict]:
    peak, fit = estimate.stages[estimate.peak_stage], estimate.fit
    where = _where(estimate, peak)
    return _totals("estimate", where, peak) + [
        {"kind": "estimate", **where, "component": "capacity", "label": f"GPU capacity ({fit.gpu})",
         "bytes": fit.capacity_bytes, "GiB": round(fit.capacity_bytes / GiB, 6), "value": fit.gpu},
        {"kind": "estimate", **where, "component": "utilization", "label": "Device total / GPU capacity",
         "value": round(fit.utilization, 6)},
        {"kind": "estimate", **where, "component": "verdict", "label": verdict_word(fit.verdict),
         "value": fit.verdict},
    ]


# --- JSON -----------------------------------------------------------------------------------------

def config_json(config: dict, estimate) -> str:
    """`config`'s model as given, every other field as `estimate` used it (`resolved_sections`),
    but for the fields that follow TP (expert TP, sequence parallelism) where they hold the value TP
    gives them: the file is loaded again, and written out they would stop following TP, so that a
    later TP change is refused (ETP on a dense model, sequence parallelism with TP 1)."""
    sections = resolved_sections(estimate)
    par = estimate.parallel
    sections["parallel"] = {k: v for k, v in sections["parallel"].items()
                            if k not in tp_following_defaults(par.tp) or not par.follows_tp(k)}
    return json.dumps({"model": config["model"], **sections}, indent=2) + "\n"


# --- chart images ---------------------------------------------------------------------------------

def chart_png(chart, scale: float = 2.0) -> bytes | None:
    """An Altair chart as PNG (vl-convert, no browser); None when vl-convert is not installed."""
    try:
        import vl_convert as vlc
    except ImportError:
        return None
    spec = chart.properties(width=520).to_dict()
    spec["autosize"] = {"type": "pad"}  # a set width: the image takes the size its legend needs (charts.legend)
    spec.setdefault("config", {}).setdefault("font", "DejaVu Sans")
    return vlc.vegalite_to_png(spec, scale=scale)


# --- PDF ------------------------------------------------------------------------------------------

NAME_MAX = 200  # characters of a name (scenario, model, title) the PDF shows
MAX_CELL_LINES = 25  # a table cell's lines: with its heading row a row always fits on one page
LINE_HEIGHT = 4.6
REPLACEMENT = "\ufffd"


def _gib(n: int | float) -> str:
    return f"{n / GiB:,.2f} GiB"


def _pct(x: float) -> str:
    return f"{x:.0%}"


def _short(name: str, limit: int = NAME_MAX) -> str:
    return name if len(name) <= limit else name[:limit - 1] + "…"


@functools.lru_cache(maxsize=1)
def _glyphs() -> frozenset[int]:
    """Code points both bundled faces can draw."""
    from fontTools.ttLib import TTFont

    maps = [set(TTFont(FONT_DIR / name).getBestCmap()) for name in FONT_FILES.values()]
    return frozenset(set.intersection(*maps))


def _printable(text: str) -> str:
    """`text` as the font can draw it: tabs and carriage returns become spaces, other control
    characters and characters without a glyph become U+FFFD (fpdf2 would draw nothing for them)."""
    glyphs = _glyphs()

    def one(ch: str) -> str:
        if ch == "\n":
            return ch
        if ch in "\t\r":
            return " "
        if unicodedata.category(ch).startswith("C") or ord(ch) not in glyphs:
            return REPLACEMENT
        return ch

    return "".join(map(one, text))


def _new_pdf(title: str):
    from fpdf import FPDF

    title = _printable(_short(title))
    pdf = FPDF(orientation="P", unit="mm", format="A4")
    pdf.set_auto_page_break(auto=True, margin=15)
    pdf.set_margins(15, 15, 15)
    for style, name in FONT_FILES.items():
        pdf.add_font("DejaVu", style, str(FONT_DIR / name))
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


def _fit_cell(pdf, text: str, width: float) -> str:
    """`text` drawable and cut to `MAX_CELL_LINES` wrapped lines of a `width` mm column: fpdf2
    refuses a row taller than a page."""
    text = _printable(text)
    lines = pdf.multi_cell(width, LINE_HEIGHT, text, dry_run=True, output="LINES")
    if len(lines) <= MAX_CELL_LINES:
        return text
    return "\n".join(lines[:MAX_CELL_LINES])[:-1] + "…"


def _table(pdf, rows: list[list[str]], widths: tuple[float, ...], font_size: float = 8.5,
           align: tuple[str, ...] | None = None) -> None:
    from fpdf.fonts import FontFace

    pdf.set_font("DejaVu", "", font_size)
    # col_widths are proportions of the printable width; 2 mm less leaves room for the cell padding
    mm = [w / sum(widths) * pdf.epw - 2 for w in widths]
    with pdf.table(col_widths=widths, text_align=align or "LEFT", line_height=LINE_HEIGHT,
                   headings_style=FontFace(emphasis="BOLD"), first_row_as_headings=True) as table:
        for r in rows:
            row = table.row()
            for cell, width in zip(r, mm):
                row.cell(_fit_cell(pdf, str(cell), width))
    pdf.ln(2)


def _model_name(config: dict, estimate) -> str:
    model = config.get("model")
    return _short(model if isinstance(model, str) else f"custom: {estimate.architecture.name}")


def _inputs_rows(config: dict, estimate) -> list[list[str]]:
    rows = [["Setting", "Value"], ["Model", _model_name(config, estimate)]]
    arch = estimate.architecture
    rows.append(["Architecture", f"{arch.num_layers} layers, hidden {arch.hidden_size}, {arch.num_attention_heads} "
                                 f"heads ({arch.num_kv_heads} KV), vocab {arch.vocab_size:,}"
                                 + (f", {arch.num_experts} experts (top-{arch.num_experts_per_token})"
                                    if arch.num_experts else "")])
    par, tr = estimate.parallel, estimate.training
    rows.append(["Layout", f"TP {par.tp} × PP {par.pp} × CP {par.cp} × DP {par.dp} = {counted(par.gpus, 'GPU')}; "
                           f"VPP {par.vpp}, "
                           f"EP {par.ep}, ZeRO {estimate.zero_stage}, sequence parallel "
                           f"{'on' if par.sequence_parallel else 'off'}"])
    rows.append(["Run", f"{tr.mode}, {tr.framework}, seq {tr.seq_len:,}, micro-batch {tr.micro_batch_size}, "
                        f"{counted(estimate.microbatches, 'micro-batch')} per step"])
    r = estimate.recipe
    rows.append(["Precision", f"weights {r.param_dtype}, gradients {r.grad_dtype}, optimizer {tr.optimizer} in "
                              f"{r.optimizer_dtype}, master weights {'yes' if r.master_weights else 'no'}, "
                              f"compute {r.compute_dtype}{', fp8' if tr.fp8 else ''}"])
    every = f" of every {tr.recompute_every}-th layer" if tr.recompute_every > 1 else ""
    rows.append(["Memory savers", f"recompute {tr.recompute}{every}, {tr.attention} attention, loss {tr.loss}"])
    rows.append(["GPU", f"{estimate.hardware.device.name} ({_gib(estimate.hardware.device.capacity_bytes)})"])
    return rows + _settings_rows(config)


def _settings_rows(config: dict) -> list[list[str]]:
    """The settings the configuration gives, "Label: value", one row each, under their section's
    title (named once, on its first row); an object's (an adapter's, an RL run's) fields one by one."""
    rows = []
    for section, title in SECTION_TITLES.items():
        lines = []
        for name, value in (config.get(section) or {}).items():
            if isinstance(value, dict):
                lines += [f"{field_label(f'{section}.{name}.{inner}')}: {_shown(v)}" for inner, v in value.items()]
            else:
                lines.append(f"{field_label(f'{section}.{name}')}: {_shown(value)}")
        rows += [[title if i == 0 else "", line] for i, line in enumerate(lines)]
    return rows


def _shown(value) -> str:
    if isinstance(value, bool):
        return "yes" if value else "no"
    if value is None:
        return "auto"
    if isinstance(value, (list, tuple)):
        return ", ".join(map(str, value))
    return str(value)


def _totals_rows(estimate) -> list[list[str]]:
    fit = estimate.fit
    peak = estimate.stages[estimate.peak_stage]
    where = f"stage {estimate.peak_stage} of {len(estimate.stages)}, {peak.peak_phase}"
    if estimate.rl_phases:  # the largest phase of the RL step decides (memory._rl_estimate)
        largest = max(estimate.rl_phases, key=lambda p: p.device_total_bytes)
        rows = [["Device total (largest RL phase)", _gib(estimate.device_total_bytes)],
                ["Allocated peak (largest RL phase)", _gib(estimate.allocated_peak_bytes)],
                ["Peak phase", f"the RL step's {largest.name} phase (of {', '.join(p.name for p in estimate.rl_phases)}); "
                               f"its training pass peaks on {where}"]]
    else:
        rows = [["Device total (peak stage)", _gib(estimate.device_total_bytes)],
                ["Allocated peak (peak stage)", _gib(estimate.allocated_peak_bytes)],
                ["Peak stage / phase", where]]
    return [
        ["Total", "Value"],
        *rows,
        ["GPU capacity", f"{_gib(fit.capacity_bytes)} ({fit.gpu})"],
        ["Verdict", f"{verdict_word(fit.verdict)}: {_pct(fit.utilization)} of capacity"],
        ["Parameters (total / active / trainable)",
         f"{estimate.parameters_total:,} / {estimate.parameters_active:,} / {estimate.parameters_trainable:,}"],
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
    _table(pdf, _breakdown_rows(peak), (70, 30, 25, 55), align=("LEFT", "RIGHT", "RIGHT", "RIGHT"))
    if len(estimate.stages) > 1:
        _heading(pdf, "Every pipeline stage")
        _table(pdf, _stages_rows(estimate), (30, 20, 35, 47, 48))
    for phase in estimate.rl_phases:
        _heading(pdf, f"RL phase {phase.name}: device total {_gib(phase.device_total_bytes)}")
        _table(pdf, [[c.label, _gib(c.bytes), c.formula] for c in phase.components], (60, 25, 95), font_size=7.5)
    host = estimate.host_stage
    if host.host or host.nvme:
        _heading(pdf, f"Host memory and NVMe per GPU process (offload, stage {host.stage})")
        _table(pdf, [["Host" if c in host.host else "NVMe", c.label, _gib(c.bytes), c.formula]
                     for c in host.host + host.nvme], (15, 50, 25, 90), font_size=7.5)
    _heading(pdf, "Fit on every GPU of the catalog")
    _table(pdf, _fits_rows(estimate), (22, 68, 30, 20, 40), font_size=7.5)
    _heading(pdf, "Formulas and sources (peak stage)")
    _table(pdf, _formula_rows(peak), (38, 72, 70), font_size=7)
    if estimate.notes:
        _heading(pdf, "Notes")
        for note in estimate.notes:
            pdf.multi_cell(0, 5, _printable(f"• {note}"), new_x="LMARGIN", new_y="NEXT")
    return bytes(pdf.output())


def _breakdown_rows(peak) -> list[list[str]]:
    rows = [["Component", "GiB", "Share", "Bytes"]]
    for c in peak.components:
        share = c.bytes / peak.device_total_bytes if peak.device_total_bytes else 0
        rows.append([charts.component_name(c.key, c.label), f"{c.bytes / GiB:,.2f}", _pct(share), f"{c.bytes:,}"])
    rows.append(["Allocated peak", f"{peak.allocated_peak_bytes / GiB:,.2f}", "", f"{peak.allocated_peak_bytes:,}"])
    rows.append(["Device total", f"{peak.device_total_bytes / GiB:,.2f}", "100%", f"{peak.device_total_bytes:,}"])
    return rows


def _stages_rows(estimate) -> list[list[str]]:
    rows = [["Stage", "Layers", "Peak phase", "Allocated peak", "Device total"]]
    for s in estimate.stages:
        rows.append([f"{s.stage}{' (peak)' if s.stage == estimate.peak_stage else ''}", str(s.layers),
                     s.peak_phase, _gib(s.allocated_peak_bytes), _gib(s.device_total_bytes)])
    return rows


def _fits_rows(estimate) -> list[list[str]]:
    from estimator.spec.gpus import GPUS

    rows = [["GPU", "Name", "Capacity", "Use", "Verdict"]]
    for f in estimate.fits():
        rows.append([f.gpu, GPUS[f.gpu].name, _gib(f.capacity_bytes), _pct(f.utilization),
                     verdict_word(f.verdict)])
    return rows


def _formula_rows(peak) -> list[list[str]]:
    rows = [["Component", "Formula", "Source"]]
    for c in peak.components:
        rows.append([charts.component_name(c.key, c.label), c.formula, c.source])
        rows += [[f"  · {p.label}", p.formula, p.source] for p in c.parts]
    return rows


def compare_pdf(scenarios: list[tuple[str, dict, object]], chart: bytes | None = None,
                title: str = "GPU memory: scenario comparison") -> bytes:
    """Several named scenarios: their settings, totals, fit and the peak-stage components."""
    pdf = _new_pdf(title)
    _heading(pdf, "Totals and fit")
    _table(pdf, _compare_totals_rows(scenarios), (30, 28, 12, 27, 27, 18, 38), font_size=7.5)
    if chart:
        _image(pdf, chart, "Peak-stage components")
    _heading(pdf, "Settings")
    for name, config, est in scenarios:
        pdf.set_font("DejaVu", "B", 9)
        pdf.multi_cell(0, 5, _printable(_short(name)), new_x="LMARGIN", new_y="NEXT")
        _table(pdf, _inputs_rows(config, est), (45, 135), font_size=7.5)
    _heading(pdf, "Peak-stage breakdown (GiB)")
    width = 120 / max(1, len(scenarios))
    _table(pdf, _compare_breakdown_rows(scenarios), (60,) + (width,) * len(scenarios), font_size=7.5)
    return bytes(pdf.output())


def _compare_totals_rows(scenarios) -> list[list[str]]:
    rows = [["Scenario", "Model", "GPUs", "Device total", "Allocated peak", "GPU", "Verdict"]]
    for name, config, est in scenarios:
        rows.append([_short(name), _model_name(config, est), str(est.parallel.gpus),
                     _gib(est.device_total_bytes), _gib(est.allocated_peak_bytes), est.fit.gpu,
                     f"{verdict_word(est.fit.verdict)} ({_pct(est.fit.utilization)})"])
    return rows


def _compare_breakdown_rows(scenarios) -> list[list[str]]:
    keys = list(dict.fromkeys(c.key for _, _, est in scenarios for c in est.stages[est.peak_stage].components))
    rows = [["Component"] + [_short(name) for name, _, _ in scenarios]]
    for key in keys:
        row = [charts.component_name(key)]
        for _, _, est in scenarios:
            comp = est.stages[est.peak_stage].component(key)
            row.append(f"{comp.bytes / GiB:,.2f}" if comp else "–")
        rows.append(row)
    return rows
