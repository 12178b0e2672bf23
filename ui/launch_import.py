"""The Memory page's "Import a launch config" box: paste or upload a framework's own launch
configuration (a Megatron-LM command line or script, a torchtitan TOML, a torchtune or axolotl
YAML, ...), load it as the configuration (the URL follows, as for any loaded configuration), and
show every setting it met: read, ignored, not modelled, unknown. The reading is
`estimator.importers`'; this module only lays it out."""

from __future__ import annotations

import streamlit as st

from estimator.spec.errors import ConfigError
from estimator.importers import import_config, supported_kinds
from estimator.importers.source import decode

from . import keys as K, state

GUESS = "guess from the text"
_LISTS = (("read", "Read"), ("ignored", "Ignored (no effect on memory)"), ("unsupported", "Not modelled"),
          ("unknown", "Unknown"))


def box() -> None:
    result = st.session_state.get(K.LAUNCH_RESULT)
    with st.expander("Import a launch config", expanded=result is not None, icon=":material/upload_file:"):
        st.caption("The configuration you are about to launch, as its framework writes it: a `pretrain_gpt.py` "
                   "command line or script (Megatron-LM), a job TOML (torchtitan), a recipe YAML (torchtune, "
                   "axolotl, LLaMA-Factory), a DeepSpeed or Accelerate config, the Trainer's arguments, a slime, "
                   "OpenRLHF, verl or Megatron-Bridge launch, a vLLM/SGLang serve line. It becomes the "
                   "configuration of every page; nothing in it is run.")
        st.text_area("Paste a launch configuration", key=K.LAUNCH_TEXT, height=150,
                     placeholder="torchrun --nproc_per_node 8 pretrain_gpt.py --tensor-model-parallel-size 2 ...")
        st.file_uploader("or upload the file", key=K.LAUNCH_FILE)
        left, right = st.columns(2)
        left.selectbox("Kind", [GUESS, *supported_kinds()], key=K.LAUNCH_KIND)
        right.number_input("GPUs (where the launcher decides; 0 = from the file)", min_value=0, max_value=2**20,
                           value=0, step=1, key=K.LAUNCH_GPUS)
        st.button("Import", key=K.LAUNCH_BUTTON, on_click=_on_import, type="primary")
        if result is not None:
            _show(result)


def _on_import() -> None:
    ss = st.session_state
    upload = ss.get(K.LAUNCH_FILE)
    try:
        if upload is not None:
            text, name = decode(upload.getvalue(), upload.name), upload.name
        else:
            text, name = ss.get(K.LAUNCH_TEXT) or "", ""
        if not text.strip():
            raise ConfigError("launch config", "", "a pasted or uploaded launch configuration", "empty")
        kind = ss.get(K.LAUNCH_KIND)
        gpus = int(ss.get(K.LAUNCH_GPUS) or 0) or None
        imported = import_config(text, None if kind in (None, GUESS) else kind, name=name, gpus=gpus)
    except ConfigError as exc:
        ss[K.LAUNCH_RESULT] = {"error": str(exc)}
        return
    ss[K.LAUNCH_RESULT] = imported.to_json()
    state.request_config(imported.config, f"a {imported.kind} launch config")


def _show(result: dict) -> None:
    if "error" in result:
        st.error(state.plain(result["error"]), icon=":material/error:")
        return
    counts = ", ".join(f"{len(result[k])} {label.split(' (')[0].lower()}" for k, label in _LISTS)
    st.success(f"Loaded a {result['kind']} launch config: {counts}.", icon=":material/check_circle:")
    tabs = st.tabs([f"{label} ({len(result[k])})" for k, label in _LISTS] + [f"Notes ({len(result['notes'])})"])
    for tab, (k, _) in zip(tabs, _LISTS):
        with tab:
            if result[k]:
                st.table([{"setting": r["name"], "value": r["value"], "note": r["note"]} for r in result[k]])
            else:
                st.caption("None.")
    with tabs[-1]:
        for note in result["notes"]:
            st.markdown(f"- {state.plain(note)}")
