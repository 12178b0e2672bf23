from torchtune.models.llama2._model_utils import scale_hidden_dim_for_mlp

def llama2(vocab_size, num_layers, num_heads, num_kv_heads, embed_dim, max_seq_len, attn_dropout=0.0, intermediate_dim=None, norm_eps=1e-05, rope_base=10000.0):
    ...

def lora_llama2(lora_attn_modules, apply_lora_to_mlp=False, apply_lora_to_output=False, *, vocab_size, num_layers, num_heads, num_kv_heads, embed_dim, max_seq_len, intermediate_dim=None, attn_dropout=0.0, norm_eps=1e-05, lora_rank, lora_alpha, lora_dropout=0.0, use_dora=False, quantize_base=False):
    ...
