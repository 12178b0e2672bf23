"""The estimate's reserved memory (max_memory_reserved) against SimuMax's real B200 Megatron-LM runs (issue 22,
tests/data/measured/published/simumax_b200: `measured.real_reserved_gib`, the largest over the ranks, against the
largest stage's estimate).

The runs without context parallelism (TP x DP x EP, and PP 2 under 1F1B; dense, or DeepSeek's MLA + MoE layers
under the all-to-all dispatcher with TE's grouped GEMM) replay the caching allocator over Megatron-Core's own order
of allocations (estimator/memory/megatron_replay.py, megatron_moe_replay.py); the others keep the flat 10% share and
say why (megatron_replay.replay_rule). The flat share was over on every run, by a median of 5.05% (up to 7.5%); on
the eight dense replayed runs it was 3.9% to 7.5% over, where the replay is 2.1% under to 0.03% under; on the four
MoE runs it was 4.5% to 7.0% over, where the replay is 0.15% under to 0.3% over (it was 1.0% to 2.3% over while the
allocated ledger stacked the combine's moment on the loss's logits, which Megatron makes after the decoder, and held
all local experts' fc2 weight gradient in the experts' backward, which TE's GroupedLinear under gradient-accumulation
fusion writes into main_grad: megatron_moe_replay.py). Over all 19 runs the median error is 0.0% (|error| 0.7%; it
was 0.9% and 1.6%). The allocated peaks are tests/test_published_megatron.py's.
The seven CP runs (all --cp-comm-type a2a) keep the flat share: TransformerEngine's all-to-all replayed on its two
streams leaves them up to 4.1% under (tests/test_megatron_cp_a2a.py).
"""

from __future__ import annotations

import statistics

import pytest

from estimator import estimate_config
from estimator.memory.replays import replay_rule
from estimator.memory.resolved import resolve
from validation.published_megatron.replay import imported, records

B200 = {r["id"]: r for r in records("simumax_b200")}
GiB = 2**30

# estimate / real_reserved_gib - 1 of the replayed runs (the flat share's in the comment)
REPLAYED = {
    "deepseekv2_tp1_ep4_pp2_dp4_l4_mbc4_cef": 0.0012,  # flat 0.061
    "deepseekv2_tp1_ep8_pp1_dp8_l4_mbc4_cef": 0.0028,  # flat 0.045
    "deepseekv3_l4_tp1_ep4_pp2_dp4_mbc4_cef": -0.0015,  # flat 0.070
    "deepseekv3_l4_tp1_ep8_pp1_dp8_mbc4_cef": -0.0002,  # flat 0.050
    "llama3_405b_l4_tp1_pp2_dp4_mbc4_cef": -0.0160,  # flat 0.039
    "llama3_405b_l4_tp2_pp1_dp4_mbc4_cef": -0.0003,  # flat 0.061
    "llama3_405b_l4_tp4_pp1_dp2_mbc4_cef": -0.0073,  # flat 0.065
    "llama3_405b_l4_tp8_pp1_dp1_mbc4_cef": -0.0170,  # flat 0.065
    "llama3_70b_l12_tp1_pp2_dp4_mbc4_cef": -0.0210,  # flat 0.039
    "llama3_70b_l12_tp4_pp1_dp2_mbc4_cef": -0.0043,  # flat 0.075
    "llama3_70b_l12_tp8_pp1_dp1_mbc4_cef": -0.0059,  # flat 0.072
    "llama3_70b_tp2_pp1_dp4_l12_mbc4_cef": -0.0003,  # flat 0.074
}
# the rest keep the flat share: the first word of the reason replay_rule gives
FLAT = {"cp": "context parallelism"}


def stages_of(record: dict):
    return estimate_config(imported(record).config).stages


def error(record: dict) -> float:
    """The largest stage's reserved memory against the largest rank's."""
    return max(s.reserved_peak_bytes for s in stages_of(record)) / GiB / record["measured"]["real_reserved_gib"] - 1


@pytest.mark.parametrize("run", sorted(REPLAYED))
def test_replayed_run(run):
    """Each replayed run's reserved memory to 0.1 point of its recorded error, none under by more than 3%."""
    record = B200[run]
    for stage in stages_of(record):
        cache = stage.component("fragmentation")
        assert "Megatron-Core's initialisation and two steps" in cache.formula
        assert "megatron_replay.py" in cache.source
    assert error(record) == pytest.approx(REPLAYED[run], abs=0.001)
    assert error(record) > -0.03


def test_replayed_median():
    """The issue's goal on the replayed runs: median within 1.5%, none under by more than 3%; over all 19 runs (the
    flat share's included) the median within 1.5% too (-0.02%; it was 5.05% with the flat share, 0.86% before the
    MoE ledger followed Megatron's order); the MoE runs within 0.5%."""
    errors = [error(B200[run]) for run in REPLAYED]
    assert abs(statistics.median(errors)) < 0.015 and min(errors) > -0.03
    assert all(abs(error(B200[run])) < 0.005 for run in REPLAYED if run.startswith("deepseek"))
    everything = [error(record) for record in B200.values()]
    assert statistics.median(everything) == pytest.approx(-0.0002, abs=0.001)


@pytest.mark.parametrize("run", sorted(set(B200) - set(REPLAYED)))
def test_the_others_keep_the_flat_share_and_say_why(run):
    record = B200[run]
    why = next(v for k, v in FLAT.items() if k in run)
    assert replay_rule(_resolved(imported(record).config)).startswith(why)
    assert all("share" in s.component("fragmentation").formula for s in stages_of(record))


def _resolved(config: dict):
    from estimator.models.loading import load_config

    cfg = load_config(config)
    return resolve(cfg.architecture, cfg.training, cfg.parallel, cfg.hardware)
