"""Llama 4 Scout's language model as the HF harness builds it: transformers 5.23 Llama4ForCausalLM from the
published config.json's `text_config` (tests/data/hf_configs/llama-4-scout-17b-16e.json), and its canonical
architecture: 48 MoE layers of 16 routed experts (top-1, sigmoid router) and one shared expert, chunked
attention over 8192 tokens in the RoPE layers and a global NoPE layer every 4th (estimator/models/hf_llama4.py).

Runs stay below the chunk (seq_len < 8192): there transformers' create_chunked_causal_mask leaves the chunked
layers' mask to SDPA's is_causal (masking_utils._ignore_causal_mask_sdpa: kv_length < attention_chunk_size), so
every layer takes the FlashAttention-2 path the harness emulates (validation/core/emulation.py). From 8192 tokens
on the chunked layers get an explicit mask, which sends SDPA to its masked path (repeat_kv, memory-efficient
kernel): not emulated, not measured."""

from __future__ import annotations

from ..hybrid.models import HybridModel, _published


def text_config_keys(hf: dict) -> dict:
    """The file's text_config as transformers 5.23's strict Llama4TextConfig takes it: the file's
    `attn_temperature_tuning: 4` is typed bool there, so it is passed as true (the same truth value)."""
    text = dict(hf["text_config"])
    text["attn_temperature_tuning"] = bool(text.get("attn_temperature_tuning", True))
    return text


def _llama4_text(t: dict) -> dict:
    """Every layer MoE (interleave step 1): no dense MLP width; one shared expert as wide as a routed one."""
    return dict(
        hidden_size=t["hidden_size"], num_layers=t["num_hidden_layers"], num_attention_heads=t["num_attention_heads"],
        num_kv_heads=t["num_key_value_heads"], head_dim=t["head_dim"], vocab_size=t["vocab_size"],
        num_experts=t["num_local_experts"], num_experts_per_token=t["num_experts_per_tok"],
        moe_intermediate_size=t["intermediate_size"], num_shared_experts=1,
        shared_expert_intermediate_size=t["intermediate_size"], attention_chunk_size=t["attention_chunk_size"],
        sliding_window_pattern=4, qk_l2_norm=t["use_qk_norm"], moe_dense_experts=True,
        eager_softmax_in_compute_dtype=True)


SCOUT = text_config_keys(_published("llama-4-scout-17b-16e"))
# Two layers (one chunked RoPE layer, one global NoPE layer), four experts: the fake-versus-real cross-check
TINY_SCOUT = dict(SCOUT, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                  head_dim=16, intermediate_size=96, intermediate_size_mlp=128, vocab_size=1000, num_local_experts=4,
                  attention_chunk_size=32, moe_layers=[0, 1], no_rope_layers=[1, 0], max_position_embeddings=16384,
                  pad_token_id=None, bos_token_id=1, eos_token_id=2)  # special tokens inside the tiny vocabulary

MODELS = {m.id: m for m in [
    HybridModel("llama-4-scout", SCOUT, _llama4_text(SCOUT)),
    HybridModel("tiny-llama-4", TINY_SCOUT, dict(_llama4_text(TINY_SCOUT), sliding_window_pattern=2)),
]}

# The measured runs, as validation/hf/step.Run's arguments (registered in validation/hf/cases.py)
LLAMA4_RUNS = [
    (("llama-4-scout", 2048), {}), (("llama-4-scout", 4096), {"recompute": "full"}),
    (("llama-4-scout", 1024, 2), {}), (("llama-4-scout", 4096), {}),
    # 8192 tokens a step: the activations (every token through all 16 experts) outgrow the optimizer step
    (("llama-4-scout", 4096, 2), {}),
    # eager attention: the chunked layers' 4-D mask beside the global layers'
    (("llama-4-scout", 2048), {"attention": "eager"}),
    # bf16 autocast over fp32 weights: the experts' bmm under autocast
    (("llama-4-scout", 2048), {"recipe": "amp"}),
]

KERNELS = {"llama-4-scout": "every layer through SDPA's FlashAttention-2 path (below the 8192-token chunk the chunked "
                            "layers' mask is SDPA's is_causal), the MoE block as transformers 5.23 runs it: every "
                            "token through all 16 experts (Llama4TextMoe: hidden_states.repeat(E, 1), scaled by the "
                            "router's scores, zero outside the top-1, then two bmm over the experts' stacked weights)"}
