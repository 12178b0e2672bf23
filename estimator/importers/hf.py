"""The Hugging Face Trainer on its own: TrainingArguments, or a TRL config that extends them (``trl sft
--config args.yaml``, ``python train.py --per_device_train_batch_size ...``), read into our JSON config.

The distributed side is in the arguments themselves (transformers 5.23.0 TrainingArguments): plain DDP
over ``--gpus``; ``deepspeed`` as a loaded dict (its keys read as the `deepspeed` importer reads a
ds_config) or as the path of a file named like the projects' bundled ones (`finetune.deepspeed_by_name`);
``fsdp: true`` with ``fsdp_config`` (``version`` 2 by default, ``reshard_after_forward``, ``cpu_offload``,
``activation_checkpointing``).
"""

from __future__ import annotations

import re

from . import deepspeed, hf_trainer
from .build import ConfigBuilder, FlatDoc, to_int
from .accelerate import FSDP_OPTIONS, fsdp_words
from .finetune import deepspeed_by_name
from .result import Imported, Ledger

KIND = "hf"
_FSDP_IGNORED = {"cpu_ram_efficient_loading": "checkpoint loading", "state_dict_type": "checkpoint format",
                 "auto_wrap_policy": "one unit per decoder layer, as the estimate wraps",
                 "transformer_layer_cls_to_wrap": "one unit per decoder layer, as the estimate wraps",
                 "min_num_params": "one unit per decoder layer, as the estimate wraps"}


def looks_like(text: str, name: str = "") -> bool:
    """TrainingArguments: the model and the Trainer's batch, in YAML, JSON or flags."""
    return bool(re.search(r"\bmodel_name_or_path\b", text)) and bool(re.search(
        r"\bper_device_train_batch_size\b|\bgradient_accumulation_steps\b", text))


def read(text: str, gpus: int | None = None, overrides: tuple[str, ...] = ()) -> Imported:
    ledger = Ledger()
    data = hf_trainer.parse_args_text(text, "TrainingArguments")
    ds, fsdp = data.pop("deepspeed", None), data.pop("fsdp_config", None)
    args = FlatDoc(data, "TrainingArguments")
    hf_trainer.merge_flags(args, overrides)
    build = ConfigBuilder(ledger)
    world = gpus or 1
    if gpus is None:
        ledger.note("no --gpus: one GPU")
    build.put("parallel.dp", world)
    batch = None
    if isinstance(ds, dict):
        framework, batch = "deepspeed", _inline_deepspeed(ds, args, build, ledger)
    elif ds:
        framework = "deepspeed" if deepspeed_by_name(ds, "deepspeed", build, ledger) else "hf"
    elif args.get("fsdp"):
        framework = _fsdp(fsdp, args.get("fsdp"), build, ledger)
    else:
        framework = "hf"
        if fsdp is not None:
            ledger.ignore("fsdp_config", "...", "read only with fsdp")
    build.put("training.framework", framework)
    ledger.note(f"framework {framework} (the Hugging Face Trainer" + {"hf": ", DDP", "deepspeed": " with DeepSpeed",
                                                                       }.get(framework, " with FSDP") + ")")
    hf_trainer.apply(args, build, ledger, framework, world, None, batch_from_ds=batch)
    if isinstance(ds, dict):
        deepspeed.read_ds_side(FlatDoc(ds, "DeepSpeed config"), args, build, ledger, "deepspeed.")
    return ledger.result(KIND, {"model": build.named_model or build.model, **build.config})


def _inline_deepspeed(ds: dict, args: FlatDoc, build: ConfigBuilder, ledger: Ledger) -> int | None:
    """The micro-batch a loaded ds_config states (None: "auto", the Trainer's)."""
    ledger.mapped("deepspeed", "{...}", "a DeepSpeed config given as a dict, read below")
    value = ds.get("train_micro_batch_size_per_gpu")
    return None if value in (None, "auto") else to_int("train_micro_batch_size_per_gpu", value, 1)


def _fsdp(options: object, given: object, build: ConfigBuilder, ledger: Ledger) -> str:
    """fsdp_config of TrainingArguments (transformers 5.23.0: version 2 unless 1) and the `fsdp` option string's
    sharding (FSDPOption: full_shard, shard_grad_op, hybrid_shard, no_shard): FSDP1's strategy, or FSDP2's
    reshard_after_forward False under shard_grad_op."""
    config = FlatDoc(options if isinstance(options, dict) else {}, "fsdp_config")
    if options is not None and not isinstance(options, dict):
        ledger.not_modelled("fsdp_config", options, "a file this importer does not read; its defaults assumed")
    version = to_int("fsdp_config.version", config.get("version", 2), 1)
    framework = "hf_fsdp2" if version == 2 else "fsdp1"  # the Trainer over Accelerate's FSDP2 / FSDP1 plugin
    build.set("training.framework", framework, "fsdp", True, why=f"FSDP version {version}")
    words = fsdp_words(given)
    strategy = next((FSDP_OPTIONS[w] for w in words if w in FSDP_OPTIONS), None)
    if framework == "fsdp1" and strategy:
        build.set("parallel.fsdp_sharding_strategy", strategy, "fsdp", given)
    elif strategy == "HYBRID_SHARD":
        ledger.not_modelled("fsdp", given, "HSDP (sharded within a node, replicated across): estimated sharded over "
                            "all GPUs")
    if "offload" in words and not config.get("cpu_offload"):
        build.set("training.offload_optimizer", "cpu", "fsdp", given)
        build.put("training.offload_parameters", "cpu")
    if config.get("reshard_after_forward", True) is False:
        build.set("parallel.zero_stage", 2, "fsdp_config.reshard_after_forward", False)
    elif framework == "hf_fsdp2" and strategy == "SHARD_GRAD_OP":  # transformers: reshard_after_forward False
        build.set("parallel.zero_stage", 2, "fsdp", given)
    if config.get("cpu_offload"):
        build.set("training.offload_optimizer", "cpu", "fsdp_config.cpu_offload", True)
        build.put("training.offload_parameters", "cpu")
    if config.get("activation_checkpointing"):
        build.set("training.recompute", "full", "fsdp_config.activation_checkpointing", True)
    for key, value in config.rest():
        if key in _FSDP_IGNORED:
            ledger.ignore(f"fsdp_config.{key}", value, _FSDP_IGNORED[key])
        else:
            ledger.not_modelled(f"fsdp_config.{key}", value, "an FSDP setting the estimate does not model")
    return framework
