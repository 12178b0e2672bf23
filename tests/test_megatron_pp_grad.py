"""The activation gradients Megatron-Core's 1F1B schedule holds between a stage's micro-batches
(estimator/memory/megatron_pp_grad.py).

Megatron-Core 0.16.1 schedules.py forward_backward_pipelining_without_interleaving: `output_tensor_grad =
send_forward_recv_backward(...)` (steady state) or `recv_backward(...)` (cool-down) makes a [s/cp (/tp under SP), b,
h] tensor in the pipeline dtype (p2p_communication.py `create_tensor_recv_next`: torch.empty) that the schedule's
variable holds through `backward_step` and on until the next receive: through every backward of a stage before the
last, and through the forward of the next steady iteration (from the second, m - W >= 2, W = min(p - r - 1, m)
warm-up forwards); `input_tensor_grad = backward_step(...)` holds the input's gradient of a stage after the first
until the next backward_step returns. The Megatron harness's non-last stages (tests/data/measured/megatron) hold the
received gradient through their backward; the schedule itself run on a fake rank (validation/megatron/
pipeline_trace.py) holds both.
"""

from __future__ import annotations

import copy
import importlib.util
import json
from pathlib import Path

import pytest

from estimator import estimate_config
from estimator.memory.megatron_pp_grad import INPUT_LABEL, LABEL

MEASURED = Path(__file__).parent / "data" / "measured" / "megatron"
MiB = 2**20
MIXTRAL = "mixtral-8x7b-tp2-pp4-first-ep4-s4096-b1-gg"  # TP 2 with SP, PP 4, h 4096, 4096 tokens, m = 1


def _config(case: str = MIXTRAL, **training) -> dict:
    config = copy.deepcopy(json.loads((MEASURED / f"{case}.json").read_text())["config"])
    config["training"].update(training)
    return config


def _received(config: dict) -> list[dict[str, int]]:
    """Per stage, per phase: the received output gradient's bytes (0 where it is not listed)."""
    return [{p.name: sum(c.bytes for c in p.components if c.label == LABEL) for p in stage.phases}
            for stage in estimate_config(config).stages]


def test_one_micro_batch_holds_it_in_backward_only():
    """The harness's Mixtral rank, m = 1: every stage but the last receives 4096/2 x 1 x 4096 bf16 = 16 MiB for its
    one backward; no steady iteration follows, so no forward holds one."""
    got = _received(_config())
    grad = 2 * 4096 // 2 * 4096
    assert grad == 16 * MiB
    assert got[:3] == [{"forward": 0, "backward": grad, "optimizer": 0}] * 3
    assert got[3] == {"forward": 0, "backward": 0, "optimizer": 0}


def _inputs(config: dict) -> list[dict[str, int]]:
    """Per stage, per phase: the previous backward's input gradient's bytes."""
    return [{p.name: sum(c.bytes for c in p.components if c.label == INPUT_LABEL) for p in stage.phases}
            for stage in estimate_config(config).stages]


def test_the_forward_holds_them_from_the_second_steady_iteration():
    """m = 4 on PP 4: rank r runs W = 3 - r warm-up forwards and m - W = 1 + r steady iterations. The previous
    backward's received gradient is alive at a steady forward from the second on (ranks 1 and 2; rank 3 is the
    last), and so is the previous backward's input gradient, at the forward and at the backward (ranks 1 to 3; rank 0
    has no input gradient). At m = 1 no stage runs two steady iterations: no input gradient anywhere."""
    config = _config(global_batch_size=16)  # DP 4, micro-batch 1: m = 4
    grad = 2 * 4096 // 2 * 4096
    assert [s["forward"] for s in _received(config)] == [0, grad, grad, 0]
    assert [s["backward"] for s in _received(config)] == [grad, grad, grad, 0]
    assert [(s["forward"], s["backward"]) for s in _inputs(config)] == [(0, 0)] + [(grad, grad)] * 3
    assert all(not any(s.values()) for s in _inputs(_config()))


def test_the_harness_records_hold_it():
    """The Mixtral -gg record's backward peak: the estimate lists the 16 MiB and its tensors' peak comes within 0.13%
    of the harness's (0.31% under without it)."""
    from validation.core.report import tensors_peak

    record = json.loads((MEASURED / f"{MIXTRAL}.json").read_text())
    stage = estimate_config(record["config"]).stages[0]
    assert stage.peak_phase == "backward" and any(c.label == LABEL for c in stage.components)
    assert tensors_peak(stage) / record["measured"]["peak_bytes"] - 1 == pytest.approx(-0.0012, abs=0.0001)


def test_only_megatrons_1f1b():
    """Interleaved (its queues receive each chunk's gradient ahead: megatron_vpp_grad.py, under its own labels) and
    the other frameworks' pipelines list none."""
    interleaved = _config(global_batch_size=16)
    interleaved["parallel"].update(vpp=2, pp_schedule="interleaved")
    interleaved["model"]["num_layers"] = 16
    assert all(not any(s.values()) for s in _received(interleaved) + _inputs(interleaved))
    plain = {"model": "llama-3.1-8b", "training": {"seq_len": 4096, "global_batch_size": 16},
             "parallel": {"pp": 4, "dp": 2}}
    megatron = _received({**plain, "training": {**plain["training"], "framework": "megatron"}})
    assert [s["backward"] for s in megatron] == [2 * 4096 * 4096] * 3 + [0]  # h 4096, no TP
    titan = {**plain, "training": {**plain["training"], "framework": "fsdp2"}}
    assert all(not any(s.values()) for s in _received(titan) + _inputs(titan))


@pytest.mark.skipif(importlib.util.find_spec("megatron.core") is None, reason="megatron-core is not installed")
def test_the_harness_keeps_the_received_gradient_at_its_backward_peak():
    """The fake-tensor harness on a tiny first stage (hidden 64, 64 tokens, micro-batch 2, TP 2 with SP): the second
    storage its backward makes, after the output's pseudo-free (`deallocate_output_tensor`), is the received gradient,
    64/2 x 2 x 64 bf16 = 8 KiB, and it is alive at the backward's peak."""
    from validation.megatron.harness import Arch, Setup, traced_step

    arch = Arch(hidden_size=64, num_layers=4, num_attention_heads=4, num_query_groups=2, kv_channels=16,
                ffn_hidden_size=160, vocab_size=1000)
    trace = traced_step(Setup(arch, seq_len=64, micro_batch_size=2, tp=2, pp=2, dp=2))
    tracker = trace.tracker
    start = dict((name, i) for i, name in tracker.marks)["backward"]
    made = [(key, size) for key, size in tracker.events[start:] if size > 0]
    key, size = made[1]
    assert size == 64 // 2 * 2 * 64 * 2
    assert key in tracker.live_at(tracker.peaks(trace.category)["backward"]["at"])


@pytest.mark.skipif(importlib.util.find_spec("megatron.core") is None, reason="megatron-core is not installed")
def test_megatrons_schedule_holds_both_gradients():
    """Megatron-Core 0.16.1's forward_backward_pipelining_without_interleaving itself on the middle of 3 fake ranks,
    4 micro-batches (W = 1 warm-up forward, 3 steady iterations, 1 cool-down backward): at each forward's end, each
    backward's start and end, (output gradients received and alive, input gradients returned and alive). One
    received gradient at every backward and at the steady forwards from the second on; the previous input gradient
    beside them from the second backward on (two at a backward's end, the new one not yet sent)."""
    from validation.megatron.pipeline_trace import held

    assert held("middle", 4) == [
        ("F", 0, 0), ("F", 0, 0),  # the warm-up forward, the first steady forward
        ("B", 1, 0), ("B end", 1, 1),
        ("F", 1, 1), ("B", 1, 1), ("B end", 1, 2),
        ("F", 1, 1), ("B", 1, 1), ("B end", 1, 2),
        ("B", 1, 1), ("B end", 1, 2),  # the cool-down backward
    ]
