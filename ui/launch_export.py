"""The Planner's download of the chosen layout as the launch configuration of the user's framework:
the writers of `estimator.importers.emit`, each text read back through the importer of its kind
before it is offered (a setting the format cannot write is shown as the reason, not written as
another run). This module only lays it out."""

from __future__ import annotations

import json

import streamlit as st

from estimator.importers.emit import emit
from estimator.spec.errors import ConfigError

from . import keys as K
from .fields import friendly_message

# the launch configurations that can run each framework of the estimate, the framework's own first
KINDS = {"megatron": ("megatron", "megatron-bridge", "slime"), "fsdp2": ("torchtitan", "verl"),
         "hf_fsdp2": ("hf", "axolotl"), "fsdp1": ("hf",), "deepspeed": ("hf", "axolotl", "llama-factory"),
         "hf": ("hf", "axolotl", "llama-factory"), "torchtune": ("torchtune",)}
_RL_KINDS = ("slime", "verl")  # they launch RL runs only; the others none
LABELS = {"megatron": "Megatron-LM (torchrun pretrain_gpt.py)", "megatron-bridge": "Megatron-Bridge (run_recipe.py)",
          "slime": "slime (train.py)", "torchtitan": "torchtitan (job TOML)",
          "hf": "Hugging Face Trainer / TRL (arguments YAML)", "axolotl": "axolotl (YAML)",
          "llama-factory": "LLaMA-Factory (YAML)", "verl": "verl (main_ppo overrides)", "torchtune": "torchtune (YAML)"}
_FILES = {"torchtitan": ("toml", "toml"), "megatron": ("sh", "bash"), "megatron-bridge": ("sh", "bash"),
          "slime": ("sh", "bash"), "verl": ("sh", "bash")}


def kinds_for(config: dict) -> tuple[str, ...]:
    training = config.get("training") or {}
    rl = training.get("rl") is not None
    return tuple(k for k in KINDS.get(training.get("framework", "megatron"), ()) if (k in _RL_KINDS) == rl)


@st.cache_data(max_entries=64, show_spinner=False)
def _written(kind: str, config_json: str, gpus_per_node: int) -> tuple[str | None, str | None]:
    """(the text, None), or (None, why the kind cannot write it): strings, as the cache keeps them."""
    try:
        return emit(kind, json.loads(config_json), gpus_per_node), None
    except ConfigError as exc:
        return None, friendly_message(exc)


def _pick(rank: int) -> None:
    st.session_state[K.PLANNER_PICK] = rank  # a callback: before the selectbox exists in the next run


def download(config: dict, rank: int, gpus_per_node: int, others=()) -> None:
    """A kind to choose, and the layout `config` as that kind's launch configuration, or why not and
    the fastest of `others` ((rank, config) in rank order) that kind can write."""
    kinds = kinds_for(config)
    if not kinds:
        st.caption(":material/info: No launch configuration is written for this framework.")
        return
    if st.session_state.get(K.PLANNER_EMIT_KIND) not in kinds:
        st.session_state[K.PLANNER_EMIT_KIND] = kinds[0]
    c = st.columns([4, 1], vertical_alignment="bottom")
    kind = c[0].selectbox("Launch config for", kinds, key=K.PLANNER_EMIT_KIND, format_func=LABELS.get,
                          help="The chosen layout written as this framework's own launch configuration, to launch as "
                               "it is: read back through the importer of its kind before it is offered.")
    text, refusal = _written(kind, json.dumps(config, sort_keys=True), gpus_per_node)
    if refusal is not None:
        st.warning(f"**{LABELS[kind]}** cannot write layout #{rank}: {refusal}", icon=":material/block:")
        writable = next((r for r, other in others if r != rank and _written(kind, json.dumps(other, sort_keys=True),
                                                                            gpus_per_node)[0] is not None), None)
        if writable is not None:
            st.button(f"Choose layout #{writable}, the fastest it can write", key=K.PLANNER_EMIT_PICK, on_click=_pick,
                      args=(writable,), icon=":material/arrow_forward:")
        return
    suffix, language = _FILES.get(kind, ("yaml", "yaml"))
    c[1].download_button("Download", text, file_name=f"layout-{rank}-{kind}.{suffix}", mime="text/plain",
                         key=K.PLANNER_EMIT, icon=":material/download:", width="stretch",
                         help="Download the launch configuration shown below.")
    st.code(text, language=language)
