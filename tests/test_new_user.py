"""The defects a new user hit (issue 26, "Defects found as a new user would"), one test or more each.

App defects are driven through Streamlit's AppTest; estimator and CLI ones call the code. The
layout defects measured at 390 and 1400 px are in tests/e2e/test_widths.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("streamlit")
from streamlit.testing.v1 import AppTest  # noqa: E402

from estimator import estimate_config  # noqa: E402
from estimator.presets import list_recipes  # noqa: E402
from ui import keys as K  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
APP = str(ROOT / "app.py")
GiB = 1024**3


def _app(query: dict | None = None) -> AppTest:
    at = AppTest.from_file(APP, default_timeout=90)
    for key, value in (query or {}).items():
        at.query_params[key] = value
    return at.run()


def _metric(at: AppTest, label: str) -> str:
    return next(m.value for m in at.metric if m.label == label)


def _gib(n: int) -> str:
    return f"{n / GiB:,.2f} GiB"


def _no_exception(at: AppTest) -> None:
    assert not at.exception, [e.value for e in at.exception]


def _recipe(name_part: str):
    return next(r for r in list_recipes() if name_part in r.name)


# --- 1. a recipe whose adapter targets "all-linear" ---------------------------------------------------

def test_the_qlora_recipe_with_all_linear_targets_loads():
    recipe = _recipe("QLoRA on one 80 GB GPU")
    assert recipe.config["training"]["adapter"]["target_modules"] == "all-linear"  # one string, as in the contract
    at = _app()
    at.switch_page("pages/presets.py").run()
    at.button(key=K.recipe(recipe.id)).click().run()
    _no_exception(at)
    assert not [e.value for e in at.sidebar.error], [e.value for e in at.sidebar.error]
    assert [s.value for s in at.sidebar.success] == [f"Loaded recipe '{recipe.name}'."]
    assert at.session_state[K.VALUES]["adapter_target_modules"] == ["all-linear"]
    est = estimate_config(recipe.config)
    assert _metric(at, "Device total per GPU") == _gib(est.device_total_bytes)


# --- 2. "Use this layout" on a dense model ----------------------------------------------------------

def test_use_this_layout_leaves_the_fields_that_follow_tp_to_follow_it():
    import json

    from ui import exports

    at = _app({"model": "llama-3.1-8b", "dp": "8"})
    at.switch_page("pages/planner.py").run()
    at.button(key="planner_run").click().run()
    _no_exception(at)
    table = next(df.value for df in at.dataframe if "Tokens/s per GPU" in df.value.columns)
    rank = int(table[table["TP"] == 2]["Rank"].iloc[0])  # a layout with TP 2: sequence parallelism on, ETP 2
    at.selectbox(key="planner_pick").set_value(rank).run()
    at.button(key="planner_use").click().run()
    _no_exception(at)
    config = at.session_state[K.CURRENT].config
    assert config["parallel"]["tp"] == 2
    assert "etp" not in config["parallel"] and "sequence_parallel" not in config["parallel"]
    est = estimate_config(config)
    assert (est.parallel.etp, est.parallel.sequence_parallel) == (2, True)  # as the planner laid it out
    exported = json.loads(exports.config_json(config, est))
    assert "etp" not in exported["parallel"] and "sequence_parallel" not in exported["parallel"]
    # TP changed afterwards is estimated, not refused ("ETP = 2 ... the model has no experts")
    at.switch_page("pages/memory.py")
    at.number_input(key="tp").set_value(1).run()
    _no_exception(at)
    assert not at.sidebar.error and not [e for e in at.error if "cannot be estimated" in e.value], \
        [e.value for e in at.error]
    one = estimate_config(at.session_state[K.CURRENT].config)
    assert (one.parallel.tp, one.parallel.etp, one.parallel.sequence_parallel) == (1, 1, False)
    assert _metric(at, "Device total per GPU") == _gib(one.device_total_bytes)


# --- 3. a page switch within a second of loading a recipe ------------------------------------------------

def _sidebar_values(at: AppTest) -> dict[str, object]:
    """Every keyed sidebar widget's value: what a browser sends back with its next click."""
    sb = at.sidebar
    return {w.key: w.value for w in [*sb.number_input, *sb.selectbox, *sb.multiselect, *sb.toggle, *sb.text_input]
            if w.key}


def _send_stale(at: AppTest, before: dict[str, object]) -> None:
    """The browser's next click carries the widgets' values from before the load (it was sent
    before the load's widgets arrived): every widget it had, at its old value."""
    sb = at.sidebar
    for w in [*sb.number_input, *sb.selectbox, *sb.multiselect, *sb.toggle, *sb.text_input]:
        if w.key in before and w.value != before[w.key]:
            w.set_value(before[w.key])


def test_a_page_switch_right_after_loading_a_recipe_keeps_the_recipe():
    recipe = _recipe("DeepSeek-V3 as reported")
    loaded = _app()
    loaded.switch_page("pages/presets.py").run()
    loaded.button(key=K.recipe(recipe.id)).click().run()
    expected = loaded.session_state[K.CURRENT].config  # the recipe, loaded with nothing in between
    assert expected["model"] == "deepseek-v3" and expected["parallel"]["ep"] == 64

    at = _app()
    at.switch_page("pages/presets.py").run()
    before = _sidebar_values(at)
    assert before[K.PRESET] == "llama-3.1-8b"
    at.button(key=K.recipe(recipe.id)).click().run()
    _send_stale(at, before)
    at.switch_page("pages/roofline.py").run()
    _no_exception(at)
    assert at.selectbox(key=K.PRESET).value == "deepseek-v3"
    assert at.session_state[K.CURRENT].config == expected
    assert not at.sidebar.error and not [e for e in at.error if "cannot be estimated" in e.value], \
        [e.value for e in at.error]
    # a change the user makes once the browser has the recipe is theirs
    at.number_input(key="seq_len").set_value(2048).run()
    assert at.session_state[K.CURRENT].config["training"]["seq_len"] == 2048
    assert at.selectbox(key=K.PRESET).value == "deepseek-v3"


# --- 5. the plan's steps, applied ------------------------------------------------------------------

def _flash(at: AppTest) -> str:
    return " ".join(s.value for s in at.sidebar.success).replace("\\", "")


def test_applying_the_plan_keeps_an_open_global_batch_open_and_says_what_it_loaded():
    from estimator import load_config
    from estimator.advice import plan_to_fit

    query = {"model": "llama-3.1-70b", "tp": "2", "pp": "2"}  # global batch left to the estimator
    steps = plan_to_fit(load_config({"model": "llama-3.1-70b", "parallel": {"tp": 2, "pp": 2}}), use_planner=False)
    assert [s.description for s in steps][-1] == "pipeline stages 4 (twice the GPUs)" and steps[-1].verdict == "fits"
    at = _app(query)
    at.button(key=K.plan_step(len(steps))).click().run()
    _no_exception(at)
    config = at.session_state[K.CURRENT].config
    assert "global_batch_size" not in config.get("training", {})  # none written that the user did not choose
    est = estimate_config(config)
    assert (est.parallel.pp, est.microbatches) == (4, 4)  # the default fills the 4 stages
    assert not [m.value for m in at.markdown if "pipeline bubble" in m.value]
    assert _flash(at) == f"Loaded steps 1 to {len(steps)} of the plan, the last: pipeline stages 4 (twice the GPUs)."
    # each Apply of the plan's first step says which change it loaded
    at = _app(query)
    at.button(key=K.plan_step(1)).click().run()
    assert _flash(at) == f"Loaded step 1 of the plan: {steps[0].description}."
    at.button(key=K.plan_step(1)).click().run()
    assert _flash(at) == f"Loaded step 1 of the plan: {steps[1].description}."


def test_a_plan_on_a_global_batch_the_user_set_says_when_the_pipeline_is_mostly_bubble():
    from estimator import load_config
    from estimator.advice import plan_to_fit

    config = {"model": "llama-3.1-70b", "training": {"global_batch_size": 2}, "parallel": {"tp": 2, "pp": 2}}
    last = plan_to_fit(load_config(config), use_planner=False)[-1]
    assert last.config.training.global_batch_size == 2
    assert last.description == ("pipeline stages 4 (twice the GPUs, same global batch); 2 micro-batches for 4 "
                                "stages: mostly pipeline bubble")
