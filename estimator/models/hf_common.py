"""What every family of Hugging Face config.json shares: the keys every config has, and the record
of one family (its reader, its keys, its defaults).
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple

# Fields of every PretrainedConfig, and generation/runtime settings that do not change the
# stored parameters. They are understood (not reported as ignored).
_COMMON_KEYS = frozenset({
    "_name_or_path", "architectures", "model_type", "transformers_version", "torch_dtype", "dtype",
    "bos_token_id", "eos_token_id", "pad_token_id", "sep_token_id", "decoder_start_token_id",
    "use_cache", "initializer_range", "initializer_factor", "hidden_act", "activation_function",
    "rms_norm_eps", "layer_norm_eps", "layer_norm_epsilon", "norm_epsilon", "rope_theta",
    "rope_scaling", "rope_parameters", "attention_dropout", "hidden_dropout", "dropout",
    "resid_pdrop", "embd_pdrop", "attn_pdrop", "max_position_embeddings", "tie_word_embeddings",
    "pretraining_tp", "quantization_config", "auto_map", "is_decoder", "return_dict",
    "output_hidden_states", "output_attentions", "torchscript", "use_bfloat16", "id2label",
    "label2id", "task_specific_params", "problem_type", "tokenizer_class", "prefix",
    "chunk_size_feed_forward", "is_encoder_decoder", "add_cross_attention", "tie_encoder_decoder",
    "cross_attention_hidden_size", "finetuning_task", "max_length", "min_length", "do_sample",
    "early_stopping", "num_beams", "temperature", "top_k", "top_p", "repetition_penalty",
    "length_penalty", "no_repeat_ngram_size", "bad_words_ids", "num_return_sequences",
    "output_scores", "return_dict_in_generate", "forced_bos_token_id", "forced_eos_token_id",
    "remove_invalid_values", "typical_p", "diversity_penalty", "num_beam_groups",
    "encoder_no_repeat_ngram_size", "exponential_decay_length_penalty", "suppress_tokens",
    "begin_suppress_tokens", "pruned_heads", "tf_legacy_loss", "use_return_dict",
    "attn_implementation", "_attn_implementation", "_attn_implementation_autoset",
    "num_labels", "model_name", "layer_types", "use_sliding_window", "sliding_window",
    "max_window_layers", "original_max_position_embeddings", "partial_rotary_factor",
    "head_dim", "num_key_value_heads", "vocab_size", "hidden_size", "intermediate_size",
    "num_hidden_layers", "num_attention_heads", "attention_bias", "mlp_bias", "unsloth_fixed",
    "use_flash_attn", "_from_model_config", "output_router_logits", "router_aux_loss_coef",
    "router_jitter_noise", "router_z_loss_coef", "norm_topk_prob", "bias", "keys_to_ignore_at_inference",
})

class Family(NamedTuple):
    """Everything one transformers ``model_type`` needs, in one record: adding a family adds one
    entry to `FAMILIES` (and, when no existing reader fits, its reader function)."""

    build: Callable[[Any], tuple[dict[str, Any], list[str]]]  # reads the canonical fields (from a hf_families._Reader)
    defaults: dict[str, Any]  # its transformers configuration class's defaults
    keys: frozenset[str] = frozenset()  # family-specific keys it understands beyond _COMMON_KEYS


# LlamaConfig's defaults, shared by the families whose configuration classes copy them
_LLAMA = dict(vocab_size=32000, hidden_size=4096, intermediate_size=11008, num_hidden_layers=32,
              num_attention_heads=32, num_key_value_heads=None, head_dim=None,
              max_position_embeddings=2048, tie_word_embeddings=False, attention_bias=False,
              mlp_bias=False)
