"""What a checkpoint's config.json says that serving needs: its weight format and context length.

``weight_format: "auto"`` reads the checkpoint's ``quantization_config`` the way vLLM picks a
quantization method from it (model_executor/layers/quantization: ``quant_method`` fp8, gptq, awq, mxfp4,
modelopt/modelopt_fp4, compressed-tensors), else its ``torch_dtype`` (bf16 unless float16). The context
length is ``max_position_embeddings`` (text_config for multimodal wrappers), else the transformers
configuration class's default for the family (estimator/models/hf_config.py), as vLLM derives max_model_len.
"""

from __future__ import annotations

from typing import Any

from ..spec.errors import ConfigError
from .weights import WeightFormat


def _text_config(config: dict) -> dict:
    text = config.get("text_config")
    return {**config, **text} if isinstance(text, dict) else config


def _quantized_format(q: dict) -> str | None:
    method = str(q.get("quant_method", "")).lower()
    if method == "fp8":
        return "fp8"
    if method in ("gptq", "gptq_marlin") and q.get("bits", 4) == 4:
        return "gptq_int4"
    if method in ("awq", "awq_marlin") and q.get("bits", q.get("w_bit", 4)) == 4:
        return "awq_int4"
    if method == "mxfp4":
        return "mxfp4"
    if method in ("modelopt", "modelopt_fp4") and "FP4" in str(q.get("quant_algo", q.get("quantization", ""))).upper():
        return "nvfp4"
    if method == "modelopt":
        return "fp8"
    if method == "compressed-tensors":
        groups = q.get("config_groups") or {}
        weights = next(iter(groups.values()), {}).get("weights", {}) if groups else {}
        bits, kind = weights.get("num_bits"), weights.get("type")
        if bits == 8:
            return "fp8" if kind == "float" else "int8"
        if bits == 4:
            return "nvfp4" if kind == "float" else "gptq_int4"
    return None


def checkpoint_format(config: dict | None, requested: str | None, arch=None) -> WeightFormat:
    """The format the weights are loaded in; a named format overrides the checkpoint's. MXFP4 is an MoE's: vLLM's and
    SGLang's Mxfp4Config quantize the fused experts and leave every linear layer unquantized, so a dense model
    (`arch` without experts) is refused it rather than estimated as bf16 under another name."""
    if requested == "mxfp4" and arch is not None and not arch.is_moe:
        raise ConfigError("serving.weight_format", requested, "a format of the model's linear layers for a dense "
                          "model (bf16, fp16, fp8, int8, gptq_int4, awq_int4, nvfp4)",
                          "MXFP4 quantizes an MoE's experts only (quantization/mxfp4.py Mxfp4Config: linear layers "
                          "unquantized)")
    config = _text_config(config or {})
    dtype_bytes = 2
    q = config.get("quantization_config") if isinstance(config.get("quantization_config"), dict) else {}
    requested = requested or "auto"
    name = requested
    if requested == "auto":
        found = _quantized_format(q) if q else None
        if q and found is None:
            raise ConfigError("serving.weight_format", "auto", "a named weight format",
                              f"the checkpoint's quantization_config ({q.get('quant_method')!r}) is not one this "
                              "estimate models")
        dtype = str(config.get("torch_dtype") or config.get("dtype") or "bfloat16")
        name = found or ("fp16" if dtype == "float16" else "bf16")
    dtype = str(config.get("torch_dtype") or config.get("dtype") or "bfloat16")
    dtype_name = "fp16" if name == "fp16" or (requested == "auto" and dtype == "float16") else "bf16"
    block, per_channel = None, False
    if name == "fp8" and q.get("weight_block_size"):
        size = q["weight_block_size"]
        block = (int(size[0]), int(size[1]))
    if name == "fp8" and str(q.get("quant_method")) == "compressed-tensors":
        groups = q.get("config_groups") or {}
        weights = next(iter(groups.values()), {}).get("weights", {}) if groups else {}
        per_channel = weights.get("strategy") == "channel"
    return WeightFormat(name, block, dtype_bytes, per_channel, dtype_name)


def context_length(config: dict | None) -> int | None:
    if not config:
        return None
    text = _text_config(config)
    value: Any = text.get("max_position_embeddings")
    if value is None:
        from ..models.hf_config import FAMILIES
        family = FAMILIES.get(str(text.get("model_type")))
        value = family.defaults.get("max_position_embeddings") if family else None
    return int(value) if isinstance(value, (int, float)) and value > 0 else None
