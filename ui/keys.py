"""Every session-state key the app uses, in one place. No Streamlit here.

Two kinds of keys live in ``st.session_state``:

- The configuration's widgets are keyed by their field's name (``tp``, ``seq_len``...; see
  `ui.fields`): that name is also the URL parameter, so it is part of the published link format
  and is not repeated here. A widget exists only while its sidebar group is open; the values
  themselves live in one dict (`VALUES`). The custom architecture editor's widgets are
  ``arch_<field>`` (`arch`).
- Everything else is named below. Keys starting with ``_`` are the app's own bookkeeping (and
  its sidebar widgets, which must not look like URL fields); the others are page widgets.

Modules use these names, never the string literals, so a key can be found (and renamed) in one
place.
"""

from __future__ import annotations

# --- the session -------------------------------------------------------------------------------
INIT = "_init"  # set once the link has been read (the session's first run)
CURRENT = "_current"  # this run's `state.Current`
DRAWN_TOKEN = "_drawn_token"  # which script run drew the configuration (see state.current)
NAV_RERUN = "_nav_rerun"  # a page ran without app.py around it and asked for a rerun through it
PENDING = "_pending"  # (config, source): a whole configuration to load on the next run
GOTO = "_goto"  # a page to switch to on the next run, after PENDING is applied
FLASH = "_flash"  # (kind, text): a one-run message in the sidebar ("Loaded ...")
URL_WARNINGS = "_url_warnings"  # what was wrong with the link the session started from
LAST_CHANGED = "_last_changed"  # the configuration widget the user changed last (blame for errors)
LAST_VALID = "_last_valid"  # whether the previous run's configuration could be estimated
BLAME = "_blame"  # (config JSON, widget key): the change that made that configuration impossible
VALUES = "_values"  # {field name: widget value}: the configuration's settings, drawn or not
LOADED = "_loaded"  # settings a loaded configuration set, for their widgets in the run after a page switch
OPEN_GROUPS = "_open_groups"  # the sidebar groups the user has open (an expander forgets it on a page switch)
LOADS = "_loads"  # how many configurations this session has loaded (state._apply_pending)
LOAD_SEEN = "_load_seen"  # a hidden widget: how many of those loads the browser had seen when it sent its widgets
LOAD_SEEN_BOX = "_load_seen_box"  # the hidden container that holds it
LAST_LOAD = "_last_load"  # (model choice, hub info, setting names) of the last load, to set again over a stale browser

# --- the model ----------------------------------------------------------------------------------
SOURCE = "_src"  # segmented control: Preset / HF Hub / Custom
PREV_SOURCE = "_prev_src"  # the source before the last change (the custom editor starts from it)
PRESET = "_preset"  # selectbox of bundled presets
HUB_TEXT = "_hub_text"  # text input: the Hugging Face id
HUB_FETCH = "_hub_fetch"  # the Fetch button
HUB_REQUEST = "_hub_request"  # an id to fetch in this run's body (set by the button or Enter)
HUB_MODEL = "_hub_model"  # the fetched model (a dict from compute.fetch_hub_model), or absent
HUB_STATUS = "_hub_status"  # why the last fetch failed (text), or absent
ARCH_READY = "_arch_ready"  # the custom editor's widgets hold an architecture
ARCH_PREFIX = "arch_"


def arch(name: str) -> str:
    """The custom architecture editor's widget for field `name`."""
    return ARCH_PREFIX + name


# --- sidebar widgets ----------------------------------------------------------------------------
GROUP_PREFIX = "_group_"


def group(name: str) -> str:
    """The sidebar expander of settings group `name` ("Run", "Parallel layout"...): True while open."""
    return GROUP_PREFIX + name


DISMISS_WARNINGS = "_dismiss_warnings"
IMPORT_FILE = "_import_file"
RESET = "_reset"

# --- Memory and Roofline pages ---------------------------------------------------------------------
MEMORY_STAGE = "memory_stage"
# the Memory page's "Import a launch config" box (ui/launch_import.py)
LAUNCH_TEXT = "launch_text"
LAUNCH_FILE = "launch_file"
LAUNCH_KIND = "launch_kind"
LAUNCH_GPUS = "launch_gpus"
LAUNCH_BUTTON = "launch_import"
LAUNCH_RESULT = "_launch_result"  # the last import: the settings read, ignored, not modelled, unknown; or its error


def chart(kind: str) -> str:
    """A chart drawn by `ui.view.chart` ("stages", "phases", "roofline")."""
    return f"chart_{kind}"


def plan_step(i: int) -> str:
    return f"plan_{i}"


def single_change(j: int) -> str:
    return f"single_{j}"


# --- Compare page -------------------------------------------------------------------------------
SCENARIOS = "_scenarios"  # list of {"id", "name", "config"}
COMPARE_MSG = "_compare_msg"
SCN_NEW_NAME = "scn_new_name"
SCN_ADD = "scn_add"
SCN_IMPORT = "scn_import"
SCN_CSV = "scn_csv"
SCN_JSON = "scn_json"
SCN_PDF = "scn_pdf"
COMPARE_CHART = "compare_chart"


def scn_name(entry_id: str) -> str:
    return f"scn_name_{entry_id}"


def scn_load(entry_id: str) -> str:
    return f"scn_load_{entry_id}"


def scn_remove(entry_id: str) -> str:
    return f"scn_rm_{entry_id}"


# --- Presets page -------------------------------------------------------------------------------
USER_PRESETS = "_user_presets"  # list of {"id", "name", "config"}
PRESETS_MSG = "_presets_msg"
PRESET_TABLE = "preset_table"
PRESET_PICK = "preset_pick"
PRESET_USE = "preset_use"
SERVE_USERS = "serve_users"  # the Serving page's planner: concurrent users
SERVE_CONTEXT = "serve_context"  # ... and tokens per user
MY_PRESET_NAME = "my_preset_name"
MY_PRESET_SAVE = "my_preset_save"
MY_PRESET_IMPORT = "my_preset_import"
MY_PRESET_EXPORT = "my_export"


def recipe(recipe_id: str) -> str:
    return f"recipe_{recipe_id}"


def my_use(entry_id: str) -> str:
    return f"my_use_{entry_id}"


def my_remove(entry_id: str) -> str:
    return f"my_rm_{entry_id}"


# --- Guide page ---------------------------------------------------------------------------------
SERVING_TABLE = "guide_serving_table"


# --- Planner page -------------------------------------------------------------------------------
PLANNER_GPUS = "planner_gpus"
PLANNER_GPUS_SET = "_planner_gpus_set"  # the user typed a GPU count: stop following the sidebar's layout
PLANNER_PER_NODE = "planner_per_node"
PLANNER_MARGIN = "planner_margin"
PLANNER_RUN = "planner_run"
PLANNER_ASK = "_planner_ask"  # Plan was pressed: search with the inputs of the run that follows
PLANNER_ASKED = "_planner_asked"  # the inputs of the last search: {config, plan_json, gpus, per_node, margin}
PLANNER_TABLE = "planner_table"
PLANNER_PICK = "planner_pick"
PLANNER_USE = "planner_use"
PLANNER_REPLAN = "planner_replan"
PLANNER_CHART = "planner_chart"
PLANNER_EMIT_KIND = "planner_emit_kind"  # the framework whose launch configuration the chosen layout is written as
PLANNER_EMIT = "planner_emit"
PLANNER_EMIT_PICK = "planner_emit_pick"  # choose the fastest layout the chosen launch configuration can write


def reference_table(i: int) -> str:
    """The guide page's table of the i-th worked example of another calculator."""
    return f"guide_reference_table_{i}"


PLANNER_AGAIN = "_planner_again"  # Plan was pressed: a search stopped by request runs again in full

# --- searches in worker processes (ui.searches) ---------------------------------------------------------
SEARCH_OWNER = "_search_owner"  # this session's name as the owner of its searches
SEARCH_STOP = "search_stop"  # the Stop button of a running search
