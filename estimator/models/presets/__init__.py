"""Bundled models and training recipes, available offline.

Each model is a JSON file in ``models/``: the model's Hugging Face ``config.json`` as published
(``config``), its Hub id, and its published parameter count with the source of that count and
whether the publisher's figure is exact or rounded (``published``). ``recipes.json`` holds named
training set-ups in the contract's config format (``../shared/CONTRACT.md``).

Files are read lazily, on the first call that needs them: importing this package does no I/O.
"""

from __future__ import annotations

import copy
import functools
import json
from dataclasses import dataclass, field
from importlib import resources
from typing import Any

from ...spec.architecture import Architecture
from ...spec.errors import ConfigError

__all__ = ["PresetInfo", "Recipe", "list_presets", "preset_ids", "get_preset", "get_hf_config",
           "get_architecture", "list_recipes", "get_recipe"]


@dataclass(frozen=True)
class PresetInfo:
    """A bundled model and its published parameter count.

    `published_total` / `published_active` are the publisher's figures. `exact` says whether
    `published_total` is an exact count (else it is rounded as `total_rounding` describes:
    ``{"unit": 10_000_000, "mode": "nearest"}`` is "to 0.01B"; mode ``"down"`` is truncation);
    `active_exact` and `active_rounding` say the same of `published_active`. `counting` notes
    where the publisher counts differently from the estimator's text-decoder total (vision encoder
    included, MTP excluded from active, input embedding excluded from active).
    """

    id: str
    name: str
    hub_id: str
    published_total: int
    published_active: int | None
    count_source: str
    exact: bool
    active_exact: bool | None = None
    active_source: str | None = None
    total_rounding: dict | None = None
    active_rounding: dict | None = None
    counting: dict = field(default_factory=dict)
    notes: str = ""
    config_source: str = ""


@dataclass(frozen=True)
class Recipe:
    """A named, realistic training set-up: `config` is a contract config (model = a preset id)."""

    id: str
    name: str
    description: str
    source: str
    config: dict


def _files():
    return resources.files(__name__)


@functools.lru_cache(maxsize=1)
def _index() -> dict[str, str]:
    """Preset id -> file name, from the ``models/`` folder."""
    folder = _files() / "models"
    return {entry.name[:-5]: entry.name for entry in folder.iterdir() if entry.name.endswith(".json")}


def preset_ids() -> list[str]:
    return sorted(_index())


def _unknown(preset_id: object) -> ConfigError:
    return ConfigError("model", preset_id, ", ".join(preset_ids()), "not a bundled preset")


@functools.lru_cache(maxsize=None)
def _load(preset_id: str) -> dict:
    name = _index().get(preset_id) if isinstance(preset_id, str) else None
    if name is None:
        raise _unknown(preset_id)
    return json.loads((_files() / "models" / name).read_text(encoding="utf-8"))


def get_preset(preset_id: str) -> dict:
    """The whole preset record (a copy): id, name, hub_id, config_source, published, config."""
    return copy.deepcopy(_load(preset_id))


def get_hf_config(preset_id: str) -> dict:
    """The model's Hugging Face ``config.json`` content (a copy)."""
    return copy.deepcopy(_load(preset_id)["config"])


@functools.lru_cache(maxsize=None)
def get_architecture(preset_id: str) -> Architecture:
    """The canonical architecture of a bundled model."""
    from ..hf_config import architecture_from_hf_config  # the mapping is only needed here

    record = _load(preset_id)
    arch, _ignored = architecture_from_hf_config(record["config"], name=record["id"])
    return arch


def _info(record: dict) -> PresetInfo:
    p = record["published"]
    return PresetInfo(
        id=record["id"], name=record["name"], hub_id=record["hub_id"],
        published_total=p["total"], published_active=p.get("active"), count_source=p["source"],
        exact=p["total_exact"], active_exact=p.get("active_exact"), active_source=p.get("active_source"),
        total_rounding=p.get("total_rounding"), active_rounding=p.get("active_rounding"),
        counting=dict(p.get("counting") or {}), notes=p.get("notes", ""),
        config_source=record.get("config_source", ""),
    )


def list_presets() -> list[PresetInfo]:
    """Every bundled model, sorted by id."""
    return [_info(_load(pid)) for pid in preset_ids()]


def get_preset_info(preset_id: str) -> PresetInfo:
    return _info(_load(preset_id))


def _rounding_text(rounding: dict | None) -> str:
    unit = f"{rounding['unit'] / 1e9:g}B"
    return f"truncated to {unit}" if rounding.get("mode") == "down" else f"rounded to {unit}"


def counting_note(info: PresetInfo) -> str:
    """How the publisher's count differs from the estimator's, in words ("" where they agree): the
    estimator counts the text decoder with its MTP modules, and as active every parameter a token
    passes through, the input embedding included (architecture.parameter_counts); the publisher
    may count the vision encoder, leave out the MTP module or the embedding, or round."""
    notes = []
    if info.counting.get("total_includes_vision_encoder"):
        notes.append("published total includes the vision encoder")
    if info.counting.get("active_excludes_mtp"):
        notes.append("published active leaves out the MTP module")
    if info.counting.get("active_excludes_embedding"):
        notes.append("published active leaves out the input embedding")
    if not info.exact and info.total_rounding:
        notes.append(f"published total {_rounding_text(info.total_rounding)}")
    if info.active_exact is False and info.active_rounding:
        notes.append(f"published active {_rounding_text(info.active_rounding)}")
    return "; ".join(notes)


@functools.lru_cache(maxsize=1)
def _recipes() -> tuple[dict[str, Any], ...]:
    data = json.loads((_files() / "recipes.json").read_text(encoding="utf-8"))
    return tuple(data["recipes"])


def list_recipes() -> list[Recipe]:
    """The bundled training recipes, in file order."""
    return [Recipe(id=r["id"], name=r["name"], description=r["description"], source=r["source"],
                   config=copy.deepcopy(r["config"])) for r in _recipes()]


def get_recipe(recipe_id: str) -> Recipe:
    for recipe in list_recipes():
        if recipe.id == recipe_id:
            return recipe
    raise ConfigError("recipe", recipe_id, ", ".join(r["id"] for r in _recipes()), "not a bundled recipe")
