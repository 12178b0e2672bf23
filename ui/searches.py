"""Streamlit glue for the planner's searches: one pool of worker processes per server
(`ui.search_pool`), who owns which search, and the progress panel a page shows while one runs.

Settings (environment variables; on Streamlit Community Cloud root-level secrets become
environment variables, and `.streamlit/secrets.toml` keys of the same name in lower case are read
too):

- ``PLANNER_TIME_BUDGET_S``: the most seconds one search may run before it answers with the best
  layouts found and a note of what it did not search (default 60; ``0`` or ``none``: no limit).
- ``PLANNER_WORKERS``: searches that run at once, each in a process of its own (default: one core
  fewer than the machine has, at least 1; never more than its cores); more requests wait in line.

A search belongs to the session and page that asked for it: switching page, asking for another
search on the same page, or closing the tab (no poll for 30 s) ends it.
"""

from __future__ import annotations

import math
import os
import uuid

import streamlit as st

from estimator import ConfigError
from ui import keys as K
from ui.search_pool import DONE, FAILED, GONE, QUEUED, RUNNING, SearchPool, Status

PLANNER = "Planner"  # page titles (ui.state.PAGES): a search is owned on one of them
MEMORY = "Memory"
DEFAULT_BUDGET_S = 60.0
POLL_S = 0.5  # how often a page asks how its search stands


def _setting(name: str) -> str | None:
    value = os.environ.get(name)
    if value is None:
        try:
            value = st.secrets.get(name.lower())
        except Exception:  # no secrets file: nothing set there
            value = None
    return None if value is None else str(value).strip()


def cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def workers(text: str | None = None, available: int | None = None) -> int:
    """`PLANNER_WORKERS`, at most one per core; by default one core is left to the server."""
    available = available or cores()
    if text:
        try:
            return max(1, min(int(text), available))
        except ValueError:
            pass
    return max(1, available - 1)


def time_budget(text: str | None = None) -> float | None:
    """`PLANNER_TIME_BUDGET_S` in seconds; None for no limit."""
    if text is None:
        return DEFAULT_BUDGET_S
    if text.lower() in ("0", "none", "off", ""):
        return None
    try:
        value = float(text)
    except ValueError:
        return DEFAULT_BUDGET_S
    return value if 0 < value < math.inf else DEFAULT_BUDGET_S


@st.cache_resource(show_spinner=False)
def pool() -> SearchPool:
    """The server's one pool, shared by every session."""
    return SearchPool(workers=workers(_setting("PLANNER_WORKERS")), budget_s=time_budget(_setting("PLANNER_TIME_BUDGET_S")))


def owner() -> str:
    """This session's name as an owner of searches."""
    ss = st.session_state
    if K.SEARCH_OWNER not in ss:
        ss[K.SEARCH_OWNER] = uuid.uuid4().hex
    return ss[K.SEARCH_OWNER]


def visiting(page: str) -> None:
    """Called on every run with the page shown: the session's searches on other pages end."""
    if K.SEARCH_OWNER in st.session_state:  # a session that never searched owns nothing
        pool().leave(owner(), staying_on=page)


def request(key: str, kind: str, args: dict, page: str, again: bool = False) -> Status:
    return pool().request(key, kind, args, owner(), page, again=again)


def status(key: str) -> Status:
    return pool().status(key, owner())


def error_of(s: Status) -> ConfigError:
    """A failed search's reason as the ConfigError the worker sent back (or one saying what went wrong)."""
    e = s.error or {}
    if "field" in e:
        return ConfigError(e["field"], e["value"], e["allowed"], e.get("reason", ""))
    what = e.get("internal") or "the search ended before it answered; press the button to search again"
    return ConfigError("config", "", "a configuration the planner can handle", f"internal error: {what}")


def _ordinal(n: int) -> str:
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


def describe_wait(s: Status) -> str:
    busy = f"{s.running} of {s.workers} search{'es' if s.workers != 1 else ''} running"
    return f"Waiting for a free search worker: {_ordinal(s.position)} in line ({busy})."


def describe_progress(s: Status, best_text) -> tuple[float, str]:
    """(fraction done, one line) of a running search; `best_text` words the best layout so far."""
    p = s.progress or {}
    judged, total = p.get("judged", 0), p.get("total", 0)
    if p.get("phase") == "fewest GPUs":
        return 1.0, f"No layout fits: looking for the fewest GPUs that would ({p.get('judged', 0):,} GPUs checked)…"
    if not total:
        return 0.0, "Starting the search…"
    text = f"{judged:,} of {total:,} layouts judged in {p.get('seconds', 0):.1f} s"
    best = p.get("best")
    text += f"; best so far: {best_text(best)}" if best else "; no fitting layout found yet"
    return min(1.0, judged / total), text


def progress_panel(key: str, best_text, what: str) -> None:
    """While `key` waits or runs: where it stands, refreshed every POLL_S seconds, and a Stop
    button; once it has answered, the whole page runs again to show the answer."""

    @st.fragment(run_every=POLL_S)
    def panel() -> None:
        s = status(key)
        if s.state in (DONE, FAILED, GONE):
            st.rerun(scope="app")
        if s.state == QUEUED:
            st.info(describe_wait(s), icon=":material/hourglass_top:")
        elif s.state == RUNNING:
            fraction, text = describe_progress(s, best_text)
            st.progress(fraction, text=f"{what}: {text}")
        st.button("Stop", key=K.SEARCH_STOP, icon=":material/stop_circle:", on_click=pool().stop, args=(key,),
                  help="Stop the search: the best layouts found so far are shown, with a note of what was not "
                       "searched.")

    panel()


__all__ = ["DONE", "FAILED", "GONE", "QUEUED", "RUNNING", "Status", "pool", "request", "status", "visiting",
           "progress_panel", "owner", "time_budget", "workers", "PLANNER", "MEMORY"]
