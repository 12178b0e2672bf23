"""The app under load (issue #26, "Load, measured"): N sessions rerunning on one server while another
session runs a large planner search. Prints; tests/test_load.py runs a short version without timings.

    python bench/bench_load.py                     # 4 sessions x 12 reruns, DeepSeek-V3 on 2,048 GPUs
    python bench/bench_load.py --sessions 8 --reruns 20
    python bench/bench_load.py --in-process        # the search in the server's own process, as before #26

The "server" is this process: every session is a Streamlit `AppTest` of app.py run in it, so they
share its caches, its search pool and its GIL, as a server's sessions do (AppTest runs each script
run in a thread of its own). Each rerun is a user's change: a sequence length no session has used
(every cache keyed on the configuration misses), on the Memory page; its latency is the wall time
of `AppTest.run()`. Phases:

1. idle: the sessions' reruns, round robin, no search;
2. during: a further session loads the recipe "deepseek-v3-as-reported" and presses Plan on the
   Planner page for 2,048 GPUs (bench/bench_planner.py's case); while the search runs (in a
   worker process of ui/search_pool.py), the same reruns;
3. after: the search answered; the session leaves the Planner page.

Reported: the reruns' latency percentiles idle and during the search, their ratio (the goal: a
median within 1.5x of idle), and the server's RSS at the start, the most during the search, and
after it (the goal: back within 200 MB of the start), with the search worker's own peak RSS.
`--in-process` runs the same search with `estimator.planner.plan` in a thread of this process
instead (what the Planner page did before: the search in the script thread), for comparison.
"""

from __future__ import annotations

import argparse
import gc
import itertools
import os
import statistics
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
APP = str(ROOT / "app.py")
MiB = 2**20
SEQ_LENS = itertools.count(1024, 8)  # a fresh sequence length each rerun: no cache serves it


def rss(pid: int | None = None) -> int:
    """Resident bytes of a process (this one by default); 0 when it has ended."""
    try:
        with open(f"/proc/{pid or 'self'}/status") as fh:
            for line in fh:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def session(query: dict | None = None):
    from streamlit.testing.v1 import AppTest
    at = AppTest.from_file(APP, default_timeout=120)
    for key, value in (query or {"model": "llama-3.1-8b", "dp": "8"}).items():
        at.query_params[key] = value
    return at.run()


def rerun(at) -> float:
    """One user change on the Memory page: the seconds of its run."""
    widget = at.number_input(key="seq_len")
    widget.set_value(next(SEQ_LENS))
    start = time.perf_counter()
    at.run()
    seconds = time.perf_counter() - start
    if at.exception:
        raise SystemExit(f"a rerun raised: {[e.value for e in at.exception]}")
    return seconds


def round_robin(sessions: list, reruns: int, go_on=lambda: True) -> list[float]:
    out = []
    for _ in range(reruns):
        for at in sessions:
            if not go_on():
                return out
            out.append(rerun(at))
    return out


def percentiles(values: list[float]) -> dict:
    values = sorted(values)
    pick = lambda q: values[min(len(values) - 1, int(q * len(values)))]  # noqa: E731
    return {"n": len(values), "p50": statistics.median(values), "p90": pick(0.9), "p99": pick(0.99),
            "max": values[-1]}


def dsv3_recipe() -> dict:
    from estimator.models.presets import get_recipe
    return get_recipe("deepseek-v3-as-reported").config


class Sampler:
    """The server's RSS and the search workers' (their peak), sampled every 0.2 s in a thread."""

    def __init__(self):
        self.server_max = 0
        self.worker_max = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        from ui import searches
        while not self._stop.is_set():
            self.server_max = max(self.server_max, rss())
            for pid in searches.pool().snapshot()["pids"]:
                self.worker_max = max(self.worker_max, rss(pid))
            time.sleep(0.2)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()


def start_search_in_pool(gpus: int):
    """A session that loads the recipe and presses Plan; returns it and whether its search runs."""
    from ui import keys as K
    from ui import searches
    searcher = session()
    searcher.session_state[K.PENDING] = (dsv3_recipe(), "bench")
    searcher.run()
    searcher.switch_page("pages/planner.py").run()
    searcher.number_input(key="planner_gpus").set_value(gpus).run()
    searcher.button(key="planner_run").click().run()
    job = searcher.session_state[K.PLANNER_ASKED]
    key = "plan:" + __import__("json").dumps([job["plan_json"], job["gpus"], job["per_node"], job["margin"]])

    def running() -> bool:
        return searches.pool().status(key, searches_owner(searcher)).state in (searches.QUEUED, searches.RUNNING)
    return searcher, running


def searches_owner(at) -> str:
    from ui import keys as K
    return at.session_state[K.SEARCH_OWNER]


def start_search_in_process(gpus: int):
    """The same search in a thread of this process (the Planner page before #26)."""
    from estimator import load_config
    from estimator.search.planner import plan
    cfg = load_config(dsv3_recipe())
    thread = threading.Thread(target=plan, args=(cfg.architecture, cfg.training, cfg.hardware, gpus), daemon=True)
    thread.start()
    return None, thread.is_alive


def measure(sessions: int = 4, reruns: int = 12, gpus: int = 2048, in_process: bool = False,
            budget_s: float | None = None, quiet: bool = False) -> dict:
    """The three phases; returns the numbers (tests/test_load.py reads them)."""
    if budget_s is not None:
        from ui import searches
        os.environ["PLANNER_TIME_BUDGET_S"] = str(budget_s)
        searches.pool().close()  # a pool made before, with another budget, makes way for a new one
        searches.pool.clear()
    say = (lambda *a: None) if quiet else print
    users = [session() for _ in range(sessions)]
    round_robin(users, 1)  # each session's first run builds what every later one shares
    gc.collect()
    start_rss = rss()
    idle = round_robin(users, reruns)
    say(f"idle: {len(idle)} reruns")
    started = time.perf_counter()
    searcher, running = (start_search_in_process if in_process else start_search_in_pool)(gpus)
    with Sampler() as sampled:
        during = round_robin(users, reruns * 100, go_on=running)
        while running():  # the reruns ran out before the search: wait for it
            time.sleep(0.2)
    search_s = time.perf_counter() - started
    if searcher is not None:
        searcher.switch_page("pages/memory.py").run()  # leaves the Planner page
    gc.collect()
    time.sleep(1.0)
    after_rss = rss()
    from ui import searches
    peaks = searches.pool().peaks
    out = {"idle": percentiles(idle), "during": percentiles(during) if during else None, "search_s": search_s,
           "rss_start": start_rss, "rss_during_max": max(sampled.server_max, start_rss), "rss_after": after_rss,
           "worker_rss_max": max([sampled.worker_max] + (peaks[-1:] if not in_process else [])),
           "sessions": sessions, "in_process": in_process}
    if searcher is not None:
        from ui import keys as K
        from ui import searches
        asked = searcher.session_state[K.PLANNER_ASKED]
        key = "plan:" + __import__("json").dumps([asked["plan_json"], asked["gpus"], asked["per_node"],
                                                  asked["margin"]])
        answer = searches.pool().status(key)
        out["search_answer"] = answer.state
        out["search_stopped"] = (answer.result or {}).get("stopped")
    return out


def report(m: dict) -> str:
    lines = [f"{m['sessions']} sessions; the search {'in the server process' if m['in_process'] else 'in a worker'}: "
             f"{m['search_s']:.1f} s" + (f" ({m.get('search_answer')}"
                                         + (f", stopped at {m['search_stopped']}" if m.get("search_stopped") else "")
                                         + ")" if "search_answer" in m else "")]
    for phase in ("idle", "during"):
        p = m[phase]
        if p:
            lines.append(f"  rerun latency {phase:>6}: n {p['n']:>4}  p50 {p['p50'] * 1000:7.1f} ms  p90 "
                         f"{p['p90'] * 1000:7.1f} ms  p99 {p['p99'] * 1000:7.1f} ms  max {p['max'] * 1000:7.1f} ms")
    if m["during"]:
        ratio = m["during"]["p50"] / m["idle"]["p50"]
        lines.append(f"  median during / idle: {ratio:.2f} (goal <= 1.5: {'met' if ratio <= 1.5 else 'NOT met'})")
    grown = (m["rss_after"] - m["rss_start"]) / MiB
    lines.append(f"  server RSS: start {m['rss_start'] / MiB:.0f} MiB, during (most) {m['rss_during_max'] / MiB:.0f} MiB, "
                 f"after {m['rss_after'] / MiB:.0f} MiB ({grown:+.0f} MiB; goal within 200 MB: "
                 f"{'met' if grown * MiB <= 200e6 else 'NOT met'})"
                 + (f"; search worker's peak RSS {m['worker_rss_max'] / MiB:.0f} MiB" if m["worker_rss_max"] else ""))
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sessions", type=int, default=4)
    parser.add_argument("--reruns", type=int, default=12, help="idle reruns per session")
    parser.add_argument("--gpus", type=int, default=2048)
    parser.add_argument("--in-process", action="store_true")
    parser.add_argument("--time-budget", type=float, default=None, help="PLANNER_TIME_BUDGET_S for the pool")
    args = parser.parse_args()
    print(report(measure(args.sessions, args.reruns, args.gpus, args.in_process, args.time_budget)))
    os._exit(0)  # an in-process search thread may still run: do not wait for it


if __name__ == "__main__":
    main()
