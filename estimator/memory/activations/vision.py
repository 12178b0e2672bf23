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
SigLIP with Gemma 3's projector (modeling_siglip.py SiglipEncoderLayer, modeling_gemma3.py
Gemma3MultiModalProjector), per patch:
- each block: two LayerNorms, each keeping its input (Bc), its fp32 mean and rstd (8) and its output (Bc, the
  next linears' input); q, k and v (3Bc, the kernel keeps the projections' outputs), the attention output
  (Bc) and its fp32 log-sum-exp (4n); fc1's output (Bf, kept by the tanh GELU) and the GELU's (Bf, kept by
  fc2): 8Bc + 2Bf + 16 + 4n.
- the tower: the pixels (fp32 batch and 16-bit copy), the post-LayerNorm (input Bc, statistics 8) and the
  contiguous copy the average pool keeps (Bc); per pooled token, Gemma's fp32 RMSNorm (fp32 copy 4c, rsqrt 4,
  normalised 4c kept by the (1 + w) product) and its 16-bit output the projection keeps (Bc).
Under full recompute (transformers' gradient checkpointing covers the vision blocks) a block keeps its input
(Bc) instead. With the encoder frozen (`training.freeze_vision`) autograd records none of its operations (neither
its weights nor the pixels need a gradient): only the fp32 pixels of the batch and what the trained merger or
projector keeps remain: Qwen2.5-VL's merger keeps its norm's normalised output (Bc, for the norm's weight), its
output and the two MLP tensors (3Bc); Gemma 3's projector per pooled token the fp32 normalised tokens (4c, for
the (1 + w) weight) and the projection's 16-bit input (Bc).
Under the transformers frameworks `attention` "flash" is transformers' default attn_implementation, SDPA (flash-attn
is not a dependency of transformers; the tower follows the model's implementation): Qwen2.5-VL's tower then runs one
SDPA call per window or image and concatenates their outputs (modeling_qwen2_5_vl.py Qwen2_5_VLVisionAttention.forward,
the branch for an implementation other than flash_attention_2), so a trained block keeps the concatenation (the output
projection's input) besides the per-window outputs the kernel keeps: Bc more per patch (`sdpa_windows`). SigLIP's
tower attends over each image whole, one unmasked call either way.
Measured: tests/data/measured/qwen2.5-vl-7b-* (the -sdpavision records: the tower on SDPA; the others on
flash_attention_2) and gemma-3-27b-* (the HF harness, validation/vlm).
"""

from __future__ import annotations

from ...spec import vision as _vision
from ...spec.architecture import Architecture
from ...spec.dtypes import bytes_per_element
from ...spec.training import Training

SOURCE = ("transformers 5.23 modeling_qwen2_5_vl.py (Qwen2_5_VLVisionBlock, Qwen2_5_VLPatchMerger), modeling_siglip.py "
          "(SiglipEncoderLayer), modeling_gemma3.py (Gemma3MultiModalProjector); flash-attn "
          "v2.7 flash_attn_interface.py FlashAttnVarlenFunc (saves q, k, v, out, softmax_lse); measured: "
          "tests/data/measured/qwen2.5-vl-7b-*, gemma-3-27b-*; under SDPA Qwen2_5_VLVisionAttention.forward splits q, "
          "k, v by window and torch.cat's the outputs (the -sdpavision records)")


def image_size(arch: Architecture, training: Training) -> int:
    return training.image_size or _vision.default_image_size(arch)


def sdpa_windows(arch: Architecture, training: Training) -> bool:
    """Qwen2.5-VL's tower attends window by window through SDPA: under the transformers frameworks, whose
    `attention` "flash" is transformers' default SDPA (the module docstring)."""
    from .llama4 import TRANSFORMERS_FRAMEWORKS
    return arch.vision_tower == _vision.QWEN2_5_VL and training.framework in TRANSFORMERS_FRAMEWORKS \
        and training.attention == "flash"


def block_bytes_per_patch(arch: Architecture, B: float, windows_concatenated: bool = False) -> float:
    """A trained block's saved bytes per patch; `windows_concatenated`: Qwen2.5-VL's tower on SDPA, which keeps
    the concatenation of the per-window outputs too (`sdpa_windows`)."""
    c, f, n = arch.vision_hidden_size, arch.vision_intermediate_size, arch.vision_num_heads
    if arch.vision_tower == _vision.SIGLIP:
        layer_norm = B * c + 8 + B * c  # input, mean and rstd, output
        return 2 * layer_norm + 3 * B * c + B * c + 4 * n + 2 * B * f
    norm = 4 * c + 4 + 2 * B * c  # fp32 copy, rsqrt, normalised output, scaled output
    attention = 2 * B * c + 3 * B * c + B * c + 4 * n  # q, k (rotated), qkv output, attention output, lse
    concatenated = B * c if windows_concatenated else 0  # the per-window outputs' torch.cat, o_proj's input
    return 2 * norm + attention + concatenated + 4 * B * f


def tower_bytes_per_patch(arch: Architecture, B: float) -> float:
    c, n, p = arch.vision_hidden_size, arch.vision_num_heads, arch.vision_patch_size
    pixels = _vision.CHANNELS * arch.vision_temporal_patch_size * p * p
    if arch.vision_tower == _vision.SIGLIP:
        return (4 + B) * pixels + B * c + 8 + B * c
    rotary = 2 * 4 * (c // n)
    merger = 4 * c + 4 + 2 * B * c + 2 * B * c
    return (4 + B) * pixels + rotary + merger


def vision_activation(arch: Architecture, training: Training) -> tuple[float, str]:
    """(bytes per micro-batch, formula) the vision tower keeps for backward; (0, "") without images."""
    if arch.vision_tower is None or not training.images_per_sample or training.mode != "training":
        return 0.0, ""
    B = bytes_per_element(training.compute_dtype)
    size = image_size(arch, training)
    if arch.vision_tower == _vision.LLAMA4:
        return _llama4_activation(arch, training, B, size)
    patches = _vision.patches_per_image(arch, size) * training.images_per_sample * training.micro_batch_size
    layers = arch.vision_num_layers
    if training.recompute == "full":
        per_block, kept = B * arch.vision_hidden_size, "its input"
    else:
        windows = sdpa_windows(arch, training)
        per_block = block_bytes_per_patch(arch, B, windows)
        kept = "norms, q, k, qkv, attention output" + (" per window and concatenated" if windows else "") + ", lse, MLP"
    if training.freeze_vision:
        return _frozen(arch, training, B, size, patches)
    per_patch = per_block * layers + tower_bytes_per_patch(arch, B)
    formula = (f"{patches:,} patches ({training.micro_batch_size} x {training.images_per_sample} images of "
               f"({size} / {arch.vision_patch_size})^2) x ({per_block:,.0f} B per block ({kept}) x {layers} blocks + "
               f"{tower_bytes_per_patch(arch, B):,.0f} B pixels, norms and "
               f"{'pooling' if arch.vision_tower == _vision.SIGLIP else 'rotary and merger'})")
    pooled = 0
    if arch.vision_tower == _vision.SIGLIP:  # Gemma 3's projector over the pooled tokens
        tokens = arch.vision_tokens_per_image * training.images_per_sample * training.micro_batch_size
        pooled = tokens * token_bytes(arch, B)
        formula += f" + {tokens:,} pooled tokens x {token_bytes(arch, B):,.0f} B (projector norm and input)"
    return patches * per_patch + pooled, formula


def token_bytes(arch: Architecture, B: float) -> float:
    """Gemma 3's projector per pooled token: its fp32 RMSNorm (copy, rsqrt, normalised) and the 16-bit input
    of the projection."""
    c = arch.vision_hidden_size
    return 4 * c + 4 + 4 * c + B * c


def _frozen(arch: Architecture, training: Training, B: float, size: int, patches: int) -> tuple[float, str]:
    """A frozen encoder: the fp32 pixels and the trained merger's or projector's saved tensors."""
    c, p = arch.vision_hidden_size, arch.vision_patch_size
    pixels = 4 * _vision.CHANNELS * arch.vision_temporal_patch_size * p * p
    text = (f"{patches:,} patches ({training.micro_batch_size} x {training.images_per_sample} images of ({size} / {p})^2)"
            f" x {pixels:,} B fp32 pixels (the encoder frozen: nothing saved)")
    if arch.vision_tower == _vision.SIGLIP:
        tokens = arch.vision_tokens_per_image * training.images_per_sample * training.micro_batch_size
        per_token = 4 * c + B * c
        return patches * pixels + tokens * per_token, text + f" + {tokens:,} pooled tokens x {per_token:,.0f} B projector"
    return patches * (pixels + 4 * B * c), text + f" + {4 * B * c:,.0f} B per patch merger (norm, output, MLP)"


LLAMA4_SOURCE = ("transformers 5.23 modeling_llama4.py Llama4VisionModel (Llama4UnfoldConvolution, "
                 "Llama4VisionEncoderLayer, pixel_shuffle, Llama4VisionPixelShuffleMLP), Llama4MultiModalProjector; "
                 "measured: tests/data/measured/llama-4-scout-vl-*")


def llama4_tile_bytes(arch: Architecture, training: Training, B: float) -> tuple[float, str]:
    """What Llama 4's tower keeps per tile (LLAMA4_SOURCE), with c its width, f its MLP's, n its heads, q the
    adapter's width, N = (tile / patch)^2 + 1 positions (the class token), P = N - 1 patches, K = P / merge^2
    tokens:
    - the pixels (the batch, in the model's dtype: the tower does not cast them) and the unfold's copy the patch
      linear keeps (2 x B x 3 patch^2 per patch);
    - per position: the pre- and post-LayerNorms' inputs and fp32 mean and rstd (2 x (Bc + 8)); each block as
      SigLIP's: two LayerNorms (input, statistics, output), q and k after the rotary embedding (new 16-bit
      tensors from the fp32 complex product), v, the attention output and its fp32 log-sum-exp, fc1's output and
      the GELU's: 8Bc + 16 + 4n + 2Bf; under full recompute a block keeps its input (Bc);
    - the pixel shuffle's last contiguous copy, the adapter's first input (Bc per patch);
    - per token: the adapter's fc1 output, its GELU, fc2's output and its GELU (the projector's input): 4Bq.
    With the encoder frozen (the adapter with it): the pixels and the projector's input (Bq per token)."""
    c, f, n, q = arch.vision_hidden_size, arch.vision_intermediate_size, arch.vision_num_heads, arch.vision_projector_size
    side = arch.vision_image_size // arch.vision_patch_size
    P, pixels = side * side, _vision.CHANNELS * arch.vision_patch_size ** 2
    N, K = P + 1, P // arch.vision_spatial_merge_size ** 2
    if training.freeze_vision:
        return P * B * pixels + K * B * q, f"{P} x {B * pixels:,.0f} B pixels + {K} tokens x Bq (the projector's input)"
    block = B * c if training.recompute == "full" else 8 * B * c + 16 + 4 * n + 2 * B * f
    kept = "its input" if training.recompute == "full" else "norms, q, k, v, output, lse, MLP"
    total = P * (2 * B * pixels + B * c) + N * (arch.vision_num_layers * block + 2 * (B * c + 8)) + K * 4 * B * q
    return total, (f"{P} patches x (2 x {B * pixels:,.0f} B pixels and unfold + Bc shuffle) + {N} positions x "
                   f"({arch.vision_num_layers} blocks x {block:,.0f} B ({kept}) + 2 LayerNorms) + {K} tokens x 4Bq")


def _llama4_activation(arch: Architecture, training: Training, B: float, size: int) -> tuple[float, str]:
    tiles = _vision.tiles_per_image(arch, size) * training.images_per_sample * training.micro_batch_size
    per_tile, formula = llama4_tile_bytes(arch, training, B)
    return tiles * per_tile, (f"{tiles:,} tiles ({training.micro_batch_size} x {training.images_per_sample} images of "
                              f"{size} px on {arch.vision_image_size}-px tiles) x ({formula})")
