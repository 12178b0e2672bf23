"""vLLM and SGLang serve lines. The vLLM lines are the ones ALCF's user guide publishes for Aurora
(argonne-lcf user-guides, docs/aurora/data-science/inference/vllm.md); without the serving object in
this version, they map to inference with one full-context sequence, the engines' start-up check."""

import pytest

from estimator import ConfigError, estimate_config
from estimator.importers import estimate_imported, import_config
from estimator.models.loading import load_config
from estimator.serving.service import serving_config



def same_estimate(result, expected):
    assert result.config == expected
    assert estimate_imported(result).to_json() == estimate_config(expected).to_json()


def test_vllm_405b_on_two_nodes():
    line = ("vllm serve meta-llama/Llama-3.1-405B-Instruct --port 8000 --tensor-parallel-size 8 "
            "--pipeline-parallel-size 2 --dtype bfloat16 --trust-remote-code --max-model-len 8192 --enforce-eager")
    result = import_config(line)
    assert result.kind == "vllm"
    same_estimate(result, {"model": "llama-3.1-405b",
                           "training": {"mode": "inference", "seq_len": 8192, "kv_cache_tokens": 8192},
                           "serving": {"engine": "vllm", "cuda_graphs": False, "max_model_len": 8192},
                           "parallel": {"tp": 8, "pp": 2}})
    assert not result.unsupported  # --enforce-eager is serving.cuda_graphs off
    assert {s.name for s in result.ignored} == {"--port", "--trust-remote-code"}


def test_vllm_default_context_and_sglang():
    result = import_config("vllm serve meta-llama/Llama-3.1-8B-Instruct --port 8000 --dtype bfloat16 --enforce-eager")
    assert result.config["training"]["seq_len"] == 131072  # the model's max_position_embeddings
    line = ("python -m sglang.launch_server --model-path Qwen/Qwen3-32B --tp 2 --context-length 40960 "
            "--mem-fraction-static 0.85 --kv-cache-dtype fp8_e5m2 --max-running-requests 64 --host 0.0.0.0")
    result = import_config(line)
    assert result.kind == "sglang"
    same_estimate(result, {"model": "qwen3-32b",
                           "training": {"mode": "inference", "kv_cache_dtype": "fp8", "seq_len": 40960,
                                        "kv_cache_tokens": 40960},
                           "serving": {"engine": "sglang", "mem_fraction_static": 0.85, "max_num_seqs": 64,
                                       "kv_cache_dtype": "fp8_e5m2", "max_model_len": 40960},
                           "parallel": {"tp": 2}})
    assert not result.unsupported


def test_a_line_without_a_prefix_caching_flag_leaves_it_to_the_engine():
    """No flag: serving.prefix_caching stays unset, the engine's default (SGLang 0.5.23 fields/memory.py
    disable_radix_cache=False: on for Qwen3; vLLM 0.33 config/model.py: on for a decoder), which the estimate's
    note names; --disable-radix-cache / --no-enable-prefix-caching / --enable-prefix-caching set it."""
    on = import_config("python -m sglang.launch_server --model-path Qwen/Qwen3-8B --context-length 4096")
    assert "prefix_caching" not in on.config["serving"]
    assert any("radix cache" in n and "default" in n for n in on.notes)
    estimate = serving_config(load_config(on.config))
    assert estimate.resolved.prefix_caching and estimate.resolved.prefix_caching_default
    assert any(n.startswith("Prefix caching on: the engine's default") for n in estimate.notes)
    off = import_config("python -m sglang.launch_server --model-path Qwen/Qwen3-8B --context-length 4096 "
                        "--disable-radix-cache")
    assert off.config["serving"]["prefix_caching"] is False
    vllm = import_config("vllm serve Qwen/Qwen3-8B --max-model-len 4096")
    assert "prefix_caching" not in vllm.config["serving"]
    for flag, value in (("--no-enable-prefix-caching", False), ("--enable-prefix-caching", True)):
        assert import_config(f"vllm serve Qwen/Qwen3-8B --max-model-len 4096 {flag}").config["serving"][
            "prefix_caching"] is value


def test_a_quantized_vllm_line_names_its_weight_format_and_leaves_speculation_listed():
    line = ("vllm serve Qwen/Qwen2.5-7B-Instruct --quantization awq --max-model-len 16384 "
            "--gpu-memory-utilization 0.8 --kv-cache-dtype fp8 --speculative-config '{\"method\": \"eagle\"}'")
    result = import_config(line)
    assert result.config["serving"] == {"engine": "vllm", "gpu_memory_utilization": 0.8, "weight_format": "awq_int4",
                                        "kv_cache_dtype": "fp8", "max_model_len": 16384}
    assert [s.name for s in result.unsupported] == ["--speculative-config"]


def test_credentials_never_printed_and_world_checked():
    result = import_config("vllm serve Qwen/Qwen3-8B --api-key sk-live-123456 --max-model-len 4096")
    assert "sk-live" not in "\n".join(result.warning_lines()) and "sk-live" not in str(result.to_json())
    with pytest.raises(ConfigError, match="tp x pp x dp = 1"):
        import_config("vllm serve Qwen/Qwen3-8B --max-model-len 4096", gpus=8)
