"""DeepSpeed ZeRO-2's gradient partition (issue #23), by hand from DeepSpeed v0.19.5's stage_1_and_2.py
(estimator/memory/deepspeed_zero2.py cites the lines; v0.12.6's copy_grads_in_partition is the same): each of the HF
Trainer's two parameter groups is partitioned on its own (its flat tensor padded to a multiple of 2 x dp, cut in dp
shares) and `grads_in_partition` is torch.empty of the numel of every parameter overlapping the rank's share of each
group, whole. The busiest rank sets the per-GPU gradients, not N/d.

The real-GPU ZeRO-2 record's Qwen-1.8B (untied head), 256 tokens, as the estimator lists its tensors in module order:
the embedding E = 151,936 x 2,048, 24 layers (q, k, v of 2,048^2, one qkv bias of 6,144, o, two norms of 2,048,
gate and up of 2,048 x 5,504, down), the final norm, the head (E). The weight-decay group (every matrix: E, each
layer's D = 4 x 2,048^2 + 3 x 2,048 x 5,504, the head) holds N_D = 2 E + 24 D; the other group (each layer's q, k and
v biases of 2,048, three tensors as Qwen2Attention holds them, and two norms, 10,240; then the final norm)
N_V = 24 x 10,240 + 2,048. The rule is measured per rank on real DeepSpeed 0.19.5 over 2 and 4 gloo ranks
(tests/test_deepspeed_partitions.py)."""

from __future__ import annotations

import copy
import json
from pathlib import Path

from estimator import estimate_config
from estimator.memory.deepspeed_offload import rank_overlaps
from estimator.memory.deepspeed_zero2 import busiest_rank

E = 151_936 * 2_048
D = 4 * 2_048**2 + 3 * 2_048 * 5_504
Q = 2_048**2  # q, k, v, o
F = 2_048 * 5_504  # gate, up, down
LAYER_V = 3 * 2_048 + 2 * 2_048  # a layer's no-decay tensors: the q, k and v biases, the two norms
N_D = 2 * E + 24 * D
N_V = 24 * LAYER_V + 2_048
N = N_D + N_V


def _stage(dp: int, tp: int = 1, **training):
    path = (Path(__file__).parent / "data" / "measured" / "gpu" / "deepspeed" /
            "deepspeed-qwen-1.8b-zero2-foreach-adamw-recompute-s256-b1.json")
    config = copy.deepcopy(json.loads(path.read_text())["config"])
    config["training"].update({"global_batch_size": dp, **training})
    config["parallel"].update(dp=dp, tp=tp)
    return estimate_config(config).stages[0]


def _gradients(stage, phase: str) -> int:
    return next(c.bytes for p in stage.phases if p.name == phase for c in p.components if c.label == "Gradients")


def test_the_layout():
    assert N == 1_836_828_672 and D == 50_593_792 and N_V == 247_808
    assert N_D % 16 == 0 and N_V % 16 == 0  # no padding at dp 4 or 8: the shares are N_D / dp and N_V / dp


def test_dp8_busiest_rank_holds_the_embedding_and_three_layers():
    """dp 8: decay shares of S = N_D / 8 = 229,572,608. Rank 1's [S, 2S) ends 147,980,288 elements past the
    embedding, inside layer 2's down (2 D + Q x 4 + F x 2 = 141,854,720 < that < 3 D): the embedding and layers 0-2,
    E + 3 D. Rank 6's (6 S - E = 21 D + 3,801,088, inside layer 21's q; the head starts before 7 S) is the same
    sum: layers 21-23 and the head. A middle rank holds about S plus two tensors. The no-decay shares, 30,976 =
    3 x 10,240 + 256: rank 1's runs from layer 3's q bias into layer 6's, three layers and a q bias, 32,768 (rank
    6's the same, layer 18's q bias to layer 21's). Rank 1: E + 3 D + 32,768, twice N/8."""
    S = N_D // 8
    assert 2 * D + 4 * Q + 2 * F < 2 * S - E < 3 * D and 6 * S - E - 21 * D == 3_801_088 < Q and N_D - E < 7 * S
    decay = rank_overlaps(tuple([E] + [Q] * 4 + [F] * 3) + tuple([Q] * 4 + [F] * 3) * 23 + (E,), 8)
    assert decay[1] == decay[6] == E + 3 * D == max(decay)
    assert 3 * 10_240 < N_V // 8 < 3 * 10_240 + 2_048
    busiest = E + 3 * D + 3 * LAYER_V + 2_048
    assert busiest == 462_979_072 > 2 * (N // 8)
    stage = _stage(8)
    assert _gradients(stage, "optimizer") == _gradients(stage, "backward") == 2 * busiest == 925_958_144


def test_dp4_busiest_rank_is_a_middle_one():
    """dp 4: decay shares of 459,145,216 (2 x the dp-8 share). Rank 0 holds E + 3 D (it ends inside layer 2's down),
    rank 3 layers 21-23 and the head, E + 3 D again; rank 1 starts inside layer 2's down and ends exactly where
    layer 12 starts (2 S - E = 12 D: that tensor is not in the partition, get_partition_info's `current_index <
    end_index`): layer 2's down and layers 3-11, F + 9 D = 466,616,320, the most. No-decay shares of 61,952 =
    6 x 10,240 + 512: rank 1 runs from layer 6's q bias into layer 12's, six layers and a q bias, 63,488."""
    S = N_D // 4
    assert 2 * S - E == 12 * D and 2 * D + 4 * Q + 2 * F < S - E < 3 * D
    busiest = F + 9 * D + 6 * LAYER_V + 2_048
    assert F + 9 * D == 466_616_320 > E + 3 * D and busiest == 466_679_808
    stage = _stage(4)
    assert _gradients(stage, "optimizer") == 2 * busiest == 933_359_616


def test_under_tensor_parallelism_the_groups_are_the_ranks_shards():
    """TP 2, dp 8: the rank's shards (matrices, the embedding and head and the qkv bias halved; norms whole). Decay:
    E / 2, layers of D2 = D / 2 = 25,296,896, the head; 918,290,432 in all, shares of 114,786,304; rank 1's ends
    23,396,352 into layer 2 (inside its down, which starts at 19,660,800): E / 2 + 3 D2 (rank 6's, layers 21-23 and
    the head, the same). No-decay: layers of 3 x 1,024 (the q, k, v bias halves) + 2 x 2,048 = 7,168 and the final
    norm, 174,080, shares of 21,760 = 3 x 7,168 + 256: rank 1's from layer 3's q bias (1,024) into layer 6's,
    3 x 7,168 + 1,024."""
    D2, V2 = D // 2, 3_072 + 2 * 2_048
    S2 = (E + 24 * D2) // 8
    assert S2 == 114_786_304 and 2 * S2 - E // 2 - 2 * D2 == 23_396_352 and (24 * V2 + 2_048) // 8 == 3 * V2 + 256
    busiest = E // 2 + 3 * D2 + 3 * V2 + 1_024
    assert _gradients(_stage(8, tp=2), "optimizer") == 2 * busiest == 462_991_360


def test_busiest_rank_sums_each_rank_over_the_groups():
    """The two groups' busiest ranks differ: each rank's own sum is taken, not the sum of the maxima (15). Group A =
    (2, 6) over 2 ranks, shares of 4: rank 0 [0, 4) touches both (8), rank 1 [4, 8) the 6; group B = (1, 5, 2):
    rank 0 touches 1 and 5 (6), rank 1 5 and 2 (7). Rank 0: 8 + 6 = 14, rank 1: 6 + 7 = 13."""
    assert rank_overlaps((2.0, 6.0), 2) == [8.0, 6.0] and rank_overlaps((1.0, 5.0, 2.0), 2) == [6.0, 7.0]
    assert busiest_rank(((2.0, 6.0), (1.0, 5.0, 2.0)), 2) == 14.0


def test_one_gpu_and_offload_keep_the_flat_partition():
    """dp 1 holds every gradient, N (the measured H200 runs); offload_optimizer puts the partition on the host."""
    assert _gradients(_stage(1), "optimizer") == 2 * N
    assert _gradients(_stage(8, offload_optimizer="cpu"), "optimizer") == 0
