from torchtune.models.gemma2._component_builders import gemma2, lora_gemma2

def gemma2_2b():
    return gemma2(vocab_size=256000, num_layers=26, num_heads=8, head_dim=256, num_kv_heads=4, embed_dim=2304, intermediate_dim=9216, max_seq_len=8192, attn_dropout=0.0, norm_eps=1e-06, hidden_capping_value=30.0, final_capping_value=50.0, sliding_window_size=4096)
qlora_gemma2_2b = partial(lora_gemma2_2b, quantize_base=True)

def gemma2_9b():
    return gemma2(vocab_size=256000, num_layers=42, num_heads=16, head_dim=256, num_kv_heads=8, embed_dim=3584, intermediate_dim=14336, max_seq_len=8192, attn_dropout=0.0, norm_eps=1e-06, hidden_capping_value=30.0, final_capping_value=50.0, sliding_window_size=4096)
qlora_gemma2_9b = partial(lora_gemma2_9b, quantize_base=True)

def gemma2_27b():
    return gemma2(vocab_size=256000, num_layers=46, num_heads=32, head_dim=128, num_kv_heads=16, embed_dim=4608, intermediate_dim=36864, max_seq_len=8192, attn_dropout=0.0, norm_eps=1e-06, hidden_capping_value=30.0, final_capping_value=50.0, sliding_window_size=4096, query_pre_attn_scalar=144)
qlora_gemma2_27b = partial(lora_gemma2_27b, quantize_base=True)
