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


# TRL's SFTTrainer (validation/accelerate/trl_sft.py): the fake run answers TRL's reads of values from the batch;
# the real run runs TRL's own code. nll over micro-batch 2 (the entropy's reshape copies); chunked_nll over 2 x 199
# targets (a full 256-token chunk and a partial one: the rewritten range), and over 2 x 299 with the model's
# recompute around TRL's checkpointed chunks; chunked_nll under LoRA (the patch on the PeftModel's base model).
SFT_NLL = AccelerateRun(Run("tiny-llama", 64, 2), trl_sft="nll")
SFT_CHUNKED = AccelerateRun(Run("tiny-llama", 200, 2), trl_sft="chunked_nll")
SFT_CHUNKED_RECOMPUTE = AccelerateRun(Run("tiny-llama", 300, 2, recompute="full"), trl_sft="chunked_nll")
SFT_CHUNKED_LORA = AccelerateRun(LoraRun("tiny-llama", 64, 1, rank=4, alpha=8, targets=ALL_SEVEN),
                                 trl_sft="chunked_nll")


@pytest.mark.parametrize("run", [SFT_NLL, SFT_CHUNKED, SFT_CHUNKED_RECOMPUTE, SFT_CHUNKED_LORA],
                         ids=["nll-b2", "chunked-b2", "chunked-b2-recompute", "chunked-lora"])
def test_trl_sft_fake_measurement_equals_real_cpu_run(run):
    pytest.importorskip("trl", reason="the SFTTrainer cases need trl 1.9.0 (validation/install_frameworks.sh)")
    assert measure(run) == measure(run, fake=False)


def _vocabulary_wide(tracker, category) -> Counter:
    """The activations alive at the backward phase's peak with a vocabulary-sized dimension, by label."""
    live = tracker.live_at(tracker.peaks(category)["backward"]["at"])
    return Counter({tracker.labels[k]: size for k, size in live.items()
                    if category(k) == "activations" and str(V) in tracker.labels.get(k, "").split("(")[-1]})


def test_trl_nll_keeps_the_outputs_and_copies_the_shifted_logits_for_the_entropy():
    """loss_type "nll" (trl 1.9.0 SFTTrainer.compute_loss): the outputs (Accelerate's fp32 copy of the logits) are
    alive while the entropy is computed under no_grad; `entropy_from_logits` reshapes `logits[..., :-1, :]` to
    (-1, V), a copy at micro-batch 2 (the slice is not contiguous), then per 128-row chunk makes its log-softmax,
    exp and product (2 x 63 = 126 rows: one chunk). Beside them the loss's fp32 log-softmax, kept for backward:
    the step's peak. One label each, so the counts are the sizes."""
    pytest.importorskip("trl", reason="the SFTTrainer cases need trl 1.9.0 (validation/install_frameworks.sh)")
    tracker, category, *_ = traced_step(SFT_NLL)
    b, s = 2, 64
    assert _vocabulary_wide(tracker, category) == Counter({
        f"_log_softmax.default float32 ({b * s}, {V})": block(4 * b * s * V),  # the loss's, saved for backward
        f"_to_copy.default float32 ({b}, {s}, {V})": block(4 * b * s * V),  # convert_outputs_to_fp32's copy
        f"clone.default float32 ({b}, {s - 1}, {V})": block(4 * b * (s - 1) * V),  # the reshape's copy
        f"_log_softmax.default float32 ({b * (s - 1)}, {V})": block(4 * b * (s - 1) * V),  # the entropy's chunk
        f"exp.default float32 ({b * (s - 1)}, {V})": block(4 * b * (s - 1) * V),
        f"mul.Tensor float32 ({b * (s - 1)}, {V})": block(4 * b * (s - 1) * V),
    })


def test_trl_chunked_nll_holds_one_256_token_chunk_of_logits():
    """loss_type "chunked_nll" (trl 1.9.0 `_chunk`, recomputed in backward by torch.utils.checkpoint): no
    [b, s, V] tensor at all; at the peak (the first, full chunk's recomputation: backward takes the 142-token
    chunk first) one chunk's logits, `h.float() @ w.float().t()` made bf16 by Accelerate's autocast (from the bf16
    casts of both fp32 copies; the weight's transposed), its fp32 log-softmax, exp and product for the entropy,
    and the second chunk's gradient of the head weight (bf16, the backward of `w.float()`), held by autograd until
    the first chunk's is added to it. The fp32 copy of the weight is freed once autocast has cast it: at this
    size (V x H = 1000 x 64) the chunk outweighs it."""
    pytest.importorskip("trl", reason="the SFTTrainer cases need trl 1.9.0 (validation/install_frameworks.sh)")
    tracker, category, *_ = traced_step(SFT_CHUNKED)
    chunk = 256
    assert _vocabulary_wide(tracker, category) == Counter({
        f"mm.default bfloat16 ({chunk}, {V})": block(2 * chunk * V),
        f"_log_softmax.default float32 ({chunk}, {V})": block(4 * chunk * V),
        f"exp.default float32 ({chunk}, {V})": block(4 * chunk * V),
        f"mul.Tensor float32 ({chunk}, {V})": block(4 * chunk * V),
        f"_to_copy.default bfloat16 ({H}, {V})": block(2 * H * V),  # autocast's cast of w.float().t()
        f"_to_copy.default bfloat16 ({V}, {H})": block(2 * V * H),  # the second chunk's weight gradient
    })
