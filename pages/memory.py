"""Memory: will the run fit? Totals first, then per stage, per component, per GPU, per phase."""

import streamlit as st

from ui import keys, launch_import, rl_view, state, view

cur = state.current()
st.title("Will it fit?")
st.caption(f"Model **{state.plain(cur.model_label)}** · estimates per GPU, per pipeline stage")
launch_import.box()

est = state.estimate_or_stop(cur)

view.verdict_banner(est)
view.batch_assumption(est)
view.totals(est)
view.what_to_change(cur, est)
rl_view.show(est)

st.subheader("Memory per pipeline stage")
view.chart("stages", cur.config_json)

peak = est.stages[est.peak_stage]
st.subheader(f"Breakdown of the peak stage (stage {peak.stage}, {peak.layers} layers, peak in {peak.peak_phase})")
view.breakdown_table(peak)
if len(est.stages) > 1:
    others = [s.stage for s in est.stages if s.stage != est.peak_stage]
    with st.expander("Other stages"):
        which = st.selectbox("Stage", others, key=keys.MEMORY_STAGE, persist_state="session")
        view.breakdown_table(est.stages[which])
view.activation_ledger(est)
view.host_memory(est)

st.subheader("Fit on every GPU")
view.fit_cards(est)

st.subheader(f"Through one step of stage {peak.stage}")
st.caption("Live tensors in each phase (the allocator's view, without the CUDA context, NCCL buffers and "
           "fragmentation). The stage's allocated peak is the largest of the three.")
view.chart("phases", cur.config_json)

if est.notes:
    with st.expander("Notes from the estimator"):
        for note in est.notes:
            st.markdown(f"- {note}")

st.subheader("Export")
view.export_buttons(cur, est)
