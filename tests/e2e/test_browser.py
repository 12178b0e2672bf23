"""The app in a real browser: shared links, URL updates, downloads, screenshots of every page."""

from __future__ import annotations

import io
import json
import subprocess
import sys

import pytest

from .conftest import ARTIFACTS, ROOT, wait_for_app

GiB = 1024**3
LINK = "model=llama-3.1-70b&tp=8&pp=4&vpp=5&dp=2&seq_len=8192&recompute=selective&gpu=h100-80"
CONFIG = {"model": "llama-3.1-70b", "training": {"seq_len": 8192, "recompute": "selective"},
          "parallel": {"tp": 8, "pp": 4, "vpp": 5, "dp": 2}, "hardware": {"gpu": "h100-80"}}


def _tp(page):
    return page.get_by_role("spinbutton", name="Tensor parallel (TP)", exact=True)


def _metric(page, label: str) -> str:
    metric = page.get_by_test_id("stMetric").filter(has_text=label).first
    return metric.get_by_test_id("stMetricValue").inner_text().strip()


def _cli_device_total(config: dict, tmp_path) -> int:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    out = subprocess.run([sys.executable, "-m", "estimator", "estimate", "--config", str(path), "--json"],
                         capture_output=True, text=True, cwd=ROOT, timeout=120, check=True)
    return json.loads(out.stdout)["device_total_bytes"]


def test_a_shared_link_shows_the_cli_total(page, app_url, tmp_path):
    expected = _cli_device_total(CONFIG, tmp_path)
    page.goto(f"{app_url}/?{LINK}")
    wait_for_app(page)
    assert _metric(page, "Device total per GPU") == f"{expected / GiB:,.2f} GiB"
    # the share control gives a link to the same configuration
    page.get_by_role("button", name="Share this configuration").click()
    link = page.get_by_test_id("stCode").first.inner_text().strip()
    assert link.startswith(app_url) and "model=llama-3.1-70b" in link and "vpp=5" in link and "tp=8" in link
    page.keyboard.press("Escape")
    # the same link on another page keeps the configuration
    page.goto(f"{app_url}/roofline?{LINK}")
    wait_for_app(page)
    assert _tp(page).input_value() == "8"
    page.get_by_role("link", name="Memory").first.click()
    wait_for_app(page)
    assert _metric(page, "Device total per GPU") == f"{expected / GiB:,.2f} GiB"
    assert "tp=8" in page.url and "model=llama-3.1-70b" in page.url


def test_changing_tp_updates_the_url_and_survives_a_reload(page, app_url):
    page.goto(f"{app_url}/?model=llama-3.1-8b")
    wait_for_app(page)
    before = _metric(page, "Device total per GPU")
    tp = _tp(page)
    tp.fill("4")
    tp.press("Enter")
    page.wait_for_function("() => window.location.search.includes('tp=4')")
    wait_for_app(page)
    after = _metric(page, "Device total per GPU")
    assert after != before
    assert "model=llama-3.1-8b" in page.url
    page.reload()
    wait_for_app(page)
    assert "tp=4" in page.url
    assert _tp(page).input_value() == "4"
    assert _metric(page, "Device total per GPU") == after


def test_a_bad_link_parameter_warns(page, app_url):
    page.goto(f"{app_url}/?model=llama-3.1-8b&tp=banana")
    wait_for_app(page)
    assert page.get_by_test_id("stAlertContentWarning").filter(has_text="tp='banana'").count() == 1
    assert _tp(page).input_value() == "1"


def _download(page, label: str, target) -> bytes:
    button = page.get_by_test_id("stDownloadButton").filter(has_text=label).first
    with page.expect_download(timeout=120_000) as info:
        button.get_by_role("button", name=label).click()
    info.value.save_as(target)
    return target.read_bytes()


def test_csv_and_pdf_downloads(page, app_url, tmp_path):
    import pandas as pd

    page.goto(f"{app_url}/?{LINK}")
    wait_for_app(page)
    shown = _metric(page, "Device total per GPU")
    csv = _download(page, "Breakdown (CSV)", tmp_path / "breakdown.csv")
    df = pd.read_csv(io.StringIO(csv.decode("utf-8")))
    peak = df[df["peak_stage"]]
    assert f"{peak['bytes'].sum() / GiB:,.2f} GiB" == shown
    pdf = _download(page, "Report (PDF)", tmp_path / "report.pdf")
    assert pdf.startswith(b"%PDF")
    pypdf = pytest.importorskip("pypdf")
    text = "\n".join(p.extract_text() or "" for p in pypdf.PdfReader(io.BytesIO(pdf)).pages)
    assert shown in text
    config = json.loads(_download(page, "Configuration (JSON)", tmp_path / "config.json"))
    assert config["model"] == "llama-3.1-70b" and config["parallel"]["tp"] == 8


@pytest.mark.parametrize("theme", ["light", "dark"])
def test_screenshot_every_page(browser, app_url, theme):
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    context = browser.new_context(viewport={"width": 1400, "height": 2400}, color_scheme=theme)
    page = context.new_page()
    page.set_default_timeout(60_000)
    query = "model=mixtral-8x7b&tp=2&pp=4&dp=2&ep=2"
    try:
        for name, path in [("memory", ""), ("roofline", "roofline"), ("compare", "compare"), ("presets", "presets")]:
            page.goto(f"{app_url}/{path}?{query}")
            wait_for_app(page, settle_ms=800)
            if name == "compare":  # two scenarios to compare
                page.get_by_role("button", name="Add current configuration").click()
                wait_for_app(page)
                tp = _tp(page)
                tp.fill("4")
                tp.press("Enter")
                wait_for_app(page)
                page.get_by_role("button", name="Add current configuration").click()
                wait_for_app(page, settle_ms=1500)
            assert page.get_by_test_id("stException").count() == 0
            page.screenshot(path=str(ARTIFACTS / f"{name}-{theme}.png"), full_page=True)
            assert (ARTIFACTS / f"{name}-{theme}.png").stat().st_size > 10_000
    finally:
        context.close()
