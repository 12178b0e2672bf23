"""`plan --emit KIND` and `serve --emit ENGINE` on the command line: the text printed is a launch
configuration of that kind, read back by its importer to one of the layouts the plan chose (or to the
serving configuration given); a kind that cannot express the run exits 2 with the field named."""

import json
import subprocess
import sys

import pytest

from estimator.importers import estimate_imported, import_config


def run(*words, timeout=300):
    return subprocess.run([sys.executable, "-m", "estimator", *words], capture_output=True, text=True,
                          timeout=timeout)


@pytest.mark.parametrize("kind, training", [
    ("hf", {"framework": "deepspeed", "seq_len": 4096}),
    ("axolotl", {"framework": "deepspeed", "seq_len": 2048}),
    ("llama-factory", {"framework": "deepspeed", "seq_len": 4096, "micro_batch_size": 2}),
    ("megatron-bridge", {"seq_len": 4096, "global_batch_size": 64, "dropout": 0.0}),
])
def test_plan_emit_writes_a_layout_the_plan_chose(kind, training, tmp_path):
    config = tmp_path / "c.json"
    config.write_text(json.dumps({"model": "llama-3.1-8b", "training": training}))
    emitted = run("plan", "--config", str(config), "--gpus", "8", "--emit", kind)
    assert emitted.returncode == 0, emitted.stderr
    imported = import_config(emitted.stdout, gpus=8)
    assert imported.kind == kind and imported.unknown == ()
    fitting = json.loads(run("plan", "--config", str(config), "--gpus", "8", "--json").stdout)["layouts"]
    if kind == "llama-factory":
        # the planner's fused loss has no LLaMA-Factory setting: its first layout with Liger's kernels
        # (enable_liger_kernel), which keep less (tests/test_liger.py), so it fits as the layout did
        assert imported.config["training"]["liger_kernel"] and "Liger's kernels" in emitted.stderr
        assert estimate_imported(imported).device_total_bytes <= fitting[0]["device_total_bytes"]
        return
    assert estimate_imported(imported).device_total_bytes in [x["device_total_bytes"] for x in fitting]


def test_serve_emit_and_refusals(tmp_path):
    config = tmp_path / "s.json"
    config.write_text(json.dumps({"model": "qwen3-8b", "parallel": {"tp": 2},
                                  "training": {"mode": "inference", "seq_len": 8192, "kv_cache_tokens": 8192},
                                  "serving": {"engine": "vllm", "max_model_len": 8192}}))
    line = run("serve", "--config", str(config), "--emit", "vllm")
    assert line.returncode == 0 and line.stdout == ("vllm serve Qwen/Qwen3-8B --tensor-parallel-size 2 "
                                                    "--max-model-len 8192 --gpu-memory-utilization 0.9 "
                                                    "--enable-prefix-caching\n")  # the estimate's (vLLM's default)
    wrong = run("serve", "--config", str(config), "--emit", "sglang")
    assert wrong.returncode == 2 and wrong.stdout == "" and "serving.engine" in wrong.stderr
    assert len(wrong.stderr.strip().splitlines()) == 1
    training = tmp_path / "t.json"
    training.write_text(json.dumps({"model": "olmo-2-13b", "training": {"framework": "torchtune", "seq_len": 4096}}))
    refused = run("plan", "--config", str(training), "--gpus", "8", "--emit", "torchtune")
    assert refused.returncode == 2 and "torchtune has no builder" in refused.stderr
