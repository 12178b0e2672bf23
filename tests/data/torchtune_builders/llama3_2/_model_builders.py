from torchtune.models.llama3_2._component_builders import llama3_2, lora_llama3_2

def llama3_2_1b():
    return llama3_2(vocab_size=128256, num_layers=16, num_heads=32, num_kv_heads=8, embed_dim=2048, max_seq_len=131072, intermediate_dim=8192, attn_dropout=0.0, norm_eps=1e-05, rope_base=500000, scale_factor=32)

def llama3_2_3b():
    return llama3_2(vocab_size=128256, num_layers=28, num_heads=24, num_kv_heads=8, embed_dim=3072, max_seq_len=131072, intermediate_dim=8192, attn_dropout=0.0, norm_eps=1e-05, rope_base=500000, scale_factor=32)
qlora_llama3_2_1b = partial(lora_llama3_2_1b, quantize_base=True)
qlora_llama3_2_3b = partial(lora_llama3_2_3b, quantize_base=True)
