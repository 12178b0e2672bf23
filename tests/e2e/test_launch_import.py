"""The Memory page's "Import a launch config" box in a real browser: a pasted torchtitan TOML sets
the configuration, the URL follows and survives a reload, and the settings read / ignored / not
modelled / unknown are listed; a hostile paste is refused with its reason."""

from pathlib import Path

from estimator.importers import estimate_imported, import_config

from .conftest import ARTIFACTS, ROOT, wait_for_app

TOML = (ROOT / "tests" / "data" / "launch" / "torchtitan" / "llama3_70b.toml").read_text()


def _metric(page, label: str) -> str:
    metric = page.get_by_test_id("stMetric").filter(has_text=label).first
    return metric.get_by_test_id("stMetricValue").inner_text().strip()


def _open_box(page):
    page.get_by_text("Import a launch config", exact=True).click()
    box = page.get_by_test_id("stExpander").filter(has_text="Paste a launch configuration")
    box.get_by_role("textbox", name="Paste a launch configuration").wait_for()
    return box


def test_a_pasted_toml_sets_the_configuration_and_the_url(page, app_url):
    page.goto(f"{app_url}/?model=llama-3.1-8b")
    wait_for_app(page)
    box = _open_box(page)
    box.get_by_role("textbox", name="Paste a launch configuration").fill(TOML)
    gpus = box.get_by_role("spinbutton", name="GPUs (where the launcher decides; 0 = from the file)")
    gpus.fill("64")
    gpus.press("Enter")
    wait_for_app(page)
    box.get_by_role("button", name="Import").click()
    page.wait_for_function("() => window.location.search.includes('framework=fsdp2')")
    wait_for_app(page)
    for part in ("model=llama-3.1-70b", "tp=8", "dp=8", "recompute=full", "micro_batch_size=8"):
        assert part in page.url, page.url
    box = page.get_by_test_id("stExpander").filter(has_text="Paste a launch configuration")
    assert "Loaded a torchtitan launch config" in box.inner_text()
    box.get_by_role("tab", name="Ignored (no effect on memory)").first.click()
    assert "optimizer.lr" in box.inner_text()
    page.screenshot(path=str(ARTIFACTS / "launch-import.png"), full_page=False)
    expected = estimate_imported(import_config(TOML, gpus=64)).device_total_bytes
    shown = _metric(page, "Device total per GPU")
    assert f"{expected / 2**30:,.2f}" in shown, shown
    page.reload()
    wait_for_app(page)
    assert "tp=8" in page.url and _metric(page, "Device total per GPU") == shown


def test_a_hostile_paste_is_refused(page, app_url):
    page.goto(f"{app_url}/?model=llama-3.1-8b")
    wait_for_app(page)
    before = page.url
    box = _open_box(page)
    box.get_by_role("textbox", name="Paste a launch configuration").fill(
        "pretrain_gpt.py --num-layers $(touch /tmp/launch-import-ran)")
    box.get_by_role("button", name="Import").click()
    wait_for_app(page)
    assert "nothing is run" in page.get_by_test_id("stExpander").filter(
        has_text="Paste a launch configuration").inner_text()
    assert page.url == before and not Path("/tmp/launch-import-ran").exists()
