"""The estimate against Megatron-LM's published real-GPU memory (issue 22).

Two sources, each record citing its file and commit (validation/published_megatron builds them):

- tests/data/measured/published/megatron_golden: Megatron-LM core_v0.16.1's functional tests, the
  tensorboard rank's (the last rank's) ``mem-max-allocated-bytes`` on H100/A100 (golden values), the
  launch flags from the case's model_config.yaml;
- tests/data/measured/published/simumax_b200: SimuMax's B200 release table (Megatron-LM core_v0.14.0,
  TE 2.11 on 8 x B200), every rank's ``max_memory_allocated``; the record's stage is the largest's.

Each record's launch goes through our Megatron importer and the estimate of the measured stage.
The issue's goals are held here: the golden values' median |error| within 3% and no under-estimate
beyond 5% (the MoE cases the same); the B200 runs' median within 1.5% and none under by more than
3%. A record the estimate still misses by more is listed in KNOWN_MISSES with the mechanism, as a
strict expected failure: fixing it fails the test until it leaves the list.
"""

from __future__ import annotations

import statistics

import pytest

from validation.published_megatron.replay import PUBLISHED, distinct, records, replay

GOLDEN = records("megatron_golden")
B200 = records("simumax_b200")
GOLDEN_BOUND = 0.05  # no under-estimate beyond 5% (issue 22); over-estimates held to the same
B200_BOUND = 0.03  # none under by more than 3% (issue 22)

# record id -> the mechanism behind the miss (beyond the record's bound)
_ROUTING = ("dropless MoE routing drifts out of balance as the router trains: the golden series of the peak rises "
            "%s while mem-allocated-bytes after each step stays flat (no persistent buffer); the estimate assumes "
            "balanced routing (training.moe_capacity_factor 1) and is within 3%% of the early plateau")
KNOWN_MISSES: dict[str, str] = {
    "moe-gpt3_mcore_te_tp2_pp2_ep4_etp1_memory_speed": _ROUTING % "from 53.94 GiB (iterations 3-29) to 55.98 GiB "
                                                                  "(iteration 39)",
}
# moe-gpt3_mcore_te_tp2_pp2_ep4_etp1_mtp_resume_torch_dist_fp8 (the same drift, from 52.09 GiB at iterations 5-20 to
# 53.62 GiB at 40) left the list at -4.9%, within the bound, once the interleaved schedule's gradients were listed
# (megatron_vpp_grad.py; -5.0% before)


def by_id(recs: list[dict]) -> dict[str, dict]:
    return {r["id"]: r for r in recs}


def cases(recs: list[dict]) -> list:
    return [pytest.param(r, id=r["id"], marks=pytest.mark.xfail(reason=KNOWN_MISSES[r["id"]], strict=True))
            if r["id"] in KNOWN_MISSES else pytest.param(r, id=r["id"]) for r in recs]


def test_the_records_are_there_and_cite_their_source():
    assert len(GOLDEN) >= 100 and len(B200) == 19
    for record in GOLDEN:
        source = record["source"]
        assert source["repository"] == "NVIDIA/Megatron-LM" and source["tag"] == "core_v0.16.1"
        assert source["golden_values"].startswith(source["case"]) and len(source["golden_values_commit"]) == 40
        assert record["gpu"] in ("h100-80", "a100-80") and record["measured"]["max_allocated_bytes"] > 0
    for record in B200:
        assert record["source"]["repository"] == "MooreThreads/SimuMax" and record["gpu"] == "b200"
        assert record["measured"]["max_allocated_bytes"] == max(record["measured"]["max_allocated_bytes_by_stage"])
    # MoE, TP/PP/CP/EP, interleaved pipelines, the distributed optimizer, recompute and fp8 are all covered
    launches = " ".join(r["launch"] for r in GOLDEN)
    for flag in ("--num-experts", "--expert-model-parallel-size", "--context-parallel-size", "--fp8-format",
                 "--num-layers-per-virtual-pipeline-stage", "--use-distributed-optimizer",
                 "--recompute-granularity", "--multi-latent-attention"):
        assert flag in launches
    assert set(KNOWN_MISSES) <= {r["id"] for r in GOLDEN + B200}


def test_the_cases_left_out_say_why():
    """Every golden case with memory values is a record or listed with the reason it is not one."""
    lines = [l for l in (PUBLISHED / "megatron_golden" / "excluded.txt").read_text().splitlines()
             if l and not l.startswith("#")]
    excluded = dict(l.split("\t") for l in lines)
    assert len(excluded) >= 40 and all(why for why in excluded.values())
    assert not set(excluded) & {r["source"]["case"] for r in GOLDEN}


@pytest.mark.parametrize("record", cases(GOLDEN))
def test_golden_value_within_bound(record):
    row = replay(record)
    assert abs(row.error) <= GOLDEN_BOUND, f"{row.error:+.1%}: {row.estimated} vs {row.measured}"


@pytest.mark.parametrize("record", cases(B200))
def test_b200_run_within_bound(record):
    row = replay(record)
    assert abs(row.error) <= B200_BOUND, f"{row.error:+.1%}: {row.estimated} vs {row.measured}"


# SimuMax's four DeepSeek-V2/V3 runs (MLA + MoE, the all-to-all dispatcher, TE's grouped GEMM): the allocated error
# of the largest rank's stage, to 0.1 point. Each was +0.9% to +1.6% over while the ledger stacked the combine's moment
# on the loss's saved tensors and held the experts' fc2 weight gradient that TE's GroupedLinear writes into main_grad
# (tests/test_megatron_moe_order.py works both by hand for DeepSeek-V3 EP 4 x PP 2). The DeepSeek-V2 runs were +0.12%
# and +0.18% while the last stage charged the experts' backward moment beside the loss's saved tensors, which the
# loss's backward frees first (moe_moments.LOSS_BEFORE_THE_LAYERS, shown by the Megatron harness's Mixtral last stage)
B200_MOE = {
    "deepseekv2_tp1_ep4_pp2_dp4_l4_mbc4_cef": -0.0030,  # was 0.0154; -0.0039 before megatron_pp_grad.py
    "deepseekv2_tp1_ep8_pp1_dp8_l4_mbc4_cef": -0.0031,  # was 0.0157
    "deepseekv3_l4_tp1_ep4_pp2_dp4_mbc4_cef": -0.0016,  # was 0.0125; -0.0021 before megatron_pp_grad.py
    "deepseekv3_l4_tp1_ep8_pp1_dp8_mbc4_cef": -0.0017,  # was 0.0088
}


@pytest.mark.parametrize("run", sorted(B200_MOE))
def test_b200_moe_run(run):
    assert replay(by_id(B200)[run]).error == pytest.approx(B200_MOE[run], abs=0.001)


def median_error(recs: list[dict]) -> float:
    rows = distinct([replay(r) for r in recs], recs)
    return statistics.median(abs(r.error) for r in rows)


def test_golden_values_median():
    assert median_error(GOLDEN) <= 0.03
    moe = [r for r in GOLDEN if "--num-experts" in r["launch"]]
    assert len(moe) >= 15 and median_error(moe) <= 0.03


def test_b200_median():
    assert median_error(B200) <= 0.015
