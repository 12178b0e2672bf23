"""The Accelerate harness (validation/accelerate/): the HF Trainer's step through the real Accelerate, under
fake tensors, equals real CPU runs of tiny models byte for byte and `transformers.Trainer.training_step`'s own
allocations; what Accelerate's mixed precision changes, counted by hand."""

from collections import Counter

import pytest

pytest.importorskip("transformers", reason="the Accelerate harness needs transformers (the [validate] extra)")
pytest.importorskip("accelerate", reason="the Accelerate harness needs accelerate")
pytest.importorskip("peft", reason="the LoRA cases need peft")

from validation.accelerate.harness import AccelerateRun, measure, traced_step  # noqa: E402
from validation.peft import step as peft_step  # noqa: E402
from validation.peft.build import ALL_SEVEN, LoraRun  # noqa: E402
from validation.hf.step import Run  # noqa: E402
from validation.hf.step import traced_step as plain_traced_step  # noqa: E402
from validation.core.tracker import categories, phase_summary  # noqa: E402
from validation.core.tracker import cuda_block_bytes as block  # noqa: E402

FULL = AccelerateRun(Run("tiny-llama", 64, 2))
LORA = AccelerateRun(LoraRun("tiny-llama", 64, 2, rank=4, alpha=8, targets=ALL_SEVEN))
# tiny-llama (validation/models.py): hidden 64, 2 layers, 4 heads of 16, 2 KV heads (k, v 32 wide), MLP 160,
# vocabulary 1000
H, KV, MLP, V, LAYERS = 64, 32, 160, 1000, 2


@pytest.fixture(scope="module")
def fake():
    return {run: measure(run) for run in (FULL, LORA)}


@pytest.mark.parametrize("run", [FULL, LORA], ids=["full", "lora"])
def test_fake_measurement_equals_real_cpu_run(run, fake):
    assert fake[run] == measure(run, fake=False)


@pytest.mark.parametrize("run", [FULL, LORA], ids=["full", "lora"])
def test_the_harness_step_allocates_what_trainer_training_step_does(run, fake):
    """The same prepared model run by the real `Trainer.training_step` (forward and backward in one phase)."""
    ours, trainer = fake[run]["phases"], measure(run, trainer=True)["phases"]
    assert max(ours["forward"]["total"], ours["backward"]["total"]) == trainer["backward"]["total"]
    assert ours["optimizer"] == trainer["optimizer"]


def live_labels(tracker, phase: str) -> Counter:
    index = dict((name, i) for i, name in tracker.marks)[phase]
    return Counter(tracker.labels.get(k, "?") for k in tracker.live_at(index))


def test_accelerate_copies_the_logits_to_fp32_and_the_forward_peak_ties_the_losss():
    """convert_outputs_to_fp32 makes a second fp32 [b, s, V] after the loss's own upcast (accelerate 1.15
    utils/operations.py); at that moment the bf16 logits, the fp32 log-softmax and the copy are alive,
    as many bytes as at the loss's upcast (bf16 logits, fp32 upcast, fp32 log-softmax): the forward peak
    is the plain loop's."""
    tracker, *_ = traced_step(FULL)
    plain, _ = plain_traced_step(FULL.base)
    begin, end = (i for i, _ in tracker.marks[:2])
    copies = [k for k, d in tracker.events[begin:end] if d > 0 and tracker.labels.get(k, "").startswith("_to_copy")
              and tracker.labels[k].endswith("float32 (2, 64, 1000)")]
    assert len(copies) == 2  # the loss's upcast, then Accelerate's copy
    everything = categories(set(), set(), set())
    ours, theirs = phase_summary(tracker, everything)["phases"], phase_summary(plain, everything)["phases"]
    assert ours["forward"]["total"] == theirs["forward"]["total"]
    # after compute_loss returns, the copy is gone: backward starts without any [b, s, V] but the log-softmax
    assert sum(1 for label in live_labels(tracker, "backward").elements() if "(2, 64, 1000)" in label
               or "(128, 1000)" in label) == 1


def test_lora_under_autocast_keeps_bf16_adapter_inputs():
    """peft casts each adapted module's input to the fp32 adapters' dtype; under Accelerate's autocast
    lora_A's linear casts it back to bf16 and keeps that copy (2 B where the plain loop keeps 4 B), lora_A's
    r-wide output is bf16 too, and the bf16 copies autocast makes of the fp32 adapter weights are kept for
    the input's gradient, except where the input needs none (the first layer's q, k, v: frozen embeddings)."""
    plain, _, _, _ = peft_step.traced_step(LORA.base)
    ours, *_ = traced_step(LORA)

    def at_backward(tracker):
        index = dict((name, i) for i, name in tracker.marks)["backward"]
        return sum(tracker.live_at(index).values())

    b, s, r = 2, 64, 4
    ins = (H, H, H, H, H, H, MLP)  # q, k, v, o, gate, up, down
    outs = (H, KV, KV, H, MLP, MLP, H)
    per_layer = sum(block(4 * b * s * i) - block(2 * b * s * i) + block(4 * b * s * r) - block(2 * b * s * r)
                    - block(2 * r * i) - block(2 * o * r) for i, o in zip(ins, outs))
    first_layer_qkv_a = 3 * block(2 * r * H)
    assert at_backward(plain) - at_backward(ours) == LAYERS * per_layer + first_layer_qkv_a == 273_920
