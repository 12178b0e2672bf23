"""Server-side rerun time of the app's pages (AppTest, in-process, no browser). Prints; not a test.

    python bench/bench_app.py [--repeat N]

For each page: N reruns with the same configuration, and N reruns after a widget change to a
configuration no run has seen yet (the sequence length; every cache keyed on the configuration
misses: estimate, plan, chart specs). Each is the time of `AppTest.run()`: the script run in its
thread, plus AppTest's own few milliseconds of parsing the result. Minimum and median are
printed; the machine is shared, so the minimum is the number to compare. For the Memory page
it also prints the time spent in `ui.view.chart` (the two charts: spec built on a cache miss,
then handed to `st.vega_lite_chart`) and its share of the rerun.

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

CHART_SECONDS: list[float] = []  # time in ui.view.chart during the current run


def _time_charts() -> None:
    """Wrap `ui.view.chart` (pages call it through the module, so the wrapper is what they run)."""
    from ui import view

    chart = view.chart

    @functools.wraps(chart)
    def timed(*args, **kwargs):
        t = time.perf_counter()
        try:
            return chart(*args, **kwargs)
        finally:
            CHART_SECONDS.append(time.perf_counter() - t)

    view.chart = timed


def _run(at: AppTest) -> float:
    CHART_SECONDS.clear()
    t = time.perf_counter()
    at.run()
    elapsed = time.perf_counter() - t
    failed = [e.value for e in at.exception] + [e.value for e in at.error if "cannot be estimated" in e.value]
    if failed:
        sys.exit(f"the page did not render, so its time means nothing: {failed[0]}")
    return elapsed


def _ms(values: list[float]) -> str:
    return f"min {1000 * min(values):6.1f} ms, median {1000 * statistics.median(values):6.1f} ms"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=int, default=10)
    args = parser.parse_args()
    _time_charts()
    at = AppTest.from_file(APP, default_timeout=120)
    for k, v in QUERY.items():
        at.query_params[k] = v
    print(f"first run (fresh session, Memory page): {1000 * _run(at):7.1f} ms")
    print(f"{'page':<20} {'rerun, same config':<40} after a widget change (new config)    (of {args.repeat})")
    # a sequence length per rerun, none used twice in the whole benchmark nor equal to QUERY's
    # (multiples of 1024 stay valid for QUERY's layout)
    fresh = iter(range(int(QUERY["seq_len"]) + 1024, 10**7, 1024))
    for page in PAGES:
        at.switch_page(page)
        _run(at)
        same, changed, charts = [], [], []
        for _ in range(args.repeat):
            same.append(_run(at))
            at.number_input(key="seq_len").set_value(next(fresh))
            changed.append(_run(at))
            charts.append(sum(CHART_SECONDS))
        print(f"{page:<20} {_ms(same):<40} {_ms(changed)}")
        if page == "pages/memory.py":
            memory = (changed, charts)
    changed, charts = memory
    shares = [c / t for c, t in zip(charts, changed)]
    print(f"Memory page after a widget change: drawing the charts (ui.view.chart) {_ms(charts)}, "
          f"median share of the rerun {statistics.median(shares):.0%}")


if __name__ == "__main__":
    main()
