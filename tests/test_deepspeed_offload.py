"""DeepSpeed ZeRO-Offload's host buffers (issue #23): every buffer DeepSpeed v0.19.5 makes on the host with
offload_optimizer 'cpu', counted by hand from the configuration (estimator/memory/deepspeed_offload.py cites the
lines), and the GPU side counting none of them.

Llama-3.2-1B, bf16, 8 ranks: N = 1,235,814,400 parameters, n = N / 8 = 154,476,800 in a rank's partition; its
largest tensor is the tied 128,256 x 2,048 embedding."""

from __future__ import annotations

from estimator import Parallel, Training, estimate
from estimator.memory.deepspeed_offload import overlapping_elements
from estimator.models.presets import get_architecture

LLAMA_1B = get_architecture("llama-3.2-1b")
N = 1_235_814_400
n = N // 8
EMBEDDING = 128_256 * 2_048
LAYER = 2 * 2_048 * 2_048 + 2 * 2_048 * 512 + 3 * 2_048 * 8_192  # q, k, v, o, gate, up, down (norms apart)


def offloaded(zero: int, global_batch: int | None = None):
    training = Training(framework="deepspeed", seq_len=2048, offload_optimizer="cpu", global_batch_size=global_batch)
    return estimate(LLAMA_1B, training, Parallel(dp=8, zero_stage=zero)).stages[0]


def host(stage) -> dict[str, int]:
    return {c.label: c.bytes for c in stage.host}


def test_zero3_keeps_its_flat_gradient_partitions_on_the_host():
    """stage3.py __init__: grad_partitions_flat_buffer, every partition in the gradient-accumulation dtype (bf16:
    engine.py get_data_types), on self.device = the CPU under offload_optimizer; beside the fp32 master (4 B),
    Adam's two moments (8 B) and the fp32 sub-group gradients (4 B, initialize_optimizer_states)."""
    stage = offloaded(3)
    assert host(stage)["Gradient partitions (grad_partitions_flat_buffer)"] == 2 * n
    assert stage.host_bytes == (4 + 8 + 4 + 2) * n
    # the GPU keeps neither the flat buffer nor any gradient at the step
    step = {c.key: c.bytes for c in stage.phases[2].components}
    assert step.get("gradients", 0) == 0
    assert not any("grad_partitions" in c.label or "Gradient partitions" in c.label
                   for p in stage.phases for c in p.components)


def test_zero2_keeps_a_bf16_partition_copy_and_a_staging_buffer_on_the_host():
    """stage_1_and_2.py __init__: param_buffer_of_bit16_for_cpu_offload_groups (2 B x n),
    temp_grad_buffer_for_cpu_offload (2 B x the largest parameter) on the host; temp_grad_buffer_for_gpu_offload
    (2 B x the largest parameter) on the GPU. One micro-batch a step: no accumulated_grads_in_cpu."""
    stage = offloaded(2)
    assert host(stage) == {"fp32 master weights": 4 * n, "Optimizer states": 8 * n, "fp32 gradient partition": 4 * n,
                           "16-bit copy of the partition (for the updated weights)": 2 * n,
                           "Gradient staging buffer (temp_grad_buffer_for_cpu_offload)": 2 * EMBEDDING}
    gpu = {c.label: c.bytes for c in stage.phases[2].components}
    assert gpu["Gradient staging buffer (temp_grad_buffer_for_gpu_offload)"] == 2 * EMBEDDING
    assert gpu.get("Gradients", 0) == 0


def test_zero1_offload_gives_the_fp32_partition_its_host_gradient():
    """ZeRO-1 runs the same class: initialize_optimizer_states gives single_partition_of_fp32_groups a host
    gradient (4 B x n) under cpu_offload, as ZeRO-2."""
    assert offloaded(1).host_bytes == offloaded(2).host_bytes == (4 + 8 + 4 + 2) * n + 2 * EMBEDDING


def test_accumulating_micro_batches_keep_whole_parameters_on_the_host():
    """4 micro-batches a step (32 = 4 x 1 x 8): copy_grads_in_partition accumulates in accumulated_grads_in_cpu, a
    bf16 buffer of each parameter overlapping the rank's partition, whole. The partitions are N / 8 (N is a multiple
    of 2 x 8). Rank 1 holds [n, 2n): the embedding [0, 262,668,288) overlaps it, and layer 0 from 262,668,288 up
    to 2n = 308,953,600, 46,285,312 elements in: q, k, v, o (10,485,760), gate and up (33,554,432) lie before it,
    down_proj (16,777,216) crosses it; the rank touches the embedding and layer 0 to down_proj's end. In the
    estimator's tensor order the layer's two norms (2 x 2,048) precede the MLP (transformers registers them after
    it): they count too. Rank 0 touches the embedding alone, a middle rank at most n + two MLP matrices."""
    touched = EMBEDDING + LAYER + 2 * 2_048
    assert touched == 323_489_792
    stage = offloaded(2, global_batch=32)
    assert host(stage)["Accumulated gradients (accumulated_grads_in_cpu)"] == 2 * touched
    assert stage.host_bytes == offloaded(2).host_bytes + 2 * touched


def test_overlapping_elements_counts_whole_tensors_on_the_busiest_rank():
    """Tensors 5, 3, 8 over 2 ranks: 16 elements padded to a multiple of 4 stay 16, shares [0, 8) and [8, 16).
    Rank 0 touches 5 and 3 (8); rank 1 the 8 (8). Tensors 5, 6, 1 (12): shares [0, 6), [6, 12): rank 0 touches 5
    and 6 (11), rank 1 the 6 and the 1 (7). Tensors 7 over 2 ranks: padded to 8, shares of 4, both touch 7."""
    assert overlapping_elements((5.0, 3.0, 8.0), 2) == 8
    assert overlapping_elements((5.0, 6.0, 1.0), 2) == 11
    assert overlapping_elements((7.0,), 2) == 7
    assert overlapping_elements((1.0, 1.0, 1.0), 4) == 2  # padded to 8, shares of 2: rank 0 the first two


def _qwen_zero2_offloaded(dp: int):
    """The real-GPU ZeRO-2 record's Qwen-1.8B (untied head, 151,936 x 2,048, the largest tensor), 256 tokens, full
    recompute, with offload_optimizer 'cpu', the 'auto' bucket (h x h = 4,194,304) and `dp` ranks."""
    import copy
    import json
    from pathlib import Path

    from estimator import estimate_config

    path = (Path(__file__).parent / "data" / "measured" / "gpu" / "deepspeed" /
            "deepspeed-qwen-1.8b-zero2-foreach-adamw-recompute-s256-b1.json")
    config = copy.deepcopy(json.loads(path.read_text())["config"])
    for key in ("overlap_comm", "reduce_bucket_size"):
        config["training"].pop(key)
    config["training"].update(offload_optimizer="cpu", global_batch_size=dp)
    config["parallel"]["dp"] = dp
    stage = estimate_config(config).stages[0]
    return {c.label: c.bytes for p in stage.phases if p.name == "backward" for c in p.components
            for c in (c.parts or (c,))}, stage


QWEN_N = 1_836_828_672
QWEN_HEAD = 151_936 * 2_048  # 311,164,928 elements, over the 4,194,304-element bucket


def test_zero2_offload_keeps_the_head_gradient_whole_until_the_next_hook():
    """stage_1_and_2.py (v0.19.5) with cpu_offload: the head's gradient, over reduce_bucket_size, becomes
    extra_large_param_to_reduce (l. 1203) and stays whole (2 B x 311,164,928) until the next gradient's hook reduces
    it (l. 1179); then copy_grads_in_partition (l. 1724, cpu_offload branch) takes the rank's slice of it in fp64 for
    its norm (l. 1635 -> 1561 `.double().norm(2)`, 8 B an element), frees that, casts the slice to fp32 for the host
    (l. 1575, 4 B: the smaller) and frees the gradient (l. 1578). One GPU: the slice is the whole head."""
    backward, stage = _qwen_zero2_offloaded(1)
    assert backward["The largest tensor's gradient, whole until the next gradient's hook"] == 2 * QWEN_HEAD
    assert backward["fp64 copy of this GPU's slice of it (its norm, offload_optimizer)"] == 8 * QWEN_HEAD
    assert backward["Gradients"] == 0  # no partition on the GPU: each slice goes to the host
    # the moment is backward's peak and the stage's: the bf16 parameters, the GPU staging buffer (2 B x the head),
    # the workspaces, 24 layer inputs, the recomputed layer, the bucket and the head's 10 B an element
    assert stage.allocated_peak_bytes == sum(backward.values()) == (
        2 * QWEN_N + 2 * QWEN_HEAD + 2 * 32 * 2**20 + 24 * 256 * 2048 * 2 + 8 * 256
        + backward["One recomputed layer's activations"] + 2 * 2048**2 + 10 * QWEN_HEAD)


def test_zero2_offload_slices_the_head_by_the_rank_partitions():
    """8 ranks: the flat group (N = 1,836,828,672, a multiple of 2 x 8) in shares of N / 8 = 229,603,584; the head
    is the last tensor, [N - 311,164,928, N), so the last rank's whole share lies inside it: 8 B x N / 8 = N bytes."""
    backward, _ = _qwen_zero2_offloaded(8)
    assert backward["The largest tensor's gradient, whole until the next gradient's hook"] == 2 * QWEN_HEAD
    assert backward["fp64 copy of this GPU's slice of it (its norm, offload_optimizer)"] == QWEN_N


def test_largest_overlap_is_the_largest_tensors_biggest_slice():
    """Tensors 2, 10, 4 over 2 ranks: shares [0, 8), [8, 16); the 10 lies on [2, 12): 6 on rank 0, 4 on rank 1.
    Tensors 5, 3, 8: the 8 is [8, 16), rank 1's whole share. One rank: the whole tensor."""
    from estimator.memory.deepspeed_offload import largest_overlap

    assert largest_overlap((2.0, 10.0, 4.0), 2) == 6
    assert largest_overlap((5.0, 3.0, 8.0), 2) == 8
    assert largest_overlap((10.0,), 1) == 10


def test_under_tensor_parallelism_each_rank_counts_its_own_shards():
    """TP 2 x DP 4, ZeRO-2, 4 micro-batches a step (16 = 4 x 1 x 4): each rank's engine flattens the shards its
    module holds, so DeepSpeed's buffers are the shards' (deepspeed_offload.trainable_sizes). The rank's tensors:
    the embedding's vocabulary half, E / 2 = 131,334,144, the largest (both staging buffers: 2 B x E / 2); each
    layer LAYER / 2 = 30,412,800 with its two norms whole (4,096); the final norm (2,048): 617,940,992 in all,
    shares of 154,485,248 (a multiple of 2 x 4). Rank 0's share ends in layer 0's down projection (154,485,248 -
    E / 2 = 23,151,104, past q, k, v, o, the norms, gate and up: 22,024,192): it touches the embedding and all of
    layer 0, the busiest (ranks 1-3 touch a down projection and five layers, 160,452,608 + 2,048 at most)."""
    shard_layer = LAYER // 2 + 2 * 2_048
    assert EMBEDDING // 2 + 16 * shard_layer + 2_048 == 617_940_992 == 4 * 154_485_248
    # q, k, v, o, the two norms, gate and up come before the down projection
    down_starts = (2 * 2_048 * 2_048 + 2 * 2_048 * 512) // 2 + 4_096 + 2 * (2_048 * 8_192 // 2)
    assert down_starts == 22_024_192 < 154_485_248 - EMBEDDING // 2 == 23_151_104 < shard_layer
    training = Training(framework="deepspeed", seq_len=2048, offload_optimizer="cpu", global_batch_size=16)
    stage = estimate(LLAMA_1B, training, Parallel(dp=4, tp=2, zero_stage=2)).stages[0]
    buffers = host(stage)
    assert buffers["Gradient staging buffer (temp_grad_buffer_for_cpu_offload)"] == 2 * (EMBEDDING // 2)
    assert buffers["Accumulated gradients (accumulated_grads_in_cpu)"] == 2 * (EMBEDDING // 2 + shard_layer)
    assert buffers["16-bit copy of the partition (for the updated weights)"] == 2 * 154_485_248
    gpu = {c.label: c.bytes for c in stage.phases[2].components}
    assert gpu["Gradient staging buffer (temp_grad_buffer_for_gpu_offload)"] == 2 * (EMBEDDING // 2)
