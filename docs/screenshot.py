"""Take docs/memory.png from the app as it is: `streamlit run app.py` offline on a free loopback port,
headless Chromium (Playwright, Debian's /usr/bin/chromium) at 1400 x 2400 on the Memory page of
`LINK`, the whole page as one PNG.

    python docs/screenshot.py

The PNG carries the link and the device total the page showed (PNG text chunks), so that
tests/test_new_user.py can tell when the estimator no longer gives the numbers the picture shows.
"""

from __future__ import annotations

import io
import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "docs" / "memory.png"
CHROMIUM = "/usr/bin/chromium"
# Mixtral-8x7B with TP 2, PP 4, DP 2, EP 2 on H100s: just over (101%), with a plan to fit and four stages
LINK = "model=mixtral-8x7b&tp=2&pp=4&dp=2&ep=2"
SIZE = {"width": 1400, "height": 2400}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_until_served(url: str, server: subprocess.Popen) -> None:
    deadline = time.time() + 90
    while True:
        try:
            if urllib.request.urlopen(f"{url}/_stcore/health", timeout=2).read() == b"ok":
                return
        except OSError:
            pass
        if server.poll() is not None or time.time() > deadline:
            raise SystemExit("streamlit did not start")
        time.sleep(0.3)


def _settle(page) -> None:
    """The app connected and its script finished, twice (to outlast a rerun)."""
    for _ in range(2):
        page.wait_for_selector("[data-testid='stApp'][data-test-connection-state='CONNECTED']")
        page.wait_for_selector("[data-testid='stApp'][data-test-script-state='notRunning']")
        page.wait_for_timeout(1500)


def take(out: Path = OUT) -> str:
    """Screenshot the Memory page of `LINK` into `out`; the device total it shows."""
    from PIL import Image, PngImagePlugin
    from playwright.sync_api import sync_playwright

    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    server = subprocess.Popen(
        [sys.executable, "-m", "streamlit", "run", "app.py", "--server.headless", "true", "--server.port", str(port),
         "--server.address", "127.0.0.1", "--browser.gatherUsageStats", "false", "--server.fileWatcherType", "none"],
        cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    try:
        _wait_until_served(url, server)
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu"])
            page = browser.new_page(viewport=SIZE)
            page.set_default_timeout(120_000)
            page.goto(f"{url}/?{LINK}")
            _settle(page)
            page.locator(".vega-embed svg.marks").first.wait_for()
            total = (page.get_by_test_id("stMetric").filter(has_text="Device total per GPU").first
                     .get_by_test_id("stMetricValue").inner_text().strip())
            png = page.screenshot(full_page=True)
            browser.close()
    finally:
        server.terminate()
        server.wait(timeout=20)
    info = PngImagePlugin.PngInfo()
    info.add_text("link", LINK)
    info.add_text("device-total", total)
    Image.open(io.BytesIO(png)).save(out, pnginfo=info, optimize=True)
    return total


if __name__ == "__main__":
    print(f"{OUT.relative_to(ROOT)}: {LINK}, device total {take()}")
