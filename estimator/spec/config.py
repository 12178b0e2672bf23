"""The JSON configuration of ``../shared/CONTRACT.md``: parse it, check it, write it back.

``model`` is a bundled preset id, a Hugging Face model id (``org/name[@revision]``, fetched with
`estimator.hub`), a Hugging Face ``config.json`` object (it has ``model_type``) or the canonical
architecture object (it has ``hidden_size`` and ``num_layers``). The other sections map one to
one onto `Training`, `Parallel` and `Hardware`; an unknown key is an error so that typos
surface.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, fields

from .architecture import ARCHITECTURE_FIELDS, Architecture
from .errors import ConfigError
from .hardware import Hardware
from .parallel import Parallel, tp_following_defaults
from .serving import Serving
from .training import Training

SECTIONS = {"training": Training, "parallel": Parallel, "hardware": Hardware}


@dataclass(frozen=True)
class Config:
    architecture: Architecture
    training: Training
    parallel: Parallel
    hardware: Hardware
    model: str | dict  # what the user gave: a preset id, a hub id, or an architecture object
    serving: Serving | None = None  # the top-level ``serving`` object (CONTRACT.md, "Additions: serving")

    def to_dict(self) -> dict:
        """The contract's JSON, with only the fields that differ from their defaults."""
        out: dict = {"model": self.model if isinstance(self.model, str) else architecture_to_dict(self.architecture)}
        for name, cls in SECTIONS.items():
            given = getattr(self, name)
            section = {f.name: getattr(given, f.name) for f in fields(cls)
                       if getattr(given, f.name) != getattr(cls(), f.name)}
            for nested in ("adapter", "rl"):  # objects of their own in the JSON
                if section.get(nested) is not None:
                    section[nested] = section[nested].to_dict()
            if name == "parallel":  # values that follow TP are not worth writing back
                for derived in tp_following_defaults(given.tp):
                    if given.follows_tp(derived):
                        section.pop(derived, None)
            if section:
                out[name] = section
        if self.serving is not None:
            out["serving"] = {f.name: getattr(self.serving, f.name) for f in fields(Serving)
                              if getattr(self.serving, f.name) != f.default}
            if self.serving.speculative is not None:
                out["serving"]["speculative"] = self.serving.speculative.to_dict()
        return out


def architecture_to_dict(arch: Architecture) -> dict:
    default = {f.name: f.default for f in fields(Architecture) if f.default is not dataclasses.MISSING}
    out = {}
    for name in ARCHITECTURE_FIELDS:
        value = getattr(arch, name)
        if name in ("hidden_size", "num_layers", "num_attention_heads", "vocab_size") or value != default.get(name):
            out[name] = value
    # head_dim and num_kv_heads are resolved on creation; drop them when they equal their defaults
    if arch.num_kv_heads == arch.num_attention_heads:
        out.pop("num_kv_heads", None)
    if arch.head_dim == arch.hidden_size // arch.num_attention_heads:
        out.pop("head_dim", None)
    if arch.is_moe and arch.shared_expert_intermediate_size == arch.moe_intermediate_size:
        out.pop("shared_expert_intermediate_size", None)
    return out


def build_section(name: str, values: object):
    cls = SECTIONS[name]
    if values is None:
        return cls()
    if not isinstance(values, dict):
        raise ConfigError(name, values, "an object of fields")
    known = {f.name for f in fields(cls)}
    for key in values:
        if key not in known:
            raise ConfigError(f"{name}.{key}", values[key], f"known fields of {name}: {', '.join(sorted(known))}",
                              "unknown field")
    return cls(**values)


def build_serving(values: object) -> Serving:
    """The ``serving`` object; an unknown key is an error like in every section."""
    if not isinstance(values, dict):
        raise ConfigError("serving", values, "an object of fields")
    known = {f.name for f in fields(Serving)}
    for key in values:
        if key not in known:
            raise ConfigError(f"serving.{key}", values[key], f"known fields of serving: {', '.join(sorted(known))}",
                              "unknown field")
    return Serving(**values)
