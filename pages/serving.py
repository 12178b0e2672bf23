"""Serving: how many concurrent sequences of what length fit on vLLM or SGLang, term by term,
and the inverse question: N users at context L, on how many GPUs."""

import json

import pandas as pd
import streamlit as st

from estimator.serving.service import headline
from ui import keys as K, serving_view, state

cur = state.current()
st.title("Serving")
st.caption(f"Model **{state.plain(cur.model_label)}** · the engine's start-up accounting on one GPU of a replica "
           "(set the engine, version, max_model_len, KV dtype and weight format in the sidebar's Serving group)")

state.estimate_or_stop(cur)
res = serving_view.serving(cur.config_json)
if res.error is not None:
    state.show_error(res.error)
    st.stop()
result = res.value
r = result.resolved

if result.starts:
    st.success(headline(result), icon=":material/check_circle:")
else:
    st.error(headline(result), icon=":material/error:")
cols = st.columns(5)
cols[0].metric("Max concurrency", f"{result.capacity.max_concurrency:,.2f}",
               help=f"Sequences of max_model_len ({r.max_model_len:,} tokens) the KV cache holds at once.")
cols[1].metric("KV cache tokens", f"{result.capacity.tokens:,}")
cols[2].metric("KV cache", f"{result.capacity.kv_cache_bytes / 2**30:,.2f} GiB",
               help=f"{result.capacity.num_blocks:,} blocks of {r.block_size} tokens")
cols[3].metric("Longest max_model_len", f"{result.max_model_len_that_fits:,}",
               help="The longest single sequence the KV cache holds (what vLLM suggests when it refuses to start).")
cols[4].metric("Device total", f"{result.device_total_bytes / 2**30:,.2f} GiB",
               help=f"Of {result.total_bytes / 2**30:,.2f} GiB; budget {result.budget_bytes / 2**30:,.2f} GiB.")
if result.effective_concurrency != result.capacity.max_concurrency:
    st.caption(f"With the shared prefix cached: {result.effective_concurrency:,.2f} sequences.")
st.caption(f"{result.engine} {result.engine_version} (rules of {r.rules.label}) · weights {r.weight_format} · KV "
           f"{r.kv_cache_dtype} · max_num_seqs {r.max_num_seqs:,} · max_num_batched_tokens "
           f"{r.max_num_batched_tokens:,} · prefix caching {'on' if r.prefix_caching else 'off'}"
           f"{' (the engine default)' if r.prefix_caching_default else ''} · limiting rank: "
           f"stage {result.limiting_stage}")

st.subheader("Memory split")
rows = serving_view.split_rows(result)
st.vega_lite_chart(serving_view.split_chart_spec(rows), width="stretch")
st.dataframe(pd.DataFrame(rows), hide_index=True, width="stretch",
             column_config={"GiB": st.column_config.NumberColumn(format="%.2f")})
for note in result.notes:
    st.caption(f"Note: {note}")

st.subheader("How many GPUs for N users?")
left, right = st.columns(2)
users = left.number_input("Concurrent users", min_value=1, max_value=1_000_000, value=64, step=8, key=K.SERVE_USERS)
context = right.number_input("Context per user (tokens)", min_value=1, max_value=2**24,
                             value=int(r.max_model_len), step=1024, key=K.SERVE_CONTEXT)
planned = serving_view.plan(cur.config_json, int(users), int(context))
if planned.error is not None:
    st.warning(state.plain(str(planned.error)))
elif not planned.value.options:
    st.info(f"No layout holds one sequence of {int(context):,} tokens on this GPU.")
else:
    p = planned.value
    st.caption(f"{p.searched} layouts in {p.seconds:.2f} s; fewest GPUs first.")
    st.dataframe(pd.DataFrame([{
        "GPUs": o.gpus, "replicas": o.replicas, "TP": o.parallel.tp, "PP": o.parallel.pp,
        "sequences per replica": o.sequences_per_replica,
        "changes": ", ".join(f"{k}={v}" for k, v in o.changes.items()) or "none"} for o in p.options]),
        hide_index=True, width="stretch")

st.subheader("Export")
serving_json = json.dumps(result.to_json(), indent=2) + "\n"
c1, c2 = st.columns(2)
c1.download_button("Configuration (JSON)", json.dumps(cur.config, indent=2) + "\n", file_name="config.json",
                   mime="application/json", help="`python -m estimator serve --config config.json` prints the same.")
c2.download_button("Serving estimate (JSON)", serving_json, file_name="serving.json", mime="application/json")
