"""The Megatron-Core harness's declaration (validation/core/harness.py)."""

from __future__ import annotations

import warnings

from ..core.harness import Command, Harness

METHOD = (
    "fake-tensor CPU emulation of one rank: Megatron-Core's GPTModel (local layer spec; TE's fused "
    "attention and RMSNorm/LayerNorm replaced by stand-ins making TE's allocations, see "
    "validation/megatron/kernels.py; Megatron's jit_fuser functions, torch.compile kernels in "
    "production, allocate only their outputs, see validation/megatron/fused.py) for this rank's "
    "pipeline stage, wrapped in Megatron's DDP (fp32 grad buffer) and optimizer (distributed "
    "where stated), runs under torch FakeTensorMode with torch's fake process group playing a "
    "world of tp x cp x dp x pp ranks. A TorchDispatchMode registers every storage when created "
    "and freed (512-byte rounding), and the temporary CUDA's softmax backward makes (tmp = grad * output, "
    "SoftMax.cu softmax_backward_cuda_out), which the CPU kernel does not. One micro-batch: forward (the "
    "previous stage's hidden states received and kept; non-last "
    "stages' output pseudo-freed after sending) and backward (from the loss, or from a received "
    "output gradient). Step 2 is measured (step 1 made the optimizer states). Categories: "
    "parameters (the model's bf16 parameters / param buffer), gradients (DDP's fp32 main_grad "
    "buffers), optimizer_states (fp32 main parameters and Adam moments), activations "
    "(everything else). MoE runs use drop-and-pad to the capacity factor (static shapes). "
    "Validated byte for byte against real CPU runs of tiny models (tests/test_harness_megatron.py)."
)


def quiet(argv: list[str]) -> None:
    """Megatron-Core warns at import that Apex and Transformer Engine are absent: the harness
    emulates what it needs of them (kernels.py)."""
    warnings.filterwarnings("ignore", message=".*(Apex|Transformer Engine).*")


HARNESS = Harness(
    name="megatron", title="Megatron-Core", order=(2, 4), method=METHOD, distributions=("megatron-core", "torch"),
    measure="harness:measure", fields="cases:record_fields",
    counts=(("step_measured", 2), ("micro_batches_measured", 1)),
    report="report:report", prepare="plugin:quiet",
    commands=(Command("schedules", "run each Megatron-Core release's interleaved-schedule code over every layout "
                                   "into tests/data/measured/schedules/", "schedules:write"),))
