"""The DeepSpeed replay over data-parallel ranks (estimator/memory/deepspeed_replay.py): ZeRO-2 at the busiest rank's
sizes, by hand from DeepSpeed v0.19.5's runtime/zero/stage_1_and_2.py (each Trainer group flattened whole, aligned to
2 x dp, l. 389-390; the rank's equal share cast to fp32, l. 489; averaged_gradients the narrow() pieces of the
tensors in the share, get_flat_partition l. 2092-2163), and the published run it changes."""

from __future__ import annotations

import copy

from estimator import estimate_config
from estimator.memory.deepspeed_replay import _zero2_ranks
from estimator.memory.sharding import stage_parameters
from estimator.spec.parallel import Parallel

from test_deepspeed_gathers import QWEN_7B

H, V, F, L = 4096, 151936, 11008, 32
DECAY = 2 * V * H + L * (3 * H * H + H * H + 3 * H * F)  # embedding, head; c_attn, c_proj, w1, w2, mlp c_proj
NO_DECAY = L * (2 * H + 3 * H) + H  # two norms and c_attn's bias a layer, the final norm


def zero2(dp: int) -> dict:
    config = copy.deepcopy(QWEN_7B)
    config["training"]["framework_version"] = "0.19.5"
    config["parallel"] = {"dp": dp, "zero_stage": 2}
    return config


def test_zero2_on_two_ranks_steps_each_groups_half_and_flattens_it_whole():
    assert DECAY == 7_720_665_088 and NO_DECAY == 659_456
    est = estimate_config(zero2(2))
    stage = stage_parameters(est.architecture, Parallel(dp=2), "deepspeed")[0]
    shares, flats, touched, pieces = _zero2_ranks(est.architecture, stage, Parallel(dp=2))
    assert shares == [DECAY / 2, -(-NO_DECAY // 4) * 2] == [3_860_332_544, 329_728]
    assert flats == [DECAY, 659_456]
    # the rank's pieces of the weight-decay tensors fill its share (nothing padded: DECAY is a multiple of 4)
    assert sum(pieces) == DECAY / 2 and max(pieces) == V * H
    assert DECAY / 2 < touched < DECAY  # whole tensors overlapping the share: the one across its edge whole


def fragmentation(config: dict) -> str:
    return next(c for c in estimate_config(config).stages[0].components if c.key == "fragmentation").formula


def test_zero_2_and_3_over_data_parallel_ranks_replay_and_zero_1_keeps_the_flat_share():
    assert fragmentation(zero2(4)).startswith("caching allocator replayed over DeepSpeed's initialisation")
    zero1 = zero2(2)
    zero1["parallel"]["zero_stage"] = 1
    assert fragmentation(zero1).endswith("flat share, no allocator replay: ZeRO-1 (the replay is measured on ZeRO-2 "
                                         "and ZeRO-3)")
