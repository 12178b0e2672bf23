"""The Memory page's "Import a launch config" box, in-process (AppTest): a pasted torchtitan TOML
becomes the configuration, its URL, and the totals the CLI gives for the same import."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("streamlit")
from streamlit.testing.v1 import AppTest  # noqa: E402

from estimator.importers import estimate_imported, import_config  # noqa: E402
from ui import keys as K  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
TOML = (ROOT / "tests" / "data" / "launch" / "torchtitan" / "llama3_70b.toml").read_text()


def test_pasted_launch_config_becomes_the_configuration():
    at = AppTest.from_file(str(ROOT / "app.py"), default_timeout=90).run()
    at.text_area(key=K.LAUNCH_TEXT).input(TOML)
    at.number_input(key=K.LAUNCH_GPUS).set_value(64)
    at.button(key=K.LAUNCH_BUTTON).click().run()
    assert not at.exception, [e.value for e in at.exception]
    result = at.session_state[K.LAUNCH_RESULT]
    assert result["kind"] == "torchtitan" and "error" not in result
    assert at.query_params["model"] == "llama-3.1-70b" and at.query_params["tp"] == "8"
    assert at.query_params["dp"] == "8" and at.query_params["framework"] == "fsdp2"
    expected = estimate_imported(import_config(TOML, gpus=64)).device_total_bytes
    assert at.session_state[K.CURRENT].config["parallel"]["tp"] == 8
    assert any(f"{expected / 2**30:,.2f} GiB" in m.value for m in at.metric)
    assert any("Loaded a torchtitan launch config" in s.value for s in at.success)


def test_a_bad_launch_config_is_explained_and_changes_nothing():
    at = AppTest.from_file(str(ROOT / "app.py"), default_timeout=90).run()
    before = dict(at.query_params)
    at.text_area(key=K.LAUNCH_TEXT).input("pretrain_gpt.py --num-layers $(reboot)")
    at.button(key=K.LAUNCH_BUTTON).click().run()
    assert not at.exception
    assert "nothing is run" in at.session_state[K.LAUNCH_RESULT]["error"]
    assert any("nothing is run" in e.value for e in at.error)
    assert dict(at.query_params) == before
