"""A Hugging Face config's dropout probabilities: which the architecture carries and which are notes.

The attention dropout (``attention_dropout``, GPT-2's ``attn_pdrop``) is the training's: under the
transformers frameworks `training.dropout` stands for it (memory/activations/entries.py
`RESIDUAL_DROPOUT_SOURCE`), so a non-zero one is a note asking for it. The others are the model's: where
transformers 5.23's modelling code applies them they become the Architecture's ``attention_residual_dropout``,
``mlp_residual_dropout`` and ``embedding_dropout`` (memory/activations/entries.py `config_dropout` charges
their masks):

- phi3 (models/phi3/modeling_phi3.py Phi3DecoderLayer): ``resid_pdrop`` on the attention and the MLP
  output; Phi3Config's ``embd_pdrop`` is applied nowhere (a note).
- gpt2 (models/gpt2/modeling_gpt2.py): ``resid_pdrop`` in GPT2Attention and GPT2MLP, ``embd_pdrop`` in
  GPT2Model; GPT2Config's defaults are 0.1.
- gpt_neox (models/gpt_neox/modeling_gpt_neox.py): ``hidden_dropout`` on the embeddings and both outputs.
- starcoder2 (models/starcoder2/modeling_starcoder2.py): ``residual_dropout`` after o_proj and the MLP's
  c_proj, ``embedding_dropout`` on the embeddings.
- falcon (models/falcon/modeling_falcon.py FalconDecoderLayer): ``dropout_add(mlp_output, residual,
  hidden_dropout)`` once per layer; without parallel attention (neither ``parallel_attn`` nor
  ``new_decoder_architecture``) the attention output goes through ``dropout_add(..., attention_dropout)``
  first. No embedding dropout.
"""

from __future__ import annotations

from typing import Any

from ..spec.errors import ConfigError

ATTENTION_DROPOUTS = ("attention_dropout", "attn_pdrop")
# the keys each family reads (transformers 5.23), their config class's default where it is not 0
_DEFAULTS = {"gpt2": {"resid_pdrop": 0.1, "embd_pdrop": 0.1, "attn_pdrop": 0.1}}
_UNUSED = {"phi3": ("embd_pdrop",)}  # read by the config class, applied by no module


def _p(config: dict, model_type: str, key: str, prefix: str) -> float:
    value = config.get(key, _DEFAULTS.get(model_type, {}).get(key, 0.0))
    if value is None:
        return 0.0
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < 1:
        raise ConfigError(f"{prefix}{key}", value, "a dropout probability, a number >= 0 and below 1")
    return float(value)


def _falcon_parallel(config: dict) -> bool:
    return bool(config.get("new_decoder_architecture", False)) or bool(config.get("parallel_attn", True))


def config_dropouts(config: dict, model_type: str, prefix: str = "model.") -> tuple[dict[str, Any], list[str]]:
    """The architecture's dropout fields of a config (module docstring) and the notes on the others."""
    p = lambda key: _p(config, model_type, key, prefix)  # noqa: E731
    fields: dict[str, Any] = {}
    if model_type in ("phi3", "gpt2"):
        fields = dict(attention_residual_dropout=p("resid_pdrop"), mlp_residual_dropout=p("resid_pdrop"))
        if model_type == "gpt2":
            fields["embedding_dropout"] = p("embd_pdrop")
    elif model_type == "gpt_neox":
        fields = dict.fromkeys(("attention_residual_dropout", "mlp_residual_dropout", "embedding_dropout"),
                               p("hidden_dropout"))
    elif model_type == "starcoder2":
        fields = dict(attention_residual_dropout=p("residual_dropout"), mlp_residual_dropout=p("residual_dropout"),
                      embedding_dropout=p("embedding_dropout"))
    elif model_type == "falcon":
        fields = dict(mlp_residual_dropout=p("hidden_dropout"))
        if not _falcon_parallel(config):
            fields["attention_residual_dropout"] = p("attention_dropout")
    notes = []
    for key in ATTENTION_DROPOUTS:
        if key in config or key in _DEFAULTS.get(model_type, {}):
            value = p(key)
            if value > 0:
                notes.append(f"{key} {value:g} (set training.dropout to count it)")
    for key in _UNUSED.get(model_type, ()):
        if p(key) > 0:
            notes.append(f"{key} {p(key):g} ({model_type}'s modelling code applies it nowhere: no mask)")
    return {k: v for k, v in fields.items() if v > 0}, notes
