"""Tiny models for the fake-versus-real self-test (tests/test_harness_peft.py)."""

from __future__ import annotations

from ..hf.models import MODELS, Model, _dense

TINY = {m.id: m for m in [
    MODELS["tiny-llama"],
    MODELS["tiny-mixtral"],
    # one fused q, k, v linear (build.py FUSED_QKV): GPT-2's c_attn (a Conv1D) and Falcon's query_key_value
    MODELS["tiny-gpt2"],
    MODELS["tiny-falcon"],
    # NF4 needs every quantized weight's numel to be a multiple of 64 x 256 (torchao's block and
    # scaler block): hidden 256 with 2 KV heads of 64 makes the smallest, k_proj 128 x 256.
    Model("tiny-llama-256", "LlamaConfig", dict(
        hidden_size=256, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        head_dim=64, intermediate_size=512, vocab_size=1000, max_position_embeddings=512,
        tie_word_embeddings=False), _dense(256, 2, 4, 2, 64, 512, 1000)),
]}
