"""LLaMA-Factory: its training YAML (``llamafactory-cli train config.yaml``) read into our JSON config.

Keys and defaults follow LLaMA-Factory v0.9.5 (commit 7af909522a951e3ad9f022ea6f88b6755257eaa5,
``src/llamafactory/hparams``): finetuning_type (lora / full / freeze / oft), lora_rank 8,
lora_alpha = 2 x rank when unset, lora_target ("all" = every linear layer), quantization_bit 4 or 8
(bitsandbytes NF4 with double quantization by default), cutoff_len 2048, gradient checkpointing on
unless disable_gradient_checkpointing, stage (pt / sft / dpo; DPO keeps a reference model unless the
loss is orpo or simpo, and a LoRA run uses its own base as the reference:
train/trainer_utils.py create_ref_model), deepspeed (a bundled config by name). The HF Trainer
runs it: DDP over --gpus unless DeepSpeed is named.
"""

from __future__ import annotations

import re

from ..spec.errors import ConfigError
from .build import ConfigBuilder, FlatDoc, key_value_overrides, to_float, to_int, trainer_batch
from .finetune import deepspeed_by_name, targets, trainer_optimizer, transformers_attention
from .hf_keys import LEGACY, TRAINING_ARGUMENTS
from .liger import liger_defaults
from .models import named_model
from .result import Imported, Ledger
from .source import parse_yaml
from .yaml_keys import LLAMA_FACTORY

KIND = "llama-factory"
VERSION = "LLaMA-Factory v0.9.5"
# LLaMA-Factory's AttentionFunction (extras/constants.py: auto, disabled, sdpa, fa2, fa3) -> transformers' name
_FLASH_ATTN = {"fa2": "flash_attention_2", "sdpa": "sdpa", "fa3": "flash_attention_3"}
_OPTIM = {"adamw_torch": "adamw", "adamw_torch_fused": "adamw", "adamw_8bit": "adam8bit",
          "adamw_bnb_8bit": "adam8bit", "paged_adamw_8bit": "paged_adamw8bit", "paged_adamw_32bit": "paged_adamw",
          "adafactor": "adafactor", "sgd": "sgd"}


def looks_like(text: str, name: str = "") -> bool:
    return bool(re.search(r"^finetuning_type:", text, re.M)) or bool(re.search(r"^(stage|cutoff_len|template):",
                                                                               text, re.M)) and \
        bool(re.search(r"^model_name_or_path:", text, re.M))


def read(text: str, gpus: int | None = None, overrides: tuple[str, ...] = ()) -> Imported:
    ledger = Ledger()
    doc = FlatDoc(parse_yaml(text, "LLaMA-Factory config"), "LLaMA-Factory config")
    key_value_overrides(overrides, doc, ledger, VERSION)
    build = ConfigBuilder(ledger)
    build.put("training.framework", "hf")
    name = doc.get("model_name_or_path")
    build.named_model = named_model(name, "model_name_or_path", "a Hugging Face id (org/name)")
    ledger.mapped("model_name_or_path", name, f"model = \"{build.named_model}\"")
    finetuning = doc.get("finetuning_type", "lora")
    if finetuning == "lora":
        _lora(doc, build, ledger)
    elif finetuning != "full":
        ledger.not_modelled("finetuning_type", finetuning, "estimated as a full fine-tune")
    seq = to_int("cutoff_len", doc.get("cutoff_len", 2048), 1)
    build.set("training.seq_len", seq, "cutoff_len" if doc.given("cutoff_len") else "(no cutoff_len)", seq)
    trainer_batch(doc, build, gpus, "per_device_train_batch_size", 8)
    if doc.get("bf16"):
        ledger.mapped("bf16", True, "bf16 weights (the model is loaded in bf16)")
    elif doc.get("fp16"):
        build.set("training.param_dtype", "fp16", "fp16", True)
    else:
        build.set("training.param_dtype", "fp32", "(no bf16 / fp16)", "", why="fp32 training")
        build.put("training.compute_dtype", "fp32")
    if not doc.get("disable_gradient_checkpointing", False):
        build.set("training.recompute", "full", "disable_gradient_checkpointing" if doc.given(
            "disable_gradient_checkpointing") else "(no disable_gradient_checkpointing)", False,
            why="LLaMA-Factory checkpoints every layer unless told not to")
    ds = doc.get("deepspeed")
    if ds:
        deepspeed_by_name(ds, "deepspeed", build, ledger)
    trainer_optimizer(build, ledger, "optim", doc.get("optim", "adamw_torch"), _OPTIM, given=False)
    if doc.get("enable_liger_kernel"):
        # LLaMA-Factory model/model_utils/liger_kernel.py apply_liger_kernel: the model type's defaults, with
        # fused_linear_cross_entropy=False where the stage needs logits (require_logits: stage not pt or sft)
        liger_defaults(build, "enable_liger_kernel", True, flce=doc.get("stage", "sft") in ("sft", "pt"))
    # LLaMA-Factory model/model_utils/attention.py configure_attn_implementation: disabled = eager, fa2 and sdpa
    # name transformers' attn_implementation, auto leaves transformers' default (sdpa)
    flash = doc.get("flash_attn", "auto")
    if not isinstance(flash, str) or flash not in ("auto", "disabled", *_FLASH_ATTN):
        raise ConfigError("flash_attn", flash, "auto, disabled, " + ", ".join(_FLASH_ATTN))
    if flash == "disabled":
        build.set("training.attention", "eager", "flash_attn", "disabled")
    elif flash in _FLASH_ATTN:
        transformers_attention(build, ledger, "flash_attn", _FLASH_ATTN[flash])
    _stage(doc, build, ledger, finetuning, seq)
    for key, value in doc.rest():
        top = key.split(".")[0]
        if top in LLAMA_FACTORY or top in TRAINING_ARGUMENTS or top in LEGACY:
            ledger.ignore(key, value, "data, paths, logging, schedule: no effect on memory")
        else:
            ledger.strange(key, value, f"not an argument of {VERSION}")
    return ledger.result(KIND, {"model": build.named_model or build.model, **build.config})


def _lora(doc: FlatDoc, build: ConfigBuilder, ledger: Ledger) -> None:
    rank = to_int("lora_rank", doc.get("lora_rank", 8), 1)
    chosen = targets(doc.get("lora_target", "all"))
    if chosen is None:
        raise ConfigError("lora_target", doc.flat.get("lora_target"), "all, or q_proj, k_proj, v_proj, o_proj, "
                          "gate_proj, up_proj, down_proj")
    bits = doc.get("quantization_bit")
    spec = {"method": "qlora" if bits == 4 else "dora" if doc.get("use_dora") else "lora", "rank": rank,
            "alpha": to_float("lora_alpha", doc.get("lora_alpha") or 2 * rank), "target_modules": chosen,
            "dropout": to_float("lora_dropout", doc.get("lora_dropout", 0.0))}
    if bits == 8:
        spec["base_dtype"] = "int8"
    elif bits not in (None, 4):
        raise ConfigError("quantization_bit", bits, "4 or 8 (bitsandbytes)")
    if bits is not None and doc.get("quantization_method", "bnb") != "bnb":
        ledger.not_modelled("quantization_method", doc.flat["quantization_method"], "estimated as bitsandbytes")
    if bits == 4 and doc.get("quantization_type", "nf4") != "nf4":
        ledger.not_modelled("quantization_type", doc.flat["quantization_type"], "estimated as NF4")
    if doc.get("additional_target"):
        spec["trainable_embeddings"] = True
    build.set("training.adapter", spec, "finetuning_type", "lora", why=f"{spec['method']} rank {rank}")


def _stage(doc: FlatDoc, build: ConfigBuilder, ledger: Ledger, finetuning: str, seq: int) -> None:
    stage = doc.get("stage", "sft")
    if stage in ("sft", "pt"):
        ledger.mapped("stage", stage, "supervised training")
        return
    if stage != "dpo":
        ledger.not_modelled("stage", stage, "estimated as supervised fine-tuning")
        return
    loss = doc.get("pref_loss", "sigmoid")
    if loss in ("orpo", "simpo"):  # no reference: chosen and rejected run together, twice the batch
        build.set("training.micro_batch_size", 2 * build.get("training.micro_batch_size", 1), "pref_loss", loss,
                  why="chosen and rejected sequences concatenated, no reference model")
        return
    # chosen and rejected each hold prompt + response within cutoff_len
    rl = {"algorithm": "dpo", "max_prompt_len": seq // 2, "max_response_len": seq - seq // 2,
          "reference_model": True}
    build.set("training.rl", rl, "stage", stage, why=f"pref_loss {loss}")
    if finetuning == "lora" and not doc.given("ref_model"):
        ledger.not_modelled("finetuning_type", "lora", "a LoRA DPO run scores the reference with its own base "
                            "weights (adapters off); the estimate counts a separate frozen copy")
