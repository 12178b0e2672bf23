"""torchao's AdamW8bit (torchtune's 8-bit AdamW) steps each parameter with a torch.compile'd function whose Inductor
kernels write each 8-bit state's new codes and block scales to scratch before copying them into the state (issue
#23, torchtune's README row "+ 8-bit AdamW"). The scratch is read from the code Inductor generates
(validation/torchtune/inductor_scratch.py, tests/data/measured/compile/), counted by the torchtune harness and
charged by the estimator in the optimizer phase and, under optimizer_in_backward, after the loss."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from estimator import estimate_config
from estimator.spec import optimizers
from estimator.spec.optimizers import TORCHAO_8BIT_SCRATCH, step_scratch

DATA = Path(__file__).parent / "data" / "measured"
RECORD = json.loads((DATA / "compile" / "torchao-adamw8bit-step-scratch-128256x3072.json").read_text())
TUNE = DATA / "torchtune"
EMBEDDING_3B = 128256 * 3072  # Llama 3.2 3B's tied embedding, its largest tensor: 394,002,432 elements
HEAD_8B = 128256 * 4096  # Llama 3.1 8B's embedding and LM head: 525,336,576 elements
GiB = 2**30


def load(case: str) -> dict:
    return json.loads((TUNE / f"{case}.json").read_text())


def phase(estimate, name: str):
    return next(p for p in estimate.stages[0].phases if p.name == name)


def test_the_compiled_step_writes_new_codes_and_scales_for_each_8bit_state():
    m = RECORD["measured"]
    assert m["elements"] == EMBEDDING_3B == 394_002_432
    assert sorted((b["dtype"], b["bytes"]) for b in m["buffers"]) == \
        [("float32", 1_539_072 * 4)] * 2 + [("uint8", 394_002_432)] * 2  # a scale per 256; a code per element
    # all four alive during the fused kernel, no fp32 copy of the tensor
    assert m["peak_bytes"] == 2 * (394_002_432 + 394_002_432 // 256 * 4) == 800_317_440
    assert TORCHAO_8BIT_SCRATCH.per_element * EMBEDDING_3B == m["peak_bytes"]
    assert RECORD["versions"]["torchao"] == "0.10.0"


def test_the_scratch_is_torchaos_keyed_on_its_release(monkeypatch):
    assert step_scratch("adam8bit", "torchtune", None) is TORCHAO_8BIT_SCRATCH
    assert step_scratch("adam8bit", "torchtune", "0.6.1") is TORCHAO_8BIT_SCRATCH  # torchao 0.10.0
    assert step_scratch("adam8bit", "hf", None) is None  # bitsandbytes' AdamW8bit steps in place
    assert step_scratch("adamw", "torchtune", None) is None  # fused AdamW
    # torchao before 0.7.0 stepped in the states' dtype (it cannot step a bf16 parameter with 8-bit states)
    monkeypatch.setitem(optimizers.TORCHTUNE_TORCHAO, "0.6.1", (0, 6, 1))
    assert step_scratch("adam8bit", "torchtune", "0.6.1") is None


def test_the_optimizer_phase_holds_the_largest_tensors_scratch_as_the_harness_counts_it():
    """Llama 3.1 8B, AdamW8bit after backward: the step of its 128256 x 4096 embedding (or head) holds
    2 x (525,336,576 codes + 2,052,096 x 4 B scales) = 1,067,089,920 B beside every gradient, the optimizer
    phase's peak; the harness's phase holds exactly that beside the RoPE cache and the batch (tokens, labels and
    the shifted labels, int64 x 4096 each; the ignore-label cache; the token count and the running loss)."""
    record = load("llama-3.1-8b-full-ac-chunkedce-adamw8bit-s4096-b1")
    m = record["measured"]
    assert m["peak_phase"] == "optimizer"
    batch = 3 * 4096 * 8 + 3 * 512
    assert m["phases"]["optimizer"]["activations"] == m["buffer_bytes"] + 1_067_089_920 + batch
    estimate = estimate_config(record["config"])
    scratch = [c for c in phase(estimate, "optimizer").components if c.key == "transient"]
    assert [c.bytes for c in scratch] == [round(TORCHAO_8BIT_SCRATCH.per_element * HEAD_8B)] == [1_067_089_920]
    assert estimate.allocated_peak_bytes == pytest.approx(m["peak_bytes"], rel=0.005)


def test_in_backward_the_step_comes_after_the_loss():
    """torchtune's README row setup (Llama 3.2 3B, batch 2 x 4096, AC, offloading, chunked loss, 8-bit AdamW
    stepped in backward), eager in the harness: backward's peak is the loss's moment, 18,524,572,672 B, which the
    estimate holds within 1% without the scratch; beside it the scratch would overshoot by over 4%. The tied
    embedding's gradient is whole only after the lookup's backward, at backward's end."""
    record = load("llama-3.2-3b-full-ac-offload-chunkedce-adamw8bit-inbwd-s4096-b2")
    measured = record["measured"]["phases"]["backward"]["total"]
    assert measured == 18_524_572_672
    backward = dict(estimate_config(record["config"]).stages[0].phase_totals)["backward"]
    assert backward == pytest.approx(measured, rel=0.01)
    assert backward + 800_317_440 > 1.04 * measured


def test_a_short_step_peaks_at_the_chunked_heads_sum_not_at_the_embeddings_compiled_step():
    """At 128 tokens the loss is small, and backward's peak is the chunked head's backward (memory/activations/
    chunked_head.py: two chunks' [V, h] bf16 weight gradients and their sum, 3 x 394,002,432 x 2 B, beside 7/8 of
    the bf16 logits gradients and 2/8 of the hidden-state ones, the fp32 log-softmax and a chunk's head input
    freed), above the tied embedding's step at backward's end, its bf16 gradient and the scratch:
    394,002,432 x (2 + 2.03125) B."""
    config = json.loads(json.dumps(load("llama-3.2-3b-full-ac-offload-chunkedce-adamw8bit-inbwd-s4096-b2")["config"]))
    config["training"].update(seq_len=128, micro_batch_size=1)
    estimate = estimate_config(config)
    assert estimate.stages[0].peak_phase == "backward"
    transient = [c for c in phase(estimate, "backward").components if c.key == "transient"]
    T, V, h = 128, 128_256, 3_072
    head = 3 * V * h * 2 + 7 / 8 * T * V * 2 + 2 / 8 * T * h * 2 - 4 * T * V - 1 / 8 * T * h * 2
    assert [(c.label, c.bytes) for c in transient] == [("Transient buffers", head)] == \
        [("Transient buffers", 2_327_175_168)]
    assert head > 394_002_432 * 2 + 800_317_440 == 1_588_322_304
    assert transient[0].parts[0].label.startswith("two chunks' LM head weight gradients and their sum")
