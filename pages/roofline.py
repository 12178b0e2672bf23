"""Roofline: where each operation of a training step (of an inference prefill) sits against the
GPU's compute and bandwidth roofs, and what the step costs in time."""

import pandas as pd
import streamlit as st

from estimator.spec.gpus import GPUS
from estimator.spec.wording import duration, verdict_word
from ui import compute, roofline_charts, state, view

cur = state.current()
# what the roofline times (roofline.roofline): a training step, or in inference one prefill of the batch
serving = cur.mode == "inference"
step_name = "prefill" if serving else "step"
st.title("Roofline")
st.caption(f"Model **{state.plain(cur.model_label)}** · "
           + ("one prefill of the batch (forward only, no backward or optimizer)" if serving else "one training step")
           + " on one GPU of the peak stage's layout")

state.estimate_or_stop(cur)
res = compute.roofline(cur.config_json)
if res.error is not None:
    state.show_error(res.error)
    st.stop()

rf = res.value
data = rf.to_json()
step = data.get("step", {})
gpu = GPUS[cur.values["gpu"]]


ops = data.get("operations", [])
# The roofs come from the roofline model's operations (the peak for each operation's dtype), or
# from the GPU catalog when there are none.
peaks = sorted({op["peak_flops"] for op in ops if op.get("peak_flops")}) or [gpu.bf16_flops]
bandwidth = next((op["bandwidth"] for op in ops if op.get("bandwidth")), gpu.memory_bandwidth)

bound = step.get("upper_bound", {})
cols = st.columns(5)
cols[0].metric(f"{step_name.capitalize()} time (expected)", duration(step.get("time_s", 0)),
               help=("One forward pass over every sequence's prompt (seq_len tokens each)" if serving else
                     "One optimizer step, all micro-batches") + f". At the roofs: {duration(bound.get('time_s', 0))}.")
cols[1].metric("Tokens/s per GPU", f"{step.get('tokens_per_s_per_gpu', 0):,.0f}",
               help=f"Roofline (upper bound): {bound.get('tokens_per_s_per_gpu', 0):,.0f}.")
cols[2].metric("MFU", f"{step.get('mfu', 0):.1%}",
               help=f"Model FLOPs utilisation: useful FLOPs / (time x peak). Upper bound {bound.get('mfu', 0):.1%}.")
cols[3].metric("Pipeline bubble", f"{step.get('bubble_share_of_step', 0):.1%}",
               help=f"Share of the {step_name} each GPU idles in the pipeline bubble. The bubble is (PP - 1) / (VPP x "
                    "micro-batches) of the compute time (Narayanan et al. 2021): "
                    f"{step.get('bubble_fraction', 0):.3g} here.")
cols[4].metric("Exposed communication", duration(step.get("exposed_comm_s", 0)),
               help=f"Communication of the {step_name} that no computation hides.")
st.caption(f"Roofline (upper bound): {bound.get('tokens_per_s_per_gpu', 0):,.0f} tokens/s per GPU, "
           f"MFU {bound.get('mfu', 0):.1%}, with every kernel at its roof and every link at its line rate.")

left, right = st.columns([3, 1])
with left:
    st.markdown(f"**Where the {step_name}'s time goes**")
    st.vega_lite_chart(roofline_charts.step_time_spec(step, step_name), width="stretch")
with right:
    est = state.estimate_or_stop(cur)
    st.markdown("**Memory**")
    try:
        st.metric("Device total (peak stage)", f"{est.device_total_bytes / 2**30:,.1f} GiB")
        st.caption(f"{verdict_word(est.fit.verdict)}, {est.fit.utilization:.0%} of {gpu.name}")
    except AttributeError:
        st.caption("See the Memory page.")

st.subheader(f"Roofline of {gpu.name}")
roofs = ", ".join(f"{p / 1e12:,.0f}" for p in peaks)
st.caption(f"Compute roof {roofs} TFLOP/s, bandwidth roof {bandwidth / 1e12:,.2f} TB/s, ridge at "
           f"{peaks[-1] / bandwidth:,.0f} FLOP/byte. Stage {data.get('stage', 0)} (the slowest), one micro-batch, "
           "one layer of each kind. Points: attainable FLOP/s of each operation; colour = what bounds it, "
           "shape = forward or backward. Times are at the roof: lower bounds.")
if ops:
    view.chart("roofline", cur.config_json)

st.subheader("Operations")
if ops:
    df = pd.DataFrame({
        "operation": [op["name"] for op in ops], "phase": [op["phase"] for op in ops],
        "scope": [op["scope"] for op in ops], "bound": [op["bound"] for op in ops],
        "GFLOP": [op["flops"] / 1e9 for op in ops], "MB": [op["bytes"] / 1e6 for op in ops],
        "FLOP/byte": [op["arithmetic_intensity"] for op in ops],
        "roof (µs)": [op["roof_time_s"] * 1e6 for op in ops], "expected (µs)": [op["time_s"] * 1e6 for op in ops],
        "achieved": [op["achieved_fraction"] for op in ops], "count": [op["count"] for op in ops],
        "total (ms)": [op["total_time_s"] * 1e3 for op in ops], "formula": [op["formula"] for op in ops],
        "source": [op["source"] for op in ops]})
    st.dataframe(df, hide_index=True, width="stretch", column_config={
        "GFLOP": st.column_config.NumberColumn(format="%.2f"), "MB": st.column_config.NumberColumn(format="%.1f"),
        "FLOP/byte": st.column_config.NumberColumn(format="%.1f"),
        "roof (µs)": st.column_config.NumberColumn(format="%.1f"),
        "expected (µs)": st.column_config.NumberColumn(format="%.1f"),
        "achieved": st.column_config.NumberColumn("achieved of roof", format="percent"),
        "total (ms)": st.column_config.NumberColumn(format="%.2f"),
    })
else:
    st.info("The roofline model returned no operations for this configuration.")
if step.get("communication"):
    st.markdown("**Communication per step**")
    comm = step["communication"]
    st.dataframe(pd.DataFrame({
        "collective": [c["name"] for c in comm], "group": [c["group"] for c in comm], "ranks": [c["size"] for c in comm],
        "link": [c["link"] for c in comm], "GB sent": [c["bytes"] / 1e9 for c in comm],
        "bus GB/s": [c["bandwidth"] / 1e9 for c in comm], "line GB/s": [c["line_bandwidth"] / 1e9 for c in comm],
        "time (ms)": [c["time_s"] * 1e3 for c in comm], "exposed (ms)": [c["exposed_s"] * 1e3 for c in comm]}),
        hide_index=True, width="stretch", column_config={
            k: st.column_config.NumberColumn(format="%.2f") for k in ("GB sent", "time (ms)", "exposed (ms)")})
for note in data.get("notes", []):
    st.caption(f"Note: {note}")
