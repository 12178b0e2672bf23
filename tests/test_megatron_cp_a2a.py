"""Context parallelism in the Megatron replay (estimator/memory/megatron_cp_a2a.py): a dense layer under
TransformerEngine v2.11's all-to-all (AttnFuncWithCPAndQKVOA2A), its linears' sequence-parallel gathers and the
backward's activation gradients (megatron_te_linears.py) request by request, and what replaying them gives on
SimuMax's seven B200 CP runs (tests/data/measured/published/simumax_b200, all launched with --cp-comm-type a2a)."""

from __future__ import annotations

import statistics

import pytest

from estimator.memory import megatron_cp_a2a, megatron_replay, reserved
from estimator.memory.megatron_cp_a2a import CP_STREAM, Plan
from estimator.memory.megatron_te_linears import Linears
from tests.test_published_megatron_reserved import B200, error, stages_of
from validation.published_megatron.replay import imported

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

    def transient(self, sizes):
        self.free(*[self.alloc(size) for size in sizes])

    def release(self, blocks):
        self.free(*blocks)

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


# a layer of ledger requests [norm input 10, QKV input 11, QKV output 80, q and k after RoPE 72, LSE 1, attention
# output 64, MLP norm input 12, fc1 input 13, fc1 output 120, fc2 input 60]; q 64, k and v 8; hidden states of 20 a CP
# rank's whole sequence, 10 a TP rank's under sequence parallelism
PLAN = Plan(qkv=2, rope=3, output=5, q=64, k=8, v=8, lin=Linears(full=20, local=10, tp=2, gathers=True))
SIZES = [10, 11, 80, 72, 1, 64, 12, 13, 120, 60]


def _a(size, block, stream=0):
    return ("alloc", size, stream, block)


def _f(*blocks):
    return [("free", b) for b in blocks]


def _forward(program):
    carried = program.alloc(10)  # the last layer's output, reduce-scattered
    kept, out = megatron_cp_a2a.forward(program, SIZES, PLAN, carried)
    return kept, out


def test_a_layers_forward_in_megatron_and_tes_order():
    """The residual sum (the last layer's output freed), the QKV projection's norm output, its all-gather over TP,
    its output, the gather freed; the query's reshape copy, the rotary q (the copy freed), the rotary k; q, k, v's
    all-to-all (the CP stream's three results); the attention's output and LSE; its all-to-all back; the rotary q, k
    and the QKV output freed; the output projection's [s, h] output, reduce-scattered, freed; the residual sum, the
    scattered output freed; fc1's norm output, gather, output (gather freed), SwiGLU's output; fc2's output,
    reduce-scattered: the layer's output, carried to the next layer's residual sum."""
    program = _Recorder()
    kept, out = _forward(program)
    cp = CP_STREAM
    assert program.log == [
        _a(10, 1), _a(10, 2), *_f(1), _a(11, 3), _a(20, 4), _a(80, 5), *_f(4),
        _a(64, 6), _a(64, 7), *_f(6), _a(8, 8),
        _a(64, 9), _a(64, 10), _a(8, 11), _a(8, 12), _a(64, 13, cp), *_f(10), _a(8, 14), _a(8, 15), _a(8, 16, cp),
        *_f(12), _a(8, 17, cp), *_f(15), *_f(9, 11, 14),
        _a(64, 18), _a(1, 19),
        _a(64, 20), _a(64, 21), _a(64, 22, cp), *_f(21), *_f(20),
        *_f(7, 8, 5),
        _a(20, 23), _a(10, 24), *_f(23), _a(12, 25), *_f(24),
        _a(13, 26), _a(20, 27), _a(120, 28), *_f(27), _a(60, 29),
        _a(20, 30), _a(10, 31), *_f(30)]
    assert kept == [2, 3, 13, 16, 17, 18, 19, 22, 25, 26, 28, 29] and out == 31
    assert kept[PLAN.kept_output] == 22  # the output projection's input


def test_a_layers_backward_makes_the_activation_gradients_in_order():
    """fc2's output gradient gathered, its input gradient (fc2's saved input freed), SwiGLU's backward (one tensor),
    fc1's LayerNormLinear backward (gather, [s, h] input gradient, its reduce-scatter, the norm output and gather freed,
    the norm's input gradient); the output projection's likewise; TE's attention: the output gradient's all-to-all, dq,
    dk, dv, cuDNN's workspace (2 x q: the fp32 dQ accumulator, and the fp32 softmax sum, as large as the LSE), their
    all-to-all back, the attention's saved tensors freed; the rotary embedding's k then q gradients, their cat into the
    QKV output's; the QKV projection's LayerNormLinear backward. Every block freed; the weights' gradients fc2, fc1,
    the MLP norm, then the attention norm and output projection, then QKV."""
    program = _Recorder()
    kept, out = _forward(program)
    start = len(program.log)
    gradients = []
    megatron_cp_a2a.backward(program, list(kept), SIZES, PLAN, [5, 4, 1, 2, 7, 6], gradients.append)
    cp = CP_STREAM
    assert program.log[start:] == [
        _a(20, 32), _a(60, 33), *_f(32), *_f(29), _a(120, 34), *_f(33, 28),
        _a(20, 35), _a(20, 36), _a(10, 37), *_f(26, 35), _a(10, 38), *_f(37), *_f(36, 34, 25, 38),
        _a(20, 39), _a(64, 40), *_f(39), *_f(22),
        _a(64, 41), _a(64, 42), _a(64, 43, cp), *_f(42), *_f(41),
        _a(64, 44), _a(8, 45), _a(8, 46), _a(2 * 64 + 1, 47), *_f(47),
        _a(64, 48), _a(64, 49), _a(8, 50), _a(8, 51), _a(8, 52), _a(64, 53, cp), *_f(49), _a(8, 54), _a(8, 55, cp),
        *_f(51), _a(8, 56, cp), *_f(54), *_f(48, 50, 52),
        *_f(44, 45, 46, 43, 40), *_f(19, 18, 17, 16, 13),
        _a(8, 57), *_f(55), _a(64, 58), *_f(53), _a(80, 59), *_f(58, 57, 56),
        _a(20, 60), _a(20, 61), _a(10, 62), *_f(3, 60), _a(10, 63), *_f(62), *_f(61, 59, 2, 63)]
    assert gradients == [6, 7, 2, 1, 4, 5]
    made = {entry[3] for entry in program.log if entry[0] == "alloc"}
    freed = [entry[1] for entry in program.log if entry[0] == "free"]
    assert sorted(freed) == sorted(made - {out}) and len(set(freed)) == len(freed)


def test_the_hook_plans_the_cp_runs_layers(monkeypatch):
    """The 70B run at TP 2, CP 4, 32k tokens: 8,192 tokens a GPU; q 8,192 x 8,192 / 2 x 2 B = 64 MiB, k and v
    8,192 x 1,024 / 2 x 2 B = 8 MiB; the ledger's QKV output, RoPE and output entries its 3rd, 4th and 6th requests;
    the hidden states 8,192 x 8,192 x 2 B = 128 MiB, a TP rank's half under sequence parallelism."""
    plans = []
    planned = megatron_cp_a2a.plan
    monkeypatch.setattr(megatron_cp_a2a, "plan", lambda *a: plans.append(planned(*a)) or plans[-1])
    error(B200["llama3_70b_l12_tp2_cp4_pp1_dp1_seq32768_mbc4_cef"])
    lin = Linears(full=128 * MiB, local=64 * MiB, tp=2, gathers=True)
    assert set(plans) == {Plan(qkv=2, rope=3, output=5, q=64 * MiB, k=8 * MiB, v=8 * MiB, lin=lin)}


class _Programs(reserved._Program):
    """The replay's program, each one made kept (its allocator's peaks)."""
    made: list = []

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.made.append(self)


def test_the_replays_allocated_peak_is_the_measured_one(monkeypatch):
    """The replay's own allocated peak against each run's max_memory_allocated (`measured.max_allocated_bytes`): 30 to
    46 MiB over on all seven (0.06% at most), where before TE's linears, their gathers and the backward's activation
    gradients were replayed it was up to 1,504 MiB under (405B at TP 2, 131k tokens: 1.2%)."""
    monkeypatch.setattr(reserved, "_Program", _Programs)
    for run in CP_RUNS:
        _Programs.made = []
        stage, = stages_of(B200[run])
        assert "megatron_te_linears.py" in stage.component("fragmentation").source
        peak = max(program.allocator.allocated_peak for program in _Programs.made)
        over = peak - B200[run]["measured"]["max_allocated_bytes"]
        assert 30 * MiB < over < 47 * MiB, (run, over / MiB)


# estimate / real_reserved_gib - 1 of the CP runs (one stream: as if TE's CP stream shared the current stream's
# blocks); before TE's linears, the backward's activation gradients and the optimizer's ranks were replayed:
# 0.0004, -0.0414, -0.0206, -0.0064, -0.0194, -0.0337, -0.0145 (median -1.9%, at worst -4.1%)
REPLAYED_CP = {
    "llama3_405b_l4_tp1_cp8_pp1_dp1_seq32768_mbc4_cef": (-0.0004, -0.0088),
    "llama3_405b_l4_tp2_cp4_pp1_dp1_seq131072_mbc4_cef": (-0.0143, -0.0221),
    "llama3_405b_l4_tp2_cp4_pp1_dp1_seq32768_mbc4_cef": (-0.0034, -0.0083),
    "llama3_70b_l12_tp1_cp8_pp1_dp1_seq131072_mbc4_cef": (-0.0242, -0.0043),
    "llama3_70b_l12_tp1_cp8_pp1_dp1_seq32768_mbc4_cef": (0.0003, -0.0160),
    "llama3_70b_l12_tp2_cp4_pp1_dp1_seq131072_mbc4_cef": (-0.0282, -0.0370),
    "llama3_70b_l12_tp2_cp4_pp1_dp1_seq32768_mbc4_cef": (-0.0148, -0.0173),
}


def test_the_cp_runs_replayed_meet_the_goal(monkeypatch):
    """All seven runs replayed: per-stream pools bring the median from 1.6% under (one stream) to 1.4% under, the worst
    from 3.7% to 2.8% under (70B at TP 2, 131k tokens): each CP run within the issue's 3%."""
    assert set(CP_RUNS) == set(REPLAYED_CP)
    assert all(megatron_replay.replay_rule(_resolved(run)) is None for run in CP_RUNS)
    streams = {run: error(B200[run]) for run in CP_RUNS}
    monkeypatch.setattr(megatron_cp_a2a, "CP_STREAM", 0)
    one = {run: error(B200[run]) for run in CP_RUNS}
    for run in CP_RUNS:
        assert (streams[run], one[run]) == pytest.approx(REPLAYED_CP[run], abs=0.001)
    errors = list(streams.values())
    assert statistics.median(errors) == pytest.approx(-0.0143, abs=0.001)
    assert statistics.median(one.values()) == pytest.approx(-0.0160, abs=0.001)
    assert min(errors) == pytest.approx(-0.0282, abs=0.001) and all(abs(e) < 0.03 for e in errors)


def _resolved(run: str):
    from tests.test_published_megatron_reserved import _resolved as resolved

    return resolved(imported(B200[run]).config)


def _cp(model: str, **parallel):
    from tests.test_published_megatron_reserved import _resolved as resolved

    return resolved({"model": model, "training": {"framework": "megatron", "seq_len": 4096, "global_batch_size": 4},
                     "parallel": {"tp": 2, "cp": 2, "dp": 2, "zero_stage": 1, **parallel}})


@pytest.mark.parametrize("model, parallel, why", [
    ("llama-3.1-8b", {"cp_comm_type": "a2a"}, None),
    ("llama-3.1-8b", {}, "context parallelism by p2p (only the all-to-all's order is replayed"),
    ("llama-3.1-8b", {"cp_comm_type": "allgather"}, "context parallelism by allgather (only"),
    ("mixtral-8x7b", {"cp_comm_type": "a2a"}, "context parallelism over MoE, MLA, QK-norm or state-space layers"),
    ("qwen3-8b", {"cp_comm_type": "a2a"}, "context parallelism over MoE, MLA, QK-norm or state-space layers"),
])
def test_the_cp_rule(model, parallel, why):
    """Megatron's default --cp-comm-type is p2p: its ring (and the all-gather's buffers) are not replayed; nor are
    layers other than the dense, gated, rotary one the all-to-all's order is written for."""
    rule = megatron_cp_a2a.cp_rule(_cp(model, **parallel))
    assert rule == why if why is None else rule.startswith(why)


def test_every_preset_the_rule_lets_by_has_the_all_to_alls_layers():
    """Each bundled model under Megatron with CP 2 by the all-to-all: either the replay says why it does not apply,
    or every layer kind of it has a plan (the walk refuses a CP layer without one)."""
    from estimator import estimate_config
    from estimator.models.presets import preset_ids
    from estimator.spec.errors import ConfigError

    replayed = []
    for model in preset_ids():
        config = {"model": model, "training": {"framework": "megatron", "seq_len": 4096, "global_batch_size": 4},
                  "parallel": {"tp": 2, "cp": 2, "dp": 2, "zero_stage": 1, "cp_comm_type": "a2a"}}
        try:
            stage = estimate_config(config).stages[0]
        except ConfigError:  # CP refused for the model (MLA's sparse attention, recurrent layers)
            continue
        if stage.component("fragmentation").formula.startswith("caching allocator"):
            replayed.append(model)
    assert {"llama-3.1-8b", "llama-3.1-405b", "mistral-7b", "qwen2.5-7b", "phi-4"} <= set(replayed)
    assert not {"qwen3-8b", "mixtral-8x7b", "deepseek-v3", "gemma-3-27b"} & set(replayed)


@pytest.mark.parametrize("training", [{"dropout": 0.1}, {"recompute": "full"}, {"loss": "fused"}, {"loss": "chunked"},
                                      {"micro_batch_size": 2}, {"optimizer": "sgd"}, {"fp8": True}])
def test_a_training_setting_the_replayed_layer_lacks_keeps_the_flat_share(training):
    """A Megatron CP a2a layout with another training setting is either replayed or keeps the flat share with its
    reason, never an error: with dropout the layer keeps masks the all-to-all's plan has not (cp_rule says so)."""
    from estimator import estimate_config

    config = {"model": "llama-3.1-8b", "training": {"framework": "megatron", "seq_len": 32768, "global_batch_size": 8,
                                                    **training},
              "parallel": {"tp": 2, "cp": 4, "dp": 1, "zero_stage": 1, "cp_comm_type": "a2a"}, "hardware": {"gpu": "b200"}}
    formula = estimate_config(config).stages[0].component("fragmentation").formula
    if training == {"dropout": 0.1}:
        from tests.test_published_megatron_reserved import _resolved

        assert megatron_cp_a2a.cp_rule(_resolved(config)).startswith("context parallelism with dropout")
        assert "share" in formula
    else:
        assert "share" in formula or formula.startswith("caching allocator")



def test_a_custom_layer_without_the_all_to_alls_plan_keeps_the_flat_share(tmp_path, capsys):
    """A custom model every named check of cp_rule lets by (dense, gated, rotary, no QK-norm, TE's fused attention)
    whose layer has sandwich norms (norms_per_layer 4, as Gemma-2's): its ledger has two more norm inputs, so `plan`
    finds no all-to-all order in it. cp_rule asks `plan` itself (`unplanned`): the layout keeps the flat share with
    that reason, and the CLI answers (it raised ValueError in the walk, an internal error, before)."""
    import json

    from estimator.cli import main

    config = {"model": {"hidden_size": 4096, "num_layers": 8, "num_attention_heads": 32, "num_kv_heads": 8,
                        "vocab_size": 128256, "intermediate_size": 14336, "norms_per_layer": 4},
              "training": {"framework": "megatron", "seq_len": 4096, "global_batch_size": 4},
              "parallel": {"tp": 2, "cp": 2, "dp": 2, "zero_stage": 1, "cp_comm_type": "a2a"}}
    from tests.test_published_megatron_reserved import _resolved as resolved

    cfg = resolved(config)
    assert megatron_cp_a2a.unplanned(cfg) == ["dense"]
    why = ("context parallelism over layers whose saved tensors are not the replayed layer's (dense: the all-to-all's "
           "requests are placed among a dense layer's QKV, rotary, attention and gated-MLP tensors)")
    assert megatron_cp_a2a.cp_rule(cfg) == why and megatron_replay.replay_rule(cfg) == why
    # the same model with Megatron's two norms a layer has the plan, and is replayed
    two = resolved({**config, "model": {**config["model"], "norms_per_layer": 2}})
    assert megatron_cp_a2a.unplanned(two) == [] and megatron_replay.replay_rule(two) is None
    path = tmp_path / "c.json"
    path.write_text(json.dumps(config))
    assert main(["estimate", "--config", str(path), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["stages"][0]["formulas"]["fragmentation"] == (
        "10% of the allocated peak (default segments); flat share, no allocator replay: " + why)
