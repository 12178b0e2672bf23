"""Megatron-Bridge (NeMo 2's successor for Megatron training): a ``run_recipe.py --recipe NAME`` command line
with its convenience flags and ``KEY=VALUE`` ConfigContainer overrides, or a YAML of overrides (with
``-- --recipe NAME`` beside it), read into our JSON config.

Nothing of the user's or the recipe's Python is imported or run: the recipe's settings come from
`bridge_recipes` (the Llama 3 and Qwen3 recipes of Megatron-Bridge commit 067f987d, read with ``ast``), its
base from `_COMMON` below, the keys' names from `bridge_keys`. A recipe, then the YAML, then the convenience
flags, then the ``KEY=VALUE`` words set each key (``scripts/training/run_recipe.py``: "When both forms set
the same field, the trailing KEY=VALUE override takes precedence"). The keys are Megatron-Core's own names,
so the model, DDP and optimizer settings are read by the `megatron` importer's rules, as the flags
Megatron-LM derives from the same fields; the lines name the Bridge keys. What Bridge decides on top:

- the model is the recipe's Hugging Face model (``AutoBridge.from_hf_pretrained``); the Llama and Qwen
  bridges set ``hidden_dropout`` 0 and take ``attention_dropout`` from the Hugging Face config, 0
  (``models/llama/llama_bridge.py``, ``models/qwen/qwen3_bridge.py``);
- ``mixed_precision`` (a recipe name of ``training/mixed_precision.py``) overwrites the DDP and optimizer
  fields it shares, ``grad_reduce_in_fp32`` included (``update_config_with_precision_overrides``);
- the distributed optimizer is on when either ``ddp.use_distributed_optimizer`` or
  ``optimizer.use_distributed_optimizer`` is (``training/config.py``
  ``_validate_and_sync_distributed_optimizer_settings``);
- ``model.seq_length`` follows ``dataset.seq_length`` (``run_recipe.py`` ``sync_model_dataset_sequence_length``).
"""

from __future__ import annotations

import re

from ..spec.errors import ConfigError
from . import megatron, megatron_flags
from . import megatron_args as margs, megatron_training as mtrain
from .bridge_keys import SECTIONS
from .bridge_recipes import ALIASES, RECIPES
from .build import ConfigBuilder, to_int
from .models import named_model
from .result import Imported, Ledger, Setting
from .shell import read_launch
from .source import parse_yaml

KIND = "megatron-bridge"
VERSION = "Megatron-Bridge 067f987d"
_ENTRY = re.compile(r"(?:^|/)run_recipe\.py$")

# recipes/common.py (_pretrain_common, _sft_common, _peft_common) and the OptimizerConfig of
# recipes/utils/optimizer_utils.py distributed_fused_adam_with_cosine_annealing, for the keys read below
_ADAM = {"optimizer.optimizer": "adam", "optimizer.use_distributed_optimizer": True, "mixed_precision": "bf16_mixed"}
_COMMON = {
    "pretrain": {**_ADAM, "train.global_batch_size": 32, "train.micro_batch_size": 2, "dataset.seq_length": 4096,
                 "ddp.grad_reduce_in_fp32": True, "ddp.overlap_grad_reduce": True, "ddp.overlap_param_gather": True,
                 "ddp.use_distributed_optimizer": True, "ddp.data_parallel_sharding_strategy": "optim_grads_params"},
    "sft": {**_ADAM, "train.global_batch_size": 128, "train.micro_batch_size": 1, "dataset.seq_length": 2048,
            "ddp.grad_reduce_in_fp32": True},
    "peft": {**_ADAM, "train.global_batch_size": 128, "train.micro_batch_size": 1, "dataset.seq_length": 2048,
             "ddp.grad_reduce_in_fp32": True, "peft": "lora"},
}
# run_recipe.py's convenience flags (COMMON_OVERRIDE_FIELDS) and its other flags
_CONVENIENCE = {
    "-ms": "train.train_iters", "--max_steps": "train.train_iters", "-gb": "train.global_batch_size",
    "--global_batch_size": "train.global_batch_size", "-mb": "train.micro_batch_size",
    "--micro_batch_size": "train.micro_batch_size", "-sl": "dataset.seq_length", "--seq_length": "dataset.seq_length",
    "-tp": "model.tensor_model_parallel_size", "--tensor_model_parallel_size": "model.tensor_model_parallel_size",
    "-pp": "model.pipeline_model_parallel_size",
    "--pipeline_model_parallel_size": "model.pipeline_model_parallel_size",
    "-cp": "model.context_parallel_size", "--context_parallel_size": "model.context_parallel_size",
    "-vp": "model.virtual_pipeline_model_parallel_size",
    "--virtual_pipeline_model_parallel_size": "model.virtual_pipeline_model_parallel_size",
    "-ep": "model.expert_model_parallel_size", "--expert_model_parallel_size": "model.expert_model_parallel_size",
    "-etp": "model.expert_tensor_parallel_size",
    "--expert_tensor_parallel_size": "model.expert_tensor_parallel_size", "--lr": "optimizer.lr",
    "--min_lr": "optimizer.min_lr", "--warmup_iters": "scheduler.lr_warmup_iters",
    "--pretrained_checkpoint": "checkpoint.pretrained_checkpoint", "--save_dir": "checkpoint.save",
    "--load_dir": "checkpoint.load", "--save_interval": "checkpoint.save_interval",
}
_RUNNER = {"--model": 1, "--recipe": 1, "--mode": 1, "--step-func": 1, "--step_func": 1, "--dataset": 1,
           "--dry-run": 0, "--dry_run": 0, "--deterministic": 0, "--dump-env": 0, "--dump_env": 0}
# Bridge keys whose Megatron-LM flag is not the key's own name with dashes
_FLAG_OF = {
    "model.virtual_pipeline_model_parallel_size": "--num-virtual-stages-per-pipeline-rank",
    "model.num_layers_in_first_pipeline_stage": "--decoder-first-pipeline-num-layers",
    "model.num_layers_in_last_pipeline_stage": "--decoder-last-pipeline-num-layers",
    "dataset.seq_length": "--seq-length", "train.global_batch_size": "--global-batch-size",
    "train.micro_batch_size": "--micro-batch-size",
}
_FLAG_SECTIONS = ("model.", "ddp.", "optimizer.")
# mixed_precision recipes (training/mixed_precision.py): (--fp16, fp8 format, fp8 recipe, fp8 param gather)
_PRECISION = {"bf16_mixed": (False, None, None, False), "fp16_mixed": (True, None, None, False),
              "bf16_with_fp8_delayed_scaling_mixed": (False, "hybrid", "delayed", True),
              "fp16_with_fp8_delayed_scaling_mixed": (True, "hybrid", "delayed", True),
              "bf16_with_mxfp8_mixed": (False, "e4m3", "mxfp8", True),
              "fp16_with_mxfp8_mixed": (True, "e4m3", "mxfp8", True),
              "bf16_with_fp8_current_scaling_mixed": (False, "hybrid", "tensorwise", False),
              "fp16_with_fp8_current_scaling_mixed": (True, "hybrid", "tensorwise", False),
              "bf16_with_fp8_subchannel_scaling_mixed": (False, "hybrid", "blockwise", False),
              "fp16_with_fp8_subchannel_scaling_mixed": (True, "hybrid", "blockwise", False)}
_IGNORED_SECTIONS = {"checkpoint": "checkpoints", "logger": "logging", "scheduler": "the learning-rate schedule",
                     "validation": "evaluation", "tokenizer": "the tokenizer's files", "rng": "seeds",
                     "dist": "process-group setup", "ft": "fault tolerance", "straggler": "monitoring",
                     "nvrx_straggler": "monitoring", "profiling": "profiling", "rerun_state_machine":
                     "fault tolerance", "inprocess_restart": "fault tolerance", "env_vars": "the environment"}
_IGNORED_KEYS = re.compile(r"optimizer\.(lr|min_lr|weight_decay|adam_\w+|sgd_momentum|clip_grad|decoupled_\w+)$|"
                           r"model\.(init_method_std|rotary_\w+|yarn_\w+|mtp_loss_scaling_factor|pipeline_dtype|"
                           r"seq_length|transformer_impl|cuda_graph_scope|cuda_graph_warmup_steps)$|"
                           r"train\.(train_iters|manual_gc\w*|exit_\w+|eval_\w+)$|dataset\.(?!seq_length$)\w+|"
                           r"ddp\.(check_for_nan_in_grad|average_in_collective)$|mixed_precision\.fp8_(margin|"
                           r"amax_\w+)$")
_LORA_TARGETS = {"linear_qkv": ("q", "k", "v"), "linear_proj": ("o",), "linear_fc1": ("gate", "up"),
                 "linear_fc2": ("down",)}


def is_entry(word: str) -> bool:
    return bool(_ENTRY.search(word))


def looks_like(text: str, name: str = "") -> bool:
    return bool(re.search(r"(^|[\s/])run_recipe\.py\b", text))


def read(text: str, gpus: int | None = None, overrides: tuple[str, ...] = ()) -> Imported:
    ledger = Ledger()
    if looks_like(text):
        launch = read_launch(text, is_entry)
        for note in launch.notes:
            ledger.note(note)
        launcher, words, yaml_keys = launch.launcher, launch.args + tuple(overrides), {}
    else:
        launcher, words = (), tuple(overrides)
        yaml_keys = _flatten(parse_yaml(text, "Megatron-Bridge overrides"), "")
    runner, given = _words(words, ledger)
    recipe = _recipe(runner)
    settings = _settings(recipe, yaml_keys, given)
    build = ConfigBuilder(ledger)
    world = megatron._world_size(launcher, gpus, ledger)
    if world is None:
        raise ConfigError("--gpus", None, "the number of GPUs: the command line has no torchrun prefix", "missing")
    _model(recipe, build, ledger)
    flags, keys = _megatron_flags(settings, ledger)
    args = margs._Args(flags)
    mtrain._training(args, build, ledger)
    if mtrain.named_moe(build.named_model):  # the Megatron reader reads these only for a model it builds itself
        mtrain._moe_runtime(args, build, ledger)
    mtrain._parallel(args, build, ledger, world)
    _adapter(settings, build, ledger)
    mtrain._account_rest(args, ledger)
    _relabel(ledger, keys, settings)
    consumed = {k for f in args.used if f in keys for k in keys[f].split(" / ")}
    _account_rest(settings, consumed, ledger)
    for key in runner:
        if key != "--recipe":
            ledger.ignore(key, runner[key], "the runner's own setting (training loop, dataset preset, dry run)")
    return ledger.result(KIND, {"model": build.named_model, **build.config})


# --- the words and the settings -------------------------------------------------------------------

def _words(words: tuple[str, ...], ledger: Ledger) -> tuple[dict[str, object], dict[str, object]]:
    """(the runner's flags, {key: value} of the convenience flags then the KEY=VALUE words)."""
    import yaml
    runner: dict[str, object] = {}
    flags: dict[str, object] = {}
    assigned: dict[str, object] = {}
    i = 0
    while i < len(words):
        word = words[i]
        i += 1
        name, eq, inline = word.partition("=")
        if name in _RUNNER or name in _CONVENIENCE:
            arity = _RUNNER.get(name, 1)
            if arity == 0:
                runner[name] = True
                continue
            if not eq:
                if i >= len(words):
                    raise ConfigError(name, None, "a value after it", "missing its value")
                inline, i = words[i], i + 1
            if name in _CONVENIENCE:
                flags[_CONVENIENCE[name]] = _scalar(inline, yaml)
            else:
                runner[name] = inline
        elif eq and not word.startswith("-") and re.fullmatch(r"[+~]?[A-Za-z_][\w.]*", name):
            assigned[name.lstrip("+~")] = _scalar(inline, yaml)
        else:
            ledger.strange(word, "", f"not a flag of run_recipe.py nor a KEY=VALUE override ({VERSION})")
    return runner, {**flags, **assigned}


def _scalar(text: str, yaml) -> object:
    """A KEY=VALUE value as OmegaConf's dotlist reads it: YAML, a plain string where it is not."""
    try:
        value = yaml.safe_load(text) if text.strip() else None
    except yaml.YAMLError:
        return text
    if isinstance(value, (dict, list)) and len(str(value)) > 10_000:
        raise ConfigError("override", "...", "a short value")
    return value


def _flatten(data: object, prefix: str) -> dict[str, object]:
    if not isinstance(data, dict):
        raise ConfigError("launch config", type(data).__name__, "a YAML mapping of ConfigContainer sections")
    out: dict[str, object] = {}
    for key, value in data.items():
        path = f"{prefix}{key}"
        if isinstance(value, dict) and value and not (path == "env_vars"):
            out.update(_flatten(value, path + "."))
        else:
            out[path] = value
    return out


def _recipe(runner: dict[str, object]) -> str:
    name = runner.get("--recipe")
    if name is None:
        raise ConfigError("--recipe", runner.get("--model"), "a recipe function's name (" + ", ".join(sorted(
            ALIASES)[:6]) + ", ...): --model with --mode is resolved by Bridge's runner at run time",
            "the command does not name its recipe")
    name = ALIASES.get(str(name), str(name))
    if name not in RECIPES:
        raise ConfigError("--recipe", name, "a Llama 3 or Qwen3 recipe of Megatron-Bridge (the bundled ones: "
                          + ", ".join(sorted(ALIASES)[:8]) + ", ...)", "its settings are not bundled")
    return name


def _chain(name: str) -> list[str]:
    """The recipe and the recipes it starts from, first the oldest; the last item's base is common."""
    chain = [name]
    while RECIPES[chain[0]][0] in RECIPES:
        chain.insert(0, RECIPES[chain[0]][0])
    return chain


def _settings(recipe: str, yaml_keys: dict, given: dict) -> dict[str, tuple[object, str]]:
    """key -> (value, where it came from): the base, the recipe chain, the YAML, the command line."""
    chain = _chain(recipe)
    out = {k: (v, "recipe base") for k, v in _COMMON[RECIPES[chain[0]][0]].items()}
    for name in chain:
        out.update({k: (v, "recipe") for k, v in RECIPES[name][2].items()})
    out.update({k: (v, "yaml") for k, v in yaml_keys.items()})
    out.update({k: (v, "") for k, v in given.items()})
    return out


def _model(recipe: str, build: ConfigBuilder, ledger: Ledger) -> None:
    hub = next(RECIPES[n][1] for n in reversed(_chain(recipe)) if RECIPES[n][1])
    build.named_model = named_model(hub, "--recipe", "a recipe whose model is a Hugging Face id", value=recipe)
    ledger.mapped("--recipe", recipe, f"model = {build.named_model!r} (the recipe's AutoBridge.from_hf_pretrained"
                                      f"({hub!r}))")
    for name in _chain(recipe):
        for statement in RECIPES[name][3]:
            ledger.not_modelled(f"recipe {name}", statement, "a statement of the recipe this reader does not "
                                                             "evaluate")


# --- Bridge keys as Megatron-LM flags -------------------------------------------------------------

def _megatron_flags(settings: dict, ledger: Ledger) -> tuple[dict[str, object], dict[str, str]]:
    """The settings Megatron-LM has a flag for, as those flags (switches True where on), and flag ->
    the key it came from (for the lines). A switch that is off is read as the flag left out."""
    flags: dict[str, object] = {"--hidden-dropout": "0.0", "--attention-dropout": "0.0"}
    keys = {"--hidden-dropout": "(the bridge's hidden_dropout 0)",
            "--attention-dropout": "(the Hugging Face config's attention_dropout 0)"}
    for key, (value, origin) in settings.items():
        flag = _FLAG_OF.get(key) or ("--" + key.split(".", 1)[1].replace("_", "-") if key.startswith(_FLAG_SECTIONS)
                                     else None)
        if flag not in megatron_flags.FLAGS or key == "model.seq_length" or (
                key == "ddp.data_parallel_sharding_strategy" and not settings.get("ddp.use_megatron_fsdp", (0,))[0]):
            continue
        arity = megatron_flags.FLAGS[flag][0]
        if arity == 0 and value not in (True, False, None):
            raise ConfigError(key, value, "true or false")
        if value is True or arity != 0 and value is not None:
            flags[flag] = True if arity == 0 else [str(v) for v in value] if isinstance(value, (list, tuple)) \
                else str(value)
            keys[flag] = key
        elif value in (False, None) and origin != "recipe base":
            ledger.mapped(_label(key, origin), value, f"off ({flag} left out)" if arity == 0 else "unset (the "
                          "default)")
    _distributed_optimizer(settings, flags, keys)
    _precision(settings, flags, keys, ledger)
    if flags.get("--pipeline-model-parallel-layout") is not None:
        flags["--pipeline-model-parallel-layout"] = _layout(settings["model.pipeline_model_parallel_layout"][0])
    return flags, keys


def _shown(value: object) -> str:
    return "true" if value is True else "false" if value is False else str(value)


def _label(key: str, origin: str) -> str:
    return key + (f" ({origin})" if origin else "")


def _distributed_optimizer(settings: dict, flags: dict, keys: dict) -> None:
    """On when either DDP's or the optimizer's switch is (_validate_and_sync_distributed_optimizer_settings)."""
    on = [k for k in ("ddp.use_distributed_optimizer", "optimizer.use_distributed_optimizer")
          if settings.get(k, (False, ""))[0]]
    flags.pop("--use-distributed-optimizer", None)
    if on:
        flags["--use-distributed-optimizer"] = True
        keys["--use-distributed-optimizer"] = " / ".join(on)


def _precision(settings: dict, flags: dict, keys: dict, ledger: Ledger) -> None:
    """mixed_precision's recipe, then its own fields; it overwrites DDP's grad_reduce_in_fp32."""
    name = settings.get("mixed_precision", (None, ""))[0]
    fp16, fmt, recipe, gather = _PRECISION.get(name, (None,) * 4) if isinstance(name, str) else (None,) * 4
    if isinstance(name, str) and fp16 is None:
        raise ConfigError("mixed_precision", name, "one of " + ", ".join(_PRECISION) + " (other recipes are not "
                          "modelled)")
    fp16 = bool(settings.get("mixed_precision.fp16", (fp16, ""))[0])
    fmt = settings.get("mixed_precision.fp8", (fmt, ""))[0]
    recipe = settings.get("mixed_precision.fp8_recipe", (recipe, ""))[0]
    gather = settings.get("mixed_precision.fp8_param_gather", (gather, ""))[0]
    fp32_grads = settings.get("mixed_precision.grad_reduce_in_fp32", (not fp16, ""))[0]
    for flag in ("--bf16", "--fp16", "--fp8-format", "--fp8-recipe", "--fp8-param-gather", "--grad-reduce-in-bf16",
                 "--accumulate-allreduce-grads-in-fp32"):
        flags.pop(flag, None)
    wanted = {"--fp16" if fp16 else "--bf16": True}
    if fmt:
        wanted.update({"--fp8-format": str(fmt), "--fp8-recipe": str(recipe or "delayed")})
        if gather:
            wanted["--fp8-param-gather"] = True
    if not fp16 and not fp32_grads:
        wanted["--grad-reduce-in-bf16"] = True
    elif fp16 and fp32_grads:
        wanted["--accumulate-allreduce-grads-in-fp32"] = True
    flags.update(wanted)
    keys.update(dict.fromkeys(wanted, "mixed_precision"))
    if "ddp.grad_reduce_in_fp32" in settings:
        value, origin = settings["ddp.grad_reduce_in_fp32"]
        ledger.ignore(_label("ddp.grad_reduce_in_fp32", origin), value, "mixed_precision's grad_reduce_in_fp32 "
                                                                        "overwrites it")


def _layout(value: object) -> str:
    """Bridge's list of stages (["embedding", "decoder", ...]) as Megatron-LM's layout string."""
    if isinstance(value, str):
        return value
    letters = {"embedding": "E", "decoder": "t", "mtp": "m", "loss": "L"}
    try:
        return "|".join("".join(letters[part] for part in stage) for stage in value)
    except (KeyError, TypeError):
        raise ConfigError("model.pipeline_model_parallel_layout", value, "stages of embedding, decoder, mtp and "
                          "loss") from None


def _relabel(ledger: Ledger, keys: dict[str, str], settings: dict) -> None:
    """The lines of the Megatron readers, named by the Bridge keys their flags came from (and where
    those were set), a switch's line showing the key's value."""
    flags = sorted(keys, key=len, reverse=True)

    def rename(s: Setting) -> Setting:
        name, value = s.name, s.value
        for flag in flags:
            if flag in name:
                key = keys[flag]
                name = re.sub(re.escape(flag) + r"(?![\w-])", _label(key, settings.get(key, (0, ""))[1]), name)
                if name == _label(key, settings.get(key, (0, ""))[1]) and value == "" and key in settings:
                    value = _shown(settings[key][0])
        return Setting(name, value, s.note)
    for items in (ledger.read, ledger.ignored, ledger.unsupported):
        items[:] = [rename(s) for s in items]


# --- adapters and the rest --------------------------------------------------------------------------

def _adapter(settings: dict, build: ConfigBuilder, ledger: Ledger) -> None:
    scheme, origin = settings.get("peft", (None, ""))
    if scheme in (None, "none"):
        return
    if scheme not in ("lora", "dora"):
        raise ConfigError("peft", scheme, "'lora', 'dora' or none")
    modules = settings.get("peft.target_modules", (list(_LORA_TARGETS), ""))[0]
    if not isinstance(modules, (list, tuple)) or any(m not in _LORA_TARGETS for m in modules):
        raise ConfigError("peft.target_modules", modules, "a list of " + ", ".join(_LORA_TARGETS))
    targets = "all-linear" if set(modules) == set(_LORA_TARGETS) else [t for m in modules for t in _LORA_TARGETS[m]]
    spec = {"method": scheme, "rank": to_int("peft.dim", settings.get("peft.dim", (32, ""))[0], 1),
            "alpha": float(settings.get("peft.alpha", (32, ""))[0]), "target_modules": targets,
            "dropout": float(settings.get("peft.dropout", (0.0, ""))[0])}
    build.set("training.adapter", spec, "peft" + (f" ({origin})" if origin else ""), scheme,
              why=f"recipes/common.py _peft_common's LoRA: rank {spec['rank']}, alpha {spec['alpha']:g}")
    for key in ("peft.dim", "peft.alpha", "peft.dropout", "peft.target_modules"):
        settings.pop(key, None)


def _account_rest(settings: dict, consumed: set[str], ledger: Ledger) -> None:
    """Every key not read through a flag: ignored, not modelled, or not a key of ConfigContainer."""
    named = {s.name for items in (ledger.read, ledger.ignored, ledger.unsupported) for s in items}
    fsdp = settings.get("ddp.use_megatron_fsdp", (False, ""))[0]
    for key, (value, origin) in settings.items():
        label = _label(key, origin)
        if key in consumed or label in named or key in ("peft", "mixed_precision") or key.startswith(
                ("mixed_precision.fp", "mixed_precision.bf16", "mixed_precision.grad_reduce_in_fp32")):
            continue
        section, _, rest = key.partition(".")
        field = rest.split(".")[0]
        if section != "env_vars" and (section not in SECTIONS or field not in SECTIONS[section]):
            if origin.startswith("recipe"):  # a field of the model's own provider (Qwen3MoEModelProvider, ...)
                ledger.not_modelled(label, value, "a setting of the recipe's model provider the estimate does not "
                                                  "model")
            else:
                ledger.strange(label, value, f"not a key of {VERSION}'s ConfigContainer")
        elif section in _IGNORED_SECTIONS or _IGNORED_KEYS.fullmatch(key):
            ledger.ignore(label, value, _IGNORED_SECTIONS.get(section, "no effect on memory or speed"))
        elif key == "ddp.data_parallel_sharding_strategy" and not fsdp:
            ledger.ignore(label, value, "read only with ddp.use_megatron_fsdp")
        elif origin == "recipe base":
            continue  # a default of the recipe's base that nothing reads
        else:
            ledger.not_modelled(label, value, f"a {VERSION} setting the estimate does not model")
