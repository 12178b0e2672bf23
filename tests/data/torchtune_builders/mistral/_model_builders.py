from torchtune.models.mistral._component_builders import mistral, lora_mistral, mistral_classifier, lora_mistral_classifier
from torchtune.models.mistral._tokenizer import MistralTokenizer

def mistral_7b():
    return mistral(vocab_size=32000, num_layers=32, num_heads=32, num_kv_heads=8, embed_dim=4096, intermediate_dim=14336, max_seq_len=32768, attn_dropout=0.0, norm_eps=1e-05)
qlora_mistral_7b = partial(lora_mistral_7b, quantize_base=True)
qlora_mistral_reward_7b = partial(lora_mistral_reward_7b, quantize_base=True)
