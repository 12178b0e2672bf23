from torchtune.models.qwen3._component_builders import lora_qwen3, qwen3
from torchtune.models.qwen3._tokenizer import QWEN3_SPECIAL_TOKENS, Qwen3Tokenizer

def qwen3_0_6b_base():
    return qwen3(vocab_size=151936, num_layers=28, num_heads=16, num_kv_heads=8, embed_dim=1024, intermediate_dim=3072, max_seq_len=32768, head_dim=128, attn_dropout=0.0, norm_eps=1e-06, rope_base=1000000.0, tie_word_embeddings=True, q_proj_bias=False, k_proj_bias=False, v_proj_bias=False, q_norm=True, k_norm=True)

def qwen3_0_6b_instruct():
    return qwen3(vocab_size=151936, num_layers=28, num_heads=16, num_kv_heads=8, embed_dim=1024, intermediate_dim=3072, max_seq_len=40960, head_dim=128, attn_dropout=0.0, norm_eps=1e-06, rope_base=1000000.0, tie_word_embeddings=True, q_proj_bias=False, k_proj_bias=False, v_proj_bias=False, q_norm=True, k_norm=True)

def qwen3_1_7b_base():
    return qwen3(vocab_size=151936, num_layers=28, num_heads=16, num_kv_heads=8, embed_dim=2048, intermediate_dim=6144, max_seq_len=32768, head_dim=128, attn_dropout=0.0, norm_eps=1e-06, rope_base=1000000.0, tie_word_embeddings=True, q_proj_bias=False, k_proj_bias=False, v_proj_bias=False, q_norm=True, k_norm=True)

def qwen3_1_7b_instruct():
    return qwen3(vocab_size=151936, num_layers=28, num_heads=16, num_kv_heads=8, embed_dim=2048, intermediate_dim=6144, max_seq_len=40960, head_dim=128, attn_dropout=0.0, norm_eps=1e-06, rope_base=1000000.0, tie_word_embeddings=True, q_proj_bias=False, k_proj_bias=False, v_proj_bias=False, q_norm=True, k_norm=True)

def qwen3_4b_base():
    return qwen3(vocab_size=151936, num_layers=36, num_heads=32, num_kv_heads=8, embed_dim=2560, intermediate_dim=9728, max_seq_len=32768, head_dim=128, attn_dropout=0.0, norm_eps=1e-06, rope_base=1000000.0, tie_word_embeddings=True, q_proj_bias=False, k_proj_bias=False, v_proj_bias=False, q_norm=True, k_norm=True)

def qwen3_4b_instruct():
    return qwen3(vocab_size=151936, num_layers=36, num_heads=32, num_kv_heads=8, embed_dim=2560, intermediate_dim=9728, max_seq_len=40960, head_dim=128, attn_dropout=0.0, norm_eps=1e-06, rope_base=1000000.0, tie_word_embeddings=True, q_proj_bias=False, k_proj_bias=False, v_proj_bias=False, q_norm=True, k_norm=True)

def qwen3_8b_base():
    return qwen3(vocab_size=151936, num_layers=36, num_heads=32, num_kv_heads=8, embed_dim=4096, intermediate_dim=12288, max_seq_len=32768, head_dim=128, attn_dropout=0.0, norm_eps=1e-06, rope_base=1000000.0, q_proj_bias=False, k_proj_bias=False, v_proj_bias=False, q_norm=True, k_norm=True)

def qwen3_8b_instruct():
    return qwen3(vocab_size=151936, num_layers=36, num_heads=32, num_kv_heads=8, embed_dim=4096, intermediate_dim=12288, max_seq_len=40960, head_dim=128, attn_dropout=0.0, norm_eps=1e-06, rope_base=1000000.0, q_proj_bias=False, k_proj_bias=False, v_proj_bias=False, q_norm=True, k_norm=True)

def qwen3_14b_base():
    return qwen3(vocab_size=151936, num_layers=40, num_heads=40, num_kv_heads=8, embed_dim=5120, intermediate_dim=17408, max_seq_len=32768, head_dim=128, attn_dropout=0.0, norm_eps=1e-06, rope_base=1000000.0, q_proj_bias=False, k_proj_bias=False, v_proj_bias=False, q_norm=True, k_norm=True)

def qwen3_14b_instruct():
    return qwen3(vocab_size=151936, num_layers=40, num_heads=40, num_kv_heads=8, embed_dim=5120, intermediate_dim=17408, max_seq_len=40960, head_dim=128, attn_dropout=0.0, norm_eps=1e-06, rope_base=1000000.0, q_proj_bias=False, k_proj_bias=False, v_proj_bias=False, q_norm=True, k_norm=True)

def qwen3_32b():
    return qwen3(vocab_size=151936, num_layers=64, num_heads=64, num_kv_heads=8, embed_dim=5120, intermediate_dim=25600, max_seq_len=40960, head_dim=128, attn_dropout=0.0, norm_eps=1e-06, rope_base=1000000.0, q_proj_bias=False, k_proj_bias=False, v_proj_bias=False, q_norm=True, k_norm=True)
