"""Planner: every parallel layout of this run on N GPUs; which fit, which are fastest, and the
memory/throughput Pareto front. One click loads a layout into the shared configuration."""

import json

import pandas as pd
import streamlit as st

from estimator import ConfigError
from estimator.spec.gpus import GPUS
from estimator.memory.result import TIGHT_FRACTION
from estimator.spec.parallel import tp_following_defaults
from estimator.search.stacks import in_words
from ui import charts, compute, launch_export, searches, state, keys as K
from ui.fields import config_key, friendly_message

MAX_GPUS = 16384  # the planner's own bound (plan(max_gpus=...)), where its no-fit search stops
GiB = 1024**3

cur = state.current()
ss = st.session_state
st.title("Planner")
st.caption(f"Model **{state.plain(cur.model_label)}** · every parallel layout on N GPUs: which fit, which are fastest")

if cur.waiting:
    st.info(cur.waiting, icon=":material/info:")
    st.stop()
if cur.mode != "training":
    st.info("The planner lays out training runs: set **Mode** to training in the sidebar (Run).",
            icon=":material/info:")
    st.stop()

# The planner sets the whole layout itself, so a layout the sidebar cannot estimate (TP 3 on 32
# heads) does not stop it; the model, the training setup and the GPU must be valid on their own,
# or with the sidebar's layout where the setup needs one (DeepEP needs EP > 1: DeepSeek-V3's recipe).
plan_cfg = compute.plan_config(cur.config)
plan_json = config_key(plan_cfg)
check = compute.estimate(plan_json)
if not check.ok and compute.estimate(cur.config_json).ok:
    check = compute.estimate(cur.config_json)
if not check.ok:
    state.show_error(check.error or ConfigError("config", "", "a configuration the estimator can handle"))
    st.stop()
st.caption(f":material/tune: The layouts **{check.value.training.framework}** runs, the only ones searched: "
           f"{in_words(check.value.training)}")


def _layout_gpus() -> int:
    v = cur.values
    return max(1, int(v.get("tp") or 1) * int(v.get("pp") or 1) * int(v.get("cp") or 1) * int(v.get("dp") or 1))


def _typed() -> None:
    ss[K.PLANNER_GPUS_SET] = True


def _ask() -> None:
    ss[K.PLANNER_ASK] = True
    ss[K.PLANNER_AGAIN] = True


def _replan(asked: dict, gpus: int) -> None:
    """The no-fit answer's button: the same search on the fewest GPUs that fit."""
    ss[K.PLANNER_GPUS] = gpus  # before the widget exists in the next run: allowed
    ss[K.PLANNER_GPUS_SET] = True
    ss[K.PLANNER_ASKED] = {**asked, "gpus": gpus}


# Until the user types a count, the GPU count follows the sidebar's layout (TP x PP x CP x DP).
# Set through the session state only, never with `value=` as well (Streamlit warns on both).
if not ss.get(K.PLANNER_GPUS_SET) or K.PLANNER_GPUS not in ss:
    ss[K.PLANNER_GPUS] = _layout_gpus()
cols = st.columns([1, 1, 2, 1], vertical_alignment="bottom")
cols[0].number_input("GPUs", min_value=1, max_value=MAX_GPUS, step=1, key=K.PLANNER_GPUS, on_change=_typed,
                     persist_state="session",
                     help="How many GPUs to lay the run out on; starts at the sidebar's TP x PP x CP x DP. The "
                          "search takes seconds on 8 GPUs and longer on thousands; it runs in a worker process "
                          "and shows its progress.")
cols[1].number_input("GPUs per node", min_value=1, max_value=64, value=8, step=1, key=K.PLANNER_PER_NODE,
                     persist_state="session", help="Tensor parallelism stays within one node.")
cols[2].slider("Memory margin", min_value=10, max_value=100, value=round(TIGHT_FRACTION * 100), step=1,
               format="%d%%", key=K.PLANNER_MARGIN, persist_state="session",
               help="The largest share of the GPU's memory a layout may use. 80% is the estimator's 'fits' "
                    "verdict: no run went out of memory below it in 454 measured runs (Fujii et al. 2024).")
inputs = {"config": cur.config, "plan_json": plan_json, "gpus": int(ss[K.PLANNER_GPUS]), "per_node": int(ss[K.PLANNER_PER_NODE]),
          "margin": ss[K.PLANNER_MARGIN] / 100}
cols[3].button("Plan", key=K.PLANNER_RUN, type="primary", icon=":material/search:", width="stretch", on_click=_ask,
               help="Search every layout (TP, PP with VPP, CP, DP, EP, ZeRO, micro-batch, recompute, loss) and "
                    "estimate the candidates in full.")
# The search takes this run's inputs (a callback would see the previous run's configuration); the
# click itself is a callback's flag, since a run can restart before reaching the button (state.current)
if ss.pop(K.PLANNER_ASK, False):
    ss[K.PLANNER_ASKED] = inputs

asked = ss.get(K.PLANNER_ASKED)
if not asked:
    st.info("Press **Plan** to search every parallel layout of this run on these GPUs.", icon=":material/info:")
    st.stop()


def _same(a: dict, b: dict) -> bool:
    return all(a[k] == b[k] for k in ("plan_json", "gpus", "per_node", "margin"))


def _recompute(t: dict) -> str:
    if t["recompute"] == "full":
        n = t.get("recompute_layers")
        return f"full ({n} layer{'s' if n != 1 else ''})" if n else "full (all)"
    return t["recompute"]


def _pipeline(p: dict) -> str:
    text = f"PP {p['pp']}"
    if p.get("pp_first_stage_layers") is not None:
        text += f" ({p['pp_first_stage_layers']}|..|{p['pp_last_stage_layers']})"
    return text + (f" × VPP {p['vpp']}" if p["vpp"] > 1 else "")


def _describe(x: dict) -> str:
    p, t = x["parallel"], x["training"]
    parts = [f"TP {p['tp']}", _pipeline(p), f"CP {p['cp']}", f"DP {p['dp']}"]
    if p["ep"] > 1 or p["etp"] != p["tp"]:
        parts.append(f"EP {p['ep']}/ETP {p['etp']}")
    parts += [f"ZeRO {p['zero_stage']}", f"micro-batch {t['micro_batch_size']}", f"recompute {_recompute(t)}",
              f"{t['loss']} loss"]
    return " · ".join(parts)


def _describe_best(x: dict) -> str:
    return (f"{_describe(x)} · {x['device_total_bytes'] / GiB:,.2f} GiB · "
            f"{x['tokens_per_s_per_gpu']:,.0f} tokens/s per GPU")


# The search runs in a worker process (ui.searches): this run asks for it, and while it waits or
# runs the page shows where it stands and stops here; its answer comes back as plain data.
job = "plan:" + json.dumps([asked["plan_json"], asked["gpus"], asked["per_node"], asked["margin"]])
answer = searches.request(job, "plan", {"config_json": asked["plan_json"], "gpus": asked["gpus"],
                                        "gpus_per_node": asked["per_node"], "margin": asked["margin"]},
                          page=searches.PLANNER, again=ss.pop(K.PLANNER_AGAIN, False))
if answer.state in (searches.QUEUED, searches.RUNNING):
    searches.progress_panel(job, _describe_best, f"Searching every layout on {asked['gpus']:,} GPUs")
    st.stop()
if answer.state != searches.DONE:
    error = searches.error_of(answer)
    st.error(f"**The planner cannot lay out this run.** {state.plain(friendly_message(error))}",
             icon=":material/error:")
    st.stop()
data = answer.result
if not _same(asked, inputs):
    st.info(f"These layouts are for the inputs of the last search ({asked['gpus']:,} GPUs, {asked['per_node']} per "
            f"node, margin {asked['margin']:.0%}, and the sidebar's settings then); the inputs have changed since: "
            "press **Plan** to search again.", icon=":material/history:")

layouts = data["layouts"]
if data.get("stopped"):
    st.warning(state.plain(data["note"]), icon=":material/timer_off:")
limit_bytes = asked["margin"] * data["capacity_bytes"]
found = (f"Searched **{data['searched']:,}** layouts on {asked['gpus']:,} × {data['gpu']} in "
         f"**{data['seconds']:.2f} s** ({data['estimates']:,} full estimates, {data['rooflines']:,} rooflines; "
         "the rest judged by exact rules)")
if not layouts:
    extra = data["wall_seconds"] - data["seconds"]
    st.caption(found + ("." if data.get("not_searched") else f"; finding the fewest GPUs that fit took {extra:.1f} s more."))
    st.warning(state.plain(data["no_fit"][:1].upper() + data["no_fit"][1:]) + ".", icon=":material/block:")
    fewest = data.get("smallest_fit") or {}
    own = fewest.get(data["gpu"])
    if own:
        st.button(f"Plan on {own:,} × {data['gpu']}", key=K.PLANNER_REPLAN, type="primary", icon=":material/replay:",
                  on_click=_replan, args=(asked, own),
                  help="Search again with the fewest of these GPUs on which some layout fits.")
    others = [{"GPU": g, "Name": GPUS[g].name if g in GPUS else g, "Fewest GPUs that fit": n}
              for g, n in fewest.items()]
    if others:
        with st.expander("The fewest GPUs of each kind that fit (powers of two)"):
            st.dataframe(pd.DataFrame(others), hide_index=True, width="stretch",
                         column_config={"Fewest GPUs that fit": st.column_config.NumberColumn(format="localized")})
    st.stop()

front = sum(x["pareto"] for x in layouts)
st.caption(found + f". Listed: the fastest fitting layouts and the Pareto front of memory against throughput "
           f"({front} layouts), {len(layouts)} in all, each within {asked['margin']:.0%} of "
           f"{data['capacity_bytes'] / GiB:,.1f} GiB. Speeds are the step-time model's expected figures "
           "(achieved kernel efficiency, measured NCCL bandwidth, each framework's overlap).")


def _uneven(p: dict) -> str:
    first = p.get("pp_first_stage_layers")
    return "" if first is None else f"{first}|{p['pp_last_stage_layers']}"


# What a layout gives (memory and speed) comes first, then the layout: 19 columns do not fit in the
# page's width, and the numbers the table is read for were off-screen at 1400 px
rows = [{"Rank": i, "Pareto": x["pareto"], "GiB per GPU": x["device_total_bytes"] / GiB,
         "Utilization": x["utilization"], "Tokens/s per GPU": x["tokens_per_s_per_gpu"], "MFU": x["mfu"],
         "Step time (s)": x["step_time_s"], "TP": x["parallel"]["tp"], "PP": x["parallel"]["pp"],
         "VPP": x["parallel"]["vpp"], "First|last layers": _uneven(x["parallel"]), "CP": x["parallel"]["cp"],
         "DP": x["parallel"]["dp"], "EP": x["parallel"]["ep"], "ETP": x["parallel"]["etp"],
         "ZeRO": x["parallel"]["zero_stage"], "Micro-batch": x["training"]["micro_batch_size"],
         "Recompute": _recompute(x["training"]), "Loss": x["training"]["loss"]}
        for i, x in enumerate(layouts, 1)]

st.subheader("Memory against throughput")
st.caption("Every listed layout; the Pareto front (no other layout needs less memory and runs faster) in red, "
           "joined. Hover a point for its layout; the dashed line is the memory limit.")
points = [{"rank": r["Rank"], "GiB": r["GiB per GPU"], "tokens_per_s": r["Tokens/s per GPU"], "mfu": r["MFU"],
           "step_s": r["Step time (s)"], "layout": _describe(x),
           "set": "Pareto front" if x["pareto"] else "Other layouts"} for r, x in zip(rows, layouts)]
try:
    st.vega_lite_chart(charts.planner_spec(points, limit_bytes / GiB), width="stretch", key=K.PLANNER_CHART)
except Exception as exc:  # a chart is never worth a traceback
    st.caption(f":material/info: The chart is not available for these layouts ({type(exc).__name__}).")


def _picked() -> None:
    """A row clicked in the table becomes the layout to use (rows are in rank order, whatever the sort)."""
    event = ss.get(K.PLANNER_TABLE)
    chosen = event.selection.rows if event is not None and event.selection else []
    if chosen:
        ss[K.PLANNER_PICK] = chosen[0] + 1


st.subheader("Fitting layouts, fastest first")
st.caption("Click a column header to sort, a row to choose it. PP first|last: the layers of uneven first and "
           "last pipeline stages; ZeRO: the stage the layout runs (Megatron's distributed optimizer is 1).")
st.dataframe(pd.DataFrame(rows), hide_index=True, width="stretch", key=K.PLANNER_TABLE, on_select=_picked,
             selection_mode="single-row", column_config={
                 "Pareto": st.column_config.CheckboxColumn("Pareto", help="On the memory/throughput Pareto front"),
                 "GiB per GPU": st.column_config.NumberColumn(format="%.2f", help="Device total of the peak stage"),
                 "Utilization": st.column_config.NumberColumn(format="percent"),
                 "Tokens/s per GPU": st.column_config.NumberColumn(format="localized"),
                 "MFU": st.column_config.NumberColumn(format="percent"),
                 "Step time (s)": st.column_config.NumberColumn(format="%.3f"),
             })


def layout_config(config: dict, changes: dict) -> dict:
    """`config` with the planner's layout: its parallel fields replace the sidebar's whole layout
    (uneven stages and world size included: a field the layout leaves out is its default), its
    training fields the micro-batch, recompute and loss; the rest is as it was planned.

    A field that follows TP (expert TP, sequence parallelism) and holds the value TP gives it is
    left out, to go on following TP: written out, a later change of TP in the sidebar would be
    refused (ETP 4 with TP 2 on a dense model, sequence parallelism with TP 1)."""
    parallel = {k: v for k, v in (config.get("parallel") or {}).items() if k == "comm_overlap"}
    following = tp_following_defaults(changes["parallel"]["tp"])
    chosen = {k: v for k, v in changes["parallel"].items() if k not in following or v != following[k]}
    training = {k: v for k, v in (config.get("training") or {}).items()
                if k not in ("recompute_layers", "recompute_modules")}  # the planner's own, or the default
    return {**config, "parallel": {**parallel, **chosen}, "training": {**training, **changes["training"]}}


ranks = list(range(1, len(layouts) + 1))
if ss.get(K.PLANNER_PICK) not in ranks:
    ss[K.PLANNER_PICK] = 1
c = st.columns([4, 1], vertical_alignment="bottom")
rank = c[0].selectbox("Layout", ranks, key=K.PLANNER_PICK,
                      format_func=lambda r: f"#{r}: {_describe(layouts[r - 1])} · "
                                            f"{layouts[r - 1]['device_total_bytes'] / GiB:,.2f} GiB · "
                                            f"{layouts[r - 1]['tokens_per_s_per_gpu']:,.0f} tokens/s per GPU")
chosen = layouts[rank - 1]
picked = layout_config(asked["config"], {"parallel": chosen["parallel"], "training": chosen["training"]})
c[1].button("Use this layout", key=K.PLANNER_USE, type="primary", icon=":material/play_arrow:", width="stretch",
            on_click=state.load_and_open, args=(picked, f"layout #{rank} of the planner"),
            help="Loads the layout into the sidebar's configuration (and the link) and opens the Memory page.")
# the same layout as the user's framework writes a launch (ui/launch_export.py)
launch_export.download(picked, rank, asked["per_node"], others=(
    (r, layout_config(asked["config"], {"parallel": x["parallel"], "training": x["training"]}))
    for r, x in enumerate(layouts, 1)))
