from torchtune.models.gemma.rms_norm import GemmaRMSNorm
from torchtune.models.gemma.gemma_norm_embedding import GemmaNormEmbeddings

def gemma(vocab_size, num_layers, num_heads, head_dim, num_kv_heads, embed_dim, intermediate_dim, max_seq_len, attn_dropout=0.0, norm_eps=1e-06, rope_base=10000):
    ...

def lora_gemma(lora_attn_modules, apply_lora_to_mlp=False, *, vocab_size, num_layers, num_heads, head_dim, num_kv_heads, embed_dim, intermediate_dim, max_seq_len, attn_dropout=0.0, norm_eps=1e-06, rope_base=10000, lora_rank, lora_alpha, lora_dropout=0.0, use_dora=False, quantize_base=False):
    ...
