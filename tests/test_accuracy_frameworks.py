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
RECORDS = sorted(p for framework in ("torchtitan",) for p in (MEASURED / framework).glob("*.json"))

# case id -> why the estimate misses it (the next modelling steps)
KNOWN_GAPS = {
    "titan-llama-3.1-8b-w8-noac-s8192-b1":
        "not explained yet: the measured activations exceed the per-layer ledger (written from transformers' "
        "modules) by 5.6 GiB over 32 layers, about 175 MiB a layer; torchtitan's own modules (nn.RMSNorm, "
        "complex rotary embedding) keep other tensors; a per-tensor breakdown from the harness comes next",
    "titan-llama-3.1-8b-w8-fullac-s8192-b2":
        "the peak is inside ChunkedLossWrapper at the end of forward (components/loss.py): the lm_head gathered "
        "in bf16, its fp32 unsharded gradient across the chunks and the fp32 hidden-state gradient buffer; the "
        "chunked-loss model keeps a chunk of logits instead",
    "titan-llama-3.1-70b-w64-tp8-fullac-s8192-b1":
        "the peak is near the end of backward, with nearly every sharded gradient and the last units' unsharded "
        "gradients alive; the model's backward peak is its first moment",
}


def load(path: Path) -> dict:
    return json.loads(path.read_text())


def phase(result, name: str) -> dict[str, int]:
    stage = result.stages[result.peak_stage]
    return {c.key: c.bytes for c in next(p for p in stage.phases if p.name == name).components}


def test_the_recorded_cases_are_there():
    assert len(RECORDS) >= 7
    assert set(KNOWN_GAPS) <= {p.stem for p in RECORDS}


@pytest.mark.parametrize("path", RECORDS, ids=lambda p: p.stem)
def test_model_states_within_one_percent(path):
    record = load(path)
    step, measured = phase(estimate_config(record["config"]), "optimizer"), record["measured"]["phases"]["optimizer"]
    assert step["parameters"] == pytest.approx(measured["parameters"], rel=0.01)
    assert step["optimizer_states"] + step.get("master_weights", 0) == \
        pytest.approx(measured["optimizer_states"], rel=0.01)
    assert step["gradients"] == pytest.approx(measured["gradients"], rel=0.01)


@pytest.mark.parametrize("path", [pytest.param(p, marks=pytest.mark.xfail(reason=KNOWN_GAPS[p.stem], strict=True))
                                  if p.stem in KNOWN_GAPS else p for p in RECORDS], ids=lambda p: p.stem)
def test_peak_within_five_percent(path):
    record = load(path)
    peak = estimate_config(record["config"]).allocated_peak_bytes
    assert peak == pytest.approx(record["measured"]["peak_bytes"], rel=0.05)
