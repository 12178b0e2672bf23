"""Roofline: where each operation of a training step sits against the GPU's compute and
bandwidth roofs, and what the step costs in time."""

import pandas as pd
import streamlit as st

from estimator.hardware import GPUS
from ui import compute, state, view

cur = state.current()
st.title("Roofline")
st.caption(f"Model **{state.plain(cur.model_label)}** · one training step on one GPU of the peak stage's layout")

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

cols = st.columns(5)
cols[0].metric("Step time", f"{step.get('time_s', 0):,.3f} s", help="One optimizer step, all micro-batches.")
cols[1].metric("Tokens/s per GPU", f"{step.get('tokens_per_s_per_gpu', 0):,.0f}")
cols[2].metric("MFU", f"{step.get('mfu', 0):.1%}", help="Model FLOPs utilisation: useful FLOPs / (time × peak).")
cols[3].metric("Pipeline bubble", f"{step.get('bubble_share_of_step', 0):.1%}",
               help="Share of the step each GPU idles in the pipeline bubble, as a percentage of the step. The bubble is (PP - 1) / (VPP × "
                    "micro-batches) of the ideal compute time (Narayanan et al. 2021): "
                    f"{step.get('bubble_fraction', 0):.3g} here.")
cols[4].metric("Exposed communication", f"{step.get('exposed_comm_s', 0):,.3f} s")

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
    df = pd.DataFrame(ops)
    keep = [c for c in ("name", "phase", "scope", "kind", "bound", "flops", "bytes", "arithmetic_intensity", "time_s",
                        "count", "total_time_s", "formula") if c in df.columns]
    df = df[keep + [c for c in df.columns if c not in keep and c not in ("peak_flops", "bandwidth", "ridge_point")]]
    st.dataframe(df, hide_index=True, width="stretch", column_config={
        "total_time_s": st.column_config.NumberColumn("Time × count (s)", format="%.3e"),
        "flops": st.column_config.NumberColumn("FLOPs", format="%.3e"),
        "bytes": st.column_config.NumberColumn("Bytes", format="%.3e"),
        "arithmetic_intensity": st.column_config.NumberColumn("FLOP/byte", format="%.1f"),
        "time_s": st.column_config.NumberColumn("Time (s)", format="%.3e"),
    })
else:
    st.info("The roofline model returned no operations for this configuration.")
st.subheader("Step summary")
summary = {k: v for k, v in step.items() if not isinstance(v, (list, dict))}
st.dataframe(pd.DataFrame({"value": summary}), width="stretch")
if step.get("communication"):
    st.markdown("**Communication**")
    st.dataframe(pd.DataFrame(step["communication"]), hide_index=True, width="stretch")
for note in data.get("notes", []):
    st.caption(f"Note: {note}")
