"""DeepSpeed: a ``ds_config.json`` with the Hugging Face TrainingArguments (or TRL config) and PEFT
LoraConfig it runs with, read into our JSON config.

ZeRO stage, offload devices and bucket sizes follow DeepSpeed's config keys (``zero_optimization``);
``"auto"`` values are filled as transformers 5.23.0 ``integrations/deepspeed.py`` fills them
(HfTrainerDeepSpeedConfig.trainer_config_process / trainer_config_finalize): the micro-batch from
per_device_train_batch_size, bf16/fp16 from the arguments, reduce_bucket_size = h x h and
stage3_prefetch_bucket_size = int(0.9 x h x h) with h the model's hidden size.
"""

from __future__ import annotations

import re

from ..spec.errors import ConfigError
from . import hf_trainer
from .build import ConfigBuilder, FlatDoc, to_float, to_int
from .result import Imported, Ledger
from .source import parse_json

KIND = "deepspeed"
# DeepSpeed's zero_optimization keys that do not change what the estimate counts
_ZERO_IGNORED = {"allgather_partitions", "reduce_scatter",
                 "round_robin_gradients", "stage3_gather_16bit_weights_on_model_save",
                 "gather_16bit_weights_on_model_save", "stage3_gather_fp16_weights_on_model_save",
                 "offload_optimizer.pin_memory", "offload_param.pin_memory",
                 "offload_optimizer.nvme_path", "offload_param.nvme_path", "load_from_fp32_weights",
                 "elastic_checkpoint", "ignore_unused_parameters", "legacy_stage1", "cpu_offload",
                 "stage3_param_persistence_threshold", "sub_group_size", "allgather_bucket_size",
                 "stage3_max_reuse_distance", "offload_optimizer.buffer_count", "offload_optimizer.fast_init",
                 "offload_param.buffer_count", "offload_param.buffer_size", "offload_param.max_in_cpu",
                 "offload_optimizer.ratio", "offload_optimizer.pipeline_read", "offload_optimizer.pipeline_write"}
_TOP_IGNORED = {"gradient_clipping", "steps_per_print", "wall_clock_breakdown", "scheduler", "tensorboard",
                "wandb", "csv_monitor", "comms_logger", "flops_profiler", "prescale_gradients",
                "gradient_predivide_factor", "communication_data_type", "zero_allow_untested_optimizer",
                "zero_force_ds_cpu_optimizer", "checkpoint", "dump_state", "train_batch_size"}


def looks_like(text: str, name: str = "") -> bool:
    """A ds_config: JSON with a zero_optimization section (a TrainingArguments YAML that holds one
    under ``deepspeed`` is the `hf` kind's)."""
    return text.lstrip().startswith("{") and bool(re.search(r'"zero_optimization"\s*:', text))


def read(text: str, gpus: int | None = None, overrides: tuple[str, ...] = (), training_args: str | None = None,
         peft: str | None = None) -> Imported:
    ledger = Ledger()
    ds = FlatDoc(parse_json(text, "ds_config.json"), "DeepSpeed config")
    args = hf_trainer.load_args(training_args) or FlatDoc({}, "TrainingArguments")
    hf_trainer.merge_flags(args, overrides)
    lora = hf_trainer.load_peft(peft)
    build = ConfigBuilder(ledger)
    build.put("training.framework", "deepspeed")
    ledger.note("framework deepspeed (DeepSpeed ZeRO under the Hugging Face Trainer)")
    world = _world(ds, args, gpus, ledger)
    build.put("parallel.dp", world)
    mbs = _auto(ds, "train_micro_batch_size_per_gpu", args.get("per_device_train_batch_size", 8))
    if not args.flat:
        raise ConfigError("--training-args", None, "the TrainingArguments (or TRL config) the DeepSpeed config runs "
                          "with: they name the model and the sequence length", "missing")
    hf_trainer.apply(args, build, ledger, "deepspeed", world, lora, batch_from_ds=to_int(
        "train_micro_batch_size_per_gpu", mbs, 1))
    read_ds_side(ds, args, build, ledger, "ds:")
    return ledger.result(KIND, {"model": build.named_model or build.model, **build.config})


def read_ds_side(ds: FlatDoc, args: FlatDoc, build: ConfigBuilder, ledger: Ledger, prefix: str) -> None:
    """A ds_config's precision, ZeRO stage, offload and buckets, and every other key accounted for
    (named `prefix` + key): its own file's, or the dict TrainingArguments' ``deepspeed`` holds."""
    _precision(ds, args, build, ledger)
    _client_optimizer(ds, args, build)
    _zero(ds, build, ledger)
    hf_trainer.settle_sft_loss(build, ledger)
    for key, value in ds.rest():
        top = key.split(".")[0]
        if top in _TOP_IGNORED or key in ("gradient_accumulation_steps", "bf16.enabled", "fp16.enabled",
                                          "train_micro_batch_size_per_gpu"):
            ledger.ignore(f"{prefix}{key}", value, "no effect on memory, or read from the Trainer's arguments")
        elif top in ("optimizer",):
            ledger.ignore(f"{prefix}{key}", value, "the optimizer's hyper-parameters (its type is read)")
        elif top in ("fp16", "bf16"):
            ledger.ignore(f"{prefix}{key}", value, "loss scaling")
        else:
            ledger.not_modelled(f"{prefix}{key}", value, "a DeepSpeed setting the estimate does not model")


def _auto(ds: FlatDoc, key: str, hf_value: object) -> object:
    """A DeepSpeed value, or the Trainer's where the file says "auto" (or nothing)."""
    value = ds.get(key)
    return hf_value if value in ("auto", None) else value


def _world(ds: FlatDoc, args: FlatDoc, gpus: int | None, ledger: Ledger) -> int:
    """--gpus, or DeepSpeed's train_batch_size = world x micro-batch x accumulation when all three
    are numbers in the file."""
    if gpus is not None:
        return gpus
    total, micro, steps = (ds.flat.get(k) for k in ("train_batch_size", "train_micro_batch_size_per_gpu",
                                                     "gradient_accumulation_steps"))
    if all(isinstance(v, int) and v > 0 for v in (total, micro, steps)) and total % (micro * steps) == 0:
        world = total // (micro * steps)
        ledger.note(f"world size {world} = train_batch_size {total} / ({micro} x {steps})")
        return world
    raise ConfigError("--gpus", None, "the number of GPUs: the DeepSpeed launcher decides it", "missing")


def _precision(ds: FlatDoc, args: FlatDoc, build: ConfigBuilder, ledger: Ledger) -> None:
    """bf16.enabled / fp16.enabled ("auto": the Trainer's bf16 / fp16); DeepSpeed keeps fp32 master
    weights and Adam states beside 16-bit weights and gradients (the framework's defaults)."""
    for name in ("bf16", "fp16"):
        value = ds.get(f"{name}.enabled")
        if value not in (None, "auto"):
            ledger.mapped(f"ds:{name}.enabled", value, "must agree with the Trainer's " + name)
            if bool(value) != bool(args.flat.get(name, name == "bf16" and hf_trainer.trainer_kind(args) != "trainer")):
                raise ConfigError(f"{name}.enabled", value, f"the Trainer's {name} ({args.flat.get(name)})",
                                  "transformers refuses a DeepSpeed config that disagrees with TrainingArguments")
    if ds.get("optimizer.type") not in (None, "Adam", "AdamW", "adam", "adamw"):
        ledger.not_modelled("ds:optimizer.type", ds.flat["optimizer.type"], "estimated as AdamW")


def _client_optimizer(ds: FlatDoc, args: FlatDoc, build: ConfigBuilder) -> None:
    """Without an optimizer section DeepSpeed steps the Trainer's own optimizer on its flat partitions (transformers
    integrations/deepspeed.py deepspeed_optim_sched: the Trainer's create_optimizer): `optim adamw_torch` is torch's
    foreach AdamW; with a section DeepSpeed builds its FusedAdam (engine.py _configure_basic_optimizer), in place,
    and so does adamw_torch_fused: the default (memory/deepspeed_step.py)."""
    if ds.get("optimizer.type") is None and str(args.flat.get("optim", "")) == "adamw_torch":
        build.set("training.adamw_implementation", "foreach", "optim", "adamw_torch",
                  why="no optimizer section in the ds_config: DeepSpeed steps the Trainer's foreach AdamW")


def _zero(ds: FlatDoc, build: ConfigBuilder, ledger: Ledger) -> None:
    stage = ds.get("zero_optimization.stage", 0)
    if stage not in (0, 1, 2, 3):
        raise ConfigError("zero_optimization.stage", stage, "0, 1, 2 or 3")
    build.set("parallel.zero_stage", stage, "ds:zero_optimization.stage")
    for part, path in (("offload_optimizer", "training.offload_optimizer"), ("offload_param",
                                                                            "training.offload_parameters")):
        device = ds.get(f"zero_optimization.{part}.device", "none")
        if device not in ("none", "cpu", "nvme", None):
            raise ConfigError(f"zero_optimization.{part}.device", device, "'none', 'cpu' or 'nvme'")
        if device not in ("none", None):
            build.set(path, device, f"ds:zero_optimization.{part}.device")
    model = build.named_model
    hidden = _hidden_size(model) if isinstance(model, str) else None
    for key, path, auto in (("reduce_bucket_size", "training.reduce_bucket_size", lambda h: h * h),
                            ("stage3_prefetch_bucket_size", "training.stage3_prefetch_bucket_size",
                             lambda h: int(0.9 * h * h)),
                            ("stage3_max_live_parameters", "training.stage3_max_live_parameters", None)):
        value = ds.get(f"zero_optimization.{key}")
        if value is None:
            continue
        if value == "auto":
            if auto is None or hidden is None:
                raise ConfigError(f"zero_optimization.{key}", "auto", "a number (the model's hidden size is not "
                                  "known offline)" if auto else "a number")
            if key.startswith("stage3") and stage != 3:
                continue
            build.set(path, auto(hidden), f"ds:zero_optimization.{key}", "auto",
                      why=f"filled as transformers fills it, hidden size {hidden}")
        else:
            number = to_int(f"zero_optimization.{key}", _whole(f"zero_optimization.{key}", value), 0)
            if number == 0:  # no bucket: gradients reduced (parameters fetched) one at a time
                ledger.not_modelled(f"ds:zero_optimization.{key}", value, "0 (no bucket); estimated as a bucket of "
                                    "one element")
                build.put(path, 1)
            else:
                build.set(path, number, f"ds:zero_optimization.{key}", value)
    _overlap_comm(ds, build, ledger, stage)
    _contiguous_gradients(ds, build, ledger, stage)
    for key, value in list(ds.flat.items()):
        if key.startswith("zero_optimization.") and key not in ds.used:
            sub = key[len("zero_optimization."):]
            if sub in _ZERO_IGNORED:
                ds.used.add(key)
                ledger.ignore(f"ds:{key}", value, "communication scheduling or checkpoint format")


def _zero_switch(ds: FlatDoc, ledger: Ledger, key: str, stage: int) -> bool | None:
    """A zero_optimization switch's value where it can matter: None when absent, or under ZeRO stage 0 (said so)."""
    value = ds.get(key)
    if value is None:
        return None
    if not isinstance(value, bool):
        raise ConfigError(key, value, "true or false")
    if stage == 0:
        ledger.ignore(f"ds:{key}", value, "ZeRO stage 0 reduces through the engine's own buffers")
        return None
    return value


def _overlap_comm(ds: FlatDoc, build: ConfigBuilder, ledger: Ledger, stage: int) -> None:
    """zero_optimization.overlap_comm (training.overlap_comm): it changes what ZeRO 1-3 hold (two reduce buckets,
    ZeRO-1 reducing in backward; memory/deepspeed_zero1_overlap.py, deepspeed_step.py), so it is read, not ignored."""
    key = "zero_optimization.overlap_comm"
    value = _zero_switch(ds, ledger, key, stage)
    if value is None:
        return
    if value == (stage == 3):  # DeepSpeed's default: on under ZeRO-3 only (zero/config.py, stage3.py)
        ledger.ignore(f"ds:{key}", value, f"DeepSpeed's default under ZeRO-{stage}, as the estimate counts it")
    else:
        build.set("training.overlap_comm", value, f"ds:{key}")


def _contiguous_gradients(ds: FlatDoc, build: ConfigBuilder, ledger: Ledger, stage: int) -> None:
    """zero_optimization.contiguous_gradients (DeepSpeed's default true): off is modelled for ZeRO-2 over more than
    one rank (memory/deepspeed_noncontiguous.py); elsewhere estimated with it on, and said so. offload_optimizer
    turns it back on (stage_1_and_2.py l. 259), which the estimate applies itself."""
    key = "zero_optimization.contiguous_gradients"
    value = _zero_switch(ds, ledger, key, stage)
    if value is None:
        return
    if value:
        ledger.ignore(f"ds:{key}", value, "DeepSpeed's default (on), as the estimate counts it")
    elif stage == 2 and (build.get("parallel.dp") or 1) > 1:
        build.set("training.contiguous_gradients", value, f"ds:{key}")
    else:
        ledger.not_modelled(f"ds:{key}", value, "off is modelled for ZeRO-2 over more than one GPU; estimated with "
                            "it on")


def _hidden_size(model: str) -> int | None:
    from ..models.presets import get_architecture, preset_ids
    return get_architecture(model).hidden_size if model in preset_ids() else None


def _whole(name: str, value: object) -> int | str:
    """A DeepSpeed size as JSON writes it (5e8 is a float there) as an integer; anything else as given, for to_int
    to refuse by name (a list, a word, a bool)."""
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        return str(value)
    number = to_float(name, value)
    return int(number) if number == int(number) else str(value)

