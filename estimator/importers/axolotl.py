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
from .build import ConfigBuilder, FlatDoc, key_value_overrides, to_int, trainer_batch
from .finetune import deepspeed_by_name, targets, transformers_attention
from .hf_keys import LEGACY, TRAINING_ARGUMENTS
from .models import named_model
from .result import Imported, Ledger
from .liger import axolotl_liger
from .source import parse_yaml
from .yaml_keys import AXOLOTL

KIND = "axolotl"
VERSION = "axolotl v0.18.0"
_OPTIM = {"adamw_bnb_8bit": "adam8bit", "paged_adamw_8bit": "adam8bit", "adamw_8bit": "adam8bit",
          "paged_adamw_32bit": "adamw", "adamw_torch": "adamw", "adamw_torch_fused": "adamw", "adamw_hf": "adamw",
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
    optim = doc.get("optimizer", "adamw_torch_fused")
    if optim in _OPTIM:
        if _OPTIM[optim] != "adamw":
            build.set("training.optimizer", _OPTIM[optim], "optimizer", optim)
        else:
            ledger.mapped("optimizer", optim, "training.optimizer = \"adamw\"")
    else:
        ledger.not_modelled("optimizer", optim, "estimated as AdamW")
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
            "alpha": float(doc.get("lora_alpha", 16)), "target_modules": chosen,
            "dropout": float(doc.get("lora_dropout", 0.0))}
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
        version = doc.get("fsdp_config.fsdp_version", doc.get("fsdp_version", 1))
        build.set("training.framework", "fsdp2", "fsdp_config.fsdp_version", version,
                  why="" if str(version) == "2" else "FSDP1's flat parameters estimated as FSDP2")
        for key in ("fsdp_config.reshard_after_forward", "fsdp_config.fsdp_reshard_after_forward"):
            if doc.given(key) and str(doc.get(key)).lower() == "false":
                build.set("parallel.zero_stage", 2, key, False)
        for key in ("fsdp_config.offload_params", "fsdp_config.fsdp_offload_params"):
            if doc.given(key) and doc.get(key):
                build.set("training.offload_optimizer", "cpu", key, True)
                build.put("training.offload_parameters", "cpu")
        for key in ("fsdp_config.activation_checkpointing", "fsdp_config.fsdp_activation_checkpointing"):
            if doc.given(key) and doc.get(key):
                build.set("training.recompute", "full", key, True)
