"""FP8 under fsdp2: torchao's Float8Linear as torchtitan converts a model to it (Float8LinearConverter), and
torchao's FSDP2 float8 all-gather, each by hand. The measured steps (tests/data/measured/torchtitan/*fp8*) are
held in tests/test_accuracy_frameworks.py."""

from __future__ import annotations

import pytest

from estimator import ConfigError, Parallel, Training, estimate_config
from estimator.activations import layer_entries
from estimator.presets import get_architecture

LLAMA_8B = get_architecture("llama-3.1-8b")
# Llama-3.1-8B: h = 4096, 8 KV heads of 128, f = 14336, 32 layers, vocab 128,256, untied
H, KV, F, V, LAYERS = 4096, 1024, 14336, 128256, 32
BLOCK_LINEAR = H * H + 2 * H * KV + H * H + 3 * H * F  # wq, wk, wv, wo, w1, w3, w2: 218,103,808
BLOCK_NORMS = 2 * H  # attention_norm, ffn_norm: 8,192
PARAMS = LAYERS * (BLOCK_LINEAR + BLOCK_NORMS) + 2 * V * H + H  # 8,030,261,248


def config(zero_stage: int = 3, **training) -> dict:
    return {"model": "llama-3.1-8b", "training": {"framework": "fsdp2", "seq_len": 2048, **training},
            "parallel": {"dp": 8, "zero_stage": zero_stage}}


def gathered(result, phase: str) -> int:
    parts = [p for c in next(p for p in result.stages[0].phases if p.name == phase).components
             for p in (c.parts or (c,)) if p.label == "Unsharded parameters in flight"]
    assert len(parts) == 1
    return parts[0].bytes


def test_the_hand_counts_are_llama_8b():
    assert (BLOCK_LINEAR, PARAMS) == (218_103_808, 8_030_261_248)
    assert estimate_config(config()).parameters_total == PARAMS


@pytest.mark.parametrize("recipe", ["rowwise", "tensorwise"])
def test_torchao_keeps_no_fp8_copy_of_the_weights(recipe):
    """Float8Linear keeps its weight as it is and casts it in each matmul (torchao/float8/float8_linear.py):
    the parameters stay fp32 shards, 4 B x 8,030,261,248 / 8, and no FP8 weight copies appear (with
    Transformer Engine under megatron they would: 2 B per linear weight)."""
    for fp8 in (False, True):
        step = next(p for p in estimate_config(config(fp8=fp8, fp8_recipe=recipe)).stages[0].phases
                    if p.name == "optimizer")
        keys = {c.key: c.bytes for c in step.components}
        assert keys["parameters"] == 4 * PARAMS // 8 == 4_015_130_624
        assert "fp8_weight_copies" not in keys


def test_torchao_saves_the_high_precision_gemm_inputs():
    """matmul_with_hp_or_float8_args.forward saves input_hp (torchao): the QKV input stays 2 B x s x b x h
    under fsdp2; Transformer Engine (megatron) saves its 1-byte FP8 copy."""
    s, par = 8192, Parallel(dp=8)

    def qkv_input(training: Training) -> float:
        return next(e for e in layer_entries(LLAMA_8B, training, par, "dense")
                    if e.name == "QKV projection input").bytes(par)

    assert qkv_input(Training(framework="fsdp2", seq_len=s, fp8=True, fp8_recipe="rowwise")) == 2 * s * H
    assert qkv_input(Training(framework="megatron", seq_len=s, fp8=True)) == 1 * s * H


def test_float8_all_gather_gathers_one_byte_per_linear_weight():
    """With torchao's enable_fsdp_float8_all_gather a block's linear weights arrive as float8 (1 B) and its
    two norms as bf16 (2 B): 2 B x 218,112,000 = 436,224,000 for a block without it, 218,120,192 with it.
    Backward holds a block and the prefetched one; forward ends with a block and the head unit
    (2 B x 128,256 x 4096, which stays bf16: lm_head is not a float8 linear)."""
    block_bf16 = 2 * (BLOCK_LINEAR + BLOCK_NORMS)
    block_fp8 = 1 * BLOCK_LINEAR + 2 * BLOCK_NORMS
    assert (block_bf16, block_fp8) == (436_224_000, 218_120_192)
    head = 2 * V * H
    plain = estimate_config(config(fp8=True, fp8_recipe="tensorwise"))
    fp8 = estimate_config(config(fp8=True, fp8_recipe="tensorwise", fp8_all_gather=True))
    assert gathered(plain, "backward") == 2 * block_bf16 == 872_448_000
    assert gathered(fp8, "backward") == 2 * block_fp8 == 436_240_384
    assert gathered(plain, "forward") == block_bf16 + head
    assert gathered(fp8, "forward") == block_fp8 + head == 1_268_793_344


def test_float8_all_gather_without_resharding_keeps_every_block_in_float8():
    """zero_stage 2 (reshard_after_forward=False): all 32 blocks stay gathered, at 1 B per linear weight,
    beside the bf16 root unit (embedding, final norm, head: 2 x 128,256 x 4096 + 4096 parameters)."""
    root = 2 * V * H + H
    result = estimate_config(config(zero_stage=2, fp8=True, fp8_recipe="tensorwise", fp8_all_gather=True))
    expected = LAYERS * (1 * BLOCK_LINEAR + 2 * BLOCK_NORMS) + 2 * root
    assert expected == 9_081_200_640
    assert gathered(result, "forward") == gathered(result, "backward") == expected


@pytest.mark.parametrize("training, zero, field, words", [
    (dict(fp8=True, fp8_recipe="mxfp8"), 3, "training.fp8_recipe", "'tensorwise' or 'rowwise' with framework 'fsdp2'"),
    (dict(framework="megatron", fp8=True, fp8_recipe="rowwise"), 0, "training.fp8_recipe",
     "'tensorwise' or 'mxfp8' or 'blockwise' with framework 'megatron'"),
    (dict(framework="deepspeed", fp8=True), 0, "training.fp8", "unless framework is 'megatron' or 'fsdp2'"),
    (dict(fp8=True, param_dtype="fp8"), 3, "training.param_dtype", "with fp8 under framework 'fsdp2'"),
    # torchao Float8LinearConfig.__post_init__: "enable_fsdp_float8_all_gather only supports tensorwise"
    (dict(fp8=True, fp8_recipe="rowwise", fp8_all_gather=True), 3, "training.fp8_all_gather",
     "unless fp8_recipe is 'tensorwise'"),
    (dict(fp8_all_gather=True), 3, "training.fp8_all_gather", "unless fp8 is true"),
    (dict(framework="megatron", fp8=True, fp8_all_gather=True), 0, "training.fp8_all_gather",
     "unless framework is 'fsdp2'"),
    (dict(fp8=True, fp8_all_gather=True), 0, "training.fp8_all_gather", "unless zero_stage is 2 or 3"),
])
def test_what_torchao_and_transformer_engine_refuse_is_refused(training, zero, field, words):
    cfg = config(zero_stage=zero, **training)
    with pytest.raises(ConfigError) as error:
        estimate_config(cfg)
    assert error.value.field == field and words in str(error.value)
