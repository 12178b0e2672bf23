"""The app under load, short (bench/bench_load.py has the full run and its timings): sessions rerunning
on one server while another runs a large planner search, which runs in a worker process (#26).

Speed is the benchmark's to measure (a timed test is flaky on a shared CI machine); this test holds
what makes the reruns fast, as counts: the planner's search never runs in the server's process (the
cause of slow reruns before #26: it held the server's interpreter), the press of Plan asks for one
search and returns while it still runs, and the server's RSS is back within 200 MB of its start."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

pytest.importorskip("streamlit")
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))


def test_the_search_runs_in_a_worker_and_memory_comes_back_while_sessions_rerun(monkeypatch):
    from bench_load import measure, report
    from estimator.search import planner
    from ui import searches
    from ui.search_pool import SearchPool

    in_server, asked = [], []
    real_plan, real_request = planner.plan, SearchPool.request
    monkeypatch.setattr(planner, "plan", lambda *a, **k: in_server.append(a) or real_plan(*a, **k))
    monkeypatch.setattr(SearchPool, "request",
                        lambda self, key, kind, *a, **k: asked.append(kind) or real_request(self, key, kind, *a, **k))

    # DeepSeek-V3 on 2,048 GPUs takes ~9 s of CPU alone (README, Speed): a 4 s budget always stops it
    m = measure(sessions=2, reruns=8, gpus=2048, budget_s=4, quiet=True)
    print(report(m))
    assert in_server == [], "the planner's search ran in the server's process"
    assert asked.count("plan") == 1, asked  # one press, one search: the reruns beside it ask for none
    assert m["search_answer"] == "done" and m["search_stopped"] == "its time budget of 4 s"
    assert m["worker_rss_max"] > 0 and os.getpid() not in searches.pool().snapshot()["pids"]
    # the press returned while the search ran (a press that waited for it would leave no rerun beside it)
    assert m["during"] is not None and m["during"]["n"] >= 1, report(m)
    assert m["rss_after"] - m["rss_start"] <= 200e6, report(m)
    searches.pool().close()
    searches.pool.clear()
