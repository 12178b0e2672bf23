"""Browser tests: Playwright for Python driving Debian's chromium against `streamlit run app.py`.

They skip, with the reason shown, when /usr/bin/chromium or the playwright package is missing
(install: `apt-get install chromium` and `pip install playwright`; never `playwright install`).
Screenshots go to test-artifacts/e2e/ (git-ignored).
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = "/usr/bin/chromium"
ARTIFACTS = ROOT / "test-artifacts" / "e2e"
LAUNCH_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
               "--disable-sync", "--no-first-run"]


def _missing() -> str | None:
    if not os.path.exists(CHROMIUM):
        return f"{CHROMIUM} not found (apt-get install chromium)"
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "the playwright package is not installed (pip install playwright)"
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


SERVER_PIDS: dict[str, int] = {}  # URL -> the process id of the server behind it


@contextlib.contextmanager
def _serve(log_name: str, env_extra: dict | None = None):
    """`streamlit run app.py` on a free loopback port, offline; yields its URL."""
    reason = _missing()
    if reason:
        pytest.skip(f"browser tests skipped: {reason}")
    port = _free_port()
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    log = open(ARTIFACTS / log_name, "w")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", **(env_extra or {})}
    proc = subprocess.Popen(
        [sys.executable, "-m", "streamlit", "run", "app.py", "--server.headless", "true", "--server.port", str(port),
         "--server.address", "127.0.0.1", "--browser.gatherUsageStats", "false", "--server.fileWatcherType", "none"],
        cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, env=env)
    url = f"http://127.0.0.1:{port}"
    SERVER_PIDS[url] = proc.pid
    try:
        deadline = time.time() + 60
        while True:
            try:
                if urllib.request.urlopen(f"{url}/_stcore/health", timeout=2).read() == b"ok":
                    break
            except OSError:
                pass
            if proc.poll() is not None or time.time() > deadline:
                pytest.fail(f"streamlit did not start (see {log.name})")
            time.sleep(0.3)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()


@pytest.fixture(scope="session")
def app_url():
    with _serve("streamlit.log") as url:
        yield url


@pytest.fixture
def fresh_app_url():
    """A server no browser has visited yet (its first request decides how Streamlit runs pages)."""
    with _serve("streamlit-fresh.log") as url:
        yield url


@pytest.fixture(scope="session")
def browser(app_url):
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=LAUNCH_ARGS)
        yield b
        b.close()


@pytest.fixture
def page(browser):
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    context = browser.new_context(viewport={"width": 1400, "height": 1000}, accept_downloads=True)
    pg = context.new_page()
    pg.set_default_timeout(60_000)
    yield pg
    context.close()


def wait_for_app(page, settle_ms: int = 300) -> None:
    """Wait until the app is connected and its script has finished (twice, to outlast a rerun)."""
    for _ in range(2):
        page.wait_for_selector("[data-testid='stApp'][data-test-connection-state='CONNECTED']")
        page.wait_for_selector("[data-testid='stApp'][data-test-script-state='notRunning']")
        page.wait_for_timeout(settle_ms)
