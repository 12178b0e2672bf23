"""Llama 4's config.json (issue 28): the language model of ``Llama4ForConditionalGeneration`` (its
``text_config``, model_type ``llama4_text``), registered in `hf_families.FAMILIES` on import (hf_config
imports this module).

What transformers 5.23 (models/llama4/modeling_llama4.py) builds from it:

- MoE layers (``moe_layers``, else every ``interleave_moe_layer_step``-th from step - 1: Scout all 48,
  Maverick every other one) hold a sigmoid top-k router without bias, ``num_local_experts`` routed experts
  and one shared expert, all gated MLPs of width ``intermediate_size``; the other layers a dense gated MLP of
  width ``intermediate_size_mlp``.
- Attention without biases (``attention_bias``); the L2 query/key norm of the RoPE layers (``use_qk_norm``,
  Llama4TextL2Norm) has no weight, so it adds no parameter.
- ``no_rope_layers``: a 0 marks a NoPE layer, which attends to the whole sequence (layer_types
  "full_attention"); the RoPE layers are "chunked_attention" over ``attention_chunk_size`` tokens. The NoPE
  layers are every ``no_rope_layer_interval``-th layer (layer i when (i + 1) % interval == 0): the canonical
  ``sliding_window_pattern``.
"""

from __future__ import annotations

from typing import Any

from .hf_common import Family
from .hf_families import FAMILIES, _attention_common, _Reader
from ..spec.field import MAX_LAYERS


def _every_nth(flags: list[int], num_layers: int) -> int | None:
    """The interval N when exactly the layers i with (i + 1) % N == 0 are marked; 0 when none is; None when the
    marks follow no such rule."""
    marked = [i for i, flag in enumerate(flags[:num_layers]) if flag]
    if not marked:
        return 0
    period = marked[0] + 1
    return period if marked == list(range(period - 1, num_layers, period)) else None


def _global_interval(r: _Reader, num_layers: int) -> int:
    """Every N-th layer is a NoPE (global) layer: read from ``no_rope_layers`` (1 = RoPE, 0 = NoPE; at least one
    entry per layer), else from ``no_rope_layer_interval`` (Llama4TextConfig.__post_init__)."""
    flags = r.list_of("no_rope_layers", int, "a list of 0 (NoPE) and 1 (RoPE), one per layer")
    if not flags:  # None or [] (Llama4TextConfig: an empty list means the interval's default)
        return r.int("no_rope_layer_interval")
    if len(flags) < num_layers or set(flags) - {0, 1}:
        raise r._error("no_rope_layers", flags, f"at least {num_layers} entries of 0 and 1 (num_hidden_layers)")
    interval = _every_nth([1 - f for f in flags], num_layers)
    if interval is None:
        raise r._error("no_rope_layers", flags, "a NoPE layer (0) every N-th layer and RoPE (1) elsewhere",
                       "other placements are not modelled")
    return interval


def _moe_interval(r: _Reader, num_layers: int) -> int:
    """MoE every N-th layer from layer N - 1: ``moe_layers`` when given, else ``interleave_moe_layer_step``."""
    layers = r.list_of("moe_layers", int, "a list of layer indices")
    if layers is None:
        return r.int("interleave_moe_layer_step")
    flags = [0] * num_layers
    for i in layers:
        if 0 <= i < num_layers:
            flags[i] = 1
    interval = _every_nth(flags, num_layers)
    if interval is None or len(set(layers)) != len(layers) or any(i < 0 or i >= num_layers for i in layers):
        raise r._error("moe_layers", layers, "every N-th layer index from N - 1 (interleave_moe_layer_step N)",
                       "other placements are not modelled")
    return interval


def _llama4_text(r: _Reader) -> tuple[dict[str, Any], list[str]]:
    notes: list[str] = []
    fields = _attention_common(r)
    num_layers = r.int("num_hidden_layers", maximum=MAX_LAYERS)  # _moe_interval walks the layers
    width = r.int("intermediate_size")
    fields.update(num_layers=num_layers, vocab_size=r.int("vocab_size"), tie_embeddings=r.bool("tie_word_embeddings"))
    if r.bool("attention_bias"):
        fields["qkv_bias"] = True
        notes.append("attention_bias (the output projection's bias is not counted)")
    step = _moe_interval(r, num_layers)
    if step == 0:  # no MoE layer: every layer is the dense MLP
        fields["intermediate_size"] = r.int("intermediate_size_mlp")
    else:
        fields.update(num_experts=r.int("num_local_experts"), num_experts_per_token=r.int("num_experts_per_tok"),
                      moe_intermediate_size=width, num_shared_experts=1, shared_expert_intermediate_size=width,
                      first_dense_layers=step - 1, moe_layer_frequency=step,
                      intermediate_size=r.int("intermediate_size_mlp") if step > 1 else None)
    if step:  # transformers 5.23 Llama4TextMoe runs every token through every expert
        fields["moe_dense_experts"] = True
    fields["qk_l2_norm"] = r.bool("use_qk_norm")
    fields["eager_softmax_in_compute_dtype"] = True  # eager_attention_forward: "doesn't cast attn weights to fp32"
    chunk = r.int("attention_chunk_size", required=False)
    interval = _global_interval(r, num_layers)
    if chunk is not None and interval != 1:  # interval 1: every layer is NoPE, so none is chunked
        fields.update(attention_chunk_size=chunk, sliding_window_pattern=interval)
    return fields, notes


LLAMA4_FAMILIES = {
    "llama4_text": Family(  # Llama4TextConfig (transformers 5.23 configuration_llama4.py)
        build=_llama4_text,
        defaults=dict(vocab_size=202048, hidden_size=5120, intermediate_size=8192, intermediate_size_mlp=16384,
                      num_hidden_layers=48, num_attention_heads=40, num_key_value_heads=8, head_dim=128,
                      max_position_embeddings=4096 * 32, tie_word_embeddings=False, num_experts_per_tok=1,
                      num_local_experts=16, moe_layers=None, interleave_moe_layer_step=1, use_qk_norm=True,
                      no_rope_layers=None, no_rope_layer_interval=4, attention_chunk_size=8192,
                      attention_bias=False),
        keys=frozenset({'attention_chunk_size', 'attn_scale', 'attn_temperature_tuning', 'cache_implementation',
                        'floor_scale', 'for_llm_compressor', 'interleave_moe_layer_step', 'intermediate_size_mlp',
                        'moe_layers', 'no_rope_layer_interval', 'no_rope_layers', 'num_experts_per_tok',
                        'num_local_experts', 'use_qk_norm'})),
}
FAMILIES.update(LLAMA4_FAMILIES)
