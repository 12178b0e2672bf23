"""The one configuration every page shares: its widgets (in the sidebar), its URL and its state.

`app.py` calls `render_config()` after ``st.navigation(...)`` and before ``pg.run()``: widgets
created there keep their values across page switches, and their ``bind="query-params"`` keeps
the URL in step (Streamlit 1.67; see shared/research). The model is not one widget, so its URL
parameters (``model``, and the architecture's fields with ``model=custom``) are written here on
every run.

Pages read `current()` and never touch widget keys. To load a whole configuration (a preset, a
recipe, a scenario, an imported file) a page calls `request_config(config)` and reruns; the next
run applies it before any widget exists, which is the only moment Streamlit allows it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlencode

import streamlit as st

from estimator import ConfigError
from estimator.hardware import GPUS

from . import compute
from .fields import (ALL_FIELDS, ARCH_BY_NAME, BY_NAME, ARCH_FIELDS, ARCH_GROUPS, DEFAULT_MODEL, GROUPS, ModelChoice,
                     arch_editor_values, canonical_arch, config_dict, config_key, error_group, friendly_message,
                     parse_url, ui_values_from_config, url_params)

SOURCES = ("Preset", "HF Hub", "Custom")
_SOURCE_OF = {"preset": "Preset", "hub": "HF Hub", "custom": "Custom"}
GiB = 1024**3


@dataclass
class Current:
    """The configuration of this run, as every page sees it."""

    model: ModelChoice
    values: dict[str, Any]
    config: dict  # the contract's JSON (model = preset id or canonical architecture)
    config_json: str
    params: dict[str, str]  # the shareable URL's parameters
    model_error: ConfigError | None = None
    hub_info: dict | None = None
    messages: list[str] = field(default_factory=list)

    @property
    def model_label(self) -> str:
        if self.model.source == "preset":
            return self.model.preset
        if self.model.source == "hub":
            return self.model.hub_id
        return "custom architecture"


def current() -> Current:
    """This run's configuration; every page starts with it.

    A page can run without `app.py` around it: Streamlit (1.67) treats an app with a ``pages/``
    folder as a v1 multipage app until the first ``st.navigation`` call of the process sets
    ``PagesManager.uses_pages_directory = False``, so the first request of a fresh server for a
    deep link (``/roofline``), and every AppTest rerun (AppTest resets that flag), run the page
    script directly. Then this switches the process to ``st.navigation`` and reruns, which runs
    `app.py` and lands on the same page; if that is not possible the configuration is drawn here.
    """
    ss = st.session_state
    if not _drawn_this_run():
        try:
            from streamlit.runtime.pages_manager import PagesManager
            if PagesManager.uses_pages_directory:
                PagesManager.uses_pages_directory = False
                st.rerun()
        except ImportError:
            pass
        render_config()
    return ss["_current"]


def _run_token():
    """An object that is new for every script run (the run context's cursor map)."""
    from streamlit.runtime.scriptrunner_utils.script_run_context import get_script_run_ctx
    ctx = get_script_run_ctx()
    return getattr(ctx, "cursors", None)


def _drawn_this_run() -> bool:
    token = _run_token()
    return token is not None and st.session_state.get("_drawn_token") is token


def request_config(config: dict, source: str = "") -> None:
    """Load `config` (the contract's JSON) into the shared configuration on the next run."""
    st.session_state["_pending"] = (config, source)


def load_and_open(config: dict, source: str, page: str | None = "pages/memory.py") -> None:
    """A button callback (``on_click``): load `config` and open `page` (None: stay).

    Callbacks run before the script, so the next run applies the config before any widget exists
    and then switches page."""
    request_config(config, source)
    if page:
        st.session_state["_goto"] = page


# --- session start: the link ----------------------------------------------------------------------

def _presets() -> list:
    try:
        from estimator.presets import list_presets
        return list_presets()
    except Exception:  # the presets package is being written by others
        return []


def _preset_ids() -> list[str]:
    ids = [p.id for p in _presets()]
    return ids or [DEFAULT_MODEL]


def hub_count_note(hub_info: dict) -> str:
    """The computed parameter count beside the one the checkpoint stores."""
    note = f"Using **{hub_info['repo_id']}**: {hub_info['computed_total']:,} parameters computed"
    if hub_info.get("stored_count"):
        note += f", {hub_info['stored_count']:,} stored in its safetensors"
    elif hub_info.get("count_note"):
        note += f" (stored count unknown: {hub_info['count_note']})"
    return note


def hub_mismatch_warning(hub_info: dict) -> str:
    stored, computed = hub_info["stored_count"], hub_info["computed_total"]
    text = (f"The checkpoint stores {stored:,} parameters, the architecture gives {computed:,} "
            f"({(computed - stored) / stored:+.2%}).")
    return text + (f" {hub_info['count_note']}." if hub_info.get("count_note") else
                   " The memory estimate uses the architecture's count.")


def _set_model(choice: ModelChoice, hub_info: dict | None = None) -> None:
    ss = st.session_state
    ss["_src"] = _SOURCE_OF[choice.source]
    if choice.source == "preset":
        ss["_preset"] = choice.preset
    elif choice.source == "hub":
        ss["_hub_text"] = choice.hub_id
        ss["_hub_model"] = hub_info
    arch = choice.arch if choice.source == "custom" else None
    if arch is not None:
        _set_arch_editor(arch)


def _set_arch_editor(arch: dict) -> None:
    for name, value in arch_editor_values(arch).items():
        st.session_state[f"arch_{name}"] = value
    st.session_state["_arch_ready"] = True


def _fetch(hub_id: str) -> tuple[dict | None, str]:
    try:
        info = compute.fetch_hub_model(hub_id)
    except ImportError:
        return None, "Fetching from the Hugging Face Hub is not available in this build (estimator.hub is missing)."
    except ConfigError as exc:
        return None, str(exc.reason or exc)
    except Exception as exc:  # never a traceback
        return None, f"could not fetch {hub_id} ({type(exc).__name__})"
    return info, ""


def _init_session() -> None:
    ss = st.session_state
    ss["_init"] = True
    ss.setdefault("_scenarios", [])
    ss.setdefault("_user_presets", [])
    params = {k: (st.query_params.get_all(k) if k in BY_NAME and BY_NAME[k].kind == "multi" else st.query_params.get(k))
              for k in st.query_params}
    parsed = parse_url(params)
    warnings = list(parsed.warnings)
    model = parsed.model
    if parsed.hub_id:
        info, error = _fetch(parsed.hub_id)
        if info:
            model = ModelChoice(source="hub", hub_id=parsed.hub_id, arch=info["arch"])
            _set_model(model, info)
        else:
            warnings.append(f"The model '{parsed.hub_id}' in the link could not be loaded: {error}. "
                            f"Showing the default model, {DEFAULT_MODEL}.")
            parsed.bad.append("model")
            model = None
    if model is None:
        model = ModelChoice(source="preset", preset=DEFAULT_MODEL if DEFAULT_MODEL in _preset_ids()
                            else _preset_ids()[0])
    if model.source != "hub":
        _set_model(model)
    for name in set(parsed.bad):
        if name in st.query_params:
            del st.query_params[name]
    for name, value in parsed.values.items():
        ss[name] = value
    ss["_url_warnings"] = warnings


def _apply_pending() -> None:
    ss = st.session_state
    pending = ss.pop("_pending", None)
    if not pending:
        return
    config, source = pending
    try:
        if not isinstance(config, dict) or "model" not in config:
            raise ConfigError("config", type(config).__name__, "a JSON object with a model", "no model given")
        values = ui_values_from_config(config)
        model, info = _model_from_config(config["model"])
    except ConfigError as exc:
        ss["_flash"] = ("error", f"Could not load {source or 'the configuration'}: {friendly_message(exc)}")
        return
    _set_model(model, info)
    for name, value in values.items():
        ss[name] = value
    ss["_flash"] = ("success", f"Loaded {source or 'the configuration'}.")


def _model_from_config(model: object) -> tuple[ModelChoice, dict | None]:
    if isinstance(model, str):
        if "/" in model:
            info, error = _fetch(model)
            if not info:
                raise ConfigError("model", model, "a Hugging Face model that can be fetched", error)
            return ModelChoice(source="hub", hub_id=model, arch=info["arch"]), info
        if model not in _preset_ids():
            raise ConfigError("model", model, ", ".join(_preset_ids()), "not a bundled preset")
        return ModelChoice(source="preset", preset=model), None
    if isinstance(model, dict):
        if "model_type" in model or "text_config" in model:
            from estimator.config import architecture_to_dict
            from estimator.hf_config import architecture_from_hf_config
            arch = architecture_to_dict(architecture_from_hf_config(model)[0])
        else:
            arch = canonical_arch(model)
        return ModelChoice(source="custom", arch=arch), None
    raise ConfigError("model", model, "a preset id, a Hugging Face id or an architecture object")


# --- widgets ----------------------------------------------------------------------------------------

def _widget(f, key: str, bind: bool) -> None:
    kw: dict[str, Any] = {"key": key, "help": f.help}
    if bind:
        kw["bind"] = "query-params"
    else:
        kw["persist_state"] = "session"
    if f.kind == "select":
        st.selectbox(f.label, f.options, index=f.options.index(f.default) if f.default in f.options else 0, **kw)
    elif f.kind == "multi":
        st.multiselect(f.label, f.options, default=f.default, **kw)
    elif f.kind == "bool":
        st.toggle(f.label, value=bool(f.default), **kw)
    elif f.kind == "int":
        st.number_input(f.label, min_value=None if f.min is None else int(f.min),
                        max_value=None if f.max is None else int(f.max), value=f.default,
                        step=int(f.step or 1), placeholder="auto" if f.optional else None, **kw)
    elif f.kind == "float":
        st.number_input(f.label, min_value=f.min, max_value=f.max, value=f.default, step=f.step or 0.1,
                        placeholder="auto" if f.optional else None, **kw)
    else:
        st.text_input(f.label, value=f.default or "", **kw)


def _on_source_change() -> None:
    ss = st.session_state
    if ss.get("_src") != "Custom":
        return
    # start the editor from the model chosen before
    prev = ss.get("_prev_src", "Preset")
    try:
        if prev == "HF Hub" and ss.get("_hub_model"):
            arch = ss["_hub_model"]["arch"]
        else:
            from estimator.config import architecture_to_dict
            from estimator.presets import get_architecture
            arch = architecture_to_dict(get_architecture(ss.get("_preset", DEFAULT_MODEL)))
        _set_arch_editor(arch)
    except Exception:
        pass


def _on_fetch() -> None:
    ss = st.session_state
    hub_id = (ss.get("_hub_text") or "").strip()
    if not hub_id:
        ss["_hub_status"] = ("error", "Enter a model id such as meta-llama/Llama-3.1-8B.")
        return
    info, error = _fetch(hub_id)
    if info:
        ss["_hub_model"] = info
        ss["_hub_status"] = ("success", f"Fetched {info['repo_id']}.")
    else:
        ss["_hub_status"] = ("error", error)


def _on_import() -> None:
    ss = st.session_state
    upload = ss.get("_import_file")
    if upload is None:
        return
    try:
        data = json.loads(upload.getvalue().decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        ss["_flash"] = ("error", f"{upload.name} is not valid JSON ({exc}).")
        return
    request_config(data, upload.name)


def _on_reset() -> None:
    request_config({"model": DEFAULT_MODEL if DEFAULT_MODEL in _preset_ids() else _preset_ids()[0]},
                   "the defaults")


def _preset_label(pid: str) -> str:
    names = {p.id: p.name for p in _presets()}
    return names.get(pid, pid)


def _model_section(error_slot) -> tuple[ModelChoice, ConfigError | None, dict | None]:
    ss = st.session_state
    ss["_prev_src"] = ss.get("_src", "Preset")
    st.segmented_control("Model source", SOURCES, key="_src", persist_state="session", on_change=_on_source_change,
                         help="A bundled preset, any model on the Hugging Face Hub (its config.json is fetched), "
                              "or your own architecture.")
    src = ss.get("_src") or "Preset"
    error: ConfigError | None = None
    hub_info = None
    if src == "Preset":
        ids = _preset_ids()
        if ss.get("_preset") not in ids:
            ss["_preset"] = ids[0]
        st.selectbox("Model", ids, key="_preset", format_func=_preset_label, persist_state="session",
                     help="Bundled models with their published configs; see the Presets page for details.")
        model = ModelChoice(source="preset", preset=ss["_preset"])
    elif src == "HF Hub":
        cols = st.columns([3, 1], vertical_alignment="bottom")
        cols[0].text_input("Hugging Face model id", key="_hub_text", placeholder="org/name[@revision]",
                           persist_state="session",
                           help="Fetches the model's config.json from the Hub (gated models need HF_TOKEN on the "
                                "server).")
        cols[1].button("Fetch", key="_hub_fetch", on_click=_on_fetch, width="stretch")
        status = ss.get("_hub_status")
        if status:
            (st.success if status[0] == "success" else st.error)(status[1])
        hub_info = ss.get("_hub_model")
        if hub_info:
            model = ModelChoice(source="hub", hub_id=hub_info["repo_id"], arch=hub_info["arch"])
            st.caption(hub_count_note(hub_info))
            if hub_info.get("mismatch"):
                st.warning(hub_mismatch_warning(hub_info), icon=":material/error:")
            if hub_info.get("ignored"):
                st.caption("Not modelled from its config: " + ", ".join(hub_info["ignored"]))
        else:
            error = ConfigError("model", ss.get("_hub_text") or "", "a fetched Hugging Face model",
                                "no model fetched yet: enter an id and press Fetch")
            model = ModelChoice(source="preset", preset=ss.get("_preset") or DEFAULT_MODEL)
    else:
        if not ss.get("_arch_ready"):
            _on_source_change()
        with st.expander("Architecture", expanded=True):
            for group in ARCH_GROUPS:
                st.markdown(f"**{group}**")
                for f in ARCH_FIELDS:
                    if f.group == group:
                        _widget(f, f"arch_{f.name}", bind=False)
        values = {f.name: ss.get(f"arch_{f.name}") for f in ARCH_FIELDS}
        values = {k: v for k, v in values.items() if v is not None and v != ""}
        try:
            arch = canonical_arch(values)
        except ConfigError as exc:
            error, arch = exc, {}
        model = ModelChoice(source="custom", arch=arch)
    return model, error, hub_info


def _sync_model_url(model: ModelChoice) -> None:
    """Write the model's parameters to the URL (they are not a bound widget)."""
    wanted = model.url_params()
    for name in list(st.query_params):
        if (name in ARCH_BY_NAME) and name not in wanted:
            del st.query_params[name]
    for name, text in wanted.items():
        if st.query_params.get(name) != text:
            st.query_params[name] = text


def share_url(params: dict[str, str]) -> str:
    try:
        base = st.context.url or ""
    except Exception:
        base = ""
    return f"{base}?{urlencode(params, doseq=True)}"


def render_config(sidebar: bool = True) -> Current:
    """Draw the shared configuration's widgets and compute this run's `Current`."""
    ss = st.session_state
    if not ss.get("_init"):
        _init_session()
    _apply_pending()
    goto = ss.pop("_goto", None)
    if goto:
        # bound parameters follow their widgets; the others (the model) are passed on here
        keep = {k: st.query_params.get(k) for k in st.query_params if k not in BY_NAME}
        st.switch_page(goto, query_params=keep)
    container = st.sidebar if sidebar else st.container()
    slots: dict[str, Any] = {}
    with container:
        st.markdown("### Configuration")
        share_slot = st.empty()
        for text in ss.get("_url_warnings", []):
            st.warning(text, icon=":material/link_off:")
        if ss.get("_url_warnings"):
            st.button("Dismiss link warnings", key="_dismiss_warnings",
                      on_click=lambda: ss.__setitem__("_url_warnings", []))
        flash = ss.pop("_flash", None)
        if flash:
            (st.success if flash[0] == "success" else st.error)(flash[1])
        st.markdown("#### Model")
        slots["Model"] = st.empty()
        model, model_error, hub_info = _model_section(slots["Model"])
        for group in GROUPS:
            with st.expander(group, expanded=group in ("Run", "Parallel layout", "GPU")):
                slots[group] = st.empty()
                for f in ALL_FIELDS:
                    if f.group == group:
                        _widget(f, f.name, bind=True)
                if group == "GPU":
                    gpu = GPUS.get(ss.get("gpu"))
                    if gpu:
                        st.caption(f"{gpu.name}: {gpu.capacity_bytes / GiB:.1f} GiB")
        with st.popover("Import / reset", width="stretch"):
            st.file_uploader("Import a configuration (JSON)", type=["json"], key="_import_file",
                             on_change=_on_import,
                             help="A file exported from this app or written for `python -m estimator estimate "
                                  "--config`.")
            st.button("Reset to defaults", key="_reset", on_click=_on_reset)

    values = {f.name: ss.get(f.name, f.default) for f in ALL_FIELDS}
    config = config_dict(model, values)
    cur = Current(model=model, values=values, config=config, config_json=config_key(config),
                  params=url_params(model, values), model_error=model_error, hub_info=hub_info)
    ss["_current"] = cur
    ss["_drawn_token"] = _run_token()
    _sync_model_url(model)

    # the estimator's verdict on the inputs, next to the group it concerns
    error = model_error
    if error is None:
        result = compute.estimate(cur.config_json)
        error = result.error
    if error is not None:
        group = error_group(error)
        slot = slots.get(group) or slots["Model"]
        slot.error(friendly_message(error), icon=":material/error:")
    with share_slot.container():
        with st.popover("Share this configuration", icon=":material/share:", width="stretch"):
            st.caption("This link opens the same configuration on any page:")
            st.code(share_url(cur.params), language=None, wrap_lines=True)
    return cur


def show_error(error: ConfigError) -> None:
    """The message a page shows instead of its results when the configuration is not usable."""
    st.error(f"**This configuration cannot be estimated.** {friendly_message(error)}  \n"
             "Change the setting in the sidebar (the message is also shown next to it).", icon=":material/error:")
