"""Record what SGLang's own start-up accounting computes, for a grid of models, layouts and GPUs.

Run inside a venv holding SGLang (``pip install --no-deps sglang==0.5.23`` over the system's torch, with a
constraints file pinning it, plus msgspec, pybase64 and pyzmq):

    /work/venvs/sglang-helper/bin/python -m validation.sglang.pool_records --out tests/data/serving/sglang-0.5.23.json

SGLang imports CUDA-only packages (sgl_kernel, flashinfer, triton, ...) at module level; they are not
installed here, and stand-in modules take their place (validation/sglang/stubs.py), as the other
harnesses stand in for CUDA kernels. Nothing of theirs runs in what is recorded.

For every case it:

1. resolves SGLang's server arguments as ``launch_server`` does (``ServerArgs(...).resolve_once()``, the
   whole resolution pipeline of arg_groups/) for the checkpoint's config.json on a machine that says it is
   a CUDA GPU of the case's memory (SGLang's own ``override_platform`` facts, and
   ``get_device_memory_capacity`` answering the catalog's MiB): mem_fraction_static, chunked_prefill_size,
   the decode and prefill CUDA graphs' sizes, page_size, the radix cache and hybrid settings;
2. publishes them as SGLang's runtime context and builds SGLang's ModelConfig, the layer split of each
   pipeline rank (``resolve_layer_indices`` over ``get_pp_indices``), a KVCacheConfigurator and the pool
   configurator SGLang picks (``create_memory_pool_configurator``);
3. runs ``KVCacheConfigurator._profile_available_bytes`` on a GPU whose free memory before loading is our
   pre-load memory and after loading that less our weights (the pools' budget, after a hybrid model's
   recurrent-state pool, ``_handle_max_mamba_cache``), sizes the pools from the bytes our estimate leaves
   the rank (``calculate_pool_sizes``), then ``resolve_max_num_reqs``.

The memory and the weights given are ours (SGLang measures both on a GPU); the record holds them so a test
can hold our accounting to SGLang's on exactly that memory. ``serving.prefix_caching`` is our field for SGLang's
radix cache: a case that does not turn it on runs with ``--disable-radix-cache``, and its record says
``prefix_caching: false`` (unset, the estimate takes SGLang's default: on).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import types

from validation.core.record import write_json

CASES = [
    # (preset, gpu, tp, pp, serving overrides)
    ("llama-3.1-8b", "h100-80", 1, 1, {"max_model_len": 32768}),
    ("llama-3.1-8b", "h100-80", 2, 1, {"kv_cache_dtype": "fp8_e4m3"}),
    ("llama-3.1-8b", "a100-40", 1, 1, {"max_num_seqs": 64}),
    ("llama-3.1-70b", "h100-80", 4, 1, {}),
    ("llama-3.1-70b", "h100-80", 8, 1, {"weight_format": "fp8"}),
    ("llama-3.1-70b", "h100-80", 2, 2, {}),
    ("qwen2.5-7b", "l40s", 1, 1, {}),
    ("qwen3-30b-a3b", "h100-80", 2, 1, {}),
    ("qwen3-235b-a22b", "h100-80", 4, 1, {"weight_format": "fp8", "mem_fraction_static": 0.93}),
    ("qwen3-235b-a22b", "h200", 8, 1, {}),
    ("mixtral-8x7b", "h100-80", 2, 1, {}),
    ("mistral-7b", "a100-80", 1, 1, {}),
    ("deepseek-v3", "h200", 8, 1, {}),
    ("deepseek-v3", "h200", 8, 1, {"kv_cache_dtype": "fp8_e4m3", "block_size": 64}),
    ("gemma-3-27b", "h100-80", 1, 1, {}),
    ("gpt-oss-20b", "h100-80", 1, 1, {}),
    ("gpt-oss-120b", "h100-80", 2, 1, {}),
    # hybrids with SGLang's default radix cache (prefix_caching on) and without it (--disable-radix-cache)
    ("qwen3-next-80b-a3b", "h100-80", 4, 1, {"prefix_caching": True}),
    ("qwen3-next-80b-a3b", "h200", 2, 1, {"max_model_len": 65536, "prefix_caching": True}),
    ("qwen3-next-80b-a3b", "h100-80", 4, 1, {}),
    ("qwen3-next-80b-a3b", "h200", 4, 1, {"max_num_seqs": 128}),
    ("nemotron-h-8b", "h100-80", 1, 1, {"prefix_caching": True}),
    ("nemotron-h-8b", "a100-40", 2, 1, {"prefix_caching": True}),
    ("nemotron-h-8b", "h100-80", 2, 2, {"prefix_caching": True}),
    ("nemotron-h-8b", "h100-80", 1, 1, {"max_num_seqs": 64}),
    # Falcon-H1: attention and a Mamba-2 state in every layer; TP 2 replicates its one group (extra groups)
    ("falcon-h1-7b", "h100-80", 1, 1, {"prefix_caching": True}),
    ("falcon-h1-7b", "h100-80", 2, 1, {}),
    ("llama-3.1-8b", "h100-80", 1, 1, {"max_model_len": 32768, "prefix_caching": True}),
    ("llama-3.1-8b", "b200", 1, 1, {"max_model_len": 32768}),
    ("qwen3-30b-a3b", "b200", 2, 1, {}),
    ("deepseek-v3", "b200", 8, 1, {}),
    # the smaller GPUs' tiers of chunked_prefill_size and the decode graphs' batch
    ("llama-3.2-3b", "l4", 1, 1, {"max_model_len": 16384}),
    ("llama-3.2-1b", "rtx-4090", 1, 1, {}),
    ("qwen2.5-7b", "l40s", 4, 1, {}),
    # Qwen2.5-VL: served multimodal by default (the VLM share, the 100 MiB embedding cache), the tower in the weights
    ("qwen2.5-vl-7b", "h100-80", 1, 1, {}),
    ("qwen2.5-vl-7b", "h100-80", 2, 1, {"max_model_len": 32768}),
    ("qwen2.5-vl-7b", "a100-40", 1, 1, {"max_model_len": 32768}),
    ("qwen2.5-vl-7b", "h100-80", 2, 2, {}),
    ("qwen2.5-vl-7b", "h100-80", 1, 1, {"enable_multimodal": False}),
    ("gemma-3-27b", "h100-80", 1, 1, {"enable_multimodal": True}),  # Gemma 3's vision served
    ("gemma-3-27b", "h200", 2, 1, {"enable_multimodal": True, "max_model_len": 32768}),
]

_SM = {"h100-80": (9, 0), "h200": (9, 0), "a100-40": (8, 0), "a100-80": (8, 0), "l40s": (8, 9), "b200": (10, 0), "l4": (8, 9),
       "rtx-4090": (8, 9)}
_KV = {None: "auto", "fp8_e4m3": "fp8_e4m3", "fp8": "fp8_e4m3", "fp8_e5m2": "fp8_e5m2"}


def _platform(gpu: str):
    from sglang.srt.runtime_context import override_platform
    major, minor = _SM[gpu]
    return override_platform(is_cuda=True, is_hip=False, is_npu=False, is_xpu=False, is_musa=False, is_mps=False,
                             is_sm90=major == 9, is_sm100=major == 10, is_sm100_or_sm110=major == 10,
                             is_sm110=False, is_sm120=False, is_blackwell=major == 10,
                             is_hopper_with_cuda_12_3=major == 9,
                             has_amx=False, has_flashinfer=True, device_capability=(major, minor),
                             device_sm=major * 10 + minor)


def _gpu_memory(mib: int) -> None:
    """Every module's reference to get_device_memory_capacity answers the GPU's MiB."""
    for name, module in list(sys.modules.items()):
        if name.startswith("sglang") and hasattr(module, "get_device_memory_capacity"):
            module.get_device_memory_capacity = lambda device=None, _m=mib: _m


def _server_args(model_dir: str, tp: int, pp: int, serving: dict):
    from sglang.srt.server_args import ServerArgs
    kwargs = dict(model_path=model_dir, tp_size=tp, pp_size=pp, device="cuda",
                  kv_cache_dtype=_KV[serving.get("kv_cache_dtype")])
    if serving.get("prefix_caching") is not None:  # our field is the radix cache; unset: SGLang's own default
        kwargs["disable_radix_cache"] = not serving["prefix_caching"]
    if serving.get("mem_fraction_static"):
        kwargs["mem_fraction_static"] = serving["mem_fraction_static"]
    if serving.get("max_num_seqs"):
        kwargs["max_running_requests"] = serving["max_num_seqs"]
    if serving.get("block_size"):
        kwargs["page_size"] = serving["block_size"]
    if serving.get("enable_multimodal") is not None:
        kwargs["enable_multimodal"] = serving["enable_multimodal"]
    if serving.get("max_model_len"):
        kwargs["context_length"] = serving["max_model_len"]
    import sglang.srt.utils as utils
    import sglang.srt.utils.common as common
    saved = utils.is_cuda, common.is_cuda
    # a CUDA machine: the prefill graphs' default backend (cuda_graph_config.default_prefill_backend) asks
    # is_cuda() when the record is built
    utils.is_cuda = common.is_cuda = lambda: True
    try:
        args = ServerArgs(**kwargs)
        args.resolve_once()
    finally:
        utils.is_cuda, common.is_cuda = saved
    return args


def _cuda_quantizations() -> None:
    """The quantization methods SGLang registers on a CUDA machine (layers/quantization/__init__.py registers
    mxfp4 only on CPU, CUDA, gfx95 and XPU platforms, and this one says it is none of them at import)."""
    from sglang.srt.layers import quantization
    quantization.BASE_QUANTIZATION_METHODS.setdefault("mxfp4", quantization.Mxfp4Config)
    quantization.QUANTIZATION_METHODS.setdefault("mxfp4", quantization.Mxfp4Config)


def _resolved(args) -> dict:
    from sglang.srt.arg_groups.overrides import resolved_view
    args = resolved_view(args)  # the arguments after every handler's declarations
    graphs = args.cuda_graph_config
    out = {"mem_fraction_static": args.mem_fraction_static, "chunked_prefill_size": args.chunked_prefill_size,
           "decode_cuda_graph_max_bs": graphs.decode.max_bs, "decode_cuda_graph_backend": str(graphs.decode.backend),
           "prefill_cuda_graph_backend": str(graphs.prefill.backend),
           "prefill_cuda_graph_sizes": len(graphs.prefill.bs or ()), "page_size": args.page_size,
           "disable_radix_cache": args.disable_radix_cache, "max_running_requests": args.max_running_requests,
           "kv_cache_dtype": args.kv_cache_dtype, "attention_backend": args.attention_backend}
    for name in ("mamba_radix_cache_strategy", "swa_full_tokens_ratio", "mamba_full_memory_ratio",
                 "disable_overlap_schedule"):
        out[name] = getattr(args, name, None)
    return out


def run_case(case) -> dict:
    from estimator.models.presets import get_architecture, get_hf_config
    from estimator.serving.sglang_engine import estimate_sglang, pre_load_bytes
    from estimator.spec.hardware import Hardware
    from estimator.spec.parallel import Parallel
    from estimator.spec.serving import Serving

    preset, gpu, tp, pp, overrides = case
    # a case runs without the radix cache (--disable-radix-cache) unless it turns it on: its record says which
    overrides = {"prefix_caching": False, **overrides}
    raw = get_hf_config(preset)
    ours = estimate_sglang(get_architecture(preset), Serving(engine="sglang", **overrides), Parallel(tp=tp, pp=pp),
                           Hardware(gpu), raw)
    available = [max(s.available, 0) for s in ours.stages]
    hardware = Hardware(gpu)
    with tempfile.TemporaryDirectory() as model_dir, _platform(gpu):
        with open(os.path.join(model_dir, "config.json"), "w") as fh:
            json.dump(raw, fh)
        _gpu_memory(round(hardware.device.capacity_bytes / 2**20))
        args = _server_args(model_dir, tp, pp, overrides)
        resolved = _resolved(args)
        pre = pre_load_bytes(ours)  # less the CUDA context and the process groups (sglang_dist_init.py)
        pools = [_pools(args, tp, pp, rank, avail, pre, stage.weights)
                 for rank, (avail, stage) in enumerate(zip(available, ours.stages))]
    return {"case": {"model": preset, "gpu": gpu, "tp": tp, "pp": pp, "serving": {"engine": "sglang", **overrides}},
            "given": {"available_kv_bytes": available, "gpu_mib": round(hardware.device.capacity_bytes / 2**20),
                      "pre_model_load_bytes": pre, "weights_bytes": [s.weights for s in ours.stages]},
            "sglang": {**resolved, "ranks": pools}}


def _pools(args, tp: int, pp: int, rank: int, available: int, pre: int | None = None, weights: int = 0) -> dict:
    """Publish the resolved arguments, build what KVCacheConfigurator builds for one rank, size its pools."""
    import torch
    from sglang.srt.configs.model_config import ModelConfig
    from sglang.srt.distributed.utils import get_pp_indices
    from sglang.srt.mem_cache import kv_cache_configurator as kvc_mod
    from sglang.srt.model_executor.model_runner_components.layer_setup import resolve_layer_indices
    from sglang.srt.model_executor.pool_configurator import create_memory_pool_configurator
    from sglang.srt.runtime_context import publish

    from sglang.srt.arg_groups.overrides import resolved_view
    publish(args, role="scheduler")
    view = resolved_view(args)
    model_config = ModelConfig.from_server_args(args)
    start, end = get_pp_indices(model_config.num_hidden_layers, rank, pp)
    layer_info = resolve_layer_indices(model=types.SimpleNamespace(start_layer=start, end_layer=end),
                                       model_config=model_config, is_draft_worker=False)
    kv_dtype = {"auto": model_config.dtype, "fp8_e4m3": torch.float8_e4m3fn,
                "fp8_e5m2": torch.float8_e5m2}[view.kv_cache_dtype]
    kvc = _configurator(kvc_mod, args, view, model_config, layer_info, kv_dtype, pp)
    rest_gb = available / (1 << 30)
    state = {}
    profiled = _profiled(kvc_mod, kvc, pre, weights) if pre is not None else None
    if kvc.mambaish_config is not None:
        after = kvc._handle_max_mamba_cache(rest_gb)
        from sglang.srt.runtime_context import get_schedule
        params = kvc.mambaish_config.mamba2_cache_params
        state = {"max_mamba_cache_size": get_schedule().max_mamba_cache_size,
                 "mamba_cache_per_req": params.mamba_cache_per_req, "mamba_layers": len(params.layers),
                 "state_bytes": available - int(after * (1 << 30))}
        rest_gb = after
    configurator = create_memory_pool_configurator(kvc)
    config = configurator.calculate_pool_sizes(int(rest_gb * (1 << 30)), view.page_size)
    tokens = config.max_total_num_tokens
    return {"stage_layers": [start, end], "configurator": type(configurator).__name__, "profiled_bytes": profiled,
            "cell_size": getattr(configurator, "_cell_size", None), "max_total_num_tokens": tokens,
            "full_max_total_num_tokens": config.full_max_total_num_tokens,
            "swa_max_total_num_tokens": config.swa_max_total_num_tokens,
            "max_running_requests": kvc.resolve_max_num_reqs(tokens), "context_len": model_config.context_len,
            **state}


def _profiled(kvc_mod, kvc, pre: int, weights: int):
    """KVCacheConfigurator._profile_available_bytes (the pools' budget, after a hybrid's state pool) on a GPU
    whose free memory after loading is pre - weights (our weights: SGLang measures them on the GPU)."""
    from sglang.srt.runtime_context import get_parallel
    saved = kvc_mod.get_available_gpu_memory
    kvc_mod.get_available_gpu_memory = lambda *a, **k: (pre - weights) / (1 << 30)
    try:  # the WORLD group is read only to pass to the (stood-in) free-memory query
        with get_parallel().override(world_group=types.SimpleNamespace(cpu_group=None)):
            return kvc._profile_available_bytes(pre / (1 << 30))
    except Exception as err:  # noqa: BLE001 - recorded, not hidden
        return f"{type(err).__name__}: {err}"[:200]
    finally:
        kvc_mod.get_available_gpu_memory = saved


def _configurator(kvc_mod, args, view, model_config, layer_info, kv_dtype, pp):
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm
    aux = types.SimpleNamespace(draft_model_config=None, dflash_draft_num_layers=None, eagle_draft_num_layers=None,
                                eagle_draft_swa_num_layers=None)
    return kvc_mod.KVCacheConfigurator(
        device="cuda", gpu_id=0, attn_dp_size=1, pp_size=pp, pp_group=None, model=None, model_config=model_config,
        server_args=args, kv_cache_dtype=kv_dtype, model_dtype=model_config.dtype, page_size=view.page_size,
        sliding_window_size=model_config.sliding_window_size if hasattr(model_config, "sliding_window_size") else None,
        spec_algorithm=SpeculativeAlgorithm.from_string(None), is_draft_worker=False, post_capture_kv_active=False,
        spec_aux_config=aux, is_hybrid_swa=model_config.is_hybrid_swa, is_hybrid_swa_compress=False,
        use_mla_backend=model_config.attention_arch.name == "MLA", layer_info=layer_info, forward_stream=None,
        req_to_token_pool=None, token_to_kv_pool_allocator=None, memory_pool_config=None,
        kv_cache_dtype_str=view.kv_cache_dtype)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--only", type=int, nargs="*", help="case indices (for a quick check)")
    args = parser.parse_args(argv)
    from validation.sglang.stubs import install
    install()
    import sglang
    version = sglang.__version__
    _cuda_quantizations()
    cases = [CASES[i] for i in args.only] if args.only else CASES
    records = []
    for case in cases:
        try:
            records.append(run_case(case))
        except Exception as err:  # a case SGLang refuses is recorded with its message
            import traceback
            traceback.print_exc()
            records.append({"case": {"model": case[0], "gpu": case[1], "tp": case[2], "pp": case[3],
                                     "serving": {"engine": "sglang", "prefix_caching": False, **case[4]}},
                            "error": f"{type(err).__name__}: {err}"[:400]})
        print(json.dumps(records[-1])[:600], flush=True)
    command = (f"{sys.executable} -m validation.sglang.pool_records --out {args.out}  "
               f"(sglang=={version} --no-deps, torch, transformers as installed; CPU only, CUDA packages stood in)")
    write_json(args.out, {"command": command, "sglang_version": version, "records": records})
    print(f"{len(records)} records -> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
