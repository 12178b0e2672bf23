"""``plan --emit torchtune``: a layout written as a torchtune v0.6.1 recipe config (the keys the
``full_finetune_distributed`` / ``lora_finetune_distributed`` recipes read, and the `torchtune`
importer reads back), for models that are one of torchtune's builders. The dataset, tokenizer path and
checkpointer are the user's own: the YAML holds what decides memory and speed, to merge into the recipe."""

from __future__ import annotations

import re

from ..spec.errors import ConfigError
from .emit_check import verified
from .torchtune import BUILDERS
from .torchtune_models import BUILDERS as BUILDER_CONFIGS

# our optimizers -> torchtune's optimizer components (the `torchtune` importer's _OPTIMIZERS backwards)
_OPTIMIZERS = {"adamw": "torch.optim.AdamW", "adam8bit": "torchao.optim.AdamW8bit", "sgd": "torch.optim.SGD",
               "paged_adamw8bit": "bitsandbytes.optim.PagedAdamW8bit", "paged_adamw": "bitsandbytes.optim.PagedAdamW"}
_LOSSES = {"standard": "torch.nn.CrossEntropyLoss", "chunked": "torchtune.modules.loss.CEWithChunkedOutputLoss"}
_ATTENTION = {"q": "q_proj", "k": "k_proj", "v": "v_proj", "o": "output_proj"}


def emit_torchtune(config: dict) -> str:
    from ..models.loading import load_config
    cfg = load_config(config)
    tr, par = cfg.training, cfg.parallel
    if tr.framework != "torchtune":
        raise ConfigError("--emit", "torchtune", f"a configuration with framework 'torchtune' (this one is "
                          f"{tr.framework!r})")
    lines = [f"# written by llm-memory plan --emit torchtune (torchtune v0.6.1); on {par.gpus} GPU"
             f"{'s' if par.gpus > 1 else ''}:",
             f"#   tune run {'--nproc_per_node ' + str(par.gpus) + ' ' if par.gpus > 1 else ''}"
             f"{_recipe(tr, par)} --config THIS_FILE (with your dataset, tokenizer and checkpointer)",
             "model:", f"  _component_: {_builder(cfg)}"]
    lines += _adapter(tr.adapter)
    lines += ["tokenizer:", f"  max_seq_len: {tr.seq_len}", f"batch_size: {tr.micro_batch_size}"]
    steps = (tr.global_batch_size or tr.micro_batch_size * par.dp) // (tr.micro_batch_size * par.dp)
    if steps > 1:
        lines.append(f"gradient_accumulation_steps: {steps}")
    lines.append(f"dtype: {'fp32' if tr.param_dtype == 'fp32' else 'bf16'}")
    if par.tp > 1:
        lines.append(f"tensor_parallel_dim: {par.tp}")
    if par.zero_stage == 2:
        lines.append("fsdp_reshard_after_forward: False")
    if tr.offload_optimizer == "cpu" or tr.offload_parameters == "cpu":
        lines.append("fsdp_cpu_offload: True")
    if tr.recompute == "full":
        lines.append("enable_activation_checkpointing: True")
        if tr.recompute_every != 1:
            lines += ["ac_mode: selective", f"ac_option: {tr.recompute_every}"]
    lines += [f"enable_activation_offloading: {tr.offload_activations}", f"compile: {tr.compile}",
              f"optimizer_in_bwd: {tr.optimizer_in_backward}"]
    if tr.optimizer not in _OPTIMIZERS:
        raise ConfigError("training.optimizer", tr.optimizer, ", ".join(_OPTIMIZERS), "torchtune has no setting for "
                          "it")
    if tr.loss not in _LOSSES:
        raise ConfigError("training.loss", tr.loss, ", ".join(_LOSSES), "torchtune has no setting for it")
    lines += ["optimizer:", f"  _component_: {_OPTIMIZERS[tr.optimizer]}", "loss:",
              f"  _component_: {_LOSSES[tr.loss]}"]
    return verified("torchtune", "\n".join(lines) + "\n", config, gpus=par.gpus)


def _recipe(tr, par) -> str:
    kind = "lora_finetune" if tr.adapter is not None else "full_finetune"
    return f"{kind}_{'distributed' if par.gpus > 1 else 'single_device'}"


def _builder(cfg) -> str:
    """torchtune's builder for the model: the one whose name spells the preset's (llama3_1_8b for
    llama-3.1-8b), else the first with its shapes; a config.json model: the builder (torchtune_models.py)
    whose config.json it is, the one it names first; with an adapter, its lora_/qlora_ variant."""
    adapter = cfg.training.adapter
    prefix = "" if adapter is None else "qlora_" if adapter.method == "qlora" else "lora_"
    if isinstance(cfg.model, dict):
        shape = {k: v for k, v in cfg.model.items() if k != "_name_or_path"}
        names = sorted((b != cfg.model.get("_name_or_path"), b) for b, (_, c) in BUILDER_CONFIGS.items() if c == shape)
        if names:
            name = names[0][1]
            return f"torchtune.models.{BUILDER_CONFIGS[name][0]}.{prefix}{name}"
    preset = cfg.model if isinstance(cfg.model, str) else None
    names = [b for b, p in BUILDERS.items() if p == preset]
    if not names:
        raise ConfigError("model", preset or "{...}", "a model torchtune builds: " + ", ".join(sorted(set(
            BUILDERS.values()))) + ", or the config.json of one of its builders (torchtune_models.py)",
            "torchtune has no builder for it")
    spelled = re.sub(r"[^a-z0-9]", "", preset)
    name = next((b for b in names if b.replace("_", "").startswith(spelled)), names[0])
    module = re.sub(r"_\d+b(?:_[a-z]+)?$", "", name)
    return f"torchtune.models.{module}.{prefix}{name}"


def _adapter(adapter) -> list[str]:
    if adapter is None:
        return []
    targets = ["q", "k", "v", "o", "gate", "up", "down"] if adapter.all_linear else list(adapter.target_modules)
    attention = [_ATTENTION[t] for t in targets if t in _ATTENTION]
    if not attention:
        raise ConfigError("training.adapter.target_modules", targets, "at least one of q, k, v, o",
                          "torchtune's LoRA builders adapt attention projections")
    lines = [f"  lora_attn_modules: [{', '.join(attention)}]",
             f"  apply_lora_to_mlp: {all(t in targets for t in ('gate', 'up', 'down'))}",
             f"  lora_rank: {adapter.rank}", f"  lora_alpha: {adapter.alpha:g}", f"  lora_dropout: {adapter.dropout:g}"]
    if adapter.method == "dora":
        lines.append("  use_dora: True")
    return lines
