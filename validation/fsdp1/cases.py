"""The FSDP1 cases (HF Trainer + Accelerate's FSDP1 plugin), and each one's configuration in the
contract's JSON format (/work/shared/CONTRACT.md: `training.framework` "fsdp1")."""

from __future__ import annotations

from ..hf.models import MODELS
from .step import Run

ALL_SEVEN = ["q", "k", "v", "o", "gate", "up", "down"]


def case_id(run: Run) -> str:
    kind = f"lora-r{run.lora_rank}-all7" if run.lora_rank else "full"
    recompute = "recompute" if run.recompute == "full" else "norecompute"
    accumulate = f"-ga{run.accumulation}-nosync" if run.accumulation > 1 else ""
    return f"fsdp1-{run.model}-{kind}-w{run.world}-{recompute}-s{run.seq_len}-b{run.micro_batch_size}{accumulate}"


def _runs() -> list[Run]:
    return [
        Run("llama-3.1-8b", 8, 4096, recompute="full"),
        Run("llama-3.1-8b", 8, 4096, recompute="full", accumulation=2),
        Run("llama-3.1-8b", 8, 2048),
        Run("llama-3.1-8b", 8, 4096, recompute="full", lora_rank=16),
        Run("qwen3-8b", 8, 4096, recompute="full"),
        Run("llama-3.2-1b", 4, 2048, accumulation=4),
        Run("qwen2.5-7b", 8, 4096, recompute="full", lora_rank=16, accumulation=2),
    ]


CASES: dict[str, Run] = {case_id(r): r for r in _runs()}


def contract_config(run: Run) -> dict:
    training = {
        "mode": "training", "framework": "fsdp1", "seq_len": run.seq_len, "micro_batch_size": run.micro_batch_size,
        "global_batch_size": run.micro_batch_size * run.world * run.accumulation,
        # FSDP1 MixedPrecision(param_dtype=bf16): bf16 gathered copies over fp32 sharded FlatParameters (the
        # master copy), fp32 sharded gradients (the FlatParameter's dtype), fp32 AdamW states
        "param_dtype": "bf16", "grad_dtype": "fp32", "master_weights": True, "optimizer_dtype": "fp32",
        "compute_dtype": "bf16", "optimizer": "adamw", "recompute": run.recompute, "attention": "flash",
        "dropout": 0.0, "loss": "standard",
    }
    if run.lora_rank:
        training["adapter"] = {"method": "lora", "rank": run.lora_rank, "alpha": 2 * run.lora_rank,
                               "target_modules": ALL_SEVEN, "dropout": 0.0}
    return {"model": MODELS[run.model].architecture(), "training": training,
            "parallel": {"tp": 1, "pp": 1, "dp": run.world}, "hardware": {"gpu": "h100-80"}}


def describe(run: Run) -> str:
    kind = (f"LoRA rank {run.lora_rank} on q, k, v, o, gate, up, down (adapters inside their layer's FlatParameter)"
            if run.lora_rank else "full fine-tuning")
    recompute = "gradient checkpointing (non-reentrant, every layer)" if run.recompute == "full" else \
        "no gradient checkpointing"
    accumulate = (f", {run.accumulation} micro-batches per step, all but the last under no_sync()"
                  if run.accumulation > 1 else "")
    return (f"{run.model}, {kind}, PyTorch FSDP1 FULL_SHARD over {run.world} ranks (rank 0 measured) as the HF "
            f"Trainer with Accelerate wraps it: a unit per decoder layer, MixedPrecision(bf16, bf16, bf16), "
            f"use_orig_params, limit_all_gathers, BACKWARD_PRE; bf16 autocast, fused AdamW, grad-norm clipping, "
            f"{recompute}, SDPA (FlashAttention-2), seq {run.seq_len}, micro-batch {run.micro_batch_size}{accumulate}")
