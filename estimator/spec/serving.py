"""The `serving` object of the JSON config (../shared/CONTRACT.md, "Additions: serving").

One frozen record of what an engine is asked to do: which engine and release, how much of the GPU
it may take, the longest request, the batch limits, the KV cache block and dtype, the weights'
format. Fields whose default is ``None`` are the engine's own choice (by GPU, by model); the rules
that resolve them live with the engine's version records (`vllm_versions.py`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from .errors import ConfigError
from .values import check_section
from .field import record
from .mm_limits import parse_limits

_VERSION = re.compile(r"(\d{1,3})\.(\d{1,3})(?:\.(\d{1,3}))?(?:\.?post\d+)?")


@record("speculative")
@dataclass(frozen=True)
class Speculative:
    """``serving.speculative``: speculative decoding (vLLM --speculative-config)."""

    method: str | None = None  # required: the object's switch
    num_speculative_tokens: int = 3
    draft_model: str | None = None  # draft_model: a preset or Hugging Face id; eagle/eagle3: the head's checkpoint

    def __post_init__(self) -> None:
        check_section("speculative", self)
        if self.method == "draft_model" and not self.draft_model:
            raise ConfigError("serving.speculative.draft_model", None, "a preset or Hugging Face model id",
                              "required with method 'draft_model'", ("serving.speculative.method",))

    def to_dict(self) -> dict:
        return {f: getattr(self, f) for f in ("method", "num_speculative_tokens", "draft_model")
                if f == "method" or getattr(self, f) != getattr(Speculative, f)}


def speculative_from(value: object) -> Speculative | None:
    if value is None or isinstance(value, Speculative):
        return value
    if not isinstance(value, dict):
        raise ConfigError("serving.speculative", value, "an object with method, num_speculative_tokens, draft_model")
    known = ("method", "num_speculative_tokens", "draft_model")
    for key in value:
        if key not in known:
            raise ConfigError(f"serving.speculative.{key}", value[key], f"known fields: {', '.join(known)}",
                              "unknown field")
    return Speculative(**value)


@record("serving")
@dataclass(frozen=True)
class Serving:
    engine: str = "vllm"
    engine_version: str | None = None  # None: the newest release whose rules are recorded
    gpu_memory_utilization: float = 0.9  # vLLM: the share of the GPU's total memory the engine may use
    mem_fraction_static: float | None = None  # SGLang: weights + KV pool share; None: SGLang's own choice
    max_model_len: int | None = None  # None: the model's context length (its config)
    max_num_seqs: int | None = None  # None: the engine's default for this GPU
    max_num_batched_tokens: int | None = None  # None: the engine's default for this GPU
    block_size: int | None = None  # None: the engine's default for this attention
    kv_cache_dtype: str | None = None  # None ("auto"): the model's dtype
    weight_format: str | None = None  # None ("auto"): the checkpoint's own format (its quantization_config)
    cuda_graphs: bool = True  # False: --enforce-eager
    prefix_caching: bool | None = None  # None: the engine's default for its release and the model (prefix_default.py)
    shared_prefix_tokens: int | None = None  # with prefix caching: a prompt prefix every sequence shares
    speculative: Speculative | None = None  # speculative decoding; None = off
    limit_mm_per_prompt: str | None = None  # vLLM --limit-mm-per-prompt as 'image=1,video=0'; None: 999 each
    enable_multimodal: bool | None = None  # SGLang --enable-multimodal; None: SGLang's default by architecture

    def __post_init__(self) -> None:
        for name in ("kv_cache_dtype", "weight_format"):  # the contract's "auto" is the field's auto (None)
            if getattr(self, name) == "auto":
                object.__setattr__(self, name, None)
        check_section("serving", self)
        object.__setattr__(self, "speculative", speculative_from(self.speculative))  # JSON gives an object
        if self.engine_version is not None:
            version_tuple(self.engine_version)  # refuses what is not a release number
        parse_limits(self.limit_mm_per_prompt)  # a modality named twice is refused
        if self.shared_prefix_tokens and self.prefix_caching is False:
            raise ConfigError("serving.shared_prefix_tokens", self.shared_prefix_tokens, "empty without prefix caching",
                              "a shared prefix is stored once only with prefix_caching on", ("serving.prefix_caching",))


def version_tuple(text: str) -> tuple[int, int, int]:
    """'0.11', '0.11.2' or 'v0.11.0' as (0, 11, 2); a ConfigError names the field otherwise."""
    match = _VERSION.fullmatch(text.strip().lstrip("v"))
    if not match:
        raise ConfigError("serving.engine_version", text, "a release number such as '0.11' or '0.33.0'")
    return int(match.group(1)), int(match.group(2)), int(match.group(3) or 0)
