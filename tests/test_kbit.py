"""peft's prepare_model_for_kbit_training (training.adapter.prepare_kbit, estimator/memory/kbit.py): the
16-bit weights that are not quantized become fp32, so do the residual stream, the logits and the
attention (SDPA's math backend with grouped KV heads). Hand-computed numbers, the GPU record."""

import json
from pathlib import Path

import pytest

from estimator import estimate_config
from estimator.spec.errors import ConfigError

GPU = Path(__file__).parent / "data" / "measured" / "gpu"
PREPARED = "llama-3.1-8b-qlora-bnb-r16-all7-recompute-drop00-s4096-b1-prepared"
MiB = 2**20


def config(prepared: bool = True, **training) -> dict:
    record = json.loads((GPU / f"{PREPARED}.json").read_text())
    cfg = record["config"]
    cfg["training"]["adapter"]["prepare_kbit"] = prepared
    cfg["training"].update(training)
    return cfg


def peak_stage(cfg: dict):
    result = estimate_config(cfg)
    return next(s for s in result.stages if s.stage == result.peak_stage)


def step_component(stage, key: str) -> int:
    return next(c.bytes for p in stage.phases if p.name == "optimizer" for c in p.components if c.key == key)


def test_the_rest_of_the_model_is_cast_to_fp32():
    """Llama-3.1-8B: embedding and LM head (128,256 x 4,096 each) and 65 RMSNorm scales of 4,096 go
    from 2 to 4 bytes; the GPU measured exactly that difference between the two runs."""
    grown = step_component(peak_stage(config(True)), "parameters") - step_component(peak_stage(config(False)),
                                                                                     "parameters")
    by_hand = 2 * (2 * 128_256 * 4096 + (2 * 32 + 1) * 4096)
    assert grown == by_hand == 2_101_878_784
    plain = json.loads((GPU / PREPARED.replace("-prepared", ".json")).read_text())["measured"]["parameters"]
    prepared = json.loads((GPU / f"{PREPARED}.json").read_text())["measured"]["parameters"]
    assert prepared - plain == by_hand


def test_fp32_residual_stream_logits_and_math_attention():
    """Full recompute keeps each layer's fp32 input (4*s*h: 32 x 64 MiB); the loss keeps the fp32
    log-softmax and no upcast copy is made; the attention keeps _safe_softmax's fp32 output, 4*a*s^2."""
    result = estimate_config(config(True))
    stage = next(s for s in result.stages if s.stage == result.peak_stage)
    forward = next(p for p in stage.phases if p.name == "forward")
    assert next(c.bytes for c in forward.components if c.key == "activations") == 32 * 4 * 4096 * 4096
    plain = estimate_config(config(False))
    plain_forward = next(p for p in next(s for s in plain.stages).phases if p.name == "forward")
    assert next(c.bytes for c in plain_forward.components if c.key == "activations") == 32 * 2 * 4096 * 4096
    ledger = {line.name: line.bytes for line in result.activation_ledger}
    assert ledger["softmax output (fp32, SDPA math backend)"] == 4 * 32 * 4096 * 4096 == 2048 * MiB
    assert "softmax output cast to the compute dtype" not in ledger


def test_the_gpu_record_within_five_percent_and_its_phases():
    """The H200 record: allocated peak 18.12 GiB (backward), forward 14.71 GiB; without the field the
    estimate was 12.78 GiB (-29.5%)."""
    record = json.loads((GPU / f"{PREPARED}.json").read_text())
    stage = peak_stage(record["config"])
    assert stage.allocated_peak_bytes == pytest.approx(record["measured"]["peak_bytes"], rel=0.01)
    assert stage.peak_phase == "backward"
    forward = next(p for p in stage.phases if p.name == "forward")
    measured_forward = record["measured"]["phases"]["forward"]["peak_bytes"]
    assert sum(c.bytes for c in forward.components) == pytest.approx(measured_forward, rel=0.01)
    assert peak_stage(config(False)).allocated_peak_bytes < 0.72 * record["measured"]["peak_bytes"]


def test_equal_head_counts_keep_no_scores():
    """Without grouped KV heads memory-efficient attention takes fp32: no s^2 tensor is kept."""
    cfg = config(True)
    cfg["model"]["num_kv_heads"] = cfg["model"]["num_attention_heads"]
    ledger = {line.name for line in estimate_config(cfg).activation_ledger}
    assert not any("softmax" in name for name in ledger)
    assert any("flash" in name for name in ledger)


@pytest.mark.parametrize("change, field", [
    ({"framework": "deepspeed", "training_loop": "trainer"}, "training.adapter.prepare_kbit"),  # the GPU record's loop is plain
    ({"param_dtype": "fp32", "compute_dtype": "fp32"}, "training.adapter.prepare_kbit"),
])
def test_refused_outside_its_stack(change, field):
    with pytest.raises(ConfigError) as err:
        estimate_config(config(True, **change))
    assert err.value.field == field


def test_refused_without_a_quantized_base():
    cfg = config(True)
    cfg["training"]["adapter"].update(method="lora", base_dtype="bf16")
    cfg["training"]["adapter"].pop("bitsandbytes_version")  # the GPU record names its release (0.48.2)
    with pytest.raises(ConfigError) as err:
        estimate_config(cfg)
    assert err.value.field == "training.adapter.prepare_kbit" and "base_dtype" in str(err.value)


ACCELERATE = Path(__file__).parent / "data" / "measured" / "accelerate"
PREPARED_TRAINER = "llama-3.1-8b-qlora-r16-all7-recompute-drop00-s4096-b1-prepared-accelerate-bf16"


def test_under_the_trainers_autocast_sdpa_gets_bf16_and_the_head_is_copied():
    """Under the HF Trainer's autocast (bf16): SDPA casts the fp32 q, k, v, so no math-backend scores are kept;
    the fp32 LM head is cast for its matmul and the bf16 copy is kept for backward (128,256 x 4,096 x 2 B); the
    logits are bf16 (2 B) beside Accelerate's fp32 copy (4 B)."""
    cfg = config(True, training_loop="trainer")
    result = estimate_config(cfg)
    ledger = {line.name for line in result.activation_ledger}
    assert not any("math backend" in name for name in ledger)
    stage = next(s for s in result.stages if s.stage == result.peak_stage)
    parts = {p.label: p.bytes for ph in stage.phases for c in ph.components for p in (c.parts or (c,))}
    assert parts["autocast's 16-bit copy of the fp32 LM head weight (kept for backward)"] == 128_256 * 4096 * 2
    assert parts["logits in the autocast dtype (the fp32 head's matmul)"] == 4096 * 128_256 * 2


def test_the_accelerate_record_within_one_percent_in_both_phases():
    """The real Accelerate's step over the prepared model (validation/accelerate): forward 15.82 GiB, backward
    16.65 GiB; the plain loop's ledger was 9.1% over."""
    record = json.loads((ACCELERATE / f"{PREPARED_TRAINER}.json").read_text())
    stage = peak_stage(record["config"])
    for phase in ("forward", "backward"):
        measured = record["measured"]["phases"][phase]["total"]
        estimated = sum(c.bytes for p in stage.phases if p.name == phase for c in p.components
                        if c.key not in ("context", "fragmentation", "communication"))
        assert estimated == pytest.approx(measured, rel=0.01), phase

