from torchtune.models.phi3._component_builders import phi3, lora_phi3
from torchtune.models.phi3._tokenizer import Phi3MiniTokenizer

def phi3_mini():
    return phi3(vocab_size=32064, num_layers=32, num_heads=32, num_kv_heads=32, embed_dim=3072, intermediate_dim=8192, max_seq_len=4096, attn_dropout=0.0, norm_eps=1e-05)
qlora_phi3_mini = partial(lora_phi3_mini, quantize_base=True)
