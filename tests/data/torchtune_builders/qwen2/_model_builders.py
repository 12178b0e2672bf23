from torchtune.models.qwen2._component_builders import lora_qwen2, qwen2
from torchtune.models.qwen2._tokenizer import QWEN2_SPECIAL_TOKENS, Qwen2Tokenizer

def qwen2_7b():
    return qwen2(vocab_size=152064, num_layers=28, num_heads=28, num_kv_heads=4, embed_dim=3584, intermediate_dim=18944, max_seq_len=32768, attn_dropout=0.0, norm_eps=1e-06, rope_base=1000000.0)

def qwen2_0_5b():
    return qwen2(vocab_size=151936, num_layers=24, num_heads=14, num_kv_heads=2, embed_dim=896, intermediate_dim=4864, max_seq_len=32768, attn_dropout=0.0, norm_eps=1e-06, rope_base=1000000.0, tie_word_embeddings=True)

def qwen2_1_5b():
    return qwen2(vocab_size=151936, num_layers=28, num_heads=12, num_kv_heads=2, embed_dim=1536, intermediate_dim=8960, max_seq_len=32768, attn_dropout=0.0, norm_eps=1e-06, rope_base=1000000.0, tie_word_embeddings=True)
