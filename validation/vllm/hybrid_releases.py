"""Record what vLLM 0.15.0-0.25.0 compute for hybrid models (Mamba-1/-2, Gated DeltaNet beside attention): the block
size, the states' mamba_cache_mode, and the KV cache's blocks, tokens and concurrency, by release, prefix caching and
speculative decoding (estimator/serving/recurrent_state.py).

No venv holds these releases: their Python files (the PyPI wheels' vllm/*.py, unzipped) go first on the path of the
0.33.0 venv's interpreter, with the few pure-Python packages the older imports want beside them:

    PYTHONPATH=/work/venvs/hybvers/src/vllm-0.19.0:/work/venvs/hybvers/extra \\
        /work/venvs/vllm/0.33.0/bin/python -m validation.vllm.hybrid_releases --out tests/data/serving/hybrid/vllm-0.19.0.json

(extra: pip install --no-deps --target extra gguf diskcache mistral_common pydantic_extra_types pycountry tiktoken.)
Everything that decides the numbers is the release's own code, run on stand-in config objects (kv_records.py's, plus
the cache and model fields these functions read): model_executor/models/config.py HybridAttentionMambaModelConfig
.verify_and_update_config (which runs MambaModelConfig's: the mode) and, from 0.20.0, platforms/interface.py
Platform._align_hybrid_block_size with the default backend's class (FlashAttention; FlashInfer on a capability-100
GPU: platforms/cuda.py _get_backend_priorities); the states' shapes and dtypes from the model classes'
get_mamba_state_shape_from_config / get_mamba_state_dtype_from_config (Qwen3-Next's module needs compressed_tensors:
its classmethods' MambaStateShapeCalculator calls are made here with the release's calculator); each recurrent
layer's MambaSpec from layers/mamba/abstract.py MambaBase.get_kv_cache_spec (over a MambaMixer2 / MambaMixer made
without __init__, holding those shapes); and v1/core/kv_cache_utils.py get_kv_cache_configs and
get_max_concurrency_for_kv_cache_config over the memory our estimate leaves for the KV cache. No drafter layers join
the specs: a speculative case records what num_speculative_tokens does to the states.
"""

from __future__ import annotations

import argparse
import importlib
import sys
import types

from validation.core.record import write_json
from .kv_records import _model_config_proxy, _specs, _stand_in_config

# (preset, gpu, tp, max_model_len, prefix caching, speculative tokens, first release that runs it)
CASES = [
    ("nemotron-h-8b", "h100-80", 1, 8192, False, 0, "0.15"),
    ("nemotron-h-8b", "h100-80", 1, 8192, True, 0, "0.15"),
    ("nemotron-h-8b", "h100-80", 1, 8192, False, 2, "0.17"),
    ("nemotron-h-8b", "h100-80", 1, 8192, True, 2, "0.17"),
    ("jamba-mini-1.5", "h100-80", 2, 131072, True, 0, "0.15"),
    ("jamba-mini-1.5", "h100-80", 2, 131072, True, 2, "0.17"),
    ("falcon-h1-7b", "h100-80", 1, 32768, True, 0, "0.15"),
    ("qwen3-next-80b-a3b", "h200", 2, 131072, False, 2, "0.15"),
    ("qwen3-next-80b-a3b", "h200", 2, 131072, True, 0, "0.15"),
    ("qwen3-next-80b-a3b", "h200", 2, 131072, True, 2, "0.17"),
    ("qwen3-next-80b-a3b", "b200", 4, 32768, False, 0, "0.15"),
]
SM100 = ("b200", "gb200", "b300")
MODULES = {"nemotron_h": ("nemotron_h", "NemotronHForCausalLM"), "jamba": ("jamba", "JambaForCausalLM"),
           "falcon_h1": ("falcon_h1", "FalconH1ForCausalLM"), "qwen3_next": ("qwen3_next", "Qwen3NextForCausalLM")}


def _release(version: str) -> str:
    return ".".join(version.split(".")[:2])


def _model_class(text, version: str):
    """(the model class or None where its module does not import here, whether it has SupportsMambaPrefixCaching)."""
    module, name = MODULES[text.model_type]
    try:
        cls = getattr(importlib.import_module(f"vllm.model_executor.models.{module}"), name)
    except ImportError:  # qwen3_next: read the class's bases from its source
        spec = importlib.util.find_spec(f"vllm.model_executor.models.{module}")
        source = open(spec.origin).read()
        head = source[source.index(f"class {name}("):]
        return None, "SupportsMambaPrefixCaching" in head[:head.index(":\n")]
    from vllm.model_executor.models.interfaces import supports_mamba_prefix_caching
    return cls, bool(supports_mamba_prefix_caching(cls))


def _qwen3_next_state(cfg):
    """Qwen3NextForCausalLM.get_mamba_state_shape_from_config / _dtype_from_config (qwen3_next.py, every release read):
    the release's calculator with num_spec = num_speculative_tokens."""
    import inspect
    from vllm.model_executor.layers.mamba.mamba_utils import MambaStateDtypeCalculator, MambaStateShapeCalculator
    text = cfg.model_config.hf_config
    spec = cfg.speculative_config
    shapes = MambaStateShapeCalculator.gated_delta_net_state_shape(
        cfg.parallel_config.tensor_parallel_size, text.linear_num_key_heads, text.linear_num_value_heads,
        text.linear_key_head_dim, text.linear_value_head_dim, text.linear_conv_kernel_dim,
        spec.num_speculative_tokens if spec else 0)
    fn = MambaStateDtypeCalculator.gated_delta_net_state_dtype
    args = (cfg.model_config.dtype, cfg.cache_config.mamba_cache_dtype)
    if "mamba_ssm_cache_dtype" in inspect.signature(fn).parameters:
        args += (cfg.cache_config.mamba_ssm_cache_dtype,)
    return shapes, fn(*args)


def _config(case, version: str, hf_config, proxy, batched: int):
    import torch
    preset, gpu, tp, max_len, caching, spec_tokens, _ = case
    ns = types.SimpleNamespace
    cfg = _stand_in_config(max_len, batched, 1, tp, 16)
    release = _release(version)
    cache = cfg.cache_config
    cache.block_size = None if release in ("0.15", "0.17") else 16  # 0.18.0 cache.py sets DEFAULT_BLOCK_SIZE first
    for name, value in (("enable_prefix_caching", caching), ("mamba_cache_mode", "none"), ("mamba_block_size", None),
                        ("mamba_page_size_padded", None), ("cache_dtype", "auto"), ("calculate_kv_scales", False),
                        ("mamba_cache_dtype", "auto"), ("mamba_ssm_cache_dtype", "auto"),
                        ("user_specified_block_size", False), ("user_specified_mamba_block_size", False),
                        ("kv_cache_dtype_skip_layers", None)):
        setattr(cache, name, value)
    if hf_config.model_type == "nemotron_h":  # its hook (model_executor/models/config.py NemotronHForCausalLMConfig)
        cache.mamba_ssm_cache_dtype = getattr(hf_config, "mamba_ssm_cache_dtype", "float32")
    model = proxy
    for name, value in vars(cfg.model_config).items():  # the stand-in's fields (max_model_len, ...)
        setattr(model, name, value)
    from vllm.config import ModelConfig
    model.get_mamba_chunk_size = types.MethodType(ModelConfig.get_mamba_chunk_size, model)
    model.dtype, model.max_model_len, model.model = torch.bfloat16, max_len, preset
    model.architecture, model.is_hybrid = hf_config.architectures[0], True  # use_mla: ModelConfig's own
    cls, supports = _model_class(hf_config, version)
    model.supports_mamba_prefix_caching = supports
    cfg.model_config = model
    cfg.scheduler_config.enable_chunked_prefill = True
    cfg.speculative_config = ns(num_speculative_tokens=spec_tokens, method="eagle") if spec_tokens else None
    cfg.num_speculative_tokens = spec_tokens
    cfg.attention_config = ns(backend=None)
    cfg.compilation_config = ns(custom_op_log_check=lambda: None, cudagraph_mode="set")  # 0.11: not None: kept
    return cfg, cls


def _state_class(cls, cfg):
    if cls is not None:
        return cls
    shape = classmethod(lambda c, v: _qwen3_next_state(v)[0])
    dtype = classmethod(lambda c, v: _qwen3_next_state(v)[1])
    return type("Qwen3NextState", (), {"get_mamba_state_shape_from_config": shape,
                                       "get_mamba_state_dtype_from_config": dtype})


def _align(cfg, cls, gpu: str, release: str):
    """The release's own block and mode setting, with its platform check answering for `gpu`."""
    config_mod = importlib.import_module("vllm.model_executor.models.config")
    registry = importlib.import_module("vllm.model_executor.models").ModelRegistry
    state_cls = _state_class(cls, cfg)
    saved = registry.resolve_model_cls
    registry.resolve_model_cls = lambda *a, **k: (state_cls, cfg.model_config.architecture)
    platform = getattr(config_mod, "current_platform", None)
    if platform is not None:
        config_mod.current_platform = types.SimpleNamespace(
            is_device_capability_family=lambda c: gpu in SM100 and c == 100)
    try:
        config_mod.HybridAttentionMambaModelConfig.verify_and_update_config(cfg)
        if release >= "0.20":
            from vllm.platforms.interface import Platform
            if gpu in SM100:  # flashinfer.py needs the flashinfer package: its FlashInferBackend's kernel block sizes,
                # [16, 32, 64] (0.20.0, 0.21.0; 0.25.0 adds 128-1024 for trtllm-gen GQA on sm100: the smallest is 16)
                backend = type("FlashInferBlocks", (), {"get_supported_kernel_block_sizes": staticmethod(
                    lambda: [16, 32, 64])})
            else:
                from vllm.v1.attention.backends.flash_attn import FlashAttentionBackend as backend
            Platform._align_hybrid_block_size(cfg, backend)
    finally:
        registry.resolve_model_cls = saved
        if platform is not None:
            config_mod.current_platform = platform
    return state_cls


def _state_specs(cfg, state_cls, text):
    """Each recurrent layer's MambaSpec from MambaBase.get_kv_cache_spec over a mixer made without __init__."""
    from vllm.model_executor.layers.mamba.mamba_mixer import MambaMixer
    from vllm.model_executor.layers.mamba.mamba_mixer2 import MambaMixer2
    shapes = tuple(state_cls.get_mamba_state_shape_from_config(cfg))
    dtypes = tuple(state_cls.get_mamba_state_dtype_from_config(cfg))
    mixer = MambaMixer if text.model_type == "jamba" else MambaMixer2
    layer = mixer.__new__(mixer)
    object.__setattr__(layer, "get_state_shape", lambda: shapes)
    object.__setattr__(layer, "get_state_dtype", lambda: dtypes)
    if cfg.cache_config.mamba_block_size is None:  # MambaModelConfig's "none" default, set before the layers are built
        cfg.cache_config.mamba_block_size = cfg.model_config.max_model_len
    spec = layer.get_kv_cache_spec(cfg)
    offset = text.num_hidden_layers if text.model_type == "falcon_h1" else 0
    kinds = getattr(text, "layer_types", None)

    def stage(layers: range, attention: dict) -> dict:
        return {f"model.layers.{offset + i}.mixer": spec for i in layers
                if text.model_type == "falcon_h1" or kinds[i] in ("linear_attention", "mamba")}
    return stage, spec


def run_case(case, version: str) -> dict:
    from transformers import AutoConfig
    from estimator.models.presets import get_architecture, get_hf_config
    from estimator.serving.vllm_engine import estimate_vllm
    from estimator.spec.hardware import Hardware
    from estimator.spec.parallel import Parallel
    from estimator.spec.serving import Serving

    preset, gpu, tp, max_len, caching, spec_tokens, _ = case
    release = _release(version)
    raw = get_hf_config(preset)
    ours = estimate_vllm(get_architecture(preset), Serving(engine_version=release, max_model_len=max_len,
                                                           prefix_caching=caching), Parallel(tp=tp), Hardware(gpu), raw)
    config = dict(raw)
    hf_config = AutoConfig.for_model(config.pop("model_type"), **config)
    proxy = _model_config_proxy(hf_config)
    text = proxy.hf_text_config
    cfg, cls = _config(case, version, hf_config, proxy, ours.resolved.max_num_batched_tokens)
    state_cls = _align(cfg, cls, gpu, release)
    stage, spec = _state_specs(cfg, state_cls, text)
    block = cfg.cache_config.block_size
    specs, _, _ = _specs(None, hf_config, proxy, tp, 1, block, "auto", [range(text.num_hidden_layers)], stage)
    available = [ours.stages[0].available]
    utils = importlib.import_module("vllm.v1.core.kv_cache_utils")
    lines = []  # _report_kv_cache_config's "GPU KV cache size: N tokens" (info_once, which logs once a process)
    utils.logger.info_once = lambda msg, *a, **k: lines.append(msg % a) if "KV cache size" in msg else None
    configs = utils.get_kv_cache_configs(cfg, specs, available)
    concurrency = utils.get_max_concurrency_for_kv_cache_config(cfg, configs[0])
    return {
        "case": {"model": preset, "gpu": gpu, "tp": tp, "max_model_len": max_len, "prefix_caching": caching,
                 "num_speculative_tokens": spec_tokens, "engine_version": release},
        "vllm_version": version,
        "given": {"available_kv_bytes": available},
        "vllm": {"block_size": block, "mamba_cache_mode": cfg.cache_config.mamba_cache_mode,
                 "mamba_block_size": spec.block_size, "state_page_bytes": spec.page_size_bytes,
                 "state_pages_per_request": spec.max_memory_usage_bytes(cfg) // spec.page_size_bytes,
                 "num_groups": len(configs[0].kv_cache_groups), "num_blocks": configs[0].num_blocks,
                 "kv_cache_tokens": int(lines[-1].split(":")[1].split("tokens")[0].replace(",", "")),
                 "max_concurrency": concurrency},
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    importlib.import_module("vllm.v1.core.kv_cache_utils")  # the release on the path imports here
    version = importlib.import_module("vllm").__version__
    records = [run_case(case, version) for case in CASES if _release(version) >= case[6]]
    command = (f"PYTHONPATH={':'.join(sys.path[1:3])} {sys.executable} -m validation.vllm.hybrid_releases "
               f"--out {args.out}  (vllm=={version} from its wheel's Python files; CPU only)")
    write_json(args.out, {"command": command, "vllm_version": version, "records": records})
    print(f"{len(records)} records -> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
