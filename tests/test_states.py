"""Model states per GPU: Megatron's accounting, ZeRO stages, frameworks and optimizers."""

import pytest

from canonical import LLAMA_31_8B, LLAMA_31_70B, MIXTRAL_8X7B, gpt
from estimator import Parallel, Training, estimate
from estimator.models.presets import get_architecture
from estimator.spec.errors import ConfigError
from estimator.memory.sharding import stage_parameters

STATIC = ("parameters", "gradients", "master_weights", "optimizer_states")


def static_bytes(result, stage):
    comps = {c.key: c.bytes for c in result.stages[stage].phases[2].components}  # optimizer step phase
    return sum(comps.get(k, 0) for k in STATIC)


def test_megatron_bf16_adam_is_18_bytes_per_parameter():
    # Megatron-LM docs, distributed optimizer: bf16 params, fp32 main grads, fp32 master, Adam = 18 B
    par = Parallel(tp=8, pp=4, dp=4)
    result = estimate(LLAMA_31_70B, Training(), par)
    for s, stage in zip(result.stages, stage_parameters(LLAMA_31_70B, par, "megatron")):
        assert static_bytes(result, s.stage) == pytest.approx(18 * stage.local, abs=4)


@pytest.mark.parametrize("dp, cp", [(2, 1), (8, 1), (4, 2), (64, 1)])
def test_distributed_optimizer_is_6_plus_12_over_d(dp, cp):
    # Megatron-LM docs: 6 + 12/d bytes per parameter, d = the data-parallel (x context-parallel) group
    par = Parallel(tp=8, pp=4, dp=dp, cp=cp, zero_stage=1)
    result = estimate(LLAMA_31_70B, Training(seq_len=8192), par)
    for s, stage in zip(result.stages, stage_parameters(LLAMA_31_70B, par, "megatron")):
        assert static_bytes(result, s.stage) == pytest.approx((6 + 12 / (dp * cp)) * stage.local, rel=1e-9, abs=8)


def _overlaps(sizes: list, n: int) -> list:
    """For each of n ranks, the whole of every tensor overlapping its share, ceil(N / 2n) x 2 elements, of the flat
    group (stage_1_and_2.py v0.19.5 get_partition_info)."""
    share = -(-sum(sizes) // (2 * n)) * 2
    starts = [sum(sizes[:i]) for i in range(len(sizes))]
    return [sum(size for start, size in zip(starts, sizes) if start < (r + 1) * share and start + size > r * share)
            for r in range(n)]


H, FFN, VOCAB, KV = 4096, 14336, 128256, 1024


def _busiest_partition(n: int) -> int:
    """Llama-3.1-8B's gradient elements that DeepSpeed ZeRO-1's and ZeRO-2's busiest rank keeps at the step: the
    whole of every tensor overlapping its 1/n of each flat group (stage_1_and_2.py v0.19.5 grads_in_partition), the
    groups the HF Trainer's two, partitioned each on its own, the weight-decay matrices (embedding, each
    layer's q, k, v, o, gate, up, down, the head) and the norms; grads_in_partition sums the rank's overlaps in both
    (copy_grads_in_partition, v0.19.5), the busiest rank's."""
    decay = [VOCAB * H] + [H * H, H * KV, H * KV, H * H, H * FFN, H * FFN, FFN * H] * 32 + [VOCAB * H]
    return max(map(sum, zip(_overlaps(decay, n), _overlaps([H] * 65, n))))


def test_zero_stages_per_the_zero_paper():
    # Rajbhandari et al. 2020, figure 1 with K = 12: stage 0 16, stage 1 4 + 12/N, stage 2 2 + 14/N,
    # stage 3 16/N bytes per parameter (bf16 params and grads, fp32 master + Adam). At DeepSpeed's step ZeRO-1
    # holds its partition's gradients alone (the epilogue drops every .grad, stage_1_and_2.py l. 2017), the whole
    # tensors overlapping the busiest rank's 1/N of each of the Trainer's two groups: 2 + 12/N per parameter beside
    # them (tests/test_deepspeed_zero1.py); ZeRO-2's grads_in_partition is the same (tests/test_deepspeed_zero2.py;
    # both measured over 2 and 4 ranks, tests/test_deepspeed_partitions.py)
    n = 8
    locals_ = stage_parameters(LLAMA_31_8B, Parallel(dp=n), "deepspeed")[0].local
    assert locals_ == 8_030_261_248
    expected = {0: 16 * locals_, 1: (2 + 12 / n) * locals_ + 2 * _busiest_partition(n),
                2: (2 + 12 / n) * locals_ + 2 * _busiest_partition(n), 3: 16 / n * locals_}
    # rank 5's matrices (8.7% above 1/8 of the 8.03e9 parameters) and nine norms
    assert _busiest_partition(n) == 1_090_519_040 + 9 * H
    for stage, total in expected.items():
        result = estimate(LLAMA_31_8B, Training(framework="deepspeed"), Parallel(dp=n, zero_stage=stage))
        assert static_bytes(result, 0) == pytest.approx(total, rel=1e-9, abs=8)


def test_hf_pure_bf16_keeps_8_bytes_and_autocast_16():
    n = 8_030_261_248
    pure = estimate(LLAMA_31_8B, Training(framework="hf", param_dtype="bf16"))
    assert static_bytes(pure, 0) == 2 * n + 2 * n + 4 * n  # bf16 params, grads, two bf16 Adam moments
    amp = estimate(LLAMA_31_8B, Training(framework="hf", param_dtype="fp32"))
    assert static_bytes(amp, 0) == 4 * n + 4 * n + 8 * n


def test_fsdp2_shards_fp32_parameters_gradients_and_states():
    n, d = 8_030_261_248, 8
    result = estimate(LLAMA_31_8B, Training(framework="fsdp2"), Parallel(dp=d))
    assert result.zero_stage == 3  # fully_shard's default
    comps = {c.key: c.bytes for c in result.stages[0].phases[2].components}
    assert comps["parameters"] == pytest.approx(4 * n / d, abs=1)
    assert comps["gradients"] == pytest.approx(4 * n / d, abs=1)
    assert comps["optimizer_states"] == pytest.approx(8 * n / d, abs=1)
    assert "master_weights" not in comps  # the fp32 shard is the master


def test_fsdp2_gathers_torchtitans_units_in_bf16():
    """torchtitan's FSDP units (distributed/fsdp.py): forward ends inside the loss with the head unit
    (not resharded after forward) and a block gathered; backward starts with a block and the one
    prefetched. Megatron-FSDP's full sharding keeps the generic 2 layers + the root unit."""
    d = 8
    result = estimate(LLAMA_31_8B, Training(framework="fsdp2"), Parallel(dp=d))
    forward, backward = ({p.label: p.bytes for p in {c.key: c for c in phase.components}["transient"].parts}
                         for phase in result.stages[0].phases[:2])
    layer = 218_112_000  # one Llama-3.1-8B layer (see test_parameters)
    head = 128256 * 4096
    assert forward["Unsharded parameters in flight"] == 2 * (layer + head)
    assert backward["Unsharded parameters in flight"] == 2 * 2 * layer
    megatron = estimate(LLAMA_31_8B, Training(), Parallel(dp=d, zero_stage=3)).stages[0].phases[0]
    root = 2 * 128256 * 4096 + 4096  # embedding, LM head, final norm (128,256 needs no padding at TP 1)
    parts = {p.label: p.bytes for p in {c.key: c for c in megatron.components}["transient"].parts}
    assert parts["Unsharded parameters in flight"] == 2 * (2 * layer + root)


def test_expert_states_shard_over_expert_data_parallel():
    # Mixtral with EP 8 on 8 GPUs (DP 8): each GPU holds one expert per layer; expert-DP = 1, so the
    # distributed optimizer cannot shard expert states, while dense states shard over DP = 8.
    par = Parallel(dp=8, ep=8, zero_stage=1)
    stage = stage_parameters(MIXTRAL_8X7B, par, "megatron")[0]
    expert_per_gpu = 32 * 3 * 4096 * 14336  # one expert in each of 32 layers
    assert stage.expert_local == expert_per_gpu
    result = estimate(MIXTRAL_8X7B, Training(), par)
    comps = {c.key: c.bytes for c in result.stages[0].phases[2].components}
    assert comps["optimizer_states"] == pytest.approx(8 * stage.dense_local / 8 + 8 * expert_per_gpu, abs=8)


@pytest.mark.parametrize("optimizer, per_param", [
    ("sgd", 0), ("sgd_momentum", 4), ("lion", 4), ("adamw", 8),
])
def test_optimizer_state_bytes(optimizer, per_param):
    n = 8_030_261_248
    result = estimate(LLAMA_31_8B, Training(framework="hf", param_dtype="fp32", optimizer=optimizer))
    comps = {c.key: c.bytes for c in result.stages[0].phases[2].components}
    assert comps["optimizer_states"] == per_param * n


def test_adam8bit_blockwise_and_small_tensors_in_32_bit():
    # bitsandbytes: 1 byte per state + one fp32 absmax per 256 elements; tensors < 4096 elements
    # (here the 65 norms of 4096 elements are exactly 4096: they are quantized too)
    n = 8_030_261_248
    result = estimate(LLAMA_31_8B, Training(framework="hf", param_dtype="fp32", optimizer="adam8bit"))
    comps = {c.key: c.bytes for c in result.stages[0].phases[2].components}
    assert comps["optimizer_states"] == pytest.approx(2 * (1 + 4 / 256) * n, abs=2)


def test_adafactor_factored_second_moment_by_hand():
    h, f, v, g, d = 4096, 14336, 128256, 8, 128
    per_layer = (h + h) + (g * d + h) * 2 + (h + h) + (2 * f + h) + (h + f) + 2 * h  # q,k,v,o,fc1,fc2,norms
    elements = 32 * per_layer + (v + h) + (v + h) + h
    result = estimate(LLAMA_31_8B, Training(framework="hf", param_dtype="fp32", optimizer="adafactor"))
    comps = {c.key: c.bytes for c in result.stages[0].phases[2].components}
    assert comps["optimizer_states"] == 4 * elements


def test_muon_momentum_on_hidden_matrices_adamw_elsewhere():
    n = 8_030_261_248
    h, v = 4096, 128256
    others = 2 * v * h + 65 * h  # embedding, head, 65 norms
    result = estimate(LLAMA_31_8B, Training(framework="hf", param_dtype="fp32", optimizer="muon"))
    comps = {c.key: c.bytes for c in result.stages[0].phases[2].components}
    assert comps["optimizer_states"] == 4 * (n - others) + 8 * others


def test_foreach_adamw_temporary_at_the_step():
    # torch's _multi_tensor_adam materialises sqrt(exp_avg_sq) for the whole group
    n = 8_030_261_248
    result = estimate(LLAMA_31_8B, Training(framework="hf", param_dtype="bf16"))
    step = {c.key: c for c in result.stages[0].phases[2].components}
    assert step["transient"].bytes == 2 * n  # bf16 states -> a bf16 temporary
    [sqrt] = step["transient"].parts or (step["transient"],)
    assert sqrt.formula == "2 B x parameters on this GPU"  # one GPU, nothing sharded: no divisor


def test_the_foreach_temporary_of_a_distributed_optimizer_names_its_divisor():
    """Megatron-Core 0.16.1 without TransformerEngine steps torch's foreach AdamW on the distributed optimizer's
    shard: sqrt(v) of 4 B x the 1,235,814,400 parameters of Llama-3.2-1B / 8 ranks, and the formula says / d."""
    training = Training(framework="megatron", seq_len=2048, te_version="not_installed", transformer_impl="local",
                        attention="eager")
    stage = estimate(get_architecture("llama-3.2-1b"), training, Parallel(dp=8, zero_stage=1)).stages[0]
    step = next(p for p in stage.phases if p.name == "optimizer")
    [sqrt] = [p for c in step.components for p in (c.parts or (c,)) if p.label.startswith("foreach AdamW")]
    assert sqrt.bytes == 4 * 1_235_814_400 // 8
    assert sqrt.formula == "4 B x parameters on this GPU / d (8)"


def test_ddp_buckets_copy_the_gradients():
    n = 8_030_261_248
    result = estimate(LLAMA_31_8B, Training(framework="hf", param_dtype="bf16"), Parallel(dp=2))
    step = {c.key: c.bytes for c in result.stages[0].phases[2].components}
    assert step["buckets"] == 2 * n


def test_hf_rejects_zero_sharding():
    with pytest.raises(ConfigError, match="parallel.zero_stage"):
        estimate(LLAMA_31_8B, Training(framework="hf"), Parallel(dp=2, zero_stage=2))


def test_gpt_175b_static_memory_matches_korthikanti_figure_1():
    # Korthikanti et al. 2022, figure 1: GPT-3 175B on TP 8 x PP 8 holds 45.56 GiB of parameters and
    # optimizer state per GPU (the figure's values as transcribed in NVIDIA Calculon's
    # calculon/llm/validation.py); a middle stage holds 96/8 = 12 layers at 18 B per parameter.
    arch = gpt(12288, 96, 96)
    result = estimate(arch, Training(seq_len=2048, global_batch_size=64), Parallel(tp=8, pp=8, dp=1))
    assert static_bytes(result, 3) / 2**30 == pytest.approx(45.56, rel=2e-3)
