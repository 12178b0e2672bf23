from torchtune.models.qwen2._positional_embeddings import Qwen2RotaryPositionalEmbeddings
from torchtune.models.qwen3._attention import Qwen3Attention

def qwen3(vocab_size, num_layers, num_heads, num_kv_heads, embed_dim, intermediate_dim, max_seq_len, head_dim=None, attn_dropout=0.0, norm_eps=1e-05, rope_base=1000000.0, tie_word_embeddings=False, q_proj_bias=True, k_proj_bias=True, v_proj_bias=True, q_norm=False, k_norm=False):
    ...

def lora_qwen3(lora_attn_modules, apply_lora_to_mlp=False, apply_lora_to_output=False, *, vocab_size, num_layers, num_heads, num_kv_heads, embed_dim, intermediate_dim, max_seq_len, head_dim=None, attn_dropout=0.0, norm_eps=1e-05, rope_base=1000000.0, tie_word_embeddings=False, q_proj_bias=True, k_proj_bias=True, v_proj_bias=True, q_norm=False, k_norm=False, lora_rank, lora_alpha, lora_dropout=0.0, use_dora=False, quantize_base=False):
    ...
