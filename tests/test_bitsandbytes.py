"""QLoRA on bitsandbytes (the HF Trainer's and DeepSpeed's stack), by hand: NF4 storage with and without
double quantization, and what the 4-bit layer keeps by release. bitsandbytes' MatMul4Bit keeps its input A
for backward through 0.43.1 (autograd/_functions.py ``ctx.tensors = (A, B)``) and nothing of it from 0.43.2
on (commit 9e753741, PR #1270 "fix QLoRA mem bug: delete useless buffered activation"); the measured
records (tests/data/measured/peft/*-bnb0.43.1, *-nodq) are held in tests/test_accuracy.py."""

from __future__ import annotations

import pytest

from estimator import estimate_config
from estimator.spec.errors import ConfigError

ALL_SEVEN = ["q", "k", "v", "o", "gate", "up", "down"]
S, H, F, LAYERS = 2048, 4096, 14336, 32  # Llama-3.1-8B at 2048 tokens
# Llama-3.1-8B's 224 linears of the layers: q and o 4096 x 4096, k and v 1024 x 4096, gate, up, down 14336 x 4096
QUANTIZED = LAYERS * (2 * H * H + 2 * 1024 * H + 3 * F * H)


def qlora(recompute: str = "none", framework: str = "hf", **adapter) -> dict:
    return {"model": "llama-3.1-8b", "training": {"framework": framework, "seq_len": S, "recompute": recompute,
                                                  "adapter": {"method": "qlora", "target_modules": ALL_SEVEN,
                                                              **adapter}}}


def forward_activations(cfg: dict) -> int:
    stage = estimate_config(cfg).stages[0]
    return next(c.bytes for p in stage.phases if p.name == "forward" for c in p.components if c.key == "activations")


def parameters(cfg: dict) -> int:
    stage = estimate_config(cfg).stages[0]
    return next(c.bytes for p in stage.phases if p.name == "optimizer" for c in p.components if c.key == "parameters")


def test_nf4_without_double_quantization_costs_an_fp32_scale_per_64_weights():
    assert QUANTIZED == 6_979_321_856
    # per weight 0.5 + 4/64 B and a 16-entry fp32 code book (512 B); double-quantized 0.5 + 1/64 + 4/16384 B
    # and three 512-byte allocations (the code book, the offset, the copied 256-entry dynamic code)
    plain = QUANTIZED * (0.5 + 4 / 64) + 224 * 512
    nested = QUANTIZED * (0.5 + 1 / 64 + 4 / 16384) + 224 * 2048
    assert parameters(qlora(double_quant=False)) - parameters(qlora()) == round(plain - nested)
    assert plain - nested == 325_107_712


def test_bitsandbytes_0_43_1_keeps_each_4bit_linears_input():
    # per layer: the attention norm's output (q, k, v's input), the MLP norm's (gate, up) and the gated
    # product (down), bf16; o's input is flash attention's output, kept anyway. The first layer's q, k, v
    # input needs no gradient (frozen embeddings, no checkpointing), so MatMul4Bit keeps nothing there.
    per_layer = 2 * S * H + 2 * S * H + 2 * S * F
    extra = forward_activations(qlora(bitsandbytes_version="0.43.1")) - forward_activations(qlora())
    assert extra == LAYERS * per_layer - 2 * S * H
    assert forward_activations(qlora(bitsandbytes_version="0.43.2")) == forward_activations(qlora())


def test_under_checkpointing_the_inputs_outlive_the_checkpoint():
    # ctx.tensors is an attribute of the autograd node, not a tensor saved for backward: the Trainer's
    # non-reentrant checkpoint cannot drop it, so every layer keeps its 4-bit linears' inputs, o's too
    per_layer = 2 * S * H + 2 * S * H + 2 * S * H + 2 * S * F
    extra = forward_activations(qlora("full", bitsandbytes_version="0.43.1")) - forward_activations(qlora("full"))
    assert extra == LAYERS * per_layer


def test_deepspeed_runs_bitsandbytes_too_and_torchtune_its_own_nf4():
    # DeepSpeed's bf16 adapters on q and v read the attention norm's output as it is (kept for lora_A anyway):
    # the old release adds the MLP's 4-bit inputs only
    old = qlora(framework="deepspeed", bitsandbytes_version="0.43.1", target_modules=["q", "v"])
    extra = forward_activations(old) - forward_activations(qlora(framework="deepspeed", target_modules=["q", "v"]))
    assert extra == LAYERS * (2 * S * H + 2 * S * F)
    for adapter, field in (({"double_quant": False}, "training.adapter.double_quant"),
                           ({"bitsandbytes_version": "0.43.1"}, "training.adapter.bitsandbytes_version")):
        with pytest.raises(ConfigError) as err:
            estimate_config(qlora(framework="torchtune", **adapter))
        assert err.value.field == field and "torchtune" in str(err.value)


@pytest.mark.parametrize("adapter, words", [
    ({"method": "lora", "double_quant": False}, "unless the base is NF4"),
    ({"method": "lora", "bitsandbytes_version": "0.43.1"}, "unless the base is NF4"),
    ({"bitsandbytes_version": "0.38.1"}, "0.39.0 or later"),
    ({"bitsandbytes_version": "latest"}, "major.minor[.patch]"),
    ({"bitsandbytes_version": 0.43}, "major.minor[.patch]"),
])
def test_bad_bitsandbytes_settings_name_the_field(adapter, words):
    with pytest.raises(ConfigError) as err:
        estimate_config(qlora(**adapter))
    assert err.value.field.startswith("training.adapter.") and words in str(err.value)
