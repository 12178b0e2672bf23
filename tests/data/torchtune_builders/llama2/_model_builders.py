from torchtune.models.llama2._component_builders import llama2, lora_llama2, llama2_classifier, lora_llama2_classifier
from torchtune.models.llama2._tokenizer import Llama2Tokenizer

def llama2_7b():
    return llama2(vocab_size=32000, num_layers=32, num_heads=32, num_kv_heads=32, embed_dim=4096, max_seq_len=4096, attn_dropout=0.0, norm_eps=1e-05)
qlora_llama2_7b = partial(lora_llama2_7b, quantize_base=True)

def llama2_13b():
    return llama2(vocab_size=32000, num_layers=40, num_heads=40, num_kv_heads=40, embed_dim=5120, intermediate_dim=13824, max_seq_len=4096, attn_dropout=0.0, norm_eps=1e-05)
qlora_llama2_13b = partial(lora_llama2_13b, quantize_base=True)

def llama2_70b():
    return llama2(vocab_size=32000, num_layers=80, num_heads=64, num_kv_heads=8, embed_dim=8192, intermediate_dim=28672, max_seq_len=4096, attn_dropout=0.0, norm_eps=1e-05)
qlora_llama2_70b = partial(lora_llama2_70b, quantize_base=True)
qlora_llama2_reward_7b = partial(lora_llama2_7b, quantize_base=True)
