"""A model config's own residual and embedding dropouts under the transformers frameworks (estimator/models/
hf_dropout.py reads them; memory/activations/entries.py `config_dropout` charges them): each one a bool mask of
s x b x h bytes (CUDA's fused native_dropout), by hand against the HF harness's records of StarCoder2, Phi-3 and
GPT-NeoX with and without them (tests/data/measured/*-drop10, validation/hf/dropout.py)."""

import json
from pathlib import Path

import pytest

from estimator import estimate_config
from estimator.spec.architecture import Architecture
from validation.core.report import tensors_peak

MEASURED = Path(__file__).parent / "data" / "measured"


def record(name: str) -> dict:
    return json.loads((MEASURED / f"{name}.json").read_text())


def peak(config: dict) -> int:
    result = estimate_config(config)
    return tensors_peak(result.stages[result.peak_stage])


# (the pair of records, masks per layer, embedding mask): StarCoder2 drops out both residual branches and the
# embeddings, Phi-3 both branches (its embd_pdrop is applied nowhere), GPT-NeoX all three with hidden_dropout
@pytest.mark.parametrize("base, layer_masks, embedding_mask", [
    ("starcoder2-3b-8layers-bf16-adamw-norecompute-sdpa-s4096-b2", 2, 1),
    ("phi-3-mini-8layers-bf16-adamw-norecompute-sdpa-s4096-b2", 2, 0),
    ("pythia-1.4b-8layers-bf16-adamw-norecompute-sdpa-s4096-b2", 2, 1),
])
def test_each_dropout_keeps_a_one_byte_mask_per_token_and_hidden_unit(base, layer_masks, embedding_mask):
    plain, dropped = record(base), record(f"{base}-drop10")
    arch = plain["config"]["model"]
    tokens = 4096 * 2
    by_hand = (arch["num_layers"] * layer_masks + embedding_mask) * tokens * arch["hidden_size"]  # bool: 1 byte
    assert dropped["measured"]["peak_bytes"] - plain["measured"]["peak_bytes"] == by_hand
    assert peak(dropped["config"]) - peak(plain["config"]) == by_hand


def test_the_masks_are_the_transformers_frameworks_own():
    """Under Megatron-Core training.dropout rules (its hidden_dropout): the config's probabilities add nothing."""
    config = record("starcoder2-3b-8layers-bf16-adamw-norecompute-sdpa-s4096-b2-drop10")["config"]
    megatron = {**config, "training": {**config["training"], "framework": "megatron"}}
    plain = {**megatron, "model": {k: v for k, v in config["model"].items() if not k.endswith("_dropout")}}
    assert peak(megatron) == peak(plain)


def test_a_frozen_embedding_keeps_no_dropout_mask():
    """An adapter run's frozen embedding gives an output that needs no gradient: its dropout saves nothing."""
    config = record("starcoder2-3b-8layers-bf16-adamw-norecompute-sdpa-s4096-b2-drop10")["config"]
    lora = {**config, "training": {**config["training"], "adapter": {"method": "lora", "rank": 16},
                                   "grad_dtype": "fp32", "optimizer_dtype": "fp32"}}
    names = {line.name for line in estimate_config(lora).activation_ledger}
    assert "embedding dropout mask" not in names and "MLP residual dropout mask" in names


def test_a_dropout_probability_is_checked():
    from estimator import ConfigError
    with pytest.raises(ConfigError) as caught:
        Architecture(hidden_size=64, num_layers=2, num_attention_heads=4, vocab_size=100, intermediate_size=128,
                     embedding_dropout=1.0)
    assert "embedding_dropout" in str(caught.value.field)
