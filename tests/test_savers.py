"""The memory savers PyTorch-native stacks offer (issue: the PyTorch-native stack), each by hand."""

from __future__ import annotations

import pytest

from estimator import Architecture, ConfigError, Parallel, Training, estimate
from estimator.models.presets import get_architecture
from estimator.memory.sharding import stored_kind_counts

LLAMA_8B = get_architecture("llama-3.1-8b")
FSDP = dict(framework="fsdp2", seq_len=8192, micro_batch_size=2)


def activations(training: Training, par: Parallel = Parallel(dp=8), arch: Architecture = LLAMA_8B) -> int:
    return estimate(arch, training, par).stages[0].component("activations").bytes


def test_checkpointing_every_second_layer_keeps_half_the_layers_whole():
    """torchtitan's layer-level AC with N = 2 on Llama-3.1-8B (32 layers): 16 layers keep their
    input, B*s*b*h = 2 * 8192 * 2 * 4096 bytes, and 16 keep everything they keep without recompute."""
    token_ids = 8 * 8192 * 2  # int64 ids of the first stage
    layer_input = 2 * 8192 * 2 * 4096
    whole_layer = (activations(Training(**FSDP)) - token_ids) / 32
    every2 = activations(Training(**FSDP, recompute="full", recompute_every=2))
    assert every2 == 16 * layer_input + round(16 * whole_layer) + token_ids
    every3 = activations(Training(**FSDP, recompute="full", recompute_every=3))  # layers 3, 6, ..., 30
    assert every3 == 10 * layer_input + round(22 * whole_layer) + token_ids
    # N larger than the stage: nothing is checkpointed, as without recompute
    assert activations(Training(**FSDP, recompute="full", recompute_every=64)) == activations(Training(**FSDP))


def test_every_nth_layer_counts_the_ranks_layers_in_running_order():
    """Six layers, the first dense and the rest MoE. Every 2nd of layers 0..5 is 1, 3, 5 (all MoE):
    stored are layer 0 (dense) and 2, 4 (MoE). A rank running chunks 0-1 then 4-5 with N = 3
    checkpoints its 3rd layer, layer 4."""
    arch = Architecture(hidden_size=256, num_layers=6, num_attention_heads=4, intermediate_size=512,
                        vocab_size=1000, num_experts=4, num_experts_per_token=2, moe_intermediate_size=128,
                        first_dense_layers=1)
    assert stored_kind_counts(arch, (range(0, 6),), 2) == (("dense", 1), ("moe", 2))
    assert stored_kind_counts(arch, (range(0, 2), range(4, 6)), 3) == (("dense", 1), ("moe", 2))
    assert stored_kind_counts(arch, (range(0, 2), range(4, 6)), 2) == (("dense", 1), ("moe", 1))


@pytest.mark.parametrize("training, field, words", [
    (dict(recompute="selective", recompute_every=2, framework="fsdp2"), "training.recompute_every", "'full'"),
    (dict(recompute="full", recompute_every=2, framework="megatron"), "training.recompute_every", "'fsdp2'"),
    (dict(recompute="full", recompute_every=2, recompute_layers=4, framework="fsdp2"), "training.recompute_every",
     "recompute_layers"),
    (dict(recompute_every=0), "training.recompute_every", "an integer from 1 to 16,384"),
])
def test_layer_level_checkpointing_is_refused_where_no_framework_offers_it(training, field, words):
    with pytest.raises(ConfigError) as error:
        Training(**training)
    assert error.value.field == field and words in str(error.value)


LLAMA_1B = get_architecture("llama-3.2-1b")  # 1,235,814,400 parameters, tied 128,256 x 2,048 embedding


def phases(training: Training, par: Parallel = Parallel()) -> dict[str, int]:
    return dict(estimate(LLAMA_1B, training, par).stages[0].phase_totals)


def test_optimizer_in_backward_never_holds_a_full_gradient_set():
    """fsdp2 on one GPU, bf16 compute over fp32 shards, fused AdamW (torchtune's fused=True): the
    step phase holds 4 B of fp32 gradients per parameter; stepped in backward, they never exist."""
    n = 1_235_814_400
    base = dict(framework="fsdp2", seq_len=2048)
    plain, fused = phases(Training(**base)), phases(Training(**base, optimizer_in_backward=True))
    assert plain["optimizer"] - fused["optimizer"] == 4 * n
    assert fused["forward"] == plain["forward"]
    # at backward's start the loss's fp32 gradients (2 x 4 x s x V) outweigh one tensor's step
    assert fused["backward"] == plain["backward"]


def test_a_short_sequence_peaks_at_backwards_end_unless_the_optimizer_steps_there():
    """seq 128 on one GPU. Plain fsdp2: backward's last moments hold every fp32 gradient beside the
    fp32 shards and AdamW's states, 4 + 8 + 4 B per parameter, the activations gone (and torchtitan's
    RoPE caches, one per layer: 16 x 128 positions x 32 complex64). Stepped in
    backward, no gradient set ever exists: backward peaks at its start, where the tied embedding's
    fp32 gradient, 4 B x 128,256 x 2,048, is the largest moment (over the loss's 2 x 4 B x 128 x
    128,256)."""
    n = 1_235_814_400
    base = dict(framework="fsdp2", seq_len=128)
    plain = estimate(LLAMA_1B, Training(**base)).stages[0]
    fused = estimate(LLAMA_1B, Training(**base, optimizer_in_backward=True)).stages[0]
    workspaces = 2 * 32 * 2**20  # PyTorch's two cuBLAS workspaces (forward and backward threads) on an H100
    assert dict(plain.phase_totals)["backward"] == 4 * n + 8 * n + 4 * n + 16 * 128 * 32 * 8 + workspaces
    backward = {c.key: c for c in fused.phases[1].components}
    assert backward["gradients"].bytes == 0
    step = next(p for p in backward["transient"].parts if p.label.startswith("One parameter's gradient"))
    assert step.bytes == 4 * 128_256 * 2_048 > 2 * 4 * 128 * 128_256
    assert dict(fused.phase_totals)["backward"] < dict(plain.phase_totals)["backward"]


@pytest.mark.parametrize("training, par, words", [
    (dict(framework="megatron"), Parallel(), "'fsdp2'"),
    (dict(framework="fsdp2", global_batch_size=16), Parallel(dp=4), "micro_batch_size x dp = 4"),
    (dict(framework="fsdp2"), Parallel(pp=2), "pp > 1"),
])
def test_optimizer_in_backward_is_refused_where_torchtune_refuses_it(training, par, words):
    with pytest.raises(ConfigError) as error:
        estimate(LLAMA_1B, Training(**training, optimizer_in_backward=True), par)
    assert error.value.field == "training.optimizer_in_backward" and words in str(error.value)


N_1B = 1_235_814_400  # Llama-3.2-1B's parameters (one stage)


def offloaded(framework: str, zero: int, optimizer: str = "cpu", parameters: str = "none"):
    training = Training(framework=framework, seq_len=2048, offload_optimizer=optimizer, offload_parameters=parameters)
    return estimate(LLAMA_1B, training, Parallel(dp=8, zero_stage=zero)).stages[0]


EMBEDDING_1B = 128_256 * 2_048  # Llama-3.2-1B's largest tensor


def test_zero_offload_moves_the_optimizer_partition_to_the_host():
    """DeepSpeed ZeRO-2 with offload_optimizer cpu (ZeRO-Offload): the host keeps the partition's
    fp32 master (4 B), Adam states (8 B) and fp32 gradients (4 B), and DeepSpeed's own 16-bit copy of
    the partition (2 B) and bf16 staging buffer of the largest tensor (v0.19.5 stage_1_and_2.py
    __init__: param_buffer_of_bit16_for_cpu_offload_groups, temp_grad_buffer_for_cpu_offload); the
    GPU's step phase keeps only the bf16 parameters, 2 B x N (no gradient partition, no fp32 step
    copy), and the GPU staging buffer (temp_grad_buffer_for_gpu_offload, 2 B x the embedding)."""
    stage = offloaded("deepspeed", 2)
    assert stage.host_bytes == (round(4 * N_1B / 8) + round(8 * N_1B / 8) + round(4 * N_1B / 8) + round(2 * N_1B / 8)
                                + 2 * EMBEDDING_1B)
    assert dict(stage.phase_totals)["optimizer"] == 2 * N_1B + 2 * EMBEDDING_1B + 2 * 32 * 2**20  # 2 cuBLAS workspaces
    assert stage.nvme_bytes == 0


def test_zero_infinity_keeps_states_on_nvme_and_swap_buffers_on_the_host():
    """ZeRO-3 with both offloaded to NVMe: NVMe holds master, states, fp32 gradients and the bf16
    parameter partition (4 + 8 + 4 + 2 B per parameter of the partition); the host pins 4 fp32
    optimizer swap buffers of the partition (below sub_group_size 1e9) and 5 parameter buffers of
    1e8 bf16 elements, and ZeRO-3's flat bf16 gradient partitions (stage3.py __init__
    grad_partitions_flat_buffer on the CPU under offload_optimizer, DeepSpeed v0.19.5)."""
    stage = offloaded("deepspeed", 3, "nvme", "nvme")
    n = N_1B / 8
    assert stage.nvme_bytes == round(4 * n) + round(8 * n) + round(4 * n) + round(2 * n)
    assert stage.host_bytes == round(4 * n * 4) + 5 * 10**8 * 2 + round(2 * n)


def test_fsdp2_cpu_offload_moves_shards_gradients_and_the_step():
    """FSDP2 CPUOffloadPolicy: the host keeps the fp32 parameter shard (4 B), its fp32 gradient (4 B)
    and AdamW's states (8 B; fused AdamW, no temporary); the GPU keeps no model state."""
    stage = offloaded("fsdp2", 3, "cpu", "cpu")
    n = N_1B / 8
    assert stage.host_bytes == round(8 * n) + round(4 * n) + round(4 * n)
    assert {c.key: c.bytes for c in stage.phases[2].components if c.key in ("parameters", "optimizer_states",
                                                                                "gradients")} == \
        {"parameters": 0, "optimizer_states": 0, "gradients": 0}


def test_megatron_cpu_offload_keeps_the_main_gradients_on_the_gpu():
    """--optimizer-cpu-offload with the distributed optimizer: master weights and Adam states of
    the partition go to the host with fp32 gradient copies; the fp32 main-grad buffer, 4 B x N,
    stays on the GPU."""
    stage = offloaded("megatron", 1)
    assert stage.host_bytes == round(4 * N_1B / 8) + round(8 * N_1B / 8) + round(4 * N_1B / 8)
    assert stage.component("gradients").bytes == 4 * N_1B
    assert stage.component("optimizer_states").bytes == 0


@pytest.mark.parametrize("framework, zero, optimizer, parameters, field, words", [
    ("hf", 0, "cpu", "none", "training.offload_optimizer", "'deepspeed'"),
    ("fsdp2", 3, "cpu", "none", "training.offload_optimizer", "both 'cpu'"),
    ("fsdp2", 3, "nvme", "nvme", "training.offload_optimizer", "both 'cpu'"),
    ("fsdp2", 0, "cpu", "cpu", "training.offload_optimizer", "zero_stage is 2 or 3"),
    ("megatron", 1, "none", "cpu", "training.offload_parameters", "'cpu' only"),
    ("megatron", 0, "cpu", "none", "training.offload_optimizer", "zero_stage is 1"),
    ("deepspeed", 0, "cpu", "none", "training.offload_optimizer", "zero_stage is 1, 2 or 3"),
    ("deepspeed", 2, "nvme", "none", "training.offload_optimizer", "zero_stage 3"),
    ("deepspeed", 2, "none", "cpu", "training.offload_parameters", "zero_stage 3"),
])
def test_offload_is_refused_where_the_framework_does_not_offer_it(framework, zero, optimizer, parameters, field,
                                                                   words):
    with pytest.raises(ConfigError) as error:
        offloaded(framework, zero, optimizer, parameters)
    assert error.value.field == field and words in str(error.value)


def test_torchtitans_operator_level_checkpointing_keeps_what_its_policy_saves():
    """recompute "selective" under fsdp2 is torchtitan's SelectiveAC: per Llama-3.1-8B layer the
    block input, the outputs of the odd matmuls wq (a*d = 4096), wv (g*d = 1024), w1 (f = 14336) and
    w2 (h = 4096), flash attention's output (4096) and its fp32 log-sum-exp (a = 32 heads), for
    T = 8192 x 2 tokens in bf16."""
    T = 8192 * 2
    per_layer = T * (2 * (4096 + 4096 + 1024 + 14336 + 4096 + 4096) + 4 * 32)
    assert per_layer == 1_042_284_544
    training = Training(**FSDP, recompute="selective")
    assert activations(training) == 32 * per_layer + 8 * T  # and the first stage's token ids
    # TP 2 with sequence parallelism: column-parallel outputs and the block input halve; w2's local
    # output is whole (partial sums) until its reduce-scatter, whose output is saved, as is wo's
    tp2 = T * (2 * (4096 + 4096 + 1024 + 14336 + 4096) / 2 + 4 * 32 / 2 + 2 * 4096 + 2 * 2 * 4096 / 2)
    assert activations(training, Parallel(tp=2, dp=4)) == round(32 * tp2) + 8 * T


def test_the_ledger_shows_the_eager_tensors_recomputed_and_the_policys_saves_kept():
    est = estimate(LLAMA_8B, Training(**FSDP, recompute="selective"), Parallel(dp=8))
    kept = [line.name for line in est.activation_ledger if not line.dropped_by_recompute]
    assert kept == ["block input (kept by the checkpoint)", "q projection output (saved matmul)",
                    "v projection output (saved matmul)", "w1 (gate) output (saved matmul)",
                    "w2 (down) output (saved matmul)", "flash attention output (saved)",
                    "flash log-sum-exp (saved, fp32)"]
    assert any(line.dropped_by_recompute for line in est.activation_ledger)


@pytest.mark.parametrize("model, training, field", [
    ("qwen3-30b-a3b", dict(), "training.recompute"),
    ("llama-3.1-8b", dict(recompute_modules=["mlp"]), "training.recompute_modules"),
    ("llama-3.1-8b", dict(attention="eager"), "training.attention"),
])
def test_operator_level_checkpointing_is_refused_where_it_is_not_modelled(model, training, field):
    with pytest.raises(ConfigError) as error:
        estimate(get_architecture(model), Training(framework="fsdp2", recompute="selective", **training))
    assert error.value.field == field and "operator-level" in str(error.value)
