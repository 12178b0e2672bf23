"""The PyTorch FSDP1 harness's declaration (validation/core/harness.py)."""

from __future__ import annotations

from ..core.harness import Harness

METHOD = (
    "fake-tensor CPU emulation of CUDA, rank 0 of a fake process group (FakeStore, backend 'fake'): the real "
    "transformers model code wrapped by torch's own FullyShardedDataParallel (FSDP1) as Accelerate's plugin "
    "configures it for the HF Trainer, run under torch FakeTensorMode on the CPU device handle; every tensor "
    "storage is logged when an op creates it and when it is freed (FSDP's storage resizes included), rounded up "
    "to 512 bytes as the CUDA caching allocator does. CUDA behaviour emulated as for the HF records: "
    "FlashAttention-2 allocations for SDPA, the packed-sequence check. Streams and events are the CPU handle's "
    "no-ops: allocations in the order the CPU issues them, without a GPU stream's delayed block reuse. Step 2 is "
    "measured. Phases: accumulate (micro-batches before the last, under no_sync), forward and backward (the last "
    "micro-batch), optimizer (FSDP clip_grad_norm_ and fused AdamW). Categories: parameters (each unit's sharded "
    "fp32 FlatParameter, `_local_shard`), gradients (the sharded gradients), optimizer_states (exp_avg, "
    "exp_avg_sq, step), activations (everything else: unsharded bf16 FlatParameters and gradients, saved tensors, "
    "temporaries, buffers, the batch). Validated byte for byte against real CPU runs of tiny models "
    "(tests/test_harness_fsdp1.py)."
)

HARNESS = Harness(
    name="fsdp1", title="PyTorch FSDP1", order=(5, 5), method=METHOD, distributions=("torch", "transformers"),
    optional_distributions=("peft",), trace="step:traced_step")
