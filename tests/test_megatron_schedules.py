"""Our interleaved in-flight counts against Megatron-Core's own schedule code, for every layout up to
PP 16 (VPP 2..8, micro-batches PP..4 PP, every micro-batch group Megatron accepts) and every
Megatron release the estimator offers (estimator/spec/versions.py).

validation/megatron/schedules.py runs each release's get_pp_rank_microbatches and
get_schedule_table (0.16.1 installed, 0.19.0 from a git snapshot of NVIDIA/Megatron-LM); its
record (tests/data/measured/schedules/megatron-interleaved.json, `python -m validation.megatron
schedules`) keeps what that code answered, so the comparison runs without either. Where a
release's source is here, the test also runs the code itself.
"""

import json

import pytest

from estimator.memory.pipeline import (in_flight_per_rank, interleaved_microbatches_error, microbatches,
                                       pipeline_filling_microbatches)
from estimator.memory.memory import estimate_config
from estimator.spec.errors import ConfigError
from estimator.spec.parallel import Parallel
from estimator.search.layouts import Shape, shape_micro_batches
from estimator.spec.training import Training
from estimator.spec.versions import RELEASES
from validation.megatron import schedules

RECORD = json.loads(schedules.RECORD.read_text())
VERSIONS = [r.version for r in RELEASES["megatron"]]


def our_rows() -> list[list[int]]:
    """What the estimator says, in the record's form: chunk-forwards alive at each rank's peak."""
    rows = []
    for p, v, m, g in schedules.layouts():
        stacks = in_flight_per_rank(Parallel(pp=p, vpp=v), m, [()] * p, group=g)
        chunks = [s * v for s in stacks]
        assert all(abs(c - round(c)) < 1e-9 for c in chunks)
        rows.append([p, v, m, g, *(round(c) for c in chunks)])
    return rows


@pytest.fixture(scope="module")
def ours():
    return our_rows()


@pytest.mark.parametrize("version", VERSIONS)
def test_our_in_flight_counts_equal_the_recorded_megatron_schedule(ours, version):
    recorded = RECORD["releases"][version]
    assert recorded["release"] == next(r.cited for r in RELEASES["megatron"] if r.version == version)
    shown = [r for r in ours if r[0] <= schedules.SHOWN_PP]
    assert shown == recorded["rows_up_to_pp_4"]  # readable first: the layouts up to PP 4, rank by rank
    assert len(ours) == recorded["rows"] == 16919
    assert schedules.digest(ours) == recorded["sha256"]  # every layout up to PP 16


@pytest.mark.parametrize("version", VERSIONS)
def test_each_release_s_own_schedule_code_equals_our_counts(ours, version):
    try:
        code = schedules.schedule_code(version)
    except FileNotFoundError as missing:
        pytest.skip(f"Megatron-Core {version}'s schedules.py is not here ({missing}); the recorded table "
                    "holds what it answered")
    theirs = schedules.peaks(code)
    assert theirs == ours
    assert schedules.digest(theirs) == RECORD["releases"][version]["sha256"]


def test_the_rule_before_core_v0_10_would_fail_the_record(ours):
    """The rule we used to follow (Megatron-Core up to core_v0.9.0: every chunk-forward first when
    micro-batches = PP) differs from the record on later ranks: PP 4, VPP 2, 4 micro-batches."""
    row = next(r for r in RECORD["releases"]["0.16"]["rows_up_to_pp_4"] if r[:4] == [4, 2, 4, 4])
    assert row[4:] == [8, 8, 7, 5]  # rank 0 all 8, rank 3 warms up (v - 1)p = 4 and holds 5
    assert row[4:] != [8, 8, 8, 8]


def test_the_group_size_adds_warm_up_chunks():
    # rank r warms up 2(p - r - 1) + (v - 1)g chunk-forwards: PP 4, VPP 3, group 6, 12 micro-batches
    par = Parallel(pp=4, vpp=3)
    assert [c * 3 for c in in_flight_per_rank(par, 12, [()] * 4, group=6)] == [19, 17, 15, 13]
    assert [c * 3 for c in in_flight_per_rank(par, 12, [()] * 4)] == [15, 13, 11, 9]  # group = pp


@pytest.mark.parametrize("p", range(2, 17))
@pytest.mark.parametrize("v", [2, 3, 5])
def test_the_default_global_batch_fills_the_interleaved_pipeline(p, v):
    """`pipeline_filling_microbatches`: the fewest micro-batches Megatron accepts at which rank 0
    holds what any larger count would, for every group size from p to 4p (found by search)."""
    for g in range(p, 4 * p + 1):
        par = Parallel(pp=p, vpp=v)
        accepted = [m for m in range(1, 8 * p) if not interleaved_microbatches_error(p, m, g)]
        most = in_flight_per_rank(par, 8 * p * v, [()] * p, group=g)[0]
        fewest = next(m for m in accepted if in_flight_per_rank(par, m, [()] * p, group=g)[0] == most)
        assert pipeline_filling_microbatches(par, g) == fewest
        t = Training(micro_batch_size=2, microbatch_group_size=g)
        assert microbatches(t, Parallel(pp=p, vpp=v, dp=3)) == fewest


def test_an_estimate_reads_the_group_and_echoes_the_release():
    base = {"model": "llama-3.1-8b", "parallel": {"pp": 4, "vpp": 2}}
    auto = estimate_config(base)
    grouped = estimate_config({**base, "training": {"microbatch_group_size": 8, "framework_version": "0.19"}})
    assert [s.in_flight_microbatches for s in auto.stages] == [5.5, 4.5, 3.5, 2.5]  # (2(3 - r) + 4 + 1) / 2
    assert [s.in_flight_microbatches for s in grouped.stages] == [7.5, 6.5, 5.5, 4.5]  # (2(3 - r) + 8 + 1) / 2
    # the fewest that fill: p + g = 8 for g = p; one group of 8 (16 chunks >= rank 0's 2 x 3 + 8 + 1)
    assert auto.microbatches == 8 and grouped.microbatches == 8
    assert grouped.stages[0].allocated_peak_bytes > auto.stages[0].allocated_peak_bytes
    out = grouped.to_json()
    assert (out["framework_version"], out["framework_release"]) == ("0.19", "Megatron-Core 0.19.0 (core_v0.19.0, 5be96267)")
    assert auto.to_json()["framework_version"] == "0.16"
    hf = estimate_config({"model": "llama-3.1-8b", "training": {"framework": "hf"}}).to_json()
    assert (hf["framework_version"], hf["framework_release"]) == (None, None)


def test_the_planner_offers_only_micro_batches_the_interleaved_schedule_runs():
    # 64 samples on DP 4, PP 2 x VPP 2: micro-batch 16 leaves one micro-batch per step, short of a group of 2
    tr = Training(seq_len=4096, global_batch_size=64)
    assert shape_micro_batches(tr, Shape(1, 2, 2, None, None, 1, 4, 1, 1, 1)) == (1, 2, 4, 8)
    assert shape_micro_batches(tr, Shape(1, 2, 1, None, None, 1, 4, 1, 1, 1)) == (1, 2, 4, 8, 16)  # 1F1B runs one


@pytest.mark.parametrize("training, parallel, field, words", [
    ({"global_batch_size": 6}, {"pp": 4, "vpp": 2}, "training.global_batch_size", "0 or at least pp = 4, not 2"),
    ({"microbatch_group_size": 3}, {"pp": 4, "vpp": 2}, "training.microbatch_group_size", "at least pp = 4"),
    ({"microbatch_group_size": 8, "global_batch_size": 4}, {"pp": 4, "vpp": 2}, "training.global_batch_size",
     "at least one whole group"),
    ({"microbatch_group_size": 4}, {"pp": 4}, "training.microbatch_group_size", "when vpp is 1"),
    ({"framework": "fsdp2", "microbatch_group_size": 4}, {"pp": 4, "vpp": 2}, "training.microbatch_group_size",
     "unless framework is 'megatron'"),
    ({"framework_version": "main"}, {}, "training.framework_version", "'0.16', '0.19'"),
    ({"framework": "hf", "framework_version": "0.16"}, {}, "training.framework_version", "empty/null with framework"),
])
def test_megatron_s_group_checks_and_the_versions_name_the_field(training, parallel, field, words):
    with pytest.raises(ConfigError) as e:
        estimate_config({"model": "llama-3.1-8b", "training": training, "parallel": parallel})
    assert e.value.field == field and words in str(e.value)
