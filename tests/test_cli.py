"""The command line of ../shared/CONTRACT.md."""

import json
import subprocess
import sys

import pytest

from estimator import GPUS

LLAMA = {"name": "llama-3.1-8b", "hidden_size": 4096, "num_layers": 32, "num_attention_heads": 32, "num_kv_heads": 8,
         "intermediate_size": 14336, "vocab_size": 128256}
SEVEN = ("parameters", "gradients", "optimizer_states", "activations", "communication", "runtime", "fragmentation")


def cli(*args):
    return subprocess.run([sys.executable, "-m", "estimator", *args], capture_output=True, text=True)


@pytest.fixture
def config_file(tmp_path):
    def write(config):
        path = tmp_path / "config.json"
        path.write_text(json.dumps(config))
        return str(path)
    return write


def test_json_output_has_every_contract_key(config_file):
    run = cli("estimate", "--config", config_file({"model": LLAMA, "parallel": {"tp": 2, "pp": 4, "dp": 2},
                                                   "training": {"global_batch_size": 16}}), "--json")
    assert run.returncode == 0 and run.stderr == ""
    out = json.loads(run.stdout)  # exactly one JSON object
    # full fine-tuning: every parameter trains (an adapter run counts its adapters, tests/test_adapters.py)
    assert out["parameters"] == {"total": 8_030_261_248, "active": 8_030_261_248, "trainable": 8_030_261_248}
    assert [s["stage"] for s in out["stages"]] == [0, 1, 2, 3]
    for stage in out["stages"]:
        assert stage["layers"] == 8
        assert all(key in stage["components"] for key in SEVEN)
        tensors = sum(v for k, v in stage["components"].items() if k not in ("communication", "runtime", "fragmentation"))
        assert tensors == stage["allocated_peak_bytes"]
        assert sum(stage["components"].values()) == stage["device_total_bytes"]
        assert all(isinstance(v, int) for v in stage["components"].values())
    peak = max(out["stages"], key=lambda s: s["device_total_bytes"])
    assert out["peak_stage"] == peak["stage"]
    assert out["device_total_bytes"] == peak["device_total_bytes"]
    assert out["allocated_peak_bytes"] == peak["allocated_peak_bytes"]
    fit = out["fit"]
    assert fit["gpu"] == "h100-80" and fit["capacity_bytes"] == GPUS["h100-80"].capacity_bytes
    assert fit["utilization"] == pytest.approx(out["device_total_bytes"] / fit["capacity_bytes"], rel=1e-5)
    assert fit["verdict"] == ("oom" if fit["utilization"] > 1 else "tight" if fit["utilization"] > 0.8 else "fits")


def test_flags_override_fields(config_file):
    path = config_file({"model": LLAMA, "parallel": {"tp": 1}})
    base = json.loads(cli("estimate", "--config", path, "--json").stdout)
    tp4 = json.loads(cli("estimate", "--config", path, "--json", "--tp", "4", "--seq-len", "8192",
                         "--gpu", "a100-80", "--sequence-parallel", "true").stdout)
    assert tp4["fit"]["gpu"] == "a100-80"
    assert tp4["stages"][0]["components"]["parameters"] < base["stages"][0]["components"]["parameters"]


def test_text_output_shows_every_stage_and_the_verdict(config_file):
    run = cli("estimate", "--config", config_file({"model": LLAMA, "parallel": {"pp": 2}}))
    assert run.returncode == 0
    assert "Stage 0:" in run.stdout and "Stage 1:" in run.stdout
    assert "Fit on h100-80" in run.stdout and "device total" in run.stdout


def test_inference_has_kv_cache_and_no_training_state(config_file):
    # Llama-3.1-8B, bf16 cache, 131,072 cached tokens, batch 1: 2 x 32 x 8 x 128 x 131072 x 2 bytes
    run = cli("estimate", "--config", config_file({"model": LLAMA, "training": {
        "mode": "inference", "seq_len": 4096, "kv_cache_tokens": 131072}}), "--json")
    stage = json.loads(run.stdout)["stages"][0]["components"]
    assert stage["kv_cache"] == 2 * 32 * 8 * 128 * 131072 * 2 == 17_179_869_184
    assert stage["gradients"] == 0 and stage["optimizer_states"] == 0
    assert stage["parameters"] == 2 * 8_030_261_248


@pytest.mark.parametrize("content, words", [
    ("{not json", "invalid JSON at line 1"),
    ("[1, 2]", "a JSON object"),
])
def test_malformed_files_exit_2(tmp_path, content, words):
    path = tmp_path / "bad.json"
    path.write_text(content)
    run = cli("estimate", "--config", str(path))
    assert run.returncode == 2 and run.stdout == "" and words in run.stderr
    assert len(run.stderr.strip().splitlines()) == 1


def test_missing_file_and_bad_flag_exit_2(config_file):
    assert cli("estimate", "--config", "/nonexistent.json").returncode == 2
    run = cli("estimate", "--config", config_file({"model": LLAMA}), "--tp", "four")
    assert run.returncode == 2 and "[parallel.tp] = 'four'" in run.stderr
    assert cli("estimate").returncode == 2


def test_gpus_lists_the_catalog():
    run = cli("gpus")
    assert run.returncode == 0
    assert [line.split()[0] for line in run.stdout.splitlines()] == list(GPUS)


def test_notes_say_how_the_configuration_was_read(config_file):
    # 2 pipeline stages with 1 micro-batch per step: the advice names the global batch that fills them
    one = {"model": LLAMA, "parallel": {"pp": 2, "tp": 8}, "training": {"global_batch_size": 1}}
    run = cli("estimate", "--config", config_file(one), "--json")
    notes = json.loads(run.stdout)["notes"]
    assert any("set global_batch_size to at least 2" in n for n in notes)
    # Megatron pads 128,256 to a multiple of 128 x 8 = 1,024: 126 x 1,024 = 129,024
    assert any("padded from 128,256 to 129,024" in n for n in notes)
    text = cli("estimate", "--config", config_file(one)).stdout
    assert "Note: 1 micro-batch(es) per step on 2 pipeline stages" in text


def test_default_global_batch_fills_the_pipeline(config_file):
    # auto under 1F1B: m = pp = 2 micro-batches, so stage 0 holds 2 in flight (min(p - 0, m))
    auto = json.loads(cli("estimate", "--config", config_file({"model": LLAMA, "parallel": {"pp": 2, "tp": 8}}),
                          "--json").stdout)
    assert auto["microbatches"] == 2 and auto["stages"][0]["in_flight_microbatches"] == 2
    assert any("global batch 2 (auto): 2 micro-batches per step" in n for n in auto["notes"])
    # interleaved: 2 x pp = 8 micro-batches; a larger global batch holds exactly the same memory
    layout = {"pp": 4, "vpp": 2, "tp": 8}
    auto = json.loads(cli("estimate", "--config", config_file({"model": LLAMA, "parallel": layout}), "--json").stdout)
    big = json.loads(cli("estimate", "--config", config_file({"model": LLAMA, "parallel": layout,
                                                              "training": {"global_batch_size": 512}}),
                         "--json").stdout)
    assert auto["microbatches"] == 8
    # rank 0 holds 2(p - 1) + (v - 1)p + 1 = 6 + 4 + 1 = 11 chunks of 1/v = 5.5 stacks
    assert auto["stages"][0]["in_flight_microbatches"] == 5.5
    assert auto["allocated_peak_bytes"] == big["allocated_peak_bytes"]


def test_a_run_that_does_not_fit_prints_what_to_change(config_file, tmp_path):
    path = config_file({"model": "llama-3.1-8b", "training": {"seq_len": 32768, "global_batch_size": 8},
                        "parallel": {"dp": 8, "zero_stage": 1}})
    out = json.loads(cli("estimate", "--config", path, "--json").stdout)
    assert out["fit"]["verdict"] == "oom"
    plan = out["plan_to_fit"]
    assert plan[-1]["verdict"] == "fits"
    # the last step's configuration, run through the CLI again, gives the same device total
    final = tmp_path / "final.json"
    final.write_text(json.dumps(plan[-1]["config"]))
    again = json.loads(cli("estimate", "--config", str(final), "--json").stdout)
    assert again["device_total_bytes"] == plan[-1]["device_total_bytes"] and "plan_to_fit" not in again
    assert "What to change" in cli("estimate", "--config", path).stdout


def test_the_one_shot_command_runs_without_the_cyclic_collector():
    # cli.run: the planner pauses the collector for its search, and switching it back on made one
    # collection walk every memo record of a DeepSeek-V3 plan (~0.5 s of CPU) in a process about to exit
    probe = ("import gc, estimator.cli as cli\n"
             "cli.main = lambda: print('collector on' if gc.isenabled() else 'collector off') or 3\n"
             "cli.run()\n")
    run = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True)
    assert (run.returncode, run.stdout) == (3, "collector off\n")


# Found by fuzzing the command line with valid configurations mutated one field at a time and with random serving
# objects (2026-11-27): each was a traceback ("internal error") or an answer that took tens of seconds.

def test_a_layer_without_norms_is_refused_with_the_fields_label(config_file):
    """norms_per_layer 0 divided by zero (a norm tensor of no copies); no model has none, and the activation ledger
    keeps the pre-norms' inputs whatever the count, so the field allows 1 to 16."""
    run = cli("estimate", "--config", config_file({"model": dict(LLAMA, norms_per_layer=0)}))
    assert run.returncode == 2
    assert run.stderr.strip() == ("error: Norms per layer [model.norms_per_layer] = 0: allowed: an integer from 1 "
                                  "to 16")


def test_bad_serving_input_is_refused_before_the_planner_searches(config_file, monkeypatch):
    """`estimate` with a serving object on a run that does not fit: the serving object's error came after the
    planner's search for a fitting training layout (Llama-4-Scout on one GH200: 17 s), now before any."""
    from estimator import cli as cli_module
    from estimator.search import advice

    def searched(*args, **kwargs):
        raise AssertionError("the planner searched before the serving object was checked")

    monkeypatch.setattr(advice, "plan_to_fit", searched)
    path = config_file({"model": "llama-4-scout", "hardware": {"gpu": "gh200"},
                        "serving": {"engine": "vllm", "mem_fraction_static": 0.5}})
    assert cli_module.main(["estimate", "--config", path]) == 2


def test_the_planners_search_in_estimate_is_bounded(config_file):
    """A run the single changes cannot fit asks the planner for the nearest fitting layout, a search of 20-30 s for
    a 109B MoE on one GPU; `--time-budget` bounds it and says so, and the answer is still one JSON object."""
    path = config_file({"model": "llama-4-scout", "hardware": {"gpu": "gh200"}})
    run = cli("estimate", "--config", path, "--json", "--time-budget", "0.001")
    assert run.returncode == 0
    out = json.loads(run.stdout)
    assert out["fit"]["verdict"] == "oom" and out["plan_to_fit"] and out["plan_to_fit"][-1]["verdict"] == "oom"
    assert run.stderr.startswith("note: the planner's search for the nearest fitting layout stopped after 0.001 s")
    for bad in ("0", "-1", "inf", "nan"):
        refused = cli("estimate", "--config", path, "--time-budget", bad)
        assert refused.returncode == 2 and "--time-budget" in refused.stderr, bad
