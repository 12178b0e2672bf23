"""The pieces of Megatron-Core's allocator replay (estimator/memory/megatron_replay.py), each against numbers worked
by hand or against the replay without its shortcut; its accuracy against real GPUs is held by
tests/test_gpu_megatron_records.py and tests/test_published_megatron_reserved.py."""

from __future__ import annotations

import pytest

from estimator.memory import megatron_replay, one_f_one_b_replay
from estimator.memory.resolved import resolve
from estimator.models.loading import load_config


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


@pytest.mark.parametrize(("dp", "expected"), [(1, [10, 20, 30]), (2, [30]), (3, [20]), (4, [15])])
def test_the_first_ranks_main_parameters(dp, expected):
    """The distributed optimizer's first rank owns the first 1/dp of the one bucket, laid out from the last
    parameter: of 10 + 20 + 30 elements, dp 2 gives it the last parameter whole, dp 3 and 4 part of it."""
    assert megatron_replay._shards([10, 20, 30], dp) == expected


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
    monkeypatch.setattr(megatron_replay, "_one_f_one_b", _every_micro_batch)
    assert _cache(config, stage) == skipped
    assert len(backwards) - ran == 4 * 2 * 64 > 20 * ran  # every stage's two steps of 64, against a few walked


def _every_micro_batch(schedule, pp: int, rank: int, microbatches: int) -> None:
    """1F1B with the walk over every micro-batch: nothing recorded or skipped."""
    walk = schedule.walk
    warmup = min(pp - rank - 1, microbatches)
    waiting = [walk.forward() for _ in range(warmup)]
    for _ in range(microbatches - warmup):
        waiting.append(walk.forward())
        walk.backward(waiting.pop(0))
    for state in waiting:
        walk.backward(state)


def _cache(config: dict, stage: int) -> tuple[int, int]:
    from estimator import estimate_config
    from estimator.spec import memo

    memo.PER_LAYOUT.clear()  # the replay is remembered per configuration
    component = estimate_config(config).stages[stage].component("fragmentation")
    return component.bytes, component.formula
