"""vLLM and SGLang serve lines. The vLLM lines are the ones ALCF's user guide publishes for Aurora
(argonne-lcf user-guides, docs/aurora/data-science/inference/vllm.md); without the serving object in
this version, they map to inference with one full-context sequence, the engines' start-up check."""

import pytest

from estimator import ConfigError, estimate_config
from estimator.importers import estimate_imported, import_config



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
                           "parallel": {"tp": 8, "pp": 2}})
    assert [s.name for s in result.unsupported] == ["--enforce-eager"]  # serving.cuda_graphs: not in this version
    assert "maps to serving.cuda_graphs" in result.unsupported[0].note
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
                           "parallel": {"tp": 2}})
    assert {s.name for s in result.unsupported} == {"--mem-fraction-static", "--max-running-requests"}


def test_credentials_never_printed_and_world_checked():
    result = import_config("vllm serve Qwen/Qwen3-8B --api-key sk-live-123456 --max-model-len 4096")
    assert "sk-live" not in "\n".join(result.warning_lines()) and "sk-live" not in str(result.to_json())
    with pytest.raises(ConfigError, match="tp x pp x dp = 1"):
        import_config("vllm serve Qwen/Qwen3-8B --max-model-len 4096", gpus=8)
