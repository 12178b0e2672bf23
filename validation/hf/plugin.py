"""The Hugging Face transformers harness's declaration (validation/core/harness.py)."""

from __future__ import annotations

from ..core.harness import Harness

METHOD = (
    "fake-tensor CPU emulation of CUDA: the real transformers model code runs one HF-Trainer "
    "training step under torch FakeTensorMode on CPU (no memory is allocated); a "
    "TorchDispatchMode registers every tensor storage when an op creates it and a weakref "
    "finalizer when it is freed, each rounded up to 512 bytes as the CUDA caching allocator "
    "does. CUDA behaviour is emulated: SDPA makes FlashAttention-2's allocations (native GQA; "
    "saves q, k, v, output and its fp32 log-sum-exp b x heads x s; backward dq/dk/dv, "
    "dq_accum, softmax_d and, for GQA, expanded dK/dV), the softmax backward's CUDA temporary "
    "(tmp = grad * output, SoftMax.cu softmax_backward_cuda_out), CUDA autocast's fp32 op lists given to the "
    "CPU's autocast (pow, exp, layer_norm, softmax, sum, ...: validation/core/autocast.py), foreach AdamW/SGD, host-resident "
    "scalars (AdamW step counters, torch.tensor constants) not counted, transformers' "
    "packed-sequence check answered as for real arange position ids. Step 2 is measured "
    "(optimizer states exist; grads set to None by zero_grad). The model outputs (logits) are "
    "dropped before backward, as Trainer.compute_loss returns the loss alone. Categories: "
    "parameters, gradients (param.grad), optimizer_states (optimizer.state tensors), "
    "activations (everything else alive: saved tensors, temporaries, autocast weight copies, "
    "the input batch and model buffers). Validated byte for byte against real CPU runs of "
    "tiny models (tests/test_harness.py). Hybrid models: the CUDA-only kernels transformers calls when their "
    "packages are installed are emulated as autograd Functions that allocate what the kernels' Python wrappers "
    "allocate and save what their ctx.save_for_backward saves (validation/hybrid/kernels.py): causal-conv1d's "
    "CausalConv1dFn, flash-linear-attention's ChunkGatedDeltaRuleFunction, mamba-ssm's "
    "MambaSplitConv1dScanCombinedFn and Mamba-1's SelectiveScanFn (validation/hybrid/mamba1.py); on real CPU runs they give transformers' torch fallbacks' values "
    "(tests/test_harness_hybrid.py). Vision-language models (validation/vlm/vision.py): images through the vision "
    "tower, its data-dependent inputs (window index, sequence bounds) precomputed by transformers' vision_utils on "
    "real tensors, its attention (and Gemma 3's decoder) on flash_attention_2, emulated with the allocations of "
    "flash-attn's varlen and dense kernels, or in a -sdpavision case Qwen2.5-VL's tower on SDPA as transformers runs "
    "it without flash-attn (one emulated FlashAttention-2 call per window or image); fake equals real on tiny models "
    "(tests/test_harness_vision.py). Liger-Kernel (-liger cases, validation/hf/liger.py): the model patched as the "
    "Trainer's use_liger_kernel patches it, liger-kernel's Python wrappers allocating as they do and its Triton "
    "launches stubbed; the wrappers' device branches answered as on an H100 (no fake-equals-real check: Triton "
    "kernels do not run on a CPU)."
)

HARNESS = Harness(
    name="hf", title="Hugging Face transformers", order=(0, 0), method=METHOD,
    distributions=("torch", "transformers"), top_level=True, run_versions="cases:run_versions",
    report="report:report", trace="step:traced_step", explain_top=40)
