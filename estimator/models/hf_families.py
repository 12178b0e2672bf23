"""One mapping per model family from its config.json to the canonical architecture (Llama-like,
Qwen MoE, Mixtral, DeepSeek, gpt-oss, GPT-2, GPT-NeoX, StarCoder2, Falcon, ...).
"""

from __future__ import annotations

import math
from typing import Any

from ..spec.errors import ConfigError
from .hf_common import _LLAMA, Family


class _Reader:
    """A config dict over its family's defaults, read only through typed getters: every value the
    mapping uses is checked on the way in, so a hostile file ends in a `ConfigError` that names the
    field, never in a TypeError or ValueError further down. An explicit null counts as absent."""

    def __init__(self, config: dict, model_type: str, prefix: str = "model."):
        self.config = config
        self.model_type = model_type
        self.defaults = FAMILIES[model_type].defaults
        self.prefix = prefix  # "model.text_config." for a multimodal file's language model

    def _find(self, keys: tuple[str, ...]) -> tuple[str, Any]:
        """(key, value) of the first spelling the file has (``n_embd``, then ``hidden_size``), else
        of the first the family's defaults have; (first key, None) when neither has one."""
        for source in (self.config, self.defaults):
            for key in keys:
                if source.get(key) is not None:
                    return key, source[key]
        return keys[0], None

    def _error(self, key: str, value: Any, allowed: str, reason: str = "") -> ConfigError:
        return ConfigError(self.prefix + key, value, allowed, reason)

    def int(self, key: str, *aliases: str, required: bool = True, minimum: int = 1,
            maximum: int | None = None) -> int | None:
        """An integer >= `minimum` (an integral float such as 4096.0 is read as the integer); `maximum` where the
        reader walks that many items before the architecture's own bounds are checked."""
        key, value = self._find((key, *aliases))
        allowed = "a positive integer" if minimum == 1 else f"an integer >= {minimum}"
        if maximum is not None:
            allowed = f"an integer from {minimum:,} to {maximum:,}"
        if value is None:
            if required:
                raise self._error(key, None, allowed, f"{self.model_type} config has no {key}")
            return None
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        if (isinstance(value, bool) or not isinstance(value, int) or value < minimum
                or (maximum is not None and value > maximum)):
            raise self._error(key, value, allowed)
        return value

    def bool(self, key: str, default: bool = False) -> bool:
        _, value = self._find((key,))
        value = default if value is None else value
        if not isinstance(value, bool):
            raise self._error(key, value, "true or false")
        return value

    def number(self, key: str, default: float | None = None) -> float | None:
        """A positive finite number; an explicit null is none (`default` only when the key is absent:
        Gemma-2 switches a soft-cap off with null)."""
        value = self.config[key] if key in self.config else default
        if value is None:
            return None
        allowed = "a positive finite number or null"
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise self._error(key, value, allowed)
        try:
            value = float(value)
        except OverflowError:  # an integer beyond the float range
            raise self._error(key, value, allowed) from None
        if not math.isfinite(value) or value <= 0:
            raise self._error(key, value, allowed)
        return value

    def text(self, key: str) -> str | None:
        _, value = self._find((key,))
        if value is not None and not isinstance(value, str):
            raise self._error(key, value, "a string")
        return value

    def list_of(self, key: str, kind: type, allowed: str) -> list | None:
        """A list whose items are all of `kind` (bools are not integers here)."""
        value = self.config.get(key)
        if value is None:
            return None
        if not isinstance(value, list) or not all(isinstance(v, kind) and not isinstance(v, bool) for v in value):
            raise self._error(key, value, allowed)
        return value


# --- sliding-window layouts -------------------------------------------------------------------

def _pattern_from_layer_types(layer_types: list[str], num_layers: int) -> tuple[int | None, list[str]]:
    """``layer_types`` (transformers >= 4.53) as the canonical pattern: 0 when every layer slides,
    N when every N-th layer is global; None when no layer slides."""
    if not layer_types:
        return None, []
    sliding = [t == "sliding_attention" for t in layer_types]
    if not any(sliding):
        return None, []
    if all(sliding):
        return 0, []
    full = [i for i, s in enumerate(sliding) if not s]
    period = full[0] + 1
    if all(((i + 1) % period == 0) == (not s) for i, s in enumerate(sliding)):
        return period, []
    # Irregular: keep the same number of global layers, approximately placed.
    return max(1, round(len(layer_types) / len(full))), ["layer_types (irregular pattern, approximated)"]


def _sliding(r: _Reader, num_layers: int) -> tuple[int | None, int, list[str]]:
    """(sliding_window, sliding_window_pattern, notes) for the family."""
    mt = r.model_type
    if mt in ("qwen2", "qwen2_moe", "qwen3", "qwen3_moe") and not r.bool("use_sliding_window"):
        return None, 0, []
    if r.config.get("sliding_window") is False:  # some exporters write false for "no window"
        return None, 0, []
    window = r.int("sliding_window", required=False)
    if window is None:
        return None, 0, []
    if "layer_types" in r.config:
        types = r.list_of("layer_types", str, "a list of attention kinds ('sliding_attention', 'full_attention')")
        pattern, notes = _pattern_from_layer_types(types or [], num_layers)
        if pattern is None:
            return None, 0, notes
        return window, pattern, notes
    if mt in ("gemma2", "gpt_oss"):
        return window, 2, []  # alternating local and global layers
    if mt in ("gemma3", "gemma3_text"):
        return window, r.int("sliding_window_pattern"), []
    return window, 0, []


# --- builders ---------------------------------------------------------------------------------

def _attention_common(r: _Reader, hidden_key: str = "hidden_size", heads_key: str = "num_attention_heads"
                      ) -> dict[str, Any]:
    hidden = r.int(hidden_key)
    heads = r.int(heads_key)
    kv = r.int("num_key_value_heads", required=False) or heads
    head_dim = r.int("head_dim", required=False)
    return dict(hidden_size=hidden, num_attention_heads=heads, num_kv_heads=kv, head_dim=head_dim)


def _llama_like(r: _Reader) -> tuple[dict[str, Any], list[str]]:
    """Llama, Mistral, Qwen2/3, Phi-3, Granite, Gemma: pre-norm decoder, RMSNorm, SwiGLU/GeGLU."""
    mt = r.model_type
    notes: list[str] = []
    fields = _attention_common(r)
    fields.update(
        num_layers=r.int("num_hidden_layers"),
        intermediate_size=r.int("intermediate_size"),
        vocab_size=r.int("vocab_size"),
        tie_embeddings=r.bool("tie_word_embeddings"),
    )
    if mt not in ("qwen2", "qwen2_moe"):
        attention_bias = r.bool("attention_bias")
        mlp_bias = r.bool("mlp_bias")
        if attention_bias and mlp_bias:
            fields["linear_bias"] = True
        elif attention_bias:
            fields["qkv_bias"] = True
            notes.append("attention_bias (the output projection's bias is not counted)")
        elif mlp_bias:
            notes.append("mlp_bias (MLP biases without attention biases are not counted)")
    if mt in ("qwen2", "qwen2_moe"):
        fields["qkv_bias"] = r.bool("qkv_bias", True) if mt == "qwen2_moe" else True
    if mt in ("qwen3", "qwen3_moe", "gemma3", "gemma3_text"):
        fields["qk_norm"] = True
    if mt == "olmo2":
        fields.update(qk_norm=True, qk_norm_full_width=True)
    if mt in ("gemma2", "gemma3", "gemma3_text"):
        fields["norms_per_layer"] = 4  # input, post-attention, pre- and post-feedforward
    if mt in ("gemma", "gemma2", "gemma3", "gemma3_text"):
        fields["norm_unit_offset"] = True  # GemmaRMSNorm: x * (1 + w), computed in fp32
        # Gemma2Config defaults: attention scores capped at 50, final logits at 30
        for key, field, gemma2_default in (("attn_logit_softcapping", "attention_logit_softcapping", 50.0),
                                           ("final_logit_softcapping", "final_logit_softcapping", 30.0)):
            value = r.number(key, gemma2_default if mt == "gemma2" else None)
            if value is not None:
                fields[field] = value
    if mt == "phi3" and r.bool("lm_head_bias"):
        notes.append("lm_head_bias (not counted)")
    if mt == "phi3":  # modeling_phi3.py: one qkv_proj, sliced; apply_rotary_pos_emb ends in torch.cat
        fields["fused_qkv"] = True
    window, pattern, more = _sliding(r, fields["num_layers"])
    fields.update(sliding_window=window, sliding_window_pattern=pattern)
    return fields, notes + more


def _moe_pattern_qwen(r: _Reader, num_layers: int) -> dict[str, Any]:
    """Qwen2/3-MoE: layer i is sparse when i is not in mlp_only_layers and (i + 1) % step == 0.
    The sparse candidates are step - 1, 2 step - 1, ...; the canonical pattern (a dense prefix, then
    every step-th layer) holds when mlp_only_layers removes the first k of them and no other. Read
    from the list, not by walking the layers, so the cost does not grow with num_hidden_layers."""
    only = r.list_of("mlp_only_layers", int, "a list of layer indices") or []
    step = r.int("decoder_sparse_step")
    removed = sorted({i for i in only if 0 <= i < num_layers and (i + 1) % step == 0})
    if removed != [(k + 1) * step - 1 for k in range(len(removed))]:
        raise r._error("mlp_only_layers", only, "a leading run of layers (0, 1, ..., k-1)",
                       "this placement of dense layers cannot be represented")
    first = (len(removed) + 1) * step - 1
    if first >= num_layers:
        return dict(num_experts=0)
    return dict(first_dense_layers=first, moe_layer_frequency=step)


def _mixtral(r: _Reader) -> tuple[dict[str, Any], list[str]]:
    fields, notes = _llama_like(r)
    fields.update(num_experts=r.int("num_local_experts"), num_experts_per_token=r.int("num_experts_per_tok"),
                  moe_intermediate_size=fields.pop("intermediate_size"))
    return fields, notes


def _qwen_moe(r: _Reader) -> tuple[dict[str, Any], list[str]]:
    fields, notes = _llama_like(r)
    experts = r.int("num_experts", minimum=0)
    pattern = _moe_pattern_qwen(r, fields["num_layers"]) if experts else dict(num_experts=0)
    if pattern.get("num_experts") == 0:
        return fields, notes
    fields.update(pattern)
    fields.update(num_experts=experts, num_experts_per_token=r.int("num_experts_per_tok"),
                  moe_intermediate_size=r.int("moe_intermediate_size"))
    if r.model_type == "qwen2_moe":
        shared = r.int("shared_expert_intermediate_size", required=False, minimum=0)
        if shared:
            fields.update(num_shared_experts=1, shared_expert_intermediate_size=shared, shared_expert_gate=True)
    if fields.get("first_dense_layers", 0) == 0 and fields.get("moe_layer_frequency", 1) == 1:
        # every layer is MoE: intermediate_size is unused by the checkpoint
        fields["intermediate_size"] = None
    return fields, notes


def _deepseek(r: _Reader) -> tuple[dict[str, Any], list[str]]:
    notes: list[str] = []
    heads = r.int("num_attention_heads")
    fields: dict[str, Any] = dict(
        hidden_size=r.int("hidden_size"), num_layers=r.int("num_hidden_layers"), num_attention_heads=heads,
        num_kv_heads=heads,  # MLA: every head has its own key and value after up-projection
        vocab_size=r.int("vocab_size"), intermediate_size=r.int("intermediate_size"),
        tie_embeddings=r.bool("tie_word_embeddings"),
        kv_lora_rank=r.int("kv_lora_rank"),
        # an explicit null means no query compression (DeepSeek-V2-Lite), not "the default rank"
        q_lora_rank=None if ("q_lora_rank" in r.config and r.config["q_lora_rank"] is None)
        else r.int("q_lora_rank", required=False),
        qk_nope_head_dim=r.int("qk_nope_head_dim"), qk_rope_head_dim=r.int("qk_rope_head_dim"),
        v_head_dim=r.int("v_head_dim"),
    )
    experts = r.int("n_routed_experts", required=False, minimum=0)
    if experts:
        freq = r.int("moe_layer_freq")
        first = r.int("first_k_dense_replace", minimum=0)
        if freq > 1 and first % freq:
            # transformers: layer i is MoE when i >= first_k_dense_replace and i % moe_layer_freq == 0
            notes.append("moe_layer_freq (MoE layers placed approximately)")
        fields.update(num_experts=experts, num_experts_per_token=r.int("num_experts_per_tok"),
                      moe_intermediate_size=r.int("moe_intermediate_size"),
                      num_shared_experts=r.int("n_shared_experts", required=False, minimum=0) or 0,
                      first_dense_layers=first, moe_layer_frequency=freq,
                      # DeepSeek-V3's aux-loss-free balancing stores e_score_correction_bias per router
                      router_bias=r.text("topk_method") == "noaux_tc")
    fields["mtp_layers"] = r.int("num_nextn_predict_layers", required=False, minimum=0) or 0
    return fields, notes


def _gpt_oss(r: _Reader) -> tuple[dict[str, Any], list[str]]:
    fields, notes = _llama_like_no_bias(r)
    experts = r.int("num_local_experts")
    fields.update(
        num_experts=experts,
        num_experts_per_token=r.int("num_experts_per_tok", "experts_per_token"),
        moe_intermediate_size=fields.pop("intermediate_size"),
        # q, k, v, o biases; expert biases (gate_up_proj_bias, down_proj_bias); router bias
        linear_bias=r.bool("attention_bias", True),
        router_bias=True,
        attention_sinks=True,
    )
    return fields, notes


def _llama_like_no_bias(r: _Reader) -> tuple[dict[str, Any], list[str]]:
    fields = _attention_common(r)
    fields.update(num_layers=r.int("num_hidden_layers"), intermediate_size=r.int("intermediate_size"),
                  vocab_size=r.int("vocab_size"), tie_embeddings=r.bool("tie_word_embeddings"))
    window, pattern, notes = _sliding(r, fields["num_layers"])
    fields.update(sliding_window=window, sliding_window_pattern=pattern)
    return fields, notes


def _gpt2(r: _Reader) -> tuple[dict[str, Any], list[str]]:
    hidden = r.int("n_embd", "hidden_size")
    inner = r.int("n_inner", required=False) or 4 * hidden
    return dict(
        hidden_size=hidden, num_layers=r.int("n_layer", "num_hidden_layers"),
        num_attention_heads=r.int("n_head", "num_attention_heads"), vocab_size=r.int("vocab_size"),
        intermediate_size=inner, tie_embeddings=r.bool("tie_word_embeddings", True), gated_mlp=False,
        norm="layernorm", linear_bias=True, position_embedding="learned",
        max_position_embeddings=r.int("n_positions", "max_position_embeddings"),
        composite_gelu=(r.text("activation_function") or "gelu_new") == "gelu_new",  # GPT2Config's default
        # modeling_gpt2.py eager_attention_forward: softmax of the scores in their dtype, no fp32 upcast
        eager_softmax_in_compute_dtype=True,
        # GPT2Attention: one c_attn (Conv1D, h -> 3h) split into q, k, v views; peft's default target ['c_attn']
        fused_qkv=True,
    ), []


def _gpt_neox(r: _Reader) -> tuple[dict[str, Any], list[str]]:
    bias = r.bool("attention_bias", True)
    notes = [] if bias else ["attention_bias (MLP biases are still counted)"]
    return dict(
        hidden_size=r.int("hidden_size"), num_layers=r.int("num_hidden_layers"),
        num_attention_heads=r.int("num_attention_heads"), vocab_size=r.int("vocab_size"),
        intermediate_size=r.int("intermediate_size"), tie_embeddings=r.bool("tie_word_embeddings"),
        gated_mlp=False, norm="layernorm", linear_bias=True, fused_qkv=True,
        parallel_attention=r.bool("use_parallel_residual", True), composite_gelu=r.text("hidden_act") == "gelu_new",
        # GPTNeoXConfig: rope_parameters' partial_rotary_factor, from rotary_pct, 0.25 by default
        partial_rotary_factor=_partial_rotary(r, "rotary_pct", 0.25),
    ), notes


def _partial_rotary(r: _Reader, key: str, default: float) -> float:
    """The rotary share of a head: `key` (a legacy spelling), else rope_parameters' partial_rotary_factor (transformers
    5.x saves it there), else `default`; a number in (0, 1]."""
    rope = r.config.get("rope_parameters")
    value = r.number(key) if key in r.config else r.number("partial_rotary_factor") \
        if "partial_rotary_factor" in r.config else None
    if value is None and isinstance(rope, dict) and rope.get("partial_rotary_factor") is not None:
        value = _Reader(rope, r.model_type, r.prefix + "rope_parameters.").number("partial_rotary_factor")
    value = default if value is None else value
    if value > 1:
        raise r._error(key, value, "a positive number up to 1")
    return value


def _starcoder2(r: _Reader) -> tuple[dict[str, Any], list[str]]:
    fields = _attention_common(r)
    window, pattern, notes = _sliding(r, r.int("num_hidden_layers"))
    fields.update(
        num_layers=r.int("num_hidden_layers"), vocab_size=r.int("vocab_size"),
        intermediate_size=r.int("intermediate_size"), tie_embeddings=r.bool("tie_word_embeddings", True),
        gated_mlp=False, norm="layernorm", linear_bias=r.bool("use_bias", True),
        sliding_window=window, sliding_window_pattern=pattern, composite_gelu=r.text("hidden_act") == "gelu_new",
    )
    return fields, notes


def _falcon(r: _Reader) -> tuple[dict[str, Any], list[str]]:
    notes: list[str] = []
    hidden = r.int("hidden_size", "n_embed")
    heads = r.int("num_attention_heads", "n_head")
    new_arch = r.bool("new_decoder_architecture")
    if new_arch:
        kv = r.int("num_kv_heads", "n_head_kv", required=False) or heads
        norms = r.int("num_ln_in_parallel_attn", required=False) or 2
    else:
        kv = 1 if r.bool("multi_query", True) else heads
        norms = 1 if r.bool("parallel_attn", True) else 2
    return dict(
        hidden_size=hidden, num_layers=r.int("num_hidden_layers", "n_layer"), num_attention_heads=heads,
        num_kv_heads=kv, vocab_size=r.int("vocab_size"),
        intermediate_size=r.int("ffn_hidden_size", required=False) or 4 * hidden,
        tie_embeddings=r.bool("tie_word_embeddings", True), gated_mlp=False, norm="layernorm",
        linear_bias=r.bool("bias"), norms_per_layer=norms,
        parallel_attention=new_arch or r.bool("parallel_attn", True), composite_gelu=r.text("activation") == "gelu_new",
        # modeling_falcon.py FalconAttention eager path: F.softmax(..., dtype=hidden_states.dtype), one k and v head
        # broadcast in the matmuls (multi-query)
        # (the new architecture copies k and v out to every head first, lines 254-263, whatever its num_kv_heads)
        eager_softmax_in_compute_dtype=True, eager_kv_broadcast=kv == 1 and not new_arch,
        # FalconAttention: one query_key_value (peft's default target); _split_heads takes k and v by index lists
        # (copies) unless multi_query and new_decoder_architecture are both off (views of the output)
        fused_qkv=True, qkv_split_copies=new_arch or r.bool("multi_query", True), qkv_split_expands_kv=new_arch,
        # FalconModel.forward always materialises the 4-D mask (allow_is_causal_skip=False) and FalconAttention
        # hands it to SDPA, transformers' default attn_implementation (memory/activations/sdpa_math.py)
        sdpa_mask_always=True,
        # ALiBi in place of the rotary embedding (no parameters): one b x heads x s x s mask a step
        # (memory/activations/alibi.py)
        position_embedding="alibi" if r.bool("alibi") else "rope",
    ), notes


# --- the families ------------------------------------------------------------------------------

_DEEPSEEK_KEYS = frozenset({'aux_loss_alpha', 'ep_size', 'first_k_dense_replace', 'kv_lora_rank',
                            'moe_intermediate_size', 'moe_layer_freq', 'n_group', 'n_routed_experts',
                            'n_shared_experts', 'num_experts_per_tok', 'num_nextn_predict_layers',
                            'q_lora_rank', 'qk_nope_head_dim', 'qk_rope_head_dim', 'rope_interleave',
                            'routed_scaling_factor', 'scoring_func', 'seq_aux', 'topk_group', 'topk_method',
                            'v_head_dim'})

FAMILIES: dict[str, Family] = {
    "llama": Family(  # LlamaConfig
        build=_llama_like,
        defaults=_LLAMA),
    "mistral": Family(  # MistralConfig
        build=_llama_like,
        defaults=dict(vocab_size=32000, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                      num_attention_heads=32, num_key_value_heads=8, head_dim=None,
                      max_position_embeddings=131072, tie_word_embeddings=False, sliding_window=4096)),
    "mixtral": Family(  # MixtralConfig
        build=_mixtral,
        defaults=dict(vocab_size=32000, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                      num_attention_heads=32, num_key_value_heads=8, head_dim=None,
                      max_position_embeddings=131072, tie_word_embeddings=False, sliding_window=None,
                      num_experts_per_tok=2, num_local_experts=8),
        keys=frozenset({'num_experts_per_tok', 'num_local_experts'})),
    "qwen2": Family(  # Qwen2Config
        build=_llama_like,
        defaults=dict(vocab_size=151936, hidden_size=4096, intermediate_size=22016, num_hidden_layers=32,
                      num_attention_heads=32, num_key_value_heads=32, head_dim=None,
                      max_position_embeddings=32768, tie_word_embeddings=False, use_sliding_window=False,
                      sliding_window=4096),
        keys=frozenset({'use_mrope'})),
    "qwen2_moe": Family(  # Qwen2MoeConfig
        build=_qwen_moe,
        defaults=dict(vocab_size=151936, hidden_size=2048, intermediate_size=5632, num_hidden_layers=24,
                      num_attention_heads=16, num_key_value_heads=16, head_dim=None,
                      max_position_embeddings=32768, tie_word_embeddings=False, use_sliding_window=False,
                      sliding_window=4096, decoder_sparse_step=1, moe_intermediate_size=1408,
                      shared_expert_intermediate_size=5632, num_experts_per_tok=4, num_experts=60,
                      mlp_only_layers=None, qkv_bias=True),
        keys=frozenset({'decoder_sparse_step', 'layer_types', 'mlp_only_layers', 'moe_intermediate_size',
                        'num_experts', 'num_experts_per_tok', 'qkv_bias', 'shared_expert_intermediate_size'})),
    "qwen3": Family(  # Qwen3Config
        build=_llama_like,
        defaults=dict(vocab_size=151936, hidden_size=4096, intermediate_size=22016, num_hidden_layers=32,
                      num_attention_heads=32, num_key_value_heads=32, head_dim=128,
                      max_position_embeddings=32768, tie_word_embeddings=False, attention_bias=False,
                      use_sliding_window=False, sliding_window=4096)),
    "qwen3_moe": Family(  # Qwen3MoeConfig
        build=_qwen_moe,
        defaults=dict(vocab_size=151936, hidden_size=2048, intermediate_size=6144, num_hidden_layers=24,
                      num_attention_heads=32, num_key_value_heads=4, head_dim=None,
                      max_position_embeddings=32768, tie_word_embeddings=False, attention_bias=False,
                      use_sliding_window=False, sliding_window=4096, decoder_sparse_step=1,
                      moe_intermediate_size=768, num_experts_per_tok=8, num_experts=128,
                      mlp_only_layers=None),
        keys=frozenset({'decoder_sparse_step', 'mlp_only_layers', 'moe_intermediate_size', 'num_experts',
                        'num_experts_per_tok'})),
    "deepseek_v2": Family(  # DeepseekV2Config
        build=_deepseek,
        defaults=dict(vocab_size=102400, hidden_size=4096, intermediate_size=11008,
                      moe_intermediate_size=1407, num_hidden_layers=30, num_attention_heads=32,
                      num_key_value_heads=32, n_shared_experts=None, n_routed_experts=None,
                      first_k_dense_replace=0, moe_layer_freq=1, kv_lora_rank=512, q_lora_rank=1536,
                      qk_rope_head_dim=64, v_head_dim=128, qk_nope_head_dim=128, num_experts_per_tok=None,
                      topk_method='greedy', max_position_embeddings=2048, tie_word_embeddings=False,
                      num_nextn_predict_layers=0),
        keys=frozenset({'aux_loss_alpha', 'ep_size', 'first_k_dense_replace', 'kv_lora_rank',
                        'moe_intermediate_size', 'moe_layer_freq', 'n_group', 'n_routed_experts',
                        'n_shared_experts', 'num_experts_per_tok', 'num_nextn_predict_layers', 'q_lora_rank',
                        'qk_nope_head_dim', 'qk_rope_head_dim', 'rope_interleave', 'routed_scaling_factor',
                        'scoring_func', 'seq_aux', 'topk_group', 'topk_method', 'v_head_dim'})),
    "deepseek_v3": Family(  # DeepseekV3Config
        build=_deepseek,
        defaults=dict(vocab_size=129280, hidden_size=7168, intermediate_size=18432,
                      moe_intermediate_size=2048, num_hidden_layers=61, num_attention_heads=128,
                      num_key_value_heads=128, n_shared_experts=1, n_routed_experts=256,
                      first_k_dense_replace=3, moe_layer_freq=1, kv_lora_rank=512, q_lora_rank=1536,
                      qk_rope_head_dim=64, v_head_dim=128, qk_nope_head_dim=128, num_experts_per_tok=8,
                      topk_method='noaux_tc', max_position_embeddings=4096, tie_word_embeddings=False,
                      num_nextn_predict_layers=0),
        keys=_DEEPSEEK_KEYS),
    "gemma": Family(  # GemmaConfig
        build=_llama_like,
        defaults=dict(vocab_size=256000, hidden_size=3072, intermediate_size=24576, num_hidden_layers=28,
                      num_attention_heads=16, num_key_value_heads=16, head_dim=256,
                      max_position_embeddings=8192, tie_word_embeddings=True),
        keys=frozenset({'hidden_activation'})),
    "gemma2": Family(  # Gemma2Config
        build=_llama_like,
        defaults=dict(vocab_size=256000, hidden_size=2304, intermediate_size=9216, num_hidden_layers=26,
                      num_attention_heads=8, num_key_value_heads=4, head_dim=256,
                      max_position_embeddings=8192, tie_word_embeddings=True, sliding_window=4096),
        keys=frozenset({'attn_logit_softcapping', 'cache_implementation', 'final_logit_softcapping',
                        'hidden_activation', 'query_pre_attn_scalar'})),
    "gemma3_text": Family(  # Gemma3TextConfig
        build=_llama_like,
        defaults=dict(vocab_size=262208, hidden_size=2304, intermediate_size=9216, num_hidden_layers=26,
                      num_attention_heads=8, num_key_value_heads=4, head_dim=256,
                      max_position_embeddings=131072, tie_word_embeddings=True, sliding_window=4096,
                      sliding_window_pattern=6),
        keys=frozenset({'attn_logit_softcapping', 'cache_implementation', 'final_logit_softcapping',
                        'hidden_activation', 'query_pre_attn_scalar', 'rope_local_base_freq',
                        'sliding_window_pattern', 'use_bidirectional_attention'})),
    "phi3": Family(  # Phi3Config
        build=_llama_like,
        defaults=dict(vocab_size=32064, hidden_size=3072, intermediate_size=8192, num_hidden_layers=32,
                      num_attention_heads=32, num_key_value_heads=None, head_dim=None,
                      max_position_embeddings=4096, tie_word_embeddings=False, sliding_window=None),
        keys=frozenset({'lm_head_bias', 'rope_position_scaling'})),
    "gpt_oss": Family(  # GptOssConfig
        build=_gpt_oss,
        defaults=dict(vocab_size=201088, hidden_size=2880, intermediate_size=2880, num_hidden_layers=36,
                      num_attention_heads=64, num_key_value_heads=8, head_dim=64,
                      max_position_embeddings=131072, tie_word_embeddings=False, sliding_window=128,
                      num_local_experts=128, num_experts_per_tok=4, attention_bias=True),
        keys=frozenset({'experts_per_token', 'initial_context_length', 'num_experts_per_tok',
                        'num_local_experts', 'rope_scaling', 'router_aux_loss_coef', 'swiglu_limit'})),
    "olmo2": Family(  # Olmo2Config
        build=_llama_like,
        defaults=dict(vocab_size=50304, hidden_size=4096, intermediate_size=11008, num_hidden_layers=32,
                      num_attention_heads=32, num_key_value_heads=None, head_dim=None,
                      max_position_embeddings=2048, tie_word_embeddings=False, attention_bias=False),
        keys=frozenset({'clip_qkv'})),
    "granite": Family(  # GraniteConfig
        build=_llama_like,
        defaults=_LLAMA,
        keys=frozenset({'attention_multiplier', 'embedding_multiplier', 'logits_scaling',
                        'residual_multiplier'})),
    "gpt_neox": Family(  # GPTNeoXConfig
        build=_gpt_neox,
        defaults=dict(vocab_size=50432, hidden_size=6144, num_hidden_layers=44, num_attention_heads=64,
                      intermediate_size=24576, max_position_embeddings=2048, tie_word_embeddings=False,
                      attention_bias=True),
        keys=frozenset({'classifier_dropout', 'rotary_emb_base', 'rotary_pct', 'use_parallel_residual'})),
    "gpt2": Family(  # GPT2Config (attribute_map: hidden_size=n_embd, num_hidden_layers=n_layer, ...)
        build=_gpt2,
        defaults=dict(vocab_size=50257, n_positions=1024, n_embd=768, n_layer=12, n_head=12, n_inner=None,
                      tie_word_embeddings=True),
        keys=frozenset({'add_cross_attention', 'n_ctx', 'n_embd', 'n_head', 'n_inner', 'n_layer',
                        'n_positions', 'reorder_and_upcast_attn', 'scale_attn_by_inverse_layer_idx',
                        'scale_attn_weights', 'summary_activation', 'summary_first_dropout',
                        'summary_proj_to_labels', 'summary_type', 'summary_use_proj'})),
    "starcoder2": Family(  # Starcoder2Config
        build=_starcoder2,
        defaults=dict(vocab_size=49152, hidden_size=3072, intermediate_size=12288, num_hidden_layers=30,
                      num_attention_heads=24, num_key_value_heads=2, max_position_embeddings=4096,
                      tie_word_embeddings=True, use_bias=True, sliding_window=None),
        keys=frozenset({'embedding_dropout', 'residual_dropout', 'use_bias'})),
    "falcon": Family(  # FalconConfig
        build=_falcon,
        defaults=dict(vocab_size=65024, hidden_size=4544, num_hidden_layers=32, num_attention_heads=71,
                      num_kv_heads=None, multi_query=True, new_decoder_architecture=False, parallel_attn=True,
                      bias=False, alibi=False, ffn_hidden_size=None, num_ln_in_parallel_attn=None,
                      max_position_embeddings=2048, tie_word_embeddings=True),
        keys=frozenset({'activation', 'alibi', 'ffn_hidden_size', 'multi_query', 'n_embed', 'n_head',
                        'n_head_kv', 'n_layer', 'new_decoder_architecture', 'num_kv_heads',
                        'num_ln_in_parallel_attn', 'parallel_attn', 'rope_theta'})),
}
FAMILIES["gemma3"] = FAMILIES["gemma3_text"]  # a gemma3 config without text_config (rare)
