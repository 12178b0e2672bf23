"""The app's pool of search processes (ui/search_pool.py): answers equal to the planner's own, a
bounded number running with the rest in line, shared searches, Stop, owners leaving, quiet owners,
a bounded cache, errors; and the settings that size it (ui/searches.py)."""

from __future__ import annotations

import json
import os
import time

import pytest

from estimator import load_config
from estimator.search.planner import plan
from ui.search_pool import DONE, FAILED, GONE, QUEUED, RUNNING, SearchPool

SMALL = {"model": "llama-3.2-1b", "training": {"seq_len": 4096, "global_batch_size": 64}}
LARGE = {"model": "deepseek-v3", "training": {"seq_len": 4096, "global_batch_size": 15360}}  # a minute or more


def args(config: dict, gpus: int = 8) -> dict:
    return {"config_json": json.dumps(config), "gpus": gpus, "gpus_per_node": 8, "margin": 0.8}


def wait(pool: SearchPool, key: str, owner: str = "a", states=(DONE, FAILED), timeout_s: float = 120):
    deadline = time.monotonic() + timeout_s
    while True:
        status = pool.status(key, owner)
        if status.state in states:
            return status
        assert time.monotonic() < deadline, f"{key} still {status.state}"
        time.sleep(0.1)


def gone(pid: int, timeout_s: float = 10) -> bool:
    """The process has ended (its memory is the system's again)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.05)
    return False


@pytest.fixture
def pool():
    made = []

    def make(**kwargs) -> SearchPool:
        made.append(SearchPool(**{"workers": 1, "budget_s": None, **kwargs}))
        return made[-1]
    yield make
    for p in made:
        p.close()


def test_an_answer_is_the_planners_own_and_its_process_ends(pool):
    p = pool()
    first = p.request("small", "plan", args(SMALL), "a", "Planner")
    assert first.state in (QUEUED, RUNNING)
    pid = p.snapshot()["pids"][0]
    answer = wait(p, "small")
    assert answer.state == DONE
    cfg = load_config(SMALL)
    direct = plan(cfg.architecture, cfg.training, cfg.hardware, 8).to_json()
    got = answer.result
    assert [x["parallel"] | x["training"] for x in got["layouts"]] == \
        [x["parallel"] | x["training"] for x in direct["layouts"]]
    assert [x["device_total_bytes"] for x in got["layouts"]] == [x["device_total_bytes"] for x in direct["layouts"]]
    assert got["searched"] == direct["searched"] and got["gpu"] == "h100-80" and "stopped" not in got
    assert gone(pid) and p.snapshot()["running"] == 0
    # asked again: the answer kept, no new process
    assert p.request("small", "plan", args(SMALL), "b", "Planner").result == got and p.snapshot()["pids"] == []


def test_at_most_the_workers_run_and_the_rest_wait_in_line(pool):
    p = pool(workers=1)
    p.request("large", "plan", args(LARGE, 2048), "a", "Planner")
    waiting = p.request("small", "plan", args(SMALL), "b", "Planner")
    assert waiting.state == QUEUED and waiting.position == 1 and waiting.running == 1 and waiting.workers == 1
    third = p.request("small-16", "plan", args(SMALL, 16), "c", "Planner")
    assert third.state == QUEUED and third.position == 2
    assert p.snapshot() | {"pids": None} == {"running": 1, "queued": 2, "answers": 0, "pids": None}
    p.leave("a")  # the large search's only owner leaves: it ends, the next starts
    assert wait(p, "small", "b").state == DONE
    assert wait(p, "small-16", "c").state == DONE


def test_owners_share_one_search_and_it_ends_when_the_last_leaves(pool):
    p = pool(workers=2)
    p.request("large", "plan", args(LARGE, 2048), "a", "Planner")
    p.request("large", "plan", args(LARGE, 2048), "b", "Planner")
    snap = p.snapshot()
    assert snap["running"] == 1 and len(snap["pids"]) == 1
    pid = snap["pids"][0]
    p.leave("a", staying_on="Memory")  # a switched page
    assert p.status("large", "b").state == RUNNING
    p.request("other", "plan", args(SMALL), "b", "Planner")  # b asks for another search on the same page
    assert gone(pid) and p.status("large").state == GONE


def test_stop_answers_with_the_best_found_so_far_and_plan_again_runs_it_in_full(pool):
    p = pool()
    p.request("large", "plan", args(LARGE, 2048), "a", "Planner")
    running = wait(p, "large", states=(RUNNING,))
    deadline = time.monotonic() + 60
    while not (running.progress and running.progress["judged"]):
        assert time.monotonic() < deadline
        time.sleep(0.2)
        running = p.status("large", "a")
    assert 0 < running.progress["judged"] <= running.progress["total"]
    p.stop("large")
    answer = wait(p, "large")
    assert answer.state == DONE and answer.result["stopped"] == "a request to stop"
    assert answer.result["not_searched"] > 0 and "not searched" in answer.result["note"]
    # Plan pressed again: a search stopped by request runs again; without `again`, the stopped answer stays
    assert p.request("large", "plan", args(LARGE, 2048), "a", "Planner").result == answer.result
    assert p.request("large", "plan", args(LARGE, 2048), "a", "Planner", again=True).state in (QUEUED, RUNNING)


def test_a_search_whose_owner_goes_quiet_ends(pool):
    p = pool(idle_s=1.0)
    p.request("large", "plan", args(LARGE, 2048), "a", "Planner")
    pid = p.snapshot()["pids"][0]
    assert gone(pid, timeout_s=15)  # nobody polled for a second
    assert p.status("large").state == GONE


def test_the_time_budget_applies_to_every_search(pool):
    p = pool(budget_s=1.0)
    p.request("large", "plan", args(LARGE, 2048), "a", "Planner")
    answer = wait(p, "large", timeout_s=60)
    assert answer.result["stopped"] == "its time budget of 1 s" and answer.result["not_searched"] > 0


def test_answers_kept_are_bounded(pool):
    p = pool(cache_entries=2)
    for gpus in (1, 2, 4):
        p.request(f"g{gpus}", "plan", args(SMALL, gpus), "a", f"page {gpus}")
        wait(p, f"g{gpus}")
    assert p.snapshot()["answers"] == 2
    assert p.status("g1").state == GONE and p.status("g4").state == DONE


def test_a_configuration_the_planner_refuses_fails_with_its_field(pool):
    p = pool()
    bad = {"model": "llama-3.2-1b", "training": {"mode": "inference"}}
    answer = wait(p, p.request("bad", "plan", args(bad), "a", "Planner") and "bad")
    assert answer.state == FAILED and answer.error["field"] == "training.mode"


def test_the_nearest_fitting_layout_is_the_clis():
    from estimator.search.advice import plan_to_fit
    config = {"model": "llama-3.1-70b", "training": {"seq_len": 8192}, "parallel": {"dp": 8}}
    p = SearchPool(workers=1)
    try:
        p.request("n", "nearest", {"config_json": json.dumps(config)}, "a", "Memory")
        answer = wait(p, "n", timeout_s=240)
    finally:
        p.close()
    cli = plan_to_fit(load_config(config))
    got = answer.result["suggestion"]
    assert got["description"] == cli[0].description and got["gpus"] == 32 == cli[0].gpus
    assert got["config"] == cli[0].config.to_dict() and got["device_total_bytes"] == cli[0].device_total_bytes


def test_settings_size_the_pool():
    from ui.searches import DEFAULT_BUDGET_S, time_budget, workers
    assert workers(None, available=2) == 1 and workers(None, available=1) == 1 and workers(None, available=8) == 7
    assert workers("4", available=2) == 2 and workers("0", available=8) == 1 and workers("x", available=4) == 3
    assert time_budget(None) == DEFAULT_BUDGET_S and time_budget("12.5") == 12.5
    assert time_budget("0") is None and time_budget("none") is None and time_budget("-1") == DEFAULT_BUDGET_S
