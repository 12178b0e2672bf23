"""The FSDP2 cases (HF Trainer + Accelerate's FSDP plugin with `fsdp_version: 2`), and each one's
configuration in the contract's JSON format (/work/shared/CONTRACT.md: `training.framework` "hf_fsdp2")."""

from __future__ import annotations

from ..hf.models import MODELS
from .step import Run

ALL_SEVEN = ["q", "k", "v", "o", "gate", "up", "down"]


def case_id(run: Run) -> str:
    kind = f"lora-r{run.lora_rank}-all7" if run.lora_rank else "full"
    recompute = "recompute" if run.recompute == "full" else "norecompute"
    accumulate = f"-ga{run.accumulation}-nosync" if run.accumulation > 1 else ""
    reshard = "" if run.reshard_after_forward else "-noreshard"
    attention = "" if run.attention == "sdpa" else "-" + run.attention
    return (f"hf_fsdp2-{run.model}-{kind}-w{run.world}-{recompute}-s{run.seq_len}-b{run.micro_batch_size}"
            f"{accumulate}{reshard}{attention}")


def _runs() -> list[Run]:
    return [
        Run("llama-3.1-8b", 8, 4096, recompute="full"),
        Run("llama-3.1-8b", 8, 4096, recompute="full", accumulation=2),
        Run("llama-3.1-8b", 8, 2048),
        Run("llama-3.1-8b", 8, 4096, recompute="full", lora_rank=16),
        Run("llama-3.1-8b", 8, 4096, recompute="full", lora_rank=16, accumulation=2),
        Run("qwen3-8b", 8, 4096, recompute="full"),
        # tied embeddings: the embedding shares the tail unit [final_norm, embed, lm_head]
        Run("llama-3.2-1b", 4, 2048),
        Run("llama-3.2-1b", 4, 2048, accumulation=4),
        Run("llama-3.2-1b", 4, 2048, reshard_after_forward=False),
        Run("llama-3.2-1b", 4, 2048, accumulation=2, reshard_after_forward=False),
        # transformers' eager attention: the softmax backward's CUDA temporary (core/emulation.py)
        Run("llama-3.2-1b", 4, 4096, attention="eager"),
        # short sequences: backward's last moment, the embedding's post-backward (the tied tail's), peaks
        Run("llama-3.1-8b", 8, 512, recompute="full"),
        Run("llama-3.2-1b", 4, 512, recompute="full"),
        Run("llama-3.1-8b", 8, 512, recompute="full", lora_rank=16),
        Run("qwen2.5-7b", 8, 1024, recompute="full", accumulation=2),
    ]


CASES: dict[str, Run] = {case_id(r): r for r in _runs()}


def contract_config(run: Run) -> dict:
    training = {
        "mode": "training", "framework": "hf_fsdp2", "seq_len": run.seq_len,
        "micro_batch_size": run.micro_batch_size,
        "global_batch_size": run.micro_batch_size * run.world * run.accumulation,
        # MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=bf16, output_dtype=bf16) over fp32 sharded
        # parameters (accelerate's upcast of the trainable ones: the master copy), fp32 sharded gradients (the
        # sharded parameter's dtype), fp32 AdamW states
        "param_dtype": "bf16", "grad_dtype": "fp32", "master_weights": True, "optimizer_dtype": "fp32",
        "compute_dtype": "bf16", "optimizer": "adamw", "recompute": run.recompute,
        "attention": "flash" if run.attention == "sdpa" else run.attention,
        "dropout": 0.0, "loss": "standard",
    }
    if run.lora_rank:
        training["adapter"] = {"method": "lora", "rank": run.lora_rank, "alpha": 2 * run.lora_rank,
                               "target_modules": ALL_SEVEN, "dropout": 0.0}
    # reshard_after_forward=False keeps each unit's bf16 parameters gathered from forward to backward: ZeRO-2
    parallel = {"tp": 1, "pp": 1, "dp": run.world, "zero_stage": 3 if run.reshard_after_forward else 2}
    return {"model": MODELS[run.model].architecture(), "training": training, "parallel": parallel,
            "hardware": {"gpu": "h100-80"}}


def describe(run: Run) -> str:
    kind = (f"LoRA rank {run.lora_rank} on q, k, v, o, gate, up, down (frozen bf16 base, fp32 adapters)"
            if run.lora_rank else "full fine-tuning (bf16 checkpoint, trainable parameters upcast to fp32)")
    recompute = "gradient checkpointing (non-reentrant, every layer)" if run.recompute == "full" else \
        "no gradient checkpointing"
    accumulate = (f", {run.accumulation} micro-batches per step, all but the last under no_sync "
                  f"(set_requires_gradient_sync(False))" if run.accumulation > 1 else "")
    reshard = "reshard_after_forward" if run.reshard_after_forward else "reshard_after_forward=False"
    attention = "SDPA (FlashAttention-2)" if run.attention == "sdpa" else "eager attention"
    return (f"{run.model}, {kind}, PyTorch FSDP2 over {run.world} ranks (rank 0 measured) as the HF Trainer with "
            f"Accelerate (fsdp_version 2) wraps it: fully_shard per decoder layer ({reshard}), the embedding, the "
            f"tail [final norm, lm_head] unsharded after forward, the root; MixedPrecisionPolicy(bf16, bf16, bf16), "
            f"no autocast; fused AdamW, grad-norm clipping, {recompute}, {attention}, seq {run.seq_len}, "
            f"micro-batch {run.micro_batch_size}{accumulate}")
