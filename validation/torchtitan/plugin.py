"""The torchtitan harness's declaration (validation/core/harness.py)."""

from __future__ import annotations

from ..core.harness import Harness

METHOD = (
    "fake-tensor CPU emulation of CUDA, rank 0 of a fake process group (FakeStore, backend "
    "'fake'): torchtitan 0.3.0's own model definition, parallelize function (FSDP2 fully_shard "
    "with MixedPrecisionPolicy(bf16 params, fp32 reduce), TP/SP, activation checkpointing, "
    "torchao float8 via Float8LinearConverter), ChunkedLossWrapper and fused AdamW container "
    "run a Trainer.train_step under torch FakeTensorMode on CPU. A TorchDispatchMode registers "
    "every storage of a plain (local) tensor when an op creates it and a weakref finalizer when "
    "it is freed, rounded up to 512 bytes as the CUDA caching allocator does; DTensor and "
    "float8 wrapper tensors are looked through to their local tensors; FSDP2's storage "
    "resize_ (free/alloc of unsharded parameters) is reported to the tracker. CUDA behaviour "
    "emulated: torch.compile'd flex attention makes Inductor's flex kernel allocations (forward: "
    "out, fp32 logsumexp and max_scores; saves q, k, v, out, logsumexp; backward: fp32 delta, "
    "dq, dk, dv with no GQA expansion) and counts as one must-save op for SelectiveAC, as the "
    "compiled region does; torch.nn.RMSNorm takes CUDA's aten._fused_rms_norm path (CPU kernels registered for "
    "_fused_rms_norm and _fused_rms_norm_backward, so autograd saves the input, weight and the fp32 rstd per row, and "
    "the kernels allocate the output and rstd, then dX and dgamma, as layer_norm_kernel.cu does) instead of the CPU "
    "build's op-by-op composite with its fp32 copies; torchao float8 matmuls (torch._scaled_mm) run through torch's "
    "CPU kernel (fake tensors: its meta function), which allocates the bf16 output the CUDA kernel allocates, "
    "nothing else being visible to the tracker; fused AdamW's step counters are on the device (counted as optimizer "
    "state). Eager run (disable_cuda_graphs=True, grads set to None at zero_grad). Step 2 is "
    "measured. Phases: forward = model forward plus the chunked loss (lm_head forward and "
    "backward per chunk), backward = decoder backward, optimizer = clip_grad_norm_ + step. "
    "Categories: parameters (the sharded fp32 parameters), gradients (sharded param.grad), "
    "optimizer_states (AdamW exp_avg, exp_avg_sq, step), activations (everything else: "
    "unsharded bf16 parameters and gradients in flight, saved tensors, temporaries, buffers, "
    "the batch). Validated byte for byte against real CPU runs of tiny models "
    "(tests/test_harness_torchtitan.py)."
)

HARNESS = Harness(
    name="torchtitan", title="torchtitan", order=(1, 2), method=METHOD, distributions=("torch", "torchtitan"),
    optional_distributions=("torchao",), measure="cases:measure", report="report:report")
