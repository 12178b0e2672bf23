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
RECORDS = sorted(p for framework in ("torchtitan", "megatron") for p in (MEASURED / framework).glob("*.json"))

# case id -> why the estimate misses it (the next modelling steps)
KNOWN_GAPS = {
    "titan-llama-3.1-8b-w8-noac-s8192-b1":
        "the harness runs torch.nn.RMSNorm through its CPU decomposition, which keeps an fp32 normalised copy "
        "(4 B x s x b x h per norm) beyond the ledger's transformers-style norm (per-tensor breakdown of a 2-layer "
        "run); on CUDA, F.rms_norm may dispatch to aten._fused_rms_norm, which keeps only the input and rstd: the "
        "harness must emulate that kernel (as it emulates flash attention) before the ledger is changed",
    "titan-qwen3-8b-w64-noac-s2048-b4":
        "under by 11% without recompute: as titan-llama-3.1-8b-w8-noac-s8192-b1 (torch.nn.RMSNorm's CPU "
        "decomposition in the harness, here also on the q and k norms)",
    "titan-llama-3.1-8b-w8-ac-every2-s8192-b1":
        "under by 5.2%: the 16 layers kept whole carry the harness's fp32 RMSNorm copies (see "
        "titan-llama-3.1-8b-w8-noac-s8192-b1)",
    "titan-qwen3-32b-w64-tp4-fullac-s8192-b1":
        "under by 8% at backward's last moments: beside the gradients, a unit's unsharded fp32 gradients and "
        "the recomputed layer, the harness holds the embedding unit gathered for its backward and 64 small "
        "buffers allocated before the step (per-tensor breakdown), which the model does not list yet",
    "titan-qwen3-32b-w512-tp8-noac-reshard-never-s4096-b1":
        "under by 24%: no recompute (the harness's fp32 RMSNorm copies, here also on q and k) with every "
        "block's TP-sharded bf16 parameters left gathered after forward; not itemised yet",
    "titan-llama-3.1-70b-w512-tp8-fullac-reshard-never-s8192-b2":
        "under by 5.8% with every block left gathered after forward under TP 8: not itemised yet",
    "titan-qwen3-8b-w8-tp2-ac-every2-s4096-b1":
        "under by 8% with TP 2 and every second layer checkpointed: the stored layers' ledger under torchtitan's "
        "tensor parallel plan is not itemised yet",
    "gpt3-175b-tp8-pp8-first-s2048-b1-unfused":
        "Megatron's unfused softmax with attention_softmax_in_fp32 (the default, transformer_config.py) keeps an "
        "fp32 softmax output for its backward and a bf16 copy for scores x V, 6 B per score (fused_softmax.py); "
        "the ledger keeps the 2 B of the fused upper-triangular softmax kernel, which this CPU build lacks",
    "mixtral-8x7b-tp2-pp4-first-ep4-s4096-b1-router-fp32":
        "not expressible: --moe-router-dtype fp32 (+0.28 GiB of fp32 router temporaries at the peak)",
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
