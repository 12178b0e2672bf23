"""FP8 under fsdp2: torchao's Float8Linear as torchtitan converts a model to it (Float8LinearConverter), and
torchao's FSDP2 float8 all-gather, each by hand. The measured steps (tests/data/measured/torchtitan/*fp8*) are
held in tests/test_accuracy.py."""

from __future__ import annotations

import pytest

from estimator import ConfigError, Parallel, Training, estimate_config
from estimator.memory.activations.layer import layer_entries
from estimator.models.presets import get_architecture

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
    (dict(fp8=True, fp8_recipe="blockwise"), 3, "training.fp8_recipe",
     "'tensorwise' or 'rowwise' or 'mxfp8' with framework 'fsdp2'"),
    (dict(fp8=True, fp8_recipe="mxfp8"), 3, "training.fp8_recipe", "'tensorwise' or 'rowwise' when compile is false"),
    (dict(fp8=True, fp8_recipe="mxfp8", compile=True, fp8_all_gather=True), 3, "training.fp8_all_gather",
     "unless fp8_recipe is 'tensorwise'"),
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


EXTRAS = ("the block's output gradient (sequence-parallel shard)", "its all-gather over TP", "float8 weight",
          "grad_input", "float8 grad_output for grad_input, and the one being made",
          "two fp32 copies of grad_output (to(float32) * scale, clamp)",
          "both float8 grad_outputs and the input's float8 copy", "two fp32 copies of the input",
          "output projection's output (full sequence)", "reduce-scatter's cat of it", "reduce-scatter output",
          "MLP norm output (sequence-parallel shard)")


def _block_backward(**training) -> dict[str, int]:
    """Llama-3.1-70B, TP 8 (sequence parallel), FSDP over 64, full AC, seq 8192: the backward phase's
    transient parts that a block's backward holds beyond its saved tensors, and their total."""
    result = estimate_config({"model": "llama-3.1-70b", "parallel": {"tp": 8, "dp": 64, "zero_stage": 3},
                              "training": {"framework": "fsdp2", "seq_len": 8192, "recompute": "full",
                                           "loss": "chunked", **training}})
    backward = next(p for p in result.stages[0].phases if p.name == "backward")
    parts = {q.label: q.bytes for c in backward.components if c.key == "transient" for q in c.parts}
    assert "One recomputed layer's activations" in parts  # the moment is a block's recomputation
    found = {label: b for label, b in parts.items() if label in EXTRAS}
    return found | {"total": sum(found.values())}


def test_eager_float8_casts_in_a_blocks_backward_by_hand():
    """torchao casts the down projection's grad_output (the all-gathered 8192 x 8192 bf16 gradient) to float8
    for grad_input: to(float32) * scale and the fp32 clamp exist together (2 x 4 B x 8192 x 8192 = 512 MiB)
    beside the float8 weight (8192 x 3584 / TP), grad_input
    (2 B x 8192 x 3584) and, for grad_weight, the first float8 grad_output while the second is made (2 x 1 B x
    8192 x 8192). With the gradient from the block above (its shard and its all-gather) that is 868 MiB; the
    per-tensor breakdown of the rowwise record's 2-layer run holds exactly these storages at that moment."""
    n_g, n_x = 8192 * 8192, 8192 * 28672 // 8
    grads = 2 * n_g // 8 + 2 * n_g
    parts = _block_backward(fp8=True, fp8_recipe="rowwise")
    assert parts["two fp32 copies of grad_output (to(float32) * scale, clamp)"] == 8 * n_g == 536_870_912
    assert parts["float8 grad_output for grad_input, and the one being made"] == 2 * n_g
    assert parts["float8 weight"] == n_x and parts["grad_input"] == 2 * n_x
    assert parts["total"] == grads + 10 * n_g + 3 * n_x == 910_163_968  # 868 MiB
    # the saved input's cast (8 B x 8192 x 3584 of fp32 copies) is smaller here; without float8 the end of the
    # recomputation is the largest moment: the down projection's output (full sequence), its cat for the
    # reduce-scatter, the reduce-scatter's output and the MLP norm's (sequence-parallel shards)
    assert _block_backward()["total"] == grads + 2 * 2 * n_g + 2 * 2 * n_g // 8 == 452_984_832


def test_compiled_blocks_fuse_the_casts():
    """torch.compile fuses torchao's casts into Inductor kernels (no fp32 copies), and the compiled blocks'
    buffers are Inductor's: no such component is listed."""
    assert _block_backward(fp8=True, fp8_recipe="rowwise", compile=True) == {"total": 0}


def test_the_roofline_times_the_float8_all_gather():
    """The roofline accepts fp8_all_gather (it refused it: its FP8-off copy kept the flag) and gathers the
    blocks' float8 linear weights at 1 B, their norms and the root unit (embedding, norm and head) at 2 B:
    ZeRO 3 gathers twice per micro-batch, 2 x 7/8 x (32 x 218,120,192 + 2 x (2 x 128,256 x 4096 + 4096))."""
    from estimator.speed.roofline import roofline

    def gather(**training):
        r = roofline(LLAMA_8B, Training(framework="fsdp2", seq_len=2048, fp8=True, fp8_recipe="tensorwise",
                                        **training), Parallel(dp=8, zero_stage=3))
        (c,) = [c for c in r.step.communication if c.name == "parameter all-gather"]
        return c.bytes, r.step.tokens_per_s_per_gpu

    bf16, plain_speed = gather()
    fp8, fp8_speed = gather(fp8_all_gather=True)
    root = V * H + H + V * H
    assert bf16 == pytest.approx(2 * 7 / 8 * 2 * PARAMS)
    assert fp8 == pytest.approx(2 * 7 / 8 * (LAYERS * (BLOCK_LINEAR + 2 * BLOCK_NORMS) + 2 * root))
    assert fp8_speed >= plain_speed


def test_mxfp8_linears_keep_what_float8_linears_keep():
    """torchtitan's MXFP8LinearConverter swaps in torchao's MXFP8Linear (torchao 0.18 prototype/moe_training/
    mxfp8_linear.py): mx_mm saves (input_hp, weight_hp) and casts both to MXFP8 in every matmul, as Float8Linear
    saves its high-precision arguments, so with compiled blocks (the casts fused) the step holds what the
    rowwise recipe's does: the 2-byte QKV input, no FP8 weight copies."""
    mx = estimate_config(config(fp8=True, fp8_recipe="mxfp8", compile=True))
    rowwise = estimate_config(config(fp8=True, fp8_recipe="rowwise", compile=True))
    assert mx.allocated_peak_bytes == rowwise.allocated_peak_bytes
    tr = Training(framework="fsdp2", seq_len=8192, fp8=True, fp8_recipe="mxfp8", compile=True)
    par = Parallel(dp=8)
    assert next(e for e in layer_entries(LLAMA_8B, tr, par, "dense")
                if e.name.startswith("QKV projection input")).bytes(par) == 2 * 8192 * H
