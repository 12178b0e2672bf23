"""Record vLLM's own KV cache accounting for DeepSeek Sparse Attention (DeepSeek-V3.2) and Kimi-K2.

The same method as `kv_records.py` (vLLM's spec classes and get_kv_cache_configs on CPU, over the KV memory
our estimate leaves each stage), with the specs vLLM's DeepSeek-V3.2 model registers per layer: MLA's
latent (MLAAttentionSpec with the resolved cache dtype, "fp8_ds_mla" by default in 0.11) and the lightning
indexer's key cache (models/deepseek_v2.py DeepseekV32IndexerCache.get_kv_cache_spec: an MLAAttentionSpec
of one head of index_head_dim + index_head_dim // 128 x 4 bytes, dtype uint8; the 128 is Indexer.__init__'s
quant_block_size). Kimi-K2's config.json names model_type "kimi_k2", whose configuration class is
DeepSeek-V3's (auto_map configuration_deepseek.DeepseekV3Config), so it is read as deepseek_v3.

    /work/venvs/vllm/0.11.0/bin/python -m validation.vllm.dsa_records --out tests/data/serving/dsa/vllm-0.11.0.json
    /work/venvs/vllm/0.33.0/bin/python -m validation.vllm.dsa_records --out tests/data/serving/dsa/vllm-0.33.0.json

The 0.33.0 venv (2026-11-27; the same one runs kv_records, prefix_defaults and mm_records): vLLM without its
dependencies over the system's torch 2.13 (CPU) and transformers 5.23, which the venv sees, plus the packages of the
modules on these recorders' import path (each with --no-deps, at the versions PyPI gave that day):

    python3 -m venv --system-site-packages /work/venvs/vllm/0.33.0
    /work/venvs/vllm/0.33.0/bin/pip install --no-deps vllm==0.33.0 pyzmq==27.3.0 cbor2==6.3.0 \
        openai_harmony==0.0.8 openai==3.57.0 pybase64==1.5.1 cachetools==8.0.2 msgspec==0.22.0 uvloop==0.23.0 \
        prometheus_client==0.26.0 xgrammar==0.2.8 apache-tvm-ffi==0.1.11 fastapi==0.165.0 \
        partial_json_parser==0.2.1.1.post7 llguidance==1.9.1
    # mm_records only: the processors' transforms, outside the venv
    /work/venvs/vllm/0.33.0/bin/pip install --no-deps --target /work/venvs/vlmserve-torchvision torchvision==0.28.0

(vLLM 0.33.0 asks for transformers<5.21 and llguidance<1.8; the accounting read here runs on 5.23 and 1.9.1.)
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys

from validation.core.record import write_json
from .kv_records import _model_config_proxy, _stand_in_config, _Tokens, our_estimate

CASES = [
    # (preset, gpu, tp, pp, serving overrides)
    ("deepseek-v3.2", "h200", 8, 1, {"max_model_len": 32768}),
    ("deepseek-v3.2", "h200", 8, 2, {"max_model_len": 163840}),
    ("deepseek-v3.2", "b200", 8, 1, {"max_model_len": 65536, "kv_cache_dtype": "fp8"}),
    ("kimi-k2", "h200", 8, 2, {"max_model_len": 131072}),
]


def _specs(proxy, hf_config, block_size: int, cache_dtype: str, ranges, release: str):
    """The two specs per layer as 0.11.0 builds them (MLAAttention and DeepseekV32IndexerCache
    get_kv_cache_spec), or as 0.33.0 does (mla_attention.py get_kv_cache_spec: max_tp_shards 1, the
    fp8_ds_mla cell of 656 bytes, the top-k buffer width and the index-group leader; the indexer's spec with
    cache_role INDEXER)."""
    import torch
    interface = importlib.import_module("vllm.v1.kv_cache_interface")
    sparse = hasattr(hf_config, "index_topk")  # vLLM's test for DeepSeek-V3.2 (deepseek_v2.py, models/config.py)
    dtype = torch.uint8 if cache_dtype.startswith("fp8") else torch.bfloat16
    latent = dict(block_size=block_size, num_kv_heads=1, head_size=proxy.get_head_size(), dtype=dtype,
                  cache_dtype_str=None if cache_dtype == "auto" else cache_dtype)
    index = dict(block_size=block_size, num_kv_heads=1, dtype=torch.uint8)
    if release >= "0.33":
        latent.update(max_tp_shards=1, state_content_bytes=656 if cache_dtype == "fp8_ds_mla" else None)
        if sparse:
            latent.update(topk_buffer_width=hf_config.index_topk, is_index_group_leader=True)
        index.update(max_tp_shards=1, cache_role=interface.SparseCacheRole.INDEXER)
    stages = []
    for layers in ranges:
        specs = {}
        for i in layers:
            specs[f"model.layers.{i}.self_attn.attn"] = interface.MLAAttentionSpec(**latent)
            if sparse:
                dim = hf_config.index_head_dim
                specs[f"model.layers.{i}.self_attn.indexer.k_cache"] = interface.MLAAttentionSpec(
                    head_size=dim + dim // 128 * 4, **index)
        stages.append(specs)
    return stages


def run_case(case, vllm_version: str) -> dict:
    from transformers import AutoConfig
    from vllm.distributed.utils import get_pp_indices

    preset, gpu, tp, pp, overrides = case
    release, raw, ours = our_estimate(case, vllm_version)
    r = ours.resolved
    config = {k: v for k, v in raw.items() if k not in ("auto_map", "quantization_config")}
    model_type = config.pop("model_type")
    hf_config = AutoConfig.for_model("deepseek_v3" if model_type == "kimi_k2" else model_type, **config)
    proxy = _model_config_proxy(hf_config)
    ranges = [range(*get_pp_indices(hf_config.num_hidden_layers, rank, pp)) for rank in range(pp)]
    specs = _specs(proxy, hf_config, r.block_size, r.kv_cache_dtype, ranges, release)
    available = [s.available for s in ours.stages]
    cfg = _stand_in_config(r.max_model_len, r.max_num_batched_tokens, pp, tp, r.block_size)
    handler = _Tokens()
    logging.getLogger("vllm").addHandler(handler)
    utils = importlib.import_module("vllm.v1.core.kv_cache_utils")
    fits = []
    if release >= "0.33":  # as kv_records.run_case does for 0.33
        planning = importlib.import_module("vllm.v1.core.kv_cache_planning")
        builder_mod = importlib.import_module("vllm.v1.core.kv_cache_config_builder")
        groups = planning.get_global_kv_cache_groups(cfg, specs)
        configs = planning.get_kv_cache_configs(cfg, specs, available, groups)
        tokens, concurrency = utils.get_kv_cache_capacity(cfg, utils.generate_scheduler_kv_cache_config(configs))
        builder = builder_mod.get_kv_cache_config_builder(cfg)
        cfg.model_config.max_model_len = r.context_length
        for config_one, avail in zip(configs, available):
            block = planning._pool_bytes_per_block_from_builder(builder, cfg, config_one.kv_cache_groups)
            fits.append(planning._estimate_max_model_len_from_groups(builder, cfg, config_one.kv_cache_groups,
                                                                     avail - block))
        kv_bytes = [max(t.size for t in c.kv_cache_tensors) for c in configs]
    else:
        configs = utils.get_kv_cache_configs(cfg, specs, available)
        tokens = min(handler.lines)
        concurrency = utils.get_max_concurrency_for_kv_cache_config(cfg, configs[0])
        for spec_one, avail in zip(specs, available):
            cfg.model_config.max_model_len = r.context_length
            fits.append(utils.estimate_max_model_len(cfg, spec_one, avail))
        kv_bytes = [sum(t.size for t in c.kv_cache_tensors) for c in configs]
    return {
        "case": {"model": preset, "gpu": gpu, "tp": tp, "pp": pp, "serving": {"engine_version": release, **overrides}},
        "vllm_version": vllm_version,
        "given": {"available_kv_bytes": available, "block_size": r.block_size, "kv_cache_dtype": r.kv_cache_dtype,
                  "max_model_len": r.max_model_len, "model_len_ceiling": r.context_length},
        "vllm": {"use_mla": bool(proxy.use_mla), "latent_head_size": proxy.get_head_size(),
                 "page_bytes_per_layer": {name.split("self_attn.")[1]: spec.page_size_bytes
                                          for name, spec in specs[0].items() if ".layers.0." in name},
                 "stage_layers": [[x.start, x.stop] for x in ranges], "num_groups": len(configs[0].kv_cache_groups),
                 "num_blocks": configs[0].num_blocks,
                 "kv_cache_bytes_per_stage": kv_bytes, "kv_cache_tokens": tokens, "max_concurrency": concurrency,
                 "max_model_len_that_fits": min(fits)},
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    import vllm
    version = vllm.__version__
    if not version.startswith(("0.11.", "0.33.")):
        raise SystemExit("written against vLLM 0.11.0 and 0.33.0 (their spec classes and group planning)")
    records = [run_case(case, version) for case in CASES]
    command = (f"{sys.executable} -m validation.vllm.dsa_records --out {args.out}  "
               f"(vllm=={version}, torch, transformers as installed; CPU only)")
    write_json(args.out, {"command": command, "vllm_version": version, "records": records})
    print(f"{len(records)} records -> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
