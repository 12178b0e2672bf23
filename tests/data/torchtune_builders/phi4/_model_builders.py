from torchtune.models.phi3._component_builders import lora_phi3, phi3
from torchtune.models.phi4._tokenizer import Phi4Tokenizer

def phi4_14b():
    return phi3(vocab_size=100352, num_layers=40, num_heads=40, num_kv_heads=10, embed_dim=5120, intermediate_dim=17920, max_seq_len=16384, attn_dropout=0.0, norm_eps=1e-05)
qlora_phi4_14b = partial(lora_phi4_14b, quantize_base=True)
