from torchtune.models.gemma2._attention import Gemma2Attention
from torchtune.models.gemma.rms_norm import GemmaRMSNorm
from torchtune.models.gemma.gemma_norm_embedding import GemmaNormEmbeddings
from torchtune.models.gemma._component_builders import gemma_mlp, lora_gemma_mlp

def gemma2(vocab_size, num_layers, num_heads, head_dim, num_kv_heads, embed_dim, intermediate_dim, max_seq_len, attn_dropout=0.0, norm_eps=1e-06, rope_base=10000, hidden_capping_value=50.0, final_capping_value=30.0, sliding_window_size=4096, query_pre_attn_scalar=None):
    ...

def lora_gemma2(lora_attn_modules, apply_lora_to_mlp=False, *, vocab_size, num_layers, num_heads, head_dim, num_kv_heads, embed_dim, intermediate_dim, max_seq_len, attn_dropout=0.0, norm_eps=1e-06, rope_base=10000, hidden_capping_value=50.0, final_capping_value=30.0, sliding_window_size=4096, query_pre_attn_scalar=None, lora_rank, lora_alpha, lora_dropout=0.0, use_dora=False, quantize_base=False):
    ...
