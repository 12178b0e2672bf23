"""A transformers causal LM built on the meta device for the harnesses that wrap one (FSDP1's, the HF Trainer's
FSDP2): parameters on meta, buffers real, given storage later inside FakeTensorMode (`core.meta.materialize`),
and peft's LoRA on its seven projections."""

from __future__ import annotations

from .models import MODELS

ALL_SEVEN = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def meta_causal_lm(model: str, attention: str, layers: int | None, dtype):
    """MODELS[model] in `dtype` on meta (the first `layers` decoder layers when given), its tied head tied: built
    on meta the head is a parameter of its own, and a real build ties it."""
    from accelerate import init_empty_weights
    from transformers import AutoModelForCausalLM

    config = MODELS[model].hf_config(attention)
    if layers:
        config.num_hidden_layers = layers
    with init_empty_weights(include_buffers=False):
        built = AutoModelForCausalLM.from_config(config, dtype=dtype)
    if config.tie_word_embeddings:
        built.lm_head.weight = built.get_input_embeddings().weight
    return built


def lora_on_all_seven(model, rank: int):
    """peft's LoRA, rank r and alpha 2r, on q, k, v, o, gate, up and down."""
    from peft import LoraConfig, get_peft_model

    return get_peft_model(model, LoraConfig(r=rank, lora_alpha=2 * rank, target_modules=ALL_SEVEN,
                                            task_type="CAUSAL_LM"), low_cpu_mem_usage=True)
