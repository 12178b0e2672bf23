"""axolotl: its training YAML (``axolotl train config.yml``) read into our JSON config.

Keys and defaults follow axolotl v0.18.0 (commit 2f5cb9da62a0fe763a1ddeb7798fc9acb2f4a417,
``src/axolotl/utils/schemas``): base_model, adapter (lora/qlora) with lora_r / lora_alpha /
lora_dropout / lora_target_linear / lora_target_modules / lora_modules_to_save, load_in_4bit /
load_in_8bit, sequence_len, micro_batch_size, gradient_accumulation_steps, bf16 (true/auto) / fp16,
gradient_checkpointing, optimizer, torch_compile, the liger plugin, deepspeed (a bundled config by
name) and fsdp_config. The HF Trainer runs it: DDP over --gpus unless DeepSpeed or FSDP is named.
"""

from __future__ import annotations

import re

from ..spec.errors import ConfigError
from .accelerate import FSDP_OPTIONS, fsdp1_strategy_name, fsdp_words
from .build import ConfigBuilder, FlatDoc, key_value_overrides, to_float, to_int, trainer_batch
from .finetune import deepspeed_by_name, targets, trainer_optimizer, transformers_attention
from .hf_keys import LEGACY, TRAINING_ARGUMENTS
from .models import named_model
from .result import Imported, Ledger
from .liger import axolotl_liger
from .source import parse_yaml
from .yaml_keys import AXOLOTL

KIND = "axolotl"
VERSION = "axolotl v0.18.0"
_OPTIM = {"adamw_bnb_8bit": "adam8bit", "paged_adamw_8bit": "paged_adamw8bit", "adamw_8bit": "adam8bit",
          "paged_adamw_32bit": "paged_adamw", "adamw_torch": "adamw", "adamw_torch_fused": "adamw", "adamw_hf": "adamw",
          "adafactor": "adafactor", "lion_8bit": "lion", "paged_lion_8bit": "lion", "sgd": "sgd"}
_READ_ELSEWHERE = ("model_type", "tokenizer_type")


def looks_like(text: str, name: str = "") -> bool:
    return bool(re.search(r"^base_model:", text, re.M)) and bool(re.search(r"^(sequence_len|micro_batch_size):",
                                                                         text, re.M))


def read(text: str, gpus: int | None = None, overrides: tuple[str, ...] = ()) -> Imported:
    ledger = Ledger()
    doc = FlatDoc(parse_yaml(text, "axolotl config"), "axolotl config")
    key_value_overrides(overrides, doc, ledger, VERSION)
    build = ConfigBuilder(ledger)
    build.put("training.framework", "hf")
    _model(doc, build, ledger)
    seq = doc.get("sequence_len", 2048)
    build.set("training.seq_len", to_int("sequence_len", seq, 1), "sequence_len" if doc.given("sequence_len") else
              "(no sequence_len)", seq)
    if doc.get("sample_packing"):
        ledger.mapped("sample_packing", True, "samples packed to sequence_len")
    trainer_batch(doc, build, gpus, "micro_batch_size", 1)
    _precision(doc, build, ledger)
    _distributed(doc, build, ledger)
    if doc.get("gradient_checkpointing"):
        build.set("training.recompute", "full", "gradient_checkpointing", doc.flat["gradient_checkpointing"])
    trainer_optimizer(build, ledger, "optimizer", doc.get("optimizer", "adamw_torch_fused"), _OPTIM)
    axolotl_liger(doc, build, ledger)
    attn = doc.get("attn_implementation")
    if attn is not None:
        transformers_attention(build, ledger, "attn_implementation", attn)
    elif doc.get("flash_attention"):  # axolotl's switch: attn_implementation flash_attention_2
        transformers_attention(build, ledger, "flash_attention", "flash_attention_2")
    elif doc.get("sdp_attention"):
        transformers_attention(build, ledger, "sdp_attention", "sdpa")
    elif doc.given("flash_attention") and doc.get("flash_attention") is False:
        build.set("training.attention", "eager", "flash_attention", False)
    if doc.get("torch_compile") and build.get("training.framework") == "hf":
        build.set("training.compile", True, "torch_compile", True)
    if doc.get("rl"):
        ledger.not_modelled("rl", doc.flat["rl"], "axolotl's preference / RL trainers; estimated as supervised "
                                                  "fine-tuning")
    for key, value in doc.rest():
        top = key.split(".")[0]
        known = top in AXOLOTL or top in TRAINING_ARGUMENTS or top in LEGACY or top in _READ_ELSEWHERE
        if known or top.startswith("liger_"):  # liger_*: the Liger plugin's own arguments
            ledger.ignore(key, value, "datasets, paths, logging, schedule: no effect on memory")
        else:
            ledger.strange(key, value, f"not a key of {VERSION}'s config schema")
    return ledger.result(KIND, {"model": build.named_model or build.model, **build.config})


def _model(doc: FlatDoc, build: ConfigBuilder, ledger: Ledger) -> None:
    name = doc.get("base_model")
    build.named_model = named_model(name, "base_model", "a Hugging Face id (org/name)")
    ledger.mapped("base_model", name, f"model = \"{build.named_model}\"")
    adapter = doc.get("adapter")
    four, eight = bool(doc.get("load_in_4bit")), bool(doc.get("load_in_8bit"))
    if adapter not in (None, "", "lora", "qlora"):
        raise ConfigError("adapter", adapter, "'lora' or 'qlora' (or none for a full fine-tune)")
    if not adapter:
        return
    if doc.get("lora_target_linear"):
        chosen: object = "all-linear"
    else:
        chosen = targets(doc.get("lora_target_modules"))
        if chosen is None:
            raise ConfigError("lora_target_modules", doc.flat.get("lora_target_modules"),
                              "q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj, or lora_target_linear")
    method = "qlora" if adapter == "qlora" or four else "dora" if doc.get("peft_use_dora") else "lora"
    spec = {"method": method, "rank": to_int("lora_r", doc.get("lora_r", 8), 1),
            "alpha": to_float("lora_alpha", doc.get("lora_alpha", 16)), "target_modules": chosen,
            "dropout": to_float("lora_dropout", doc.get("lora_dropout", 0.0))}
    if eight and method == "lora":
        spec["base_dtype"] = "int8"
    if doc.get("lora_modules_to_save"):
        spec["trainable_embeddings"] = True
    build.set("training.adapter", spec, "adapter", adapter, why=f"{method} rank {spec['rank']}")


def _precision(doc: FlatDoc, build: ConfigBuilder, ledger: Ledger) -> None:
    bf16, fp16 = doc.get("bf16"), doc.get("fp16")
    if bf16 in (True, "auto", "true"):
        ledger.mapped("bf16", bf16, "bf16 weights (loaded in bf16, as the Trainer runs them)")
    elif fp16:
        build.set("training.param_dtype", "fp16", "fp16", fp16)
    else:
        build.set("training.param_dtype", "fp32", "(no bf16 / fp16)", "", why="fp32 training")
        build.put("training.compute_dtype", "fp32")


def _distributed(doc: FlatDoc, build: ConfigBuilder, ledger: Ledger) -> None:
    ds = doc.get("deepspeed")
    if ds:
        deepspeed_by_name(ds, "deepspeed", build, ledger)
        return
    if doc.get("fsdp") or any(k.startswith("fsdp_config.") for k in doc.flat):
        _fsdp(doc, build, ledger)
        for key in ("fsdp_config.activation_checkpointing", "fsdp_config.fsdp_activation_checkpointing"):
            if doc.given(key) and doc.get(key):
                build.set("training.recompute", "full", key, True)


_OFFLOAD_KEYS = ("fsdp_config.offload_params", "fsdp_config.fsdp_offload_params")


def _fsdp(doc: FlatDoc, build: ConfigBuilder, ledger: Ledger) -> None:
    """FSDP1 (axolotl's default) as fsdp1 with its sharding strategy, FSDP2 as hf_fsdp2 (axolotl trains through the
    HF Trainer and Accelerate); FSDP1 with its parameters
    offloaded as FSDP2's CPUOffloadPolicy (FSDP1's CPUOffload is not modelled: memory/fsdp1.py)."""
    options = fsdp_words(doc.get("fsdp"))
    offload = next((k for k in _OFFLOAD_KEYS if doc.given(k) and doc.get(k)), "fsdp" if "offload" in options else None)
    key, version = _fsdp_version(doc)
    strategy = _fsdp1_strategy(doc, options, ledger) if version == 1 else None
    given = version if key else ""
    key = key or "fsdp_version"  # not given: axolotl's default
    if version == 1 and not offload:
        build.set("training.framework", "fsdp1", key, given, why="" if given else "axolotl's default")
        if strategy:
            build.set("parallel.fsdp_sharding_strategy", strategy[1], strategy[0], strategy[2])
    else:
        build.set("training.framework", "hf_fsdp2", key, given)
        if version == 1:
            ledger.not_modelled(offload, True, "FSDP1's CPUOffload: estimated as FSDP2's CPUOffloadPolicy (parameters, "
                                "gradients and optimizer states on the host)")
        unsharded = strategy and strategy[1] in ("SHARD_GRAD_OP", "NO_SHARD")
        for reshard in ("fsdp_config.reshard_after_forward", "fsdp_config.fsdp_reshard_after_forward"):
            if doc.given(reshard) and str(doc.get(reshard)).lower() == "false":
                build.set("parallel.zero_stage", 2, reshard, False)
        if unsharded:
            build.set("parallel.zero_stage", 2 if strategy[1] == "SHARD_GRAD_OP" else 0, strategy[0], strategy[2])
    if offload:
        build.set("training.offload_optimizer", "cpu", offload, "offload" if offload == "fsdp" else True)
        build.put("training.offload_parameters", "cpu")


def _fsdp_version(doc: FlatDoc) -> tuple[str | None, int]:
    """axolotl's _resolve_fsdp_version (utils/schemas/validation.py): the top-level fsdp_version, else fsdp_config's
    (fsdp_version, or its alias version: schemas/fsdp.py), else 1."""
    for key in ("fsdp_version", "fsdp_config.fsdp_version", "fsdp_config.version"):
        if doc.given(key):
            return key, to_int(key, doc.get(key), 1)
    return None, 1


def _fsdp1_strategy(doc: FlatDoc, options: list, ledger: Ledger) -> tuple[str, str, object] | None:
    """FSDP1's sharding strategy as (key, name, value given): fsdp_config's (fsdp_)sharding_strategy, else the `fsdp`
    list's option; None: FULL_SHARD, the default (memory/fsdp1.py). HYBRID_SHARD shards within a node
    (fsdp_shard_group_size's default, 8)."""
    for option in options:
        if option not in (*FSDP_OPTIONS, "auto_wrap", "offload"):
            ledger.not_modelled("fsdp", option, "an FSDP option the estimate does not model")
    for key in ("fsdp_config.fsdp_sharding_strategy", "fsdp_config.sharding_strategy"):
        if doc.given(key):
            return key, fsdp1_strategy_name(key, doc.get(key)), doc.get(key)
    chosen = [o for o in options if o in FSDP_OPTIONS]
    return ("fsdp", FSDP_OPTIONS[chosen[0]], chosen[0]) if chosen else None
