"""The hybrid architectures measured: each model's published config.json (tests/data/hf_configs/,
the same files the parameter-count tests build) and its canonical architecture object, with the
fields issue 28 adds: `full_attention_interval` and the `linear_*` fields for Gated DeltaNet layers,
`hybrid_override_pattern` and the `mamba_*` fields for Mamba-2 blocks."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

HF_CONFIGS = Path(__file__).resolve().parents[2] / "tests" / "data" / "hf_configs"


@dataclass(frozen=True)
class HybridModel:
    id: str
    hf: dict  # the config.json keys (model_type included)
    canonical: dict  # the contract's architecture object

    def hf_config(self, attn_implementation: str):
        from transformers import AutoConfig

        config = AutoConfig.for_model(**self.hf)
        config._attn_implementation = attn_implementation
        config.use_cache = False  # the Trainer's setting: no cache in training
        return config

    def architecture(self) -> dict:
        return dict(self.canonical, name=self.id)


def _published(name: str) -> dict:
    return json.loads((HF_CONFIGS / f"{name}.json").read_text())


def _qwen3_next(hf: dict) -> dict:
    """Qwen3-Next: decoder layers of (Gated DeltaNet or gated attention) + MoE with one gated shared
    expert; (1 + w) RMSNorms; q/k norms; the attention's q_proj doubled for its output gate."""
    return dict(
        hidden_size=hf["hidden_size"], num_layers=hf["num_hidden_layers"],
        num_attention_heads=hf["num_attention_heads"], num_kv_heads=hf["num_key_value_heads"],
        head_dim=hf["head_dim"], vocab_size=hf["vocab_size"],  # every layer MoE: intermediate_size unused
        tie_embeddings=hf["tie_word_embeddings"], qk_norm=True, norm_unit_offset=True,
        num_experts=hf["num_experts"], num_experts_per_token=hf["num_experts_per_tok"],
        moe_intermediate_size=hf["moe_intermediate_size"], num_shared_experts=1,
        shared_expert_intermediate_size=hf["shared_expert_intermediate_size"], shared_expert_gate=True,
        attention_output_gate=True, full_attention_interval=hf["full_attention_interval"],
        linear_num_key_heads=hf["linear_num_key_heads"], linear_num_value_heads=hf["linear_num_value_heads"],
        linear_key_head_dim=hf["linear_key_head_dim"], linear_value_head_dim=hf["linear_value_head_dim"],
        linear_conv_kernel_dim=hf["linear_conv_kernel_dim"])


def _nemotron_h(hf: dict) -> dict:
    """Nemotron-H: blocks of one norm (its scale multiplied in fp32) and one of Mamba-2 (M), attention
    without positions (*), a squared-ReLU MLP (-); the model casts its logits to fp32."""
    return dict(
        hidden_size=hf["hidden_size"], num_layers=len(hf["hybrid_override_pattern"]),
        num_attention_heads=hf["num_attention_heads"], num_kv_heads=hf["num_key_value_heads"],
        head_dim=hf["attention_head_dim"], vocab_size=hf["vocab_size"], intermediate_size=hf["intermediate_size"],
        tie_embeddings=hf["tie_word_embeddings"], gated_mlp=False, position_embedding="none", norm_fp32_scale=True,
        logits_fp32=True,
        hybrid_override_pattern=hf["hybrid_override_pattern"], mamba_num_heads=hf["mamba_num_heads"],
        mamba_head_dim=hf["mamba_head_dim"], mamba_state_size=hf["ssm_state_size"],
        mamba_num_groups=hf["n_groups"], mamba_conv_kernel=hf["conv_kernel"],
        mamba_conv_bias=hf["use_conv_bias"], mamba_chunk_size=hf["chunk_size"])


def _jamba(hf: dict) -> dict:
    """Jamba: decoder layers of (Mamba-1 or attention without positions) + (MLP or MoE), two norms each;
    attention where i % attn_layer_period == attn_layer_offset, MoE where i % expert_layer_period ==
    expert_layer_offset (JambaConfig.layers_block_type, layers_num_experts); the experts as wide as the MLP."""
    return dict(
        hidden_size=hf["hidden_size"], num_layers=hf["num_hidden_layers"],
        num_attention_heads=hf["num_attention_heads"], num_kv_heads=hf["num_key_value_heads"],
        vocab_size=hf["vocab_size"], intermediate_size=hf["intermediate_size"],
        tie_embeddings=hf["tie_word_embeddings"], position_embedding="none",
        num_experts=hf["num_experts"], num_experts_per_token=hf["num_experts_per_tok"],
        moe_intermediate_size=hf["intermediate_size"], first_dense_layers=hf["expert_layer_offset"],
        moe_layer_frequency=hf["expert_layer_period"],
        attention_layer_period=hf["attn_layer_period"], attention_layer_offset=hf["attn_layer_offset"],
        mamba_expand=hf["mamba_expand"], mamba_state_size=hf["mamba_d_state"], mamba_dt_rank=hf["mamba_dt_rank"],
        mamba_conv_kernel=hf["mamba_d_conv"], mamba_conv_bias=hf["mamba_conv_bias"])


def _falcon_h1(hf: dict) -> dict:
    """Falcon-H1: decoder layers of attention (RoPE, GQA, 128-wide heads) and a Mamba-2 mixer side by side on one
    norm's output, then a gated MLP; the mixer's gated norm with mamba_rms_norm."""
    return dict(
        hidden_size=hf["hidden_size"], num_layers=hf["num_hidden_layers"],
        num_attention_heads=hf["num_attention_heads"], num_kv_heads=hf["num_key_value_heads"],
        head_dim=hf["head_dim"], vocab_size=hf["vocab_size"], intermediate_size=hf["intermediate_size"],
        tie_embeddings=hf["tie_word_embeddings"], parallel_mamba=True, mamba_num_heads=hf["mamba_n_heads"],
        mamba_head_dim=hf["mamba_d_head"], mamba_state_size=hf["mamba_d_state"], mamba_num_groups=hf["mamba_n_groups"],
        mamba_conv_kernel=hf["mamba_d_conv"], mamba_conv_bias=hf["mamba_conv_bias"],
        mamba_chunk_size=hf["mamba_chunk_size"], mamba_gated_norm=hf["mamba_rms_norm"])


QWEN3_NEXT_80B = _published("qwen3-next-80b-a3b-instruct")
NEMOTRON_H_8B = _published("nemotron-h-8b-base-8k")
JAMBA_MINI = _published("ai21-jamba-1.5-mini")
FALCON_H1_7B = _published("falcon-h1-7b-instruct")
FALCON_H1_34B = _published("falcon-h1-34b-instruct")
FALCON_H1_05B = _published("falcon-h1-0.5b-instruct")  # no gated norm in its mixer (mamba_rms_norm false)

# Tiny models for the emulation and fake-versus-real checks (tests/test_harness_hybrid.py): grouped
# value heads (2 key heads, 4 value heads), a full-attention layer, MoE; every Nemotron-H block kind.
TINY_QWEN3_NEXT = dict(QWEN3_NEXT_80B, hidden_size=64, num_hidden_layers=4, num_attention_heads=4,
                       num_key_value_heads=2, head_dim=16, intermediate_size=96, vocab_size=1000,
                       max_position_embeddings=512, linear_num_key_heads=2, linear_num_value_heads=4,
                       linear_key_head_dim=16, linear_value_head_dim=16, num_experts=4, num_experts_per_tok=2,
                       moe_intermediate_size=32, shared_expert_intermediate_size=32)
TINY_NEMOTRON_H = dict(NEMOTRON_H_8B, hidden_size=64, hybrid_override_pattern="M-*M-", num_hidden_layers=5,
                       num_attention_heads=4, num_key_value_heads=2, attention_head_dim=16, intermediate_size=128,
                       vocab_size=1000, max_position_embeddings=512, mamba_num_heads=8, mamba_head_dim=16,
                       ssm_state_size=16, n_groups=2, chunk_size=16)
# Jamba: Mamba + MLP (0, 2), attention + MoE (1), Mamba + MoE (3)
TINY_JAMBA = dict(JAMBA_MINI, hidden_size=64, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
                  intermediate_size=96, vocab_size=1000, max_position_embeddings=512, num_experts=4,
                  attn_layer_period=3, attn_layer_offset=1, mamba_d_state=8, mamba_dt_rank=8)

# Falcon-H1: 2 groups of 4 Mamba heads, chunks of 16 (the 48- and 64-token runs span several); muP multipliers
# other than 1 so that the scaled paths are exercised; the gate before the norm, as the fused kernel is called
TINY_FALCON_H1 = dict(FALCON_H1_7B, hidden_size=64, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
                      head_dim=16, intermediate_size=96, vocab_size=1000, max_position_embeddings=512, mamba_d_ssm=64,
                      mamba_n_heads=4, mamba_d_head=16, mamba_n_groups=2, mamba_d_state=8, mamba_chunk_size=16,
                      mamba_norm_before_gate=False, ssm_in_multiplier=1.25, ssm_out_multiplier=0.5,
                      attention_in_multiplier=0.75, key_multiplier=0.5, mlp_multipliers=[0.75, 0.5],
                      ssm_multipliers=[0.5, 0.25, 0.5, 0.75, 0.5], embedding_multiplier=2.0, lm_head_multiplier=0.25)

TINY_FALCON_H1_PLAIN = dict(TINY_FALCON_H1, mamba_rms_norm=False)  # the mixer gated in the scan, no norm

MODELS = {m.id: m for m in [
    HybridModel("qwen3-next-80b-a3b", QWEN3_NEXT_80B, _qwen3_next(QWEN3_NEXT_80B)),
    HybridModel("nemotron-h-8b", NEMOTRON_H_8B, _nemotron_h(NEMOTRON_H_8B)),
    HybridModel("tiny-qwen3-next", TINY_QWEN3_NEXT, _qwen3_next(TINY_QWEN3_NEXT)),
    HybridModel("tiny-nemotron-h", TINY_NEMOTRON_H, _nemotron_h(TINY_NEMOTRON_H)),
    HybridModel("jamba-mini-1.5", JAMBA_MINI, _jamba(JAMBA_MINI)),
    HybridModel("tiny-jamba", TINY_JAMBA, _jamba(TINY_JAMBA)),
    HybridModel("falcon-h1-7b", FALCON_H1_7B, _falcon_h1(FALCON_H1_7B)),
    HybridModel("falcon-h1-34b", FALCON_H1_34B, _falcon_h1(FALCON_H1_34B)),
    HybridModel("falcon-h1-0.5b", FALCON_H1_05B, _falcon_h1(FALCON_H1_05B)),
    HybridModel("tiny-falcon-h1", TINY_FALCON_H1, _falcon_h1(TINY_FALCON_H1)),
    HybridModel("tiny-falcon-h1-plain", TINY_FALCON_H1_PLAIN, _falcon_h1(TINY_FALCON_H1_PLAIN)),
]}

# The measured runs, as validation/hf/step.Run's arguments (registered in validation/hf/cases.py). Long
# sequences without recompute peak in the forward or backward; the others at the optimizer step (foreach
# AdamW's copy of every state), with their phases' activations recorded.
HYBRID_RUNS = [
    (("qwen3-next-80b-a3b", 4096), {}), (("qwen3-next-80b-a3b", 8192), {"recompute": "full"}),
    (("qwen3-next-80b-a3b", 2048, 2), {}), (("qwen3-next-80b-a3b", 32768), {}),
    (("nemotron-h-8b", 4096), {}), (("nemotron-h-8b", 8192), {"recompute": "full"}),
    (("nemotron-h-8b", 2048, 2), {}), (("nemotron-h-8b", 16384), {"recompute": "full"}),
    (("nemotron-h-8b", 8192), {}),
    (("jamba-mini-1.5", 4096), {}), (("jamba-mini-1.5", 8192), {"recompute": "full"}),
    (("jamba-mini-1.5", 2048, 2), {}), (("jamba-mini-1.5", 16384), {"recompute": "full"}),
    (("jamba-mini-1.5", 32768), {}),
    (("falcon-h1-7b", 4096), {}), (("falcon-h1-7b", 8192), {"recompute": "full"}), (("falcon-h1-7b", 2048, 2), {}),
    (("falcon-h1-7b", 16384), {}), (("falcon-h1-34b", 4096), {"recompute": "full"}),
    (("falcon-h1-0.5b", 4096, 2), {}), (("falcon-h1-0.5b", 16384), {"recompute": "full"}),
]

KERNELS = {  # what a record's description says of the emulated kernels, and their sources
    "qwen3-next-80b-a3b": "Gated DeltaNet layers through causal-conv1d's causal_conv1d_fn and flash-linear-attention's "
                          "chunk_gated_delta_rule (emulated: fla-org/flash-linear-attention@bc3b101, "
                          "Dao-AILab/causal-conv1d@0d2252d), gated attention every 4th layer",
    "nemotron-h-8b": "Mamba-2 blocks through mamba-ssm's mamba_split_conv1d_scan_combined (emulated: "
                     "state-spaces/mamba@e9594ce)",
    "jamba-mini-1.5": "Mamba-1 layers through causal-conv1d's causal_conv1d_fn and mamba-ssm's selective_scan_fn "
                      "(emulated: Dao-AILab/causal-conv1d@0d2252d, state-spaces/mamba@e9594ce), attention every 8th "
                      "layer, MoE every 2nd",
    **dict.fromkeys(("falcon-h1-7b", "falcon-h1-34b", "falcon-h1-0.5b"), "attention and a Mamba-2 mixer side by side in every layer, the "
                    "mixer through mamba-ssm's mamba_split_conv1d_scan_combined (emulated: state-spaces/mamba@e9594ce)"),
}
