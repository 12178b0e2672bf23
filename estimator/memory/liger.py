"""Liger-Kernel's patched model (training.liger_kernel): what the HF Trainer's ``use_liger_kernel`` runs.

transformers 5.23 ``Trainer.train`` calls ``integrations/liger.py apply_liger_kernel``, which hands the
(PEFT-unwrapped) model to liger_kernel.transformers ``_apply_liger_kernel_to_instance``: the model type's
``apply_liger_kernel_to_<model_type>`` with its defaults (liger-kernel 0.8.5 transformers/monkey_patch.py,
e.g. ``apply_liger_kernel_to_llama``/``_qwen2``/``_qwen3``: rope=True, rms_norm=True, swiglu=True,
fused_linear_cross_entropy=True, cross_entropy=False). A model type missing from its
``MODEL_TYPE_TO_APPLY_LIGER_FN`` is left as it is ("There are currently no Liger kernels supported").

What each kernel keeps for backward (liger-kernel 0.8.5 ops/):
- rms_norm.py ``LigerRMSNormFunction.forward``: ``save_for_backward(X, W, RSTD)``; RSTD is one fp32 value
  per row in the "llama" and "gemma" casting modes (``rms_norm_forward``), Y a new tensor in X's dtype:
  the norm keeps its input and 4 bytes per row, where transformers' eager RMSNorm keeps an fp32 upcast, the
  rsqrt and the normalised tensor.
- swiglu.py ``LigerSiLUMulFunction.forward``: ``save_for_backward(a, b)`` (gate and up outputs), the
  product ``c`` a new tensor (the down projection's input, kept by that linear); backward recomputes
  silu(a) and writes the two gradients into a and b: eager LlamaMLP's kept SiLU output is not made.
- rope.py ``LigerRopeFunction.forward``: ``save_for_backward(cos, sin)``; ``rope_forward`` rotates q and k in
  place (transposed back to the projections' contiguous layout), so the attention core keeps the same q
  and k as with transformers' eager rotation: no change to what a layer keeps.
- fused_linear_cross_entropy.py: the loss (activations/loss.py ``_liger_chunked_loss``).
"""

from __future__ import annotations

from ..spec.architecture import Architecture
from ..spec.errors import ConfigError
from ..spec.training import Training

RELEASE = "0.8.5"
SOURCE = (f"liger-kernel {RELEASE} transformers/monkey_patch.py (apply_liger_kernel_to_llama/_qwen2/_qwen3 defaults) "
          "and ops/rms_norm.py, ops/swiglu.py, ops/rope.py; transformers 5.23 integrations/liger.py")
RMS_NORM_SOURCE = f"liger-kernel {RELEASE} ops/rms_norm.py LigerRMSNormFunction (saves X, W, fp32 RSTD)"
SWIGLU_SOURCE = f"liger-kernel {RELEASE} ops/swiglu.py LigerSiLUMulFunction (saves a, b; silu recomputed)"

NOTE = ("liger_kernel: each layer as liger-kernel 0.8.5 patches it (RMSNorm keeps its input and an fp32 rstd per "
        "row, SwiGLU keeps gate and up and recomputes the SiLU, RoPE rotates in place); measured with the HF harness "
        f"(validation/hf/liger.py); {SOURCE}")

# the frameworks that run a transformers model through the Trainer (memory/activations/llama4.py's list)
FRAMEWORKS = ("hf", "deepspeed", "fsdp1", "hf_fsdp2")


def check(arch: Architecture, training: Training) -> None:
    """Refuse liger_kernel where it is not what the stack runs or where its patch is not modelled."""
    if not training.liger_kernel:
        return
    if training.framework not in FRAMEWORKS:
        raise ConfigError("training.liger_kernel", True, f"false unless framework is one of {', '.join(FRAMEWORKS)}",
                          "Liger-Kernel patches transformers models (the Trainer's use_liger_kernel)",
                          related=("training.framework",))
    unpatched = _unpatched(arch)
    if unpatched:
        raise ConfigError("training.liger_kernel", True, "false for this model",
                          f"liger-kernel {RELEASE} has no patch for {unpatched} (MODEL_TYPE_TO_APPLY_LIGER_FN): "
                          "the Trainer runs the model unpatched, its loss included (loss 'standard')")
    unmodelled = _unmodelled(arch)
    if unmodelled:
        raise ConfigError("training.liger_kernel", True, "false, or a dense RMSNorm/SwiGLU decoder (Llama, Mistral, "
                          "Qwen2, Qwen3, Phi-3, Granite)", f"Liger's patch of {unmodelled} is not modelled")
    if training.compile:
        raise ConfigError("training.liger_kernel", True, "false with compile", "Liger's Triton kernels under "
                          "torch.compile are not modelled", related=("training.compile",))
    if training.loss not in ("standard", "chunked"):
        raise ConfigError("training.loss", training.loss, "'chunked' (Liger's default fused linear cross-entropy) or "
                          "'standard' (liger_kernel_config fused_linear_cross_entropy: false)",
                          "Liger's own cross_entropy kernel (liger_kernel_config cross_entropy: true) is not modelled",
                          related=("training.liger_kernel",))


def _unpatched(arch: Architecture) -> str:
    """The kind of model liger-kernel 0.8.5 leaves alone, in words; '' where it patches it. Of the model types
    the estimator reads, MODEL_TYPE_TO_APPLY_LIGER_FN lacks gpt2, gpt_neox, starcoder2, falcon (the LayerNorm
    decoders), nemotron_h, jamba and qwen2_moe."""
    if arch.norm == "layernorm":
        return "LayerNorm decoders (gpt2, gpt_neox, starcoder2, falcon)"
    if arch.hybrid_override_pattern or arch.attention_layer_period:
        return "Nemotron-H and Jamba"
    if arch.shared_expert_gate and arch.is_moe and not arch.full_attention_interval:
        return "Qwen2-MoE"
    return ""


def _unmodelled(arch: Architecture) -> str:
    """The patched kinds whose kernels differ from the dense Llama/Qwen ones checked here, in words."""
    if arch.is_moe:
        return "MoE experts"
    if arch.is_hybrid or arch.full_attention_interval:
        return "hybrid linear-attention or Mamba layers"
    if arch.vision_tower:
        return "a vision-language model"
    if arch.norm_unit_offset or arch.norm_fp32_scale or arch.norms_per_layer != 2 or arch.qk_norm_full_width:
        return "Gemma's or OLMo-2's norms"
    if not arch.gated_mlp or arch.uses_mla or arch.attention_sinks or arch.final_logit_softcapping:
        return "this architecture"
    return ""
