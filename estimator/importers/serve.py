"""vLLM and SGLang serve command lines (``vllm serve MODEL ...``, ``python -m sglang.launch_server
--model-path MODEL ...``) read into our JSON config.

A serve line maps to the serving object (CONTRACT.md "Additions: serving"; estimator/serving/): the
engine, max_model_len / context_length, the memory budget (vLLM's gpu_memory_utilization, SGLang's
mem_fraction_static), max_num_seqs, batched tokens, block size, the KV cache's dtype, the weights' format,
CUDA graphs and prefix caching; and to the plain inference estimate beside it: inference mode, the
model, TP / PP / DP, the weights' and the KV cache's dtypes and one sequence of the full context. A
speculative-decoding setting is listed as not modelled by name (its JSON is not read).

Flag names and defaults: vLLM's EngineArgs (vllm/engine/arg_utils.py, v0.19) and SGLang's ServerArgs
(python/sglang/srt/server_args.py).
"""

from __future__ import annotations

import re

from ..spec.errors import ConfigError
from .build import ConfigBuilder, split_flags, to_float, to_int
from .models import named_model
from .result import Imported, Ledger
from .shell import read_launch

# flag -> (arity, our field or None, what it is); None fields are read or reported below
_VLLM: dict[str, tuple[int, str | None]] = {
    "--model": (1, None), "--tensor-parallel-size": (1, "parallel.tp"), "-tp": (1, "parallel.tp"),
    "--pipeline-parallel-size": (1, "parallel.pp"), "-pp": (1, "parallel.pp"),
    "--data-parallel-size": (1, "parallel.dp"), "-dp": (1, "parallel.dp"), "--dtype": (1, None),
    "--kv-cache-dtype": (1, None), "--max-model-len": (1, None), "--quantization": (1, None), "-q": (1, None),
    "--gpu-memory-utilization": (1, "serving.gpu_memory_utilization"),
    "--max-num-seqs": (1, "serving.max_num_seqs"), "--max-num-batched-tokens": (1, "serving.max_num_batched_tokens"),
    "--block-size": (1, "serving.block_size"), "--enable-prefix-caching": (0, "serving.prefix_caching"),
    "--no-enable-prefix-caching": (0, "serving.prefix_caching"), "--enforce-eager": (0, "serving.cuda_graphs"),
    "--speculative-config": (1, None), "--enable-expert-parallel": (0, None),
    "--cpu-offload-gb": (1, None), "--swap-space": (1, None), "--enable-chunked-prefill": (0, None),
    "--max-num-partial-prefills": (1, None), "--kv-offloading-size": (1, None),
}
_SGLANG: dict[str, tuple[int, str | None]] = {
    "--model-path": (1, None), "--model": (1, None), "--tp": (1, "parallel.tp"), "--tp-size": (1, "parallel.tp"),
    "--pp": (1, "parallel.pp"), "--pp-size": (1, "parallel.pp"), "--dp": (1, "parallel.dp"),
    "--dp-size": (1, "parallel.dp"), "--dtype": (1, None), "--kv-cache-dtype": (1, None),
    "--context-length": (1, None), "--quantization": (1, None),
    "--mem-fraction-static": (1, "serving.mem_fraction_static"),
    "--max-running-requests": (1, "serving.max_num_seqs"), "--chunked-prefill-size": (1,
                                                                                     "serving.max_num_batched_tokens"),
    "--page-size": (1, "serving.block_size"), "--disable-radix-cache": (0, "serving.prefix_caching"),
    "--disable-cuda-graph": (0, "serving.cuda_graphs"), "--speculative-algorithm": (1, None),
    "--ep-size": (1, None), "--ep": (1, None), "--enable-dp-attention": (0, None),
    "--max-total-tokens": (1, None), "--cpu-offload-gb": (1, None),
}
# flags that leave memory alone (network, logging, API, tokenizer)
_NO_EFFECT = {"--host", "--port", "--served-model-name", "--api-key", "--trust-remote-code", "--tokenizer",
              "--tokenizer-path", "--tokenizer-mode", "--revision", "--download-dir", "--seed", "--log-level",
              "--disable-log-requests", "--disable-log-stats", "--uvicorn-log-level", "--chat-template",
              "--enable-auto-tool-choice", "--tool-call-parser", "--reasoning-parser", "--load-format",
              "--allowed-origins", "--root-path", "--ssl-keyfile", "--ssl-certfile", "--generation-config",
              "--max-logprobs", "--disable-fastapi-docs", "--enable-metrics", "--show-time-cost",
              "--log-requests", "--random-seed", "--skip-server-warmup", "--tokenizer-worker-num"}
_NO_EFFECT_SWITCH = {"--trust-remote-code", "--disable-log-requests", "--disable-log-stats",
                     "--enable-auto-tool-choice",
                     "--disable-fastapi-docs", "--enable-metrics", "--show-time-cost", "--log-requests",
                     "--skip-server-warmup"}
_DTYPES = {"auto": None, "bfloat16": "bf16", "bf16": "bf16", "float16": "fp16", "half": "fp16", "fp16": "fp16",
           "float32": "fp32", "float": "fp32"}
_KV = {"auto": None, "fp8": "fp8", "fp8_e4m3": "fp8", "fp8_e5m2": "fp8", "bfloat16": "bf16", "bf16": "bf16"}
# --quantization -> serving.weight_format (the formats the serving estimate loads)
_FORMAT = {"fp8": "fp8", "awq": "awq_int4", "awq_marlin": "awq_int4", "gptq": "gptq_int4", "gptq_marlin": "gptq_int4",
           "w8a8_int8": "int8", "modelopt_fp4": "nvfp4", "mxfp4": "mxfp4"}
_QUANT = {"fp8": "fp8", "awq": "int4", "gptq": "int4", "awq_marlin": "int4", "gptq_marlin": "int4",
          "bitsandbytes": "int4", "w8a8_int8": "int8", "modelopt_fp4": "fp4", "mxfp4": "mxfp4"}


def looks_like_vllm(text: str) -> bool:
    return bool(re.search(r"(^|\s)vllm\s+serve\s|vllm\.entrypoints", text))


def looks_like_sglang(text: str) -> bool:
    return bool(re.search(r"sglang\.launch_server|(^|\s)sglang\s+serve\s", text))


def read_serve(text: str, engine: str, gpus: int | None, overrides: tuple[str, ...]) -> Imported:
    ledger = Ledger()
    flags = _VLLM if engine == "vllm" else _SGLANG
    launch = read_launch(text, lambda w: w in ("serve", "vllm.entrypoints.openai.api_server",
                                               "sglang.launch_server"))
    words = list(launch.args) + list(overrides)
    if not launch.entry and words and not words[0].startswith("-"):
        words = words[1:]  # no entry word found: the command itself
    positional = None
    if words and not words[0].startswith("-"):  # `vllm serve MODEL`
        positional, words = words[0], words[1:]
    values = split_flags(words, lambda f: flags.get(f, (0 if f in _NO_EFFECT_SWITCH else 1 if f in _NO_EFFECT
                                                        else None, None))[0], ledger, f"{engine} serve")
    build = ConfigBuilder(ledger)
    build.put("training.mode", "inference")
    build.put("serving.engine", engine)
    ledger.note(f"{engine} serve: inference mode; checked as the engine checks at start-up: one sequence of the full "
                "context beside the weights")
    model = positional or values.pop("--model", None) or values.pop("--model-path", None)
    _model(model, build, ledger)
    used = set()
    for flag, value in values.items():
        arity, path = flags.get(flag, (None, None))
        if path is None:
            continue
        used.add(flag)
        if path.startswith("parallel."):
            build.set(path, to_int(flag, value, 1), flag)
        else:  # serving.*: a field of the serving object
            build.set(path, _serving_value(flag, value), flag, value)
    if not {"--enable-prefix-caching", "--no-enable-prefix-caching", "--disable-radix-cache"} & set(values):
        _prefix_caching_default(engine, ledger)
    _dtypes(values, build, ledger, used)
    _context(values, build, ledger, used, engine)
    _world(build, gpus, ledger)
    for flag, value in values.items():
        if flag in used:
            continue
        if flag in _NO_EFFECT:
            ledger.ignore(flag, "" if value is True else value, "network, logging or API setting")
        else:
            ledger.not_modelled(flag, "" if value is True else value, f"an {engine} setting the estimate does not "
                                                                       "model")
    return ledger.result(engine, {"model": build.named_model or build.model, **build.config})


def _prefix_caching_default(engine: str, ledger: Ledger) -> None:
    """No prefix-caching flag: serving.prefix_caching stays unset, the engine's own default for its release and
    the model (estimator/serving/prefix_default.py), which the estimate's notes name."""
    default = ("vLLM's default: on, except hybrid models before 0.33 and attention-free models" if engine == "vllm"
               else "SGLang's default: its radix cache on, unless a model hook turns it off")
    ledger.note(f"{engine} serve: prefix caching not set: {default} (the estimate's notes say which)")


def _serving_value(flag: str, value: object) -> object:
    if flag in ("--enforce-eager", "--disable-cuda-graph"):
        return False  # cuda_graphs off
    if flag == "--disable-radix-cache" or flag == "--no-enable-prefix-caching":
        return False
    if flag == "--enable-prefix-caching":
        return True
    if flag in ("--gpu-memory-utilization", "--mem-fraction-static"):
        return to_float(flag, value)
    if flag in ("--speculative-config", "--speculative-algorithm"):
        return value
    return to_int(flag, value, 1)


def _model(model: object, build: ConfigBuilder, ledger: Ledger) -> None:
    if not isinstance(model, str) or not model:
        raise ConfigError("--model", None, "the model to serve (vllm serve MODEL, or --model / --model-path)",
                          "missing")
    build.named_model = named_model(model, "--model", "a Hugging Face id (org/name) or the folder of a bundled model")
    ledger.mapped("model", model, f"model = \"{build.named_model}\"")


def _dtypes(values: dict, build: ConfigBuilder, ledger: Ledger, used: set) -> None:
    dtype = values.get("--dtype", "auto")
    used.add("--dtype")
    if dtype not in _DTYPES:
        raise ConfigError("--dtype", dtype, ", ".join(_DTYPES))
    if _DTYPES[dtype] not in (None, "bf16"):
        build.set("training.param_dtype", _DTYPES[dtype], "--dtype", dtype)
    quant = values.get("--quantization") or values.get("-q")
    used.update(("--quantization", "-q"))
    if quant:
        if quant not in _QUANT:
            ledger.not_modelled("--quantization", quant, "estimated with 16-bit weights")
        else:
            build.set("training.param_dtype", _QUANT[quant], "--quantization", quant)
            if quant in _FORMAT:
                build.put("serving.weight_format", _FORMAT[quant])
    elif _DTYPES[dtype] == "fp16":
        build.put("serving.weight_format", "fp16")
    kv = values.get("--kv-cache-dtype", "auto")
    used.add("--kv-cache-dtype")
    if kv not in _KV:
        raise ConfigError("--kv-cache-dtype", kv, ", ".join(_KV))
    if _KV[kv]:
        build.set("training.kv_cache_dtype", _KV[kv], "--kv-cache-dtype", kv)
    if kv in ("fp8", "fp8_e4m3", "fp8_e5m2"):
        build.put("serving.kv_cache_dtype", kv)


def _context(values: dict, build: ConfigBuilder, ledger: Ledger, used: set, engine: str) -> None:
    flag = "--max-model-len" if engine == "vllm" else "--context-length"
    used.add(flag)
    length = values.get(flag)
    if length is None:
        preset = build.named_model
        from ..models.presets import get_hf_config, preset_ids
        if preset not in preset_ids():
            raise ConfigError(flag, None, "the context length (the model's own is not known offline)", "missing")
        length = get_hf_config(preset).get("max_position_embeddings") or get_hf_config(preset).get(
            "text_config", {}).get("max_position_embeddings")
        ledger.note(f"no {flag}: the model's max_position_embeddings, {length}")
    tokens = to_int(flag, length, 1)
    build.set("training.seq_len", tokens, flag, length)
    build.put("training.kv_cache_tokens", tokens)
    build.put("serving.max_model_len", tokens)


def _world(build: ConfigBuilder, gpus: int | None, ledger: Ledger) -> None:
    needed = build.get("parallel.tp", 1) * build.get("parallel.pp", 1) * build.get("parallel.dp", 1)
    if gpus is not None and gpus != needed:
        raise ConfigError("--gpus", gpus, f"tp x pp x dp = {needed}", "the serve line's own parallel sizes decide it")
