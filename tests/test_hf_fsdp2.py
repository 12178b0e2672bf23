"""The HF Trainer over FSDP2 (framework hf_fsdp2, estimator/memory/hf_fsdp2.py): each mechanism by hand, from
accelerate 1.15.0's and torch 2.13's FSDP2 code. The harness's records (validation/hf_fsdp2,
tests/data/measured/hf_fsdp2) are held to 5% by tests/test_accuracy.py; these pin the parts byte for byte."""

from __future__ import annotations

import pytest

from estimator import estimate_config
from estimator.spec.errors import ConfigError
from estimator.models.presets import get_architecture
from estimator.spec.hardware import Hardware
from estimator.spec.parallel import Parallel
from estimator.spec.training import Training
from estimator.speed.roofline import roofline

LLAMA_8B = 8_030_261_248  # parameters (tests/data/measured/hf_fsdp2: 16,060,522,496 B of bf16 no_sync gradients)
V8, H8 = 128_256, 4096
LLAMA_1B_LAYER = 60_821_504  # q, o 2048^2; k, v 2048 x 512; gate, up, down 2048 x 8192; two norms
V1, H1 = 128_256, 2048


def config(model="llama-3.1-8b", dp=8, seq=4096, gbs=None, **training):
    t = {"framework": "hf_fsdp2", "seq_len": seq, "micro_batch_size": 1, "recompute": "full", **training}
    if gbs:
        t["global_batch_size"] = gbs
    return {"model": model, "training": t, "parallel": {"dp": dp}}


def parts(result, phase: str) -> dict[str, int]:
    """Every component and part of a phase of the peak stage, by label."""
    out: dict[str, int] = {}

    def walk(c):
        out[c.label] = c.bytes
        for p in c.parts:
            walk(p)
    for c in next(p for p in result.stages[result.peak_stage].phases if p.name == phase).components:
        walk(c)
    return out


NO_SYNC = "Unsharded gradients of every unit (no_sync accumulation)"


def test_no_sync_accumulation_keeps_every_unsharded_gradient_in_bf16():
    """accelerate's no_sync under FSDP2 is set_requires_gradient_sync(False): every trainable parameter keeps its
    unsharded gradient in the reduce dtype, bf16 = the gathered dtype, through the last micro-batch's forward."""
    accumulated = estimate_config(config(gbs=16))  # 2 micro-batches on 8 GPUs
    assert parts(accumulated, "forward")[NO_SYNC] == 2 * LLAMA_8B
    assert parts(accumulated, "backward")[NO_SYNC] == 2 * LLAMA_8B
    assert NO_SYNC not in parts(estimate_config(config()), "forward")  # one micro-batch: reduce-scattered at once


def test_no_sync_accumulation_under_lora_counts_the_adapters_alone():
    """Frozen weights get no gradient: LoRA r16 on all seven projections of Llama-3.1-8B has 32 layers x
    16 x (q 4096+4096, k 4096+1024, v 4096+1024, o 4096+4096, gate 4096+14336, up 4096+14336, down 14336+4096)."""
    adapters = 32 * 16 * (8192 + 5120 + 5120 + 8192 + 18432 + 18432 + 18432)
    lora = config(gbs=16, adapter={"method": "lora", "rank": 16, "alpha": 32,
                                   "target_modules": ["q", "k", "v", "o", "gate", "up", "down"]})
    assert parts(estimate_config(lora), "forward")[NO_SYNC] == 2 * adapters


def test_the_tail_unit_and_its_all_gather_output_at_the_loss():
    """The loss runs inside the model's forward with the tail (final norm, LM head) gathered, not resharded
    after forward; its all-gather output waits for the next all-gather to be freed (torch 2.13 FSDP2
    wait_for_unshard): two bf16 copies of V*h + h beside the loss (measured: two 1002 MiB buffers)."""
    forward = parts(estimate_config(config()), "forward")
    tail = 2 * (V8 * H8 + H8)
    assert forward["The tail unit (final norm, LM head) gathered: not resharded after forward"] == tail
    assert forward["The tail unit's all-gather output (freed at the next all-gather)"] == tail


def test_tied_embeddings_put_the_last_layers_all_gather_output_beside_the_loss():
    """Tied, the tail unit is gathered at the embedding (the forward's first unit): the last all-gather is the
    last layer's (measured: a 60,821,504-element bf16 buffer beside the loss, Llama-3.2-1B)."""
    forward = parts(estimate_config(config("llama-3.2-1b", dp=4, seq=2048, recompute="none")), "forward")
    assert forward["The last layer's all-gather output (freed at the next all-gather)"] == 2 * LLAMA_1B_LAYER
    assert forward["The tail unit (final norm, LM head) gathered: not resharded after forward"] == 2 * (V1 * H1 + H1)


def test_the_tied_tails_post_backward_ends_the_backward():
    """The tied tail's post-backward runs from the root's final callback (the token ids need no gradient): the tail
    gathered, the head's gradient, the lookup's and their sum, beside the first layer's reduce-scatter input
    (measured at s512: four 501 MiB tensors and a 116 MiB one), every other sharded fp32 gradient made."""
    result = estimate_config(config("llama-3.2-1b", dp=4, seq=512))
    stage = result.stages[result.peak_stage]
    backward = parts(result, "backward")
    tail = V1 * H1 + H1
    assert backward["The tail's post-backward: the tail unit gathered, the head's and the lookup's gradients and "
                    "their sum"] == 4 * 2 * tail
    assert backward["The first layer's reduce-scatter input"] == 2 * LLAMA_1B_LAYER
    assert stage.peak_phase == "backward"
    # every fp32 sharded gradient but the tail's: 4 B x (1,235,814,400 parameters - V*h - h) / 4 GPUs
    assert backward["Gradients (their units' reduce-scatters not all run yet)"] == pytest.approx(
        4 * (1_235_814_400 - tail) / 4, abs=1)


def test_reduce_scatter_once_per_step_in_bf16():
    """Accelerate's MixedPrecisionPolicy reduces in bf16, and no_sync leaves one reduce-scatter per step;
    the all-gathers run every micro-batch, forward and backward (ZeRO-3)."""
    arch = get_architecture("llama-3.1-8b")
    tr = Training(framework="hf_fsdp2", seq_len=4096, global_batch_size=16, recompute="full")
    step = roofline(arch, tr, Parallel(dp=8), Hardware("h100-80")).step
    by_name = {c.name: c for c in step.communication}
    assert by_name["gradient reduce-scatter"].bytes == pytest.approx(7 / 8 * LLAMA_8B * 2)
    assert by_name["parameter all-gather"].bytes == pytest.approx(4 * 7 / 8 * LLAMA_8B * 2)


@pytest.mark.parametrize("change, field", [
    ({"parallel": {"dp": 4, "tp": 2}}, "parallel.tp"),
    ({"parallel": {"dp": 8, "zero_stage": 0}}, "parallel.zero_stage"),
    ({"parallel": {"dp": 1}}, "parallel.dp"),
    ({"training": {"adapter": {"method": "qlora", "rank": 16, "alpha": 32, "target_modules": "all-linear"}}},
     "training.adapter.method"),
    ({"training": {"optimizer": "paged_adamw"}}, "training.optimizer"),
    ({"training": {"optimizer_in_backward": True}}, "training.optimizer_in_backward"),
    ({"training": {"recompute_every": 2}}, "training.recompute_every"),
    ({"training": {"compile": True}}, "training.compile"),
])
def test_what_is_not_modelled_is_refused_by_name(change, field):
    cfg = config()
    for section, values in change.items():
        cfg[section] = {**cfg[section], **values}
    with pytest.raises(ConfigError) as error:
        estimate_config(cfg)
    assert error.value.field == field
