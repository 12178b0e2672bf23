"""Server-side rerun time of the app's pages (AppTest, in-process, no browser). Prints; not a test.

    python bench/bench_app.py [--repeat N]

For each page: N reruns with the same configuration, and N reruns after a widget change to a
configuration no run has seen yet (the sequence length; every cache keyed on the configuration
misses: estimate, plan, chart specs). Each is timed twice over:

- `AppTest.run()`: the script run in its thread, plus AppTest's own parsing of the result into
  its element tree (10-15 ms on the Memory page; no server does it);
- the server side: the script thread alone (`LocalScriptRunner._run_script_thread`: the app and
  the page run, every element serialised and queued for the browser). It still compiles app.py
  and the page on every run (AppTest gives each run a fresh script cache; a server compiles
  them once), a few milliseconds.

Minimum and median are printed; the machine is shared, so the minimum is the number to compare,
the median the one the issue's target is read against. For the Memory page it also prints the
time spent in `ui.view.chart` (the two charts: spec built on a cache miss, then handed to
`st.vega_lite_chart`) and in `ui.state.render_config` (the sidebar: the model and the widgets of
the open groups, as a session starts: Run, Parallel layout and GPU; a closed group draws none),
and their shares of the server-side rerun.

A run that shows "cannot be estimated" or raises stops the benchmark: a page that fails early
is fast and would read as a speed-up.
"""

from __future__ import annotations

import argparse
import functools
import statistics
import sys
import time
from pathlib import Path

from streamlit.testing.v1 import AppTest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # the app's `ui` package, the same modules the AppTest runs import
APP = str(ROOT / "app.py")
PAGES = ["pages/memory.py", "pages/roofline.py", "pages/planner.py", "pages/compare.py", "pages/presets.py",
         "pages/guide.py"]
QUERY = {"model": "llama-3.1-70b", "tp": "8", "pp": "4", "vpp": "5", "dp": "2", "seq_len": "8192",
         "recompute": "selective"}

SECONDS: dict[str, list[float]] = {"chart": [], "sidebar": [], "script": []}  # during the current run


def _timed(owner, name: str, into: list[float]) -> None:
    """Wrap `owner.name` so that each call adds its seconds to `into` (the app and the pages call
    these through their module or class, so the wrapper is what they run)."""
    inner = getattr(owner, name)

    @functools.wraps(inner)
    def timed(*args, **kwargs):
        t = time.perf_counter()
        try:
            return inner(*args, **kwargs)
        finally:
            into.append(time.perf_counter() - t)

    setattr(owner, name, timed)


def _time_parts() -> None:
    from streamlit.testing.v1.local_script_runner import LocalScriptRunner

    from ui import state, view

    _timed(view, "chart", SECONDS["chart"])
    _timed(state, "render_config", SECONDS["sidebar"])
    _timed(LocalScriptRunner, "_run_script_thread", SECONDS["script"])


def _run(at: AppTest) -> tuple[float, float]:
    """(AppTest.run() seconds, the script thread's seconds)."""
    for seconds in SECONDS.values():
        seconds.clear()
    t = time.perf_counter()
    at.run()
    elapsed = time.perf_counter() - t
    failed = [e.value for e in at.exception] + [e.value for e in at.error if "cannot be estimated" in e.value]
    if failed:
        sys.exit(f"the page did not render, so its time means nothing: {failed[0]}")
    return elapsed, sum(SECONDS["script"])


def _ms(values: list[float]) -> str:
    return f"min {1000 * min(values):6.1f} ms, median {1000 * statistics.median(values):6.1f} ms"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=int, default=10)
    args = parser.parse_args()
    _time_parts()
    at = AppTest.from_file(APP, default_timeout=120)
    for k, v in QUERY.items():
        at.query_params[k] = v
    print(f"first run (fresh session, Memory page): {1000 * _run(at)[0]:7.1f} ms")
    print(f"{'page':<18} {'':<12} {'rerun, same config':<38} after a widget change (new config)  (of {args.repeat})")
    # a sequence length per rerun, none used twice in the whole benchmark nor equal to QUERY's
    # (multiples of 1024 stay valid for QUERY's layout)
    fresh = iter(range(int(QUERY["seq_len"]) + 1024, 10**7, 1024))
    for page in PAGES:
        at.switch_page(page)
        _run(at)
        same, changed, parts = [], [], []
        for _ in range(args.repeat):
            same.append(_run(at))
            at.number_input(key="seq_len").set_value(next(fresh))
            changed.append(_run(at))
            parts.append((sum(SECONDS["chart"]), sum(SECONDS["sidebar"])))
        for label, i in (("AppTest.run", 0), ("server side", 1)):
            print(f"{page if i == 0 else '':<18} {label:<12} {_ms([x[i] for x in same]):<38} "
                  f"{_ms([x[i] for x in changed])}")
        if page == "pages/memory.py":
            memory = ([x[1] for x in changed], parts)
    server, parts = memory
    print("Memory page after a widget change, of the server side:")
    for label, i in (("drawing the charts (ui.view.chart)", 0), ("the sidebar (ui.state.render_config)", 1)):
        part = [p[i] for p in parts]
        print(f"  {label:<38} {_ms(part)}, median share {statistics.median(x / t for x, t in zip(part, server)):.0%}")


if __name__ == "__main__":
    main()
