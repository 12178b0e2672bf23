"""The measured torchtune full fine-tuning cases, and each one's configuration in the contract's
JSON format (/work/shared/CONTRACT.md, with the savers of its Additions)."""

from __future__ import annotations

from .build import LORA, TuneRun
from .models import TUNE_MODELS


def case_id(run: TuneRun) -> str:
    parts = [run.model, run.method, "ac" if run.activation_checkpointing else "noac"]
    if run.activation_offloading:
        parts.append("offload")
    parts += ["chunkedce" if run.loss == "chunked" else "ce", run.optimizer]
    if run.optimizer_in_bwd:
        parts.append("inbwd")
    world = [f"w{run.world}"] if run.world > 1 else []
    return "-".join(parts + [f"s{run.seq_len}", f"b{run.batch_size}"] + world)


def _runs() -> list[TuneRun]:
    R = TuneRun
    return [
        # Llama-3.1-8B: each saver on and off
        R("llama-3.1-8b", 4096, activation_checkpointing=True),
        R("llama-3.1-8b", 4096),
        R("llama-3.1-8b", 4096, activation_checkpointing=True, loss="chunked"),
        R("llama-3.1-8b", 4096, 2, activation_checkpointing=True, loss="chunked", optimizer_in_bwd=True),
        # recipes/configs/llama3_1/8B_full_single_device.yaml with offloading on, its paged
        # 8-bit bitsandbytes optimizer replaced by fused AdamW (bitsandbytes needs CUDA)
        R("llama-3.1-8b", 4096, 2, activation_checkpointing=True, activation_offloading=True,
          loss="chunked", optimizer_in_bwd=True),
        R("llama-3.1-8b", 8192, activation_offloading=True, loss="chunked"),
        R("llama-3.1-8b", 4096, activation_checkpointing=True, loss="chunked", optimizer="adamw8bit"),
        # Qwen2.5-7B (qkv biases, its RoPE cache twice Llama's)
        R("qwen2.5-7b", 4096, 2, activation_checkpointing=True, loss="chunked"),
        R("qwen2.5-7b", 4096, optimizer_in_bwd=True),
        R("qwen2.5-7b", 8192, activation_checkpointing=True, activation_offloading=True, loss="chunked"),
        # Llama-3.2-3B (tied embeddings)
        R("llama-3.2-3b", 4096, 2, loss="chunked"),
        R("llama-3.2-3b", 8192, activation_checkpointing=True, activation_offloading=True,
          loss="chunked", optimizer_in_bwd=True),
        R("llama-3.2-3b", 4096, activation_offloading=True, optimizer="adamw8bit"),
        # a short sequence: backward's peak is the chunked head's, the sum of two chunks' [V, h] weight gradients
        # beside seven chunks' logits gradients (estimator/memory/activations/chunked_head.py)
        R("llama-3.2-3b", 2048, activation_checkpointing=True, loss="chunked", optimizer_in_bwd=True),
        # torchtune's README table, row "+ 8-bit AdamW" (1814feb1, eager here: the harness does not compile)
        R("llama-3.2-3b", 4096, 2, activation_checkpointing=True, activation_offloading=True, loss="chunked",
          optimizer="adamw8bit", optimizer_in_bwd=True),
        # lora_finetune_single_device: recipes/configs/llama3_1/8B_lora_single_device.yaml and
        # 8B_qlora_single_device.yaml (rank 8 on q, v, output_proj and the MLP; batch 2; AC;
        # chunked CE; fused AdamW), then savers switched
        R("llama-3.1-8b", 4096, 2, activation_checkpointing=True, loss="chunked", method="lora"),
        R("llama-3.1-8b", 4096, 2, activation_checkpointing=True, loss="chunked", method="qlora"),
        R("llama-3.1-8b", 4096, activation_offloading=True, loss="chunked", method="lora"),
        R("qwen2.5-7b", 8192, activation_checkpointing=True, loss="chunked", method="lora"),
        R("llama-3.2-3b", 4096, loss="chunked", method="qlora"),
        # lora_finetune_distributed (FSDP2, rank 0 of a fake process group): recipes/configs/llama3_1/
        # 8B_lora.yaml (rank 8 on q, v, output_proj and the MLP; batch 2; no AC; chunked CE) on 8 GPUs, with
        # AC, and QLoRA (quantize_base: NF4 shards, gathered as NF4) on 4 and 2
        R("llama-3.1-8b", 4096, 2, loss="chunked", method="lora", world=8),
        R("llama-3.1-8b", 4096, 2, activation_checkpointing=True, loss="chunked", method="lora", world=8),
        R("llama-3.1-8b", 4096, 2, activation_checkpointing=True, loss="chunked", method="qlora", world=4),
        R("qwen2.5-7b", 4096, 2, activation_checkpointing=True, loss="chunked", method="qlora", world=2),
        R("llama-3.2-3b", 8192, activation_checkpointing=True, loss="chunked", method="lora", world=4),
    ]


CASES: dict[str, TuneRun] = {case_id(r): r for r in _runs()}


def contract_config(run: TuneRun) -> dict:
    training = {
        # torchtune's single-device recipe in pure bf16 (dtype: bf16): gradients and optimizer
        # states in the parameters' dtype, no master copy. The Additions fields appear only when on.
        "mode": "training", "framework": "torchtune", "seq_len": run.seq_len,
        "micro_batch_size": run.batch_size, "param_dtype": "bf16", "grad_dtype": "bf16",
        "master_weights": False, "optimizer_dtype": "bf16", "compute_dtype": "bf16",
        "optimizer": "adam8bit" if run.optimizer == "adamw8bit" else "adamw",
        "recompute": "full" if run.activation_checkpointing else "none",
        "attention": "flash", "dropout": 0.0, "loss": run.loss,
    }
    if run.method != "full":
        # torchtune's LoRALinear keeps the adapters in the model's dtype (bf16)
        training["adapter"] = {
            "method": run.method, "rank": LORA["lora_rank"], "alpha": LORA["lora_alpha"],
            "target_modules": ["q", "v", "o", "gate", "up", "down"], "dropout": LORA["lora_dropout"],
            "trainable_embeddings": False, "base_dtype": "nf4" if run.method == "qlora" else "bf16"}
    if run.optimizer_in_bwd:
        training["optimizer_in_backward"] = True
    if run.activation_offloading:
        training["offload_activations"] = True
    # the distributed recipe: FSDP2 full sharding over the data-parallel ranks (reshard_after_forward)
    parallel = {"tp": 1, "pp": 1, "dp": run.world} | ({"zero_stage": 3} if run.world > 1 else {})
    return {"model": TUNE_MODELS[run.model].architecture(), "training": training,
            "parallel": parallel, "hardware": {"gpu": "h100-80"}}


def describe(run: TuneRun) -> str:
    savers = [name for on, name in [
        (run.activation_checkpointing, "activation checkpointing (every TransformerSelfAttentionLayer)"),
        (run.activation_offloading, "activation offloading (OffloadActivations, streams)"),
        (run.loss == "chunked", "chunked cross-entropy (CEWithChunkedOutputLoss, 8 chunks)"),
        (run.optimizer_in_bwd, "optimizer in backward"),
    ] if on]
    optimizer = "torchao AdamW8bit (blocks of 256)" if run.optimizer == "adamw8bit" else "torch AdamW (fused)"
    lora_recipe = "lora_finetune_distributed" if run.world > 1 else "lora_finetune_single_device"
    recipe = "full_finetune_single_device" if run.method == "full" else (
        f"{lora_recipe} ({'QLoRA, NF4 base' if run.method == 'qlora' else 'LoRA, bf16 base'}, "
        "rank 8, alpha 16, on q, v, output_proj, w1, w2, w3; bf16 adapters)")
    if run.world > 1:
        recipe += f", FSDP2 over {run.world} GPUs (rank 0 of a fake process group, reshard after forward)"
    return (f"{run.model}, torchtune {recipe} step, pure bf16, {optimizer}, "
            f"{', '.join(savers) or 'no memory savers'}, SDPA (FlashAttention-2), seq {run.seq_len}, "
            f"batch {run.batch_size}")
