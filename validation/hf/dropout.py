"""The model config's own dropouts under the HF Trainer (issue: a config's residual and embedding dropouts):
decoders whose transformers 5.23 modelling code drops out more than the attention probabilities, built from
the shape of a published config.json with fewer layers, their dropouts set to `Run.dropout`.

- Phi-3 (models/phi3/modeling_phi3.py Phi3DecoderLayer): resid_attn_dropout and resid_mlp_dropout
  (config.resid_pdrop) on the attention and MLP outputs before each residual add; config.embd_pdrop is read
  by Phi3Config but applied nowhere.
- GPT-2 (models/gpt2/modeling_gpt2.py): GPT2Model.drop (embd_pdrop) on the token plus position embeddings,
  GPT2Attention.resid_dropout and GPT2MLP.dropout (resid_pdrop) on each block's two outputs.
- GPT-NeoX (models/gpt_neox/modeling_gpt_neox.py): emb_dropout, post_attention_dropout and post_mlp_dropout,
  all config.hidden_dropout.
- StarCoder2 (models/starcoder2/modeling_starcoder2.py): embedding_dropout on the embeddings, residual_dropout
  after o_proj and after the MLP's c_proj.
- Falcon (models/falcon/modeling_falcon.py FalconDecoderLayer): dropout_add(mlp_output, residual,
  config.hidden_dropout) once per layer with parallel attention (falcon-7b); none on the embeddings.

On CUDA every one of them runs ATen's fused native_dropout, which keeps a bool mask of its input's shape
(validation/peft/step.py `cuda_dropout` routes F.dropout to it, as the CPU build does not).

The canonical architecture is the estimator's own reading of the same config.json
(estimator/models/hf_config.py), so the record's configuration is what a user who loads the file gets.
"""

from __future__ import annotations

from dataclasses import dataclass

# the config keys each family drops out with besides the attention probabilities (transformers 5.23)
DROPOUT_KEYS = {
    "phi3": ("resid_pdrop", "embd_pdrop"), "gpt2": ("resid_pdrop", "embd_pdrop"), "gpt_neox": ("hidden_dropout",),
    "starcoder2": ("residual_dropout", "embedding_dropout"), "falcon": ("hidden_dropout",),
}
# the attention dropout, left at 0 here (training.dropout's, measured in validation/peft)
ATTENTION_KEYS = {"gpt2": "attn_pdrop"}


@dataclass(frozen=True)
class HubModel:
    id: str
    hf: dict  # config.json keys, model_type included; the layer count cut to keep the fake run short

    def config_dict(self, dropout: float) -> dict:
        keys = DROPOUT_KEYS[self.hf["model_type"]]
        attention = ATTENTION_KEYS.get(self.hf["model_type"], "attention_dropout")
        return {**self.hf, **{k: dropout for k in keys}, attention: 0.0}

    def hf_config(self, attn_implementation: str, dropout: float = 0.0):
        from transformers import AutoConfig

        config = AutoConfig.for_model(**self.config_dict(dropout))
        config._attn_implementation = attn_implementation
        config.use_cache = False  # the Trainer's setting: no cache in training
        return config

    def architecture(self, dropout: float = 0.0, sdpa: bool = False) -> dict:
        """The estimator's fields of the model as its reader gives them; Falcon's SDPA mask (sdpa_mask_always) only
        for a run on SDPA (`sdpa`): under eager and flash_attention_2 nothing reads it, and their records leave it
        out."""
        from dataclasses import fields, replace

        from estimator.models.hf_config import architecture_from_hf_config

        arch, _ = architecture_from_hf_config(self.config_dict(dropout), self.id)
        arch = arch if sdpa else replace(arch, sdpa_mask_always=False)
        return {f.name: getattr(arch, f.name) for f in fields(arch)
                if getattr(arch, f.name) != f.default or f.name in ("hidden_size", "num_layers")}


MODELS = {m.id: m for m in [
    # microsoft/Phi-3-mini-4k-instruct's shape (its sliding window of 2047 left out: global attention)
    HubModel("phi-3-mini-8layers", dict(
        model_type="phi3", hidden_size=3072, intermediate_size=8192, num_hidden_layers=8, num_attention_heads=32,
        num_key_value_heads=32, vocab_size=32064, max_position_embeddings=4096, rms_norm_eps=1e-5,
        tie_word_embeddings=False, sliding_window=None, hidden_act="silu")),
    # openai-community/gpt2-medium
    HubModel("gpt2-medium-8layers", dict(
        model_type="gpt2", n_embd=1024, n_layer=8, n_head=16, vocab_size=50257, n_positions=1024,
        activation_function="gelu_new")),
    # EleutherAI/pythia-1.4b
    HubModel("pythia-1.4b-8layers", dict(
        model_type="gpt_neox", hidden_size=2048, intermediate_size=8192, num_hidden_layers=8, num_attention_heads=16,
        vocab_size=50304, max_position_embeddings=2048, rotary_pct=0.25, rotary_emb_base=10000,
        use_parallel_residual=True, hidden_act="gelu", tie_word_embeddings=False, layer_norm_eps=1e-5)),
    # bigcode/starcoder2-3b's shape (its sliding window of 4096 left out: global attention)
    HubModel("starcoder2-3b-8layers", dict(
        model_type="starcoder2", hidden_size=3072, intermediate_size=12288, num_hidden_layers=8,
        num_attention_heads=24, num_key_value_heads=2, vocab_size=49152, max_position_embeddings=16384,
        sliding_window=None, use_bias=True, hidden_act="gelu_pytorch_tanh", norm_epsilon=1e-5,
        tie_word_embeddings=True, rope_theta=999999.4420358813)),
    # tiiuae/falcon-7b
    HubModel("falcon-7b-8layers", dict(
        model_type="falcon", hidden_size=4544, num_hidden_layers=8, num_attention_heads=71, multi_query=True,
        parallel_attn=True, new_decoder_architecture=False, bias=False, alibi=False, vocab_size=65024,
        layer_norm_epsilon=1e-5, tie_word_embeddings=True)),
    # tiiuae/falcon-40b: the new decoder architecture, 8 key/value groups of 16 query heads
    HubModel("falcon-40b-8layers", dict(
        model_type="falcon", hidden_size=8192, num_hidden_layers=8, num_attention_heads=128, num_kv_heads=8,
        new_decoder_architecture=True, parallel_attn=True, bias=False, alibi=False, vocab_size=65024,
        layer_norm_epsilon=1e-5, tie_word_embeddings=True)),
    # Tiny ones for the fake-versus-real cross-check (tests/test_harness.py): 2 layers, hidden 64
    HubModel("tiny-phi3", dict(model_type="phi3", hidden_size=64, intermediate_size=160, num_hidden_layers=2,
                               num_attention_heads=4, num_key_value_heads=2, vocab_size=1000,
                               max_position_embeddings=512, sliding_window=None, tie_word_embeddings=False,
                               pad_token_id=None, bos_token_id=None, eos_token_id=None)),
    HubModel("tiny-gpt2", dict(model_type="gpt2", n_embd=64, n_layer=2, n_head=4, vocab_size=1000, n_positions=512)),
    HubModel("tiny-neox", dict(model_type="gpt_neox", hidden_size=64, intermediate_size=256, num_hidden_layers=2,
                               num_attention_heads=4, vocab_size=1000, max_position_embeddings=512, rotary_pct=0.25)),
    HubModel("tiny-starcoder2", dict(model_type="starcoder2", hidden_size=64, intermediate_size=256,
                                     num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                     vocab_size=1000, max_position_embeddings=512, sliding_window=None)),
    HubModel("tiny-falcon", dict(model_type="falcon", hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                 vocab_size=1000)),
    HubModel("tiny-falcon-new", dict(model_type="falcon", hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                     num_kv_heads=2, new_decoder_architecture=True, vocab_size=1000)),
]}
