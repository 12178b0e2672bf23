"""A model named by a launch configuration (a Hugging Face id, a checkpoint folder) matched to a
bundled preset, so that an import works offline when the preset has that architecture."""

from __future__ import annotations

import re

from ..spec.errors import ConfigError

# Suffixes that name a post-trained variant of the same architecture (the weights differ, the shapes
# do not): Meta-Llama-3.1-8B-Instruct has Llama-3.1-8B's config.json shapes.
_VARIANT = re.compile(r"(-(instruct|chat|base|hf|it|pt|fp8|bf16))+$")


# releases with the shapes of a bundled one (config.json: same widths, layers, heads, vocabulary)
_SAME_SHAPES = {"llama-3-8b": "llama-3.1-8b", "llama-3-70b": "llama-3.1-70b", "llama-3.3-70b": "llama-3.1-70b"}


def _key(name: str) -> str:
    base = name.rstrip("/").split("/")[-1].lower()
    base = _VARIANT.sub("", base).removeprefix("meta-")
    return _SAME_SHAPES.get(base, base)


def preset_for(name: str) -> str | None:
    """The bundled preset id whose Hub id (or id) names the same model as `name` (a Hub id such as
    ``meta-llama/Meta-Llama-3.1-8B-Instruct`` or a local folder ``/tmp/Qwen3-8B``), else None."""
    from ..models.presets import list_presets
    if not isinstance(name, str) or not name.strip():
        return None
    key = _key(name)
    for preset in list_presets():
        if key in (_key(preset.hub_id), _key(preset.id)):
            return preset.id
    return None


def is_hub_id(name: str) -> bool:
    """``org/name``: a Hugging Face id rather than a local path."""
    return bool(re.fullmatch(r"[A-Za-z0-9][\w.-]*/[\w.-]+", name or ""))


_NAME = object()


def named_model(name: object, label: str, allowed: str, reason: str = "", value: object = _NAME) -> str:
    """The model a launch configuration names: the bundled preset's id for `name`, else `name` itself when it is a
    Hugging Face id (org/name). Anything else is a ConfigError naming the field by its `label`, the `value` given
    (`name` unless told) and what is `allowed`."""
    preset = preset_for(name)
    if preset is None and not (isinstance(name, str) and is_hub_id(name)):
        raise ConfigError(label, name if value is _NAME else value, allowed, reason)
    return preset or name
