"""The hybrid cases (HF Trainer step, pure bf16, AdamW, SDPA), and each one's configuration in the
contract's JSON format, the architecture with issue 28's fields (validation/hybrid/models.py)."""

from __future__ import annotations

from ..cases import case_id
from ..step import Run
from .models import MODELS


def _runs() -> list[Run]:
    # Long sequences without recompute peak in the forward or backward (activations), the others at the
    # optimizer step (foreach AdamW's copy of every state) with the activations of their phases recorded
    return [
        Run("qwen3-next-80b-a3b", 4096), Run("qwen3-next-80b-a3b", 8192, recompute="full"),
        Run("qwen3-next-80b-a3b", 2048, 2), Run("qwen3-next-80b-a3b", 32768),
        Run("nemotron-h-8b", 4096), Run("nemotron-h-8b", 8192, recompute="full"),
        Run("nemotron-h-8b", 2048, 2), Run("nemotron-h-8b", 16384, recompute="full"), Run("nemotron-h-8b", 8192),
    ]


CASES: dict[str, Run] = {case_id(r): r for r in _runs()}


def contract_config(run: Run) -> dict:
    return {
        "model": MODELS[run.model].architecture(),
        "training": {
            "mode": "training", "framework": "hf", "seq_len": run.seq_len,
            "micro_batch_size": run.micro_batch_size, "param_dtype": "bf16", "grad_dtype": "bf16",
            "master_weights": False, "optimizer_dtype": "bf16", "compute_dtype": "bf16",
            "optimizer": run.optimizer, "recompute": run.recompute, "attention": "flash",
            "dropout": 0.0, "loss": "standard",
        },
        "parallel": {"tp": 1, "pp": 1, "dp": 1},
        "hardware": {"gpu": "h100-80"},
    }


KERNELS = {
    "qwen3-next-80b-a3b": "Gated DeltaNet layers through causal-conv1d's causal_conv1d_fn and flash-linear-attention's "
                          "chunk_gated_delta_rule (emulated), gated attention every 4th layer",
    "nemotron-h-8b": "Mamba-2 blocks through mamba-ssm's mamba_split_conv1d_scan_combined (emulated)",
}


def describe(run: Run) -> str:
    recompute = "full recompute (non-reentrant checkpoint per layer)" if run.recompute == "full" \
        else "no recompute"
    return (f"{run.model}, HF transformers training step: pure bf16 (bf16 parameters, grads, optimizer states), "
            f"AdamW (foreach), {recompute}, SDPA (FlashAttention-2), {KERNELS[run.model]}, seq {run.seq_len}, "
            f"micro-batch {run.micro_batch_size}")
