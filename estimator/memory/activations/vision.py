"""What a vision tower keeps for backward per image (issue 28, estimator/spec/vision.py), as transformers 5.23
runs Qwen2.5-VL's tower under the HF Trainer with 16-bit weights (modeling_qwen2_5_vl.py), its attention
FlashAttention-2's variable-length kernel over the packed windows and images (flash_attention_2).

Per patch, with c the tower's width, f its MLP width, n its heads, B the compute dtype's bytes and P the
pixels of a patch (channels x frames x patch^2):
- each block: two RMSNorms, each keeping its fp32 input copy (4c), its fp32 rsqrt (4) and its normalised
  output before the scale (Bc) for the weight's gradient, then its output (Bc, the next linear's input);
  the attention keeps q and k after the rotary embedding (2Bc), the qkv projection's output (3Bc, which
  the kernel's v is a view of), its output (Bc, also the output projection's input) and its fp32
  log-sum-exp (4n); the gated MLP keeps gate, SiLU(gate), up and their product (4Bf): in all
  8c + 8 + 4Bc + 6Bc + 4n + 4Bf, which is 28c + 8f + 8 + 4n bytes at B = 2.
- the tower: the 16-bit copy of the pixels the patch embedding keeps (BP) beside the fp32 batch (4P), the
  rotary embedding's fp32 cos and sin (2 x 4 x c/n), the merger's RMSNorm (4c + 4 + 2Bc) and its MLP's
  hidden (2 x Bc: the first linear's output, kept by the GELU, and the GELU's, kept by the second linear).
Under full recompute (transformers' gradient checkpointing covers the vision blocks) a block keeps its input
(Bc) instead. Measured: tests/data/measured/qwen2.5-vl-7b-* (the HF harness, validation/vlm).
"""

from __future__ import annotations

from ...spec import vision as _vision
from ...spec.architecture import Architecture
from ...spec.dtypes import bytes_per_element
from ...spec.training import Training

SOURCE = ("transformers 5.23 modeling_qwen2_5_vl.py (Qwen2_5_VLVisionBlock, Qwen2_5_VLPatchMerger); flash-attn "
          "v2.7 flash_attn_interface.py FlashAttnVarlenFunc (saves q, k, v, out, softmax_lse); measured: "
          "tests/data/measured/qwen2.5-vl-7b-*")


def image_size(arch: Architecture, training: Training) -> int:
    return training.image_size or _vision.default_image_size(arch)


def block_bytes_per_patch(arch: Architecture, B: float) -> float:
    c, f, n = arch.vision_hidden_size, arch.vision_intermediate_size, arch.vision_num_heads
    norm = 4 * c + 4 + 2 * B * c  # fp32 copy, rsqrt, normalised output, scaled output
    attention = 2 * B * c + 3 * B * c + B * c + 4 * n  # q, k (rotated), qkv output, attention output, lse
    return 2 * norm + attention + 4 * B * f


def tower_bytes_per_patch(arch: Architecture, B: float) -> float:
    c, n, p = arch.vision_hidden_size, arch.vision_num_heads, arch.vision_patch_size
    pixels = _vision.CHANNELS * arch.vision_temporal_patch_size * p * p
    rotary = 2 * 4 * (c // n)
    merger = 4 * c + 4 + 2 * B * c + 2 * B * c
    return (4 + B) * pixels + rotary + merger


def vision_activation(arch: Architecture, training: Training) -> tuple[float, str]:
    """(bytes per micro-batch, formula) the vision tower keeps for backward; (0, "") without images."""
    if arch.vision_tower is None or not training.images_per_sample or training.mode != "training":
        return 0.0, ""
    B = bytes_per_element(training.compute_dtype)
    size = image_size(arch, training)
    patches = _vision.patches_per_image(arch, size) * training.images_per_sample * training.micro_batch_size
    layers = arch.vision_num_layers
    if training.recompute == "full":
        per_block, kept = B * arch.vision_hidden_size, "its input"
    else:
        per_block, kept = block_bytes_per_patch(arch, B), "norms, q, k, qkv, attention output, lse, MLP"
    per_patch = per_block * layers + tower_bytes_per_patch(arch, B)
    formula = (f"{patches:,} patches ({training.micro_batch_size} x {training.images_per_sample} images of "
               f"({size} / {arch.vision_patch_size})^2) x ({per_block:,.0f} B per block ({kept}) x {layers} blocks + "
               f"{tower_bytes_per_patch(arch, B):,.0f} B pixels, rotary and merger)")
    return patches * per_patch, formula
