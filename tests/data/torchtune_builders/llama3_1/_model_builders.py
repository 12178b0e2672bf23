from torchtune.models.llama3_1._component_builders import llama3_1, lora_llama3_1

def llama3_1_8b():
    return llama3_1(vocab_size=128256, num_layers=32, num_heads=32, num_kv_heads=8, embed_dim=4096, max_seq_len=131072, intermediate_dim=14336, attn_dropout=0.0, norm_eps=1e-05, rope_base=500000)

def llama3_1_70b():
    return llama3_1(vocab_size=128256, num_layers=80, num_heads=64, num_kv_heads=8, embed_dim=8192, max_seq_len=131072, intermediate_dim=28672, attn_dropout=0.0, norm_eps=1e-05, rope_base=500000)

def llama3_1_405b():
    return llama3_1(vocab_size=128256, num_layers=126, num_heads=128, num_kv_heads=8, embed_dim=16384, max_seq_len=131072, intermediate_dim=53248, attn_dropout=0.0, norm_eps=1e-05, rope_base=500000)
qlora_llama3_1_8b = partial(lora_llama3_1_8b, quantize_base=True)
qlora_llama3_1_70b = partial(lora_llama3_1_70b, quantize_base=True)
qlora_llama3_1_405b = partial(lora_llama3_1_405b, quantize_base=True)
