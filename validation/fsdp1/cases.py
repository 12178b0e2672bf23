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
    strategy = "" if run.strategy == "FULL_SHARD" else "-" + run.strategy.lower().replace("_", "")
    strategy += f"-g{run.shard_group}" if run.strategy == "HYBRID_SHARD" else ""
    attention = "" if run.attention == "sdpa" else "-" + run.attention
    return (f"fsdp1-{run.model}-{kind}-w{run.world}-{recompute}-s{run.seq_len}-b{run.micro_batch_size}{accumulate}"
            f"{strategy}{attention}")


def _runs() -> list[Run]:
    return [
        Run("llama-3.1-8b", 8, 4096, recompute="full"),
        Run("llama-3.1-8b", 8, 4096, recompute="full", accumulation=2),
        Run("llama-3.1-8b", 8, 2048),
        Run("llama-3.1-8b", 8, 4096, recompute="full", lora_rank=16),
        Run("qwen3-8b", 8, 4096, recompute="full"),
        Run("llama-3.2-1b", 4, 2048, accumulation=4),
        Run("qwen2.5-7b", 8, 4096, recompute="full", lora_rank=16, accumulation=2),
        # the other sharding strategies (validation/fsdp1/strategies.py)
        Run("llama-3.1-8b", 8, 4096, recompute="full", strategy="SHARD_GRAD_OP"),
        Run("llama-3.1-8b", 8, 2048, strategy="SHARD_GRAD_OP"),
        Run("llama-3.1-8b", 8, 4096, recompute="full", lora_rank=16, strategy="SHARD_GRAD_OP"),
        Run("llama-3.2-1b", 4, 2048, accumulation=2, strategy="SHARD_GRAD_OP"),
        Run("llama-3.1-8b", 16, 4096, recompute="full", strategy="HYBRID_SHARD", shard_group=8),
        Run("llama-3.1-8b", 32, 4096, recompute="full", lora_rank=16, strategy="HYBRID_SHARD", shard_group=8),
        Run("llama-3.2-1b", 4, 2048, strategy="NO_SHARD"),
        # no_sync accumulation under NO_SHARD on an untied model: with tied embeddings torch 2.13 raises (the
        # shared weight's bf16 gradient assigned to its fp32 view, _flat_param.py `_use_sharded_grad_views`)
        Run("llama-3.1-8b", 8, 2048, recompute="full", accumulation=2, strategy="NO_SHARD"),
        Run("llama-3.1-8b", 8, 4096, recompute="full", lora_rank=16, strategy="NO_SHARD"),
        # transformers' eager attention without recompute: the last layer's softmax backward (CUDA's temporary
        # emulated) beside the gradients its unit has made (estimator/memory/softmax_backward.py)
        Run("llama-3.2-1b", 4, 8192, attention="eager"),
        Run("llama-3.2-1b", 4, 4096, attention="eager"),
        Run("llama-3.2-1b", 4, 8192, strategy="SHARD_GRAD_OP", attention="eager"),
        Run("llama-3.2-1b", 4, 8192, strategy="NO_SHARD", attention="eager"),
    ]


CASES: dict[str, Run] = {case_id(r): r for r in _runs()}


def contract_config(run: Run) -> dict:
    training = {
        "mode": "training", "framework": "fsdp1", "seq_len": run.seq_len, "micro_batch_size": run.micro_batch_size,
        "global_batch_size": run.micro_batch_size * run.world * run.accumulation,
        # FSDP1 MixedPrecision(param_dtype=bf16): bf16 gathered copies over fp32 sharded FlatParameters (the
        # master copy), fp32 sharded gradients (the FlatParameter's dtype), fp32 AdamW states
        "param_dtype": "bf16", "grad_dtype": "fp32", "master_weights": True, "optimizer_dtype": "fp32",
        "compute_dtype": "bf16", "optimizer": "adamw", "recompute": run.recompute,
        "attention": "flash" if run.attention == "sdpa" else run.attention,
        "dropout": 0.0, "loss": "standard",
    }
    if run.lora_rank:
        training["adapter"] = {"method": "lora", "rank": run.lora_rank, "alpha": 2 * run.lora_rank,
                               "target_modules": ALL_SEVEN, "dropout": 0.0}
    parallel = {"tp": 1, "pp": 1, "dp": run.world}
    if run.strategy != "FULL_SHARD":  # Accelerate's fsdp_sharding_strategy, and HYBRID_SHARD's shard group
        parallel["fsdp_sharding_strategy"] = run.strategy
        if run.strategy == "HYBRID_SHARD":
            parallel["fsdp_shard_group_size"] = run.shard_group
    return {"model": MODELS[run.model].architecture(), "training": training, "parallel": parallel,
            "hardware": {"gpu": "h100-80"}}


def describe(run: Run) -> str:
    kind = (f"LoRA rank {run.lora_rank} on q, k, v, o, gate, up, down (adapters inside their layer's FlatParameter)"
            if run.lora_rank else "full fine-tuning")
    recompute = "gradient checkpointing (non-reentrant, every layer)" if run.recompute == "full" else \
        "no gradient checkpointing"
    accumulate = (f", {run.accumulation} micro-batches per step, all but the last under no_sync()"
                  if run.accumulation > 1 else "")
    strategy = (f"HYBRID_SHARD (sharded over {run.shard_group} ranks, replicated {run.world // run.shard_group} times)"
                if run.strategy == "HYBRID_SHARD" else run.strategy)
    return (f"{run.model}, {kind}, PyTorch FSDP1 {strategy} over {run.world} ranks (rank 0 measured) as the HF "
            f"Trainer with Accelerate wraps it: a unit per decoder layer, MixedPrecision(bf16, bf16, bf16), "
            f"use_orig_params, limit_all_gathers, BACKWARD_PRE; bf16 autocast, fused AdamW, grad-norm clipping, "
            f"{recompute}, {'SDPA (FlashAttention-2)' if run.attention == 'sdpa' else 'eager attention'}, seq {run.seq_len}, micro-batch {run.micro_batch_size}{accumulate}")
