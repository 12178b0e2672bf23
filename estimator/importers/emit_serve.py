"""``plan --emit vllm`` / ``sglang`` (``serve-plan`` options too): a serving configuration written as the
engine's serve command line, with the flags the `serve` importer reads (vLLM's EngineArgs names, SGLang's
ServerArgs names); what the line cannot carry is refused by `emit_check.verified`."""

from __future__ import annotations

import shlex

from ..spec.errors import ConfigError
from ..serving.service import prefix_caching_of
from .emit_check import hub_id, verified

# our weight formats -> the engines' --quantization (serve._FORMAT read backwards)
_QUANTIZATION = {"fp8": "fp8", "awq_int4": "awq", "gptq_int4": "gptq", "int8": "w8a8_int8", "nvfp4": "modelopt_fp4",
                 "mxfp4": "mxfp4"}
_DTYPE = {"fp16": "float16", "fp32": "float32"}


def emit_serve(engine: str, config: dict) -> str:
    """`config` (the contract's JSON, with a ``serving`` object) as a `engine` serve line."""
    from ..models.loading import load_config
    cfg = load_config(config)
    serving, par, tr = cfg.serving, cfg.parallel, cfg.training
    if serving is None or serving.engine != engine:
        raise ConfigError("serving.engine", serving.engine if serving else None, f"'{engine}' (a serving "
                          "configuration for that engine)")
    model = hub_id(cfg, engine)
    vllm = engine == "vllm"
    words = ["vllm", "serve", model] if vllm else ["python", "-m", "sglang.launch_server", "--model-path", model]
    sizes = (("--tensor-parallel-size", par.tp), ("--pipeline-parallel-size", par.pp), ("--data-parallel-size",
             par.dp)) if vllm else (("--tp-size", par.tp), ("--pp-size", par.pp), ("--dp-size", par.dp))
    words += [w for flag, size in sizes if size > 1 for w in (flag, str(size))]
    words += ["--max-model-len" if vllm else "--context-length", str(serving.max_model_len or tr.seq_len)]
    words += _precision(serving, tr)
    if vllm:
        words += ["--gpu-memory-utilization", repr(serving.gpu_memory_utilization)]
    elif serving.mem_fraction_static is not None:
        words += ["--mem-fraction-static", repr(serving.mem_fraction_static)]
    for flag, value in ((("--max-num-seqs" if vllm else "--max-running-requests"), serving.max_num_seqs),
                        (("--max-num-batched-tokens" if vllm else "--chunked-prefill-size"),
                         serving.max_num_batched_tokens),
                        (("--block-size" if vllm else "--page-size"), serving.block_size)):
        if value is not None:
            words += [flag, str(value)]
    if not serving.cuda_graphs:
        words.append("--enforce-eager" if vllm else "--disable-cuda-graph")
    # the prefix caching the estimate assumed, stated (an unset field is the engine's default for this release)
    prefix_caching = prefix_caching_of(cfg).on
    if vllm:
        words.append("--enable-prefix-caching" if prefix_caching else "--no-enable-prefix-caching")
    elif not prefix_caching:
        words.append("--disable-radix-cache")  # SGLang has no flag that turns its radix cache on: it is its default
    return verified(engine, shlex.join(words) + "\n", config)


def _precision(serving, tr) -> list[str]:
    words = []
    if serving.weight_format is not None and serving.weight_format not in ("bf16", "fp16"):
        if serving.weight_format not in _QUANTIZATION:
            raise ConfigError("serving.weight_format", serving.weight_format, ", ".join(_QUANTIZATION))
        words += ["--quantization", _QUANTIZATION[serving.weight_format]]
    elif tr.param_dtype in _DTYPE:
        words += ["--dtype", _DTYPE[tr.param_dtype]]
    if serving.kv_cache_dtype is not None:
        words += ["--kv-cache-dtype", serving.kv_cache_dtype]
    return words
