"""Issue 26, defect 12: the model source and the HF Hub id in a real browser (the server runs
offline, HF_HUB_OFFLINE=1: every fetch fails, with its reason)."""

from __future__ import annotations

from .conftest import ARTIFACTS, wait_for_app


def _sidebar(page):
    return page.get_by_test_id("stSidebar")


def test_a_5000_character_id_stays_in_the_field_and_a_fetch_says_what_an_id_is(page, app_url):
    page.goto(f"{app_url}/?model=qwen3-8b")
    wait_for_app(page)
    _sidebar(page).get_by_role("radio", name="HF Hub").click()
    wait_for_app(page)
    box = _sidebar(page).get_by_role("textbox", name="Hugging Face model id")
    long_id = "org/" + "a" * 4996
    box.click()
    page.keyboard.insert_text(long_id)  # as a paste: one input of 5,000 characters
    box.press("Enter")
    wait_for_app(page)
    assert box.input_value() == long_id  # the browser emptied it, and nothing said why
    _sidebar(page).get_by_role("button", name="Fetch").click()
    wait_for_app(page)
    assert box.input_value() == long_id
    errors = _sidebar(page).get_by_test_id("stAlertContentError")
    assert errors.count() == 1
    text = errors.first.inner_text()
    assert "(5,000 characters)" in text and "not a valid repository id" in text, text
    page.screenshot(path=str(ARTIFACTS / "hub-long-id.png"))


def test_clicking_the_chosen_source_keeps_it(page, app_url):
    page.goto(f"{app_url}/?model=qwen3-8b")
    wait_for_app(page)
    preset = _sidebar(page).get_by_role("radio", name="Preset")
    assert preset.get_attribute("aria-checked") == "true"
    preset.click()  # the chosen one, clicked again
    wait_for_app(page)
    assert preset.get_attribute("aria-checked") == "true"
    checked = [r.inner_text() for r in _sidebar(page).get_by_role("radio").all()
               if r.get_attribute("aria-checked") == "true"]
    assert checked == ["Preset"]
    assert "model=qwen3-8b" in page.url
    main = page.get_by_test_id("stMain").inner_text()
    assert "Model qwen3-8b" in main and "press Fetch" not in main
