"""Framework kernels measured on a real GPU (validation/gpu/kernels.py, tests/data/measured/gpu/kernels):
what they hold, checked against the loss ledger the estimate builds (estimator/memory/activations/loss.py).

Megatron-Core's cross-entropy on bf16 logits [s, b, V] at TP 1, unfused and with the native fusion
(--cross-entropy-loss-fusion, the default implementation): the allocated bytes above the logits at the
forward's peak, after the forward (what it saves), and above the backward's start at its peak."""

import json
from pathlib import Path

import pytest

from estimator import Parallel, Training
from estimator.models.presets import get_architecture
from estimator.memory.activations.loss import loss_memory

KERNELS = sorted((Path(__file__).parent / "data" / "measured" / "gpu" / "kernels").glob("megatron-cross-entropy-*.json"))
SMALL = 256 * 1024  # the target mask, masked targets, the per-token loss and its max/sum: [s, b] each


def logit_bytes(entries, par) -> int:
    """The entries that scale with the vocabulary (the loss ledger also holds the head's input)."""
    return sum(int(e.bytes(par)) for e in entries if "V" in e.formula)


def ledger(record: dict, loss: str):
    run = record["run"]
    training = Training(framework="megatron", seq_len=run["seq_len"], micro_batch_size=run["micro_batch_size"],
                        loss=loss)
    par = Parallel(tp=1, pp=1, dp=1)
    return loss_memory(get_architecture("llama-3.1-8b"), training, par, run["vocab"]), par


def test_the_kernel_records_are_there():
    assert len(KERNELS) == 2
    for path in KERNELS:
        record = json.loads(path.read_text())
        assert record["versions"]["gpu"] == "NVIDIA H200" and record["measured"]["megatron_core"] == "0.16.1"


@pytest.mark.parametrize("path", KERNELS, ids=lambda p: p.stem)
@pytest.mark.parametrize("loss, impl", [("standard", "unfused"), ("fused", "fused")])
def test_megatron_cross_entropy_holds_what_the_ledger_says(path, loss, impl):
    record = json.loads(path.read_text())
    run, measured = record["run"], record["measured"][impl]
    tv = run["seq_len"] * run["micro_batch_size"] * run["vocab"]
    assert measured["logits_bytes"] == 2 * tv
    memory, par = ledger(record, loss)
    saved = logit_bytes(memory.saved, par)
    # the forward's working copies: all but the bf16 logits themselves, which the measurement starts from
    forward = logit_bytes(memory.forward, par) - 2 * tv
    backward = logit_bytes(memory.backward, par)
    assert saved == 4 * tv  # the fp32 softmax, both implementations
    assert 0 <= measured["saved_after_forward"] - saved < SMALL
    assert 0 <= measured["forward_peak_above_start"] - (saved + forward) < SMALL
    assert 0 <= measured["backward_peak_above_start"] - backward < SMALL
    # in units of the fp32 logits: unfused 1 (fwd) and 0.5 (bwd); the fusion 2 and 1.5
    assert (saved + forward, backward) == ((4 * tv, 2 * tv) if impl == "unfused" else (8 * tv, 6 * tv))
