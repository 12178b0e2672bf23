"""Vision-language models (issue 28): the vision tower before the decoder, its weights and its geometry.

Two towers, as transformers 5.23 builds them:

- ``qwen2_5_vl`` (modeling_qwen2_5_vl.py `Qwen2_5_VisionTransformerPretrainedModel`): a Conv3d patch
  embedding over temporal_patch_size frames of patch x patch pixels (no bias), ViT blocks of two RMSNorms,
  a fused qkv projection with bias, an output projection with bias and a gated SiLU MLP with biases; the
  blocks attend within windows of window_size pixels except `vision_full_attention_layers` of them
  (fullatt_block_indexes); the patch merger (RMSNorm, then an MLP over spatial_merge_size^2 neighbouring
  patches: 4c -> 4c -> text hidden) gives one decoder token per spatial_merge_size^2 patches. Images of any
  size: patches per image = (image_size / patch)^2.
- ``siglip`` with Gemma 3's projector (modeling_siglip.py `SiglipVisionTransformer` without its head,
  modeling_gemma3.py `Gemma3MultiModalProjector`): a Conv2d patch embedding with bias, a learned position
  table of (vision_image_size / patch)^2 rows, pre-LayerNorm blocks of q, k, v, o projections and a GELU
  MLP (all with biases), a post-LayerNorm; the projector average-pools the patch grid to
  vision_tokens_per_image tokens, RMS-normalises them (Gemma's (1 + w)) and projects them to the text
  width with one matrix. Every image is resized to vision_image_size.

- ``llama4`` (modeling_llama4.py `Llama4VisionModel`, `Llama4MultiModalProjector`): an image is cut into tiles of
  vision_image_size pixels (Llama4ImageProcessor: the smallest square canvas of n x n tiles that holds it, n <= 4,
  plus one global tile of the whole image when n > 1); per tile a bias-free linear patch embedding (an unfold),
  a class token and a learned position table of (size / patch)^2 + 1 rows, a pre- and a post-LayerNorm, ViT
  blocks of two LayerNorms, q, k, v, o with biases and a GELU MLP with biases; the pixel-shuffle adapter folds
  merge x merge patches into one (c merge^2 wide = vision_intermediate_size) and runs a bias-free two-layer GELU
  MLP (c merge^2 -> projector -> projector), the projector one bias-free matrix into the text width.

A sample's images become tokens of the decoder's sequence: `seq_len` counts them (the processor puts one
placeholder token per image token in `input_ids`), so the decoder is unchanged and the tower adds its
weights and what it keeps per image.
"""

from __future__ import annotations

import dataclasses
import math

from .errors import ConfigError
from .tensors import REPLICATED, ParameterTensor

QWEN2_5_VL, SIGLIP, LLAMA4 = "qwen2_5_vl", "siglip", "llama4"
LLAMA4_MAX_SIDE_TILES = 4  # Llama4ImageProcessor max_patches 16: at most 4 x 4 tiles for a square image
CHANNELS = 3  # RGB (in_channels / num_channels)


def patch_side(arch, image_size: int) -> int:
    return image_size // arch.vision_patch_size


def tiles_per_image(arch, image_size: int) -> int:
    """Llama 4: a square image of `image_size` px on the smallest canvas of n x n tiles that holds it (n <= 4,
    larger images are scaled down to 4 x 4), and the global tile when there is more than one
    (transformers 5.23 image_processing_llama4.py get_best_fit, _preprocess); 1 for the other towers."""
    if arch.vision_tower != LLAMA4:
        return 1
    side = min(-(-image_size // arch.vision_image_size), LLAMA4_MAX_SIDE_TILES)
    return side * side + (1 if side > 1 else 0)


def patches_per_image(arch, image_size: int) -> int:
    """Patches the tower runs per image: Qwen2.5-VL's processor gives (size / patch)^2 (one temporal patch
    for a still image, its frames repeated); SigLIP always sees vision_image_size; Llama 4 runs its tiles,
    each (tile / patch)^2 patches and the class token."""
    if arch.vision_tower == LLAMA4:
        return tiles_per_image(arch, image_size) * (patch_side(arch, arch.vision_image_size) ** 2 + 1)
    return patch_side(arch, image_size) ** 2


def tokens_per_image(arch, image_size: int) -> int:
    """Decoder tokens per image: Qwen2.5-VL's merger folds merge^2 patches into one; Gemma 3's projector
    pools to a fixed count (mm_tokens_per_image)."""
    if arch.vision_tower == SIGLIP:
        return arch.vision_tokens_per_image
    if arch.vision_tower == LLAMA4:  # the class token is dropped before the pixel shuffle
        per_tile = patch_side(arch, arch.vision_image_size) ** 2 // arch.vision_spatial_merge_size ** 2
        return tiles_per_image(arch, image_size) * per_tile
    return patches_per_image(arch, image_size) // arch.vision_spatial_merge_size ** 2


def default_image_size(arch) -> int | None:
    return arch.vision_image_size


def vision_tensors(arch) -> list[ParameterTensor]:
    """Every weight of the tower and its projector. Replicated: the HF Trainer, FSDP and DeepSpeed shard
    nothing by TP, and Megatron-Core's vision models keep the tower on the first pipeline stage."""
    if arch.vision_tower is None:
        return []
    c, f, layers = arch.vision_hidden_size, arch.vision_intermediate_size, arch.vision_num_layers
    p, D = arch.vision_patch_size, arch.hidden_size
    pixels = CHANNELS * arch.vision_temporal_patch_size * p * p

    def t(name, shape, copies=1, role="vision"):
        return ParameterTensor(f"vision_{name}", shape, REPLICATED, role, copies)

    if arch.vision_tower == QWEN2_5_VL:
        m = arch.vision_spatial_merge_size ** 2 * c
        return [t("patch_embed", (c, pixels)),
                t("norms", (c,), 2 * layers), t("qkv", (3 * c, c), layers), t("qkv_bias", (3 * c,), layers),
                t("proj", (c, c), layers), t("proj_bias", (c,), layers),
                t("mlp_gate_up", (2 * f, c), layers), t("mlp_gate_up_bias", (2 * f,), layers),
                t("mlp_down", (c, f), layers), t("mlp_down_bias", (c,), layers),
                t("merger_norm", (c,)), t("merger_fc1", (m, m)), t("merger_fc1_bias", (m,)),
                t("merger_fc2", (D, m)), t("merger_fc2_bias", (D,))]
    if arch.vision_tower == LLAMA4:
        return _llama4_tensors(arch, t)
    positions = (arch.vision_image_size // p) ** 2
    return [t("patch_embed", (c, pixels)), t("patch_embed_bias", (c,)), t("position_embedding", (positions, c)),
            t("layer_norms", (c,), 4 * layers),  # two LayerNorms, weight and bias
            t("qkvo", (4 * c, c), layers), t("qkvo_bias", (4 * c,), layers),
            t("fc1", (f, c), layers), t("fc1_bias", (f,), layers), t("fc2", (c, f), layers), t("fc2_bias", (c,), layers),
            t("post_layernorm", (c,), 2), t("projector", (c, D)), t("projector_norm", (c,))]


def _llama4_tensors(arch, t) -> list[ParameterTensor]:
    """Llama4VisionModel and Llama4MultiModalProjector (transformers 5.23 modeling_llama4.py)."""
    c, f, layers, p = arch.vision_hidden_size, arch.vision_intermediate_size, arch.vision_num_layers, arch.vision_patch_size
    q = arch.vision_projector_size
    positions = (arch.vision_image_size // p) ** 2 + 1  # and the class token
    return [t("patch_embed", (c, CHANNELS * p * p)), t("class_embedding", (c,)),
            t("positions", (positions, c)), t("pre_post_layernorms", (c,), 4),
            t("layer_norms", (c,), 4 * layers), t("qkvo", (4 * c, c), layers), t("qkvo_bias", (4 * c,), layers),
            t("fc1", (f, c), layers), t("fc1_bias", (f,), layers), t("fc2", (c, f), layers), t("fc2_bias", (c,), layers),
            t("adapter_fc1", (q, c * arch.vision_spatial_merge_size ** 2)), t("adapter_fc2", (q, q)),
            t("projector", (arch.hidden_size, q))]


REQUIRED = ("vision_hidden_size", "vision_num_layers", "vision_num_heads", "vision_intermediate_size", "vision_patch_size")


def is_projector(tensor: ParameterTensor) -> bool:
    """The part that maps the tower's output into the decoder (Qwen2.5-VL's merger, Gemma 3's projector): trained
    when the encoder is frozen (LLaMA-Factory's freeze_vision_tower leaves it to freeze_multi_modal_projector)."""
    return tensor.name.startswith(("vision_merger", "vision_projector"))


def encoder_tensors(arch) -> list[ParameterTensor]:
    """The encoder alone: what `training.freeze_vision` freezes."""
    return [t for t in vision_tensors(arch) if not is_projector(t)]


def _require(arch, name: str, why: str) -> None:
    if getattr(arch, name) is None:
        raise ConfigError(f"model.{name}", None, "a positive integer", why)


def check(arch) -> None:
    """A vision tower needs its shape; each tower its own geometry; without one, no vision field is set."""
    if arch.vision_tower is None:
        for f in dataclasses.fields(arch):
            if f.name.startswith("vision_") and getattr(arch, f.name) != f.default:
                raise ConfigError(f"model.{f.name}", getattr(arch, f.name), f"{f.default} without a vision tower",
                                  related=("model.vision_tower",))
        return
    for name in REQUIRED:
        _require(arch, name, "required with a vision tower")
    if arch.vision_hidden_size % arch.vision_num_heads:
        raise ConfigError("model.vision_num_heads", arch.vision_num_heads,
                          f"a divisor of vision_hidden_size ({arch.vision_hidden_size})", related=("model.vision_hidden_size",))
    if arch.vision_full_attention_layers > arch.vision_num_layers:
        raise ConfigError("model.vision_full_attention_layers", arch.vision_full_attention_layers,
                          f"at most vision_num_layers ({arch.vision_num_layers})", related=("model.vision_num_layers",))
    unit = arch.vision_patch_size * arch.vision_spatial_merge_size
    if arch.vision_window_size is not None and arch.vision_window_size < unit:
        raise ConfigError("model.vision_window_size", arch.vision_window_size, f"at least patch x merge ({unit} px)",
                          "a window holds whole merged patches", related=("model.vision_patch_size",))
    if arch.vision_tower != LLAMA4 and arch.vision_projector_size is not None:
        raise ConfigError("model.vision_projector_size", arch.vision_projector_size, "none without Llama 4's tower",
                          related=("model.vision_tower",))
    if arch.vision_tower == LLAMA4:
        _require(arch, "vision_image_size", "required with Llama 4's tower (the tile size)")
        _require(arch, "vision_projector_size", "required with Llama 4's tower (its adapter's and projector's width)")
        side = arch.vision_image_size // arch.vision_patch_size
        if arch.vision_image_size % arch.vision_patch_size or side % arch.vision_spatial_merge_size:
            raise ConfigError("model.vision_spatial_merge_size", arch.vision_spatial_merge_size,
                              f"a divisor of the tile's patch grid ({side})", "the pixel shuffle folds merge x merge patches",
                              related=("model.vision_image_size", "model.vision_patch_size"))
    if arch.vision_tower == SIGLIP:
        _require(arch, "vision_image_size", "required with a SigLIP tower (every image is resized to it)")
        _require(arch, "vision_tokens_per_image", "required with a SigLIP tower (the projector pools to it)")
        side = arch.vision_image_size // arch.vision_patch_size
        pooled = math.isqrt(arch.vision_tokens_per_image)
        if arch.vision_image_size % arch.vision_patch_size or pooled ** 2 != arch.vision_tokens_per_image \
                or side % pooled:
            raise ConfigError("model.vision_tokens_per_image", arch.vision_tokens_per_image,
                              f"a square whose side divides the patch grid's ({side})",
                              "Gemma 3's projector average-pools the patch grid to it",
                              related=("model.vision_image_size", "model.vision_patch_size"))
