"""Record what vLLM's own KV cache accounting computes, for a grid of models, layouts and releases.

Run inside a venv holding one vLLM release (installed with ``pip install --no-deps vllm==X`` over the
system's torch, plus the pure-Python packages its imports need):

    /work/venvs/vllm/0.11.0/bin/python -m validation.vllm.kv_records --out tests/data/serving/vllm-0.11.0.json

For every case it takes the checkpoint's config.json through transformers' AutoConfig (as vLLM's
``get_config`` does), asks vLLM's ModelConfig methods for the KV heads per rank, the head size and MLA
(``get_num_kv_heads``, ``get_head_size``, ``use_mla``), splits the layers over pipeline stages with vLLM's
``get_pp_indices``, builds each layer's KV cache spec with vLLM's spec classes (sliding window from the
config's ``layer_types``, else its model-wide ``sliding_window``, as vLLM's Attention layer falls back to
the cache config's), and runs vLLM's ``get_kv_cache_configs`` over the stages with the KV memory our
estimate leaves each stage. It records the block count, the KV bytes, the "GPU KV cache size" tokens and
the maximum concurrency vLLM computes, and vLLM's ``estimate_max_model_len`` on each stage. The memory
given is ours (vLLM measures weights, activations and non-torch memory on a GPU); the record holds it
so a test can hold our KV cache accounting to vLLM's on exactly that memory.

The vLLM config is a stand-in object with the fields these functions read (model_config.max_model_len,
scheduler_config.max_num_batched_tokens, parallel_config sizes, cache_config), not a full VllmConfig,
whose construction needs a GPU platform and a model on disk.
"""

from __future__ import annotations

import argparse
import importlib
import json
import logging
import sys
import types

CASES = [
    # (preset, gpu, tp, pp, serving overrides)
    ("llama-3.1-8b", "h100-80", 1, 1, {"max_model_len": 32768}),
    ("llama-3.1-8b", "h100-80", 2, 1, {"max_model_len": 32768, "kv_cache_dtype": "fp8"}),
    ("llama-3.1-70b", "h100-80", 4, 1, {}),
    ("llama-3.1-70b", "h100-80", 2, 2, {"max_model_len": 65536}),
    ("llama-3.1-70b", "h100-80", 8, 1, {"max_model_len": 32768, "weight_format": "fp8"}),
    ("qwen2.5-7b", "l40s", 1, 1, {"max_model_len": 32768, "weight_format": "awq_int4"}),
    ("qwen3-30b-a3b", "h100-80", 2, 1, {"max_model_len": 40960}),
    ("qwen3-235b-a22b", "h100-80", 4, 1, {"max_model_len": 40960, "weight_format": "fp8"}),
    ("mixtral-8x7b", "h100-80", 2, 1, {"max_model_len": 32768}),
    ("mistral-7b", "a100-80", 1, 1, {}),
    ("gemma-3-27b", "h100-80", 1, 1, {"max_model_len": 32768}),
    ("gemma-3-27b", "h100-80", 2, 2, {"max_model_len": 131072}),
    # 0.11 at its defaults (utilization 0.9, the full 131,072 context) leaves gpt-oss-120b no KV memory on one H100
    # (vLLM issue 23278 prints "Available KV cache memory: -2.14 GiB", as our estimate does: the 0.11 sampler's
    # 1,024 x 201,088-vocabulary logits); issue 27508 serves it at 0.95, where the 1.8 GiB left holds 32,768 tokens
    ("gpt-oss-120b", "h100-80", 1, 1, {"gpu_memory_utilization": 0.95, "max_model_len": 32768}),
    ("gpt-oss-20b", "h100-80", 2, 1, {"max_model_len": 65536}),
    ("deepseek-v3", "h200", 8, 1, {"max_model_len": 32768}),
    ("deepseek-v3", "h200", 8, 2, {"max_model_len": 163840, "kv_cache_dtype": "fp8"}),
]


class _Tokens(logging.Handler):
    """The "GPU KV cache size: N tokens" lines vLLM logs. 0.11 logs one per pipeline stage, from that
    stage's own block count, before every stage takes the smallest count: the smallest line is the
    limiting stage's."""

    def __init__(self):
        super().__init__()
        self.lines = []

    def emit(self, record):
        text = record.getMessage()
        if "KV cache size:" in text:
            self.lines.append(int(text.split("KV cache size:")[1].split("tokens")[0].replace(",", "").strip()))


def _stand_in_config(max_model_len: int, batched: int, pp: int, tp: int, block_size: int):
    ns = types.SimpleNamespace
    try:  # 0.33: one KV cache layout for the model; FlashAttention's NHD (= LBNHC), the engine core's usual pick
        from vllm.config.cache import _layout_from_name
        layout = lambda: _layout_from_name("NHD")  # noqa: E731
    except ImportError:
        layout = None
    sched = ns(max_num_batched_tokens=batched, disable_hybrid_kv_cache_manager=False, async_scheduling=True,
               max_num_seqs=256)
    parallel = ns(decode_context_parallel_size=1, prefill_context_parallel_size=1, pipeline_parallel_size=pp,
                  tensor_parallel_size=tp, data_parallel_size=1)
    cache = ns(num_gpu_blocks_override=None, block_size=block_size, prefix_cache_retention_interval=None,
               kv_cache_size_tokens=None, kv_cache_max_concurrency=None, enable_prefix_caching=False,
               get_resolved_kv_cache_layout=layout)
    model = ns(max_model_len=max_model_len, supports_kv_cache_grouping=False, original_max_model_len=max_model_len)
    cfg = ns(model_config=model, scheduler_config=sched, parallel_config=parallel,
             cache_config=cache, device_config=ns(device_type="cuda"), speculative_config=None,
             kv_transfer_config=None, attention_config=ns(hisparse_config=None), use_v2_model_runner=False)
    cfg.num_prefill_lookahead_tokens = 0  # no speculative decoding
    cfg.num_speculative_tokens = 0
    cfg.max_concurrent_batches = 2 if pp == 1 else pp
    cfg.max_in_flight_tokens = cfg.max_concurrent_batches * batched
    return cfg


def _model_config_proxy(hf_config):
    """vLLM's ModelConfig methods over a transformers config, without the rest of ModelConfig."""
    from vllm.config import ModelConfig
    proxy_cls = type("ModelConfigProxy", (), {name: ModelConfig.__dict__[name] for name in (
        "is_deepseek_mla", "use_mla", "get_head_size", "get_total_num_kv_heads", "get_num_kv_heads",
        "get_model_arch_config") if name in ModelConfig.__dict__})
    proxy = proxy_cls()
    proxy.is_attention_free = False  # decoder-only transformers (ModelConfig reads the architecture)
    proxy.hf_config = hf_config
    proxy.hf_text_config = getattr(hf_config, "text_config", None) or hf_config
    if hasattr(proxy.hf_text_config, "get_text_config"):
        proxy.hf_text_config = hf_config.get_text_config()
    proxy.using_transformers_backend = lambda: False  # vLLM's own model implementations
    proxy._supports_multimodal_for_mm_prefix = lambda: False
    if hasattr(proxy, "get_model_arch_config"):  # 0.33: the architecture summary the methods read
        proxy.model_arch_config = proxy.get_model_arch_config()
    return proxy


def _specs(vllm, hf_config, proxy, tp, pp, block_size, kv_dtype, ranges):
    import torch
    interface = importlib.import_module("vllm.v1.kv_cache_interface")
    text = proxy.hf_text_config
    par = types.SimpleNamespace(tensor_parallel_size=tp, pipeline_parallel_size=pp,
                                decode_context_parallel_size=1)
    heads, head_size = proxy.get_num_kv_heads(par), proxy.get_head_size()
    dtype = torch.uint8 if kv_dtype.startswith("fp8") else torch.bfloat16
    layer_types = getattr(text, "layer_types", None)
    window = getattr(text, "sliding_window", None)
    common = dict(block_size=block_size, num_kv_heads=heads, head_size=head_size, dtype=dtype)
    stages = []
    for layers in ranges:
        specs = {}
        for i in layers:
            name = f"model.layers.{i}.self_attn.attn"
            if proxy.use_mla:
                specs[name] = interface.MLAAttentionSpec(**common, cache_dtype_str=kv_dtype if kv_dtype != "auto" else None)
            elif window and (layer_types is None or layer_types[i] == "sliding_attention"):
                specs[name] = interface.SlidingWindowSpec(**common, sliding_window=window)
            else:
                specs[name] = interface.FullAttentionSpec(**common)
        stages.append(specs)
    return stages, heads, head_size


def our_estimate(case, vllm_version: str):
    """(the release key, the preset's config.json, our vLLM estimate) for a case (preset, gpu, tp, pp, overrides)."""
    from estimator.spec.hardware import Hardware
    from estimator.spec.parallel import Parallel
    from estimator.models.presets import get_architecture, get_hf_config
    from estimator.spec.serving import Serving
    from estimator.serving.vllm_engine import estimate_vllm

    preset, gpu, tp, pp, overrides = case
    release = ".".join(vllm_version.split(".")[:2])
    raw = get_hf_config(preset)
    ours = estimate_vllm(get_architecture(preset), Serving(engine_version=release, **overrides),
                         Parallel(tp=tp, pp=pp), Hardware(gpu), raw)
    return release, raw, ours


def run_case(case, vllm_version: str) -> dict:
    from transformers import AutoConfig
    from vllm.distributed.utils import get_pp_indices

    preset, gpu, tp, pp, overrides = case
    release, raw, ours = our_estimate(case, vllm_version)
    r = ours.resolved
    config = dict(raw)
    hf_config = AutoConfig.for_model(config.pop("model_type"), **config)
    proxy = _model_config_proxy(hf_config)
    text = proxy.hf_text_config
    ranges = [range(*get_pp_indices(text.num_hidden_layers, rank, pp)) for rank in range(pp)]
    specs, heads, head_size = _specs(None, hf_config, proxy, tp, pp, r.block_size, overrides.get("kv_cache_dtype", "auto"),
                                     ranges)
    available = [s.available for s in ours.stages]
    ceiling = r.context_length
    cfg = _stand_in_config(r.max_model_len, r.max_num_batched_tokens, pp, tp, r.block_size)
    handler = _Tokens()
    logging.getLogger("vllm").addHandler(handler)
    if release >= "0.33":
        planning = importlib.import_module("vllm.v1.core.kv_cache_planning")
        utils = importlib.import_module("vllm.v1.core.kv_cache_utils")
        builder_mod = importlib.import_module("vllm.v1.core.kv_cache_config_builder")
        groups = planning.get_global_kv_cache_groups(cfg, specs)
        configs = planning.get_kv_cache_configs(cfg, specs, available, groups)
        scheduler_cfg = utils.generate_scheduler_kv_cache_config(configs)
        tokens, concurrency = utils.get_kv_cache_capacity(cfg, scheduler_cfg)
        builder = builder_mod.get_kv_cache_config_builder(cfg)
        cfg.model_config.max_model_len = ceiling
        fits = []
        for config_one, avail in zip(configs, available):
            projected = config_one.kv_cache_groups
            block = planning._pool_bytes_per_block_from_builder(builder, cfg, projected)
            fits.append(planning._estimate_max_model_len_from_groups(builder, cfg, projected, avail - block))
    else:
        utils = importlib.import_module("vllm.v1.core.kv_cache_utils")
        configs = utils.get_kv_cache_configs(cfg, specs, available)
        tokens = min(handler.lines)
        concurrency = utils.get_max_concurrency_for_kv_cache_config(cfg, configs[0])
        fits = []
        for spec_one, avail in zip(specs, available):
            cfg.model_config.max_model_len = ceiling
            fits.append(utils.estimate_max_model_len(cfg, spec_one, avail))
    # 0.11: one tensor per layer position, each shared by a layer of every group; 0.33: every tensor is a
    # view of one backing allocation of bytes_per_block x num_blocks ("Groups alias from byte 0")
    kv_bytes = [sum(t.size for t in c.kv_cache_tensors) if release < "0.33" else max(t.size for t in c.kv_cache_tensors)
                for c in configs]
    return {
        "case": {"model": preset, "gpu": gpu, "tp": tp, "pp": pp, "serving": {"engine_version": release, **overrides}},
        "vllm_version": vllm_version,
        "given": {"available_kv_bytes": available, "block_size": r.block_size,
                  "max_model_len": r.max_model_len, "max_num_batched_tokens": r.max_num_batched_tokens,
                  "model_len_ceiling": ceiling},
        "vllm": {"num_kv_heads_per_rank": heads, "head_size": head_size, "use_mla": bool(proxy.use_mla),
                 "stage_layers": [[x.start, x.stop] for x in ranges], "num_groups": len(configs[0].kv_cache_groups),
                 "num_blocks": configs[0].num_blocks, "kv_cache_bytes_per_stage": kv_bytes,
                 "kv_cache_tokens": tokens, "max_concurrency": concurrency, "max_model_len_that_fits": min(fits)},
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    import vllm
    version = vllm.__version__
    records = [run_case(case, version) for case in CASES]
    command = (f"{sys.executable} -m validation.vllm.kv_records --out {args.out}  "
               f"(vllm=={version}, torch, transformers as installed; CPU only)")
    with open(args.out, "w") as fh:
        json.dump({"command": command, "vllm_version": version, "records": records}, fh, indent=1)
        fh.write("\n")
    print(f"{len(records)} records -> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
