"""A Hugging Face ``config.json`` (as a dict) to the canonical `Architecture`.

Each supported ``model_type`` follows its transformers configuration class: a field missing from
the file takes that class's default (not `PretrainedConfig`'s), and details that decide the exact
parameter count (biases, extra norms, shared-expert gates, router biases, attention sinks, MTP
modules) are carried into the canonical fields. Each family is one `Family` record in `FAMILIES`:
its reader, the defaults of its transformers ``configuration_<model>.py`` class (transformers
4.5x) and the keys it understands; each reader names what its modelling code stores per layer.

Pure function, no I/O: `architecture_from_hf_config(config)` returns the architecture and the
list of fields the file has that this mapping does not know (shown to the user as "ignored").
"""

from __future__ import annotations

from ..spec.architecture import Architecture
from ..spec.errors import ConfigError
from .hf_common import _COMMON_KEYS
from .hf_dropout import config_dropouts
from .hf_families import FAMILIES, _Reader
from .hf_hybrid import HYBRID_FAMILIES  # noqa: F401  (registers Qwen3-Next and Nemotron-H in FAMILIES)
from .hf_vision import vision_fields  # (registers Qwen2.5-VL in FAMILIES)
from .hf_sparse import SPARSE_FAMILIES  # noqa: F401  (registers DeepSeek-V3.2 and Kimi-K2 in FAMILIES)
from .hf_llama4 import LLAMA4_FAMILIES  # noqa: F401  (registers Llama 4's text model in FAMILIES)


# Multimodal wrappers whose text model has no `model_type` of its own in `text_config`.
_TEXT_MODEL_TYPES = {"gemma3": "gemma3_text", "mistral3": "mistral", "llava": "llama", "llama4": "llama4_text"}

def _supported_text() -> str:
    return ", ".join(SUPPORTED_MODEL_TYPES)

SUPPORTED_MODEL_TYPES: tuple[str, ...] = tuple(sorted(FAMILIES))


# --- entry point ------------------------------------------------------------------------------

def _model_type(config: dict, field: str) -> str | None:
    value = config.get("model_type")
    if value is not None and not isinstance(value, str):
        raise ConfigError(field, value, _supported_text())
    return value


def _text_model_config(config: dict) -> tuple[dict, str]:
    """A multimodal config's language model (``text_config``) and the prefix that names its
    fields, else the config itself."""
    model_type = _model_type(config, "model.model_type")
    text = config.get("text_config")
    if text is not None and not isinstance(text, dict):
        raise ConfigError("model.text_config", text, "an object (the language model's config)")
    if (model_type in FAMILIES and model_type != "gemma3") or text is None:
        return config, "model."
    merged = dict(text)
    if not _model_type(merged, "model.text_config.model_type"):
        inferred = _TEXT_MODEL_TYPES.get(str(model_type))
        if inferred is None:
            raise ConfigError("model.text_config.model_type", None, _supported_text(),
                              f"the text model of a {model_type!r} config does not name its model_type")
        merged["model_type"] = inferred
    if "tie_word_embeddings" not in merged and "tie_word_embeddings" in config:
        tie = config["tie_word_embeddings"]
        if tie is not None and not isinstance(tie, bool):
            raise ConfigError("model.tie_word_embeddings", tie, "true or false")
        merged["tie_word_embeddings"] = tie
    return merged, "model.text_config."


def context_length(config: dict) -> int | None:
    """The context window a ``config.json`` gives (its language model's, for a multimodal one):
    ``max_position_embeddings`` (GPT-2's ``n_positions``), or where the file leaves it out, the
    default of its transformers config class (`FAMILIES`: Gemma3TextConfig's 131072, which
    google/gemma-3-27b-pt's config.json does not repeat); None for a model type not listed."""
    text, _ = _text_model_config(config)
    for key in ("max_position_embeddings", "n_positions"):
        if isinstance(text.get(key), int):
            return text[key]
    family = FAMILIES.get(text.get("model_type"))
    defaults = family.defaults if family else {}
    return defaults.get("max_position_embeddings") or defaults.get("n_positions")


# the model types peft 0.21.2 converts from transformers v4 names to the fused experts: peft's
# utils/transformers_weight_conversion.py lines 44-45 (transformers' _MODEL_TO_CONVERSION_PATTERN plus "mixtral") and
# lines 332-352 (_MOE_TARGET_MODULE_MAPPING for "mixtral" and "qwen2_moe" only); transformers 5.23
# conversion_mapping.py maps qwen3_moe, qwen3_next and deepseek_v2/v3/v32 to "qwen2_moe" and has no key qwen2_moe,
# llama4, gpt_oss or jamba (measured: tests/data/measured/peft_wrap/moe-lora-wrap.json)
PEFT_MOE_CONVERSION = {"mixtral": "mixtral", "qwen3_moe": "qwen2_moe", "qwen3_next": "qwen2_moe",
                       "deepseek_v2": "qwen2_moe", "deepseek_v3": "qwen2_moe", "deepseek_v32": "qwen2_moe"}


def architecture_from_hf_config(config: dict, name: str | None = None) -> tuple[Architecture, list[str]]:
    """Build the canonical architecture from a Hugging Face ``config.json`` dict.

    Returns ``(architecture, ignored)`` where `ignored` lists the fields of the file that this
    mapping does not use for a supported model type (empty for a standard file). Raises
    `ConfigError` on an unsupported ``model_type`` or a bad value.
    """
    if not isinstance(config, dict):
        raise ConfigError("model", type(config).__name__, "a config.json object")
    original = config
    config, prefix = _text_model_config(config)
    model_type = config.get("model_type")
    if model_type is None:
        raise ConfigError("model.model_type", None, _supported_text(),
                          "a Hugging Face config.json must name its model_type")
    if model_type not in FAMILIES:
        raise ConfigError("model.model_type", model_type, _supported_text(),
                          f"model type {model_type!r} is not a supported decoder-only transformer")
    reader = _Reader(config, model_type, prefix)
    family = FAMILIES[model_type]
    fields, notes = family.build(reader)
    vision, unread = vision_fields(original, fields["hidden_size"])  # the vision tower, read from vision_config
    fields.update(vision)
    dropouts, dropout_notes = config_dropouts(config, model_type, prefix)
    fields.update(dropouts)
    notes = notes + unread + dropout_notes
    known = _COMMON_KEYS | family.keys | {"text_config", "vision_config"}
    ignored = sorted(str(k) for k in config if k not in known)
    if prefix != "model.":
        ignored = [f"text_config.{k}" for k in ignored]
    fields["name"] = name or reader.text("_name_or_path") or model_type
    if fields.get("num_experts"):
        fields["peft_moe_conversion"] = PEFT_MOE_CONVERSION.get(model_type, "none")
        fields["router_is_linear"] = model_type == "llama4_text"
    try:
        arch = Architecture(**{k: v for k, v in fields.items() if v is not None or k == "intermediate_size"})
    except TypeError as error:  # pragma: no cover - a builder bug, not user input
        raise ConfigError("model", model_type, "a supported config", str(error)) from None
    return arch, ignored + notes
