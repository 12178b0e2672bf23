"""Compare: up to six named scenarios side by side (kept in this browser session)."""

import json

import pandas as pd
import streamlit as st

from estimator.spec.wording import verdict_word
from ui import charts, compute, exports, scenarios, state, keys as K
from ui.fields import config_key, friendly_message

cur = state.current()
ss = st.session_state
entries: list[dict] = ss.setdefault(K.SCENARIOS, [])

st.title("Compare scenarios")
st.caption(f"Up to {scenarios.MAX_SCENARIOS} scenarios, kept in this browser session. Add the configuration from "
           "the sidebar, change it, add it again; load one back to edit it.")


def _add() -> None:
    name = (ss.get(K.SCN_NEW_NAME) or "").strip() or f"Scenario {len(ss[K.SCENARIOS]) + 1}"
    if len(ss[K.SCENARIOS]) >= scenarios.MAX_SCENARIOS:
        ss[K.COMPARE_MSG] = ("error", f"At most {scenarios.MAX_SCENARIOS} scenarios: remove one first.")
        return
    ss[K.SCENARIOS].append(scenarios.new_entry(name, ss[K.CURRENT].config))
    ss[K.SCN_NEW_NAME] = ""


def _remove(entry_id: str) -> None:
    ss[K.SCENARIOS] = [e for e in ss[K.SCENARIOS] if e["id"] != entry_id]


def _rename(entry_id: str) -> None:
    for e in ss[K.SCENARIOS]:
        if e["id"] == entry_id:
            e["name"] = (ss.get(K.scn_name(entry_id)) or "").strip() or e["name"]


def _import() -> None:
    upload = ss.get(K.SCN_IMPORT)
    if upload is None:
        return
    new, problem = scenarios.read_upload(upload, "scenarios")
    if problem:
        ss[K.COMPARE_MSG] = ("error", problem)
        return
    room = scenarios.MAX_SCENARIOS - len(ss[K.SCENARIOS])
    ss[K.SCENARIOS].extend(new[:room])
    dropped = len(new) - min(len(new), room)
    ss[K.COMPARE_MSG] = ("success", f"Imported {min(len(new), room)} scenario(s) from {upload.name}"
                          + (f"; {dropped} left out (at most {scenarios.MAX_SCENARIOS})." if dropped else "."))


cols = st.columns([3, 2, 1], vertical_alignment="bottom")
cols[0].text_input("Name of the new scenario", key=K.SCN_NEW_NAME, placeholder=f"Scenario {len(entries) + 1}")
cols[1].button("Add current configuration", key=K.SCN_ADD, on_click=_add, icon=":material/add:",
               disabled=len(entries) >= scenarios.MAX_SCENARIOS or bool(cur.waiting), width="stretch",
               help="Adds the configuration in the sidebar as it is now." if not cur.waiting else
               "Choose a model first: " + cur.waiting)
with cols[2].popover("Import", icon=":material/upload:", width="stretch"):
    st.file_uploader("Scenarios (JSON)", type=["json"], key=K.SCN_IMPORT, on_change=_import,
                     help="A file exported from this page, or one configuration in the CLI's format.")
msg = ss.pop(K.COMPARE_MSG, None)
if msg:
    (st.success if msg[0] == "success" else st.error)(msg[1])

if not entries:
    st.info("No scenarios yet. Set up a configuration in the sidebar and press **Add current configuration**.",
            icon=":material/info:")
    st.stop()

# the scenario list: rename, load, remove
results = []
for e in list(entries):
    res = compute.estimate(config_key(e["config"]))
    results.append((e, res))
    with st.container(border=True):
        c = st.columns([3, 3, 1, 1], vertical_alignment="center")
        c[0].text_input("Name", value=e["name"], key=K.scn_name(e['id']), on_change=_rename, args=(e["id"],),
                        label_visibility="collapsed")
        if res.ok:
            est = res.value
            c[1].markdown(f"{est.device_total_bytes / charts.GiB:,.2f} GiB on {est.fit.gpu} · "
                          f"**{verdict_word(est.fit.verdict)}** ({est.fit.utilization:.0%})")
        else:
            c[1].error(state.plain(friendly_message(res.error)) if res.error else "not available")
        c[2].button("Load", key=K.scn_load(e['id']), icon=":material/edit:", width="stretch",
                    on_click=state.load_and_open, args=(e["config"], f"scenario '{e['name']}'", None),
                    help="Load this scenario into the sidebar to edit it.")
        c[3].button("Remove", key=K.scn_remove(e['id']), on_click=_remove, args=(e["id"],), icon=":material/delete:",
                    width="stretch")

named = [(e["name"], res.value) for e, res in results if res.ok]
if not named:
    st.stop()

st.subheader("Peak-stage memory")
st.altair_chart(charts.compare_chart(named), width="stretch", key=K.COMPARE_CHART)

st.subheader("Totals and fit")
st.dataframe(scenarios.totals_frame(named), hide_index=True, width="stretch", column_config={
    "Device total (GiB)": st.column_config.NumberColumn(format="%.2f"),
    "Allocated peak (GiB)": st.column_config.NumberColumn(format="%.2f"),
    "Capacity (GiB)": st.column_config.NumberColumn(format="%.1f"),
    "Use": st.column_config.ProgressColumn(format="percent", min_value=0.0, max_value=1.5),
    "Parameters": st.column_config.NumberColumn(format="localized"),
    "Active": st.column_config.NumberColumn(format="localized"),
})

st.subheader("Settings that differ")
diff = scenarios.settings_diff([e for e, _ in results])
if diff.empty:
    st.caption("The scenarios have the same settings.")
else:
    st.dataframe(diff, width="stretch")

st.subheader("Speed (expected step time; roofline upper bound beside it)")
rows = []
for e, res in results:
    if not res.ok:
        continue
    rf = compute.roofline(config_key(e["config"]))
    if rf.ok:
        step = rf.value.to_json()["step"]
        rows.append({"Scenario": e["name"], "Step time (s)": step.get("time_s"),
                     "Tokens/s per GPU": step.get("tokens_per_s_per_gpu"), "MFU": step.get("mfu"),
                     "Bubble (share of step)": step.get("bubble_share_of_step"), "Exposed comm. (s)": step.get("exposed_comm_s"),
                     "Upper bound tokens/s per GPU": step.get("upper_bound", {}).get("tokens_per_s_per_gpu")})
    else:
        rows.append({"Scenario": e["name"], "Step time (s)": None})
if rows:
    st.dataframe(pd.DataFrame(rows), hide_index=True, width="stretch", column_config={
        "Step time (s)": st.column_config.NumberColumn(format="%.3f"),
        "Tokens/s per GPU": st.column_config.NumberColumn(format="%.0f"),
        "MFU": st.column_config.NumberColumn(format="percent"),
        "Bubble (share of step)": st.column_config.NumberColumn(format="percent"),
        "Exposed comm. (s)": st.column_config.NumberColumn(format="%.3f"),
        "Upper bound tokens/s per GPU": st.column_config.NumberColumn(format="%.0f"),
    })


@st.cache_data(max_entries=32, show_spinner=False)
def _compare_pdf(payload: str) -> bytes:
    items = json.loads(payload)
    triples = [(i["name"], i["config"], compute._estimate(config_key(i["config"]))) for i in items]
    png = exports.chart_png(charts.compare_chart([(n, est) for n, _, est in triples]))
    return exports.compare_pdf(triples, chart=png)


st.subheader("Export")
ok_entries = [e for e, res in results if res.ok]
payload = json.dumps([{"name": e["name"], "config": e["config"]} for e in ok_entries], sort_keys=True)
c = st.columns(3)
c[0].download_button("Breakdown (CSV)", exports.compare_csv(named), file_name="scenarios-memory.csv",
                     mime="text/csv", on_click="ignore", icon=":material/table:", key=K.SCN_CSV, width="stretch")
c[1].download_button("Scenarios (JSON)", scenarios.dump(entries, "scenarios"), file_name="scenarios.json",
                     mime="application/json", on_click="ignore", icon=":material/data_object:", key=K.SCN_JSON,
                     width="stretch", help="Import it here again, in another session or browser.")
c[2].download_button("Report (PDF)", lambda: _compare_pdf(payload), file_name="scenarios-report.pdf",
                     mime="application/pdf", on_click="ignore", icon=":material/picture_as_pdf:", key=K.SCN_PDF,
                     width="stretch")
