"""Reading a JSON config (../shared/CONTRACT.md): the model resolved (a preset id, a Hugging Face
id, a config.json object or the canonical architecture) and the sections built and checked.
"""

from __future__ import annotations


from ..spec.architecture import ARCHITECTURE_FIELDS, Architecture
from ..spec.errors import ConfigError
from ..spec.config import Config, SECTIONS, build_section, build_serving


def architecture_from_model(model: object) -> Architecture:
    if isinstance(model, str):
        if model == "":
            raise ConfigError("model", model, "a preset id, a Hugging Face id (org/name) or an architecture object")
        if "/" in model:
            from .hub import fetch_model, parse_hub_id  # the only path that touches the network
            repo_id, revision = parse_hub_id(model)  # refused before any request or cache write
            return fetch_model(repo_id, revision=revision, count=False).architecture
        from .presets import get_architecture
        return get_architecture(model)
    if isinstance(model, dict):
        if "model_type" in model or "text_config" in model:
            from .hf_config import architecture_from_hf_config
            return architecture_from_hf_config(model)[0]
        if "hidden_size" in model and "num_layers" in model:
            for key in model:
                if key not in ARCHITECTURE_FIELDS:
                    raise ConfigError(f"model.{key}", model[key], "fields of the canonical architecture (see docs/config.md)",
                                      "unknown field")
            return Architecture(**model)
        raise ConfigError("model", "{...}", "a Hugging Face config.json (with model_type) or a canonical architecture "
                          "(with hidden_size and num_layers)")
    raise ConfigError("model", model, "a preset id, a Hugging Face id or an object")


def load_config(data: object) -> Config:
    if not isinstance(data, dict):
        raise ConfigError("config", type(data).__name__, "a JSON object with model, training, parallel, hardware")
    for key in data:
        if key not in ("model", *SECTIONS, "serving"):
            raise ConfigError(key, data[key], "model, training, parallel, hardware, serving", "unknown section")
    if "model" not in data:
        raise ConfigError("model", None, "a preset id, a Hugging Face id or an architecture object", "required")
    try:
        arch = architecture_from_model(data["model"])
        sections = {name: build_section(name, data.get(name)) for name in SECTIONS}
        serving = build_serving(data["serving"]) if "serving" in data else None
    except TypeError as exc:  # a dataclass given a wrongly shaped value
        raise ConfigError("config", str(exc), "fields of the contract") from None
    return Config(architecture=arch, model=data["model"], serving=serving, **sections)
