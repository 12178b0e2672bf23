"""The estimator against measured steps of the frameworks' own code (tests/data/measured/<framework>/).

As tests/test_accuracy.py for the HF cases: each record holds the contract configuration and what
the framework's harness (validation/<framework>/) measured on rank 0. The promise is the same:
the allocated peak within 5%, parameters, gradients and optimizer states within 1%. Cases the
model does not meet yet are listed in KNOWN_GAPS with the reason, as strict expected failures: a
gap that closes fails the test until it leaves the list, and a new miss fails at once.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from estimator import estimate_config

MEASURED = Path(__file__).parent / "data" / "measured"
RECORDS = sorted(p for framework in ("torchtitan", "megatron", "peft", "torchtune") for p in (MEASURED / framework).glob("*.json"))

# case id -> why the estimate misses it (the next modelling steps)
KNOWN_GAPS = {
    "titan-qwen3-32b-w64-tp4-fullac-s8192-b1":
        "under by 6.3% at backward's last moments: beside the gradients, a unit's unsharded fp32 gradients and "
        "the recomputed layer, the harness holds the embedding unit gathered for its backward and 64 small "
        "buffers allocated before the step (per-tensor breakdown), which the model does not list yet",
    "titan-llama-3.1-70b-w512-tp8-fullac-fp8-rowwise-s8192-b1":
        "under by 17% at the backward peak (0.92 of 5.28 GiB): torchao's eager float8 casts are not modelled: "
        "_ToFloat8ConstrFunc.forward computes tensor.to(float32) * scale and to_fp8_saturated clamps it in fp32 "
        "before .to(float8) (torchao/float8/float8_training_tensor.py, float8_utils.py), so the cast of the "
        "all-gathered 8192 x 8192 operand keeps two fp32 copies (0.5 GiB) and float8 copies beside the recomputed "
        "layer (per-tensor breakdown of a 4-layer Llama-3.1-8B TP 8 run: +0.21 GiB at the backward peak against "
        "the same run in bf16; torch.compile fuses these casts; the `compile` field models the layers' partitioner, not torchao's casts, "
        "and the record is an eager run); the rest is "
        "the backward shortfall titan-llama-3.1-70b-w64-tp8-fullac-s8192-b1 shows (0.47 GiB, -2.6% there), a "
        "large share of a 5.3 GiB peak at 512 ranks",
    "mixtral-8x7b-tp2-pp4-first-ep4-s4096-b1-router-fp64":
        "under by 7.9% at the backward peak: the harness runs Megatron's jit_fuser functions (torch.compile in "
        "production, megatron/core/jit.py) eagerly, so weighted_swiglu_back's fp64 temporaries (three 4096 x 7168 "
        "products and the 4096 x 14336 concatenation, 1.1 GiB, per-tensor breakdown) are measured; a compiled "
        "kernel writes only its bf16 output. The model keeps the fp64 combine cast (384 MiB); the harness must "
        "emulate the fused expressions (outputs only) before this case can be judged",
    "mixtral-8x7b-tp2-pp4-first-ep4-s4096-b1-sel-layernorm+moe":
        "recomputing the MoE block in backward re-creates its dispatcher's permutation buffers; the model has "
        "no such backward moment",
}
# case id -> why its model states miss the 1% bound
KNOWN_STATE_GAPS: dict[str, str] = {}


def load(path: Path) -> dict:
    return json.loads(path.read_text())


def measured_stage(result, record: dict):
    """The stage the harness measured: the record names it (Megatron builds one rank's stage), else
    the estimate's peak stage."""
    return result.stages[record.get("stage", result.peak_stage)]


def step_states(result, record: dict) -> dict[str, int]:
    stage = measured_stage(result, record)
    return {c.key: c.bytes for c in next(p for p in stage.phases if p.name == "optimizer").components}


def measured_states(record: dict) -> dict[str, int]:
    """Model states at the optimizer step, or, where the step was not measured (Megatron: the
    persistent states of the whole step), as the record states them."""
    measured = record["measured"]
    return measured["phases"].get("optimizer", measured)


def test_the_recorded_cases_are_there():
    assert len(RECORDS) >= 30
    assert set(KNOWN_GAPS) | set(KNOWN_STATE_GAPS) <= {p.stem for p in RECORDS}


def expected_failures(known: dict[str, str]) -> list:
    return [pytest.param(p, marks=pytest.mark.xfail(reason=known[p.stem], strict=True)) if p.stem in known else p
            for p in RECORDS]


@pytest.mark.parametrize("path", expected_failures(KNOWN_STATE_GAPS), ids=lambda p: p.stem)
def test_model_states_within_one_percent(path):
    record = load(path)
    step, measured = step_states(estimate_config(record["config"]), record), measured_states(record)
    assert step["parameters"] == pytest.approx(measured["parameters"], rel=0.01)
    assert step["optimizer_states"] + step.get("master_weights", 0) == \
        pytest.approx(measured["optimizer_states"], rel=0.01)
    assert step["gradients"] == pytest.approx(measured["gradients"], rel=0.01)


@pytest.mark.parametrize("path", expected_failures(KNOWN_GAPS), ids=lambda p: p.stem)
def test_peak_within_five_percent(path):
    record = load(path)
    peak = measured_stage(estimate_config(record["config"]), record).allocated_peak_bytes
    assert peak == pytest.approx(record["measured"]["peak_bytes"], rel=0.05)
