"""``plan --emit hf``: a Hugging Face Trainer layout written as one TrainingArguments YAML (TRL v1.9.0's
SFTConfig keys, transformers 5.23.0's): DDP, DeepSpeed as a loaded dict under ``deepspeed`` (the form
TrainingArguments accepts beside a file path), or FSDP under ``fsdp`` / ``fsdp_config``; a LoRA through
TRL's ``use_peft`` arguments. Read back by the `hf` importer (`emit_check.verified`)."""

from __future__ import annotations

import json

from ..spec.errors import ConfigError
from .liger import trainer_lines
from .emit_check import hub_id, verified

_OPTIM = {"adamw": "adamw_torch_fused", "adam8bit": "adamw_bnb_8bit", "adafactor": "adafactor", "sgd": "sgd",
          "lion": "lion_32bit"}
_HF_NAMES = {"q": "q_proj", "k": "k_proj", "v": "v_proj", "o": "o_proj", "gate": "gate_proj", "up": "up_proj",
             "down": "down_proj"}


def emit_hf(config: dict) -> str:
    """The arguments as TRL's SFTConfig: the file runs TRL's SFTTrainer, so it is checked against the configuration
    under that loop (training_loop trl_sft), its loss written as the loss_type that runs it."""
    from ..models.loading import load_config
    framework = load_config(config).training.framework
    if framework not in ("hf", "deepspeed", "hf_fsdp2", "fsdp1"):
        raise ConfigError("--emit", "hf", f"a configuration with framework 'hf', 'deepspeed', 'hf_fsdp2' or 'fsdp1' "
                          f"(this one is {framework!r})")
    config = sft_config(config)
    cfg = load_config(config)
    tr, par = cfg.training, cfg.parallel
    lines = [f"# written by llm-memory plan, emit hf: TrainingArguments / TRL SFTConfig keys, for {par.gpus} processes",
             "# (accelerate launch or torchrun of the script that parses this file)",
             f"model_name_or_path: {hub_id(cfg, 'hf')}", f"max_length: {tr.seq_len}",
             f"per_device_train_batch_size: {tr.micro_batch_size}"]
    per_step = tr.micro_batch_size * par.dp
    if tr.global_batch_size not in (None, per_step):
        if tr.global_batch_size % per_step:
            raise ConfigError("training.global_batch_size", tr.global_batch_size, f"a multiple of micro-batch x dp = "
                              f"{per_step}", "the Trainer accumulates whole micro-batches")
        lines.append(f"gradient_accumulation_steps: {tr.global_batch_size // per_step}")
    lines += [f"bf16: {_yaml(tr.compute_dtype == 'bf16')}", f"fp16: {_yaml(tr.compute_dtype == 'fp16')}"]
    lines.append(f"gradient_checkpointing: {_yaml(tr.recompute == 'full' and tr.framework not in ('fsdp1', 'hf_fsdp2'))}")
    if tr.optimizer not in _OPTIM:
        raise ConfigError("training.optimizer", tr.optimizer, ", ".join(_OPTIM), "hf has no setting for it")
    lines.append(f"optim: {_OPTIM[tr.optimizer]}")
    lines += trainer_lines(tr.liger_kernel, tr.loss)
    if not tr.liger_kernel:  # TRL's loss_type (memory/activations/trl_loss.py)
        lines.append(f"loss_type: {'chunked_nll' if tr.loss == 'chunked' else 'nll'}")
    if tr.attention == "eager" or tr.attn_implementation:
        lines.append(f"attn_implementation: {'eager' if tr.attention == 'eager' else tr.attn_implementation}")
    if tr.compile:
        lines.append("torch_compile: true")
    lines += _adapter(tr.adapter)
    lines += _deepspeed(tr, par) if tr.framework == "deepspeed" else _fsdp(tr, par) if tr.framework != "hf" else []
    return verified("hf", "\n".join(lines) + "\n", config, gpus=par.gpus)


def sft_config(config: dict) -> dict:
    """`config` as TRL's SFTTrainer runs it: training_loop trl_sft (a plain loop has no arguments file)."""
    training = dict(config.get("training", {}))
    if training.get("training_loop", "trainer") == "plain":
        raise ConfigError("--emit", "hf", "a configuration with training_loop 'trainer' or 'trl_sft'",
                          "a plain loop has no TrainingArguments")
    return {**config, "training": {**training, "training_loop": "trl_sft"}}


def _yaml(value: bool) -> str:
    return "true" if value else "false"


def _adapter(adapter) -> list[str]:
    if adapter is None:
        return []
    targets = "all-linear" if adapter.all_linear else [_HF_NAMES[t] for t in adapter.target_modules if t in _HF_NAMES]
    lines = ["use_peft: true", f"lora_r: {adapter.rank}", f"lora_alpha: {adapter.alpha:g}",
             f"lora_dropout: {adapter.dropout:g}", f"lora_target_modules: {json.dumps(targets)}"]
    if adapter.method == "qlora":
        lines.append("load_in_4bit: true")
    elif adapter.base_dtype == "int8":
        lines.append("load_in_8bit: true")
    if adapter.method == "dora":
        lines.append("use_dora: true")
    if adapter.trainable_embeddings:
        lines.append('lora_modules_to_save: ["embed_tokens", "lm_head"]')
    return lines


def _deepspeed(tr, par) -> list[str]:
    zero = {"stage": par.zero_stage or 0}
    for part, device in (("offload_optimizer", tr.offload_optimizer), ("offload_param", tr.offload_parameters)):
        if device != "none":
            zero[part] = {"device": device}
    for field in ("reduce_bucket_size", "contiguous_gradients", "stage3_prefetch_bucket_size",
                  "stage3_max_live_parameters"):
        if getattr(tr, field) is not None:
            zero[field] = getattr(tr, field)
    ds = {"zero_optimization": zero, "bf16": {"enabled": "auto"}, "fp16": {"enabled": "auto"},
          "train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": "auto"}
    return _block("deepspeed", ds)


def _fsdp(tr, par) -> list[str]:
    options = {"version": 2 if tr.framework == "hf_fsdp2" else 1}
    if par.zero_stage == 2:
        options["reshard_after_forward"] = False
    if tr.offload_parameters == "cpu":
        options["cpu_offload"] = True
    if tr.recompute == "full":
        options["activation_checkpointing"] = True
    return ["fsdp: true"] + _block("fsdp_config", options)


def _block(key: str, value: dict) -> list[str]:
    """A nested mapping as block YAML (TrainingArguments takes it as the loaded dict)."""
    import yaml
    return yaml.safe_dump({key: value}, sort_keys=False, default_flow_style=False).rstrip("\n").splitlines()
