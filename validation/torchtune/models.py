"""torchtune model builders measured, with their canonical architecture (/work/shared/CONTRACT.md)."""

from __future__ import annotations

from dataclasses import dataclass

from ..hf.models import CANONICAL_DEFAULTS, MODELS, _dense


@dataclass(frozen=True)
class TuneModel:
    id: str
    builder: str  # "module:function" under torchtune.models
    kwargs: tuple = ()  # keyword arguments of the builder, as (name, value) pairs
    canonical: dict | None = None  # beyond CANONICAL_DEFAULTS; None: that of validation.models
    lora_builder: str = ""  # the same model with LoRA layers ("module:function")

    def build(self, lora: dict | None = None):
        """The full model, or with `lora` (the LoRA builder's keyword arguments) the LoRA one."""
        import importlib

        module, name = (self.lora_builder if lora is not None else self.builder).split(":")
        builder = getattr(importlib.import_module(f"torchtune.models.{module}"), name)
        return builder(**dict(self.kwargs), **(lora or {}))

    def architecture(self) -> dict:
        if self.canonical is None:
            return MODELS[self.id].architecture()
        arch = dict(CANONICAL_DEFAULTS, **self.canonical, name=self.id)
        return {k: v for k, v in arch.items() if v is not None}


def _tiny(family: str, **extra) -> tuple:
    """A 2-layer model of a family's component builder, for the fake-versus-real self-test."""
    return tuple(dict(vocab_size=1000, num_layers=2, num_heads=4, num_kv_heads=2, embed_dim=64,
                      intermediate_dim=160, max_seq_len=512, **extra).items())


TUNE_MODELS = {m.id: m for m in [
    # same published configs as the HF records
    TuneModel("llama-3.1-8b", "llama3_1:llama3_1_8b", lora_builder="llama3_1:lora_llama3_1_8b"),
    TuneModel("qwen2.5-7b", "qwen2_5:qwen2_5_7b_base", lora_builder="qwen2_5:lora_qwen2_5_7b_base"),
    # torchtune/models/llama3_2/_model_builders.py llama3_2_3b: tied embeddings
    TuneModel("llama-3.2-3b", "llama3_2:llama3_2_3b",
              canonical=_dense(3072, 28, 24, 8, 128, 8192, 128256, tie_embeddings=True),
              lora_builder="llama3_2:lora_llama3_2_3b"),
    TuneModel("tiny-llama3_1", "llama3_1:llama3_1", _tiny("llama3_1"),
              canonical=_dense(64, 2, 4, 2, 16, 160, 1000), lora_builder="llama3_1:lora_llama3_1"),
    # NF4 needs each quantized weight's numel to be a multiple of 64 x 256: dim 256, 2 KV heads of 64
    TuneModel("tiny-llama3_1-256", "llama3_1:llama3_1",
              tuple(dict(_tiny("llama3_1"), embed_dim=256, intermediate_dim=512).items()),
              canonical=_dense(256, 2, 4, 2, 64, 512, 1000), lora_builder="llama3_1:lora_llama3_1"),
    TuneModel("tiny-qwen2", "qwen2:qwen2", _tiny("qwen2", tie_word_embeddings=False),
              canonical=_dense(64, 2, 4, 2, 16, 160, 1000, qkv_bias=True), lora_builder="qwen2:lora_qwen2"),
    TuneModel("tiny-llama3_2", "llama3_2:llama3_2", _tiny("llama3_2", tie_word_embeddings=True),
              canonical=_dense(64, 2, 4, 2, 16, 160, 1000, tie_embeddings=True)),
]}
