from torchtune.models.qwen2._component_builders import lora_qwen2, qwen2
from torchtune.models.qwen2_5._tokenizer import QWEN2_5_SPECIAL_TOKENS, Qwen2_5Tokenizer

def qwen2_5_0_5b():
    return qwen2(vocab_size=151936, num_layers=24, num_heads=14, num_kv_heads=2, embed_dim=896, intermediate_dim=4864, max_seq_len=32768, attn_dropout=0.0, norm_eps=1e-06, rope_base=1000000.0, tie_word_embeddings=True)

def qwen2_5_1_5b_base():
    return qwen2(vocab_size=151936, num_layers=28, num_heads=12, num_kv_heads=2, embed_dim=1536, intermediate_dim=8960, max_seq_len=131072, attn_dropout=0.0, norm_eps=1e-06, rope_base=1000000.0, tie_word_embeddings=True)

def qwen2_5_1_5b_instruct():
    return qwen2(vocab_size=151936, num_layers=28, num_heads=12, num_kv_heads=2, embed_dim=1536, intermediate_dim=8960, max_seq_len=32768, attn_dropout=0.0, norm_eps=1e-06, rope_base=1000000.0, tie_word_embeddings=True)

def qwen2_5_3b():
    return qwen2(vocab_size=151936, num_layers=36, num_heads=16, num_kv_heads=2, embed_dim=2048, intermediate_dim=11008, max_seq_len=32768, attn_dropout=0.0, norm_eps=1e-06, rope_base=1000000.0, tie_word_embeddings=True)

def qwen2_5_7b_base():
    return qwen2(vocab_size=152064, num_layers=28, num_heads=28, num_kv_heads=4, embed_dim=3584, intermediate_dim=18944, max_seq_len=131072, attn_dropout=0.0, norm_eps=1e-06, rope_base=1000000.0)

def qwen2_5_7b_instruct():
    return qwen2(vocab_size=152064, num_layers=28, num_heads=28, num_kv_heads=4, embed_dim=3584, intermediate_dim=18944, max_seq_len=32768, attn_dropout=0.0, norm_eps=1e-06, rope_base=1000000.0)

def qwen2_5_14b_base():
    return qwen2(vocab_size=152064, num_layers=48, num_heads=40, num_kv_heads=8, embed_dim=5120, intermediate_dim=13824, max_seq_len=131072, attn_dropout=0.0, norm_eps=1e-05, rope_base=1000000.0)

def qwen2_5_14b_instruct():
    return qwen2(vocab_size=152064, num_layers=48, num_heads=40, num_kv_heads=8, embed_dim=5120, intermediate_dim=13824, max_seq_len=32768, attn_dropout=0.0, norm_eps=1e-06, rope_base=1000000.0)

def qwen2_5_32b_base():
    return qwen2(vocab_size=152064, num_layers=64, num_heads=40, num_kv_heads=8, embed_dim=5120, intermediate_dim=27648, max_seq_len=131072, attn_dropout=0.0, norm_eps=1e-05, rope_base=1000000.0)

def qwen2_5_32b_instruct():
    return qwen2(vocab_size=152064, num_layers=64, num_heads=40, num_kv_heads=8, embed_dim=5120, intermediate_dim=27648, max_seq_len=32768, attn_dropout=0.0, norm_eps=1e-06, rope_base=1000000.0)

def qwen2_5_72b_base():
    return qwen2(vocab_size=152064, num_layers=80, num_heads=64, num_kv_heads=8, embed_dim=8192, intermediate_dim=29568, max_seq_len=131072, attn_dropout=0.0, norm_eps=1e-05, rope_base=1000000.0)

def qwen2_5_72b_instruct():
    return qwen2(vocab_size=152064, num_layers=80, num_heads=64, num_kv_heads=8, embed_dim=8192, intermediate_dim=29568, max_seq_len=32768, attn_dropout=0.0, norm_eps=1e-06, rope_base=1000000.0)
