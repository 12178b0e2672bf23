"""torchtune: a recipe config YAML (``tune run <recipe> --config <file>``) and its ``key=value``
overrides, read into our JSON config.

Keys, defaults and meanings follow torchtune v0.6.1 (commit a6290a5b40758f13bca61c386bc8756a49ef417e):
the recipes ``full_finetune_*``, ``lora_finetune_*`` and ``dev/grpo_full_finetune_distributed``
read ``batch_size``, ``gradient_accumulation_steps``, ``dtype``, ``enable_activation_checkpointing``,
``enable_activation_offloading``, ``compile``, ``optimizer_in_bwd``, ``fsdp_cpu_offload`` and the
``model``, ``optimizer`` and ``loss`` components; the model builders' LoRA arguments have the
defaults of ``torchtune/models/*/_component_builders.py`` (rank 8, alpha 16, no MLP, no output).
One GPU unless ``--gpus`` says more (the distributed recipes shard with FSDP2 over all of them).
"""

from __future__ import annotations

import re

from ..spec.errors import ConfigError
from .build import ConfigBuilder, FlatDoc, key_value_overrides, to_int
from .result import Imported, Ledger
from .source import parse_yaml

KIND = "torchtune"
VERSION = "torchtune v0.6.1"

# model builder (after any lora_/qlora_ prefix) -> the bundled preset with the checkpoint's shapes
BUILDERS = {
    "llama3_8b": "llama-3.1-8b", "llama3_70b": "llama-3.1-70b", "llama3_1_8b": "llama-3.1-8b",
    "llama3_1_70b": "llama-3.1-70b", "llama3_1_405b": "llama-3.1-405b", "llama3_2_1b": "llama-3.2-1b",
    "llama3_2_3b": "llama-3.2-3b", "llama3_3_70b": "llama-3.1-70b", "qwen2_5_7b_base": "qwen2.5-7b",
    "qwen2_5_7b_instruct": "qwen2.5-7b", "qwen2_5_72b_instruct": "qwen2.5-72b", "qwen3_8b_base": "qwen3-8b",
    "qwen3_8b_instruct": "qwen3-8b", "qwen3_32b": "qwen3-32b", "mistral_7b": "mistral-7b", "phi4_14b": "phi-4",
}
# torchtune's LoRA module names -> ours
_ATTN = {"q_proj": "q", "k_proj": "k", "v_proj": "v", "output_proj": "o"}
# loss components -> our loss
_LOSSES = {"CEWithChunkedOutputLoss": "chunked", "LinearCrossEntropyLoss": "chunked", "CrossEntropyLoss": "standard"}
# optimizer components -> ours, by library: bitsandbytes' paged optimizers keep their large states in
# managed memory (the stock *_full_single_device configs of torchtune 0.6.1 use PagedAdamW8bit); our
# adam8bit is torchao's AdamW8bit (spec/optimizers.py step_scratch), which the torchtune docs name first
_OPTIMIZERS = {"torch.optim.AdamW": "adamw", "torch.optim.Adam": "adamw", "torch.optim.SGD": "sgd",
               "bitsandbytes.optim.PagedAdamW8bit": "paged_adamw8bit", "bitsandbytes.optim.PagedAdamW": "paged_adamw",
               "bitsandbytes.optim.AdamW8bit": "adam8bit", "bitsandbytes.optim.Adam8bit": "adam8bit",
               "torchao.optim.AdamW8bit": "adam8bit", "torchao.optim.Adam8bit": "adam8bit",
               "torchao.prototype.low_bit_optim.AdamW8bit": "adam8bit",
               "torchao.prototype.low_bit_optim.Adam8bit": "adam8bit"}
# bitsandbytes' unpaged 8-bit step updates its states in place: torchao's step scratch is counted for it
_IN_PLACE_8BIT = ("bitsandbytes.optim.AdamW8bit", "bitsandbytes.optim.Adam8bit")
# top-level keys that never change memory or speed
_NO_EFFECT = ("output_dir", "seed", "shuffle", "epochs", "max_steps_per_epoch", "clip_grad_norm", "log_every_n_steps",
              "log_peak_memory_stats", "log_level", "resume_from_checkpoint", "save_adapter_weights_only", "device",
              "low_cpu_ram", "name", "base_model_path", "num_steps", "save_every_n_epochs", "run_val_every_n_steps",
              "profiler", "metric_logger", "checkpointer", "ref_checkpointer", "lr_scheduler", "tokenizer",
              "dataset", "output", "cudnn_deterministic_mode", "lora_config", "temperature", "top_k",
              "ppo_epochs", "log_every_n_step")


def looks_like(text: str, name: str = "") -> bool:
    return bool(re.search(r"_component_:\s*torchtune\.", text))


def read(text: str, gpus: int | None = None, overrides: tuple[str, ...] = ()) -> Imported:
    ledger = Ledger()
    doc = FlatDoc(parse_yaml(text, "torchtune config"), "torchtune config")
    key_value_overrides(overrides, doc, ledger, VERSION)
    build = ConfigBuilder(ledger)
    build.put("training.framework", "torchtune")
    ledger.note(f"framework torchtune ({VERSION} recipes: the model, its gradients and optimizer states in "
                "one dtype, FSDP2 when distributed)")
    adapter = _model(doc, build, ledger)
    _training(doc, build, ledger, gpus, adapter)
    _account_rest(doc, ledger)
    return ledger.result(KIND, {"model": build.named_model or build.model, **build.config})


def _component(doc: FlatDoc, key: str) -> str:
    value = doc.get(f"{key}._component_")
    return value.rsplit(".", 1)[-1] if isinstance(value, str) else ""


def _model(doc: FlatDoc, build: ConfigBuilder, ledger: Ledger) -> dict | None:
    builder = _component(doc, "model")
    m = re.fullmatch(r"(q?lora_)?(\w+)", builder or "")
    if not m or m.group(2) not in BUILDERS:
        raise ConfigError("model._component_", doc.flat.get("model._component_"),
                          "a torchtune model builder of " + ", ".join(sorted(BUILDERS)), "not a model this estimator "
                          "knows")
    preset = BUILDERS[m.group(2)]
    build.named_model = preset
    ledger.mapped("model._component_", doc.flat["model._component_"], f"model = \"{preset}\"")
    lora = m.group(1) is not None
    if not lora:
        for key in [k for k in doc.flat if k.startswith("model.") and k != "model._component_"]:
            ledger.strange(key, doc.get(key), f"not an argument of the full model builder {builder}")
        return None
    return _adapter(doc, build, ledger, qlora=m.group(1) == "qlora_")


def _adapter(doc: FlatDoc, build: ConfigBuilder, ledger: Ledger, qlora: bool) -> dict:
    attn = doc.get("model.lora_attn_modules")
    if not isinstance(attn, list) or not attn or any(a not in _ATTN for a in attn):
        raise ConfigError("model.lora_attn_modules", attn, "a list of q_proj, k_proj, v_proj, output_proj")
    targets = [_ATTN[a] for a in attn]
    if doc.get("model.apply_lora_to_mlp", False):
        targets += ["gate", "up", "down"]
    if doc.get("model.apply_lora_to_output", False):
        ledger.not_modelled("model.apply_lora_to_output", True, "a LoRA on the output projection; not counted")
    quantize = doc.get("model.quantize_base", False) or qlora
    dora = doc.get("model.use_dora", False)
    adapter = {"method": "qlora" if quantize else "dora" if dora else "lora",
               "rank": to_int("model.lora_rank", doc.get("model.lora_rank", 8), 1),
               "alpha": float(doc.get("model.lora_alpha", 16)), "target_modules": targets,
               "dropout": float(doc.get("model.lora_dropout", 0.0))}
    if quantize and dora:
        ledger.not_modelled("model.use_dora", True, "DoRA's magnitudes on an NF4 base; estimated as QLoRA")
    build.set("training.adapter", adapter, "model.lora_*", f"rank {adapter['rank']} on {', '.join(attn)}"
              + (" + MLP" if "gate" in targets else ""))
    return adapter


def _training(doc: FlatDoc, build: ConfigBuilder, ledger: Ledger, gpus: int | None, adapter) -> None:
    seq = doc.get("tokenizer.max_seq_len")
    if seq is None:
        raise ConfigError("tokenizer.max_seq_len", None, "an integer: the sequence length every sample is cut or "
                          "packed to (give it as the override tokenizer.max_seq_len=N)",
                          "null: the longest sample of the dataset decides")
    build.set("training.seq_len", to_int("tokenizer.max_seq_len", seq, 1), "tokenizer.max_seq_len")
    if doc.get("dataset.packed"):
        ledger.mapped("dataset.packed", True, "every sample packed to tokenizer.max_seq_len")
    batch = to_int("batch_size", doc.get("batch_size", 1), 1)
    build.set("training.micro_batch_size", batch, "batch_size")
    world = gpus or 1
    if gpus is None:
        ledger.note("no --gpus: one GPU (a single-device recipe)")
    accumulate = to_int("gradient_accumulation_steps", doc.get("gradient_accumulation_steps", 1), 1)
    if accumulate > 1:
        build.set("training.global_batch_size", batch * accumulate * world, "gradient_accumulation_steps", accumulate,
                  why=f"batch_size {batch} x {accumulate} x {world} GPUs")
    dtype = doc.get("dtype", "bf16")
    if dtype not in ("bf16", "fp32"):
        raise ConfigError("dtype", dtype, "'bf16' or 'fp32'")
    if dtype == "fp32":
        build.set("training.param_dtype", "fp32", "dtype", dtype)
        build.put("training.compute_dtype", "fp32")
    else:
        ledger.mapped("dtype", dtype, "training.param_dtype = \"bf16\"")
    _parallel(doc, build, ledger, world)
    if doc.get("enable_activation_checkpointing", False):
        build.set("training.recompute", "full", "enable_activation_checkpointing", True)
        mode, option = doc.get("ac_mode"), doc.get("ac_option")
        if mode == "selective" and option not in (None, 1):
            build.set("training.recompute_every", to_int("ac_option", option, 1), "ac_option")
    if doc.get("enable_activation_offloading", False):
        build.set("training.offload_activations", True, "enable_activation_offloading", True)
    if doc.get("compile", False) is True:
        build.set("training.compile", True, "compile", True)
    if doc.get("optimizer_in_bwd", False):
        build.set("training.optimizer_in_backward", True, "optimizer_in_bwd", True)
    optimizer = doc.get("optimizer._component_")
    if optimizer not in _OPTIMIZERS:
        ledger.not_modelled("optimizer._component_", optimizer, "estimated as AdamW")
    elif _OPTIMIZERS[optimizer] != "adamw":
        build.set("training.optimizer", _OPTIMIZERS[optimizer], "optimizer._component_", optimizer)
        if optimizer in _IN_PLACE_8BIT:
            ledger.note(f"{optimizer} estimated as torchao's AdamW8bit: its states are the same, and the scratch "
                        "torchao's compiled step makes for the largest tensor (two 8-bit codes and their block "
                        "scales) is counted, which bitsandbytes, stepping in place, does not make")
    else:
        ledger.mapped("optimizer._component_", optimizer, "training.optimizer = \"adamw\"")
    for key in [k for k in doc.flat if k.startswith("optimizer.") and k != "optimizer._component_"]:
        ledger.ignore(key, doc.get(key), "an optimizer hyper-parameter or kernel choice")
    _loss(doc, build, ledger)


def _parallel(doc: FlatDoc, build: ConfigBuilder, ledger: Ledger, world: int) -> None:
    tp = to_int("tensor_parallel_dim", doc.get("tensor_parallel_dim", 1), 1)
    if world % tp:
        raise ConfigError("tensor_parallel_dim", tp, f"a divisor of the {world} GPUs")
    if tp > 1:
        build.set("parallel.tp", tp, "tensor_parallel_dim")
    build.put("parallel.dp", world // tp)
    if world // tp > 1:
        ledger.note(f"FSDP2 over {world // tp} GPUs (the distributed recipe's fully_shard, zero_stage 3)")
    if doc.get("fsdp_reshard_after_forward", True) is False:
        build.set("parallel.zero_stage", 2, "fsdp_reshard_after_forward", False)
    if doc.get("fsdp_cpu_offload", False):
        build.set("training.offload_optimizer", "cpu", "fsdp_cpu_offload", True,
                  why="FSDP2 CPUOffloadPolicy: parameters, gradients and optimizer states on the host")
        build.put("training.offload_parameters", "cpu")


def _loss(doc: FlatDoc, build: ConfigBuilder, ledger: Ledger) -> None:
    loss = _component(doc, "loss")
    if loss in _LOSSES:
        if _LOSSES[loss] != "standard":
            build.set("training.loss", _LOSSES[loss], "loss._component_", loss)
        else:
            ledger.mapped("loss._component_", loss, "training.loss = \"standard\"")
    elif loss == "GRPOSimpleLoss" or loss.startswith("GRPO"):
        _grpo(doc, build, ledger, loss)
    else:
        ledger.not_modelled("loss._component_", doc.flat.get("loss._component_"), "estimated as the standard loss")
    for key in [k for k in doc.flat if k.startswith("loss.") and k != "loss._component_"]:
        ledger.ignore(key, doc.get(key), "a loss coefficient")


def _grpo(doc: FlatDoc, build: ConfigBuilder, ledger: Ledger, loss: str) -> None:
    """dev/grpo_full_finetune_distributed: batch_size prompts per GPU, grpo_samples responses each,
    generated by the policy itself up to max_generated_tokens, scored against the reference model."""
    world = build.get("parallel.dp", 1) * build.get("parallel.tp", 1)
    prompts = to_int("batch_size", doc.get("batch_size", 1), 1) * build.get("parallel.dp", 1)
    samples = to_int("grpo_samples", doc.get("grpo_samples", 16), 1)
    response = to_int("max_generated_tokens", doc.get("max_generated_tokens", 512), 1)
    prompt = build.get("training.seq_len")
    rl = {"algorithm": "grpo", "rollout_batch_size": prompts, "samples_per_prompt": samples,
          "max_prompt_len": prompt, "max_response_len": response, "engine_memory_fraction": None,
          "reference_model": True, "offload_during_rollout": False}
    build.set("training.rl", rl, "loss._component_", loss, why=f"{prompts} prompts x {samples} samples on {world} GPUs")
    build.put("training.seq_len", prompt + response)
    fwd = doc.get("forward_batch_size")
    if fwd is not None:
        build.set("training.micro_batch_size", to_int("forward_batch_size", fwd, 1), "forward_batch_size")
    ledger.not_modelled("generation", "", "torchtune's GRPO generates with the policy itself; estimated as a "
                                          "colocated engine with its own weights and a KV cache for every sequence")


# recipe keys that change memory or speed a little and are not modelled
_NOT_MODELLED = ("custom_sharded_layers", "data_parallel_shard_dim", "data_parallel_replicate_dim",
                 "context_parallel_dim", "activation_offloading_use_streams", "clip_grad_norm_type")


def _account_rest(doc: FlatDoc, ledger: Ledger) -> None:
    for key, value in doc.rest():
        top = key.split(".")[0]
        if top in _NOT_MODELLED:
            ledger.not_modelled(key, value, f"a {VERSION} recipe setting the estimate does not model")
        elif top in _NO_EFFECT:
            ledger.ignore(key, value, "paths, logging, schedule or data: no effect on memory")
        elif key.endswith("._component_") or top in ("model", "optimizer", "loss"):
            ledger.not_modelled(key, value, f"a {VERSION} setting the estimate does not model")
        else:
            ledger.strange(key, value, f"not a key the {VERSION} recipes read")
