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
from estimator.models.presets import list_recipes  # noqa: E402
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
    from test_app import _settled  # the search runs in a worker: run the page again until it answered
    _settled(at)
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
    from estimator.search.advice import plan_to_fit

    # global batch left to the estimator; a chunked loss, so that the greedy plan's last step is a pipeline change
    query = {"model": "llama-3.1-70b", "tp": "2", "pp": "2", "loss": "chunked"}
    steps = plan_to_fit(load_config({"model": "llama-3.1-70b", "training": {"loss": "chunked"},
                                     "parallel": {"tp": 2, "pp": 2}}), use_planner=False)
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
    from estimator.search.advice import plan_to_fit

    config = {"model": "llama-3.1-70b", "training": {"global_batch_size": 2, "loss": "chunked"},
              "parallel": {"tp": 2, "pp": 2}}  # a chunked loss: the greedy plan's last step is a pipeline change
    last = plan_to_fit(load_config(config), use_planner=False)[-1]
    assert last.config.training.global_batch_size == 2
    assert last.description == ("pipeline stages 4 (twice the GPUs, same global batch); 2 micro-batches for 4 "
                                "stages: mostly pipeline bubble")


# --- 8. formatting -----------------------------------------------------------------------------------

RL_CONFIG = {"model": "qwen2.5-7b",
             "training": {"framework": "fsdp2", "micro_batch_size": 16, "global_batch_size": 1280,
                          "recompute": "full",
                          "rl": {"algorithm": "grpo", "rollout_batch_size": 1024, "samples_per_prompt": 5,
                                 "max_prompt_len": 512, "max_response_len": 512, "engine_memory_fraction": 0.6,
                                 "rollout_tp": 2}},
             "parallel": {"dp": 8}}


def _pdf_text(data: bytes) -> str:
    import io

    pypdf = pytest.importorskip("pypdf")
    return " ".join(" ".join(page.extract_text() for page in pypdf.PdfReader(io.BytesIO(data)).pages).split())


def _cli(capsys, *argv: str) -> str:
    from estimator import cli

    assert cli.main(list(argv)) == 0
    return capsys.readouterr().out


def _config_file(tmp_path, config: dict) -> str:
    import json

    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    return str(path)


def test_gemma_3s_context_is_its_config_classes_default():
    at = _app()
    at.switch_page("pages/presets.py").run()
    _no_exception(at)
    models = next(df.value for df in at.dataframe if "Context" in df.value.columns)
    context = dict(zip(models["id"], models["Context"]))
    # google/gemma-3-27b-pt's config.json leaves max_position_embeddings out: transformers'
    # Gemma3TextConfig default, 131072 (128K, the Gemma 3 27B model card's context)
    assert context["gemma-3-27b"] == 131072
    assert context["llama-3.1-8b"] == 131072 and context["qwen3-8b"] == 40960  # as their config.json give them
    assert models["Context"].notna().all(), [k for k, v in context.items() if v is None or v != v]


def test_the_rl_pdf_lists_the_rl_settings_and_names_the_deciding_phase():
    from ui import exports

    est = estimate_config(RL_CONFIG)
    largest = max(est.rl_phases, key=lambda p: p.device_total_bytes)
    assert largest.name == "training" and est.device_total_bytes == largest.device_total_bytes
    text = _pdf_text(exports.report_pdf(est, RL_CONFIG, title="RL", chart=None))
    assert "{'" not in text and "rl:" not in text  # no Python dict
    for line in ("RL algorithm: grpo", "Rollout prompts per step: 1024", "Samples per prompt: 5",
                 "Max response tokens: 512"):
        assert line in text, line
    assert f"Device total (largest RL phase) {est.device_total_bytes / GiB:,.2f} GiB" in text
    assert "Peak phase the RL step's training phase (of rollout, scoring, training)" in text
    assert "Peak stage / phase" not in text


def test_verdicts_are_spelled_one_way_in_the_app_the_cli_and_the_exports(capsys, tmp_path):
    import csv
    import io
    import re

    from ui import exports

    oom = {"model": "llama-3.1-70b"}  # 216% of one H100
    est = estimate_config(oom)
    assert est.fit.verdict == "oom"
    other_spellings = re.compile(r"\boom\b|\bFITS\b|\bTIGHT\b|\bfits:|Out of memory\b|\(over 80%\)")
    text = _cli(capsys, "estimate", "--config", _config_file(tmp_path, oom))
    assert f"Fit on h100-80 (79.6 GiB): OOM ({est.fit.utilization:.0%} of capacity)" in text
    assert not other_spellings.search(text)
    rows = list(csv.DictReader(io.StringIO(exports.breakdown_csv(est))))
    assert next(r for r in rows if r["component"] == "verdict")["label"] == "OOM"
    pdf = _pdf_text(exports.report_pdf(est, oom, title="OOM", chart=None))
    assert f"Verdict OOM: {est.fit.utilization:.0%} of capacity" in pdf and not other_spellings.search(pdf)
    at = _app({"model": "llama-3.1-70b"})
    assert _metric(at, "Verdict") == "OOM"
    assert at.error[0].value.startswith("**OOM** on NVIDIA H100")
    at.switch_page("pages/presets.py").run()
    lines = [m.value for m in at.markdown if "GiB per GPU on" in m.value]
    assert len(lines) == len(list_recipes())
    assert all(re.search(r"\*\*(Fits|Tight|OOM)\*\*", line) for line in lines), lines
    assert not any(other_spellings.search(line) for line in lines), lines


def test_one_gpu_and_one_micro_batch_are_singular(capsys, tmp_path):
    from ui import exports

    recipe = _recipe("QLoRA on one 80 GB GPU")
    est = estimate_config(recipe.config)
    assert (est.parallel.gpus, est.microbatches) == (1, 1)
    text = _cli(capsys, "estimate", "--config", _config_file(tmp_path, recipe.config))
    assert "; 1 GPU; 1 micro-batch" in text and "1 GPUs" not in text
    pdf = _pdf_text(exports.report_pdf(est, recipe.config, title="one", chart=None))
    assert "= 1 GPU;" in pdf and "1 micro-batch per step" in pdf and "1 GPUs" not in pdf
    at = _app()
    at.switch_page("pages/presets.py").run()
    line = next(m.value for m in at.markdown if "GiB per GPU on" in m.value and m.value.endswith("GPU"))
    assert line.endswith("· 1 GPU")
    assert not [m.value for m in at.markdown if "1 GPUs" in m.value]


def test_the_csv_labels_each_dropout_as_its_own_field():
    import csv
    import io

    from ui import exports
    from ui.fields import field_label

    config = {"model": "llama-3.1-8b",
              "training": {"framework": "hf", "dropout": 0.1,
                           "adapter": {"method": "lora", "rank": 16, "dropout": 0.05}}}
    rows = {r["component"]: r for r in csv.DictReader(io.StringIO(exports.breakdown_csv(estimate_config(config))))
            if r["kind"] == "setting"}
    assert (rows["training.dropout"]["label"], rows["training.dropout"]["value"]) == ("Dropout", "0.1")
    assert field_label("training.dropout") == "Dropout"
    assert field_label("training.adapter.dropout") == "Adapter dropout"


def test_the_rl_caption_points_at_the_stage_chart_where_it_is():
    query = {"model": "qwen2.5-7b", "framework": "fsdp2", "micro_batch_size": "16", "global_batch_size": "1280",
             "recompute": "full", "dp": "8", "rl_algorithm": "grpo", "rl_rollout_batch_size": "1024",
             "rl_samples_per_prompt": "5", "rl_max_prompt_len": "512", "rl_max_response_len": "512",
             "rl_engine_memory_fraction": "0.6", "rl_rollout_tp": "2"}
    at = _app(query)
    _no_exception(at)
    headers = [h.value for h in at.subheader]
    rl = next(i for i, h in enumerate(headers) if h.startswith("RL phases"))
    assert rl < headers.index("Memory per pipeline stage")  # the RL chart is drawn first
    caption = next(c.value for c in at.caption if "decides the fit" in c.value)
    assert "stage chart below" in caption and "above" not in caption


# --- 10. the presets' parameter counts, labelled the same way in the CLI and the app -----------------

def test_the_cli_and_the_presets_page_label_their_counts_alike(capsys):
    from estimator.spec.architecture import parameter_counts
    from estimator.models.presets import counting_note, get_architecture, list_presets

    lines = {line.split()[0]: line for line in _cli(capsys, "presets").splitlines()}
    at = _app()
    at.switch_page("pages/presets.py").run()
    models = next(df.value for df in at.dataframe if "Context" in df.value.columns).set_index("id")
    for info in list_presets():
        counts = parameter_counts(get_architecture(info.id))
        line = lines[info.id]
        published = f"published {info.published_total / 1e9:.2f}B"
        computed = f"computed {counts.total / 1e9:.2f}B"
        assert published in line and computed in line, line
        if counts.active != counts.total:
            assert f"{computed} ({counts.active / 1e9:.2f}B active)" in line, line
        row = models.loc[info.id]
        assert row["Computed total (B)"] == counts.total / 1e9
        assert row["Computed active (B)"] == counts.active / 1e9
        assert row["Published total"] == info.published_total
        note = counting_note(info)
        assert row["How the publisher counts"] == note
        assert line.endswith(f"({note})") if note else not line.endswith(")"), line
    # the counts that differ say why, in both places
    assert lines["deepseek-v3"].endswith("(published active leaves out the MTP module)")
    # Gemma 3's published total includes its vision tower, which the estimator counts too (issue 28)
    assert models.loc["gemma-3-27b", "How the publisher counts"] == ""
    assert "computed 684.49B (40.09B active)" in lines["deepseek-v3"]
    assert "published 684.49B (37.55B active)" in lines["deepseek-v3"]


# --- 9. the Roofline page in inference mode -----------------------------------------------------------

SERVING = {"model": "llama-3.1-8b", "mode": "inference", "tp": "8", "seq_len": "131072", "micro_batch_size": "32"}


def test_the_roofline_page_in_inference_times_a_prefill_in_short_values():
    from estimator import load_config
    from estimator.speed.roofline import roofline_config

    step = roofline_config(load_config({"model": "llama-3.1-8b", "training": {
        "mode": "inference", "seq_len": 131072, "micro_batch_size": 32}, "parallel": {"tp": 8}})).to_json()["step"]
    assert 10 < step["exposed_comm_s"] < 11 and 10 < step["time_s"] < 100
    at = _app(SERVING)
    at.switch_page("pages/roofline.py").run()
    _no_exception(at)
    caption = at.caption[0].value
    assert "one prefill of the batch (forward only" in caption and "training step" not in caption
    assert _metric(at, "Prefill time (expected)") == f"{step['time_s']:.2f} s"
    assert _metric(at, "Exposed communication") == f"{step['exposed_comm_s']:.2f} s"  # was "10,401.4 ms", cut
    assert any(m.value == "**Where the prefill's time goes**" for m in at.markdown)
    # a training run still reads as a step, its short times in milliseconds
    at = _app({"model": "llama-3.1-8b"})
    at.switch_page("pages/roofline.py").run()
    train = roofline_config(load_config({"model": "llama-3.1-8b"})).to_json()["step"]
    assert "one training step" in at.caption[0].value
    assert _metric(at, "Step time (expected)") == (f"{train['time_s'] * 1e3:,.1f} ms" if train["time_s"] < 1
                                                   else f"{train['time_s']:.2f} s")


# --- 11. the command line ---------------------------------------------------------------------------------

def _run_cli(*argv: str, stdin: str | None = None):
    import subprocess
    import sys

    return subprocess.run([sys.executable, "-m", "estimator", *argv], input=stdin, capture_output=True, text=True,
                          cwd=ROOT, timeout=120)


def test_config_dash_reads_the_json_from_standard_input(tmp_path):
    import json

    config = {"model": "llama-3.1-8b", "parallel": {"tp": 2}}
    piped = _run_cli("estimate", "--config", "-", "--json", stdin=json.dumps(config))
    assert piped.returncode == 0 and piped.stderr == "", piped.stderr
    assert json.loads(piped.stdout)["device_total_bytes"] == estimate_config(config).device_total_bytes
    bad = _run_cli("estimate", "--config", "-", stdin="not json")
    assert bad.returncode == 2 and bad.stdout == ""
    assert bad.stderr.startswith("error: --config = '-': invalid JSON at line 1 column 1")
    assert len(bad.stderr.strip().splitlines()) == 1


def test_help_points_only_at_documents_the_repository_has():
    import re

    texts = [_run_cli(*argv, "--help").stdout for argv in [(), ("estimate",), ("roofline",), ("plan",)]]
    named = {name for text in texts for name in re.findall(r"[\w./-]+\.md\b", text)}
    assert "docs/config.md" in named and "README.md" in named
    assert "CONTRACT.md" not in " ".join(texts)
    for name in named:
        assert (ROOT / name).is_file(), name
    assert "or - for standard input" in " ".join(texts[1].split())


def test_the_plan_footer_calls_its_speeds_expected_as_they_are():
    from estimator import load_config
    from estimator.search.planner import plan, render_plan_text
    from estimator.speed.roofline import roofline

    cfg = load_config({"model": "llama-3.1-8b"})
    result = plan(cfg.architecture, cfg.training, cfg.hardware, 8)
    first = result.layouts[0]
    step = roofline(cfg.architecture, first.training, first.parallel, cfg.hardware).step
    assert first.tokens_per_s_per_gpu == step.tokens_per_s_per_gpu  # the expected figure
    assert step.upper_bound.tokens_per_s_per_gpu > step.tokens_per_s_per_gpu  # not the roofs'
    footer = " ".join(render_plan_text(result).split("\n\n")[-1].split())
    assert "upper bound" not in footer
    assert "speeds are the step-time model's expected figures" in footer


# --- 12. the HF Hub source --------------------------------------------------------------------------------

def test_after_a_failed_fetch_the_page_says_it_failed(monkeypatch):
    from estimator import ConfigError
    from ui import compute

    def offline(hub_id):  # what estimator.hub says offline (HF_HUB_OFFLINE=1), without the network or the env
        raise ConfigError("model", hub_id, "a cached model", "offline mode (HF_HUB_OFFLINE) is on and the "
                          f"config.json of {hub_id} is not in the cache")
    monkeypatch.setattr(compute, "fetch_hub_model", offline)
    at = _app({"model": "qwen3-8b"})
    at.segmented_control(key=K.SOURCE).set_value("HF Hub").run()
    assert any("No Hugging Face model loaded yet" in i.value for i in at.main.info)  # before a fetch: the hint
    at.text_input(key=K.HUB_TEXT).set_value("example-org/not-cached").run()
    at.button(key=K.HUB_FETCH).click().run()
    _no_exception(at)
    [sidebar] = [e.value for e in at.sidebar.error]
    assert "Could not fetch" in sidebar and "not-cached" in sidebar
    main = " ".join(i.value for i in at.main.info)
    assert "No Hugging Face model loaded yet" not in main and "press **Fetch**" in main
    assert "Could not fetch 'example-org/not-cached'\\: offline mode" in main  # shown literally: markdown escaped
    assert not at.main.error  # one error, in the sidebar


def test_a_long_value_is_counted_by_its_own_length():
    from estimator.spec.errors import shown_value

    assert shown_value("org/" + "a" * 4996).endswith("... (5,000 characters)")


# --- 13. the README ---------------------------------------------------------------------------------------

README = ROOT / "README.md"


def test_the_readme_counts_the_measured_steps_and_frameworks_the_tests_hold():
    """The opening sentence is written from the records (`python -m validation readme`), the
    records tests/test_accuracy.py holds to 5%; it said 83 steps of three frameworks."""
    from test_accuracy import FRAMEWORKS, HF_RECORDS, RECORDS
    from validation.core import summary

    text = README.read_text()
    start = text.index(summary.HEADLINE_START) + len(summary.HEADLINE_START)
    written = text[start:text.index(summary.HEADLINE_END)]
    assert written == summary.headline()
    assert f"tested against {len(RECORDS):,} measured training steps of eight frameworks' own code" in written
    assert len(FRAMEWORKS) + 2 == 8  # the HF transformers records, FSDP1's and a folder for each of the others
    for name in ("Hugging Face transformers", "PEFT", "torchtitan", "torchtune", "Megatron-Core", "PyTorch FSDP1",
                 "HF Trainer + Accelerate", "PyTorch FSDP2 under the HF Trainer"):
        assert name in written
    assert f"The {len(HF_RECORDS)} records live in `tests/data/measured/`" in " ".join(text.split())


def test_the_readme_accuracy_table_is_the_summarys():
    import re

    from validation.core import summary

    text = README.read_text()
    table = text[text.index("| framework (harness) |"):]
    rows = [line for line in table.splitlines()[2:9]]
    for line, framework in zip(rows, summary.FRAMEWORKS):
        r = summary.summarize(framework)
        cells = [c.strip() for c in line.strip("|").split("|")]
        worst = re.match(r"([−+-]?\d+\.\d)%", cells[4]).group(1).replace("−", "-")
        assert (int(cells[1]), int(cells[2]), cells[3]) == (r.cases, r.within, f"{100 * r.median:.1f}%"), line
        assert float(worst) == round(100 * r.worst, 1), line


def test_the_gpus_the_readme_names_are_in_the_catalog():
    """ "DeepSeek-V3 on 2,048 H800s": the catalog had no H800."""
    import re

    from estimator.spec.gpus import GPUS

    named = set(re.findall(r"\b((?:[ABH]|MI)\d{3}[A-Z]?)s\b", README.read_text()))
    assert {"H800", "H100", "A100"} <= named
    for model in named:
        assert any(re.search(rf"\b{model}\b", gpu.name) for gpu in GPUS.values()), model
    from estimator.models.presets import get_recipe
    assert get_recipe("deepseek-v3-as-reported").config["hardware"]["gpu"] == "h800"


def test_the_readmes_screenshot_shows_the_numbers_the_app_gives():
    """docs/memory.png is taken by docs/screenshot.py, which writes the page's link and the device
    total it showed into the PNG: the estimator must still give that total for that link."""
    from urllib.parse import parse_qsl

    from PIL import Image

    from ui.fields import config_dict, parse_url, ui_values_from_config

    shot = Image.open(ROOT / "docs" / "memory.png")
    assert shot.size == (1400, 2400)
    link = dict(parse_qsl(shot.text["link"]))
    parsed = parse_url(link)
    assert not parsed.warnings
    values = {**ui_values_from_config({"model": parsed.model.preset}), **parsed.values}
    est = estimate_config(config_dict(parsed.model, values))
    assert shot.text["device-total"] == _gib(est.device_total_bytes)
    assert "docs/screenshot.py" in (ROOT / "README.md").read_text()
