"""SGLang's accounting (estimator/serving/sglang_engine.py, SGLang 0.5.23), by hand and against a public log."""

from __future__ import annotations

import pytest

from estimator.spec.errors import ConfigError
from estimator.spec.hardware import Hardware
from estimator.spec.parallel import Parallel
from estimator.models.presets import get_architecture, get_hf_config
from estimator.serving.sglang_engine import estimate_sglang, prefill_capture_sizes
from estimator.spec.serving import Serving

GiB = 2**30
MiB = 2**20
H100_MIB = 81_559


def sglang(model="llama-3.1-8b", gpu="h100-80", tp=1, **serving):
    return estimate_sglang(get_architecture(model), Serving(engine="sglang", **serving), Parallel(tp=tp),
                           Hardware(gpu), get_hf_config(model))


def test_default_mem_fraction_static_on_h100_by_hand():
    """H100 (81,559 MiB), TP 1: chunked_prefill_size 8192, decode graphs up to 256; reserved = 512 +
    1.5 x 8192 + 1 x 1 / 8 x 1024 + 2 x 256 + 8 x 58 prefill capture sizes = 13,904 MiB; fraction =
    round((81,559 - 13,904) / 81,559, 3) = 0.83."""
    assert prefill_capture_sizes(8192) == 8 + 14 + 8 + 8 + 12 + 8
    e = sglang(max_model_len=32768)
    assert (e.resolved.max_num_batched_tokens, e.resolved.max_num_seqs) == (8192, 256)
    # free before loading: the catalog's capacity less the CUDA context (766.8 MiB, measured on Hopper)
    pre = 81_559 * MiB - 804_061_184
    assert e.budget_bytes == int(pre * 0.83)
    cell = 32 * 2 * 8 * 128 * 2  # layers x (K + V) x KV heads x head_dim x bf16
    tokens = (e.budget_bytes - e.limiting.weights) // cell
    assert e.capacity.tokens == e.capacity.num_blocks == tokens
    assert e.capacity.max_concurrency == tokens / 32768


def test_given_fraction_and_mla_cell():
    """DeepSeek-V3 on 8 H200s, mem_fraction_static 0.9: the MLA cell is (512 + 64) x 61 layers x 2 B,
    the same on every TP rank."""
    e = sglang("deepseek-v3", "h200", tp=8, mem_fraction_static=0.9, max_model_len=32768)
    pre = 143_771 * MiB - 804_061_184
    assert e.budget_bytes == int(pre * 0.9)
    assert e.capacity.tokens == (e.budget_bytes - e.limiting.weights) // (576 * 61 * 2)


def test_cell_size_matches_a_public_sglang_log():
    """vLLM issue #21348: SGLang with Qwen3-235B-A22B-FP8, TP 4, mem_fraction_static 0.93: 'KV Cache is
    allocated. #tokens: 367404, K size: 8.23 GB, V size: 8.23 GB'. Our cell (94 layers x 1 KV head per
    rank x 128 x 2 B for K) times those tokens is that K size. Our token count is 12% higher: the memory
    SGLang sees free before loading under TP 4 (NCCL, custom all-reduce) is not modelled beyond the CUDA
    context."""
    e = sglang("qwen3-235b-a22b", tp=4, weight_format="fp8", mem_fraction_static=0.93)
    cell = e.capacity.kv_cache_bytes // e.capacity.tokens
    assert cell == 94 * 1 * 128 * 2 * 2
    assert round(367_404 * cell / 2 / GiB, 2) == 8.23
    assert 1.0 < e.capacity.tokens / 367_404 < 1.15


def test_sglang_refuses_what_it_does_not_use():
    with pytest.raises(ConfigError) as err:
        sglang(gpu_memory_utilization=0.8)
    assert err.value.field == "serving.gpu_memory_utilization"
    with pytest.raises(ConfigError) as err:
        sglang("gemma-3-27b")
    assert err.value.field == "serving.engine"
    with pytest.raises(ConfigError) as err:
        sglang(speculative={"method": "eagle"})
    assert err.value.field == "serving.speculative.method"
    with pytest.raises(ConfigError) as err:
        sglang(engine_version="0.4.6")
    assert err.value.field == "serving.engine_version"
