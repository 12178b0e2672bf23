"""``plan --emit axolotl`` / ``llama-factory``: a fine-tuning layout written as the project's training
YAML (axolotl v0.18.0's schema, LLaMA-Factory v0.9.5's arguments: the keys their importers read back),
under the Hugging Face Trainer: DDP, or DeepSpeed named by one of the project's bundled config files
(its stage and offload are in the name), or FSDP2 for axolotl. Datasets, templates and paths are the
user's own: the YAML holds what decides memory and speed."""

from __future__ import annotations

from ..spec.errors import ConfigError
from .emit_check import hub_id, verified
from .liger import axolotl_lines

_AXOLOTL_OPTIM = {"adamw": "adamw_torch_fused", "adam8bit": "adamw_bnb_8bit", "adafactor": "adafactor", "sgd": "sgd"}
_FACTORY_OPTIM = {"adamw": "adamw_torch", "adam8bit": "adamw_bnb_8bit", "adafactor": "adafactor", "sgd": "sgd"}
_HF_NAMES = {"q": "q_proj", "k": "k_proj", "v": "v_proj", "o": "o_proj", "gate": "gate_proj", "up": "up_proj",
             "down": "down_proj"}


def emit_axolotl(config: dict) -> str:
    from ..models.loading import load_config
    cfg = load_config(config)
    tr, par = cfg.training, cfg.parallel
    lines = [f"# written by llm-memory plan --emit axolotl (axolotl v0.18.0); on {par.gpus} GPUs: "
             "axolotl train THIS_FILE (add datasets, output_dir)", f"base_model: {hub_id(cfg, 'axolotl')}",
             f"sequence_len: {tr.seq_len}", f"micro_batch_size: {tr.micro_batch_size}"]
    lines += _accumulation(tr, par)
    lines += _precision(tr, "axolotl")
    if tr.recompute == "full" and tr.framework != "hf_fsdp2":
        lines.append("gradient_checkpointing: true")
    lines.append(f"optimizer: {_name(_AXOLOTL_OPTIM, tr.optimizer, 'axolotl')}")
    lines += axolotl_lines(tr.liger_kernel, tr.loss)
    if tr.attention == "eager":
        lines.append("attn_implementation: eager")
    elif tr.attn_implementation:  # axolotl's switches for transformers' attn_implementation
        lines.append("flash_attention: true" if tr.attn_implementation == "flash_attention_2" else "sdp_attention: true")
    if tr.compile:
        lines.append("torch_compile: true")
    lines += _axolotl_adapter(tr.adapter)
    lines += _axolotl_distributed(tr, par)
    return verified("axolotl", "\n".join(lines) + "\n", config, gpus=par.gpus)


def emit_llama_factory(config: dict) -> str:
    from ..models.loading import load_config
    cfg = load_config(config)
    tr, par = cfg.training, cfg.parallel
    lines = [f"# written by llm-memory plan --emit llama-factory (LLaMA-Factory v0.9.5); on {par.gpus} GPUs: "
             "llamafactory-cli train THIS_FILE (add dataset, template, output_dir)",
             f"model_name_or_path: {hub_id(cfg, 'llama-factory')}"]
    lines += _factory_stage(tr)
    lines += [f"cutoff_len: {_factory_length(tr)}", f"per_device_train_batch_size: {tr.micro_batch_size}"]
    lines += _accumulation(tr, par)
    lines += _precision(tr, "llama-factory")
    if tr.recompute == "none":
        lines.append("disable_gradient_checkpointing: true")
    lines.append(f"optim: {_name(_FACTORY_OPTIM, tr.optimizer, 'llama-factory')}")
    lines += _factory_liger(tr)
    if tr.attention == "eager":
        lines.append("flash_attn: disabled")
    elif tr.attn_implementation:
        lines.append(f"flash_attn: {'fa2' if tr.attn_implementation == 'flash_attention_2' else 'sdpa'}")
    if tr.framework == "deepspeed":
        lines.append(f"deepspeed: examples/deepspeed/ds_z{par.zero_stage or 0}{_offload(tr, par)}_config.json")
    return verified("llama-factory", "\n".join(lines) + "\n", config, gpus=par.gpus)


def _factory_liger(tr) -> list[str]:
    """enable_liger_kernel: Liger's defaults, its fused linear cross-entropy only in the pt and sft stages
    (LLaMA-Factory's require_logits)."""
    flce = tr.rl is None  # _factory_stage writes sft, or dpo for a preference run
    wanted = "chunked" if tr.liger_kernel and flce else "standard"
    if tr.loss != wanted:
        raise ConfigError("training.loss", tr.loss, f"{wanted!r} (with liger_kernel {_yaml_bool(tr.liger_kernel)})",
                          "LLaMA-Factory's only other loss is Liger's, through enable_liger_kernel")
    return ["enable_liger_kernel: true"] if tr.liger_kernel else []


def _yaml_bool(value: bool) -> str:
    return "true" if value else "false"


# --- shared ----------------------------------------------------------------------------------------

def _name(table: dict, optimizer: str, kind: str) -> str:
    if optimizer not in table:
        raise ConfigError("training.optimizer", optimizer, ", ".join(table), f"{kind} has no setting for it")
    return table[optimizer]


def _accumulation(tr, par) -> list[str]:
    per_step = tr.micro_batch_size * par.dp
    if tr.global_batch_size is None or tr.global_batch_size == per_step:
        return []
    if tr.global_batch_size % per_step:
        raise ConfigError("training.global_batch_size", tr.global_batch_size, f"a multiple of micro-batch x dp = "
                          f"{per_step}", "the Trainer accumulates whole micro-batches")
    return [f"gradient_accumulation_steps: {tr.global_batch_size // per_step}"]


def _precision(tr, kind: str) -> list[str]:
    if tr.param_dtype == "bf16":
        return ["bf16: true"]
    if tr.param_dtype == "fp16":
        return ["fp16: true"]
    if tr.param_dtype == "fp32":
        return ["bf16: false"] if kind == "axolotl" else []
    raise ConfigError("training.param_dtype", tr.param_dtype, "'bf16', 'fp16' or 'fp32'", f"{kind} has no setting "
                      "for it")


def _targets(adapter) -> list[str] | None:
    return None if adapter.all_linear else [_HF_NAMES[t] for t in adapter.target_modules if t in _HF_NAMES]


def _offload(tr, par) -> str:
    return "_offload" if tr.offload_optimizer == "cpu" else ""


# --- axolotl -------------------------------------------------------------------------------------

def _axolotl_adapter(adapter) -> list[str]:
    if adapter is None:
        return []
    qlora = adapter.method == "qlora"
    lines = [f"adapter: {'qlora' if qlora else 'lora'}", f"lora_r: {adapter.rank}", f"lora_alpha: {adapter.alpha:g}",
             f"lora_dropout: {adapter.dropout:g}"]
    lines += ["load_in_4bit: true"] if qlora else ["load_in_8bit: true"] if adapter.base_dtype == "int8" else []
    if adapter.method == "dora":
        lines.append("peft_use_dora: true")
    names = _targets(adapter)
    lines += ["lora_target_linear: true"] if names is None else ["lora_target_modules:"] + [f"  - {n}" for n in names]
    if adapter.trainable_embeddings:
        lines += ["lora_modules_to_save:", "  - embed_tokens", "  - lm_head"]
    return lines


def _axolotl_distributed(tr, par) -> list[str]:
    if tr.framework == "deepspeed":
        stage = par.zero_stage or 0
        return [f"deepspeed: deepspeed_configs/zero{stage}{'_bf16' if stage == 3 else ''}"
                f"{'_cpuoffload_all' if _offload(tr, par) else ''}.json"]
    if tr.framework == "hf_fsdp2":
        lines = ["fsdp_config:", "  fsdp_version: 2"]
        if par.zero_stage == 2:
            lines.append("  reshard_after_forward: false")
        if tr.offload_optimizer == "cpu":
            lines.append("  offload_params: true")
        if tr.recompute == "full":
            lines.append("  activation_checkpointing: true")
        return lines
    return []


# --- LLaMA-Factory -------------------------------------------------------------------------------

def _factory_stage(tr) -> list[str]:
    rl = tr.rl
    lines = []
    if rl is not None and rl.algorithm != "dpo":
        raise ConfigError("training.rl.algorithm", rl.algorithm, "'dpo' or none", "llama-factory has no setting for "
                          "it (its PPO is not emitted)")
    lines.append(f"stage: {'dpo' if rl is not None else 'sft'}")
    adapter = tr.adapter
    if adapter is None:
        return lines + ["finetuning_type: full"]
    lines += ["finetuning_type: lora", f"lora_rank: {adapter.rank}", f"lora_alpha: {adapter.alpha:g}",
              f"lora_dropout: {adapter.dropout:g}"]
    names = _targets(adapter)
    lines.append(f"lora_target: {'all' if names is None else ','.join(names)}")
    if adapter.method == "dora":
        lines.append("use_dora: true")
    if adapter.method == "qlora":
        lines.append("quantization_bit: 4")
    elif adapter.base_dtype == "int8":
        lines.append("quantization_bit: 8")
    if adapter.trainable_embeddings:
        lines.append("additional_target: embed_tokens,lm_head")
    return lines


def _factory_length(tr) -> int:
    """cutoff_len: the sequence; under DPO chosen and rejected each hold prompt + response within it."""
    return tr.rl.sequence_len if tr.rl is not None else tr.seq_len
