from torchtune.models.phi3._position_embeddings import Phi3RotaryPositionalEmbeddings

def phi3(vocab_size, num_layers, num_heads, num_kv_heads, embed_dim, intermediate_dim, max_seq_len, attn_dropout=0.0, norm_eps=1e-05, rope_base=10000):
    ...

def lora_phi3(lora_attn_modules, apply_lora_to_mlp=False, apply_lora_to_output=False, *, vocab_size, num_layers, num_heads, num_kv_heads, embed_dim, intermediate_dim, max_seq_len, attn_dropout=0.0, norm_eps=1e-05, rope_base=10000, lora_rank, lora_alpha, lora_dropout=0.0, use_dora=False, quantize_base=False):
    ...
