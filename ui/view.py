"""Pieces several pages draw: totals, fit cards, breakdown tables, export buttons."""

from __future__ import annotations

import json
import re

import streamlit as st

from estimator.spec.gpus import GPUS
from estimator.spec.wording import VERDICT_MEANINGS, VERDICT_WORDS, counted, verdict_word

from . import charts, compute, exports, keys, state
from .state import Current

GiB = 1024**3
VERDICT_ICON = {"fits": ":material/check_circle:", "tight": ":material/warning:", "oom": ":material/block:"}
VERDICT_COLOR = {"fits": "green", "tight": "orange", "oom": "red"}
VERDICT_MD = {code: f":{VERDICT_COLOR[code]}-badge[{word}]" for code, word in VERDICT_WORDS.items()}


def gib(n: int | float) -> str:
    return f"{n / GiB:,.2f} GiB"


def params_text(n: int) -> str:
    for unit, div in (("T", 1e12), ("B", 1e9), ("M", 1e6)):
        if n >= div:
            return f"{n / div:,.2f} {unit}"
    return f"{n:,}"




def totals(est) -> None:
    """Device total and allocated peak of the peak stage, capacity, verdict, parameter counts.

    Metric values are kept short (a verdict word, a percentage in the delta): a metric's value
    and label are cut with an ellipsis when the column is too narrow (four columns at 1400 px)."""
    fit = est.fit
    peak = est.stages[est.peak_stage]
    gpu = GPUS[fit.gpu]
    # the three numbers a run shows: allocated, reserved (the allocator's cache too), nvidia-smi
    cols = st.columns(4)
    cols[0].metric("Allocated peak", gib(est.allocated_peak_bytes),
                   help="Peak of live tensors and library workspaces during the step (what "
                        f"torch.cuda.max_memory_allocated reports) on stage {est.peak_stage}, reached in "
                        f"{peak.peak_phase}.")
    cache = peak.component("fragmentation")
    rule = f" Here: {cache.formula} ({cache.source})." if cache is not None and not est.rl_phases else ""
    cols[1].metric("Reserved peak", gib(est.reserved_peak_bytes),
                   help="What torch.cuda.max_memory_reserved reports: the allocated peak plus the caching "
                        "allocator's segments held but unused (fragmentation)." + rule)
    cols[2].metric("Device total per GPU", gib(est.device_total_bytes),
                   help="What nvidia-smi shows for the busiest pipeline stage's GPU: the reserved peak plus the "
                        "CUDA context and NCCL buffers, outside PyTorch's allocator. This decides the fit.")
    cols[3].metric("Verdict", verdict_word(fit.verdict), delta=f"{fit.utilization:.0%} of {gib(fit.capacity_bytes)}",
                   delta_color=VERDICT_COLOR[fit.verdict], delta_arrow="off",
                   help=f"{verdict_word(fit.verdict)} on {gpu.name} ({gib(fit.capacity_bytes)}): "
                        f"{VERDICT_MEANINGS[fit.verdict]}. Fits: below 80% of capacity; Tight: 80-100%; OOM (out of "
                        "memory): above capacity. Below 80% no run went out of memory in 454 measured runs "
                        "(Fujii et al. 2024).")
    cols = st.columns(4)
    cols[0].metric("Parameters (total)", params_text(est.parameters_total), help=f"{est.parameters_total:,}")
    if est.training.adapter:  # an adapter run: what trains is the question
        cols[1].metric("Parameters (trainable)", params_text(est.parameters_trainable),
                       help=f"{est.parameters_trainable:,} trainable ({est.parameters_trainable / est.parameters_total:.2%}"
                            f" of all); {est.parameters_active:,} active per token")
    else:
        cols[1].metric("Parameters (active per token)", params_text(est.parameters_active),
                       help=f"{est.parameters_active:,}")
    cols[2].metric("Parameters per GPU (peak stage)", params_text(peak.parameters_per_gpu),
                   help=f"{peak.parameters_per_gpu:,} before ZeRO sharding")
    cols[3].metric("GPUs", f"{est.parallel.gpus:,}",
                   help=f"TP {est.parallel.tp} × PP {est.parallel.pp} × CP {est.parallel.cp} × DP {est.parallel.dp}; "
                        f"{est.microbatches} micro-batches per step; ZeRO {est.zero_stage}")


def batch_text(est) -> str:
    """What the estimate assumes about the step's batch, in one line (shown beside the totals)."""
    t, par = est.training, est.parallel
    if t.mode == "inference":
        kv = t.kv_cache_tokens or t.seq_len
        return (f"Serving a batch of {t.micro_batch_size:,} sequence{'s' if t.micro_batch_size != 1 else ''} of "
                f"{t.seq_len:,} tokens, KV cache of {kv:,} tokens per sequence")
    m = est.microbatches
    gbs = t.global_batch_size or m * t.micro_batch_size * par.dp
    how = "auto" if t.global_batch_size is None else "set"
    text = f"{m:,} micro-batch{'es' if m != 1 else ''} per step (global batch {gbs:,} = {how})"
    text += f": micro-batch {t.micro_batch_size:,} x DP {par.dp:,}"
    if par.pp > 1:
        text += f", {par.pp} pipeline stages"
        if m < par.pp:
            text += " - fewer micro-batches than stages, so most of the step is pipeline bubble"
    return text


def batch_assumption(est) -> None:
    st.markdown(f":material/stacks: **{batch_text(est)}**")


def verdict_banner(est) -> None:
    fit = est.fit
    text = (f"**{verdict_word(fit.verdict)}** on {GPUS[fit.gpu].name}: the peak stage needs "
            f"{gib(est.device_total_bytes)} of {gib(fit.capacity_bytes)} ({fit.utilization:.0%}).")
    {"fits": st.success, "tight": st.warning, "oom": st.error}[fit.verdict](text, icon=VERDICT_ICON[fit.verdict])


def _share(part: int, whole: int) -> str:
    return f"{part / whole:.1%}" if whole else "-"


def breakdown_table(stage) -> None:
    """The stage's components with their formula and source.

    A static table: its cells wrap, so the formula and the source are read whole at any width
    (a data grid cuts them to one line)."""
    rows = [{"Component": charts.component_name(c.key, c.label), "GiB": f"{c.bytes / GiB:,.2f}",
             "Bytes": f"{c.bytes:,.0f}", "Share": _share(c.bytes, stage.device_total_bytes),
             "Formula": c.formula, "Source": c.source} for c in stage.components]
    st.table(_table(rows), hide_index=True)
    details = [(c, p) for c in stage.components for p in c.parts]
    if details:
        with st.expander("Parts of the components"):
            st.table(_table([{"Component": charts.component_name(c.key, c.label), "Part": p.label,
                              "GiB": f"{p.bytes / GiB:,.3f}", "Formula": p.formula, "Source": p.source}
                             for c, p in details]), hide_index=True)


def host_memory(est) -> None:
    """Offloaded states: the host memory (and NVMe) each GPU's process needs, with formulas, and what
    a node of 8 GPUs needs (users run out of CPU RAM before they run out of GPU memory)."""
    stage = est.host_stage
    if not stage.host and not stage.nvme:
        return
    st.subheader("Host memory (offload)")
    cols = st.columns(3)
    cols[0].metric("Host RAM per GPU process", gib(stage.host_bytes), help=f"stage {stage.stage}")
    cols[1].metric("Host RAM per node of 8 GPUs", gib(8 * stage.host_bytes),
                   help="8 processes of the largest stage; pinned memory cannot be swapped out")
    cols[2].metric("NVMe per GPU process", gib(stage.nvme_bytes))
    st.table(_table([{"Where": where, "What": c.label, "GiB": f"{c.bytes / GiB:,.2f}", "Formula": c.formula,
                      "Source": c.source} for where, parts in (("host", stage.host), ("NVMe", stage.nvme))
                     for c in parts]), hide_index=True)


def _table(rows: list[dict]):
    """Rows as an Arrow table: Streamlit sends one as it is, where it converts a DataFrame through
    pandas on every rerun (a few milliseconds a table, and these are redrawn every run)."""
    import pyarrow as pa

    return pa.Table.from_pylist(rows)


def what_to_change(cur: Current, est) -> None:
    """When the run does not fit comfortably: a plan that gets it to fit, and single changes,
    each estimated in full, each one click away. When no short chain of single changes fits, the
    planner's nearest fitting layout, as the CLI gives it (`advice.plan_to_fit`), from a search in
    a worker process (ui.searches) while the page shows its progress."""
    if est.fit.verdict == "fits":
        return
    res = compute.advice(cur.config_json)
    if not res.ok:
        return
    plan, singles = res.value
    st.subheader("What to change")
    if plan and plan[-1][3] == "fits":
        st.caption("Changes applied one after another until the run fits, each step a full estimate:")
        _plan_rows(plan, est)
    else:
        _nearest_layout(cur, est, plan)
    if singles:
        with st.expander("Each change on its own"):
            for j, (description, config, total, verdict, gpus) in enumerate(singles):
                cols = st.columns([6, 2, 1], vertical_alignment="center")
                cols[0].markdown(description)
                cols[1].markdown(f"{gib(total)} · {VERDICT_MD[verdict]}")
                cols[2].button("Apply", key=keys.single_change(j), on_click=_apply,
                               args=(config, description), width="stretch")


def _plan_rows(plan, est) -> None:
    for i, (description, config, total, verdict, gpus) in enumerate(plan, 1):
        cols = st.columns([6, 2, 1], vertical_alignment="center")
        cols[0].markdown(f"{i}. {description}")
        cols[1].markdown(f"{gib(total)} · {VERDICT_MD[verdict]}" + (f" · {counted(gpus, 'GPU')}"
                                                                    if gpus != est.parallel.gpus else ""))
        steps = "step 1 of the plan" if i == 1 else f"steps 1 to {i} of the plan"  # each step builds on the last
        cols[2].button("Apply", key=keys.plan_step(i), on_click=_apply,
                       args=(config, f"{steps}, the last: {description}" if i > 1 else f"{steps}: {description}"),
                       width="stretch")


def _nearest_layout(cur: Current, est, plan) -> None:
    """Single changes do not get there: the planner's nearest fitting layout, on these GPUs or on
    the fewest that fit; while it is searched, its progress; when none is found, the closest chain."""
    from . import searches

    job = "nearest:" + cur.config_json
    found = searches.request(job, "nearest", {"config_json": cur.config_json}, page=searches.MEMORY)
    if found.state in (searches.QUEUED, searches.RUNNING):
        st.caption("No short chain of single changes makes this run fit: the planner is searching every layout for "
                   "the nearest one that fits, on these GPUs or on the fewest that would.")
        searches.progress_panel(job, _fastest_text, "Searching for the nearest fitting layout")
        st.page_link("pages/planner.py", label="Search every parallel layout on the Planner page",
                     icon=":material/account_tree:")
        return
    answer = found.result or {}
    suggestion = answer.get("suggestion")
    if found.state == searches.DONE and suggestion:
        st.caption("No short chain of single changes makes this run fit; the planner's nearest fitting layout "
                   "(every layout searched, the fewest and smallest moves from yours):")
        cols = st.columns([6, 2, 1], vertical_alignment="center")
        cols[0].markdown(f"1. {state.plain(suggestion['description'])}")
        cols[1].markdown(f"{gib(suggestion['device_total_bytes'])} · {VERDICT_MD[suggestion['verdict']]}"
                         + (f" · {suggestion['gpus']} GPUs" if suggestion["gpus"] != est.parallel.gpus else ""))
        cols[2].button("Apply", key=keys.plan_step(1), on_click=state.load_and_open,
                       args=(suggestion["config"], "the planner's nearest fitting layout", None), width="stretch")
        return
    if answer.get("stopped"):
        st.caption(f"The planner's search for a fitting layout stopped at {answer['stopped']} before it found one.")
    elif found.state == searches.FAILED:
        st.caption(f"The planner's search for a fitting layout failed: {state.plain(str(searches.error_of(found)))}")
    if plan:
        st.caption("No plan of up to five changes makes this run fit on this GPU; the closest one:")
        _plan_rows(plan, est)
    st.page_link("pages/planner.py", label="Search every parallel layout on the Planner page",
                 icon=":material/account_tree:")


def _fastest_text(best: dict) -> str:
    return f"the fastest fitting layout found runs {best['tokens_per_s_per_gpu']:,.0f} tokens/s per GPU"


def _apply(config, source: str) -> None:
    """An Apply button's callback: the advice's `Config` loaded as its dict, written only now."""
    state.load_and_open(config.to_dict(), source, None)


def activation_ledger(est) -> None:
    """What one transformer layer keeps for backward, tensor by tensor (the estimator's ledger).
    Training only: inference keeps nothing for a backward pass."""
    if est.training.mode == "inference":
        return
    lines = est.activation_ledger
    if not lines:
        return
    with st.expander("What one layer keeps for backward (one micro-batch, one GPU)"):
        st.caption("Every tensor autograd saves in one layer, after TP/SP/CP division; the stage's activations are "
                   "these, times its layers and micro-batches in flight. Rows marked recomputed are rebuilt in backward instead of kept.")
        st.dataframe(_table([{"Layer": line.kind, "Tensor": line.name, "MiB": line.bytes / 2**20,
                              "Formula": line.formula, "Recomputed": line.dropped_by_recompute}
                             for line in lines]),
                     hide_index=True, width="stretch",
                     column_config={"MiB": st.column_config.NumberColumn(format="%.2f"),
                                    "Recomputed": st.column_config.CheckboxColumn()})


def fit_cards(est, per_row: int = 6) -> None:
    fits = est.fits()
    for start in range(0, len(fits), per_row):
        cols = st.columns(per_row)
        for col, fit in zip(cols, fits[start:start + per_row]):
            with col.container(border=True):
                st.markdown(f"**{fit.gpu}** {VERDICT_MD[fit.verdict]}")
                st.caption(f"{GPUS[fit.gpu].name}")
                st.progress(min(fit.utilization, 1.0), text=f"{fit.utilization:.0%} of {gib(fit.capacity_bytes)}")


def chart_spec(kind: str, config_json: str) -> dict:
    """A chart's Vega-Lite spec: a function of the configuration alone.

    Written directly by `charts.*_spec`, the same dict as the Altair builders' validated
    `to_dict()` (tests/test_charts.py): Altair's objects and schema validation took two thirds of
    a Memory page rerun."""
    if kind == "roofline":
        rf = compute._roofline(config_json).to_json()
        ops = rf["operations"]
        peaks = sorted({op["peak_flops"] for op in ops if op.get("peak_flops")})
        bandwidth = next(op["bandwidth"] for op in ops if op.get("bandwidth"))
        return charts.roofline_spec(ops, peaks, bandwidth)
    est = compute._estimate(config_json)
    if kind == "stages":
        return charts.stage_spec(est, est.fit.capacity_bytes)
    return charts.phase_spec(est.stages[est.peak_stage])


def _arrow_bytes(rows: list[dict]) -> bytes:
    """`rows` as an Arrow IPC stream, the form a chart's dataset travels in to the browser."""
    import pyarrow as pa

    table = pa.Table.from_pylist(rows)
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.getvalue().to_pybytes()


@st.cache_data(max_entries=256, show_spinner=False)
def _chart_wire(kind: str, config_json: str) -> dict:
    """The chart as `st.vega_lite_chart` takes it, cached per configuration: its datasets already
    Arrow bytes, which Streamlit passes on as they are (its own `altair_chart` hands them over so;
    tests/test_charts.py draws them through AppTest, so a Streamlit that stops taking them fails
    a test, not the page).

    Given rows, Streamlit converts each dataset through pandas on every call: about 7 ms a chart,
    on every rerun; pyarrow reads the rows in a tenth of that, once per configuration. The bytes
    hold the same columns and values (tests/test_charts.py reads them back)."""
    spec = chart_spec(kind, config_json)
    return {**spec, "datasets": {name: _arrow_bytes(rows) for name, rows in spec.get("datasets", {}).items()}}


def chart(kind: str, config_json: str) -> None:
    """Draw the stacked bar per stage ("stages"), the step's phases ("phases") or the roofline.
    A chart that cannot be built is one line of text, never a traceback."""
    try:
        spec = _chart_wire(kind, config_json)
    except Exception as exc:
        st.caption(f":material/info: The chart is not available for this configuration ({type(exc).__name__}).")
        return
    st.vega_lite_chart(spec, width="stretch", key=keys.chart(kind))


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "-", text).strip("-") or "config"


@st.cache_data(max_entries=64, show_spinner=False)
def _report_pdf(config_json: str, title: str) -> bytes:
    est = compute._estimate(config_json)
    png = exports.chart_png(charts.stage_chart(est, est.fit.capacity_bytes))
    return exports.report_pdf(est, json.loads(config_json), title=title, chart=png)


def export_buttons(cur: Current, est) -> None:
    """Three downloads, each file written when its button is clicked (a callable `data`): a rerun
    that only shows the buttons builds no CSV, JSON or PDF."""
    name = _slug(cur.model_label)
    config, config_json = cur.config, cur.config_json
    title = f"GPU memory estimate: {cur.model_label}"
    cols = st.columns(3)
    cols[0].download_button("Breakdown (CSV)", lambda: exports.breakdown_csv(est), file_name=f"{name}-memory.csv",
                            mime="text/csv", on_click="ignore", icon=":material/table:", key="dl_csv",
                            width="stretch", help="One row per pipeline stage and component, bytes and GiB.")
    cols[1].download_button("Configuration (JSON)", lambda: exports.config_json(config, est),
                            file_name=f"{name}-config.json",
                            mime="application/json", on_click="ignore", icon=":material/data_object:",
                            key="dl_json", width="stretch",
                            help="Load it with the sidebar's Import, or run "
                                 "`python -m estimator estimate --config FILE`.")
    cols[2].download_button("Report (PDF)", lambda: _report_pdf(config_json, title), file_name=f"{name}-report.pdf",
                            mime="application/pdf", on_click="ignore", icon=":material/picture_as_pdf:",
                            key="dl_pdf", width="stretch",
                            help="Inputs, totals, the chart, the breakdown, fit verdicts, formulas and sources.")
