"""Accelerate: its ``default_config.yaml`` (``accelerate launch --config_file``) with the Hugging
Face TrainingArguments (or TRL config) and PEFT LoraConfig of the script it launches.

Keys follow accelerate 1.15.0's ``commands/config`` (ClusterConfig): ``distributed_type``
(DEEPSPEED, FSDP, MULTI_GPU, NO), ``num_processes`` (all processes of all machines), the
``deepspeed_config`` plugin (zero_stage, offload devices) and the ``fsdp_config`` plugin
(fsdp_version, reshard after forward or sharding strategy, parameter offload, activation
checkpointing). ``mixed_precision`` is the Trainer's to decide: TrainingArguments' bf16/fp16 win.
"""

from __future__ import annotations

import re

from ..spec.errors import ConfigError
from ..spec.choices import FSDP1_STRATEGIES
from . import hf_trainer
from .build import ConfigBuilder, FlatDoc, to_int
from .result import Imported, Ledger
from .source import parse_yaml

KIND = "accelerate"
_TYPES = {"DEEPSPEED": "deepspeed", "FSDP": "fsdp", "MULTI_GPU": "hf", "NO": "hf"}
_IGNORED = {"compute_environment", "debug", "machine_rank", "main_training_function", "rdzv_backend",
            "same_network", "tpu_env", "tpu_use_cluster", "tpu_use_sudo", "use_cpu", "downcast_bf16",
            "enable_cpu_affinity", "main_process_ip", "main_process_port", "gpu_ids", "num_machines", "dynamo_config",
            "deepspeed_config.deepspeed_multinode_launcher", "deepspeed_config.zero3_init_flag",
            "deepspeed_config.zero3_save_16bit_model", "fsdp_config.fsdp_auto_wrap_policy",
            "fsdp_config.fsdp_state_dict_type", "fsdp_config.fsdp_cpu_ram_efficient_loading",
            "fsdp_config.fsdp_sync_module_states", "fsdp_config.fsdp_use_orig_params",
            "fsdp_config.fsdp_transformer_layer_cls_to_wrap", "fsdp_config.fsdp_backward_prefetch",
            "fsdp_config.fsdp_forward_prefetch", "fsdp_config.fsdp_min_num_params"}


def looks_like(text: str, name: str = "") -> bool:
    return bool(re.search(r"^distributed_type:", text, re.M)) and bool(re.search(r"^num_processes:", text, re.M))


def read(text: str, gpus: int | None = None, overrides: tuple[str, ...] = (), training_args: str | None = None,
         peft: str | None = None) -> Imported:
    ledger = Ledger()
    acc = FlatDoc(parse_yaml(text, "accelerate config"), "accelerate config")
    args = hf_trainer.load_args(training_args)
    if args is None:
        raise ConfigError("--training-args", None, "the TrainingArguments (or TRL config) of the launched script: "
                          "they name the model and the batch", "missing")
    hf_trainer.merge_flags(args, overrides)
    lora = hf_trainer.load_peft(peft)
    build = ConfigBuilder(ledger)
    kind = acc.get("distributed_type", "NO")
    if not isinstance(kind, str) or kind not in _TYPES:  # a mapping or list would not hash
        raise ConfigError("distributed_type", kind, ", ".join(_TYPES))
    world = gpus or to_int("num_processes", acc.get("num_processes", 1), 1)
    if gpus is None:
        ledger.mapped("num_processes", world, f"world size {world}")
    framework = _framework(acc, build, ledger, kind)
    build.put("parallel.dp", world if kind != "NO" else 1)
    hf_trainer.apply(args, build, ledger, framework, world, lora)
    mixed = acc.get("mixed_precision")
    if mixed is not None:
        ledger.ignore("mixed_precision", mixed, "the Trainer's bf16/fp16 decide")
    for key, value in acc.rest():
        if key in _IGNORED:
            ledger.ignore(key, value, "launcher and checkpoint settings")
        else:
            ledger.not_modelled(key, value, "an accelerate setting the estimate does not model")
    return ledger.result(KIND, {"model": build.named_model or build.model, **build.config})


def _framework(acc: FlatDoc, build: ConfigBuilder, ledger: Ledger, kind: str) -> str:
    if kind == "DEEPSPEED":
        build.put("training.framework", "deepspeed")
        file = acc.get("deepspeed_config.deepspeed_config_file")
        if file:
            raise ConfigError("deepspeed_config.deepspeed_config_file", file, "the DeepSpeed plugin's own keys here, "
                              "or the DeepSpeed file imported with --from deepspeed", "a second file is not read")
        stage = acc.get("deepspeed_config.zero_stage", 0)
        build.set("parallel.zero_stage", to_int("zero_stage", stage, 0), "deepspeed_config.zero_stage")
        for key, path in (("offload_optimizer_device", "training.offload_optimizer"),
                          ("offload_param_device", "training.offload_parameters")):
            device = acc.get(f"deepspeed_config.{key}", "none")
            if device not in ("none", None):
                build.set(path, device, f"deepspeed_config.{key}")
        steps = acc.get("deepspeed_config.gradient_accumulation_steps")
        if steps is not None:
            ledger.mapped("deepspeed_config.gradient_accumulation_steps", steps, "the Trainer's value is used")
        return "deepspeed"
    if kind == "FSDP":
        return _fsdp(acc, build, ledger)
    build.put("training.framework", "hf")
    ledger.mapped("distributed_type", kind, "framework hf (the Trainer with DDP)" if kind == "MULTI_GPU" else
                  "framework hf on one GPU")
    return "hf"


def _fsdp(acc: FlatDoc, build: ConfigBuilder, ledger: Ledger) -> str:
    version = to_int("fsdp_version", acc.get("fsdp_config.fsdp_version", 1), 1)
    framework = "hf_fsdp2" if version == 2 else "fsdp1"  # the Trainer over Accelerate's FSDP2 / FSDP1 plugin
    build.set("training.framework", framework, "fsdp_config.fsdp_version", version)
    reshard = acc.get("fsdp_config.fsdp_reshard_after_forward")
    strategy = reshard if isinstance(reshard, str) else acc.get("fsdp_config.fsdp_sharding_strategy")
    if framework == "fsdp1":
        _fsdp1_strategy(acc, strategy, build)
    elif isinstance(reshard, bool):
        stage = 3 if reshard else 2
    else:
        stage = {"FULL_SHARD": 3, "1": 3, "SHARD_GRAD_OP": 2, "2": 2, "NO_SHARD": 0, "3": 0,
                 "HYBRID_SHARD": 3, None: 3}.get(str(strategy).upper() if strategy is not None else None)
        if stage is None:
            raise ConfigError("fsdp_sharding_strategy", strategy, "FULL_SHARD, SHARD_GRAD_OP, NO_SHARD, HYBRID_SHARD")
        if str(strategy).upper() == "HYBRID_SHARD":
            ledger.not_modelled("fsdp_sharding_strategy", strategy, "sharded within a node; estimated over all GPUs")
    if framework != "fsdp1":
        build.set("parallel.zero_stage", stage, "fsdp_config.fsdp_reshard_after_forward",
                  reshard if reshard is not None else strategy)
    if acc.get("fsdp_config.fsdp_offload_params"):
        build.set("training.offload_optimizer", "cpu", "fsdp_config.fsdp_offload_params", True,
                  why="CPUOffloadPolicy: parameters, gradients and optimizer states on the host")
        build.put("training.offload_parameters", "cpu")
    if acc.get("fsdp_config.fsdp_activation_checkpointing"):
        build.set("training.recompute", "full", "fsdp_config.fsdp_activation_checkpointing", True)
    return framework


# torch's ShardingStrategy by name or by value, as accelerate 1.15 FullyShardedDataParallelPlugin takes it
FSDP1_STRATEGY_NAMES = {"1": "FULL_SHARD", "2": "SHARD_GRAD_OP", "3": "NO_SHARD", "4": "HYBRID_SHARD"}
# TrainingArguments.fsdp's sharding options (transformers trainer_utils FSDPOption), as axolotl's `fsdp` list too
FSDP_OPTIONS = {"full_shard": "FULL_SHARD", "shard_grad_op": "SHARD_GRAD_OP", "hybrid_shard": "HYBRID_SHARD",
                "no_shard": "NO_SHARD"}


def fsdp1_strategy_name(key: str, strategy: object) -> str:
    """torch's ShardingStrategy by name or by value (FULL_SHARD when not given), or a ConfigError naming `key`."""
    text = "FULL_SHARD" if strategy is None else str(strategy).upper()
    name = FSDP1_STRATEGY_NAMES.get(text, text)
    if name not in FSDP1_STRATEGIES:
        raise ConfigError(key, strategy, ", ".join(FSDP1_STRATEGIES) + " (or 1-4)")
    return name


def fsdp_words(value: object) -> list[str]:
    """TrainingArguments.fsdp (and axolotl's `fsdp`) as its option words: a string of them or a list."""
    return [str(w) for w in value] if isinstance(value, list) else str(value or "").split()


def _fsdp1_strategy(acc: FlatDoc, strategy, build: ConfigBuilder) -> None:
    """FSDP1's fsdp_sharding_strategy as the estimator's parallel.fsdp_sharding_strategy (memory/fsdp1.py);
    HYBRID_SHARD shards within a machine: num_processes / num_machines ranks."""
    name = fsdp1_strategy_name("fsdp_sharding_strategy", strategy)
    build.set("parallel.fsdp_sharding_strategy", name, "fsdp_config.fsdp_sharding_strategy", strategy)
    machines = to_int("num_machines", acc.get("num_machines", 1), 1)
    if name == "HYBRID_SHARD":
        processes = to_int("num_processes", acc.get("num_processes", 1), 1)
        build.set("parallel.fsdp_shard_group_size", processes // machines, "num_machines", machines,
                  why="HYBRID_SHARD shards within a machine")
