"""`python -m estimator serve` and `estimate` with a `serving` object (CONTRACT.md, "Additions: serving")."""

from __future__ import annotations

import json

import pytest

from estimator.cli import main
from estimator.models.loading import load_config

CONTRACT_KEYS = {"engine", "engine_version", "budget_bytes", "weights_bytes", "activation_peak_bytes",
                 "non_torch_bytes", "cuda_graph_bytes", "kv_cache_bytes", "kv_cache_tokens", "num_gpu_blocks",
                 "max_concurrency", "max_model_len_that_fits", "device_total_bytes"}
LLAMA_70B_TP4 = {"model": "llama-3.1-70b", "parallel": {"tp": 4}, "serving": {"max_model_len": 32768}}


def run(capsys, tmp_path, config, *args) -> tuple[int, str, str]:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    code = main([args[0], "--config", str(path), *args[1:]])
    out, err = capsys.readouterr()
    return code, out, err


def test_serve_json_prints_the_contract_object(capsys, tmp_path):
    code, out, err = run(capsys, tmp_path, LLAMA_70B_TP4, "serve", "--json")
    assert code == 0 and err == ""
    data = json.loads(out)
    serving = data["serving"]
    assert CONTRACT_KEYS <= serving.keys()
    assert {"stages", "parameters", "fit"} <= data.keys()  # beside the usual keys
    for key in CONTRACT_KEYS - {"engine", "engine_version", "max_concurrency"}:
        assert isinstance(serving[key], int), key
    assert serving["kv_cache_tokens"] == serving["num_gpu_blocks"] * 16 * 2048 // 2048  # one group, 0.33 rule
    assert serving["max_concurrency"] == pytest.approx(serving["num_gpu_blocks"] / 2048)
    # the terms add up: the KV cache is what the budget leaves, to less than one block
    used = sum(serving[k] for k in ("weights_bytes", "activation_peak_bytes", "non_torch_bytes", "cuda_graph_bytes",
                                    "kv_cache_bytes"))
    assert 0 <= serving["budget_bytes"] - used < 80 * 16 * 2 * 2 * 128 * 2


def test_estimate_with_serving_adds_the_object_and_flags_override(capsys, tmp_path):
    code, out, _ = run(capsys, tmp_path, LLAMA_70B_TP4, "estimate", "--json")
    base = json.loads(out)["serving"]
    code, out, _ = run(capsys, tmp_path, LLAMA_70B_TP4, "estimate", "--json", "--serving-kv-cache-dtype", "fp8")
    fp8 = json.loads(out)["serving"]
    assert code == 0 and fp8["kv_cache_dtype"] == "fp8"
    available = base["budget_bytes"] - sum(base[k] for k in ("weights_bytes", "activation_peak_bytes",
                                                             "non_torch_bytes", "cuda_graph_bytes"))
    assert base["num_gpu_blocks"] == available // (80 * 16 * 2 * 2 * 128 * 2)
    assert fp8["num_gpu_blocks"] == available // (80 * 16 * 2 * 2 * 128 * 1)  # half the page
    code, out, _ = run(capsys, tmp_path, {"model": "llama-3.1-8b"}, "estimate", "--json")
    assert "serving" not in json.loads(out)  # absent object: no serving estimate


def test_serve_text_has_the_capacity_headline(capsys, tmp_path):
    code, out, _ = run(capsys, tmp_path, LLAMA_70B_TP4, "serve", "--gpu-memory-utilization", "0.8")
    assert code == 0
    assert out.startswith("Serving on vllm") and "concurrent sequences of 32,768 tokens" in out


@pytest.mark.parametrize("serving, flag, message", [
    ({"max_model_len": 2_000_000}, (), "serving.max_model_len"),
    ({"engine_version": "0.9"}, (), "serving.engine_version"),
    ({"weight_format": "int3"}, (), "serving.weight_format"),
    ({"unknown": 1}, (), "serving.unknown"),
    ({}, ("--tp", "3"), "parallel.tp"),
    ({}, ("--block-size", "12"), "serving.block_size"),
])
def test_bad_serving_input_one_line_exit_2(capsys, tmp_path, serving, flag, message):
    config = {"model": "llama-3.1-70b", "serving": serving}
    code, out, err = run(capsys, tmp_path, config, "serve", "--json", *flag)
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and message in err


def test_config_round_trip_keeps_serving():
    cfg = load_config({"model": "llama-3.1-8b", "serving": {"max_model_len": 4096, "kv_cache_dtype": "fp8"}})
    assert cfg.to_dict()["serving"] == {"max_model_len": 4096, "kv_cache_dtype": "fp8"}
    assert load_config(cfg.to_dict()).serving == cfg.serving
