"""The HF Trainer through Accelerate harness's declaration (validation/core/harness.py)."""

from __future__ import annotations

from ..core.harness import Harness

METHOD = (
    "fake-tensor CPU emulation of CUDA, as for the HF and PEFT records (validation/hf, validation/peft): the plain harness's model and optimizer (foreach AdamW for full fine-tuning, fused AdamW over "
    "fp32 LoRA adapters), prepared by the real accelerate Accelerator(mixed_precision, cpu=True).prepare, which "
    "replaces model.forward by convert_outputs_to_fp32(autocast(forward)) (native_amp; autocast on the CPU "
    "device), then the HF Trainer's step: compute_loss (the outputs, fp32 logits included, alive until it "
    "returns), accelerator.backward, accelerator.clip_grad_norm_(1.0), optimizer step, grads set to None. Every "
    "tensor storage is logged when an op creates it and when it is freed, rounded up to 512 bytes. CUDA "
    "behaviour emulated: FlashAttention-2 allocations for SDPA (inputs cast to the autocast dtype, as CUDA "
    "autocast lists SDPA), fused dropout, device step counters of fused AdamW, host scalars not counted. Step 2 "
    "is measured. Categories as the plain records'. The harness's step equals transformers.Trainer.training_step's "
    "allocations on tiny real CPU runs (tests/test_harness_accelerate.py). The TRL cases run the real "
    "trl.SFTTrainer.training_step (its compute_loss and, for loss_type chunked_nll, its patched forward) on a batch of "
    "full-length sequences, every token a target; the values TRL reads from tensors (valid-token counts, metrics) are "
    "answered from the batch in fake runs only (validation/accelerate/trl_sft.py), which equal real CPU runs byte for "
    "byte."
)

HARNESS = Harness(
    name="accelerate", title="HF Trainer + Accelerate", order=(6, 6), method=METHOD,
    distributions=("torch", "transformers", "accelerate"), optional_distributions=("peft", "trl"),
    measure="harness:measure", trace="harness:traced_step")
