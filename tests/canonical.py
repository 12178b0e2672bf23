"""Canonical architectures used by the tests, with the published numbers they come from.

Shapes are the models' published config.json values (Hugging Face model pages of meta-llama,
Qwen and mistralai); the GPT layer is Korthikanti et al. 2022's (LayerNorm, 4h GELU MLP,
biases, learned positions).
"""

from estimator import Architecture

LLAMA_31_8B = Architecture(name="llama-3.1-8b", hidden_size=4096, num_layers=32, num_attention_heads=32,
                           num_kv_heads=8, intermediate_size=14336, vocab_size=128256)
LLAMA_31_70B = Architecture(name="llama-3.1-70b", hidden_size=8192, num_layers=80, num_attention_heads=64,
                            num_kv_heads=8, intermediate_size=28672, vocab_size=128256)
LLAMA_31_405B = Architecture(name="llama-3.1-405b", hidden_size=16384, num_layers=126, num_attention_heads=128,
                             num_kv_heads=8, intermediate_size=53248, vocab_size=128256)
QWEN3_8B = Architecture(name="qwen3-8b", hidden_size=4096, num_layers=36, num_attention_heads=32, num_kv_heads=8,
                        head_dim=128, intermediate_size=12288, vocab_size=151936, qk_norm=True)
QWEN25_7B = Architecture(name="qwen2.5-7b", hidden_size=3584, num_layers=28, num_attention_heads=28, num_kv_heads=4,
                         intermediate_size=18944, vocab_size=152064, qkv_bias=True)
MIXTRAL_8X7B = Architecture(name="mixtral-8x7b", hidden_size=4096, num_layers=32, num_attention_heads=32,
                            num_kv_heads=8, vocab_size=32000, num_experts=8, num_experts_per_token=2,
                            moe_intermediate_size=14336)


def gpt(h: int, layers: int, heads: int, vocab: int = 51200, seq: int = 2048) -> Architecture:
    """Korthikanti et al.'s GPT: LayerNorm, a plain 4h MLP, biases everywhere, learned positions."""
    return Architecture(name=f"gpt-h{h}", hidden_size=h, num_layers=layers, num_attention_heads=heads,
                        intermediate_size=4 * h, vocab_size=vocab, gated_mlp=False, norm="layernorm",
                        linear_bias=True, position_embedding="learned", max_position_embeddings=seq,
                        tie_embeddings=True)
