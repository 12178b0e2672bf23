"""The estimate's reserved memory (max_memory_reserved) against SimuMax's real B200 Megatron-LM runs (issue 22,
tests/data/measured/published/simumax_b200: `measured.real_reserved_gib`, the largest rank's).

The dense TP x DP runs without a pipeline or context parallelism replay the caching allocator over Megatron-Core's
own order of allocations (estimator/memory/megatron_replay.py); the others keep the flat 10% share and say why
(megatron_replay.replay_rule). The flat share was over on every run, by a median of 5.05% (up to 7.5%): on the six
replayed runs it was 6.1% to 7.5% over, where the replay is 1.7% under to 0.03% under. The allocated peaks are
tests/test_published_megatron.py's.
"""

from __future__ import annotations

import statistics

import pytest

from estimator import estimate_config
from estimator.memory.replays import replay_rule
from estimator.memory.resolved import resolve
from validation.published_megatron.replay import imported, measured_stage, records

B200 = {r["id"]: r for r in records("simumax_b200")}
GiB = 2**30

# estimate / real_reserved_gib - 1 of the replayed runs (the flat share's in the comment)
REPLAYED = {
    "llama3_405b_l4_tp2_pp1_dp4_mbc4_cef": -0.0003,  # flat 0.061
    "llama3_405b_l4_tp4_pp1_dp2_mbc4_cef": -0.0073,  # flat 0.065
    "llama3_405b_l4_tp8_pp1_dp1_mbc4_cef": -0.0170,  # flat 0.065
    "llama3_70b_l12_tp4_pp1_dp2_mbc4_cef": -0.0043,  # flat 0.075
    "llama3_70b_l12_tp8_pp1_dp1_mbc4_cef": -0.0059,  # flat 0.072
    "llama3_70b_tp2_pp1_dp4_l12_mbc4_cef": -0.0003,  # flat 0.074
}
# the rest keep the flat share: the first word of the reason replay_rule gives
FLAT = {"pp2": "a pipeline", "deepseek": "an MoE", "cp": "context parallelism"}  # the first that names the run


def stage_of(record: dict):
    result = estimate_config(imported(record).config)
    return next(s for s in result.stages if s.stage == measured_stage(record, result))


def error(record: dict) -> float:
    return stage_of(record).reserved_peak_bytes / GiB / record["measured"]["real_reserved_gib"] - 1


@pytest.mark.parametrize("run", sorted(REPLAYED))
def test_replayed_run(run):
    """Each replayed run's reserved memory to 0.1 point of its recorded error, none under by more than 3%."""
    record = B200[run]
    cache = stage_of(record).component("fragmentation")
    assert "Megatron-Core's initialisation and two steps" in cache.formula
    assert "megatron_replay.py" in cache.source
    assert error(record) == pytest.approx(REPLAYED[run], abs=0.001)
    assert error(record) > -0.03


def test_replayed_median():
    """The issue's goal on the replayed runs: median within 1.5%, none under by more than 3%."""
    errors = [error(B200[run]) for run in REPLAYED]
    assert abs(statistics.median(errors)) < 0.015 and min(errors) > -0.03


@pytest.mark.parametrize("run", sorted(set(B200) - set(REPLAYED)))
def test_the_others_keep_the_flat_share_and_say_why(run):
    record = B200[run]
    why = next(v for k, v in FLAT.items() if k in run)
    assert replay_rule(_resolved(imported(record).config)).startswith(why)
    assert "share" in stage_of(record).component("fragmentation").formula


def _resolved(config: dict):
    from estimator.models.loading import load_config

    cfg = load_config(config)
    return resolve(cfg.architecture, cfg.training, cfg.parallel, cfg.hardware)
