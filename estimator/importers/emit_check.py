"""What every ``plan --emit`` writer shares: the model as its Hugging Face id, and the check that what
was written reads back, through the importer of the same kind, to the configuration it was written
from. A setting the format cannot express then surfaces as a refusal naming that field, never as a
launch configuration that would run something else."""

from __future__ import annotations

from ..spec.errors import ConfigError


def refuse(kind: str, field: str, value: object, allowed: str) -> ConfigError:
    """A setting `kind` cannot write, named."""
    return ConfigError(field, value, allowed, f"{kind} has no setting for it")


def hub_id(cfg, kind: str) -> str:
    """The Hugging Face id a launch configuration names the model by: a bundled preset's, or the id
    the configuration was given; a hand-written architecture has none."""
    from ..models.presets import list_presets
    if isinstance(cfg.model, str):
        for preset in list_presets():
            if preset.id == cfg.model:
                return preset.hub_id
        if "/" in cfg.model:
            return cfg.model
    raise ConfigError("model", cfg.model if isinstance(cfg.model, str) else "{...}", "a bundled model or a Hugging "
                      "Face id", f"a {kind} launch names its model by its checkpoint")


def verified(kind: str, text: str, config: dict, gpus: int | None = None) -> str:
    """`text` when it imports (as `kind`) to the same configuration as `config`; otherwise a
    ConfigError naming the first field that the format changed."""
    from ..models.loading import load_config
    from . import import_config
    imported = import_config(text, kind, gpus=gpus, gpu=config.get("hardware", {}).get("gpu"))
    training = config.get("training", {})
    installed = {name: training[name] for name in _INSTALLED if training.get(name) is not None}
    read_back = {**imported.config, "training": {**imported.config.get("training", {}), **installed}}
    want, got = (_flat(load_config(c)) for c in (config, read_back))
    for path in list(want) + [p for p in got if p not in want]:
        if path in _LAUNCH_DEFAULTS and want.get(path) is None:
            continue
        if want.get(path) != got.get(path):
            written = got.get(path)
            raise ConfigError(path, want.get(path), f"what {kind} can write here: "
                              + ("nothing" if written is None else repr(written)), f"{kind} has no setting for it")
    return text


# what the launch's installed packages decide, not its file (as the GPU is the machine's): carried from the configuration
# to the file's read-back (training.trl_version: the SFTTrainer's release, whose rules the written loss_type runs under)
_INSTALLED = ("trl_version",)

# fields that a configuration may leave to the launch: unset, the written launch keeps its stack's own default
# (training.nccl_cumem: slime's and verl's training processes run without cuMem, spec/nccl.py RL_STACKS_CUMEM_OFF)
_LAUNCH_DEFAULTS = ("training.nccl_cumem",)

# the architecture's fields that only say what peft wraps (set by the Hugging Face reader; a launch format that
# spells the model by its shapes cannot write them)
_PEFT_ONLY = ("peft_moe_conversion", "router_is_linear")


def _flat(cfg) -> dict[str, object]:
    """Every field of a loaded configuration by its path (defaults included), the model by its shapes
    (a preset and the flags that spell its architecture are the same model); an
    adapter on every linear layer of the model written as "all-linear", however it was listed (a
    format that lists the modules reads back as the list)."""
    from dataclasses import fields, is_dataclass, replace
    from ..memory.adapters import layer_modules
    arch = cfg.architecture
    if arch.is_moe and all(arch.is_moe_layer(i) for i in range(arch.num_layers)):
        arch = replace(arch, intermediate_size=None)  # no dense layer: the dense width is never built
    if cfg.training.adapter is None:  # what peft would wrap is read only with an adapter (memory/adapters.py)
        defaults = {f.name: f.default for f in fields(arch) if f.name in _PEFT_ONLY}
        arch = replace(arch, **defaults)
    out: dict[str, object] = {"model": replace(arch, name="custom")}

    def walk(obj, prefix):
        for f in fields(obj):
            value = getattr(obj, f.name)
            if is_dataclass(value):
                walk(value, f"{prefix}{f.name}.")
            else:
                out[f"{prefix}{f.name}"] = list(value) if isinstance(value, tuple) else value
    for section in ("parallel", "training", "hardware", "serving"):  # the layout first: it decides the rest
        if getattr(cfg, section, None) is not None:
            walk(getattr(cfg, section), f"{section}.")
    if cfg.serving is not None:  # unset prefix caching is the engine's default; vLLM 0.11 turns it off for hybrids
        from ..serving.service import prefix_caching_of
        out["serving.prefix_caching"] = prefix_caching_of(cfg).on
    from ..memory.states import resolve_zero_stage  # an unset stage is the framework's own default
    out["parallel.zero_stage"] = resolve_zero_stage(cfg.training, cfg.parallel)
    if out["training.global_batch_size"] is None and cfg.training.mode == "training":
        from ..memory.pipeline import global_batch_size  # the batch the estimate assumes when none is given
        out["training.global_batch_size"] = global_batch_size(cfg.training, cfg.parallel)
    targets = out.get("training.adapter.target_modules")
    if isinstance(targets, list):
        every = {m.name for kind in cfg.architecture.kinds for m in layer_modules(cfg.architecture, kind)}
        if set(targets) == every or targets == ["all-linear"]:
            out["training.adapter.target_modules"] = "all-linear"
    return out
