"""`training.adapter` of the config: a LoRA, QLoRA or DoRA adapter's settings, checked as it is
built, and the bitsandbytes release whose 4-bit layer a QLoRA runs.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from .errors import ConfigError
from .choices import ALL_LINEAR, BNB_VERSION_PATTERN, QUANTIZED, TARGETS
from .values import check_section
from .field import record


# bitsandbytes: Linear4bit and NF4 arrived in 0.39.0 (the QLoRA release); MatMul4Bit keeps its input A for
# backward through 0.43.1 (autograd/_functions.py: ctx.tensors = (A, B)) and nothing of it from 0.43.2 on
# (commit 9e753741, PR #1270 "fix QLoRA mem bug: delete useless buffered activation": (None, B)); the
# harness's emulation (validation/peft/bnb.py) equals 0.49.2 on real CPU runs
BNB_VERSION = "0.49.2"
BNB_FIRST_4BIT = (0, 39, 0)
BNB_LAST_SAVING_INPUT = (0, 43, 1)
BNB_SOURCE = ("bitsandbytes autograd/_functions.py MatMul4Bit: ctx.tensors = (A, B) through 0.43.1, (None, B) from "
              "0.43.2 (commit 9e753741, PR #1270); measured with the emulation in validation/peft/bnb.py")
_VERSION = re.compile(BNB_VERSION_PATTERN)
# peft: through 0.11.1 a LoRA layer takes its base weight's floating dtype (tuners/lora/layer.py update_layer:
# self.to(weight.device, dtype=weight.dtype)); from 0.12.0 get_peft_model casts fp16/bf16 adapter weights to
# fp32 (autocast_adapter_dtype=True, tuners_utils.py _cast_adapter_dtype; commit ae1ae20b, PR #1706). The
# harness records ran 0.21.2.
PEFT_VERSION = "0.21.2"
PEFT_FIRST_FP32_ADAPTERS = (0, 12, 0)
PEFT_SOURCE = ("peft tuners/lora/layer.py LoraLayer.update_layer through v0.11.1 (self.to(weight.device, "
               "dtype=weight.dtype)); v0.12.0 tuners_utils.py BaseTuner._cast_adapter_dtype (autocast_adapter_dtype, "
               "commit ae1ae20b, PR #1706)")



@record("adapter")
@dataclass(frozen=True)
class Adapter:
    """`training.adapter` of the contract. ``base_dtype`` None: nf4 for qlora, else the weights
    dtype of the run."""

    method: str = "lora"
    rank: int = 16
    alpha: float = 32.0
    # peft 0.21's default (TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING) for Llama, Mistral, Mixtral, Qwen2/3 and
    # Gemma 1-3 (q_proj, v_proj), and for GPT-2, GPT-NeoX and Falcon (the one fused q, k, v linear: fused_qkv); peft
    # has none for Phi-3, StarCoder2, OLMo 2, Granite, gpt-oss, DeepSeek and the Qwen MoE types and asks for targets
    # (tests/test_adapters.py PEFT_DEFAULTS)
    target_modules: tuple[str, ...] = ("q", "v")
    dropout: float = 0.0
    trainable_embeddings: bool = False
    base_dtype: str | None = None
    double_quant: bool = True  # NF4's block scales quantized again (bnb_4bit_use_double_quant)
    bitsandbytes_version: str = BNB_VERSION  # the release whose Linear4bit an hf/deepspeed QLoRA runs
    prepare_kbit: bool = False  # peft's prepare_model_for_kbit_training was called (kbit.py)
    peft_version: str = PEFT_VERSION  # the release whose LoRA layers an hf run builds (their dtype)

    def __post_init__(self) -> None:
        if isinstance(self.target_modules, str):  # "all-linear" (or one name) in the JSON
            object.__setattr__(self, "target_modules", (self.target_modules,))
        elif isinstance(self.target_modules, list):
            object.__setattr__(self, "target_modules", tuple(self.target_modules))
        check_section("adapter", self)
        if ALL_LINEAR in self.target_modules and len(self.target_modules) > 1:
            raise ConfigError("training.adapter.target_modules", list(self.target_modules),
                              f"either {ALL_LINEAR!r} alone or a list of {', '.join(TARGETS)}")
        if self.method == "qlora" and self.base_dtype not in (None, "nf4"):
            raise ConfigError("training.adapter.base_dtype", self.base_dtype, "'nf4' (or auto) with method 'qlora'",
                              "QLoRA stores the base in NF4; choose method 'lora' for another base dtype",
                              related=("training.adapter.method",))
        nf4 = self.method == "qlora" or self.base_dtype == "nf4"
        if not self.double_quant and not nf4:
            raise ConfigError("training.adapter.double_quant", False, "true unless the base is NF4",
                              "double quantization is NF4's (bnb_4bit_use_double_quant)",
                              related=("training.adapter.base_dtype",))
        _check_bnb_version(self.bitsandbytes_version, nf4)
        if bnb_version(self.peft_version) < (0, 1, 0):  # its form is the field's (fields.py pattern)
            raise ConfigError("training.adapter.peft_version", self.peft_version,
                              "a peft release as major.minor[.patch], 0.1.0 or later")

    @property
    def all_linear(self) -> bool:
        return self.target_modules == (ALL_LINEAR,)

    def to_dict(self) -> dict:
        """The contract's object: every field that differs from its default, and the method."""
        out = {"method": self.method}
        for name in ("rank", "alpha", "target_modules", "dropout", "trainable_embeddings", "base_dtype",
                     "double_quant", "bitsandbytes_version", "prepare_kbit", "peft_version"):
            value, default = getattr(self, name), getattr(Adapter(), name)
            if value != default:
                out[name] = ALL_LINEAR if name == "target_modules" and self.all_linear else (
                    list(value) if isinstance(value, tuple) else value)
        return out


def bnb_version(text: str) -> tuple[int, int, int]:
    match = _VERSION.fullmatch(text)
    return tuple(int(g or 0) for g in match.groups())  # type: ignore[union-attr, return-value]


def _check_bnb_version(text: str, nf4: bool) -> None:
    if bnb_version(text) < BNB_FIRST_4BIT:  # its form is the field's (fields.py pattern)
        raise ConfigError("training.adapter.bitsandbytes_version", text,
                          "a bitsandbytes release as major.minor[.patch], 0.39.0 or later (its first 4-bit release)")
    if text != BNB_VERSION and not nf4:
        raise ConfigError("training.adapter.bitsandbytes_version", text, f"{BNB_VERSION!r} (the default) unless the "
                          "base is NF4", "the release decides what bitsandbytes' 4-bit layer keeps",
                          related=("training.adapter.base_dtype",))


def bnb_keeps_input(training) -> bool:
    """An hf/deepspeed QLoRA on bitsandbytes through 0.43.1: every 4-bit linear keeps its input."""
    from .choices import FSDP_FRAMEWORKS
    adapter = training.adapter
    return (adapter is not None and training.framework not in FSDP_FRAMEWORKS
            and base_dtype(adapter, training.param_dtype) == "nf4"
            and bnb_version(adapter.bitsandbytes_version) <= BNB_LAST_SAVING_INPUT)


def peft_adapters_in_base_dtype(adapter) -> bool:
    """peft before 0.12.0 leaves a LoRA layer in its base weight's 16-bit dtype (PEFT_SOURCE)."""
    return bnb_version(adapter.peft_version) < PEFT_FIRST_FP32_ADAPTERS


def adapter_from(value: object) -> Adapter | None:
    """`training.adapter` as given in JSON (an object) or already built."""
    if value is None or isinstance(value, Adapter):
        return value
    if not isinstance(value, dict):
        raise ConfigError("training.adapter", value, "an object with method, rank, alpha, target_modules, dropout, "
                          "trainable_embeddings, base_dtype")
    known = [f for f in Adapter.__dataclass_fields__]
    for key in value:
        if key not in known:
            raise ConfigError(f"training.adapter.{key}", value[key], f"fields of adapter: {', '.join(known)}",
                              "unknown field")
    return Adapter(**value)


def base_dtype(adapter: Adapter, param_dtype: str) -> str:
    return adapter.base_dtype or ("nf4" if adapter.method == "qlora" else param_dtype)


def refuse_quantized_base(training, why: str) -> None:
    """For a framework that does not model a quantized frozen base: refused by the field that made it so (its
    base_dtype, or the method whose default it is, qlora), `why` saying what that framework does with it."""
    adapter = training.adapter
    if adapter is None or base_dtype(adapter, training.param_dtype) not in QUANTIZED:
        return
    field, value = ("training.adapter.base_dtype", adapter.base_dtype) if adapter.base_dtype else \
        ("training.adapter.method", adapter.method)
    raise ConfigError(field, value, f"'lora' or 'dora' over a 16-bit base with framework {training.framework!r}",
                      why, related=("training.framework",))
