"""The Streamlit app, driven in-process with AppTest (no browser), and its URL parsing."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("streamlit")
from streamlit.testing.v1 import AppTest  # noqa: E402

from estimator import estimate_config, parameter_counts  # noqa: E402
from ui import fields  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
APP = str(ROOT / "app.py")
PAGES = ["pages/memory.py", "pages/roofline.py", "pages/compare.py", "pages/presets.py"]
GiB = 1024**3
SHARED = {"model": "llama-3.1-70b", "tp": "8", "pp": "4", "vpp": "5", "dp": "2", "seq_len": "8192",
          "recompute": "selective", "gpu": "h100-80"}
SHARED_CONFIG = {"model": "llama-3.1-70b", "training": {"seq_len": 8192, "recompute": "selective"},
                 "parallel": {"tp": 8, "pp": 4, "vpp": 5, "dp": 2}}  # gpu h100-80 is the default


def _app(query: dict | None = None) -> AppTest:
    at = AppTest.from_file(APP, default_timeout=60)
    for key, value in (query or {}).items():
        at.query_params[key] = value
    return at.run()


def _metric(at: AppTest, label: str) -> str:
    return next(m.value for m in at.metric if m.label == label)


def _gib(n: int) -> str:
    return f"{n / GiB:,.2f} GiB"


def _no_exception(at: AppTest) -> None:
    assert not at.exception, [e.value for e in at.exception]


# --- every page renders ---------------------------------------------------------------------------

@pytest.mark.parametrize("query", [{}, {"model": "mixtral-8x7b", "tp": "2", "ep": "2", "dp": "2"}],
                         ids=["defaults", "moe"])
def test_every_page_renders(query):
    at = _app(query)
    _no_exception(at)
    titles = []
    for page in PAGES:
        at.switch_page(page).run()
        _no_exception(at)
        titles.append(at.title[0].value)
        assert not [e for e in at.error if "cannot be estimated" in e.value], [e.value for e in at.error]
    assert titles == ["Will it fit?", "Roofline", "Compare scenarios", "Presets"]


def test_totals_come_from_the_estimator():
    at = _app()
    est = estimate_config({"model": fields.DEFAULT_MODEL})
    assert _metric(at, "Device total per GPU") == _gib(est.device_total_bytes)
    assert _metric(at, "Allocated peak") == _gib(est.allocated_peak_bytes)
    assert _metric(at, f"Capacity ({est.fit.gpu})") == _gib(est.fit.capacity_bytes)
    charts = at.get("arrow_vega_lite_chart") or at.get("vega_lite_chart")
    assert charts, "the Memory page draws its charts"


def test_a_widget_change_changes_the_totals():
    at = _app()
    before = _metric(at, "Device total per GPU")
    at.number_input(key="tp").set_value(4).run()
    _no_exception(at)
    after = _metric(at, "Device total per GPU")
    assert after != before
    est = estimate_config({"model": fields.DEFAULT_MODEL, "parallel": {"tp": 4}})
    assert after == _gib(est.device_total_bytes)


def test_the_configuration_survives_page_switches():
    at = _app()
    at.number_input(key="tp").set_value(4).run()
    at.selectbox(key="recompute").set_value("full").run()
    total = _metric(at, "Device total per GPU")
    for page in ["pages/roofline.py", "pages/compare.py", "pages/presets.py", "pages/memory.py"]:
        at.switch_page(page).run()
        _no_exception(at)
        assert at.number_input(key="tp").value == 4
        assert at.selectbox(key="recompute").value == "full"
    assert _metric(at, "Device total per GPU") == total


def test_query_parameters_prefill_every_page():
    at = _app(SHARED)
    _no_exception(at)
    assert not at.warning, [w.value for w in at.warning]
    est = estimate_config(SHARED_CONFIG)
    assert _metric(at, "Device total per GPU") == _gib(est.device_total_bytes)
    for page in PAGES:
        at.switch_page(page).run()
        _no_exception(at)
        assert at.number_input(key="tp").value == 8
        assert at.number_input(key="vpp").value == 5
        assert at.number_input(key="seq_len").value == 8192
        assert at.selectbox(key="recompute").value == "selective"
        assert at.selectbox(key="_preset").value == "llama-3.1-70b"
        assert at.session_state["_current"].config == SHARED_CONFIG
    at.switch_page("pages/memory.py").run()
    assert _metric(at, "Device total per GPU") == _gib(est.device_total_bytes)


def test_a_bad_query_parameter_warns_and_falls_back():
    at = _app({"model": "llama-3.1-8b", "tp": "abc", "recompute": "sometimes", "bogus": "1", "dp": "2"})
    _no_exception(at)
    warnings = " ".join(w.value for w in at.warning)
    assert "tp='abc'" in warnings and "recompute='sometimes'" in warnings and "'bogus'" in warnings
    assert at.number_input(key="tp").value == 1
    assert at.selectbox(key="recompute").value == "none"
    assert at.number_input(key="dp").value == 2  # the good one is kept


def test_an_unknown_model_in_the_link_warns():
    at = _app({"model": "no-such-model"})
    _no_exception(at)
    assert any("no-such-model" in w.value for w in at.warning)
    assert at.selectbox(key="_preset").value == fields.DEFAULT_MODEL


def test_a_custom_architecture_in_the_link():
    arch = {"hidden_size": "1024", "num_layers": "8", "num_attention_heads": "16", "vocab_size": "32000",
            "intermediate_size": "4096"}
    at = _app({"model": "custom", **arch})
    _no_exception(at)
    assert at.session_state["_current"].model.source == "custom"
    expected = estimate_config({"model": {k: int(v) for k, v in arch.items()}})
    assert _metric(at, "Device total per GPU") == _gib(expected.device_total_bytes)


def test_an_impossible_setting_is_explained_next_to_the_inputs():
    at = _app({"model": "llama-3.1-8b", "tp": "3"})  # 32 heads do not split over 3 GPUs
    _no_exception(at)
    sidebar_errors = [e.value for e in at.sidebar.error]
    assert sidebar_errors and "Tensor parallel (TP)" in sidebar_errors[0]
    assert any("cannot be estimated" in e.value for e in at.main.error)
    assert not at.metric  # no totals for a configuration that does not exist


def test_use_a_model_preset_opens_memory():
    at = _app()
    at.switch_page("pages/presets.py").run()
    at.selectbox(key="preset_pick").set_value("mixtral-8x7b").run()
    at.button(key="preset_use").click().run()
    _no_exception(at)
    assert at.title[0].value == "Will it fit?"
    assert at.selectbox(key="_preset").value == "mixtral-8x7b"
    est = estimate_config({"model": "mixtral-8x7b"})
    assert _metric(at, "Device total per GPU") == _gib(est.device_total_bytes)


def test_use_a_recipe_loads_the_whole_configuration():
    from estimator.presets import list_recipes

    recipe = list_recipes()[0]
    at = _app()
    at.switch_page("pages/presets.py").run()
    at.button(key=f"recipe_{recipe.id}").click().run()
    _no_exception(at)
    assert at.title[0].value == "Will it fit?"
    est = estimate_config(recipe.config)
    assert _metric(at, "Device total per GPU") == _gib(est.device_total_bytes)


def test_save_and_use_my_preset():
    at = _app({"model": "qwen3-8b", "tp": "2"})
    at.switch_page("pages/presets.py").run()
    at.text_input(key="my_preset_name").set_value("mine").run()
    at.button(key="my_preset_save").click().run()
    saved = at.session_state["_user_presets"]
    assert [e["name"] for e in saved] == ["mine"]
    assert saved[0]["config"] == {"model": "qwen3-8b", "parallel": {"tp": 2}}
    at.number_input(key="tp").set_value(1).run()
    at.button(key=f"my_use_{saved[0]['id']}").click().run()
    _no_exception(at)
    assert at.number_input(key="tp").value == 2


def test_compare_scenarios():
    at = _app()
    at.switch_page("pages/compare.py").run()
    at.text_input(key="scn_new_name").set_value("baseline").run()
    at.button(key="scn_add").click().run()
    at.number_input(key="tp").set_value(2).run()
    at.button(key="scn_add").click().run()
    _no_exception(at)
    entries = at.session_state["_scenarios"]
    assert [e["name"] for e in entries] == ["baseline", "Scenario 2"]
    assert entries[1]["config"]["parallel"] == {"tp": 2}
    # rename, then load the first one back into the sidebar
    at.text_input(key=f"scn_name_{entries[1]['id']}").set_value("TP2").run()
    assert at.session_state["_scenarios"][1]["name"] == "TP2"
    at.button(key=f"scn_load_{entries[0]['id']}").click().run()
    _no_exception(at)
    assert at.number_input(key="tp").value == 1
    tables = " ".join(str(df.value.to_dict()) for df in at.dataframe)
    assert "Tensor parallel (TP)" in tables  # the settings that differ
    at.button(key=f"scn_rm_{entries[0]['id']}").click().run()
    assert [e["name"] for e in at.session_state["_scenarios"]] == ["TP2"]


def test_compare_holds_at_most_six():
    at = _app()
    at.switch_page("pages/compare.py").run()
    for _ in range(6):
        at.button(key="scn_add").click().run()
    assert len(at.session_state["_scenarios"]) == 6
    assert at.button(key="scn_add").disabled


def test_importing_a_configuration_file():
    at = _app()
    at.session_state["_pending"] = (SHARED_CONFIG, "a file")
    at.run()
    _no_exception(at)
    assert at.session_state["_current"].config == SHARED_CONFIG
    assert any("Loaded a file" in s.value for s in at.sidebar.success)
    at.session_state["_pending"] = ({"model": "llama-3.1-8b", "parallel": {"tpp": 2}}, "a bad file")
    at.run()
    assert any("Could not load a bad file" in e.value for e in at.sidebar.error)
    assert at.session_state["_current"].config == SHARED_CONFIG  # unchanged


@pytest.fixture
def loopback_hub(tmp_path, monkeypatch):
    """The real huggingface_hub client against tests/hub_server.py on 127.0.0.1, never the internet."""
    import sys

    import huggingface_hub.constants as constants
    sys.path.insert(0, str(Path(__file__).parent))
    from hub_server import FakeHub, safetensors_bytes

    server = FakeHub().start()
    tiny = {"model_type": "llama", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
            "num_attention_heads": 4, "num_key_value_heads": 4, "vocab_size": 100, "tie_word_embeddings": False}
    # stores only the embedding (6,400 parameters): a mismatch the app must flag
    server.add("example-org/tiny-test-model", {"config.json": tiny,
               "model.safetensors": safetensors_bytes({"model.embed_tokens.weight": ("BF16", [100, 64])})})
    for name in ("HF_TOKEN", "HF_HUB_OFFLINE", "HF_HUB_CACHE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.setenv("HF_ENDPOINT", server.endpoint)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hf" / "hub"))
    yield tiny
    server.stop()


def test_fetch_a_model_from_the_hub(loopback_hub):
    from estimator.hf_config import architecture_from_hf_config

    arch, _ = architecture_from_hf_config(loopback_hub)
    computed = parameter_counts(arch).total
    at = _app()
    at.session_state["_src"] = "HF Hub"
    at.run()
    at.text_input(key="_hub_text").set_value("example-org/missing-model").run()
    at.button(key="_hub_fetch").click().run()
    assert any("missing-model" in e.value for e in at.sidebar.error)
    at.text_input(key="_hub_text").set_value("example-org/tiny-test-model").run()
    at.button(key="_hub_fetch").click().run()
    _no_exception(at)
    cur = at.session_state["_current"]
    assert cur.model.source == "hub" and cur.params["model"] == "example-org/tiny-test-model"
    # the computed count beside the stored one, and the mismatch flagged
    assert any(f"{computed:,} parameters computed" in c.value and "6,400 stored" in c.value
               for c in at.sidebar.caption)
    assert any("The checkpoint stores 6,400 parameters" in w.value for w in at.sidebar.warning)
    config = {"model": {"name": "example-org/tiny-test-model", "hidden_size": 64, "num_layers": 2,
                        "num_attention_heads": 4, "intermediate_size": 128, "vocab_size": 100}}
    assert _metric(at, "Device total per GPU") == _gib(estimate_config(config).device_total_bytes)
    # and a link naming a Hub model fetches it; a missing one warns
    at2 = _app({"model": "example-org/tiny-test-model"})
    assert at2.session_state["_current"].model.source == "hub"
    at3 = _app({"model": "example-org/missing-model"})
    assert any("could not be loaded" in w.value for w in at3.warning)


# --- the URL contract, as plain functions ---------------------------------------------------------

def test_url_params_follow_the_contract():
    model = fields.ModelChoice(source="preset", preset="llama-3.1-70b")
    values = {f.name: f.default for f in fields.ALL_FIELDS}
    values.update(tp=8, pp=4, vpp=5, dp=2, seq_len=8192, recompute="selective", gpu="h100-80")
    params = fields.url_params(model, values)
    assert params == {"model": "llama-3.1-70b", "seq_len": "8192", "recompute": "selective", "tp": "8", "pp": "4",
                      "vpp": "5", "dp": "2"}  # gpu=h100-80 is the default
    assert fields.parse_url(params).values == {"seq_len": 8192, "recompute": "selective", "tp": 8, "pp": 4,
                                               "vpp": 5, "dp": 2}


def test_every_contract_field_has_a_widget():
    from estimator.config import SECTIONS
    import dataclasses

    names = {f.name for cls in SECTIONS.values() for f in dataclasses.fields(cls)} - fields.NOT_WIDGETS
    assert names <= set(fields.BY_NAME)


def test_config_round_trip_through_widget_values():
    values = fields.ui_values_from_config(SHARED_CONFIG)
    model = fields.ModelChoice(source="preset", preset="llama-3.1-70b")
    assert fields.config_dict(model, values) == SHARED_CONFIG
    cfg = {"model": "llama-3.1-8b", "training": {"master_weights": False, "grad_dtype": "bf16"},
           "parallel": {"zero_stage": 1, "sequence_parallel": True, "tp": 2}}
    assert fields.config_dict(model.__class__(preset="llama-3.1-8b"), fields.ui_values_from_config(cfg)) == cfg


def test_parse_url_reports_cross_field_errors():
    state = fields.parse_url({"model": "llama-3.1-8b", "vpp": "4"})  # interleaving needs pp > 1
    assert "vpp" in state.bad and "vpp" not in state.values
    assert "Virtual stages per rank" in state.warnings[0]


def test_bench_script_runs():
    # the bench is a script, not a timed test: it must at least import
    source = (ROOT / "bench" / "bench_app.py").read_text()
    assert "AppTest" in source


def test_memory_page_shows_the_estimators_activation_ledger():
    at = _app(SHARED)
    _no_exception(at)
    assert any("What one layer keeps" in e.label for e in at.expander)
    ledger = estimate_config(SHARED_CONFIG).activation_ledger
    table = next(df.value for df in at.dataframe if "Tensor" in df.value.columns)
    assert list(table["Tensor"]) == [line.name for line in ledger]
    assert table["MiB"].sum() * 2**20 == pytest.approx(sum(line.bytes for line in ledger))


def test_a_run_that_does_not_fit_gets_a_plan_and_apply_loads_it():
    from estimator.advice import plan_to_fit
    from estimator import load_config
    query = {"model": "llama-3.1-8b", "seq_len": "32768", "global_batch_size": "8", "dp": "8", "zero_stage": "1"}
    config = {"model": "llama-3.1-8b", "training": {"seq_len": 32768, "global_batch_size": 8},
              "parallel": {"dp": 8, "zero_stage": 1}}
    at = _app(query)
    _no_exception(at)
    assert any(h.value == "What to change" for h in at.subheader)
    steps = plan_to_fit(load_config(config))
    at.button(key=f"plan_{len(steps)}").click().run()
    _no_exception(at)
    final = steps[-1]
    assert _metric(at, "Device total per GPU") == _gib(final.device_total_bytes)
    assert at.session_state["_current"].config == final.config.to_dict()
