"""The config.json of DeepSeek-V3.2 (DeepSeek Sparse Attention, estimator/spec/sparse.py) and of
Kimi-K2 (DeepSeek-V3's architecture under its own model_type), registered in `hf_families.FAMILIES`
on import (hf_config imports this module).
"""

from __future__ import annotations

from typing import Any

from .hf_common import Family
from .hf_families import _DEEPSEEK_KEYS, FAMILIES, _deepseek, _Reader


def _deepseek_v32(r: _Reader) -> tuple[dict[str, Any], list[str]]:
    """DeepSeek-V3.2(-Exp) (transformers 5.23 modular_deepseek_v32.py): DeepSeek-V3 with a lightning
    indexer in every attention layer (DeepseekV32Indexer: wq_b, wk, k_norm, weights_proj)."""
    fields, notes = _deepseek(r)
    fields.update(index_n_heads=r.int("index_n_heads"), index_head_dim=r.int("index_head_dim"),
                  index_topk=r.int("index_topk"))
    types = r.list_of("mlp_layer_types", str, "a list of 'dense' and 'sparse', one per layer")
    if types is not None:
        dense = fields.get("first_dense_layers", 0)
        expected = ["dense"] * dense + ["sparse"] * (fields["num_layers"] - dense)
        if types != expected:
            raise r._error("mlp_layer_types", types, f"{dense} 'dense' then 'sparse' (first_k_dense_replace)",
                           "other placements of the MoE layers are not modelled")
    return fields, notes


_V3 = FAMILIES["deepseek_v3"].defaults

SPARSE_FAMILIES: dict[str, Family] = {
    "deepseek_v32": Family(  # DeepseekV32Config (transformers 5.23)
        build=_deepseek_v32,
        # its class has no topk_method: the router always keeps e_score_correction_bias (DeepseekV32TopkRouter)
        defaults=dict(vocab_size=129280, hidden_size=7168, intermediate_size=18432, moe_intermediate_size=2048,
                      num_hidden_layers=61, num_attention_heads=128, num_key_value_heads=128, n_shared_experts=1,
                      n_routed_experts=256, first_k_dense_replace=3, moe_layer_freq=1, kv_lora_rank=512,
                      q_lora_rank=1536, qk_rope_head_dim=64, v_head_dim=128, qk_nope_head_dim=128,
                      num_experts_per_tok=8, topk_method="noaux_tc", max_position_embeddings=163840,
                      tie_word_embeddings=False, num_nextn_predict_layers=0, index_topk=2048, index_head_dim=128,
                      index_n_heads=64),
        keys=_DEEPSEEK_KEYS | {"index_n_heads", "index_head_dim", "index_topk", "mlp_layer_types"}),
    # moonshotai/Kimi-K2-Instruct: DeepseekV3ForCausalLM code (auto_map configuration_deepseek.DeepseekV3Config)
    # under model_type "kimi_k2", so engines can tell it apart; the same reader and defaults
    "kimi_k2": Family(build=_deepseek, defaults=dict(_V3), keys=_DEEPSEEK_KEYS),
}
FAMILIES.update(SPARSE_FAMILIES)
