"""Launch configurations read into our JSON config: the run a user is about to start, checked
before it starts.

One module per source format (`megatron`, `torchtitan`, ...); each returns an `Imported`: the
config and every setting it met, read, ignored, not modelled or unknown (`result.py`). This package
imports from the rest of `estimator`; only the CLI, the app and `estimator.check` import it.

    from estimator.importers import import_config, check
    imported = import_config(open("job.toml").read(), gpus=64)   # kind guessed from the text
    estimate = check("job.toml", gpus=64, gpu="h100-80")
"""

from __future__ import annotations

import importlib
import os

from ..spec.errors import ConfigError
from .result import Imported, Setting
from .source import check_size, read_text

__all__ = ["KINDS", "Imported", "Setting", "check", "estimate_imported", "guess_kind", "import_config", "load"]

# The contract's KIND names (and the kinds this version adds: openrlhf, megatron-bridge, hf), and the
# module that reads each. A kind without a module is named in the error message as not supported yet,
# never read as another kind.
KINDS = ("megatron", "torchtitan", "torchtune", "deepspeed", "accelerate", "axolotl", "llama-factory", "verl",
         "slime", "vllm", "sglang", "openrlhf", "megatron-bridge", "hf")
_MODULES = {"megatron": "megatron", "torchtitan": "torchtitan", "torchtune": "torchtune", "deepspeed": "deepspeed",
            "accelerate": "accelerate", "axolotl": "axolotl", "llama-factory": "llama_factory", "vllm": "vllm",
            "sglang": "sglang", "verl": "verl", "slime": "slime", "openrlhf": "openrlhf",
            "megatron-bridge": "megatron_bridge", "hf": "hf"}
# The order the readers are asked in when the kind is not given: a launch of a framework built on
# Megatron-LM (slime's train.py, Bridge's run_recipe.py) carries Megatron's flags too, so it is asked
# before Megatron's own; the Trainer's bare arguments last, after the front ends that extend them.
_GUESS_ORDER = ("slime", "megatron-bridge", "openrlhf", "megatron", "torchtitan", "torchtune", "deepspeed",
                "accelerate", "axolotl", "llama-factory", "verl", "vllm", "sglang", "hf")
_ATTACHING = ("deepspeed", "accelerate")  # kinds that read --training-args and --peft beside the file


def supported_kinds() -> tuple[str, ...]:
    return tuple(k for k in KINDS if k in _MODULES)


def _reader(kind: str):
    if kind not in KINDS:
        raise ConfigError("--from", kind, ", ".join(KINDS), "not a launch-configuration kind")
    if kind not in _MODULES:
        raise ConfigError("--from", kind, ", ".join(supported_kinds()), "not supported by this version yet")
    return importlib.import_module(f".{_MODULES[kind]}", __name__)


def guess_kind(text: str, name: str = "") -> str:
    """The kind a text is, from its content (and its file name); a ConfigError when no reader
    claims it. The readers are asked in `_GUESS_ORDER`; the first that claims the text wins."""
    for kind in (k for k in _GUESS_ORDER if k in _MODULES):
        if _reader(kind).looks_like(text, name.lower()):
            return kind
    raise ConfigError("--from", None, ", ".join(supported_kinds()), "the kind of launch configuration could not be "
                      f"told from {'the file ' + repr(name) if name else 'the text'}; give --from KIND")


def load(path_or_text: str) -> tuple[str, str]:
    """(text, name): the file at `path_or_text` ("-" = standard input), or the text itself."""
    if path_or_text == "-" or ("\n" not in path_or_text and len(path_or_text) < 4096
                               and os.path.isfile(path_or_text)):
        return read_text(path_or_text), ("<stdin>" if path_or_text == "-" else path_or_text)
    check_size(path_or_text, "text")
    return path_or_text, ""


def import_config(text: str, kind: str | None = None, *, name: str = "", gpus: int | None = None,
                  gpu: str | None = None, overrides: tuple[str, ...] = (), training_args: str | None = None,
                  peft: str | None = None) -> Imported:
    """Read a launch configuration's text into our JSON config (checked field by field).
    `overrides`: the framework's own flags given beside the file (they win over the file's)."""
    check_size(text, name or "text")
    if gpus is not None and (isinstance(gpus, bool) or not isinstance(gpus, int) or not 1 <= gpus <= 2**26):
        raise ConfigError("--gpus", gpus, "an integer from 1 to 67,108,864")
    kind = kind or guess_kind(text, name)
    module = _reader(kind)
    attached = {k: v for k, v in (("training_args", training_args), ("peft", peft)) if v is not None}
    if attached and kind not in _ATTACHING:
        raise ConfigError("--training-args" if training_args is not None else "--peft", kind,
                          f"only with --from {' or '.join(_ATTACHING)}", "this kind does not read them")
    for text_ in attached.values():
        check_size(text_, "attached file")
    imported = module.read(text, gpus=gpus, overrides=tuple(overrides), **attached)
    if gpu is not None:
        imported.config.setdefault("hardware", {})["gpu"] = gpu
    _validate(imported.config)
    return imported


def _validate(config: dict) -> None:
    """Every field in range and every section known, without fetching a Hub model (estimate does)."""
    from ..models.loading import architecture_from_model
    from ..spec.config import build_section, SECTIONS
    model = config.get("model")
    if not (isinstance(model, str) and "/" in model):
        architecture_from_model(model)
    try:
        for section in SECTIONS:
            build_section(section, config.get(section))
    except TypeError as exc:
        raise ConfigError("config", str(exc), "fields of the contract") from None


def estimate_imported(imported: Imported):
    from ..memory.memory import estimate_config
    return estimate_config(imported.config)


def check(path_or_text: str, kind: str | None = None, gpu: str | None = None, gpus: int | None = None,
          overrides: tuple[str, ...] = (), training_args: str | None = None, peft: str | None = None):
    """The estimate of a launch configuration (a file path, or its text): ``estimate.fit.verdict``
    says "fits", "tight" or "oom". Bad input raises `ConfigError`."""
    text, name = load(path_or_text)
    extra = {k: load(v)[0] for k, v in (("training_args", training_args), ("peft", peft)) if v is not None}
    return estimate_imported(import_config(text, kind, name=name, gpus=gpus, gpu=gpu, overrides=overrides, **extra))
