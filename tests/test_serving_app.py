"""The Serving page (pages/serving.py) driven in-process with AppTest: the same numbers as the CLI,
serving fields in the URL, the planner and the exports."""

from __future__ import annotations

import json
import os
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from streamlit.testing.v1 import AppTest  # noqa: E402

from estimator.models.loading import load_config  # noqa: E402
from estimator.serving.service import headline, serving_config  # noqa: E402
from ui import fields  # noqa: E402

APP = str(Path(__file__).resolve().parent.parent / "app.py")


def _serving_page(query: dict) -> AppTest:
    at = AppTest.from_file(APP, default_timeout=120)
    for key, value in query.items():
        at.query_params[key] = value
    at.run()
    at.switch_page("pages/serving.py").run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def test_page_shows_the_cli_headline_from_a_link():
    at = _serving_page({"model": "llama-3.1-70b", "tp": "4", "max_model_len": "32768", "serving_kv_cache_dtype": "fp8"})
    expected = serving_config(load_config({"model": "llama-3.1-70b", "parallel": {"tp": 4},
                                           "serving": {"max_model_len": 32768, "kv_cache_dtype": "fp8"}}))
    assert at.success[0].value == headline(expected)
    assert "concurrent sequences of 32,768 tokens" in at.success[0].value
    concurrency = next(m.value for m in at.metric if m.label == "Max concurrency")
    assert concurrency == f"{expected.capacity.max_concurrency:,.2f}"
    assert at.title[0].value == "Serving"
    # the planner answers with its table
    assert any("fewest GPUs first" in c.value for c in at.caption)


def test_serving_fields_round_trip_through_the_url_and_config():
    values = fields.ui_values_from_config({"model": "llama-3.1-8b", "serving": {
        "max_model_len": 4096, "kv_cache_dtype": "fp8", "speculative": {"method": "eagle"}}})
    params = fields.url_params(fields.ModelChoice(source="preset", preset="llama-3.1-8b"), values)
    assert params == {"model": "llama-3.1-8b", "max_model_len": "4096", "serving_kv_cache_dtype": "fp8",
                      "speculative_method": "eagle"}
    assert fields.sections_from_ui(values) == {"serving": {"max_model_len": 4096, "kv_cache_dtype": "fp8",
                                                           "speculative": {"method": "eagle"}}}


def test_a_refused_request_is_shown_not_raised():
    at = _serving_page({"model": "llama-3.1-70b", "tp": "2", "max_model_len": "131072"})
    assert at.error and "does not start" in at.error[0].value


def test_a_mamba1_hybrid_is_served_with_its_state_pages():
    """Jamba Mini 1.5 (issue 28): the page gives the CLI's headline; vLLM sizes its blocks to hold a Mamba-1
    state page (tests/test_jamba.py), so a 262,144-token context fits several times on two GPUs."""
    at = _serving_page({"model": "jamba-mini-1.5", "tp": "2"})
    expected = serving_config(load_config({"model": "jamba-mini-1.5", "parallel": {"tp": 2}}))
    assert at.success[0].value == headline(expected)
    assert expected.capacity.max_concurrency > 1


def test_a_parallel_hybrid_is_served_with_attention_and_state_pages():
    """Falcon-H1 7B (issue 28): every layer keeps KV and a Mamba-2 state; the page gives the CLI's headline (vLLM: an
    attention and a state group, blocks of 1,568 tokens: tests/test_falcon_h1.py)."""
    at = _serving_page({"model": "falcon-h1-7b"})
    expected = serving_config(load_config({"model": "falcon-h1-7b"}))
    assert at.success[0].value == headline(expected)
    assert expected.capacity.max_concurrency > 1


def test_the_issue_28_mla_presets_on_the_serving_page():
    """DeepSeek-V3.2 (its cache adds the indexer's keys: 64 x (656 + 132) bytes per layer and block under vLLM
    0.11's fp8_ds_mla default) and Kimi-K2 give the CLI's headline on the Serving page."""
    for model, tp, pp in (("deepseek-v3.2", "8", "1"), ("kimi-k2", "16", "1")):
        at = _serving_page({"model": model, "tp": tp, "pp": pp, "gpu": "h200", "max_model_len": "32768"})
        expected = serving_config(load_config({"model": model, "parallel": {"tp": int(tp), "pp": int(pp)},
                                               "hardware": {"gpu": "h200"}, "serving": {"max_model_len": 32768}}))
        assert at.success[0].value == headline(expected), model


def test_llama_4_scout_on_the_serving_page():
    """Llama 4 Scout (issue 28): its 36 chunked layers keep one chunk a request under vLLM's hybrid KV cache
    manager (0.15 on), its vision encoder's weights and 16:1 dummy image in the profile; the CLI's headline."""
    at = _serving_page({"model": "llama-4-scout", "tp": "4", "max_model_len": "131072"})
    expected = serving_config(load_config({"model": "llama-4-scout", "parallel": {"tp": 4},
                                           "serving": {"max_model_len": 131072}}))
    assert at.success[0].value == headline(expected)
    assert expected.capacity.max_concurrency > 1


def test_prefix_caching_is_the_engine_default_unless_the_link_sets_it():
    """Nemotron-H 8B under vLLM 0.33: unset (the select's auto) is vLLM's default, on, and the page says so; the
    link's prefix_caching=false gives the CLI's estimate without it (more sequences: one state page each)."""
    spec = fields.BY_NAME["prefix_caching"]
    assert spec.kind == "select" and spec.options == fields.TRISTATE
    values = fields.ui_values_from_config({"model": "nemotron-h-8b", "serving": {"prefix_caching": False}})
    params = fields.url_params(fields.ModelChoice(source="preset", preset="nemotron-h-8b"), values)
    assert params == {"model": "nemotron-h-8b", "prefix_caching": "false"}
    assert fields.sections_from_ui(values) == {"serving": {"prefix_caching": False}}
    for query, serving, caption in (({}, {}, "prefix caching on (the engine default)"),
                                    ({"prefix_caching": "false"}, {"prefix_caching": False}, "prefix caching off ·")):
        at = _serving_page({"model": "nemotron-h-8b", **query})
        expected = serving_config(load_config({"model": "nemotron-h-8b", "serving": serving}))
        assert at.success[0].value == headline(expected)
        assert any(caption in c.value for c in at.caption), query
        assert any(c.value.startswith("Note: Prefix caching") for c in at.caption)
