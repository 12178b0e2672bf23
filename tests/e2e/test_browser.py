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
    from playwright.sync_api import expect
    expect(_tp(page)).to_have_value("8", timeout=30_000)  # retried: the sidebar may still be drawing
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
    # right after a reload the page can still show the widget's first frame: wait for the value
    from playwright.sync_api import expect
    expect(_tp(page)).to_have_value("4")
    wait_for_app(page)
    assert _metric(page, "Device total per GPU") == after


def test_a_closed_groups_setting_stays_in_the_link_and_the_estimate(page, app_url, tmp_path):
    """A sidebar group draws its widgets only while open: a setting made in a group that is closed
    again stays in the URL and the estimate on every page and after a reload, and its widget shows
    it when the group opens again. A group stays as the user left it across page switches."""
    from playwright.sync_api import expect

    group = "Optimizer and memory savers"
    expected = _cli_device_total({"model": "llama-3.1-8b", "training": {"recompute": "full"},
                                  "parallel": {"tp": 2}}, tmp_path)
    page.goto(f"{app_url}/?model=llama-3.1-8b&tp=2")
    wait_for_app(page)
    sidebar = page.get_by_test_id("stSidebar")
    recompute = sidebar.get_by_role("combobox", name="Activation recomputation", exact=True)
    assert recompute.count() == 0  # closed at first: no widget
    sidebar.get_by_text(group, exact=True).click()
    wait_for_app(page)
    recompute.click()
    recompute.fill("full")
    recompute.press("Enter")
    page.wait_for_function("() => window.location.search.includes('recompute=full')")
    wait_for_app(page)
    page.get_by_role("link", name="Roofline").first.click()
    wait_for_app(page)
    expect(recompute).to_have_value("full")  # still open, on another page
    sidebar.get_by_text(group, exact=True).click()  # closed
    wait_for_app(page)
    expect(recompute).to_have_count(0)
    page.get_by_role("link", name="Memory").first.click()
    wait_for_app(page)
    expect(recompute).to_have_count(0)  # still closed
    assert "recompute=full" in page.url and "tp=2" in page.url
    assert _metric(page, "Device total per GPU") == f"{expected / GiB:,.2f} GiB"
    page.reload()  # a new session from the link
    wait_for_app(page)
    assert "recompute=full" in page.url
    assert _metric(page, "Device total per GPU") == f"{expected / GiB:,.2f} GiB"
    sidebar.get_by_text(group, exact=True).click()
    wait_for_app(page)
    expect(recompute).to_have_value("full")


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
    rows = df[df["kind"] == "component"] if "kind" in df.columns else df  # the CSV also lists settings and totals
    peak = rows[rows["peak_stage"].astype(str) == "True"]
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


# --- hardening: what a first-time user (or a hostile link) does --------------------------------------

def _cut(locator) -> list[str]:
    """Texts inside `locator` shown cut (an ellipsis): an element whose content is wider than its box."""
    return locator.evaluate_all("""els => els.flatMap(root => [root, ...root.querySelectorAll('*')])
        .filter(e => e.clientWidth > 0 && e.scrollWidth > e.clientWidth + 1
                     && getComputedStyle(e).overflowX !== 'auto' && getComputedStyle(e).overflowX !== 'scroll')
        .map(e => e.innerText)""")


def test_memory_page_shows_labels_values_and_table_cells_whole_at_1400px(browser, app_url):
    from playwright.sync_api import expect

    context = browser.new_context(viewport={"width": 1400, "height": 2400})
    page = context.new_page()
    page.set_default_timeout(60_000)
    try:
        # out of memory: the longest verdict; a pipeline for the batch line
        page.goto(f"{app_url}/?model=llama-3.1-70b&pp=2&seq_len=8192")
        wait_for_app(page, settle_ms=800)
        metrics = page.get_by_test_id("stMetric")
        expect(metrics).to_have_count(8, timeout=60_000)
        assert _cut(metrics) == []
        assert "per step (global batch" in page.get_by_test_id("stMain").inner_text()
        table = page.get_by_test_id("stTable").first
        assert "Source" in table.inner_text() and _cut(table) == []
        # the per-layer ledger is for training only
        assert page.get_by_text("What one layer keeps for backward").count() == 1
        page.screenshot(path=str(ARTIFACTS / "memory-1400.png"), full_page=True)
        page.goto(f"{app_url}/?model=llama-3.1-70b&mode=inference")
        wait_for_app(page, settle_ms=800)
        expect(page.get_by_test_id("stMetric")).to_have_count(8, timeout=60_000)
        assert page.get_by_text("What one layer keeps for backward").count() == 0
        assert _cut(page.get_by_test_id("stMetric")) == []
        page.goto(f"{app_url}/roofline?model=mixtral-8x7b&tp=2&pp=4&dp=2&ep=2")
        wait_for_app(page, settle_ms=800)
        # step time, tokens/s per GPU, MFU, bubble, exposed communication; the memory summary beside them
        expect(page.get_by_test_id("stMetric")).to_have_count(6, timeout=60_000)
        assert _cut(page.get_by_test_id("stMetric")) == []
    finally:
        context.close()


def test_hf_hub_source_is_calm_before_a_fetch_and_its_button_fits(page, app_url):
    page.goto(f"{app_url}/?model=qwen3-8b")
    wait_for_app(page)
    page.get_by_test_id("stSidebar").get_by_role("radio", name="HF Hub").click()
    wait_for_app(page)
    assert page.get_by_test_id("stException").count() == 0
    assert page.get_by_test_id("stAlertContentError").count() == 0
    assert "press Fetch" in page.get_by_test_id("stMain").inner_text()
    assert "model=qwen3-8b" not in page.url
    fetch = page.get_by_test_id("stSidebar").get_by_role("button", name="Fetch")
    assert fetch.is_visible() and "Fetch" in fetch.inner_text() and _cut(fetch) == []
    page.screenshot(path=str(ARTIFACTS / "hub-before-fetch.png"))
    # offline (the server runs with HF_HUB_OFFLINE=1): one message, no contradiction
    box = page.get_by_test_id("stSidebar").get_by_role("textbox", name="Hugging Face model id")
    box.fill("example-org/not-cached")
    box.press("Enter")
    wait_for_app(page)
    fetch.click()
    wait_for_app(page)
    errors = page.get_by_test_id("stAlertContentError")
    assert errors.count() == 1 and "example-org/not-cached" in errors.first.inner_text()
    assert page.get_by_test_id("stException").count() == 0


def test_a_hostile_link_is_reported_never_rendered(page, app_url):
    page.goto(f"{app_url}/?model=%5Bclick%5D(https://example.com/x)&gpu=%3Cb%3Ex%3C/b%3E&seq_len=1e30"
              f"&tp={'9' * 5000}&dropout=nan")
    wait_for_app(page, settle_ms=800)
    assert page.get_by_test_id("stException").count() == 0
    warnings = page.get_by_test_id("stAlertContentWarning")
    text = " ".join(warnings.all_inner_texts())
    for label in ("Model", "GPU", "Sequence length (tokens)", "Tensor parallel (TP)", "Dropout"):
        assert label in text
    assert "[click](https://example.com/x)" in text.replace("\u2060", "")  # shown literally
    assert warnings.locator("a").count() == 0 and warnings.locator("b").count() == 0
    for name in ("seq_len=", "tp=", "dropout=", "gpu="):
        assert name not in page.url
    assert _tp(page).input_value() == "1"


def test_a_deep_link_is_the_first_request_of_a_fresh_server(browser, fresh_app_url):
    """The pages/ folder makes a fresh Streamlit server run /roofline's script by itself until some
    session calls st.navigation: the page must still come with the app's sidebar and navigation."""
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    page = context.new_page()
    page.set_default_timeout(60_000)
    try:
        page.goto(f"{fresh_app_url}/roofline?model=llama-3.1-70b&tp=8")
        wait_for_app(page, settle_ms=800)
        from playwright.sync_api import expect
        expect(page.get_by_role("heading", name="Roofline", exact=True)).to_be_visible()
        assert page.get_by_test_id("stException").count() == 0
        expect(_tp(page)).to_have_value("8", timeout=30_000)  # retried: the sidebar may still be drawing
        assert "/roofline" in page.url and "tp=8" in page.url
        # the app's own navigation (at the top), not the legacy pages/ menu in the sidebar
        assert page.get_by_test_id("stSidebarNav").count() == 0
        page.get_by_role("link", name="How to read this").first.click()
        wait_for_app(page)
        expect(page.get_by_role("heading", name="How to read this", exact=True)).to_be_visible()
        expect(_tp(page)).to_have_value("8", timeout=30_000)
    finally:
        context.close()


def test_the_planner_lists_the_clis_layouts_and_loads_one(browser, app_url, tmp_path):
    from playwright.sync_api import expect

    path = tmp_path / "config.json"
    path.write_text(json.dumps({"model": "llama-3.1-8b"}))
    out = subprocess.run([sys.executable, "-m", "estimator", "plan", "--config", str(path), "--gpus", "8", "--json"],
                         capture_output=True, text=True, cwd=ROOT, timeout=300, check=True)
    first = json.loads(out.stdout)["layouts"][0]
    # tall enough for the screenshot to hold the chart, the table and the button
    context = browser.new_context(viewport={"width": 1400, "height": 2400})
    page = context.new_page()
    page.set_default_timeout(60_000)
    try:
        page.goto(f"{app_url}/planner?model=llama-3.1-8b&dp=8")
        wait_for_app(page)
        expect(page.get_by_role("heading", name="Planner", exact=True)).to_be_visible()
        page.get_by_role("button", name="Plan", exact=True).click()
        expect(page.get_by_text("Fitting layouts, fastest first")).to_be_visible(timeout=120_000)
        wait_for_app(page, settle_ms=800)
        assert page.get_by_test_id("stException").count() == 0
        assert page.get_by_test_id("stDataFrame").count() >= 1 and page.get_by_test_id("stVegaLiteChart").count() >= 1
        page.screenshot(path=str(ARTIFACTS / "planner.png"), full_page=True)
        # layout 1 (the selectbox's default) on the Memory page: the CLI's numbers
        page.get_by_role("button", name="Use this layout").click()
        expect(page.get_by_role("heading", name="Will it fit?", exact=True)).to_be_visible(timeout=60_000)
        wait_for_app(page)
        assert _metric(page, "Device total per GPU") == f"{first['device_total_bytes'] / GiB:,.2f} GiB"
        assert "zero_stage=" in page.url  # the layout is in the link too
    finally:
        context.close()


def test_the_serving_page_shows_the_clis_capacity(browser, app_url, tmp_path):
    """A link with serving fields opens the Serving page with `serve --json`'s numbers; changing the KV
    dtype in the sidebar updates the link."""
    from playwright.sync_api import expect

    config = {"model": "llama-3.1-70b", "parallel": {"tp": 4}, "serving": {"max_model_len": 32768}}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    out = subprocess.run([sys.executable, "-m", "estimator", "serve", "--config", str(path), "--json"],
                         capture_output=True, text=True, cwd=ROOT, timeout=120, check=True)
    serving = json.loads(out.stdout)["serving"]
    context = browser.new_context(viewport={"width": 1400, "height": 2400})
    page = context.new_page()
    page.set_default_timeout(60_000)
    try:
        page.goto(f"{app_url}/serving?model=llama-3.1-70b&tp=4&max_model_len=32768")
        wait_for_app(page, settle_ms=800)
        expect(page.get_by_role("heading", name="Serving", exact=True)).to_be_visible()
        expect(page.get_by_text("concurrent sequences of 32,768 tokens").first).to_be_visible()
        assert _metric(page, "Max concurrency") == f"{serving['max_concurrency']:,.2f}"
        assert _metric(page, "KV cache tokens") == f"{serving['kv_cache_tokens']:,}"
        assert page.get_by_test_id("stVegaLiteChart").count() >= 1 and page.get_by_test_id("stException").count() == 0
        page.screenshot(path=str(ARTIFACTS / "serving.png"), full_page=True)
        assert "max_model_len=32768" in page.url
    finally:
        context.close()
