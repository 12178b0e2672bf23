"""DeepSpeed ZeRO-1's gradients from the end of backward to the step (issue #23), by hand from DeepSpeed v0.19.5's
stage_1_and_2.py (estimator/memory/deepspeed_zero1.py cites the lines): with overlap_comm off (ZeRO-1's default)
every 16-bit gradient is whole until autograd ends; reduce_gradients then walks them in order, rank 0 allocating
`grads_in_partition` (the whole of every tensor overlapping its partition) at its first reduction, or under
offload_optimizer taking the reduced gradient's slice in fp64 for its norm; the step keeps `grads_in_partition`
alone (offload: no gradient on the GPU).

The real-GPU ZeRO-2 record's Qwen-1.8B (untied head), 256 tokens, full recompute, the 'auto' bucket (h x h =
4,194,304 elements): N = 1,836,828,672 elements; the estimator's module order is the embedding E = 151,936 x 2,048,
24 layers of L = 50,604,032 (q, k, v, their biases, o, two norms, gate, up, down), the final norm (2,048), the head
(E). Eight ranks share N / 8 = S = 229,603,584 each (N is a multiple of 2 x 8)."""

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
BUCKET = 2_048**2
WORKSPACES = 2 * 32 * 2**20


def _stage(dp: int, offload: str = "none", overlap: bool | None = None, **training):
    path = (Path(__file__).parent / "data" / "measured" / "gpu" / "deepspeed" /
            "deepspeed-qwen-1.8b-zero2-foreach-adamw-recompute-s256-b1.json")
    config = copy.deepcopy(json.loads(path.read_text())["config"])
    for key in ("overlap_comm", "reduce_bucket_size"):
        config["training"].pop(key)
    if overlap is not None:
        config["training"]["overlap_comm"] = overlap
    config["training"].update(offload_optimizer=offload, global_batch_size=dp, **training)
    config["parallel"].update(dp=dp, zero_stage=1)
    return estimate_config(config).stages[0]


def _phase(stage, name: str) -> tuple[int, dict[str, int]]:
    phase = next(p for p in stage.phases if p.name == name)
    return (sum(c.bytes for c in phase.components),
            {c.label: c.bytes for c in phase.components for c in (c.parts or (c,))})


def test_the_layout():
    assert L == 50_604_032 and 24 * L + 2 * E + 2_048 == N and S == 229_603_584


def test_zero1_reduces_after_backward_beside_every_gradient():
    """Rank 0: the embedding (E > S, over the bucket) is first; reduce_gradients keeps it whole (l. 1203) and the
    next parameter's hook reduces it (l. 1179), copy_grads_in_partition allocating grads_in_partition (l. 1651)
    for rank 0's tensors, the embedding alone (E > S), while every gradient is still whole: 2 B x (N + E) beside
    the bucket. The states: 2 B x N parameters, 4 + 8 B x S master weights and moments, the workspaces."""
    total, parts = _phase(_stage(8), "backward")
    assert parts["Gradients (whole, being reduced after backward)"] == 2 * N
    assert parts["Gradient partition (grads_in_partition, allocated at the first reduction)"] == 2 * E
    assert parts["Gradient reduction bucket"] == 2 * BUCKET
    assert total == 2 * N + 12 * S + WORKSPACES + 2 * N + 2 * E + 2 * BUCKET == 10_800_385_024


def test_zero1_steps_with_its_partition_alone():
    """The epilogue drops every .grad (l. 2017): the step holds grads_in_partition, the busiest rank's. Rank 6's
    share [6S, 7S) starts 3,771,904 elements into layer 21 (6S - E = 21 L + 3,771,904, inside its q) and reaches
    into the head (N - E < 7S): layers 21-23, the final norm and the head, 3 L + 2,048 + E. Beside it the fp32
    copy of the S-element partition and foreach AdamW's sqrt(v) (4 + 4 B x S)."""
    assert 6 * S - E - 21 * L == 3_771_904 < 2_048**2 and N - E < 7 * S
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


def test_overlap_comm_is_left_as_it_was():
    """overlap_comm on reduces in backward's hooks (l. 1737): not modelled here, every gradient kept to the step."""
    _, step = _phase(_stage(8, overlap=True), "optimizer")
    assert step["Gradients"] == 2 * N


def test_first_reduction_counts_what_the_bucket_took():
    """Tensors 3, 4, 10 with a bucket of 8: 3 and 4 are copied into the bucket (their storage freed) before the 10
    overflows it; the largest slice of them in a share of 5 is 3 (the 4 lies on [3, 7): 2 of it). A first tensor
    over the bucket is reduced alone: nothing moved, its slice in the share."""
    assert _first_reduction((3.0, 4.0, 10.0), 5.0, 8) == (7.0, 3.0)
    assert _first_reduction((10.0, 4.0), 6.0, 8) == (0.0, 6.0)
