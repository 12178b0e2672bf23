"""A planner search in a real browser (issue #26): its progress, Stop, and a page switch that ends it.

The server runs its searches in worker processes (ui/search_pool.py, one at a time here); the test
finds them among the server's child processes."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from .conftest import ARTIFACTS, SERVER_PIDS, _serve, wait_for_app

# DeepSeek-V3 in bf16 on 2,048 GPUs: a search of minutes, long enough to watch, stop and leave
LARGE = "planner?model=deepseek-v3&seq_len=4096&global_batch_size=15360"


@pytest.fixture(scope="module")
def search_url():
    with _serve("streamlit-search.log", {"PLANNER_WORKERS": "1", "PLANNER_TIME_BUDGET_S": "300"}) as url:
        yield url


def workers(url: str) -> list[int]:
    """The server's search processes now running (`python -m ui.search_pool`)."""
    out = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            status = (proc / "status").read_text()
            cmdline = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        ppid = int(next(line.split()[1] for line in status.splitlines() if line.startswith("PPid:")))
        if ppid == SERVER_PIDS[url] and b"ui.search_pool" in cmdline:
            out.append(int(proc.name))
    return out


def until(condition, timeout_s: float = 30) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.2)
    return False


def start(page, url: str) -> None:
    from playwright.sync_api import expect
    page.get_by_role("spinbutton", name="GPUs", exact=True).fill("2048")
    page.get_by_role("spinbutton", name="GPUs", exact=True).press("Enter")
    wait_for_app(page)
    page.get_by_role("button", name="Plan", exact=True).click()
    # the progress panel: layouts judged of the total, refreshed while the search runs
    expect(page.get_by_text("layouts judged")).to_be_visible(timeout=60_000)
    assert until(lambda: len(workers(url)) == 1)


def test_a_search_shows_progress_and_stops_with_the_best_found(browser, search_url):
    from playwright.sync_api import expect
    context = browser.new_context(viewport={"width": 1400, "height": 1400})
    page = context.new_page()
    page.set_default_timeout(60_000)
    try:
        page.goto(f"{search_url}/{LARGE}")
        wait_for_app(page)
        start(page, search_url)
        first = page.get_by_text("layouts judged").inner_text()
        expect(page.get_by_text("layouts judged")).not_to_have_text(first, timeout=30_000)  # it moves on
        page.screenshot(path=str(ARTIFACTS / "planner-searching.png"), full_page=True)
        page.get_by_role("button", name="Stop", exact=True).click()
        expect(page.get_by_text("The search stopped at a request to stop").first).to_be_visible(timeout=30_000)
        assert until(lambda: workers(search_url) == [])  # the worker ended
        assert page.get_by_test_id("stException").count() == 0
        page.screenshot(path=str(ARTIFACTS / "planner-stopped.png"), full_page=True)
    finally:
        context.close()


def test_leaving_the_planner_page_ends_its_search(browser, search_url):
    from playwright.sync_api import expect
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    page = context.new_page()
    page.set_default_timeout(60_000)
    try:
        page.goto(f"{search_url}/{LARGE}")
        wait_for_app(page)
        start(page, search_url)
        pid = workers(search_url)[0]
        page.get_by_role("link", name="Roofline").click()
        expect(page.get_by_role("heading", name="Roofline", exact=True)).to_be_visible()
        assert until(lambda: not Path(f"/proc/{pid}").exists() or workers(search_url) == [], timeout_s=15)
    finally:
        context.close()
