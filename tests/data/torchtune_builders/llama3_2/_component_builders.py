from torchtune.models.llama3._model_utils import scale_hidden_dim_for_mlp
from torchtune.models.llama3_1._position_embeddings import Llama3ScaledRoPE

def llama3_2(vocab_size, num_layers, num_heads, num_kv_heads, embed_dim, max_seq_len, attn_dropout=0.0, rope_base=500000, intermediate_dim=None, norm_eps=1e-05, scale_factor=32, tie_word_embeddings=True):
    ...

def lora_llama3_2(lora_attn_modules, apply_lora_to_mlp=False, apply_lora_to_output=False, *, vocab_size, num_layers, num_heads, num_kv_heads, embed_dim, max_seq_len, intermediate_dim=None, attn_dropout=0.0, norm_eps=1e-05, rope_base=500000, scale_factor=32, lora_rank, lora_alpha, lora_dropout=0.0, use_dora=False, quantize_base=False, tie_word_embeddings=True):
    ...
