"""Presets: the bundled models and training recipes, and your own saved configurations."""

import pandas as pd
import streamlit as st

from estimator.spec.wording import counted, verdict_word
from ui import compute, scenarios, state, keys as K
from ui.fields import config_key, friendly_message

cur = state.current()
ss = st.session_state
st.title("Presets")


@st.cache_data(show_spinner=False)
def _models() -> pd.DataFrame:
    from estimator.spec.architecture import parameter_counts
    from estimator.models.hf_config import context_length
    from estimator.models.presets import counting_note, get_architecture, get_hf_config, list_presets

    rows = []
    for p in list_presets():
        arch = get_architecture(p.id)
        counts = parameter_counts(arch)
        # the same counts, labelled the same way, as `python -m estimator presets`
        rows.append({"id": p.id, "Name": p.name, "Computed total (B)": counts.total / 1e9,
                     "Computed active (B)": counts.active / 1e9, "Layers": arch.num_layers, "Hidden": arch.hidden_size,
                     "Heads": arch.num_attention_heads, "KV heads": arch.num_kv_heads, "Experts": arch.num_experts,
                     "Context": context_length(get_hf_config(p.id)), "Hub id": p.hub_id,
                     "Published total": p.published_total, "Published active": p.published_active,
                     "How the publisher counts": counting_note(p)})
    return pd.DataFrame(rows)


try:
    models = _models()
except Exception as exc:  # the presets package is still being written
    models = None
    st.info(f"The bundled presets are not available in this build ({type(exc).__name__}).")

tab_models, tab_recipes, tab_mine = st.tabs(["Models", "Training recipes", "My presets"])

with tab_models:
    if models is not None and not models.empty:
        st.caption("Click a column header to sort. 'Computed' counts are the estimator's, exact, from each model's "
                   "published config (the text decoder with any MTP module; active: every parameter a token passes "
                   "through, the embedding included); 'Published' counts are the publisher's, and the last column "
                   "says where they count otherwise. `python -m estimator presets` lists the same counts.")
        event = st.dataframe(models, hide_index=True, width="stretch", on_select="rerun",
                             height=36 * (len(models) + 1) + 4,
                             selection_mode="single-row", key=K.PRESET_TABLE, column_config={
                                 "Computed total (B)": st.column_config.NumberColumn(format="%.2f"),
                                 "Computed active (B)": st.column_config.NumberColumn(format="%.2f"),
                                 "Context": st.column_config.NumberColumn(format="localized"),
                                 "Published total": st.column_config.NumberColumn(format="localized"),
                                 "Published active": st.column_config.NumberColumn(format="localized"),
                             })
        ids = list(models["id"])
        selected = event.selection.rows if event and event.selection else []
        default = ids.index(models.iloc[selected[0]]["id"]) if selected else (
            ids.index(cur.model.preset) if cur.model.source == "preset" and cur.model.preset in ids else 0)
        c = st.columns([3, 1], vertical_alignment="bottom")
        chosen = c[0].selectbox("Model", ids, index=default, key=K.PRESET_PICK,
                                format_func=lambda i: f"{i} ({models.set_index('id').loc[i, 'Name']})")

        def _use_model() -> None:
            pick = ss[K.PRESET_PICK]
            state.load_and_open({**ss[K.CURRENT].config, "model": pick}, f"model {pick}")

        c[1].button("Use this model", key=K.PRESET_USE, icon=":material/play_arrow:", type="primary",
                    width="stretch", on_click=_use_model,
                    help="Keeps the training, parallel and GPU settings; opens the Memory page.")

with tab_recipes:
    try:
        from estimator.models.presets import list_recipes
        recipes = list_recipes()
    except Exception as exc:
        recipes = []
        st.info(f"The bundled recipes are not available in this build ({type(exc).__name__}).")
    for r in recipes:
        with st.container(border=True):
            st.markdown(f"**{r.name}**")
            st.write(r.description)
            st.caption(f"Source: {r.source}")
            res = compute.estimate(config_key(r.config))
            if res.ok:
                est = res.value
                st.markdown(f"{est.device_total_bytes / 1024**3:,.2f} GiB per GPU on {est.fit.gpu} · "
                            f"**{verdict_word(est.fit.verdict)}** ({est.fit.utilization:.0%}) · "
                            f"{counted(est.parallel.gpus, 'GPU')}")
            elif res.error:
                st.warning(state.plain(friendly_message(res.error)))
            c = st.columns([1, 4])
            c[0].button("Use this recipe", key=K.recipe(r.id), icon=":material/play_arrow:",
                        on_click=state.load_and_open, args=(r.config, f"recipe '{r.name}'"))
            with c[1].expander("Configuration"):
                st.json(r.config)

with tab_mine:
    mine: list[dict] = ss.setdefault(K.USER_PRESETS, [])

    def _save() -> None:
        name = (ss.get(K.MY_PRESET_NAME) or "").strip() or f"My preset {len(ss[K.USER_PRESETS]) + 1}"
        ss[K.USER_PRESETS].append(scenarios.new_entry(name, ss[K.CURRENT].config))
        ss[K.MY_PRESET_NAME] = ""
        ss[K.PRESETS_MSG] = ("success", f"Saved '{name}'.")

    def _remove(entry_id: str) -> None:
        ss[K.USER_PRESETS] = [e for e in ss[K.USER_PRESETS] if e["id"] != entry_id]

    def _import() -> None:
        upload = ss.get(K.MY_PRESET_IMPORT)
        if upload is None:
            return
        new, problem = scenarios.read_upload(upload, "presets")
        if problem:
            ss[K.PRESETS_MSG] = ("error", problem)
            return
        ss[K.USER_PRESETS].extend(new)
        ss[K.PRESETS_MSG] = ("success", f"Imported {len(new)} preset(s) from {upload.name}.")

    st.caption("Save the sidebar's configuration under a name; presets live in this browser session, so export "
               "them to keep them.")
    c = st.columns([3, 1], vertical_alignment="bottom")
    c[0].text_input("Name", key=K.MY_PRESET_NAME, placeholder=f"My preset {len(mine) + 1}")
    c[1].button("Save current configuration", key=K.MY_PRESET_SAVE, on_click=_save, icon=":material/save:",
                width="stretch", disabled=bool(cur.waiting),
                help=("Choose a model first: " + cur.waiting) if cur.waiting else None)
    msg = ss.pop(K.PRESETS_MSG, None)
    if msg:
        (st.success if msg[0] == "success" else st.error)(msg[1])
    for e in mine:
        with st.container(border=True):
            c = st.columns([4, 1, 1], vertical_alignment="center")
            model = e["config"].get("model")
            shown = model if isinstance(model, str) else "custom architecture"
            c[0].markdown(f"**{state.plain(e['name'])}** · {state.plain(shown)}")
            c[1].button("Use", key=K.my_use(e['id']), icon=":material/play_arrow:", width="stretch",
                        on_click=state.load_and_open, args=(e["config"], f"preset '{e['name']}'"))
            c[2].button("Remove", key=K.my_remove(e['id']), on_click=_remove, args=(e["id"],),
                        icon=":material/delete:", width="stretch")
    c = st.columns(2)
    c[0].download_button("Export my presets (JSON)", scenarios.dump(mine, "presets"), file_name="my-presets.json",
                         mime="application/json", on_click="ignore", icon=":material/download:", key=K.MY_PRESET_EXPORT,
                         disabled=not mine, width="stretch")
    with c[1].popover("Import presets (JSON)", icon=":material/upload:", width="stretch"):
        st.file_uploader("Presets file", type=["json"], key=K.MY_PRESET_IMPORT, on_change=_import)
