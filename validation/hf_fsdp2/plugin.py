"""The HF Trainer + Accelerate FSDP2 harness's declaration (validation/core/harness.py)."""

from __future__ import annotations

from ..core.harness import Harness

METHOD = (
    "fake-tensor CPU emulation of CUDA, rank 0 of a fake process group (FakeStore, backend 'fake'): the real "
    "transformers model code (bf16, the checkpoint's dtype that from_pretrained loads by default) wrapped by "
    "accelerate 1.15's own fsdp2_prepare_model (torch's fully_shard per decoder layer, the embedding, the tail "
    "[final norm, lm_head] with reshard_after_forward=False, the root; trainable parameters upcast to fp32; "
    "MixedPrecisionPolicy(bf16, bf16, bf16) from the plugin's set_mixed_precision) as the HF Trainer with "
    "fsdp_version 2 runs it, without autocast (accelerate's _prepare_fsdp2 never calls prepare_model), under "
    "torch FakeTensorMode on the CPU; every storage of a plain (local) tensor is logged when an op creates it "
    "and when it is freed, DTensors looked through to their local tensors, FSDP2's storage resizes of the "
    "unsharded parameters included, rounded up to 512 bytes as the CUDA caching allocator does. CUDA behaviour "
    "emulated as for the HF records: FlashAttention-2 allocations for SDPA, the packed-sequence check, the "
    "softmax backward's temporary. Streams and events are the CPU's no-ops: allocations in the order the CPU "
    "issues them, without a GPU stream's delayed block reuse. Step 2 is measured. Phases: accumulate "
    "(micro-batches before the last, under set_requires_gradient_sync(False)), forward and backward (the last "
    "micro-batch), optimizer (accelerate's DTensor-aware clip_grad_norm_ and fused AdamW). Categories: "
    "parameters (the sharded parameters' local tensors: fp32 trainable, bf16 frozen), gradients (the sharded "
    "fp32 gradients, and under no_sync the unsharded bf16 gradients FSDP2 keeps between micro-batches), "
    "optimizer_states (exp_avg, exp_avg_sq, step), activations (everything else: unsharded bf16 parameters and "
    "in-flight gradients, saved tensors, temporaries, buffers, the batch). Validated byte for byte against real "
    "CPU runs of tiny models (tests/test_harness_hf_fsdp2.py)."
)

HARNESS = Harness(
    name="hf_fsdp2", title="PyTorch FSDP2 under the HF Trainer (Accelerate)", order=(7, 7), method=METHOD,
    distributions=("torch", "transformers", "accelerate"), optional_distributions=("peft",),
    report="report:report", trace="step:traced_step")
