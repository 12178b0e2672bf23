"""The Streamlit app, driven in-process with AppTest (no browser), and its URL parsing."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("streamlit")
from streamlit.testing.v1 import AppTest  # noqa: E402

from estimator import estimate_config, parameter_counts  # noqa: E402
from estimator.spec.wording import verdict_word  # noqa: E402
from ui import fields  # noqa: E402
from ui import keys as K  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
APP = str(ROOT / "app.py")
PAGES = ["pages/memory.py", "pages/roofline.py", "pages/compare.py", "pages/presets.py", "pages/guide.py"]
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


def _open(at: AppTest, *groups: str) -> AppTest:
    """Open sidebar groups, as a click on each does: a closed group draws no widgets."""
    for group in groups:
        at.session_state[K.group(group)] = True
    return at.run()


def _metric(at: AppTest, label: str) -> str:
    return next(m.value for m in at.metric if m.label == label)


def _gib(n: int) -> str:
    return f"{n / GiB:,.2f} GiB"


def _no_exception(at: AppTest) -> None:
    assert not at.exception, [e.value for e in at.exception]


def _searching(at: AppTest) -> bool:
    """A planner search is waiting or running in a worker process (its panel's Stop button is shown)."""
    return any(b.key == K.SEARCH_STOP for b in at.button)


def _settled(at: AppTest, timeout_s: float = 240) -> AppTest:
    """Run the page again until its search has answered (a browser's panel polls; AppTest does not)."""
    import time
    deadline = time.monotonic() + timeout_s
    while _searching(at):
        assert time.monotonic() < deadline, "the search did not answer in time"
        time.sleep(0.5)
        at.run()
    _no_exception(at)
    return at


# --- every page renders ---------------------------------------------------------------------------

@pytest.mark.parametrize("query", [{}, {"model": "mixtral-8x7b", "tp": "2", "ep": "2", "dp": "2"},
                                   {"model": "qwen3-next-80b-a3b", "tp": "2"}, {"model": "nemotron-h-8b"},
                                   {"model": "jamba-mini-1.5", "tp": "2"}, {"model": "falcon-h1-7b"},
                                   {"model": "qwen2.5-vl-7b", "images_per_sample": "2", "image_size": "448"},
                                   {"model": "llama-4-scout", "tp": "4", "ep": "4", "dp": "4"}],
                         ids=["defaults", "moe", "linear-attention hybrid", "state-space hybrid", "mamba-1 hybrid",
                              "parallel hybrid", "vision-language", "chunked attention (llama 4)"])
def test_every_page_renders(query):
    at = _app(query)
    _no_exception(at)
    titles = []
    for page in PAGES:
        at.switch_page(page).run()
        _no_exception(at)
        titles.append(at.title[0].value)
        assert not [e for e in at.error if "cannot be estimated" in e.value], [e.value for e in at.error]
    assert titles == ["Will it fit?", "Roofline", "Compare scenarios", "Presets", "How to read this"]


def test_totals_come_from_the_estimator():
    at = _app()
    est = estimate_config({"model": fields.DEFAULT_MODEL})
    assert _metric(at, "Device total per GPU") == _gib(est.device_total_bytes)
    assert _metric(at, "Allocated peak") == _gib(est.allocated_peak_bytes)
    assert _metric(at, "Reserved peak") == _gib(est.reserved_peak_bytes)
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
    at = _open(_app(), "Optimizer and memory savers")
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
    at = _open(_app(SHARED), "Optimizer and memory savers")
    _no_exception(at)
    assert not at.sidebar.warning, [w.value for w in at.sidebar.warning]  # no link warnings
    est = estimate_config(SHARED_CONFIG)
    assert _metric(at, "Device total per GPU") == _gib(est.device_total_bytes)
    for page in PAGES:
        at.switch_page(page).run()
        _no_exception(at)
        assert at.number_input(key="tp").value == 8
        assert at.number_input(key="vpp").value == 5
        assert at.number_input(key="seq_len").value == 8192
        assert at.selectbox(key="recompute").value == "selective"
        assert at.selectbox(key=K.PRESET).value == "llama-3.1-70b"
        assert at.session_state[K.CURRENT].config == SHARED_CONFIG
    at.switch_page("pages/memory.py").run()
    assert _metric(at, "Device total per GPU") == _gib(est.device_total_bytes)


def test_a_bad_query_parameter_warns_and_falls_back():
    at = _open(_app({"model": "llama-3.1-8b", "tp": "abc", "recompute": "sometimes", "bogus": "1", "dp": "2"}),
               "Optimizer and memory savers")
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
    assert at.selectbox(key=K.PRESET).value == fields.DEFAULT_MODEL


def test_a_custom_architecture_in_the_link():
    arch = {"hidden_size": "1024", "num_layers": "8", "num_attention_heads": "16", "vocab_size": "32000",
            "intermediate_size": "4096"}
    at = _app({"model": "custom", **arch})
    _no_exception(at)
    assert at.session_state[K.CURRENT].model.source == "custom"
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
    assert at.selectbox(key=K.PRESET).value == "mixtral-8x7b"
    est = estimate_config({"model": "mixtral-8x7b"})
    assert _metric(at, "Device total per GPU") == _gib(est.device_total_bytes)


def test_use_a_recipe_loads_the_whole_configuration():
    from estimator.models.presets import list_recipes

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
    saved = at.session_state[K.USER_PRESETS]
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
    entries = at.session_state[K.SCENARIOS]
    assert [e["name"] for e in entries] == ["baseline", "Scenario 2"]
    assert entries[1]["config"]["parallel"] == {"tp": 2}
    # rename, then load the first one back into the sidebar
    at.text_input(key=f"scn_name_{entries[1]['id']}").set_value("TP2").run()
    assert at.session_state[K.SCENARIOS][1]["name"] == "TP2"
    at.button(key=f"scn_load_{entries[0]['id']}").click().run()
    _no_exception(at)
    assert at.number_input(key="tp").value == 1
    tables = " ".join(str(df.value.to_dict()) for df in at.dataframe)
    assert "Tensor parallel (TP)" in tables  # the settings that differ
    at.button(key=f"scn_rm_{entries[0]['id']}").click().run()
    assert [e["name"] for e in at.session_state[K.SCENARIOS]] == ["TP2"]


def test_compare_holds_at_most_six():
    at = _app()
    at.switch_page("pages/compare.py").run()
    for _ in range(6):
        at.button(key="scn_add").click().run()
    assert len(at.session_state[K.SCENARIOS]) == 6
    assert at.button(key="scn_add").disabled


def test_importing_a_configuration_file():
    at = _app()
    at.session_state[K.PENDING] = (SHARED_CONFIG, "a file")
    at.run()
    _no_exception(at)
    assert at.session_state[K.CURRENT].config == SHARED_CONFIG
    assert any("Loaded a file" in s.value for s in at.sidebar.success)
    at.session_state[K.PENDING] = ({"model": "llama-3.1-8b", "parallel": {"tpp": 2}}, "a bad file")
    at.run()
    assert any("Could not load a bad file" in e.value for e in at.sidebar.error)
    assert at.session_state[K.CURRENT].config == SHARED_CONFIG  # unchanged


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
    from estimator.models.hf_config import architecture_from_hf_config

    arch, _ = architecture_from_hf_config(loopback_hub)
    computed = parameter_counts(arch).total
    at = _app()
    at.session_state[K.SOURCE] = "HF Hub"
    at.run()
    at.text_input(key=K.HUB_TEXT).set_value("example-org/missing-model").run()
    at.button(key=K.HUB_FETCH).click().run()
    assert any("missing-model" in e.value for e in at.sidebar.error)
    at.text_input(key=K.HUB_TEXT).set_value("example-org/tiny-test-model").run()
    at.button(key=K.HUB_FETCH).click().run()
    _no_exception(at)
    cur = at.session_state[K.CURRENT]
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
    assert at2.session_state[K.CURRENT].model.source == "hub"
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
    from estimator.spec.config import SECTIONS
    import dataclasses

    from estimator.spec.field import NESTED
    from estimator.spec.fields import SETTINGS
    names = {f.name for cls in SECTIONS.values() for f in dataclasses.fields(cls)} - fields.NOT_WIDGETS - set(NESTED)
    assert names <= set(fields.BY_NAME)
    # an object's fields (training.adapter) by their flat names
    assert {f.key for f in SETTINGS if f.section in NESTED} <= set(fields.BY_NAME)


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
    from estimator.search.advice import plan_to_fit
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
    assert at.session_state[K.CURRENT].config == final.config.to_dict()


# --- hostile links ----------------------------------------------------------------------------------

def _plain(text: str) -> str:
    """A message as the page shows it (markdown escapes removed)."""
    return text.replace("\\", "")


HOSTILE = [
    ("tp", "1" * 100_000, "Tensor parallel (TP)"),
    ("seq_len", "1e30", "Sequence length (tokens)"),
    ("seq_len", "-5", "Sequence length (tokens)"),
    ("tp", "abc", "Tensor parallel (TP)"),
    ("dropout", "nan", "Dropout"),
    ("moe_capacity_factor", "inf", "MoE capacity factor"),
    ("zero_stage", "7", "ZeRO / sharding stage"),
    ("gpu", "<script>", "GPU"),
    ("model", "../../etc/passwd", "Model"),
    ("model", "org/name@/tmp/x", "Model"),
    ("recompute_modules", "bogus", "Recomputed modules (selective)"),
]


@pytest.mark.parametrize("name,text,label", HOSTILE, ids=[f"{n}={t[:12]}" for n, t, _ in HOSTILE])
def test_a_hostile_link_value_is_reported_and_left_at_its_default(name, text, label, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    at = _app({"model": "llama-3.1-8b", name: text, "dp": "2"})
    _no_exception(at)
    warnings = [_plain(w.value) for w in at.sidebar.warning]
    assert len(warnings) == 1 and label in warnings[0], warnings
    assert len(warnings[0]) < 600  # the value is shown cut, never 100,000 characters
    # the bad parameter is left out of the URL, the good one is kept
    assert at.query_params.get("dp") == "2" and at.number_input(key="dp").value == 2
    if name == "model":
        assert at.query_params.get("model") == fields.DEFAULT_MODEL
        assert at.selectbox(key=K.PRESET).value == fields.DEFAULT_MODEL
    else:
        assert name not in at.query_params
        f = fields.BY_NAME[name]
        _open(at, f.group)
        widget = {"int": at.number_input, "float": at.number_input, "select": at.selectbox, "choice": at.selectbox,
                  "multi": at.multiselect, "choices": at.multiselect}[f.kind](key=name)
        assert widget.value == f.default
    est = estimate_config({"model": "llama-3.1-8b", "parallel": {"dp": 2}})
    assert _metric(at, "Device total per GPU") == _gib(est.device_total_bytes)


def test_an_endless_unknown_parameter_name_is_reported_in_one_short_line():
    at = _app({"x" * 10_000: "1", "tp": "2"})
    _no_exception(at)
    warnings = [w.value for w in at.sidebar.warning]
    assert warnings == ["An unknown link parameter (a name of 10,000 characters) was ignored."]
    assert list(at.query_params) == ["tp", "model"] or set(at.query_params) == {"tp", "model"}
    assert at.number_input(key="tp").value == 2


def test_a_link_value_reaches_the_widget_in_its_canonical_form():
    at = _open(_app({"dropout": "0.10", "tp": "02"}), "Optimizer and memory savers")
    _no_exception(at)
    assert not at.warning
    assert at.query_params["dropout"] == "0.1" and at.query_params["tp"] == "2"
    assert at.number_input(key="dropout").value == 0.1 and at.number_input(key="tp").value == 2


def test_link_values_cannot_inject_markdown():
    at = _app({"model": "[click](https://example.com/x)"})
    _no_exception(at)
    (warning,) = [w.value for w in at.sidebar.warning]
    # escaped brackets (no markdown link) and no bare URL for GFM to autolink: shown literally
    assert "\\[click\\]" in warning and "https" in warning and "://" not in warning


def test_an_imported_config_is_checked_like_a_link():
    at = _app()
    at.session_state[K.PENDING] = ({"model": "llama-3.1-8b", "training": {"seq_len": 10**30}}, "a file")
    at.run()
    _no_exception(at)
    assert any("Could not load a file" in e.value for e in at.sidebar.error)
    assert at.number_input(key="seq_len").value == fields.BY_NAME["seq_len"].default


# --- the Hugging Face source ----------------------------------------------------------------------

def test_hf_hub_before_a_fetch_is_a_calm_hint_on_every_page():
    at = _app({"model": "qwen3-8b"})
    at.segmented_control(key=K.SOURCE).set_value("HF Hub").run()
    for page in PAGES:
        at.switch_page(page).run()
        _no_exception(at)
        assert not at.error, [e.value for e in at.error]
        assert "model" not in at.query_params  # the URL no longer claims the preset
        assert at.session_state[K.CURRENT].model_label == "no model yet"
    at.switch_page("pages/memory.py").run()
    assert any("press **Fetch**" in i.value for i in at.main.info)
    assert any("press **Fetch**" in c.value for c in at.sidebar.caption)
    assert "qwen3-8b" not in at.main.caption[0].value and not at.metric
    # back to the preset: the preset is used again
    at.segmented_control(key=K.SOURCE).set_value("Preset").run()
    assert at.query_params["model"] == "qwen3-8b" and at.metric


def test_a_failed_fetch_is_one_message(loopback_hub):
    at = _app()
    at.segmented_control(key=K.SOURCE).set_value("HF Hub").run()
    at.button(key=K.HUB_FETCH).click().run()  # nothing typed: still the hint, no error
    assert not at.error
    at.text_input(key=K.HUB_TEXT).set_value("example-org/missing-model").run()
    at.button(key=K.HUB_FETCH).click().run()
    _no_exception(at)
    errors = [_plain(e.value) for e in at.error]
    assert len(errors) == 1 and "example-org/missing-model" in errors[0], errors
    assert not at.warning
    # then a good one: its id in the heading and the URL, the message gone
    at.text_input(key=K.HUB_TEXT).set_value("example-org/tiny-test-model").run()
    at.button(key=K.HUB_FETCH).click().run()
    _no_exception(at)
    assert not at.error
    assert "example-org/tiny-test-model" in at.main.caption[0].value
    assert at.query_params["model"] == "example-org/tiny-test-model"
    # a failure now keeps the fetched model and says so, once
    at.text_input(key=K.HUB_TEXT).set_value("example-org/missing-model").run()
    at.button(key=K.HUB_FETCH).click().run()
    errors = [_plain(e.value) for e in at.error]
    assert len(errors) == 1 and "Still using example-org/tiny-test-model" in errors[0]
    assert at.query_params["model"] == "example-org/tiny-test-model" and at.metric


# --- errors name the field the user changed ------------------------------------------------------

def test_an_error_names_the_field_just_changed_in_its_group():
    at = _app({"model": "llama-3.1-70b", "pp": "4"})  # 80 layers: PP 4 alone is fine
    assert not at.error or not any("not possible" in e.value for e in at.error)
    at.number_input(key="vpp").set_value(3).run()  # 4 x 3 = 12 does not divide 80
    _no_exception(at)
    (message,) = [_plain(e.value) for e in at.sidebar.error]
    assert message.startswith("Virtual stages per rank (VPP) = 3 is not possible"), message
    group = next(x for x in at.sidebar.expander if x.label == "Parallel layout")
    assert [_plain(e.value) for e in group.error] == [message]
    assert any("Virtual stages per rank (VPP) = 3" in _plain(e.value) for e in at.main.error)
    at.switch_page("pages/roofline.py").run()  # the blame stays with the configuration
    assert [_plain(e.value) for e in at.sidebar.error] == [message]


def test_an_error_about_another_field_of_the_rule_names_the_changed_one():
    at = _app({"model": "llama-3.1-70b", "pp": "4", "vpp": "4"})  # 80 layers: 20 per stage, 5 per chunk
    _no_exception(at)
    assert not at.sidebar.error
    at.number_input(key="pp").set_value(8).run()  # 10 layers per stage do not split into 4 chunks
    _no_exception(at)
    (message,) = [_plain(e.value) for e in at.sidebar.error]
    assert message.startswith("Pipeline stages (PP) = 8 is not possible with Virtual stages per rank (VPP) = 4"), \
        message


def test_an_error_from_the_link_names_its_own_field():
    at = _app({"model": "llama-3.1-8b", "tp": "3"})
    (message,) = [_plain(e.value) for e in at.sidebar.error]
    assert message.startswith("Tensor parallel (TP)")


# --- the Memory page -------------------------------------------------------------------------------

def test_the_batch_assumption_is_next_to_the_totals():
    at = _app({"model": "llama-3.1-70b", "tp": "8", "pp": "4", "dp": "2"})
    _no_exception(at)
    est = estimate_config({"model": "llama-3.1-70b", "parallel": {"tp": 8, "pp": 4, "dp": 2}})
    m = est.microbatches
    gbs = m * est.training.micro_batch_size * 2
    text = f"{m:,} micro-batch{'es' if m != 1 else ''} per step (global batch {gbs:,} = auto)"
    main = [x.value for x in at.main.markdown]
    assert any(text in x for x in main), main
    # above the first metric: part of the headline, not in an expander
    assert not any(text in x.value for e in at.expander for x in e.markdown)


def test_inference_hides_the_activation_ledger():
    at = _app({"model": "llama-3.1-8b", "mode": "inference"})
    _no_exception(at)
    assert not any("What one layer keeps" in e.label for e in at.expander)


def test_the_verdict_metric_is_short():
    at = _app({"model": "llama-3.1-70b"})  # out of memory on one H100
    verdict = next(m for m in at.metric if m.label == "Verdict")
    assert verdict.value == "OOM" and "of 79.65 GiB" in verdict.delta  # the capacity of an H100


# --- the guide ---------------------------------------------------------------------------------------

def test_the_guide_explains_the_parts_and_its_serving_table_is_the_estimators():
    from ui import compute

    at = _app({"mode": "inference", "gpu": "h200"})
    at.switch_page("pages/guide.py").run()
    _no_exception(at)
    text = " ".join(m.value for m in at.markdown)
    for words in ("nvidia-smi", "max_memory_allocated", "454", "80%", "first stage holds"):
        assert words in text
    table = next(df.value for df in at.dataframe if "KV cache dtype" in df.value.columns)
    assert len(table) == len(compute.SERVING_MODELS) * 3 * 3 * 2
    for model, context, batch, kv in [("llama-3.1-8b", 131072, 8, "fp8"), ("llama-3.1-70b", 32768, 32, "bf16")]:
        row = table[(table["Model"] == model) & (table["Context (tokens)"] == context) & (table["Batch"] == batch)
                    & (table["KV cache dtype"] == kv)].iloc[0]
        est = estimate_config({"model": model, "training": {"mode": "inference", "seq_len": context,
                                                            "micro_batch_size": batch, "kv_cache_dtype": kv},
                               "hardware": {"gpu": "h200"}})
        assert row["Total per GPU (GiB)"] == est.device_total_bytes / GiB
        assert row["KV cache (GiB)"] == est.stages[0].component("kv_cache").bytes / GiB
        assert row["Verdict"] == verdict_word(est.fit.verdict)  # one spelling of the verdicts (issue 26)


def test_the_guide_compares_other_calculators_examples_with_the_estimate():
    from estimator.memory import references

    at = _app({})
    at.switch_page("pages/guide.py").run()
    _no_exception(at)
    tables = [df.value for df in at.dataframe if "As printed" in df.value.columns]
    assert len(tables) == 4  # the guide's setups A and B, the 8B calculator, the mode-based calculator
    rl = tables[0].set_index("Item")
    kv = {r.item: r for r in references.guide_rl("A").rows}["KV cache"]
    assert rl.loc["KV cache", "Theirs"].startswith("24.50 GiB") and not rl.loc["KV cache", "Reproduced"]
    assert rl.loc["KV cache", "This estimate"].startswith(f"{kv.ours / GiB:,.2f} GiB")
    assert "no GQA" in rl.loc["KV cache", "Why they differ"]


# --- state keys live in ui/keys.py -------------------------------------------------------------------

def test_session_state_keys_are_named_in_one_place():
    import re

    # a string literal as a session-state key or a widget key; a configuration field's name (the
    # URL parameter, from ui.fields) is allowed
    literal = re.compile(r"""(?:session_state|\bss)(?:\[|\.get\(|\.pop\(|\.setdefault\()\s*f?["']([^"']*)["']""")
    keyword = re.compile(r"""\bkey=f?["']([^"']*)["']""")
    offenders = []
    for path in [*ROOT.glob("ui/*.py"), *ROOT.glob("pages/*.py"), ROOT / "app.py"]:
        if path.name == "exports.py":
            continue
        for n, line in enumerate(path.read_text().splitlines(), 1):
            found = literal.findall(line) + keyword.findall(line)
            # dl_*: export_buttons' download buttons (another module's)
            if [k for k in found if k not in fields.BY_NAME and not k.startswith("dl_")]:
                offenders.append(f"{path.relative_to(ROOT)}:{n}: {line.strip()}")
    assert not offenders, offenders


def test_no_private_streamlit_flag_is_patched():
    source = (ROOT / "ui" / "state.py").read_text()
    code = "\n".join(line for line in source.splitlines() if not line.lstrip().startswith("#"))
    assert "PagesManager.uses_pages_directory =" not in code


def test_the_memory_page_writes_its_downloads_only_when_clicked():
    # a rerun shows the three buttons without building a CSV, JSON or PDF: each button holds a
    # deferred file (its bytes are made on click; tests/e2e downloads and checks all three)
    at = _app(SHARED)
    _no_exception(at)
    buttons = at.get("download_button")
    assert [b.proto.label for b in buttons] == ["Breakdown (CSV)", "Configuration (JSON)", "Report (PDF)"]
    assert all(b.proto.HasField("deferred_file_id") and not b.proto.url for b in buttons)


# --- the Planner page ---------------------------------------------------------------------------------
# Its keys are named in pages/planner.py (a page script cannot be imported here: importing it runs it).

def _planner(query: dict | None = None, gpus: int | None = None) -> AppTest:
    """The app opened on the Planner page, with `gpus` typed in, after pressing Plan."""
    at = _app(query)
    at.switch_page("pages/planner.py").run()
    _no_exception(at)
    if gpus is not None:
        at.number_input(key="planner_gpus").set_value(gpus).run()
    at.button(key="planner_run").click().run()
    return _settled(at)


def _direct_plan(config: dict, gpus: int):
    from estimator import load_config
    from estimator.search.planner import plan
    cfg = load_config(config)
    return plan(cfg.architecture, cfg.training, cfg.hardware, gpus, comm_overlap=cfg.parallel.comm_overlap)


def test_planner_page_renders_for_the_default_model():
    at = _app()
    at.switch_page("pages/planner.py").run()
    _no_exception(at)
    assert at.title[0].value == "Planner"
    assert not at.error, [e.value for e in at.error]
    # the GPU count starts at the sidebar's layout (TP x PP x CP x DP = 1 for the defaults), margin at 80%
    assert at.number_input(key="planner_gpus").value == 1
    assert at.number_input(key="planner_per_node").value == 8
    assert at.slider(key="planner_margin").value == 80
    assert any("Press **Plan**" in i.value for i in at.info)


def test_planner_page_says_what_the_framework_runs():
    """The Planner searches only what the framework's launch configuration names (estimator/search/stacks.py), and
    says so: the HF Trainer's DDP lists data parallelism only, Megatron its splits and first-n recompute."""
    from estimator import Training
    from estimator.search.stacks import in_words
    for framework in ("hf", "megatron"):
        at = _app({"framework": framework})
        at.switch_page("pages/planner.py").run()
        _no_exception(at)
        words = in_words(Training(framework=framework))
        assert any(words in c.value and f"**{framework}** runs" in c.value for c in at.caption), \
            [c.value for c in at.caption]
    assert "data parallelism only" in in_words(Training(framework="hf"))


def test_planner_page_plans_a_parallel_hybrid():
    """Falcon-H1 7B (issue 28) on 8 GPUs: the page's table is the planner's; its one Mamba group keeps TP at 1."""
    at = _planner({"model": "falcon-h1-7b", "dp": "8"})
    direct = _direct_plan({"model": "falcon-h1-7b"}, 8)
    table = next(df.value for df in at.dataframe if "Tokens/s per GPU" in df.value.columns)
    assert len(table) == len(direct.layouts) > 0
    assert table["Tokens/s per GPU"][0] == direct.layouts[0].tokens_per_s_per_gpu
    assert set(table["TP"]) == {1}


def test_planner_table_is_the_planners_and_use_this_layout_loads_it():
    # DP 8 in the sidebar: the GPU count follows the layout, 8
    at = _planner({"model": "llama-3.1-8b", "dp": "8"})
    assert at.number_input(key="planner_gpus").value == 8
    direct = _direct_plan({"model": "llama-3.1-8b"}, 8)
    table = next(df.value for df in at.dataframe if "Tokens/s per GPU" in df.value.columns)
    assert len(table) == len(direct.layouts)
    first = direct.layouts[0]
    assert table["Tokens/s per GPU"][0] == first.tokens_per_s_per_gpu
    assert table["GiB per GPU"][0] == first.device_total_bytes / GiB
    # every row is one of the planner's layouts (compared as sets: layouts tied on speed and memory
    # may come in either order)
    shown = sorted(zip(table["Tokens/s per GPU"], table["GiB per GPU"], table["MFU"], table["Pareto"], table["TP"],
                       table["PP"], table["CP"], table["DP"], table["ZeRO"], table["Micro-batch"], table["Loss"]))
    assert shown == sorted((x.tokens_per_s_per_gpu, x.device_total_bytes / GiB, x.mfu, x.pareto, x.parallel.tp,
                            x.parallel.pp, x.parallel.cp, x.parallel.dp, x.parallel.zero_stage,
                            x.training.micro_batch_size, x.training.loss) for x in direct.layouts)
    searched = next(c.value for c in at.caption if c.value.startswith("Searched"))
    assert f"**{direct.searched:,}** layouts" in searched
    assert at.get("arrow_vega_lite_chart") or at.get("vega_lite_chart"), "the Pareto chart is drawn"
    # the first row's layout under the distributed optimizer (ZeRO 1, whose allocator the Memory page replays;
    # Megatron-FSDP's ZeRO 2 is not), loaded into the shared configuration, is what the Memory page shows
    pick = next(i for i, zero in enumerate(table["ZeRO"]) if zero == 1)
    row = table.iloc[pick]
    at.selectbox(key="planner_pick").set_value(pick + 1).run()
    at.button(key="planner_use").click().run()
    _no_exception(at)
    assert at.title[0].value == "Will it fit?"
    est = estimate_config(at.session_state[K.CURRENT].config)
    # the plan judges by the flat share (memory/reserved.FLAT_FOR_SEARCH); the Memory page shows the estimate as
    # reported, Megatron's allocator replayed (memory/megatron_replay.py)
    from estimator.memory.memory import estimate
    from estimator.models.loading import load_config
    cfg = load_config(at.session_state[K.CURRENT].config)
    judged = estimate(cfg.architecture, cfg.training, cfg.parallel, cfg.hardware, replay=False)
    assert judged.device_total_bytes / GiB == row["GiB per GPU"]
    assert est.stages[est.peak_stage].cache is not None
    assert _metric(at, "Device total per GPU") == _gib(est.device_total_bytes)
    assert (est.parallel.tp, est.parallel.pp, est.parallel.cp, est.parallel.dp, est.parallel.zero_stage,
            est.training.micro_batch_size, est.training.loss) == \
        (row["TP"], row["PP"], row["CP"], row["DP"], row["ZeRO"], row["Micro-batch"], row["Loss"])


def test_planner_writes_the_chosen_layout_as_a_launch_config():
    from estimator.importers import estimate_imported, import_config
    at = _planner({"model": "llama-3.1-8b", "framework": "deepspeed", "dp": "8"})
    table = next(df.value for df in at.dataframe if "Tokens/s per GPU" in df.value.columns)
    # a DeepSpeed run: the Trainer's arguments with their DeepSpeed dict, axolotl's or LLaMA-Factory's YAML
    kind = at.selectbox(key="planner_emit_kind")
    assert kind.value == "hf" and len(kind.options) == 3
    # every layout is one the Trainer's arguments can state (search/stacks.py): recompute on every layer or none
    assert set(table["Recompute"]) <= {"none", "full (all)"} and set(table["TP"]) == set(table["PP"]) == {1}
    # its loss is "fused" (the planner's, as cheap as "chunked" here): Liger's cross-entropy kernel alone, which
    # the Trainer (liger_kernel_config) and axolotl (liger_cross_entropy) can state and LLaMA-Factory cannot (its
    # enable_liger_kernel is Liger's defaults: training.liger_kernel with the fused linear cross-entropy)
    assert table["Loss"][0] == "fused"
    for name, first_line in (("hf", "model_name_or_path:"), ("axolotl", "base_model:")):
        at.selectbox(key="planner_emit_kind").set_value(name).run()
        _no_exception(at)
        text = next(c.value for c in at.code if c.value.startswith("# written by llm-memory"))
        assert first_line in text
        # the text offered reads back to the first layout of the table
        assert estimate_imported(import_config(text, gpus=8)).device_total_bytes / GiB == table["GiB per GPU"][0]
        assert [b.proto.label for b in at.get("download_button")] == ["Download"]
    # a layout the kind cannot write: the reason and no file; LLaMA-Factory states Liger's losses only with its
    # layer kernels (enable_liger_kernel), so it writes none of these layouts and no other layout is offered
    at.selectbox(key="planner_emit_kind").set_value("llama-factory").run()
    _no_exception(at)
    assert any("cannot write layout #1" in w.value and "Loss computation" in w.value for w in at.warning), \
        [w.value for w in at.warning]
    assert not at.get("download_button") and "planner_emit_pick" not in [b.key for b in at.button]


def test_planner_says_why_a_framework_cannot_write_the_layout():
    at = _planner({"model": "olmo-2-13b", "framework": "torchtune", "dp": "8"})
    assert at.selectbox(key="planner_emit_kind").value == "torchtune"
    assert any("cannot write layout #1" in w.value and "no builder" in w.value for w in at.warning)
    assert not at.get("download_button")


def test_planner_says_how_many_gpus_would_fit_when_none_does():
    query = {"model": "llama-3.1-405b", "dp": "8"}
    at = _app(query)
    # no chain of single changes fits: while the planner looks for the nearest layout, the Memory
    # page links to the Planner page
    links = [p.proto for p in at.get("page_link")]
    assert any("Planner" in p.label and p.page.endswith("planner") for p in links), [p.label for p in links]
    at = _planner(query)
    direct = _direct_plan({"model": "llama-3.1-405b"}, 8)
    assert not direct.layouts
    fewest = direct.smallest_fit["h100-80"]
    assert fewest
    warning = _plain(" ".join(w.value for w in at.warning))
    assert f"the fewest that fit: {fewest} x h100-80" in warning
    assert not at.dataframe or all("Tokens/s per GPU" not in df.value.columns for df in at.dataframe)
    # one click plans again on that many GPUs
    _settled(at.button(key="planner_replan").click().run())
    assert at.number_input(key="planner_gpus").value == fewest
    assert any("Tokens/s per GPU" in df.value.columns for df in at.dataframe)


def test_planner_lays_out_training_only_and_ignores_a_bad_sidebar_layout():
    at = _app({"model": "llama-3.1-8b", "mode": "inference"})
    at.switch_page("pages/planner.py").run()
    _no_exception(at)
    assert any("training runs" in i.value for i in at.info)
    # TP 3 does not divide 32 heads: the Memory page cannot estimate it, the planner sets its own TP
    at = _app({"model": "llama-3.1-8b", "tp": "3"})
    at.switch_page("pages/planner.py").run()
    _no_exception(at)
    assert not [e for e in at.main.error if "cannot" in e.value], [e.value for e in at.main.error]
    assert at.number_input(key="planner_gpus").value == 3


def test_planner_chart_spec_is_valid_vega_lite():
    import altair as alt
    from ui import charts

    rows = [{"rank": i, "GiB": g, "tokens_per_s": t, "mfu": 0.5, "step_s": 1.0, "layout": f"layout {i}",
             "set": "Pareto front" if front else "Other layouts"}
            for i, (g, t, front) in enumerate([(40.0, 900.0, True), (50.0, 1000.0, True), (55.0, 950.0, False)], 1)]
    spec = charts.planner_spec(rows, limit_gib=63.7)
    alt.LayerChart.from_dict(spec)  # raises on anything the Vega-Lite schema does not allow
    data = spec["datasets"]
    line, points = spec["layer"][0], spec["layer"][1]
    assert line["mark"]["type"] == "line" and [r["rank"] for r in data[line["data"]["name"]]] == [1, 2]
    assert len(data[points["data"]["name"]]) == 3
    assert [t["field"] for t in points["encoding"]["tooltip"]][:2] == ["rank", "layout"]


def test_offload_shows_the_host_memory_it_needs():
    """DeepSpeed ZeRO-2 with the optimizer on the CPU, Llama-3.1-8B on 8 GPUs: each process keeps
    its partition's fp32 master weights (4 B), Adam states (8 B) and fp32 gradients (4 B) in host
    memory, with DeepSpeed's bf16 copy of the partition (2 B), 18 B x 8,030,261,248 / 8 parameters, and its
    bf16 staging buffer of the largest tensor, the 128,256 x 4,096 embedding (DeepSpeed v0.19.5
    stage_1_and_2.py __init__: param_buffer_of_bit16_for_cpu_offload_groups, temp_grad_buffer_for_cpu_offload)."""
    at = _app({"model": "llama-3.1-8b", "framework": "deepspeed", "offload_optimizer": "cpu", "dp": "8",
               "zero_stage": "2"})
    assert not at.exception
    host = 18 * 8_030_261_248 / 8 + 2 * 128_256 * 4_096
    assert _metric(at, "Host RAM per GPU process") == _gib(host)
    assert _metric(at, "Host RAM per node of 8 GPUs") == _gib(8 * host)
    assert "Host memory (offload)" in [s.value for s in at.subheader]
    plain = _app({"model": "llama-3.1-8b", "framework": "deepspeed", "dp": "8", "zero_stage": "2"})
    assert "Host memory (offload)" not in [s.value for s in plain.subheader]


def test_an_adapter_fine_tune_from_the_link():
    query = {"model": "llama-3.1-70b", "framework": "hf", "seq_len": "2048", "recompute": "full",
             "adapter_method": "qlora", "adapter_rank": "64", "adapter_target_modules": "all-linear"}
    at = _app(query)
    _no_exception(at)
    est = estimate_config({"model": "llama-3.1-70b", "training": {
        "framework": "hf", "seq_len": 2048, "recompute": "full",
        "adapter": {"method": "qlora", "rank": 64, "target_modules": "all-linear"}}})
    assert _metric(at, "Device total per GPU") == _gib(est.device_total_bytes)
    assert _metric(at, "Parameters (trainable)") == "828.38 M"  # 80 layers x 64 x 161,792 (tests/test_adapters.py)
    _open(at, "Fine-tuning (adapters)")
    assert at.selectbox(key="adapter_method").value == "qlora"


def test_an_rl_run_shows_its_phases():
    query = {"model": "qwen2.5-7b", "framework": "fsdp2", "recompute": "full", "dp": "8",
             "rl_algorithm": "grpo", "rl_rollout_tp": "4"}
    at = _app(query)
    _no_exception(at)
    est = estimate_config({"model": "qwen2.5-7b", "training": {"framework": "fsdp2", "recompute": "full",
                                                                "rl": {"algorithm": "grpo", "rollout_tp": 4}},
                           "parallel": {"dp": 8}})
    assert _metric(at, "Device total per GPU") == _gib(est.device_total_bytes)
    assert any(h.value.startswith("RL phases (grpo") for h in at.subheader)
    assert [e.label for e in at.expander if e.label.split(":")[0] in ("rollout", "scoring", "training")] == \
        [f"{p.name}: {p.device_total_bytes / GiB:,.2f} GiB" for p in est.rl_phases]


def test_adapter_and_rl_fields_appear_once_switched_on():
    groups = ("Fine-tuning (adapters)", "RL (colocated rollout engine)")
    at = _open(_app(), *groups)
    keys = {w.key for w in at.number_input} | {w.key for w in at.selectbox}
    assert "adapter_method" in keys and "rl_algorithm" in keys
    assert "adapter_rank" not in keys and "rl_max_response_len" not in keys
    at = _open(_app({"adapter_method": "lora", "adapter_rank": "32"}), *groups)
    assert at.number_input(key="adapter_rank").value == 32


def test_the_sequence_length_gives_way_to_prompt_plus_response_under_rl():
    at = _app({"model": "qwen2.5-7b", "framework": "fsdp2", "dp": "8", "rl_algorithm": "grpo"})
    _no_exception(at)
    assert "seq_len" not in {w.key for w in at.number_input}


# --- the sidebar's groups: a closed one draws no widgets, its settings stay -----------------------------

OPEN_AT_START = ("Run", "Parallel layout", "GPU")
OPTIMIZER = "Optimizer and memory savers"


def _drawn_settings(at: AppTest) -> set[str]:
    """The configuration's widgets the sidebar holds in this run."""
    sb = at.sidebar
    widgets = [*sb.number_input, *sb.selectbox, *sb.multiselect, *sb.toggle, *sb.text_input]
    return {w.key for w in widgets if w.key in fields.BY_NAME}


def _share_link(at: AppTest) -> str:
    (code,) = at.sidebar.code
    return code.value


def test_only_the_open_groups_draw_their_widgets():
    """Every number input and select box walks the whole session state (Streamlit's
    SessionState.filtered_state): widgets of closed groups are the Memory page's biggest cost."""
    at = _app()
    assert [e.label for e in at.sidebar.expander] == list(fields.GROUPS)  # every group is listed
    shown = {f.name for f in fields.ALL_FIELDS if f.group in OPEN_AT_START}
    assert _drawn_settings(at) == shown
    _open(at, OPTIMIZER)
    assert _drawn_settings(at) == shown | {f.name for f in fields.ALL_FIELDS if f.group == OPTIMIZER}
    at.session_state[K.group(OPTIMIZER)] = False  # closed again, as a click does
    at.run()
    assert _drawn_settings(at) == shown


def test_a_setting_in_a_closed_group_stays_in_the_configuration_and_the_link():
    at = _open(_app({"model": "llama-3.1-8b", "tp": "2"}), OPTIMIZER)
    at.selectbox(key="recompute").set_value("full").run()
    at.number_input(key="dropout").set_value(0.1).run()
    expected = {"model": "llama-3.1-8b", "training": {"recompute": "full", "dropout": 0.1}, "parallel": {"tp": 2}}
    link = {"model": "llama-3.1-8b", "recompute": "full", "dropout": "0.1", "tp": "2"}
    assert at.session_state[K.CURRENT].config == expected and at.query_params == link
    at.session_state[K.group(OPTIMIZER)] = False
    at.run()
    assert "recompute" not in _drawn_settings(at)
    for page in [*PAGES[1:], "pages/planner.py", "pages/memory.py"]:  # reruns and page switches
        at.switch_page(page).run()
        _no_exception(at)
        assert at.session_state[K.CURRENT].config == expected
        assert at.query_params == link
        assert _share_link(at) == "?model=llama-3.1-8b&recompute=full&dropout=0.1&tp=2"
        assert "recompute" not in _drawn_settings(at)  # the group stays closed
    at.number_input(key="tp").set_value(4).run()  # another setting changes: the closed ones stay
    assert at.session_state[K.CURRENT].config == {**expected, "parallel": {"tp": 4}}
    assert at.query_params == {**link, "tp": "4"}
    _open(at, OPTIMIZER)  # and their widgets come back with their values
    assert at.selectbox(key="recompute").value == "full" and at.number_input(key="dropout").value == 0.1


def test_a_shared_link_with_closed_group_settings_reproduces_the_configuration():
    link = {"model": "llama-3.1-70b", "framework": "hf", "seq_len": "2048", "compute_dtype": "fp16",
            "recompute": "full", "dropout": "0.1", "moe_capacity_factor": "2", "adapter_method": "qlora", "adapter_rank": "64",
            "kv_cache_dtype": "fp8", "dp": "8"}
    config = {"model": "llama-3.1-70b",
              "training": {"framework": "hf", "seq_len": 2048, "compute_dtype": "fp16", "recompute": "full",
                           "dropout": 0.1, "moe_capacity_factor": 2.0, "kv_cache_dtype": "fp8",
                           "adapter": {"method": "qlora", "rank": 64}},
              "parallel": {"dp": 8}}
    at = _app(link)
    _no_exception(at)
    assert not at.sidebar.warning and not at.sidebar.error
    assert {f.group for f in map(fields.BY_NAME.get, link) if f} - set(OPEN_AT_START)  # most are in closed groups
    assert at.session_state[K.CURRENT].config == config
    assert _metric(at, "Device total per GPU") == _gib(estimate_config(config).device_total_bytes)
    # the address bar keeps every parameter (a whole float as a widget bound to the URL wrote it);
    # the share link is the one the app always wrote for this configuration
    assert at.query_params == link
    share = _share_link(at)
    assert share == ("?model=llama-3.1-70b&framework=hf&seq_len=2048&compute_dtype=fp16&recompute=full&dropout=0.1"
                     "&moe_capacity_factor=2.0&kv_cache_dtype=fp8&dp=8&adapter_method=qlora&adapter_rank=64")
    from urllib.parse import parse_qsl
    again = _app(dict(parse_qsl(share[1:])))  # the share link, opened in a new session
    assert again.session_state[K.CURRENT].config == config and _share_link(again) == share


def test_a_loaded_configuration_reaches_open_and_closed_groups():
    at = _open(_app(), OPTIMIZER, "Precision")
    at.selectbox(key="recompute").set_value("selective").run()
    at.selectbox(key="grad_dtype").set_value("bf16").run()
    at.session_state[K.group("Precision")] = False
    at.run()
    at.switch_page("pages/presets.py").run()
    from estimator.models.presets import list_recipes
    recipe = next(r for r in list_recipes() if r.id == "llama-3.1-70b-pretrain-64xh100")
    at.button(key=K.recipe(recipe.id)).click().run()  # loads it and opens the Memory page
    _no_exception(at)
    assert at.title[0].value == "Will it fit?"
    assert at.session_state[K.CURRENT].config == fields.config_dict(
        fields.ModelChoice(preset="llama-3.1-70b"), fields.ui_values_from_config(recipe.config))
    # the drawn widgets show the recipe's values (recompute none, TP 4), so does a group opened later
    assert at.selectbox(key="recompute").value == "none" and at.number_input(key="tp").value == 4
    _open(at, "Precision")
    assert at.selectbox(key="grad_dtype").value == "fp32"
    at.run()  # and keep them
    assert at.selectbox(key="recompute").value == "none" and at.selectbox(key="grad_dtype").value == "fp32"


def test_loading_a_configuration_sets_no_widget_default_and_session_state_both(monkeypatch):
    """Streamlit warns about a widget created with a default value that was also set through Session
    State: a drawn widget whose setting a load changes gets no default."""
    from streamlit.elements.lib import policies
    from streamlit.testing.v1.util import patch_config_options

    warned = []
    monkeypatch.setattr(policies, "_shown_default_value_warning", False)
    monkeypatch.setattr(policies._LOGGER, "warning", lambda message, *args, **kw: warned.append(message % args))
    with patch_config_options({"global.disableWidgetStateDuplicationWarning": False}):
        at = _open(_app({"tp": "2", "recompute": "full"}), OPTIMIZER)
        at.session_state[K.PENDING] = (SHARED_CONFIG, "a file")
        at.run()
        _open(at, "Precision")
    _no_exception(at)
    assert at.number_input(key="tp").value == 8 and at.selectbox(key="recompute").value == "selective"
    assert not warned


def test_an_error_about_a_closed_groups_setting_is_shown_in_that_group():
    at = _app({"model": "llama-3.1-8b", "offload_optimizer": "cpu"})  # Megatron's CPU offload only
    _no_exception(at)
    group = next(x for x in at.sidebar.expander if x.label == OPTIMIZER)
    assert [_plain(e.value) for e in group.error] == [_plain(e.value) for e in at.sidebar.error]
    assert len(group.error) == 1 and "Offload optimizer states" in _plain(group.error[0].value)
    assert any("cannot be estimated" in e.value for e in at.main.error)
    assert at.query_params["offload_optimizer"] == "cpu"


def test_what_to_change_gives_the_clis_answer_from_the_planners_search():
    """Issue #26, defect 4: where single changes do not get a run to fit, the app's "What to change"
    gives what the CLI gives (`advice.plan_to_fit`, the planner's nearest fitting layout: "use more
    GPUs: at least 32" for Llama-3.1-70B at 8k tokens on 8 GPUs), not "No plan of up to five
    changes"; and Apply loads that layout."""
    from estimator import load_config
    from estimator.search.advice import plan_to_fit

    config = {"model": "llama-3.1-70b", "training": {"seq_len": 8192}, "parallel": {"dp": 8}}
    cli = plan_to_fit(load_config(config))
    assert len(cli) == 1 and cli[0].description.startswith("use more GPUs: at least 32 (no layout fits on 8)")
    at = _settled(_app({"model": "llama-3.1-70b", "seq_len": "8192", "dp": "8"}))
    shown = " ".join(m.value for m in at.main.markdown)
    assert f"1. {cli[0].description}" in _plain(shown), shown
    assert "No plan of up to five changes" not in " ".join(c.value for c in at.caption)
    at.button(key=K.plan_step(1)).click().run()
    _no_exception(at)
    est = estimate_config(at.session_state[K.CURRENT].config)
    assert est.device_total_bytes == cli[0].device_total_bytes and est.parallel.gpus == 32
    assert est.fit.verdict == "fits"


def test_the_reserved_metric_shows_the_replayed_number_and_its_rule():
    """An HF Trainer run: the Memory page's reserved peak is the estimate's, the allocator replayed
    (estimator/memory/reserved.py), and its help names the rule and its source; beside it the allocated
    peak and the device total."""
    at = _app({"model": "llama-3.2-1b", "framework": "hf", "seq_len": "2048"})
    _no_exception(at)
    est = estimate_config({"model": "llama-3.2-1b", "training": {"framework": "hf", "seq_len": 2048}})
    assert est.stages[0].cache is not None
    assert _metric(at, "Reserved peak") == _gib(est.reserved_peak_bytes)
    assert _metric(at, "Allocated peak") == _gib(est.allocated_peak_bytes)
    assert _metric(at, "Device total per GPU") == _gib(est.device_total_bytes)
    reserved = next(m for m in at.metric if m.label == "Reserved peak")
    assert "caching allocator replayed over two HF Trainer steps" in reserved.help
    assert "CUDACachingAllocator.cpp" in reserved.help


def test_a_preset_edited_as_a_custom_architecture_keeps_its_vision_tower():
    """The architecture editor has a Vision tower group (issue 28): editing Qwen2.5-VL-7B keeps its tower's
    weights, so the totals stay the preset's."""
    at = _app({"model": "qwen2.5-vl-7b"})
    at.session_state[K.SOURCE] = "Custom"
    at.run()
    _no_exception(at)
    current = at.session_state[K.CURRENT]
    assert current.model.source == "custom" and current.model.arch["vision_tower"] == "qwen2_5_vl"
    assert at.number_input(key=K.arch("vision_hidden_size")).value == 1280  # shown, under Vision tower
    assert _metric(at, "Device total per GPU") == _gib(estimate_config({"model": "qwen2.5-vl-7b"}).device_total_bytes)
@pytest.mark.parametrize("query", [{"model": "deepseek-v3.2", "tp": "8", "ep": "8", "dp": "8", "seq_len": "4096"},
                                   {"model": "kimi-k2", "tp": "8", "ep": "8", "dp": "8", "seq_len": "4096"}],
                         ids=["sparse attention (DeepSeek-V3.2)", "MLA + 384 experts (Kimi-K2)"])
def test_every_page_renders_the_issue_28_mla_presets(query):
    """Issue #28's DeepSeek-V3.2 (lightning indexer) and Kimi-K2 presets on every page; DeepSeek-V3.2's
    activation ledger shows the indexer by name."""
    at = _app(query)
    _no_exception(at)
    for page in PAGES:
        at.switch_page(page).run()
        _no_exception(at)
        assert not [e for e in at.error if "cannot be estimated" in e.value], [e.value for e in at.error]
    if query["model"] == "deepseek-v3.2":
        est = estimate_config({"model": "deepseek-v3.2", "training": {"seq_len": 4096},
                               "parallel": {"tp": 8, "ep": 8, "dp": 8}})
        assert any(line.name == "indexer ReLU scores (fp32)" for line in est.activation_ledger)


def test_the_planner_plans_llama_4_scout():
    """Llama 4 Scout (issue 28): chunked attention and a vision tower's weights on the first stage; on 32 B200s
    the page finds layouts, and the first one, loaded, is what the Memory page shows. (On 16 none is within the
    planner's 80% since Megatron-Core's communicators are charged: the best, TP 4 x PP 2 x VPP 24, needs 81.6%.)"""
    at = _planner({"model": "llama-4-scout", "dp": "32", "seq_len": "4096", "gpu": "b200"})
    table = next(df.value for df in at.dataframe if "Tokens/s per GPU" in df.value.columns)
    assert len(table) > 0
    row = table.iloc[0]
    at.selectbox(key="planner_pick").set_value(1).run()
    at.button(key="planner_use").click().run()
    _no_exception(at)
    est = estimate_config(at.session_state[K.CURRENT].config)
    assert est.device_total_bytes / GiB == row["GiB per GPU"]
    assert (est.parallel.tp, est.parallel.pp, est.parallel.dp) == (row["TP"], row["PP"], row["DP"])


def test_the_trl_release_comes_from_the_url_and_moves_the_estimate():
    """training.trl_version is a setting like every field (its widget, its URL parameter): TRL 0.22's whole-sample
    entropy (spec/trl.py) is what the Memory page shows for that release."""
    query = {"model": "qwen2.5-7b", "framework": "hf", "training_loop": "trl_sft", "seq_len": "8192",
             "micro_batch_size": "2", "recompute": "full"}
    at = _app({**query, "trl_version": "0.22.0"})
    _no_exception(at)
    config = at.session_state[K.CURRENT].config
    assert config["training"]["trl_version"] == "0.22.0"
    assert _metric(at, "Device total per GPU") == _gib(estimate_config(config).device_total_bytes)
    measured = estimate_config({**config, "training": {k: v for k, v in config["training"].items()
                                                       if k != "trl_version"}})
    assert estimate_config(config).device_total_bytes > measured.device_total_bytes
