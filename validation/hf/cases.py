"""The measured cases, and each one's configuration in the contract's JSON format."""

from __future__ import annotations

from ..hybrid.models import HYBRID_RUNS, KERNELS
from ..llama4.models import KERNELS as LLAMA4_KERNELS, LLAMA4_RUNS
from ..vlm.models import KERNELS as VISION_KERNELS, SDPA_VISION, VISION_RUNS
from .dsa import DSA_RUNS, KERNELS as DSA_KERNELS
from .liger import RELEASE as LIGER_RELEASE
from .models import MODELS
from .step import Run


def case_id(run: Run) -> str:
    return (f"{run.model}-{run.recipe}-{run.optimizer.replace('_momentum', '')}-"
            f"{'recompute' if run.recompute == 'full' else 'norecompute'}-{run.attention}-"
            f"s{run.seq_len}-b{run.micro_batch_size}" + (f"-i{run.images}x{run.image_size}" if run.images else "")
            + ("-frozenvision" if run.freeze_vision else "")
            + ("-sdpavision" if run.vision_attention == "sdpa" else "") + ("-liger" if run.liger else "")
            + (f"-drop{round(run.dropout * 100):02d}" if run.dropout else ""))


def _runs() -> list[Run]:
    R = Run
    return [
        # Llama-3.1-8B: the full matrix of recipe x optimizer x recompute x attention
        R("llama-3.1-8b", 4096), R("llama-3.1-8b", 4096, recompute="full"),
        R("llama-3.1-8b", 2048, 2), R("llama-3.1-8b", 8192, recompute="full"),
        R("llama-3.1-8b", 8192), R("llama-3.1-8b", 4096, 2, recompute="full"),
        R("llama-3.1-8b", 2048, attention="eager"),
        R("llama-3.1-8b", 2048, recompute="full", attention="eager"),
        R("llama-3.1-8b", 4096, recipe="amp"), R("llama-3.1-8b", 4096, recipe="amp", recompute="full"),
        R("llama-3.1-8b", 2048, recipe="amp", attention="eager"),
        R("llama-3.1-8b", 4096, optimizer="sgd_momentum"),
        R("llama-3.1-8b", 4096, 2, recipe="amp", optimizer="sgd_momentum", recompute="full"),
        # pure bf16 without autocast from 256 tokens: the loss's fp32 upcast (transformers ForCausalLMLoss)
        # grows with s like the rest (tests/test_accuracy.py, the sequence sweep)
        R("llama-3.1-8b", 256), R("llama-3.1-8b", 1024),
        # Qwen3-8B (q/k norms)
        R("qwen3-8b", 4096), R("qwen3-8b", 8192, recompute="full"),
        R("qwen3-8b", 2048, recipe="amp"), R("qwen3-8b", 2048, attention="eager"),
        R("qwen3-8b", 4096, 2, optimizer="sgd_momentum", recompute="full"),
        # Qwen2.5-7B (qkv biases)
        R("qwen2.5-7b", 4096), R("qwen2.5-7b", 8192, 2, recompute="full"),
        R("qwen2.5-7b", 4096, recipe="amp", recompute="full"),
        R("qwen2.5-7b", 2048, 2, attention="eager"),
        # Gemma-2-9B: eager only (attention soft-capping), tied 256k vocabulary, 4 norms a layer
        R("gemma-2-9b", 2048, attention="eager"),
        R("gemma-2-9b", 4096, recompute="full", attention="eager"),
        R("gemma-2-9b", 2048, recipe="amp", recompute="full", attention="eager"),
        # Mixture of experts. Pure bf16 only: transformers runs the experts with
        # torch grouped_mm, whose kernel takes bf16 only, so fp32 expert weights (AMP) fail.
        R("mixtral-8x7b", 4096), R("mixtral-8x7b", 4096, recompute="full"),
        R("mixtral-8x7b", 8192, optimizer="sgd_momentum", recompute="full"),
        R("mixtral-8x7b", 2048, recompute="full", attention="eager"),
        R("qwen3-30b-a3b", 4096), R("qwen3-30b-a3b", 8192, recompute="full"),
        R("qwen3-30b-a3b", 2048, 2, recompute="full"),
        R("qwen3-30b-a3b", 2048, optimizer="sgd_momentum", attention="eager"),
        # Small models, also run on a real GPU (validation/gpu): fixed costs are a visible share here
        *SMALL_RUNS,
        # eager attention without recompute at long sequences: the last layer's softmax backward (its fp32
        # gradients and CUDA's temporary beside every kept activation) outgrows the loss's moment
        R("llama-3.2-1b", 8192, attention="eager"), R("qwen2.5-0.5b", 8192, attention="eager"),
        # Hybrid models (issue 28), their CUDA-only kernels emulated (validation/hybrid/kernels.py)
        *(Run(*args, **kw) for args, kw in HYBRID_RUNS),
        # Vision-language models (issue 28): images through the vision tower, their tokens in the sequence
        *(Run(*args, **kw) for args, kw in VISION_RUNS),
        # Llama 4 Scout's language model (issue 28): chunked and NoPE attention, every token through every expert
        *(Run(*args, **kw) for args, kw in LLAMA4_RUNS),
        # DeepSeek-V3.2's sparse attention (issue 28): the lightning indexer under no_grad, eager attention
        *(Run(*args, **kw) for args, kw in DSA_RUNS),
        # the Trainer's use_liger_kernel (issue 23): Liger's RMSNorm, SwiGLU, RoPE and fused linear cross-entropy
        *LIGER_RUNS,
        # the model config's residual and embedding dropouts (validation/hf/dropout.py), with and without them
        *DROPOUT_RUNS,
    ]


LIGER_RUNS = (
    Run("llama-3.1-8b", 4096, liger=True), Run("llama-3.1-8b", 2048, 2, recompute="full", liger=True),
    Run("qwen3-8b", 4096, liger=True), Run("qwen2.5-7b", 4096, recipe="amp", liger=True),
    # activations above the optimizer step's peak: long sequences, small models
    Run("llama-3.1-8b", 8192, 2, liger=True), Run("llama-3.2-1b", 8192, 2, liger=True),
    Run("qwen2.5-0.5b", 8192, 2, recipe="amp", liger=True),
)


DROPOUT_RUNS = (
    Run("phi-3-mini-8layers", 4096, 2), Run("phi-3-mini-8layers", 4096, 2, dropout=0.1),
    Run("phi-3-mini-8layers", 8192, 2, recompute="full", dropout=0.1),
    Run("phi-3-mini-8layers", 4096, 2, attention="eager", dropout=0.1),
    Run("phi-3-mini-8layers", 4096, recompute="full", attention="eager", dropout=0.1),
    Run("pythia-1.4b-8layers", 4096, 2), Run("pythia-1.4b-8layers", 4096, 2, dropout=0.1),
    Run("pythia-1.4b-8layers", 8192, 2, recompute="full", dropout=0.1),
    Run("pythia-1.4b-8layers", 2048, 2, recipe="amp", dropout=0.1),
    Run("gpt2-medium-8layers", 1024, 4), Run("gpt2-medium-8layers", 1024, 4, dropout=0.1),
    Run("gpt2-medium-8layers", 1024, 8, recompute="full", dropout=0.1),
    Run("gpt2-medium-8layers", 1024, 4, attention="eager", dropout=0.1),
    # under autocast the one c_attn (Conv1D's addmm) casts its input once (fused_qkv), and the eager softmax runs in
    # fp32 (autocast's fp32 list; Falcon's dtype=hidden_states.dtype, the fp32 residual stream)
    Run("gpt2-medium-8layers", 1024, 4, recipe="amp"),
    Run("gpt2-medium-8layers", 1024, 4, recipe="amp", attention="eager"),
    Run("starcoder2-3b-8layers", 4096, 2), Run("starcoder2-3b-8layers", 4096, 2, dropout=0.1),
    Run("starcoder2-3b-8layers", 8192, 2, recompute="full", dropout=0.1),
    Run("starcoder2-3b-8layers", 4096, recipe="amp", dropout=0.1),
    # Falcon's SDPA path passes its 4-D mask (modeling_falcon.py): Falcon-7B's 71 heads on one run SDPA's math
    # backend (validation/core/emulation.py `_masked_math_sdpa`, as the H200 ran it); eager, and flash-attn's kernel
    # (flash_attention_2, validation/hf/falcon.py)
    Run("falcon-7b-8layers", 2048), Run("falcon-7b-8layers", 1024, 2),
    Run("falcon-7b-8layers", 2048, attention="eager"), Run("falcon-7b-8layers", 2048, attention="eager", dropout=0.1),
    Run("falcon-7b-8layers", 4096, recompute="full", attention="eager", dropout=0.1),
    Run("falcon-7b-8layers", 2048, recipe="amp", attention="eager"),
    # flash_attention_2 (validation/hf/falcon.py): Falcon-7B's one k, v head and the new decoder architecture's
    # k, v copied out to every query head (Falcon-40B's shape)
    *(Run(m, s, recipe=r, recompute=c, attention="flash_attention_2")
      for m in ("falcon-7b-8layers", "falcon-40b-8layers")
      for s, r, c in ((2048, "bf16", "none"), (4096, "bf16", "full"), (2048, "amp", "none"), (4096, "amp", "full"))),
)


SMALL_RUNS = (
    Run("llama-3.2-1b", 2048), Run("llama-3.2-1b", 4096, 2, recompute="full"),
    Run("llama-3.2-1b", 2048, recipe="amp"), Run("llama-3.2-1b", 1024, 4, optimizer="sgd_momentum"),
    Run("qwen2.5-0.5b", 2048, 2), Run("qwen2.5-0.5b", 4096, recipe="amp", recompute="full"),
    Run("qwen2.5-0.5b", 1024, attention="eager"),
)


CASES: dict[str, Run] = {case_id(r): r for r in _runs()}


def _falcon_on_sdpa(run: Run) -> bool:
    """A transformers Falcon run on SDPA: its model carries the SDPA mask (Architecture.sdpa_mask_always)."""
    return run.attention == "sdpa" and getattr(MODELS[run.model], "hf", {}).get("model_type") == "falcon"


def contract_config(run: Run) -> dict:
    dtype = "bf16" if run.recipe == "bf16" else "fp32"
    images = {"images_per_sample": run.images, "image_size": run.image_size} if run.images else {}
    images.update({"freeze_vision": True} if run.freeze_vision else {})
    return {
        "model": MODELS[run.model].architecture(**({"dropout": run.dropout} if run.dropout else {}),
                                                **({"sdpa": True} if _falcon_on_sdpa(run) else {})),
        "training": {
            "mode": "training", "framework": "hf", "seq_len": run.seq_len,
            "micro_batch_size": run.micro_batch_size, "param_dtype": dtype,
            # torch keeps gradients and optimizer states in the parameter's dtype; no master copy
            "grad_dtype": dtype, "master_weights": False, "optimizer_dtype": dtype,
            "compute_dtype": "bf16", "optimizer": run.optimizer, "recompute": run.recompute,
            "attention": "flash" if run.attention in ("sdpa", "flash_attention_2") else "eager",
            **({"attn_implementation": "flash_attention_2"} if run.attention == "flash_attention_2" else {}),
            "dropout": 0.0, "loss": "chunked" if run.liger else "standard", **images,
            **({"liger_kernel": True} if run.liger else {}),
        },
        "parallel": {"tp": 1, "pp": 1, "dp": 1},
        "hardware": {"gpu": "h100-80"},
    }


def run_versions(run: Run) -> dict:
    """What a case runs beyond every record's torch and transformers: liger-kernel, whose release the Liger cases
    check before they run (liger.py `apply`)."""
    return {"liger-kernel": LIGER_RELEASE} if run.liger else {}


def describe(run: Run) -> str:
    recipe = "pure bf16 (bf16 parameters, grads, optimizer states)" if run.recipe == "bf16" \
        else "bf16 autocast over fp32 parameters"
    opt = "AdamW" if run.optimizer == "adamw" else "SGD with momentum"
    recompute = "full recompute (non-reentrant checkpoint per layer)" if run.recompute == "full" \
        else "no recompute"
    attention = {"sdpa": "SDPA (FlashAttention-2)", "eager": "eager attention",
                 "flash_attention_2": "flash_attention_2 (flash-attn's flash_attn_func, emulated)"}[run.attention]
    if _falcon_on_sdpa(run):
        attention = ("SDPA with Falcon's 4-D mask (one key/value head for many query heads, no enable_gqa: torch's "
                     "math backend, emulated as the H200 ran it)")
    kernels = f", {KERNELS[run.model]}" if run.model in KERNELS else ""
    if run.model in LLAMA4_KERNELS:
        kernels = f", {LLAMA4_KERNELS[run.model]}"
    kernels = f", {DSA_KERNELS[run.model]}" if run.model in DSA_KERNELS else kernels
    if run.model in VISION_KERNELS:
        frozen = ", the vision encoder frozen" if run.freeze_vision else ""
        tower = VISION_KERNELS[run.model] if run.vision_attention == "flash_attention_2" else SDPA_VISION[run.model]
        kernels = f", {run.images} images of {run.image_size} px per sample{frozen}, {tower}"
    if run.liger:
        kernels += (", liger-kernel 0.8.5 applied as the Trainer's use_liger_kernel (its defaults: RMSNorm, SwiGLU, "
                    "RoPE, fused linear cross-entropy; Triton launches stubbed, validation/hf/liger.py)")
    if run.dropout:
        kernels += (f", the config's residual and embedding dropouts at {run.dropout:g} (CUDA's fused native_dropout, "
                    "validation/hf/dropout.py)")
    return (f"{run.model}, HF transformers training step: {recipe}, {opt} (foreach), {recompute}, "
            f"{attention}{kernels}, seq {run.seq_len}, micro-batch {run.micro_batch_size}")
