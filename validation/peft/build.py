"""Build a transformers model with PEFT adapters the way a LoRA / QLoRA fine-tune sets it up,
without ever allocating the base weights for real.

The model is constructed with its parameters on the meta device (buffers such as RoPE's inverse
frequencies are computed for real: they are tiny and their values matter to a real run), peft's
`get_peft_model` wraps it there, and `materialize` then gives every parameter a CPU storage:
fake under FakeTensorMode, real otherwise, through the same code path.

QLoRA: transformers' ``load_in_4bit`` turns every nn.Linear of the decoder layers into bitsandbytes'
``Linear4bit`` and peft wraps the adapted ones with its ``lora.bnb.Linear4bit``. bitsandbytes'
``Params4bit`` cannot wrap a fake tensor, so the harness runs an emulation of both
(validation/peft/bnb.py: the storage, the ``MatMul4Bit`` autograd function and peft's wrapper,
from their source; checked against real bitsandbytes on a tiny CPU run in
tests/test_harness_peft.py). ``bnb_version`` picks the rule of the release: through 0.43.1
``MatMul4Bit`` keeps its input for backward, from 0.43.2 on it keeps nothing of the activations.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from ..core.meta import materialize
from ..hf.models import MODELS

# peft's target names for the contract's short names (transformers' Llama/Qwen/Mixtral modules)
TARGET_MODULES = {"q": "q_proj", "k": "k_proj", "v": "v_proj", "o": "o_proj",
                  "gate": "gate_proj", "up": "up_proj", "down": "down_proj"}
ALL_SEVEN = ("q", "k", "v", "o", "gate", "up", "down")
# one q, k, v linear (the estimator's Architecture.fused_qkv): q, k or v names it, peft wraps it once
# (transformers 5.23 modeling_gpt2.py GPT2Attention.c_attn, a Conv1D; modeling_falcon.py and modeling_gpt_neox.py
# query_key_value; modeling_phi3.py qkv_proj); the targets peft's own defaults give for gpt2, falcon and gpt_neox
# (peft 0.21 utils/constants.py TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING)
FUSED_QKV = {"gpt2": "c_attn", "falcon": "query_key_value", "gpt_neox": "query_key_value", "phi3": "qkv_proj"}


@dataclass(frozen=True)
class LoraRun:
    model: str  # a key of validation.models.MODELS (or TINY below)
    seq_len: int
    micro_batch_size: int = 1
    rank: int = 16
    alpha: int = 32
    targets: tuple[str, ...] | str = ("q", "v")  # contract short names, or "all-linear"
    dropout: float = 0.0
    recompute: str = "none"  # "none" or "full" (Trainer gradient_checkpointing=True)
    base: str = "bf16"  # frozen base weights: "bf16" (LoRA) or "nf4" (QLoRA)
    save: tuple[str, ...] = ()  # peft modules_to_save: "embed_tokens", "lm_head"
    dora: bool = False  # peft use_dora (Liu et al. 2024): a learned magnitude per output feature
    bnb_version: str = "0.49.2"  # QLoRA: the bitsandbytes release whose 4-bit layer is emulated (bnb.py)
    double_quant: bool = True  # QLoRA: bnb_4bit_use_double_quant
    prepare: bool = False  # peft prepare_model_for_kbit_training (QLoRA): the 16-bit parameters cast to fp32
    attention: str = "sdpa"  # transformers' attn_implementation: "sdpa" or "eager"
    attention_dropout: float = 0.0  # the model config's attention_dropout (eager_attention_forward's dropout)


def model_config(run: LoraRun):
    from .tiny import TINY

    spec = TINY.get(run.model) or MODELS[run.model]
    config = spec.hf_config(run.attention)
    config.attention_dropout = run.attention_dropout
    return config


def lora_config(run: LoraRun):
    from peft import LoraConfig

    targets = run.targets if run.targets == "all-linear" else target_modules(run)
    config = LoraConfig(r=run.rank, lora_alpha=run.alpha, lora_dropout=run.dropout,
                        target_modules=targets, modules_to_save=list(run.save) or None, use_dora=run.dora,
                        task_type="CAUSAL_LM")
    if run.base == "nf4":  # peft's lora.bnb.Linear4bit, emulated, for the emulated bitsandbytes layer
        from .bnb import Linear4bit, lora_layer_class
        config._register_custom_module({Linear4bit: lora_layer_class()})
    return config


def target_modules(run: LoraRun) -> list[str]:
    """peft's module names for the run's contract targets (q, k and v one fused module where the model has one)."""
    from .tiny import TINY

    spec = TINY.get(run.model) or MODELS[run.model]
    fused = FUSED_QKV.get(getattr(spec, "hf", {}).get("model_type"))
    names = [fused if fused and t in ("q", "k", "v") else TARGET_MODULES[t] for t in run.targets]
    return list(dict.fromkeys(names))


def meta_peft_model(run: LoraRun):
    """The PEFT-wrapped model, parameters on meta, buffers real."""
    from accelerate import init_empty_weights
    from peft import get_peft_model
    from transformers import AutoModelForCausalLM

    with init_empty_weights(include_buffers=False):
        base = AutoModelForCausalLM.from_config(model_config(run), dtype=torch.bfloat16)
    if base.config.tie_word_embeddings:  # built on meta the head is a parameter of its own: tie it as a real build does
        base.lm_head.weight = base.get_input_embeddings().weight
    if run.base == "nf4":  # load_in_4bit: the layers' linears become bitsandbytes' Linear4bit (emulated)
        from .bnb import replace_linears, saves_input
        replace_linears(base, saves_input(run.bnb_version), run.double_quant)
    # low_cpu_mem_usage: adapters are created on meta too. autocast_adapter_dtype stays at its
    # default (True): peft keeps the adapters of a bf16 base in fp32.
    return get_peft_model(base, lora_config(run), low_cpu_mem_usage=True)


def prepare_kbit(model: nn.Module) -> int:
    """What peft's `prepare_model_for_kbit_training` (peft 0.21 utils/other.py) does to the weights:
    every fp16/bf16 parameter that is not 4-bit (bitsandbytes' `Params4bit`: here bnb.py's packed codes) is cast to fp32 in place (`param.data = param.data.to(torch.float32)`):
    embeddings, norms, LM head, and the adapters (already fp32). Its other steps: every base
    parameter frozen (they are), and, with use_gradient_checkpointing (its default), the model's
    gradient_checkpointing_enable with the caller's kwargs (`enable_recompute` here when the run
    checkpoints; with use_reentrant=False it makes no input require grad). Returns how many were cast."""
    count = 0
    for p in model.parameters():  # the 4-bit weights (bnb.py's packed uint8 codes) are not 16-bit
        if p.dtype in (torch.float16, torch.bfloat16):
            p.data = p.data.to(torch.float32)
            count += 1
    return count


def enable_recompute(model) -> None:
    """What the Trainer does for gradient_checkpointing=True (transformers 5.x
    `Trainer._inner_training_loop` -> `activation_checkpointing_enable`): non-reentrant
    checkpoint per decoder layer, and input embeddings made to require grad."""
    if hasattr(model.get_base_model(), "activation_checkpointing_enable"):
        model.activation_checkpointing_enable()
    else:  # transformers before activation_checkpointing_enable (5.17 on the GPU machine)
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})


def trainable_parameters(model: nn.Module) -> list[nn.Parameter]:
    return [p for p in model.parameters() if p.requires_grad]


def build(model, run: LoraRun, device: str = "cpu"):
    """Storage for the meta model of `meta_peft_model` (built outside FakeTensorMode: modules
    moved between devices under it cannot swap their fake parameters) and the optimizer, as a
    Trainer run sets them up. Under FakeTensorMode to measure, without it for a real CPU run."""
    materialize(model, device)
    if device != "cpu":
        model.to(device)  # the buffers (RoPE's inverse frequencies) were built on the CPU
    if run.base == "nf4":
        from .bnb import quantize
        quantize(model)
    if run.prepare:
        prepare_kbit(model)
    model.train()
    if run.recompute == "full":
        enable_recompute(model)
    # transformers 5.x TrainingArguments.optim defaults to "adamw_torch_fused" for torch >= 2.8;
    # the Trainer builds it over the parameters that require grad only.
    opt = torch.optim.AdamW(trainable_parameters(model), lr=2e-4, weight_decay=0.0, fused=True)
    return model, opt
