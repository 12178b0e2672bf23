"""The one configuration every page shares: its widgets (in the sidebar), its URL and its state.

`app.py` calls `render_config()` after ``st.navigation(...)`` and before ``pg.run()``: widgets
created there keep their identity across page switches (Streamlit 1.67; see shared/research).

Pages read `current()` and never touch widget keys. To load a whole configuration (a preset, a
recipe, a scenario, an imported file) a page calls `request_config(config)` and reruns; the next
run applies it before any widget exists, which is the only moment Streamlit allows it.

Session-state keys are named in `ui.keys`.

The settings live in one dict in the session (`K.VALUES`), not in their widgets. The sidebar's
groups are expanders that draw their widgets only while open (``on_change="rerun"`` and
``.open``): every keyed widget makes each number input and select box of the run walk the whole
session state (``SessionState.filtered_state``), so the collapsed groups' 30-odd widgets cost a
Memory page rerun about 30% of its time (bench/bench_app.py). A widget that is drawn starts from
the dict's value (as its default, so no Session State write is needed) and writes its value back;
a collapsed group's settings stay in the dict, in the configuration and in the URL.

The URL is written here, from the configuration, on every run (`_sync_url`: the model, then every
setting that differs from its default, the share link's parameters in the share link's order);
no widget is bound to it (``bind="query-params"``: a bound widget that is not drawn in a run
loses its parameter and its value). So the link a session starts from is read once, here
(`_init_session`): every parameter is checked (`_screen`, `ui.fields.parse_url`, `_guard`), a
rejected one reported and left out, and the first run's `_sync_url` writes back only what was
accepted, in its canonical text. No widget ever parses the URL.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlencode

import streamlit as st

from estimator import ConfigError
from estimator.spec.gpus import GPUS

from . import compute, keys as K
from .fields import (SWITCHES, ALL_FIELDS, ARCH_BY_NAME, BY_NAME, ARCH_FIELDS, ARCH_GROUPS, DEFAULT_MODEL, GROUPS, ModelChoice,
                     arch_editor_values, canonical_arch, config_dict, config_key, error_group, field_label,
                     friendly_message, parse_url, to_contract, ui_values_from_config, url_params, url_text)

from estimator.spec import values as registry_values
from estimator.spec.errors import shown_value

SOURCES = ("Preset", "HF Hub", "Custom")
_SOURCE_OF = {"preset": "Preset", "hub": "HF Hub", "custom": "Custom"}
GiB = 1024**3
OPEN_AT_START = ("Run", "Parallel layout", "GPU")  # the sidebar groups open when a session starts

# The pages, in the order of the navigation. `app.py` builds `st.navigation` from them.
PAGES = (
    ("pages/memory.py", "Memory", ":material/memory:",
     "Will it fit? Totals, memory per pipeline stage, breakdown, fit on every GPU"),
    ("pages/roofline.py", "Roofline", ":material/speed:", "Per-operation roofline and step time"),
    ("pages/serving.py", "Serving", ":material/dns:",
     "Serving on vLLM or SGLang: concurrent sequences, KV cache, the longest context, GPUs for N users"),
    ("pages/planner.py", "Planner", ":material/account_tree:",
     "Every parallel layout on N GPUs: which fit, which are fastest, the memory/throughput front"),
    ("pages/compare.py", "Compare", ":material/compare_arrows:", "Up to six scenarios side by side"),
    ("pages/presets.py", "Presets", ":material/list:", "Bundled models, training recipes and your own presets"),
    ("pages/guide.py", "How to read this", ":material/menu_book:",
     "What each number means, and ready answers for common serving setups"),
)

HUB_HINT = "Enter a model id such as meta-llama/Llama-3.1-8B and press **Fetch**."
HUB_WAITING = ("No Hugging Face model loaded yet: enter a model id in the sidebar (for example "
               "Qwen/Qwen3-8B) and press **Fetch**, or choose a bundled preset.")

# What a link may carry at most: longer names and values are reported and dropped unread.
MAX_PARAM_NAME = 64
MAX_PARAM_VALUE = 256
MAX_PARAM_ITEMS = 32


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
    waiting: str = ""  # no model yet (HF Hub before a fetch): what to do, in words
    error: ConfigError | None = None  # why this configuration cannot be estimated
    error_text: str = ""  # that, in users' words, naming the field the user changed where it applies
    error_group: str = ""  # the sidebar group the message is shown in

    @property
    def model_label(self) -> str:
        if self.waiting:
            return "no model yet"
        if self.model.source == "preset":
            return self.model.preset
        if self.model.source == "hub":
            return self.model.hub_id
        return "custom architecture"

    @property
    def mode(self) -> str:
        return self.values.get("mode") or "training"


def app_pages() -> list:
    return [st.Page(path, title=title, icon=icon, help=help, default=i == 0)
            for i, (path, title, icon, help) in enumerate(PAGES)]


def current() -> Current:
    """This run's configuration; every page starts with it.

    A page script can run without `app.py` around it. Streamlit (1.67) treats an app with a
    ``pages/`` folder next to its entry point as a legacy multipage app until some session calls
    ``st.navigation`` ("As soon as any session of your app executes the st.navigation command,
    your app will ignore the pages/ directory (across all sessions)": the st.navigation docs).
    Until then a deep link (``/roofline``, the first request of a fresh server) runs the page
    script directly, and so does every AppTest rerun (AppTest forgets that any session called
    it). No configuration option changes this: ``client.showSidebarNavigation`` only hides the
    legacy menu, and nothing else turns the ``pages/`` folder off. So a page that finds the
    configuration undrawn calls ``st.navigation`` with the app's pages, that documented switch,
    and reruns; the rerun runs `app.py` and lands on the same page (a page's identity is its URL
    path, the same in both). Should the rerun not get there, the configuration is drawn here.
    """
    ss = st.session_state
    if not _drawn_this_run():
        if not ss.get(K.NAV_RERUN):
            ss[K.NAV_RERUN] = True
            st.navigation(app_pages(), position="hidden")
            st.rerun()
        render_config()
        ss[K.NAV_RERUN] = True  # drawn here: do not ask again until app.py has drawn it
    return ss[K.CURRENT]


def _run_token():
    """An object that is new for every script run (the run context's cursor map)."""
    from streamlit.runtime.scriptrunner_utils.script_run_context import get_script_run_ctx
    ctx = get_script_run_ctx()
    return getattr(ctx, "cursors", None)


def _drawn_this_run() -> bool:
    token = _run_token()
    return token is not None and st.session_state.get(K.DRAWN_TOKEN) is token


def request_config(config: dict, source: str = "") -> None:
    """Load `config` (the contract's JSON) into the shared configuration on the next run."""
    st.session_state[K.PENDING] = (config, source)


def load_and_open(config: dict, source: str, page: str | None = "pages/memory.py") -> None:
    """A button callback (``on_click``): load `config` and open `page` (None: stay).

    Callbacks run before the script, so the next run applies the config before any widget exists
    and then switches page."""
    request_config(config, source)
    if page:
        st.session_state[K.GOTO] = page


# --- messages -------------------------------------------------------------------------------------

_MARKDOWN = re.compile(r"([\\`*_\[\]<>$:~|#])")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]+")


_AUTOLINK = re.compile(r"(://|www\.|@)", re.IGNORECASE)
_JOINER = "\u2060"  # WORD JOINER: invisible, and no autolink pattern matches across it


def plain(text: str) -> str:
    """`text` shown literally by a markdown element (a warning, a caption): a link's values are
    user input and must not become links, images, colours or formulas. Markdown syntax is
    backslash-escaped; GFM's bare-URL and e-mail autolinks are found in the parsed text, after
    escapes are resolved, so an invisible word joiner breaks their patterns instead."""
    text = _AUTOLINK.sub(lambda m: m.group(0)[:1] + _JOINER + m.group(0)[1:], _CONTROL.sub(" ", text))
    return _MARKDOWN.sub(r"\\\1", text)


def _shown_default(f) -> str:
    return "empty" if f.default is None else str(f.default)


# --- session start: the link ----------------------------------------------------------------------

def _presets() -> list:
    try:
        from estimator.models.presets import list_presets
        return list_presets()
    except Exception:  # the presets package is being written by others
        return []


def _preset_ids() -> list[str]:
    ids = [p.id for p in _presets()]
    return ids or [DEFAULT_MODEL]


def _default_model() -> str:
    ids = _preset_ids()
    return DEFAULT_MODEL if DEFAULT_MODEL in ids else ids[0]


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
    ss[K.SOURCE] = _SOURCE_OF[choice.source]
    if choice.source == "preset":
        ss[K.PRESET] = choice.preset
    elif choice.source == "hub":
        ss[K.HUB_TEXT] = choice.hub_id
        ss[K.HUB_MODEL] = hub_info
        ss.pop(K.HUB_STATUS, None)
    arch = choice.arch if choice.source == "custom" else None
    if arch is not None:
        _set_arch_editor(arch)


def _set_arch_editor(arch: dict) -> None:
    for name, value in arch_editor_values(arch).items():
        st.session_state[K.arch(name)] = value
    st.session_state[K.ARCH_READY] = True


def _fetch(hub_id: str) -> tuple[dict | None, str]:
    try:
        info = compute.fetch_hub_model(hub_id)
    except ImportError:
        return None, "fetching from the Hugging Face Hub is not available in this build (estimator.hub is missing)"
    except ConfigError as exc:
        return None, str(exc.reason or exc)
    except Exception as exc:  # never a traceback
        return None, f"the Hub could not be read ({type(exc).__name__})"
    return info, ""


def value_problem(f, value: Any) -> str | None:
    """What is wrong with widget value `value` for field `f`, as "expected ..." words, or None:
    the field registry's own check (estimator/spec/values.py: type, finite, range, options) on the
    value the estimator would receive, before the value reaches a widget or the estimator."""
    if value is None:
        return None if f.optional or f.kind in ("select", "text") else "a value"
    try:
        contract = to_contract(f, value)
        if contract is None and f.name in SWITCHES:  # "none": no adapter (no RL) object at all
            return None
        registry_values.check(f.spec, contract)
    except ConfigError as exc:
        return exc.allowed
    except (TypeError, ValueError, OverflowError):  # not even of the widget's type
        return f.spec.allowed()
    return None


def _canonical_text(f, value: Any) -> str | list[str]:
    """The URL text of a widget value in the address bar: what a widget bound to the URL wrote
    there (a float with an integer value without its ``.0``)."""
    if f.kind == "float" and isinstance(value, float) and value.is_integer():
        return str(int(value))
    if f.kind == "float":
        return repr(float(value))
    if f.kind == "select":
        return str(value)
    return url_text(to_contract(f, value))


def _raw_params() -> dict[str, str | list[str]]:
    qp = st.query_params
    out: dict[str, str | list[str]] = {}
    for name in qp:
        f = BY_NAME.get(name)
        values = qp.get_all(name)
        out[name] = values if f is not None and f.kind == "multi" else (values[-1] if values else "")
    return out


def _screen(raw: dict) -> tuple[dict, list[str], list[str]]:
    """Drop names and values too long to be anything but garbage, before anything parses them."""
    kept, warnings, bad = {}, [], []
    for name, text in raw.items():
        items = text if isinstance(text, list) else [text]
        if len(name) > MAX_PARAM_NAME:
            warnings.append(f"An unknown link parameter (a name of {len(name):,} characters) was ignored.")
            bad.append(name)
            continue
        longest = max((len(t) for t in items), default=0)
        if longest > MAX_PARAM_VALUE or len(items) > MAX_PARAM_ITEMS:
            label = field_label(name) if (name in BY_NAME or name in ARCH_BY_NAME or name == "model") else None
            size = f"{longest:,} characters" if longest > MAX_PARAM_VALUE else f"{len(items)} values"
            if label:
                what = (f"showing the default model, {_default_model()}" if name == "model"
                        else f"using the default, {_shown_default(BY_NAME[name])}" if name in BY_NAME else "ignored")
                warnings.append(f"Link parameter {name} is too long for {label} ({size}); {what}.")
            else:
                warnings.append(f"Unknown link parameter {shown_value(name)} was ignored.")
            bad.append(name)
            continue
        kept[name] = text
    return kept, warnings, bad


def _guard(values: dict) -> tuple[dict, list[str], list[str]]:
    kept, warnings, bad = {}, [], []
    for name, value in values.items():
        f = BY_NAME.get(name)
        problem = value_problem(f, value) if f is not None else "a field of the app"
        if problem:
            warnings.append(f"Link parameter {name}={shown_value(value)} is not valid for {field_label(name)} "
                            f"(expected {problem}); using the default, {_shown_default(f) if f else 'none'}.")
            bad.append(name)
        else:
            kept[name] = value
    return kept, warnings, bad


def _init_session() -> None:
    """Read the link the session starts from into the settings; what was wrong with it becomes
    warnings, and a rejected parameter stays out of the URL (`_sync_url` writes what was kept)."""
    ss = st.session_state
    ss[K.INIT] = True
    ss.setdefault(K.SCENARIOS, [])
    ss.setdefault(K.USER_PRESETS, [])
    params, warnings, _ = _screen(_raw_params())
    try:
        parsed = parse_url(params)
    except Exception as exc:  # the parser is the field registry's: a bug there is one warning, never a traceback
        parsed = None
        warnings.append(f"The link could not be read ({type(exc).__name__}); showing the defaults.")
    model, values = None, {}
    if parsed is not None:
        warnings += parsed.warnings
        values, more, _ = _guard(parsed.values)
        warnings += more
        model = parsed.model
        if parsed.hub_id:
            with st.spinner(f"Fetching {plain(shown_value(parsed.hub_id))} from the Hugging Face Hub..."):
                info, error = _fetch(parsed.hub_id)
            if info:
                model = ModelChoice(source="hub", hub_id=parsed.hub_id, arch=info["arch"])
                _set_model(model, info)
            else:
                warnings.append(f"Link parameter model={shown_value(parsed.hub_id)} (Model): the Hugging Face model "
                                f"could not be loaded: {error}. Showing the default model, {_default_model()}.")
                model = None
    if model is None:
        model = ModelChoice(source="preset", preset=_default_model())
    if model.source != "hub":
        _set_model(model)
    _settings().update(values)
    ss[K.URL_WARNINGS] = warnings


def _apply_pending() -> set[str]:
    """Load the configuration a page asked for; the names of the settings it changed."""
    ss = st.session_state
    pending = ss.pop(K.PENDING, None)
    if not pending:
        return set()
    config, source = pending
    try:
        if not isinstance(config, dict) or "model" not in config:
            raise ConfigError("config", type(config).__name__, "a JSON object with a model", "no model given")
        values = ui_values_from_config(config)
        for name, value in values.items():
            problem = value_problem(BY_NAME[name], value)
            if problem:
                raise ConfigError(BY_NAME[name].spec.path, value, problem)
        model, info = _model_from_config(config["model"])
    except ConfigError as exc:
        ss[K.FLASH] = ("error", f"Could not load {source or 'the configuration'}: {friendly_message(exc)}")
        return set()
    except Exception as exc:  # never a traceback
        ss[K.FLASH] = ("error", f"Could not load {source or 'the configuration'} ({type(exc).__name__}).")
        return set()
    _set_model(model, info)
    _settings().update(values)
    ss.pop(K.LAST_CHANGED, None)
    ss[K.FLASH] = ("success", f"Loaded {source or 'the configuration'}.")
    ss[K.LOADS] = ss.get(K.LOADS, 0) + 1
    ss[K.LAST_LOAD] = (model, info, set(values))
    return set(values)  # every field (a widget the user just edited must take the loaded value too)


def _undo_stale_widgets() -> set[str]:
    """Set the last loaded configuration again when this run's widget values come from a browser
    that had not seen it; the names of the settings it sets (as `_apply_pending`'s).

    A load writes the widgets' values through Session State and they reach the browser with the
    widgets the next run draws. A click sent before they arrived (a page link pressed within a
    second of "Use this recipe") carries every widget's value from before the load, and Streamlit
    takes a browser's widget values over the session's: the page showed the old model with the
    recipe's other settings, and an error about them. The hidden widget `K.LOAD_SEEN` says which
    load the browser had seen; a run whose browser is behind gets the loaded configuration back."""
    ss = st.session_state
    record = ss.get(K.LAST_LOAD)
    if record is None or ss.get(K.LOAD_SEEN, 0) == ss.get(K.LOADS, 0):
        return set()
    model, info, names = record
    _set_model(model, info)
    ss.pop(K.LAST_CHANGED, None)  # the stale values' on_change is no change of the user's
    return set(names)


def _load_marker() -> None:
    """The hidden widget that tells `_undo_stale_widgets` which load the browser has seen: its value
    is set on every run and reaches the browser after every configuration widget of the run (the
    browser applies a run's messages in order), so a browser that sends it back has them all."""
    ss = st.session_state
    ss[K.LOAD_SEEN] = ss.get(K.LOADS, 0)
    st.html(f"<style>.st-key-{K.LOAD_SEEN_BOX} {{display: none}}</style>")
    with st.container(key=K.LOAD_SEEN_BOX):
        st.number_input("Configurations loaded", min_value=0, step=1, key=K.LOAD_SEEN, label_visibility="collapsed")


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
            from estimator.spec.config import architecture_to_dict
            from estimator.models.hf_config import architecture_from_hf_config
            arch = architecture_to_dict(architecture_from_hf_config(model)[0])
        else:
            arch = canonical_arch(model)
        return ModelChoice(source="custom", arch=arch), None
    raise ConfigError("model", model, "a preset id, a Hugging Face id or an architecture object")


# --- widgets ----------------------------------------------------------------------------------------

def _mark_changed(key: str) -> None:
    """on_change of every configuration widget: remember which one the user changed last."""
    st.session_state[K.LAST_CHANGED] = key


def _settings() -> dict[str, Any]:
    """The configuration's settings, {field name: widget value} for every field, drawn or not: the
    session's record, which the drawn widgets write back to on every run."""
    ss = st.session_state
    settings = ss.get(K.VALUES)
    if settings is None:
        settings = ss[K.VALUES] = {f.name: f.default for f in ALL_FIELDS}
    return settings


def _switched_off(f, settings: dict[str, Any], loaded: set[str]) -> bool:
    """An adapter's (an RL run's) fields while its switch says none, and the sequence length while an
    RL run trains on prompt + response: not part of the configuration, so not drawn."""
    def on(switch: str) -> bool:
        # the switch's widget, where it is drawn, may hold a change of this run; a load overrides it
        value = None if switch in loaded else st.session_state.get(switch)
        if value is None:
            value = settings.get(switch, SWITCHES[switch][1])
        return value != SWITCHES[switch][1]
    if f.name == "seq_len":
        return on("rl_algorithm")
    switch = next((key for key, (section, _) in SWITCHES.items() if section == f.section), None)
    return switch is not None and switch != f.name and not on(switch)


def _widget(f, key: str, value: Any = None, *, arch: bool = False, loaded: bool = False) -> Any:
    """Draw field `f`'s widget; its value.

    A setting's widget starts from `value` (the settings' record), given as its default: a widget
    drawn again after its group was closed shows the setting without a Session State write.
    `loaded`: a loaded configuration has just set the value through Session State, so the widget is
    given no default (Streamlit warns about a widget given both). The architecture editor's widgets
    (`arch`) keep their own values (``persist_state``) and start from the field's default."""
    kw: dict[str, Any] = {"key": key, "help": f.help, "on_change": _mark_changed, "args": (key,)}
    if arch:
        kw["persist_state"] = "session"
        value = f.default
    if f.kind == "select":
        index = 0 if loaded or value not in f.options else f.options.index(value)
        return st.selectbox(f.label, f.options, index=index, **kw)
    if f.kind == "multi":
        return st.multiselect(f.label, f.options, default=None if loaded else value, **kw)
    if f.kind == "bool":
        return st.toggle(f.label, value=False if loaded else bool(value), **kw)
    if f.kind == "int":
        return st.number_input(f.label, min_value=None if f.min is None else int(f.min),
                               max_value=None if f.max is None else int(f.max), value="min" if loaded else value,
                               step=int(f.step or 1), placeholder="auto" if f.optional else None, **kw)
    if f.kind == "float":
        return st.number_input(f.label, min_value=f.min, max_value=f.max, value="min" if loaded else value,
                               step=f.step or 0.1, placeholder="auto" if f.optional else None, **kw)
    return st.text_input(f.label, value="" if loaded else value or "", max_chars=MAX_PARAM_VALUE, **kw)


def _group(group: str, settings: dict[str, Any], loaded: set[str]) -> None:
    """The widgets of one sidebar group, in its open expander; each writes its value to `settings`.
    A setting a configuration loaded in this run (`loaded`) is set through Session State: its widget
    may exist in the browser already, showing the value before, and that is the only way to change
    it."""
    ss = st.session_state
    for f in ALL_FIELDS:
        # an adapter's (an RL run's) fields appear once its switch is on: fewer widgets per
        # rerun, and nothing shown that the configuration would not use
        if f.group != group or _switched_off(f, settings, loaded):
            continue
        if f.name in loaded:
            ss[f.name] = settings[f.name]  # the widget may exist already, showing the value before
        settings[f.name] = _widget(f, f.name, settings[f.name], loaded=f.name in loaded)
    if group == "GPU":
        gpu = GPUS.get(settings.get("gpu"))
        if gpu:
            st.caption(f"{gpu.name}: {gpu.capacity_bytes / GiB:.1f} GiB")


def _on_source_change() -> None:
    ss = st.session_state
    if ss.get(K.SOURCE) != "Custom":
        return
    # start the editor from the model chosen before
    prev = ss.get(K.PREV_SOURCE, "Preset")
    try:
        if prev == "HF Hub" and ss.get(K.HUB_MODEL):
            arch = ss[K.HUB_MODEL]["arch"]
        else:
            from estimator.spec.config import architecture_to_dict
            from estimator.models.presets import get_architecture
            arch = architecture_to_dict(get_architecture(ss.get(K.PRESET, DEFAULT_MODEL)))
        _set_arch_editor(arch)
    except Exception:
        pass


def _on_fetch() -> None:
    """The Fetch button: fetch the typed id in this run's body (where the spinner shows)."""
    ss = st.session_state
    hub_id = (ss.get(K.HUB_TEXT) or "").strip()
    if hub_id:
        ss[K.HUB_REQUEST] = hub_id
    else:
        ss.pop(K.HUB_STATUS, None)  # nothing typed: back to the hint


def _on_import() -> None:
    ss = st.session_state
    upload = ss.get(K.IMPORT_FILE)
    if upload is None:
        return
    try:
        data = json.loads(upload.getvalue().decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        ss[K.FLASH] = ("error", f"{upload.name} is not valid JSON ({exc}).")
        return
    request_config(data, upload.name)


def _on_reset() -> None:
    request_config({"model": _default_model()}, "the defaults")


def _on_dismiss() -> None:
    st.session_state[K.URL_WARNINGS] = []


def _waiting_text() -> str:
    """What the pages say while no Hub model is loaded: the hint, or after a failed fetch, that it
    failed (the sidebar says why)."""
    status = st.session_state.get(K.HUB_STATUS)
    if not status:
        return HUB_WAITING
    return (f"{plain(status)} No Hugging Face model is loaded: correct the id in the sidebar and press **Fetch**, "
            "or choose a bundled preset.")


def _hub_section() -> tuple[ModelChoice | None, dict | None]:
    """The HF Hub source, one state at a time: nothing fetched yet (a hint), fetching (a spinner),
    fetched (the model), or why the last fetch failed (one message)."""
    ss = st.session_state
    # the id gets the sidebar's whole width (ids are long); the button its label's width, below it.
    # No max_chars: the browser empties a field given more (a pasted 5,000 characters) and says
    # nothing; taken whole, a Fetch says what an id may be (hub.parse_hub_id)
    st.text_input("Hugging Face model id", key=K.HUB_TEXT, placeholder="org/name[@revision]",
                  persist_state="session",
                  help="Fetches the model's config.json from the Hub (gated models need HF_TOKEN on the "
                       "server).")
    st.button("Fetch", key=K.HUB_FETCH, on_click=_on_fetch, width="content", icon=":material/download:",
              help="Read the model's config.json (and its parameter count) from the Hugging Face Hub.")
    request = ss.pop(K.HUB_REQUEST, None)
    if request:
        with st.spinner(f"Fetching {plain(shown_value(request))} from the Hugging Face Hub..."):
            info, why = _fetch(request)
        if info:
            ss[K.HUB_MODEL] = info
            ss.pop(K.HUB_STATUS, None)
        else:
            ss[K.HUB_STATUS] = f"Could not fetch {shown_value(request)}: {why}."
    hub_info = ss.get(K.HUB_MODEL)
    status = ss.get(K.HUB_STATUS)
    if status:
        still = f" Still using {hub_info['repo_id']}." if hub_info else ""
        st.error(plain(status) + still, icon=":material/cloud_off:")
    if not hub_info:
        if not status:
            st.caption(HUB_HINT)
        return None, None
    st.caption(hub_count_note(hub_info))
    if hub_info.get("mismatch"):
        st.warning(hub_mismatch_warning(hub_info), icon=":material/error:")
    if hub_info.get("ignored"):
        st.caption("Not modelled from its config: " + ", ".join(hub_info["ignored"]))
    return ModelChoice(source="hub", hub_id=hub_info["repo_id"], arch=hub_info["arch"]), hub_info


def _model_section() -> tuple[ModelChoice | None, ConfigError | None, dict | None]:
    """The model's widgets; the model is None while none is chosen yet (HF Hub before a fetch)."""
    ss = st.session_state
    ss[K.PREV_SOURCE] = ss.get(K.SOURCE, "Preset")
    # required: a click on the chosen source keeps it (it deselected every source)
    st.segmented_control("Model source", SOURCES, key=K.SOURCE, persist_state="session", on_change=_on_source_change,
                         required=True,
                         help="A bundled preset, any model on the Hugging Face Hub (its config.json is fetched), "
                              "or your own architecture.")
    src = ss.get(K.SOURCE) or "Preset"
    error: ConfigError | None = None
    hub_info = None
    if src == "Preset":
        names = {p.id: p.name for p in _presets()}  # once a run, not once an option
        ids = list(names) or [DEFAULT_MODEL]
        if ss.get(K.PRESET) not in ids:
            ss[K.PRESET] = ids[0]
        st.selectbox("Model", ids, key=K.PRESET, format_func=lambda pid: names.get(pid, pid), persist_state="session",
                     help="Bundled models with their published configs; see the Presets page for details.")
        model = ModelChoice(source="preset", preset=ss[K.PRESET])
    elif src == "HF Hub":
        model, hub_info = _hub_section()
    else:
        if not ss.get(K.ARCH_READY):
            _on_source_change()
        with st.expander("Architecture", expanded=True):
            for group in ARCH_GROUPS:
                st.markdown(f"**{group}**")
                for f in ARCH_FIELDS:
                    if f.group == group:
                        _widget(f, K.arch(f.name), arch=True)
        values = {f.name: ss.get(K.arch(f.name)) for f in ARCH_FIELDS}
        values = {k: v for k, v in values.items() if v is not None and v != ""}
        try:
            arch = canonical_arch(values)
        except ConfigError as exc:
            error, arch = exc, {}
        model = ModelChoice(source="custom", arch=arch)
    return model, error, hub_info


def _sync_url(params: dict[str, str | list[str]], values: dict[str, Any]) -> None:
    """Write the configuration's link parameters (`Current.params`: the model, then every setting
    that differs from its default, with no model while none is chosen) to the address bar, in the
    share link's order. A float setting is written as a widget bound to the URL wrote it, ``2`` for
    2.0 (its `_canonical_text`). One message, and only when the address bar differs."""
    query: dict[str, list[str]] = {}
    for name, text in params.items():
        f = BY_NAME.get(name)
        if f is not None and f.kind == "float":
            text = _canonical_text(f, values[name])
        texts = text if isinstance(text, list) else [text]
        if texts:  # an empty list is no parameter (as in the share link)
            query[name] = texts
    qp = st.query_params
    if [(name, qp.get_all(name)) for name in qp] != list(query.items()):
        qp.from_dict(query)


def share_url(params: dict[str, str]) -> str:
    try:
        base = st.context.url or ""
    except Exception:
        base = ""
    return f"{base}?{urlencode(params, doseq=True)}"


# --- which field an error is about ----------------------------------------------------------------

def _name_of(key: str | None) -> tuple[str, Any] | None:
    """(field name, field) of a configuration widget key."""
    if not key:
        return None
    if key.startswith(K.ARCH_PREFIX) and key[len(K.ARCH_PREFIX):] in ARCH_BY_NAME:
        name = key[len(K.ARCH_PREFIX):]
        return name, ARCH_BY_NAME[name]
    if key in BY_NAME:
        return key, BY_NAME[key]
    return None


def _blamed(error: ConfigError, config_json: str) -> tuple[str, str]:
    """The message for `error` and the sidebar group it goes to.

    A rule that ties several fields together (layers divisible by PP x VPP) is reported by the
    estimator against one of them; the user should read it against the one they just changed.
    That is the widget changed last, when the error's field or one of its `related` fields is
    that widget, or when the configuration could be estimated before that change. The blame is
    remembered with the configuration, so a page switch does not move the message."""
    ss = st.session_state
    field_name = (error.field or "").split(".")[-1]
    tied = {field_name} | {r.split(".")[-1] for r in (getattr(error, "related", ()) or ())}
    key = ss.get(K.LAST_CHANGED)
    changed = _name_of(key)
    if changed and changed[0] != field_name and (changed[0] in tied or ss.get(K.LAST_VALID)):
        ss[K.BLAME] = (config_json, key)
    remembered = ss.get(K.BLAME)
    if remembered and remembered[0] == config_json and _name_of(remembered[1]):
        key = remembered[1]
    else:
        key = key if changed and changed[0] in tied else None
    chosen = _name_of(key)
    if chosen is None or chosen[0] == field_name:
        return friendly_message(error), error_group(error)
    name, f = chosen
    value = _settings().get(key) if key in BY_NAME else ss.get(key)
    with_what = f"{field_label(error.field or '')} = {shown_value(error.value)}"
    reason = (error.reason or "").strip().rstrip(".")
    text = (f"{f.label} = {'empty' if value is None else shown_value(value)} is not possible with {with_what}"
            f"{': ' + reason if reason else ''}. Allowed: {error.allowed}.")
    return text, "Model" if f.section == "model" else f.group


def render_config(sidebar: bool = True) -> Current:
    """Draw the shared configuration's widgets and compute this run's `Current`."""
    ss = st.session_state
    if not ss.get(K.INIT):
        _init_session()
    loaded = _apply_pending() | ss.pop(K.LOADED, set()) | _undo_stale_widgets()
    goto = ss.pop(K.GOTO, None)
    if goto:
        ss[K.LOADED] = loaded  # set on the page the run switches to, where the widgets are drawn
        # the link goes along; the next run writes the loaded configuration's
        st.switch_page(goto, query_params={k: st.query_params.get_all(k) for k in st.query_params})
    container = st.sidebar if sidebar else st.container()
    slots: dict[str, Any] = {}
    with container:
        st.markdown("### Configuration")
        share_slot = st.empty()
        for text in ss.get(K.URL_WARNINGS, []):
            st.warning(plain(text), icon=":material/link_off:")
        if ss.get(K.URL_WARNINGS):
            st.button("Dismiss link warnings", key=K.DISMISS_WARNINGS, on_click=_on_dismiss)
        flash = ss.pop(K.FLASH, None)
        if flash:
            (st.success if flash[0] == "success" else st.error)(plain(flash[1]))
        st.markdown("#### Model")
        slots["Model"] = st.empty()
        model, model_error, hub_info = _model_section()
        settings = _settings()
        open_groups = ss.setdefault(K.OPEN_GROUPS, set(OPEN_AT_START))
        for group in GROUPS:
            # a closed group draws no widgets (opening or closing it reruns): its settings stay in
            # `settings`, so in the configuration and the URL
            key = K.group(group)
            if key not in ss and (group in open_groups) != (group in OPEN_AT_START):
                ss[key] = group in open_groups  # a page switch forgot the expander's state: as the user left it
            group_box = st.expander(group, expanded=group in OPEN_AT_START, key=key, on_change="rerun")
            (open_groups.add if group_box.open else open_groups.discard)(group)
            with group_box:
                slots[group] = st.empty()  # the group's error message, open or not
                if group_box.open:
                    _group(group, settings, loaded)
        with st.popover("Import / reset", width="stretch"):
            st.file_uploader("Import a configuration (JSON)", type=["json"], key=K.IMPORT_FILE,
                             on_change=_on_import,
                             help="A file exported from this app or written for `python -m estimator estimate "
                                  "--config`.")
            st.button("Reset to defaults", key=K.RESET, on_click=_on_reset)
        _load_marker()  # last: a browser that has its value has every configuration widget's drawn before it

    values = {f.name: settings.get(f.name, f.default) for f in ALL_FIELDS}
    waiting = _waiting_text() if model is None else ""
    shown_model = model or ModelChoice(source="preset", preset=ss.get(K.PRESET) or _default_model())
    config = config_dict(shown_model, values)
    params = url_params(shown_model, values)
    if waiting:
        params.pop("model", None)
    cur = Current(model=shown_model, values=values, config=config, config_json=config_key(config),
                  params=params, model_error=model_error, hub_info=hub_info, waiting=waiting)
    ss[K.CURRENT] = cur
    ss[K.DRAWN_TOKEN] = _run_token()
    ss[K.NAV_RERUN] = False
    _sync_url(cur.params, values)

    # the estimator's verdict on the inputs, next to the group it concerns
    error = None
    if not waiting:
        error = model_error
        if error is None:
            error = compute.estimate(cur.config_json).error
    if error is not None:
        cur.error = error
        cur.error_text, cur.error_group = _blamed(error, cur.config_json)
        slot = slots.get(cur.error_group) or slots["Model"]
        slot.error(plain(cur.error_text), icon=":material/error:")
    if not waiting:
        ss[K.LAST_VALID] = error is None
    with share_slot.container():
        with st.popover("Share this configuration", icon=":material/share:", width="stretch"):
            st.caption("This link opens the same configuration on any page:")
            st.code(share_url(cur.params), language=None, wrap_lines=True)
    return cur


def show_error(error: ConfigError) -> None:
    """The message a page shows instead of its results when the configuration is not usable."""
    cur = st.session_state.get(K.CURRENT)
    text = cur.error_text if cur is not None and cur.error is error and cur.error_text else friendly_message(error)
    st.error(f"**This configuration cannot be estimated.** {plain(text)}  \n"
             "Change the setting in the sidebar (the message is also shown next to it).", icon=":material/error:")


def estimate_or_stop(cur: Current):
    """This run's estimate, for a page to draw; otherwise the page shows why not and stops: a calm
    hint while there is no model yet, or the one message saying what is wrong."""
    if cur.waiting:
        st.info(cur.waiting, icon=":material/info:")
        st.stop()
    if cur.error is not None:
        show_error(cur.error)
        st.stop()
    res = compute.estimate(cur.config_json)
    if not res.ok:
        show_error(res.error or ConfigError("config", "", "a configuration the estimator can handle"))
        st.stop()
    return res.value
