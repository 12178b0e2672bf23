"""DeepSpeed ZeRO-1's gradients from the end of backward to the step (issue #23), by hand from DeepSpeed v0.19.5's
stage_1_and_2.py (estimator/memory/deepspeed_zero1.py and deepspeed_zero1_overlap.py cite the lines): with
overlap_comm off (ZeRO-1's default) every 16-bit gradient is whole until autograd ends; reduce_gradients then walks
them in order, rank 0 allocating `grads_in_partition` (the whole of every tensor overlapping its partition) at its
first reduction, or under offload_optimizer taking the reduced gradient's slice in fp64 for its norm; with
overlap_comm on the hooks reduce in backward, other ranks' gradients over the bucket left whole to the epilogue; the
step keeps `grads_in_partition` alone (offload: no gradient on the GPU).

The real-GPU ZeRO-2 record's Qwen-1.8B (untied head), 256 tokens, full recompute, the 'auto' bucket (h x h =
4,194,304 elements): N = 1,836,828,672 elements; the estimator's module order is the embedding E = 151,936 x 2,048,
24 layers of L = 50,604,032 (q, k, v, their biases, o, two norms, gate, up, down), the final norm (2,048), the head
(E). Eight ranks share N / 8 = S = 229,603,584 each (N is a multiple of 2 x 8).

The optimizer's groups are the HF Trainer's two, each partitioned on its own (stage_1_and_2.py __init__ for ZeRO-1 as
for ZeRO-2; measured per rank over 2 and 4 gloo ranks: tests/test_deepspeed_partitions.py): the weight-decay group
(E, each layer's matrices D = L - 10,240, the head), N_D = 1,836,580,864, and the rest (each layer's q, k and v biases
of 2,048 and two norms of 2,048, then the final norm), N_V = 247,808; both are multiples of 16, so the fp32 partition
is still N_D / 8 + N_V / 8 = S. No-decay shares of N_V / 8 = 30,976 = 3 x 10,240 + 256: each rank's holds three
layers' and one q bias (2,048) of the next: 32,768."""

from __future__ import annotations

import copy
import json
from pathlib import Path

from estimator import estimate_config
from estimator.memory.deepspeed_zero1 import _first_reduction

N = 1_836_828_672
E = 151_936 * 2_048
L = 4 * 2_048**2 + 3 * 2_048 + 2 * 2_048 + 3 * 2_048 * 5_504
S = N // 8
D = L - 10_240  # a layer's matrices (the weight-decay group's)
V_RANK = 3 * 10_240 + 2_048  # any rank's no-decay tensors at 8 ranks
BUCKET = 2_048**2
WORKSPACES = 2 * 32 * 2**20


def _stage(dp: int, offload: str = "none", overlap: bool | None = None, tp: int = 1, **training):
    path = (Path(__file__).parent / "data" / "measured" / "gpu" / "deepspeed" /
            "deepspeed-qwen-1.8b-zero2-foreach-adamw-recompute-s256-b1.json")
    config = copy.deepcopy(json.loads(path.read_text())["config"])
    for key in ("overlap_comm", "reduce_bucket_size"):
        config["training"].pop(key)
    if overlap is not None:
        config["training"]["overlap_comm"] = overlap
    config["training"].update({"offload_optimizer": offload, "global_batch_size": dp, **training})
    config["parallel"].update(dp=dp, tp=tp, zero_stage=1)
    return estimate_config(config).stages[0]


def _phase(stage, name: str) -> tuple[int, dict[str, int]]:
    phase = next(p for p in stage.phases if p.name == name)
    return (sum(c.bytes for c in phase.components),
            {c.label: c.bytes for c in phase.components for c in (c.parts or (c,))})


def test_the_layout():
    assert L == 50_604_032 and 24 * L + 2 * E + 2_048 == N and S == 229_603_584
    assert 2 * E + 24 * D == 1_836_580_864 and 24 * 10_240 + 2_048 == 247_808 == 8 * 30_976


def test_zero1_reduces_after_backward_beside_every_gradient():
    """Rank 0: the embedding (E > S, over the bucket) is first; reduce_gradients keeps it whole (l. 1203) and the
    next parameter's hook reduces it (l. 1179), copy_grads_in_partition allocating grads_in_partition (l. 1651)
    for rank 0's tensors of both groups, the embedding alone of the decay group (E > N_D / 8) and layers 0-2 and
    layer 3's q bias of the other (V_RANK), while every gradient is still whole: 2 B x (N + E + V_RANK) beside the
    bucket. The states: 2 B x N parameters, 4 + 8 B x S master weights and moments, the workspaces."""
    total, parts = _phase(_stage(8), "backward")
    assert parts["Gradients (whole, being reduced after backward)"] == 2 * N
    assert parts["Gradient partition (grads_in_partition, allocated at the first reduction)"] == 2 * (E + V_RANK)
    assert parts["Gradient reduction bucket"] == 2 * BUCKET
    assert total == 2 * N + 12 * S + WORKSPACES + 2 * N + 2 * (E + V_RANK) + 2 * BUCKET == 10_800_450_560


def test_zero1_steps_with_its_partition_alone():
    """The epilogue drops every .grad (l. 2017): the step holds grads_in_partition, the busiest rank's. Rank 6's
    decay share [6 S_D, 7 S_D) (S_D = N_D / 8) starts 3,801,088 elements into layer 21 (inside its q) and reaches
    into the head: layers 21-23's matrices and the head, 3 D + E; its no-decay share V_RANK (layers 18-20 and
    layer 21's q bias): 3 D + E + 3 x 10,240 + 2,048 = 3 L + 2,048 + E, as ZeRO-2's busiest rank
    (tests/test_deepspeed_zero2.py). Beside it the fp32 copy of the S-element partition and foreach AdamW's sqrt(v)
    (4 + 4 B x S)."""
    S_D = (2 * E + 24 * D) // 8
    assert 6 * S_D - E - 21 * D == 3_801_088 < 2_048**2 and 2 * E + 24 * D - E < 7 * S_D
    assert 3 * D + E + V_RANK == 3 * L + 2_048 + E
    total, parts = _phase(_stage(8), "optimizer")
    assert parts["Gradients"] == 2 * (3 * L + 2_048 + E) == 925_958_144
    assert total == 2 * N + 12 * S + WORKSPACES + 2 * (3 * L + 2_048 + E) + 8 * S


def test_without_foreach_the_step_peaks_at_the_cast_from_a_flat_16_bit_copy():
    """Fused AdamW (no sqrt(v) temporary): the step's moment is the cast (stage_1_and_2.py l. 2330-2335): the
    epilogue left averaged_gradients a list of views of grads_in_partition, which step() flattens (torch.cat: a
    new 2 B x S copy) and casts to fp32 (4 B x S) before `del flat_grad_partition`. The fp32 -> bf16 update
    (`bit16_partitions[partition_id].data.copy_`) and the all-gather into bit16_groups_flat allocate nothing."""
    total, parts = _phase(_stage(8, adamw_implementation="fused"), "optimizer")
    assert parts["flat copy of the partition's gradients, cast to fp32"] == 2 * S
    assert parts["fp32 copy of the gradient partition for the step"] == 4 * S
    assert total == 2 * N + 12 * S + WORKSPACES + 2 * (3 * L + 2_048 + E) + 6 * S == 8_799_588_864


def test_one_gpu_zero1_holds_every_gradient_twice_at_the_reduction():
    """One rank: grads_in_partition is every tensor (N), allocated beside all of them; the step holds N."""
    stage = _stage(1)
    _, backward = _phase(stage, "backward")
    _, step = _phase(stage, "optimizer")
    assert backward["Gradient partition (grads_in_partition, allocated at the first reduction)"] == 2 * N
    assert step["Gradients"] == 2 * N


def test_offloaded_zero1_keeps_no_gradient_at_the_step():
    """offload_optimizer 'cpu', one rank: the embedding's slice (all of it) in fp64 for its norm (l. 1561) beside
    every whole gradient and the bucket; each reduced slice goes to the host and its gradient is freed (l. 1578):
    no gradient on the GPU at the step. The GPU keeps the parameters, the staging buffer (2 B x E) and the
    workspaces."""
    stage = _stage(1, "cpu")
    total, backward = _phase(stage, "backward")
    assert backward["fp64 copy of a reduced gradient's slice (its norm, offload_optimizer)"] == 8 * E
    assert total == 2 * N + 2 * E + WORKSPACES + 2 * N + 2 * BUCKET + 8 * E == stage.allocated_peak_bytes
    total, step = _phase(stage, "optimizer")
    assert step["Gradients"] == 0 and total == 2 * N + 2 * E + WORKSPACES


F = 2_048 * 5_504  # one MLP matrix (gate, up, down): over the 'auto' bucket; q, k, v, o are h x h, not over it


def test_overlap_comm_on_one_gpu_is_the_measured_zero2_step():
    """overlap_comm on, one rank: every parameter is in the partition, so ZeRO-1's hooks do what ZeRO-2's do
    (reduce_ipg_grads l. 1722-1724 copy each into grads_in_partition, allocated at the head's reduction beside its
    whole gradient; the epilogue drops the rest): the estimate is the real ZeRO-2 step's, held to the H200 run as
    tests/test_gpu_deepspeed.py holds it (phases to 0.05%, backward 0.3%)."""
    path = (Path(__file__).parent / "data" / "measured" / "gpu" / "deepspeed" /
            "deepspeed-qwen-1.8b-zero2-foreach-adamw-recompute-s256-b1.json")
    record = json.loads(path.read_text())
    config = copy.deepcopy(record["config"])
    config["parallel"]["zero_stage"] = 1
    stage = estimate_config(config).stages[0]
    measured = record["measured"]
    for name in ("forward", "backward", "optimizer"):
        total, _ = _phase(stage, name)
        assert abs(total / measured["phases"][name]["peak_bytes"] - 1) < (3e-3 if name == "backward" else 5e-4)
    _, backward = _phase(stage, "backward")
    assert backward["Gradient partition (grads_in_partition, allocated at the first reduction)"] == 2 * N
    assert backward["The largest tensor's gradient, whole until the next gradient's hook"] == 2 * E


def test_overlap_comm_keeps_the_other_ranks_extra_large_gradients_to_the_epilogue():
    """Eight ranks, overlap_comm on, one micro-batch: each hook copies its gradient into a bucket (storage freed),
    but one over reduce_bucket_size (h x h) stays whole (l. 1203) and ZeRO-1 clears no other rank's gradient
    (l. 1722-1724): the embedding, the head and 72 MLP matrices (F each) are whole until the epilogue on every rank
    not owning them. Rank 2's decay share [2 S_D, 3 S_D) runs from layer 2's down projection (2 S_D - E = 2 D +
    46,792,704) to layer 7's gate (3 S_D - E = 7 D + 23,396,352): it owns F + 4 D + (4 h^2 + F), and V_RANK of the
    no-decay group; 58 MLP matrices and both ends of the model stay whole beside them: 1,517,846,528 elements at
    the epilogue, the busiest rank (rank 4 the same; the first layer's recomputation holds fewer: the embedding's
    and its own not made yet). Beside them the two buckets."""
    S_D = (2 * E + 24 * D) // 8
    owned = F + 4 * D + (4 * 2_048**2 + F)
    assert 4 * 2_048**2 + 2 * F <= 2 * S_D - E - 2 * D == 46_792_704 < D  # in layer 2's down projection
    assert 4 * 2_048**2 <= 3 * S_D - E - 7 * D == 23_396_352 < 4 * 2_048**2 + F  # in layer 7's gate
    assert owned + V_RANK + 2 * E + 58 * F == 1_517_846_528
    total, parts = _phase(_stage(8, overlap=True), "backward")
    assert parts["Gradients (reduced in backward's hooks, overlap_comm)"] == 2 * 1_517_846_528
    assert parts["Gradient reduction buckets (overlap_comm: two)"] == 2 * 2 * BUCKET
    assert total == 2 * N + 12 * S + WORKSPACES + 2 * 1_517_846_528 + 4 * BUCKET == 9_548_479_488


def test_overlap_comm_steps_with_the_partition_alone():
    """The epilogue's _clear_param_grad_only (l. 2017) drops every .grad, the extra-large ones too: the step holds
    grads_in_partition, as with overlap_comm off (rank 6's: 3 L + 2,048 + E, over the two groups)."""
    total, parts = _phase(_stage(8, overlap=True), "optimizer")
    assert parts["Gradients"] == 2 * (3 * L + 2_048 + E)
    assert total == 2 * N + 12 * S + WORKSPACES + 2 * (3 * L + 2_048 + E) + 8 * S


def test_overlap_comm_with_accumulation_keeps_every_gradient_whole_until_the_last_micro_batch():
    """Two micro-batches: ZeRO-1 reduces only at the boundary (l. 1742), so the first micro-batch's gradients
    accumulate whole (2 B x N through the second forward) and the second backward allocates grads_in_partition
    (rank 6's, the busiest) beside them, at the head's reduction."""
    stage = _stage(8, overlap=True, global_batch_size=16)
    _, forward = _phase(stage, "forward")
    _, backward = _phase(stage, "backward")
    assert forward["Gradients"] == backward["Gradients"] == 2 * N
    assert backward["Gradient partition (grads_in_partition, allocated at the first reduction)"] == \
        2 * (3 * L + 2_048 + E)


def test_kept_elements_adds_the_other_ranks_extra_large_tensors():
    """Tensors 3, 10, 2, 10 over two ranks (one group: shares of 14, 25 padded to 28), bucket 5: rank 0 owns the first
    three whole (15) and keeps the last (10, over the bucket) whole: 25; rank 1 owns 2 and 10 (12) and keeps the 10
    at index 1: 22. From index 2 on only the last is counted made; offloaded (own False) only the kept ones: 10."""
    from estimator.memory.deepspeed_zero1_overlap import kept_elements

    assert kept_elements((3.0, 10.0, 2.0, 10.0), 2, 5) == 25.0
    assert kept_elements((3.0, 10.0, 2.0, 10.0), 2, 5, made_from=2) == 25.0
    assert kept_elements((3.0, 10.0, 2.0, 10.0), 2, 5, made_from=4) == 15.0
    assert kept_elements((3.0, 10.0, 2.0, 10.0), 2, 5, own=False) == 10.0
    # two groups, (3, 10) and (2, 10), each partitioned on its own (shares of 8 and 6): each 10 overlaps both
    # ranks' shares of its group, so no rank keeps another's; rank 0 owns 3 + 10 and 2 + 10, 25
    assert kept_elements((3.0, 10.0, 2.0, 10.0), 2, 5, own=False, groups=((0, 1), (2, 3))) == 0.0
    assert kept_elements((3.0, 10.0, 2.0, 10.0), 2, 5, groups=((0, 1), (2, 3))) == 25.0


def test_first_reduction_counts_what_the_bucket_took():
    """Tensors 3, 4, 10 with a bucket of 8: 3 and 4 are copied into the bucket (their storage freed) before the 10
    overflows it; the largest slice of them in a share of 5 is 3 (the 4 lies on [3, 7): 2 of it). A first tensor
    over the bucket is reduced alone: nothing moved, its slice in the share."""
    assert _first_reduction((3.0, 4.0, 10.0), 5.0, 8) == (7.0, 3.0)
    assert _first_reduction((10.0, 4.0), 6.0, 8) == (0.0, 6.0)


def test_an_moe_model_without_expert_parallelism_is_partitioned_as_a_dense_one():
    """Qwen3-30B-A3B, 8 ranks, ZeRO-1, EP 1: a transformers MoE block is no deepspeed.moe MoE layer (engine.py
    l. 1735-1739: has_moe_layers stays False), so its fused experts are ordinary parameters partitioned with the
    rest. A layer: q 8,388,608, k and v 1,048,576, the q/k norms 128 each, o 8,388,608, two norms 2,048, the router
    262,144 (19,140,864 so far), the experts' gate_up 128 x 3,072 x 1,024 = 402,653,184 and down 201,326,592:
    L = 623,120,640; with the embedding and the head (151,936 x 2,048 each) and the final norm, N = 30,532,122,624.
    The Trainer's decay group (every matrix, the experts' and router's included: a layer's L - 4,352) has shares of
    S_D = 3,816,488,960: rank 1's starts in layer 5's gate_up (S_D - E = 5 (L - 4,352) + 389,742,592) and ends in
    layer 11's down (2 S_D - E = 11 (L - 4,352) + 467,533,824): layer 5's experts and layers 6-11's matrices. The
    no-decay group (a layer's q and k norms of 128, two norms of 2,048; the final norm) has shares of 26,368 =
    6 x 4,352 + 256: rank 1's [26,368, 52,736) starts where layer 6's k norm ends (that one not in it) and ends in
    layer 12's input norm: layer 6's two norms, layers 7-11's, layer 12's q and k norms and input norm, 6 x 4,352 +
    2,048. So layer 5's experts, six layers whole and 2,048: the busiest rank's grads_in_partition at the step,
    where every gradient was counted whole before."""
    from estimator import Parallel, Training, estimate
    from estimator.models.presets import get_architecture

    layer, experts, moe_e = 19_140_864 + 402_653_184 + 201_326_592, 402_653_184 + 201_326_592, 151_936 * 2_048
    n = 2 * moe_e + 48 * layer + 2_048
    assert layer == 623_120_640 and n == 30_532_122_624 and n // 8 == 3_816_515_328
    decay = layer - 4_352
    s_d = (2 * moe_e + 48 * decay) // 8
    assert s_d == 3_816_488_960 and (48 * 4_352 + 2_048) // 8 == 26_368 == 6 * 4_352 + 256
    assert 19_140_864 - 4_352 <= s_d - moe_e - 5 * decay == 389_742_592 < 19_140_864 - 4_352 + 402_653_184
    assert 19_140_864 - 4_352 + 402_653_184 <= 2 * s_d - moe_e - 11 * decay == 467_533_824 < decay
    stage = estimate(get_architecture("qwen3-30b-a3b"), Training(framework="deepspeed", seq_len=2048,
                                                                   global_batch_size=8),
                     Parallel(dp=8, zero_stage=1)).stages[0]
    _, step = _phase(stage, "optimizer")
    assert step["Gradients"] == 2 * (experts + 6 * decay + 6 * 4_352 + 2_048) == 2 * (experts + 6 * layer + 2_048) \
        == 2 * 4_342_705_664


def test_under_expert_parallelism_the_experts_partition_over_the_expert_data_parallel_ranks():
    """Qwen3-30B-A3B, 8 ranks, EP 2: DeepSpeed's expert groups are partitioned over the expert-data-parallel group
    (8 / 2 = 4 ranks), the rest over all 8; grads_in_partition holds both (copy_grads_in_partition sums every
    group's params_in_partition). The dense tensors, in the Trainer's two groups: the decay group, both ends (E =
    151,936 x 2,048 each) and 48 layers' attention matrices and router (19,136,512), 1,540,882,432, shares of
    192,610,304; rank 6's runs from layer 44's q (6 x 192,610,304 - E = 44 x 19,136,512 + 2,490,368) into the head:
    4 layers' and the head, 387,710,976. The no-decay group (a layer's q and k norms of 128 and two norms of 2,048,
    4,352; the final norm), shares of 26,368 = 6 x 4,352 + 256: rank 6's [158,208, 184,576) starts in layer 36's
    input norm (36 x 4,352 + 1,536) and ends in layer 42's (42 x 4,352 + 1,792): 4,096 + 5 x 4,352 + 2,304 =
    28,160. Rank 6 holds 387,739,136 dense elements, the busiest. A rank's experts: 48 x half of 603,979,776,
    shares of exactly 12 layers' (3,623,878,656)."""
    from estimator import Parallel, Training, estimate
    from estimator.models.presets import get_architecture

    moe_e, attention, experts = 151_936 * 2_048, 19_140_864 - 4_352, (402_653_184 + 201_326_592) // 2
    decay = 2 * moe_e + 48 * attention
    assert decay == 1_540_882_432 == 8 * 192_610_304 and 6 * 192_610_304 - moe_e == 44 * attention + 2_490_368
    assert (48 * 4_352 + 2_048) // 8 == 26_368 and 6 * 26_368 == 36 * 4_352 + 1_536 and 7 * 26_368 == 42 * 4_352 + 1_792
    assert 48 * experts == 4 * 3_623_878_656 == 4 * 12 * experts
    stage = estimate(get_architecture("qwen3-30b-a3b"), Training(framework="deepspeed", seq_len=2048,
                                                                   global_batch_size=8),
                     Parallel(dp=8, ep=2, zero_stage=1)).stages[0]
    _, step = _phase(stage, "optimizer")
    assert step["Gradients"] == 2 * (4 * attention + moe_e + 28_160 + 12 * experts) == 2 * 4_011_617_792


def test_under_tensor_parallelism_each_rank_partitions_its_shards():
    """TP 2, DP 8: each rank's engine flattens its own shards (the embedding, head, q, k, v, their bias, o, gate, up
    and down halved, the norms whole) and ZeRO partitions them over the 8 data-parallel ranks (engine.py
    seq_data_parallel_group). A layer is L2 = 4 x 2,048^2 / 2 + 3,072 + 2 x 2,048 + 3 x 2,048 x 5,504 / 2 =
    25,304,064; the rank's tensors 2 x E / 2 + 24 L2 + 2,048 = 918,464,512, a multiple of 16: shares of S2 = 114,808,064.
    The Trainer's groups of the shards: decay (E / 2, layers' matrices L2 - 7,168, the head), shares of 114,786,304;
    the rest (a layer's q, k, v bias halves of 1,024 and two norms of 2,048: 7,168; the final norm), shares of
    21,760 = 3 x 7,168 + 256. Rank 0's first reduction allocates its partition: E / 2 (over the decay share) and
    layers 0-2's and layer 3's q bias of the rest (3 x 7,168 + 1,024). At the step ranks 1 and 6 are the busiest
    (tests/test_deepspeed_zero2.py's TP case): E / 2 + 3 (L2 - 7,168) + 3 x 7,168 + 1,024 = E / 2 + 3 L2 + 1,024."""
    L2 = 4 * 2_048**2 // 2 + 3_072 + 2 * 2_048 + 3 * 2_048 * 5_504 // 2
    S2 = (E + 24 * L2 + 2_048) // 8
    assert L2 == 25_304_064 and S2 == 114_808_064 and E // 2 > S2 and E // 2 + 24 * L2 + 2_048 < 7 * S2
    assert 6 * S2 - E // 2 - 21 * L2 == 1_880_576 < 2_048**2 // 2
    stage = _stage(8, tp=2)
    _, backward = _phase(stage, "backward")
    assert backward["Gradients (whole, being reduced after backward)"] == 2 * (E + 24 * L2 + 2_048)
    assert backward["Gradient partition (grads_in_partition, allocated at the first reduction)"] == \
        2 * (E // 2 + 3 * 7_168 + 1_024)
    _, step = _phase(stage, "optimizer")
    assert step["Gradients"] == 2 * (E // 2 + 3 * L2 + 1_024) == 462_991_360
