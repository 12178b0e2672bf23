from torchtune.models.gemma._component_builders import gemma, lora_gemma
from torchtune.models.gemma._tokenizer import GemmaTokenizer

def gemma_2b():
    return gemma(vocab_size=256000, num_layers=18, num_heads=8, head_dim=256, num_kv_heads=1, embed_dim=2048, intermediate_dim=16384, max_seq_len=8192, attn_dropout=0.0, norm_eps=1e-06)
qlora_gemma_2b = partial(lora_gemma_2b, quantize_base=True)

def gemma_7b():
    return gemma(vocab_size=256000, num_layers=28, num_heads=16, head_dim=256, num_kv_heads=16, embed_dim=3072, intermediate_dim=24576, max_seq_len=8192, attn_dropout=0.0, norm_eps=1e-06)
qlora_gemma_7b = partial(lora_gemma_7b, quantize_base=True)
