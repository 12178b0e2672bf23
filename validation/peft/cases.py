"""The measured LoRA / QLoRA cases, and each one's configuration in the contract's JSON format
(/work/shared/CONTRACT.md, with the `training.adapter` object of its Additions)."""

from __future__ import annotations

from ..hf.models import MODELS
from .build import ALL_SEVEN, LoraRun

DEFAULT_BNB = LoraRun.__dataclass_fields__["bnb_version"].default

QV = ("q", "v")
QKVO = ("q", "k", "v", "o")
MLP = ("gate", "up", "down")


def targets_label(targets) -> str:
    if targets == "all-linear":
        return "alllinear"
    return "all7" if tuple(targets) == ALL_SEVEN else "".join(targets)


def method_of(run: LoraRun) -> str:
    return "dora" if run.dora else "qlora" if run.base == "nf4" else "lora"


def case_id(run: LoraRun) -> str:
    method = method_of(run)
    recompute = "recompute" if run.recompute == "full" else "norecompute"
    save = "-save-embed-head" if run.save else ""
    quant, prepared = "", "-prepared" if run.prepare else ""
    eager = "-eager" if run.attention == "eager" else ""
    eager += f"-attndrop{round(run.attention_dropout * 100):02d}" if run.attention_dropout else ""
    if run.base == "nf4":
        quant = (f"-bnb{run.bnb_version}" if run.bnb_version != DEFAULT_BNB else "") + \
            ("" if run.double_quant else "-nodq")
    return (f"{run.model}-{method}-r{run.rank}-{targets_label(run.targets)}-{recompute}-"
            f"drop{round(run.dropout * 100):02d}-s{run.seq_len}-b{run.micro_batch_size}{save}{quant}{prepared}{eager}")


def _runs() -> list[LoraRun]:
    R = LoraRun
    return [
        # Llama-3.1-8B: rank, targets, recompute, dropout, NF4 base, trainable embeddings / head
        R("llama-3.1-8b", 4096, rank=16, alpha=32, targets=QV),
        R("llama-3.1-8b", 4096, rank=16, alpha=32, targets=ALL_SEVEN, recompute="full"),
        R("llama-3.1-8b", 2048, rank=16, alpha=32, targets=ALL_SEVEN),
        R("llama-3.1-8b", 8192, rank=64, alpha=128, targets="all-linear", dropout=0.05, recompute="full"),
        R("llama-3.1-8b", 2048, 2, rank=8, alpha=16, targets=QV, dropout=0.05),
        R("llama-3.1-8b", 4096, rank=16, alpha=32, targets=ALL_SEVEN, recompute="full", base="nf4"),
        R("llama-3.1-8b", 2048, rank=64, alpha=16, targets="all-linear", base="nf4"),
        R("llama-3.1-8b", 4096, rank=16, alpha=32, targets=QV, recompute="full", save=("lm_head", "embed_tokens")),
        # peft's prepare_model_for_kbit_training: fp32 embeddings, norms and head, so an fp32 residual
        # stream, fp32 logits and fp32 attention (the math backend with grouped KV heads)
        R("llama-3.1-8b", 4096, rank=16, alpha=32, targets=ALL_SEVEN, recompute="full", base="nf4", prepare=True),
        R("llama-3.1-8b", 2048, rank=64, alpha=16, targets="all-linear", base="nf4", prepare=True),
        # Qwen3-8B (q/k norms)
        R("qwen3-8b", 4096, rank=16, alpha=32, targets=ALL_SEVEN, recompute="full"),
        R("qwen3-8b", 4096, rank=16, alpha=32, targets=ALL_SEVEN, dropout=0.05, recompute="full", base="nf4"),
        R("qwen3-8b", 2048, rank=8, alpha=16, targets=QV),
        # Qwen2.5-7B (qkv biases)
        R("qwen2.5-7b", 8192, rank=16, alpha=32, targets="all-linear", recompute="full"),
        R("qwen2.5-7b", 4096, 2, rank=64, alpha=128, targets=ALL_SEVEN, recompute="full", base="nf4"),
        R("qwen2.5-7b", 4096, rank=16, alpha=32, targets=QV, dropout=0.05),
        # bitsandbytes through 0.43.1: MatMul4Bit keeps its input for backward (validation/peft/bnb.py);
        # NF4 without double quantization (bnb_4bit_use_double_quant=False)
        R("llama-3.1-8b", 2048, rank=64, alpha=16, targets="all-linear", base="nf4", bnb_version="0.43.1"),
        R("llama-3.1-8b", 4096, rank=16, alpha=32, targets=ALL_SEVEN, recompute="full", base="nf4",
          bnb_version="0.43.1"),
        R("qwen2.5-7b", 2048, rank=16, alpha=32, targets=QV, base="nf4", bnb_version="0.43.1"),
        R("qwen3-8b", 4096, rank=16, alpha=32, targets=ALL_SEVEN, recompute="full", base="nf4", double_quant=False),
        # Mixture of experts (bf16 base: bitsandbytes quantizes nn.Linear only, and transformers 5
        # fuses the experts into 3-D parameters). On transformers 5, peft's "all-linear" adds
        # the router and the fused experts (peft/utils/transformers_weight_conversion.py,
        # `_resolve_string_target_modules`), the experts' gate_up with rank 2r.
        R("mixtral-8x7b", 4096, rank=16, alpha=32, targets=QKVO, recompute="full"),
        R("qwen3-30b-a3b", 4096, rank=16, alpha=32, targets="all-linear", recompute="full"),
        R("qwen3-30b-a3b", 2048, rank=8, alpha=16, targets=QV),
        # DoRA (peft use_dora): the weight norm of W + BA in the forward, a magnitude per output
        R("llama-3.1-8b", 2048, rank=16, alpha=32, targets=QV, dora=True),
        R("llama-3.1-8b", 4096, rank=16, alpha=32, targets=ALL_SEVEN, recompute="full", dora=True),
        R("qwen3-8b", 2048, rank=8, alpha=16, targets=QV, dropout=0.05, dora=True),
        # eager attention without recompute at a long sequence: the backward peaks in the last layer's softmax
        # backward (as the HF record llama-3.2-1b-bf16-adamw-norecompute-eager-s8192-b1 does)
        R("llama-3.2-1b", 8192, rank=16, alpha=32, targets=QV, attention="eager"),
        R("llama-3.2-1b", 8192, rank=16, alpha=32, targets=ALL_SEVEN, attention="eager"),
        # ... with k or q and k frozen: the first layer's QK^T keeps only the input the other's gradient reads
        R("llama-3.2-1b", 8192, rank=16, alpha=32, targets=("k", "v"), attention="eager"),
        R("llama-3.2-1b", 8192, rank=16, alpha=32, targets=("v",), attention="eager"),
        # ... over bitsandbytes 0.43.1's 4-bit layers, whose MatMul4Bit holds its input in ctx.tensors (not
        # save_for_backward), which autograd's release of a node's saved tensors does not drop
        R("llama-3.2-1b", 8192, rank=16, alpha=32, targets=ALL_SEVEN, base="nf4", bnb_version="0.43.1",
          attention="eager"),
        # MLP-only adapters: the first layer's attention (input, weights frozen) keeps nothing; beside
        # them attention-only adapters, with and without recompute
        R("llama-3.2-1b", 4096, rank=16, alpha=32, targets=MLP),
        R("llama-3.2-1b", 4096, rank=16, alpha=32, targets=MLP, recompute="full"),
        R("llama-3.2-1b", 4096, rank=16, alpha=32, targets=QKVO),
        R("llama-3.2-1b", 4096, rank=16, alpha=32, targets=QKVO, recompute="full"),
        R("llama-3.2-1b", 2048, rank=16, alpha=32, targets=MLP, attention="eager"),
        # eager attention with the config's attention_dropout: softmax -> .to(dtype) -> dropout, the 16-bit copy freed
        R("llama-3.2-1b", 2048, rank=16, alpha=32, targets=QV, attention="eager", attention_dropout=0.1),
        R("llama-3.2-1b", 2048, rank=16, alpha=32, targets=MLP, attention="eager", attention_dropout=0.1),
        # ... with recompute, and without dropout: the backward peaks in a recomputed layer's softmax backward
        R("llama-3.2-1b", 4096, rank=16, alpha=32, targets=QV, attention="eager", recompute="full"),
        R("llama-3.2-1b", 4096, rank=16, alpha=32, targets=QV, attention="eager", attention_dropout=0.1,
          recompute="full"),
        # ... o or down alone: the first layer keeps nothing before it
        R("llama-3.2-1b", 2048, rank=16, alpha=32, targets=("o",), attention="eager"),
        R("llama-3.2-1b", 4096, rank=16, alpha=32, targets=("down",)),
        # one fused q, k, v linear (Architecture.fused_qkv): peft's default targets for gpt2 (c_attn, a Conv1D) and
        # falcon (query_key_value) adapt it once, one lora_A and one lora_B (build.py FUSED_QKV); Falcon eager, as
        # in validation/hf (its SDPA path's 4-D mask is not emulated)
        R("gpt2-medium-8layers", 1024, 4, rank=16, alpha=32, targets=QV),
        R("gpt2-medium-8layers", 1024, 8, rank=16, alpha=32, targets=QV, recompute="full"),
        R("falcon-7b-8layers", 2048, rank=16, alpha=32, targets=QV, attention="eager"),
    ]


CASES: dict[str, LoraRun] = {case_id(r): r for r in _runs()}


def adapter(run: LoraRun) -> dict:
    out = {
        "method": method_of(run), "rank": run.rank, "alpha": run.alpha,
        "target_modules": run.targets if run.targets == "all-linear" else list(run.targets),
        "dropout": run.dropout, "trainable_embeddings": bool(run.save), "base_dtype": run.base,
        **({"prepare_kbit": True} if run.prepare else {}),
    }
    if run.base == "nf4" and run.bnb_version != DEFAULT_BNB:
        out["bitsandbytes_version"] = run.bnb_version
    if run.base == "nf4" and not run.double_quant:
        out["double_quant"] = False
    return out


def contract_config(run: LoraRun) -> dict:
    return {
        "model": MODELS[run.model].architecture(),
        "training": {
            "mode": "training", "framework": "hf", "seq_len": run.seq_len,
            "micro_batch_size": run.micro_batch_size,
            # the frozen base's dtype; peft keeps the adapters of a bf16 base in fp32
            # (get_peft_model's autocast_adapter_dtype=True), so their gradients and AdamW
            # states are fp32 too (torch keeps both in the parameter's dtype); no master copy.
            # Trainable copies of the embeddings / LM head (modules_to_save) stay bf16.
            "param_dtype": "bf16", "grad_dtype": "fp32", "master_weights": False,
            "optimizer_dtype": "fp32", "compute_dtype": "bf16", "optimizer": "adamw",
            "recompute": run.recompute, "attention": "flash" if run.attention == "sdpa" else "eager",
            "dropout": run.attention_dropout, "loss": "standard",
            # the step calls the model directly, without Accelerate's autocast (estimator/memory/trainer_loop.py)
            "training_loop": "plain",
            "adapter": adapter(run),
        },
        "parallel": {"tp": 1, "pp": 1, "dp": 1},
        "hardware": {"gpu": "h100-80"},
    }


def describe(run: LoraRun) -> str:
    method = (f"QLoRA (frozen base linears in bitsandbytes {run.bnb_version} NF4 Linear4bit, emulated, "
              f"{'double-quantized' if run.double_quant else 'fp32'} scales)" if run.base == "nf4"
              else "LoRA (frozen bf16 base)")
    targets = "all linear layers (peft 'all-linear')" if run.targets == "all-linear" else ", ".join(run.targets)
    recompute = "gradient checkpointing (non-reentrant, every layer)" if run.recompute == "full" \
        else "no gradient checkpointing"
    save = "; embeddings and LM head trainable (modules_to_save)" if run.save else ""
    attention = "SDPA (FlashAttention-2)" if run.attention == "sdpa" else "eager attention"
    if run.attention_dropout:
        attention += f" with attention_dropout {run.attention_dropout}"
    if run.prepare:
        save += "; peft prepare_model_for_kbit_training (every non-4-bit parameter cast to fp32)"
    return (f"{run.model}, peft {method}, rank {run.rank}, alpha {run.alpha}, targets {targets}, "
            f"dropout {run.dropout}, {recompute}, fp32 adapters, fused AdamW on trainable parameters, "
            f"grad-norm clipping, {attention}, seq {run.seq_len}, micro-batch "
            f"{run.micro_batch_size}{save}")
