"""The architectures measured, twice: as the transformers config class and keyword arguments
copied from each model's published config.json (no weights are needed: the model is built from
the config), and as the contract's canonical architecture object (/work/shared/CONTRACT.md)."""

from __future__ import annotations

from dataclasses import dataclass

CANONICAL_DEFAULTS = {
    "tie_embeddings": False, "gated_mlp": True, "norm": "rmsnorm", "linear_bias": False,
    "qkv_bias": False, "qk_norm": False, "position_embedding": "rope",
    "max_position_embeddings": None, "num_experts": 0, "num_experts_per_token": None,
    "moe_intermediate_size": None, "num_shared_experts": 0,
    "shared_expert_intermediate_size": None, "first_dense_layers": 0, "moe_layer_frequency": 1,
    "norms_per_layer": 2,
}


@dataclass(frozen=True)
class Model:
    id: str
    config_class: str  # a transformers *Config class
    hf: dict  # its keyword arguments
    canonical: dict  # contract architecture fields beyond the defaults above

    def hf_config(self, attn_implementation: str):
        import transformers

        config = getattr(transformers, self.config_class)(**self.hf)
        config._attn_implementation = attn_implementation
        config.use_cache = False  # TrainingArguments.use_cache defaults to False; the Trainer sets it
        return config

    def architecture(self) -> dict:
        arch = dict(CANONICAL_DEFAULTS, **self.canonical, name=self.id)
        return {k: v for k, v in arch.items() if v is not None}


def _dense(h, layers, heads, kv, head_dim, ffn, vocab, **extra) -> dict:
    return dict(hidden_size=h, num_layers=layers, num_attention_heads=heads, num_kv_heads=kv,
                head_dim=head_dim, intermediate_size=ffn, vocab_size=vocab, **extra)


MODELS = {m.id: m for m in [
    Model("llama-3.1-8b", "LlamaConfig", dict(
        hidden_size=4096, num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8,
        head_dim=128, intermediate_size=14336, vocab_size=128256, max_position_embeddings=131072,
        rms_norm_eps=1e-5, tie_word_embeddings=False, rope_parameters=dict(
            rope_type="llama3", rope_theta=500000.0, factor=8.0, low_freq_factor=1.0,
            high_freq_factor=4.0, original_max_position_embeddings=8192)),
        _dense(4096, 32, 32, 8, 128, 14336, 128256)),
    Model("qwen3-8b", "Qwen3Config", dict(
        hidden_size=4096, num_hidden_layers=36, num_attention_heads=32, num_key_value_heads=8,
        head_dim=128, intermediate_size=12288, vocab_size=151936, max_position_embeddings=40960,
        rms_norm_eps=1e-6, tie_word_embeddings=False, attention_bias=False,
        rope_parameters=dict(rope_type="default", rope_theta=1000000.0)),
        _dense(4096, 36, 32, 8, 128, 12288, 151936, qk_norm=True)),
    Model("qwen2.5-7b", "Qwen2Config", dict(
        hidden_size=3584, num_hidden_layers=28, num_attention_heads=28, num_key_value_heads=4,
        intermediate_size=18944, vocab_size=152064, max_position_embeddings=131072,
        rms_norm_eps=1e-6, tie_word_embeddings=False, use_sliding_window=False,
        rope_parameters=dict(rope_type="default", rope_theta=1000000.0)),
        _dense(3584, 28, 28, 4, 128, 18944, 152064, qkv_bias=True)),
    # Gemma-2 soft-caps attention logits, which SDPA cannot do: transformers runs it eager only.
    Model("gemma-2-9b", "Gemma2Config", dict(
        hidden_size=3584, num_hidden_layers=42, num_attention_heads=16, num_key_value_heads=8,
        head_dim=256, intermediate_size=14336, vocab_size=256000, max_position_embeddings=8192,
        rms_norm_eps=1e-6, tie_word_embeddings=True, hidden_activation="gelu_pytorch_tanh",
        query_pre_attn_scalar=256, sliding_window=4096, final_logit_softcapping=30.0,
        attn_logit_softcapping=50.0, rope_parameters=dict(rope_type="default", rope_theta=10000.0)),
        _dense(3584, 42, 16, 8, 256, 14336, 256000, tie_embeddings=True, norms_per_layer=4,
               sliding_window=4096, sliding_window_pattern=2, attention_logit_softcapping=50.0,
               final_logit_softcapping=30.0, norm_unit_offset=True)),
    Model("mixtral-8x7b", "MixtralConfig", dict(
        hidden_size=4096, num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8,
        head_dim=128, intermediate_size=14336, vocab_size=32000, max_position_embeddings=32768,
        rms_norm_eps=1e-5, tie_word_embeddings=False, num_local_experts=8, num_experts_per_tok=2,
        rope_parameters=dict(rope_type="default", rope_theta=1000000.0)),
        _dense(4096, 32, 32, 8, 128, 14336, 32000, num_experts=8, num_experts_per_token=2,
               moe_intermediate_size=14336)),
    Model("qwen3-30b-a3b", "Qwen3MoeConfig", dict(
        hidden_size=2048, num_hidden_layers=48, num_attention_heads=32, num_key_value_heads=4,
        head_dim=128, intermediate_size=6144, moe_intermediate_size=768, num_experts=128,
        num_experts_per_tok=8, norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[],
        vocab_size=151936, max_position_embeddings=40960, rms_norm_eps=1e-6,
        tie_word_embeddings=False, rope_parameters=dict(rope_type="default", rope_theta=1000000.0)),
        _dense(2048, 48, 32, 4, 128, 6144, 151936, qk_norm=True, num_experts=128,
               num_experts_per_token=8, moe_intermediate_size=768)),
    # Small models, for the real-GPU runs (validation/gpu): at this size the library workspaces
    # and the allocator's rounding, which fake tensors cannot see, are a visible share.
    Model("llama-3.2-1b", "LlamaConfig", dict(
        hidden_size=2048, num_hidden_layers=16, num_attention_heads=32, num_key_value_heads=8,
        head_dim=64, intermediate_size=8192, vocab_size=128256, max_position_embeddings=131072,
        rms_norm_eps=1e-5, tie_word_embeddings=True, rope_parameters=dict(
            rope_type="llama3", rope_theta=500000.0, factor=32.0, low_freq_factor=1.0,
            high_freq_factor=4.0, original_max_position_embeddings=8192)),
        _dense(2048, 16, 32, 8, 64, 8192, 128256, tie_embeddings=True)),
    Model("qwen2.5-0.5b", "Qwen2Config", dict(
        hidden_size=896, num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2,
        intermediate_size=4864, vocab_size=151936, max_position_embeddings=32768,
        rms_norm_eps=1e-6, tie_word_embeddings=True, use_sliding_window=False,
        rope_parameters=dict(rope_type="default", rope_theta=1000000.0)),
        _dense(896, 24, 14, 2, 64, 4864, 151936, qkv_bias=True, tie_embeddings=True)),
    # Tiny models for the fake-versus-real cross-check (tests/test_harness.py): 2 layers, GQA.
    Model("tiny-llama", "LlamaConfig", dict(
        hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        head_dim=16, intermediate_size=160, vocab_size=1000, max_position_embeddings=512,
        tie_word_embeddings=False), _dense(64, 2, 4, 2, 16, 160, 1000)),
    Model("tiny-mixtral", "MixtralConfig", dict(
        hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        head_dim=16, intermediate_size=96, vocab_size=1000, max_position_embeddings=512,
        num_local_experts=4, num_experts_per_tok=2, tie_word_embeddings=False),
        _dense(64, 2, 4, 2, 16, 96, 1000, num_experts=4, num_experts_per_token=2,
               moe_intermediate_size=96)),
    Model("tiny-gemma2", "Gemma2Config", dict(
        hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        head_dim=16, intermediate_size=160, vocab_size=1000, max_position_embeddings=512,
        query_pre_attn_scalar=16, sliding_window=32, tie_word_embeddings=True),
        _dense(64, 2, 4, 2, 16, 160, 1000, tie_embeddings=True, norms_per_layer=4,
               sliding_window=32, sliding_window_pattern=2, attention_logit_softcapping=50.0,
               final_logit_softcapping=30.0, norm_unit_offset=True)),
]}

# The hybrid models (issue 28): Qwen3-Next's Gated DeltaNet and Nemotron-H's Mamba-2 layers, built from
# their published config.json, their CUDA kernels emulated in the step (validation/hybrid/kernels.py)
from ..hybrid.models import MODELS as _HYBRID  # noqa: E402

MODELS.update(_HYBRID)

# Vision-language models (issue 28): Qwen2.5-VL's window-attention ViT, built from its published config.json
from ..vlm.models import MODELS as _VISION  # noqa: E402

MODELS.update(_VISION)

# Llama 4 Scout's language model (issue 28): chunked attention, NoPE layers, MoE with a shared expert
from ..llama4.models import MODELS as _LLAMA4  # noqa: E402

MODELS.update(_LLAMA4)

# DeepSeek-V3.2's sparse attention (issue 28): its first three layers (validation/hf/dsa.py)
from .dsa import MODELS as _SPARSE  # noqa: E402

MODELS.update(_SPARSE)

# Decoders whose config drops out the residual branches and embeddings (validation/hf/dropout.py)
from .dropout import MODELS as _DROPOUT  # noqa: E402

MODELS.update(_DROPOUT)
