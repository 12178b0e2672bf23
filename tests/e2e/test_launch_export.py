"""The Planner's "Launch config for" download in a real browser: the chosen layout of a DeepSpeed run,
downloaded as the Trainer's arguments with their DeepSpeed dict, reads back through the `hf` importer
to the planner's own first layout."""

from __future__ import annotations

from estimator import load_config
from estimator.importers import estimate_imported, import_config
from estimator.search.planner import plan

from .conftest import ARTIFACTS, wait_for_app

QUERY = "planner?model=llama-3.1-8b&framework=deepspeed&dp=8"


def test_the_chosen_layout_downloads_as_a_launch_config(page, app_url, tmp_path):
    from playwright.sync_api import expect
    page.goto(f"{app_url}/{QUERY}")
    wait_for_app(page)
    page.get_by_role("button", name="Plan", exact=True).click()
    expect(page.get_by_text("Launch config for")).to_be_visible(timeout=240_000)
    wait_for_app(page)
    preview = page.get_by_test_id("stCode").filter(has_text="written by llm-memory").first
    assert "model_name_or_path: meta-llama/Llama-3.1-8B" in preview.inner_text()
    button = page.get_by_test_id("stDownloadButton").filter(has_text="Download").first
    with page.expect_download(timeout=120_000) as info:
        button.get_by_role("button", name="Download").click()
    target = tmp_path / info.value.suggested_filename
    info.value.save_as(target)
    assert target.name == "layout-1-hf.yaml"
    page.screenshot(path=str(ARTIFACTS / "planner-launch-config.png"), full_page=True)
    cfg = load_config({"model": "llama-3.1-8b", "training": {"framework": "deepspeed"}, "parallel": {"dp": 8}})
    first = plan(cfg.architecture, cfg.training, cfg.hardware, 8, comm_overlap=cfg.parallel.comm_overlap).layouts[0]
    downloaded = import_config(target.read_text(), gpus=8)
    assert downloaded.kind == "hf" and downloaded.unknown == ()
    assert estimate_imported(downloaded).device_total_bytes == first.device_total_bytes
