"""The estimate's reserved memory (max_memory_reserved) against SimuMax's real B200 Megatron-LM runs (issue 22,
tests/data/measured/published/simumax_b200: `measured.real_reserved_gib`, the largest over the ranks, against the
largest stage's estimate).

Every run replays the caching allocator over Megatron-Core's own order of allocations (estimator/memory/
megatron_replay.py): TP x DP x EP, PP 2 under 1F1B, dense or DeepSeek's MLA + MoE layers under the all-to-all
dispatcher with TE's grouped GEMM (megatron_moe_replay.py), and the seven CP runs (all --cp-comm-type a2a: dense layers
under TransformerEngine's all-to-all on two streams, TE's sequence-parallel gathers and the backward's activation
gradients, megatron_cp_a2a.py, megatron_te_linears.py; tests/test_megatron_cp_a2a.py). Under the distributed
optimizer each rank of DP x CP makes its own cut of the main parameters in the buffer's order, and the replay keeps
the largest rank's cache, as the measurement keeps the largest rank's reserved memory.
The flat 10% share was over on every run, by 0.6% to 7.5% (median 5.1%); the replay is 2.8% under to 2.3% over: on
the eight dense runs without CP 1.2% under to 0.9% over, on the four MoE runs 0.4% under to 0.01% over (1.0% to 2.3%
over while the allocated ledger stacked the combine's moment on the loss's logits, which Megatron makes after the
decoder, and held all local experts' fc2 weight gradient in the experts' backward, which TE's GroupedLinear under
gradient-accumulation fusion writes into main_grad: megatron_moe_replay.py; 0.1% under to 0.3% over while the
experts' backward moment stayed beside the loss's saved tensors, which the loss's backward frees first), on the seven
CP runs 2.8% under (70B, TP 2, 131k tokens) to 0.03% over. Over all 19 runs the median |error| is 0.34% (it was 1.6%
with CP on the flat share and the MoE ledger's old order, 5.1% with the flat share everywhere), the median error
-0.27%. The allocated peaks
are tests/test_published_megatron.py's.
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

# estimate / real_reserved_gib - 1 of each run (the flat share's in the comment; before the distributed optimizer's
# ranks and buffer order were replayed, the runs without CP were as the second number says; (#): before the ledger held
# the activation gradients Megatron's 1F1B keeps between micro-batches, megatron_pp_grad.py)
REPLAYED = {
    "deepseekv2_tp1_ep4_pp2_dp4_l4_mbc4_cef": -0.0028,  # flat 0.061; 0.0146; 0.0012 (experts' backward by the loss); -0.0037 (#)
    "deepseekv2_tp1_ep8_pp1_dp8_l4_mbc4_cef": -0.0018,  # flat 0.045; 0.0158; 0.0028 (experts' backward by the loss)
    "deepseekv3_l4_tp1_ep4_pp2_dp4_mbc4_cef": -0.0006,  # flat 0.070; 0.0227; -0.0011 (#)
    "deepseekv3_l4_tp1_ep8_pp1_dp8_mbc4_cef": 0.0001,  # flat 0.051; 0.0098
    "llama3_405b_l4_tp1_cp8_pp1_dp1_seq32768_mbc4_cef": -0.0004,  # flat 0.006
    "llama3_405b_l4_tp1_pp2_dp4_mbc4_cef": -0.0014,  # flat 0.039; -0.0160; -0.0027 (#)
    "llama3_405b_l4_tp2_cp4_pp1_dp1_seq131072_mbc4_cef": -0.0143,  # flat 0.009
    "llama3_405b_l4_tp2_cp4_pp1_dp1_seq32768_mbc4_cef": -0.0034,  # flat 0.047
    "llama3_405b_l4_tp2_pp1_dp4_mbc4_cef": -0.0003,  # flat 0.061; -0.0003
    "llama3_405b_l4_tp4_pp1_dp2_mbc4_cef": -0.0096,  # flat 0.065; -0.0073
    "llama3_405b_l4_tp8_pp1_dp1_mbc4_cef": -0.0121,  # flat 0.065; -0.0170
    "llama3_70b_l12_tp1_cp8_pp1_dp1_seq131072_mbc4_cef": -0.0242,  # flat 0.021
    "llama3_70b_l12_tp1_cp8_pp1_dp1_seq32768_mbc4_cef": 0.0003,  # flat 0.028
    "llama3_70b_l12_tp1_pp2_dp4_mbc4_cef": 0.0098,  # flat 0.039; -0.0210; 0.0089 (#)
    "llama3_70b_l12_tp2_cp4_pp1_dp1_seq131072_mbc4_cef": -0.0282,  # flat 0.018
    "llama3_70b_l12_tp2_cp4_pp1_dp1_seq32768_mbc4_cef": -0.0148,  # flat 0.069
    "llama3_70b_l12_tp4_pp1_dp2_mbc4_cef": -0.0011,  # flat 0.075; -0.0043
    "llama3_70b_l12_tp8_pp1_dp1_mbc4_cef": -0.0046,  # flat 0.072; -0.0059
    "llama3_70b_tp2_pp1_dp4_l12_mbc4_cef": 0.0006,  # flat 0.074; -0.0003
}


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
    """The issue's goal over all 19 runs: median |error| within 1.5% (0.34%; the median error -0.27%), none under by
    more than 3%, each CP run within 3%; the MoE runs within 0.5%."""
    errors = {run: error(B200[run]) for run in REPLAYED}
    assert set(errors) == set(B200)
    assert statistics.median(abs(e) for e in errors.values()) == pytest.approx(0.0034, abs=0.001)
    assert statistics.median(errors.values()) == pytest.approx(-0.0027, abs=0.001)
    assert min(errors.values()) > -0.03 and all(abs(e) < 0.03 for run, e in errors.items() if "_cp" in run)
    assert all(abs(e) < 0.005 for run, e in errors.items() if run.startswith("deepseek"))


@pytest.mark.parametrize("comm", ["p2p", "allgather", "a2a+p2p"])
def test_cps_other_exchanges_keep_the_flat_share_and_say_why(comm):
    """A CP run launched with another --cp-comm-type: its ring's or gathers' buffers are not replayed."""
    config = imported(B200["llama3_70b_l12_tp2_cp4_pp1_dp1_seq32768_mbc4_cef"]).config
    config = {**config, "parallel": {**config["parallel"], "cp_comm_type": comm}}
    assert replay_rule(_resolved(config)).startswith(f"context parallelism by {comm} (only the all-to-all's order")
    stage, = estimate_config(config).stages
    assert "share" in stage.component("fragmentation").formula


def _resolved(config: dict):
    from estimator.models.loading import load_config

    cfg = load_config(config)
    return resolve(cfg.architecture, cfg.training, cfg.parallel, cfg.hardware)
