"""DeepSeek-V3.2's sparse attention under transformers (issue 28): DeepSeek-V3.2-Exp's published config.json
trimmed to its first three layers, the dense ones (first_k_dense_replace = 3), and to its first four (the fourth
its first MoE layer: 256 routed experts, top-8, a shared expert), so each measured model is exactly those layers
with the embedding and head: MLA with the lightning indexer (DeepseekV32Indexer, run under no_grad) and eager
attention, the top-k folded into the mask (transformers 5.23 modeling_deepseek_v32.py).
The checkpoint's FP8 quantization_config and its MTP layer (num_nextn_predict_layers, which transformers does
not build) are left out: the model is built from the config in bf16."""

from __future__ import annotations

from ..hybrid.models import HybridModel, _published

def _trimmed(layers: int) -> dict:
    hf = _published("deepseek-v3.2-exp")
    for key in ("quantization_config", "architectures", "transformers_version", "torch_dtype"):
        hf.pop(key)
    return dict(hf, num_hidden_layers=layers, num_nextn_predict_layers=0)


def _canonical(hf: dict) -> dict:
    """The contract's architecture object of the built model (the estimator's deepseek_v32 mapping, hf_sparse.py)."""
    return dict(
        hidden_size=hf["hidden_size"], num_layers=hf["num_hidden_layers"],
        num_attention_heads=hf["num_attention_heads"], vocab_size=hf["vocab_size"],
        intermediate_size=hf["intermediate_size"], tie_embeddings=hf["tie_word_embeddings"],
        num_experts=hf["n_routed_experts"], num_experts_per_token=hf["num_experts_per_tok"],
        moe_intermediate_size=hf["moe_intermediate_size"], num_shared_experts=hf["n_shared_experts"],
        first_dense_layers=hf["first_k_dense_replace"], router_bias=True,
        q_lora_rank=hf["q_lora_rank"], kv_lora_rank=hf["kv_lora_rank"], qk_nope_head_dim=hf["qk_nope_head_dim"],
        qk_rope_head_dim=hf["qk_rope_head_dim"], v_head_dim=hf["v_head_dim"],
        index_n_heads=hf["index_n_heads"], index_head_dim=hf["index_head_dim"], index_topk=hf["index_topk"])


DEEPSEEK_V32_DENSE = _trimmed(3)  # its dense layers
DEEPSEEK_V32_MOE = _trimmed(4)  # ... and its first MoE layer
# A tiny one for the fake-versus-real check (tests/test_harness_hybrid.py): the top-k (16) below the sequence,
# so the indexer's selection masks keys; a dense layer then two MoE layers
TINY_DEEPSEEK_V32 = dict(DEEPSEEK_V32_DENSE, hidden_size=64, intermediate_size=96, moe_intermediate_size=32,
                         num_attention_heads=4, num_key_value_heads=4, n_routed_experts=4, num_experts_per_tok=2,
                         n_group=2, topk_group=1, first_k_dense_replace=1, q_lora_rank=32, kv_lora_rank=16,
                         qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16, index_n_heads=2,
                         index_head_dim=16, index_topk=16, vocab_size=1000, max_position_embeddings=512)
MODELS = {m.id: m for m in [HybridModel("deepseek-v3.2-3layers", DEEPSEEK_V32_DENSE, _canonical(DEEPSEEK_V32_DENSE)),
                            HybridModel("deepseek-v3.2-4layers", DEEPSEEK_V32_MOE, _canonical(DEEPSEEK_V32_MOE)),
                            HybridModel("tiny-deepseek-v3.2", TINY_DEEPSEEK_V32, _canonical(TINY_DEEPSEEK_V32))]}

# Eager attention only (sparse_hf.check_hf_training): SDPA would run its masked kernel
DSA_RUNS = [
    (("deepseek-v3.2-3layers", 2048), {"attention": "eager"}),
    (("deepseek-v3.2-3layers", 4096), {"attention": "eager"}),
    (("deepseek-v3.2-3layers", 2048, 2), {"attention": "eager"}),
    (("deepseek-v3.2-3layers", 4096), {"attention": "eager", "recompute": "full"}),
    (("deepseek-v3.2-3layers", 2048, 2), {"attention": "eager", "recompute": "full"}),
    (("deepseek-v3.2-4layers", 4096), {"attention": "eager"}),
    (("deepseek-v3.2-4layers", 4096, 2), {"attention": "eager", "recompute": "full"}),
]

KERNELS = {"deepseek-v3.2-3layers": "the first 3 (dense) layers of DeepSeek-V3.2-Exp, its lightning indexer under "
                                    "no_grad (untrained), the top-k as an attention mask",
           "deepseek-v3.2-4layers": "the first 4 layers of DeepSeek-V3.2-Exp (3 dense, 1 MoE), its lightning indexer "
                                    "under no_grad (untrained), the top-k as an attention mask"}
