"""Context parallelism in the Megatron replay (estimator/memory/megatron_cp_a2a.py): TransformerEngine v2.11's
all-to-all (AttnFuncWithCPAndQKVOA2A) request by request, and what replaying it gives on SimuMax's seven B200 CP
runs (tests/data/measured/published/simumax_b200, all launched with --cp-comm-type a2a), which is why
megatron_replay.replay_rule still keeps CP on the flat share."""

from __future__ import annotations

import statistics

import pytest

from estimator.memory import megatron_cp_a2a, megatron_replay
from estimator.memory.megatron_cp_a2a import CP_STREAM, Plan
from tests.test_published_megatron_reserved import B200, error

MiB = 2**20
CP_RUNS = sorted(run for run in B200 if "_cp" in run)


class _Recorder:
    """A program that names its blocks and logs the requests: ("alloc", bytes, stream, block) and ("free", block)."""

    def __init__(self):
        self.log, self.count = [], 0

    def alloc(self, nbytes, stream=0):
        self.count += 1
        self.log.append(("alloc", nbytes, stream, self.count))
        return self.count

    def free(self, *blocks):
        self.log += [("free", b) for b in blocks]

    def many(self, sizes):
        return [self.alloc(size) for size in sizes]

    def freed(self) -> set:
        return {entry[1] for entry in self.log if entry[0] == "free"}


@pytest.mark.parametrize("into_attention, expected", [
    # before attention (context_parallel.py flash_attn_a2a_communicate, before_attn=True): at step i the all-to-all's
    # output of tensor i - 1, then on the CP stream tensor i - 2's result (its all-to-all output dropped), then
    # tensor i's contiguous copy; the copies die as the function returns
    (True, [("alloc", 4, 0, 1), ("alloc", 4, 0, 2), ("alloc", 2, 0, 3), ("alloc", 2, 0, 4),
            ("alloc", 4, CP_STREAM, 5), ("free", 2), ("alloc", 1, 0, 6), ("alloc", 1, 0, 7),
            ("alloc", 2, CP_STREAM, 8), ("free", 4), ("alloc", 1, CP_STREAM, 9), ("free", 7),
            ("free", 1), ("free", 3), ("free", 6)]),
    # after attention (before_attn=False): tensor i's reordered copy comes before tensor i - 2's result
    (False, [("alloc", 4, 0, 1), ("alloc", 4, 0, 2), ("alloc", 2, 0, 3), ("alloc", 2, 0, 4), ("alloc", 1, 0, 5),
             ("alloc", 4, CP_STREAM, 6), ("free", 2), ("alloc", 1, 0, 7), ("alloc", 2, CP_STREAM, 8), ("free", 4),
             ("alloc", 1, CP_STREAM, 9), ("free", 7), ("free", 1), ("free", 3), ("free", 5)]),
])
def test_the_all_to_alls_requests_in_tes_order(into_attention, expected):
    program = _Recorder()
    results = megatron_cp_a2a._a2a(program, [4, 2, 1], into_attention)
    assert program.log == expected
    assert results == ([5, 8, 9] if into_attention else [6, 8, 9])


def test_a_layers_forward_keeps_the_reordered_qkv_and_both_outputs():
    """A layer of ledger requests [norm input, QKV input, QKV output, q and k after RoPE, LSE, output, MLP]: kept are
    the norm and QKV inputs, the reordered q, k, v (CP stream), the attention's own output and its LSE, the output
    projection's input (CP stream) and the MLP's; the rotary q and k and the QKV output freed."""
    program = _Recorder()
    p = Plan(qkv=2, rope=3, output=5, q=64, k=8, v=8)
    kept = megatron_cp_a2a.forward(program, [10, 11, 80, 72, 1, 64, 12], p)
    allocs = {block: (size, stream) for op, size, stream, block in (e for e in program.log if e[0] == "alloc")}
    assert [allocs[b] for b in kept] == [(10, 0), (11, 0), (64, CP_STREAM), (8, CP_STREAM), (8, CP_STREAM), (64, 0),
                                         (1, 0), (64, CP_STREAM), (12, 0)]
    assert kept[p.kept_output] == kept[-2]
    assert [allocs[b] for b in (3, 4, 5)] == [(80, 0), (64, 0), (8, 0)] and {3, 4, 5} <= program.freed()
    # backward: from the output projection's input down to the reordered q, all freed; nothing of it left held
    held = list(kept[:-1])
    megatron_cp_a2a.backward(program, held, p)
    assert held == kept[:2]


def test_the_hook_plans_the_cp_runs_layers(monkeypatch):
    """The 70B run at TP 2, CP 4, 32k tokens: 8,192 tokens a GPU; q 8,192 x 8,192 / 2 x 2 B = 64 MiB, k and v
    8,192 x 1,024 / 2 x 2 B = 8 MiB; the ledger's QKV output, RoPE and output entries its 3rd, 4th and 6th requests."""
    plans = []
    planned = megatron_cp_a2a.plan
    monkeypatch.setattr(megatron_replay, "replay_rule", lambda cfg: None)
    monkeypatch.setattr(megatron_cp_a2a, "plan", lambda *a: plans.append(planned(*a)) or plans[-1])
    error(B200["llama3_70b_l12_tp2_cp4_pp1_dp1_seq32768_mbc4_cef"])
    assert set(plans) == {Plan(qkv=2, rope=3, output=5, q=64 * MiB, k=8 * MiB, v=8 * MiB)}


# estimate / real_reserved_gib - 1 of the CP runs with the all-to-all replayed (one stream: as if TE's CP stream
# shared the current stream's blocks)
REPLAYED_CP = {
    "llama3_405b_l4_tp1_cp8_pp1_dp1_seq32768_mbc4_cef": (0.0004, -0.0080),
    "llama3_405b_l4_tp2_cp4_pp1_dp1_seq131072_mbc4_cef": (-0.0414, -0.0493),
    "llama3_405b_l4_tp2_cp4_pp1_dp1_seq32768_mbc4_cef": (-0.0206, -0.0314),
    "llama3_70b_l12_tp1_cp8_pp1_dp1_seq131072_mbc4_cef": (-0.0064, -0.0357),
    "llama3_70b_l12_tp1_cp8_pp1_dp1_seq32768_mbc4_cef": (-0.0194, -0.0356),
    "llama3_70b_l12_tp2_cp4_pp1_dp1_seq131072_mbc4_cef": (-0.0337, -0.0430),
    "llama3_70b_l12_tp2_cp4_pp1_dp1_seq32768_mbc4_cef": (-0.0145, -0.0048),
}


def test_the_cp_runs_replayed_fall_short_of_the_goal(monkeypatch):
    """All seven runs replayed: per-stream pools bring the median from 3.6% under (one stream) to 1.9% under, yet the
    issue's goal (median within 1.5%, none under by more than 3%) fails (405B at TP 2, 131k tokens: 4.1% under),
    so replay_rule keeps CP on the flat share and says why."""
    assert set(CP_RUNS) == set(REPLAYED_CP)
    monkeypatch.setattr(megatron_replay, "replay_rule", lambda cfg: None)
    streams = {run: error(B200[run]) for run in CP_RUNS}
    monkeypatch.setattr(megatron_cp_a2a, "CP_STREAM", 0)
    one = {run: error(B200[run]) for run in CP_RUNS}
    for run in CP_RUNS:
        assert (streams[run], one[run]) == pytest.approx(REPLAYED_CP[run], abs=0.001)
    errors = list(streams.values())
    assert statistics.median(errors) == pytest.approx(-0.0194, abs=0.001)
    assert statistics.median(one.values()) == pytest.approx(-0.0356, abs=0.001)
    assert not (abs(statistics.median(errors)) < 0.015 and min(errors) > -0.03)
    assert megatron_replay.CP_REASON.startswith("context parallelism") and "median 1.9%" in megatron_replay.CP_REASON
