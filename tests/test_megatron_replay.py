"""The pieces of Megatron-Core's allocator replay (estimator/memory/megatron_replay.py), each against numbers worked
by hand or against the replay without its shortcut; its accuracy against real GPUs is held by
tests/test_gpu_megatron_records.py and tests/test_published_megatron_reserved.py."""

from __future__ import annotations

import pytest

from estimator.memory import megatron_replay, one_f_one_b_replay
from estimator.memory.resolved import resolve
from estimator.models.loading import load_config
from tests.test_replay_trace import _walked  # 1F1B walking every micro-batch (the reference)


def resolved(config: dict):
    cfg = load_config(config)
    return resolve(cfg.architecture, cfg.training, cfg.parallel, cfg.hardware)


def test_the_rank_tensors_are_megatrons_modules():
    """Llama-3.1-8B at TP 2: linear_qkv fuses q, k and v ((4096 + 2 x 1024) x 4096 / 2), the output projection
    4096 x 4096 / 2, the two RMSNorm scales whole, fc1 fuses gate and up (2 x 14336 x 4096 / 2), fc2 4096 x 14336 / 2;
    the embedding and output layer 128256 x 4096 / 2 (128,256 is a multiple of 128 x 2: no padding)."""
    cfg = resolved({"model": "llama-3.1-8b", "parallel": {"tp": 2}})
    embedding, layers, head = megatron_replay.rank_tensors(cfg, cfg.stages[0])
    assert embedding == [128256 * 4096 / 2] and head == [4096, 128256 * 4096 / 2]
    assert len(layers) == 32
    assert layers[0] == [6144 * 4096 / 2, 4096 * 4096 / 2, 4096, 4096, 2 * 14336 * 4096 / 2, 4096 * 14336 / 2]


def test_a_tied_models_last_stage_makes_its_own_output_weight():
    """GPTModel under PP with shared embeddings: the last stage allocates the output layer's weight (the first
    stage's embedding is another rank's)."""
    cfg = resolved({"model": "llama-3.2-1b", "parallel": {"pp": 2}, "training": {"global_batch_size": 8}})
    first, last = cfg.stages
    assert megatron_replay.rank_tensors(cfg, first)[2] == []
    assert megatron_replay.rank_tensors(cfg, last)[2] == [2048, 128256 * 2048]


@pytest.mark.parametrize(("dp", "rank", "expected"), [
    (1, 0, [30, 20, 10]), (2, 0, [30]), (2, 1, [20, 10]), (3, 0, [20]), (3, 1, [10, 10]), (3, 2, [10, 10]),
    (4, 0, [15]), (4, 3, [5, 10])])
def test_a_ranks_main_parameters(dp, rank, expected):
    """The distributed optimizer's rank r owns [r/dp, (r+1)/dp) of the one bucket, laid out from the last parameter,
    and makes its main parameters in that order: of 10 + 20 + 30 elements (the buffer 30 | 20 | 10), dp 2 gives rank 0
    the last parameter whole and rank 1 the other two; dp 3 cuts at 20 and 40, dp 4 at 15, 30 and 45."""
    assert megatron_replay._shards([10, 20, 30], dp, rank) == expected


@pytest.mark.parametrize(("dp", "cp", "batch", "ranks"), [
    (1, 1, 4, [0]), (2, 4, 8, list(range(8))), (4, 4, 16, [0, 2, 4, 6, 9, 11, 13, 15]),
    (4, 4, 4 * 16, [0, 5, 10, 15]), (4, 4, 4 * 64, [0])])
def test_the_ranks_replayed(dp, cp, batch, ranks):
    """Every rank of DP x CP under the distributed optimizer up to 8 and 64 micro-batches walked: of 16 ranks at 4
    micro-batches, 8 evenly spaced (i x 15 / 7, rounded); at 16 micro-batches 4 (i x 15 / 3); at 64 the first."""
    cfg = resolved({"model": "llama-3.2-1b", "parallel": {"dp": dp, "cp": cp, "zero_stage": 1},
                    "training": {"framework": "megatron", "global_batch_size": batch}})
    assert cfg.microbatches == batch // dp
    assert megatron_replay._ranks(cfg) == ranks


class _Recorder:
    """A schedule (one_f_one_b_replay.Schedule's steady state over this walk) that records 1F1B's order; its
    allocator state never repeats."""

    recorded = False
    steady = one_f_one_b_replay.Schedule.steady

    def __init__(self):
        self.trace, self.made = [], 0
        self.walk = self.program = self

    def state(self):
        return len(self.trace)

    def forward(self):
        self.made += 1
        self.trace.append(f"F{self.made}")
        return one_f_one_b_replay._Batch((self.made, [], ([], []), None), None)

    def backward(self, batch):
        self.trace.append(f"B{batch.state[0]}")


@pytest.mark.parametrize(("rank", "expected"), [
    (0, "F1 F2 F3 F4 B1 F5 B2 B3 B4 B5"),  # pp - rank - 1 = 3 warm-up forwards
    (2, "F1 F2 B1 F3 B2 F4 B3 F5 B4 B5"),
    (3, "F1 B1 F2 B2 F3 B3 F4 B4 F5 B5"),  # the last stage: one forward, one backward
])
def test_one_f_one_b_order(rank, expected):
    walk = _Recorder()
    megatron_replay._one_f_one_b(walk, 4, rank, 5)
    assert " ".join(walk.trace) == expected


@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_skipping_whole_cycles_changes_nothing(monkeypatch, stage):
    """The steady state's short cuts (micro-batches replayed from a record, whole cycles skipped, the small pool
    replayed alone: one_f_one_b_replay.py) against the walk over every micro-batch: the same cache and segments, on
    each stage of a 4-stage pipeline of 64 micro-batches."""
    config = {"model": "llama-3.1-70b", "parallel": {"tp": 8, "pp": 4, "dp": 8},
              "training": {"global_batch_size": 512}}
    backwards = []
    backward = megatron_replay._Walk.backward
    monkeypatch.setattr(megatron_replay._Walk, "backward",
                        lambda walk, state: backwards.append(1) or backward(walk, state))
    skipped = _cache(config, stage)
    ran = len(backwards)
    monkeypatch.setattr(megatron_replay, "_one_f_one_b", _walked)
    assert _cache(config, stage) == skipped
    assert len(backwards) - ran == 4 * 2 * 64 > 20 * ran  # every stage's two steps of 64, against a few walked


def _cache(config: dict, stage: int) -> tuple[int, int]:
    from estimator import estimate_config
    from estimator.spec import memo

    memo.PER_LAYOUT.clear()  # the replay is remembered per configuration
    component = estimate_config(config).stages[stage].component("fragmentation")
    return component.bytes, component.formula
