"""The vision tower of a vision-language config.json (issue 28, estimator/spec/vision.py): Qwen2.5-VL's
`vision_config` and Gemma 3's SigLIP `vision_config` with its `mm_tokens_per_image`. Registers the
qwen2_5_vl family (its text model is Qwen2's, at the top level of the file) in `hf_families.FAMILIES` on
import (hf_config imports this module)."""

from __future__ import annotations

from typing import Any

from ..spec.errors import ConfigError
from .hf_common import Family
from .hf_families import FAMILIES, _llama_like, _Reader

# Qwen2_5_VLVisionConfig's and SiglipVisionConfig's defaults (transformers 5.23)
_QWEN_VISION = dict(depth=32, hidden_size=3584, intermediate_size=3420, num_heads=16, in_channels=3, patch_size=14,
                    spatial_merge_size=2, temporal_patch_size=2, window_size=112, out_hidden_size=3584,
                    fullatt_block_indexes=[7, 15, 23, 31])
_SIGLIP = dict(hidden_size=768, intermediate_size=3072, num_hidden_layers=12, num_attention_heads=12, num_channels=3,
               image_size=224, patch_size=16)
# Llama4VisionConfig's defaults (transformers 5.23 configuration_llama4.py)
_LLAMA4_VISION = dict(hidden_size=768, num_hidden_layers=34, num_attention_heads=16, num_channels=3, intermediate_size=5632,
                      vision_output_dim=7680, image_size=448, patch_size=14, pixel_shuffle_ratio=0.5,
                      projector_input_dim=4096, projector_output_dim=4096, multi_modal_projector_bias=False)
_LLAMA4_VISION_KEYS = {"attention_dropout", "hidden_act", "hidden_size", "image_size", "initializer_range",
                       "intermediate_size", "model_type", "multi_modal_projector_bias", "norm_eps", "num_attention_heads",
                       "num_channels", "num_hidden_layers", "patch_size", "pixel_shuffle_ratio", "projector_dropout",
                       "projector_input_dim", "projector_output_dim", "rope_theta", "rope_parameters",
                       "vision_feature_layer", "vision_feature_select_strategy", "vision_output_dim", "torch_dtype",
                       "dtype", "_attn_implementation_autoset"}
_QWEN_VISION_KEYS = {"depth", "hidden_act", "hidden_size", "intermediate_size", "num_heads", "in_chans", "in_channels",
                     "out_hidden_size", "patch_size", "spatial_merge_size", "spatial_patch_size", "window_size",
                     "fullatt_block_indexes", "tokens_per_second", "temporal_patch_size", "model_type", "torch_dtype",
                     "dtype", "initializer_range"}
_SIGLIP_KEYS = {"hidden_size", "image_size", "intermediate_size", "model_type", "num_attention_heads",
                "num_hidden_layers", "patch_size", "vision_use_head", "num_channels", "hidden_act", "layer_norm_eps",
                "attention_dropout", "torch_dtype", "dtype"}


class _VisionReader(_Reader):
    """A `vision_config` read with its transformers class's defaults; errors name model.vision_config.<key>."""

    def __init__(self, config: dict, defaults: dict, model_type: str):
        self.config, self.defaults, self.model_type, self.prefix = config, defaults, model_type, "model.vision_config."


def _vision_config(config: dict) -> dict:
    vc = config.get("vision_config")
    if not isinstance(vc, dict):
        raise ConfigError("model.vision_config", vc, "an object (the vision tower's config)")
    return vc


def _channels(r: _VisionReader, *keys: str) -> None:
    channels = r.int(*keys)
    if channels != 3:
        raise r._error(keys[0], channels, "3", "the tower is modelled for RGB images")


def _qwen2_5_vl_vision(config: dict, text_hidden: int) -> tuple[dict[str, Any], list[str]]:
    vc = _vision_config(config)
    r = _VisionReader(vc, _QWEN_VISION, "qwen2_5_vl vision")
    _channels(r, "in_channels", "in_chans")
    out = r.int("out_hidden_size")
    if out != text_hidden:
        raise r._error("out_hidden_size", out, f"the text hidden size ({text_hidden})",
                       "the merger projects into the decoder's width")
    full = r.list_of("fullatt_block_indexes", int, "a list of block indexes") if "fullatt_block_indexes" in vc \
        else _QWEN_VISION["fullatt_block_indexes"]
    depth = r.int("depth")
    if full is None or len(set(full)) != len(full) or any(i < 0 or i >= depth for i in full):
        raise r._error("fullatt_block_indexes", full, f"distinct block indexes below depth ({depth})")
    fields = dict(vision_tower="qwen2_5_vl", vision_hidden_size=r.int("hidden_size"), vision_num_layers=depth,
                  vision_num_heads=r.int("num_heads"), vision_intermediate_size=r.int("intermediate_size"),
                  vision_patch_size=r.int("patch_size", "spatial_patch_size"),
                  vision_temporal_patch_size=r.int("temporal_patch_size"),
                  vision_spatial_merge_size=r.int("spatial_merge_size"), vision_window_size=r.int("window_size"),
                  vision_full_attention_layers=len(full))
    return fields, [f"vision_config.{k}" for k in sorted(vc) if k not in _QWEN_VISION_KEYS]


def _siglip_vision(config: dict) -> tuple[dict[str, Any], list[str]]:
    """Gemma 3 (transformers 5.23 Gemma3Config): a SigLIP tower without its pooling head and the pooled projector."""
    vc = _vision_config(config)
    r = _VisionReader(vc, _SIGLIP, "siglip_vision_model")
    _channels(r, "num_channels")
    if r.bool("vision_use_head", True):
        raise r._error("vision_use_head", True, "false", "Gemma 3's tower has no attention-pooling head")
    tokens = config.get("mm_tokens_per_image", 256)  # Gemma3Config's default
    if isinstance(tokens, bool) or not isinstance(tokens, int) or tokens < 1:
        raise ConfigError("model.mm_tokens_per_image", tokens, "a positive integer")
    fields = dict(vision_tower="siglip", vision_hidden_size=r.int("hidden_size"),
                  vision_num_layers=r.int("num_hidden_layers"), vision_num_heads=r.int("num_attention_heads"),
                  vision_intermediate_size=r.int("intermediate_size"), vision_patch_size=r.int("patch_size"),
                  vision_image_size=r.int("image_size"), vision_tokens_per_image=tokens)
    return fields, [f"vision_config.{k}" for k in sorted(vc) if k not in _SIGLIP_KEYS]


def _llama4_vision(config: dict) -> tuple[dict[str, Any], list[str]]:
    """Llama 4 (transformers 5.23 Llama4VisionModel, Llama4MultiModalProjector): tiles of image_size pixels, a
    pixel shuffle of ratio r (1 / r patches a side folded into one token), the adapter MLP and the projector of
    projector width; the widths the model chains must agree."""
    vc = _vision_config(config)
    r = _VisionReader(vc, _LLAMA4_VISION, "llama4_vision_model")
    _channels(r, "num_channels")
    ratio = r.number("pixel_shuffle_ratio", 0.5)
    merge = round(1 / ratio) if ratio else 0
    if not ratio or merge < 1 or abs(merge * ratio - 1) > 1e-9:
        raise r._error("pixel_shuffle_ratio", ratio, "1 / n for a whole n (0.5: 2 x 2 patches a token)")
    hidden, inner, width = r.int("hidden_size"), r.int("intermediate_size"), r.int("projector_input_dim")
    if inner != hidden * merge * merge:
        raise r._error("intermediate_size", inner, f"hidden_size x (1 / pixel_shuffle_ratio)^2 ({hidden * merge * merge})",
                       "the adapter's first linear reads the pixel-shuffled patches (Llama4VisionMLP2 fc1)")
    for key in ("projector_output_dim", "vision_output_dim"):
        if r.int(key) != width:
            raise r._error(key, r.int(key), f"projector_input_dim ({width})", "the adapter's and the projector's "
                           "widths chain (Llama4VisionMLP2 fc2, Llama4MultiModalProjector linear_1)")
    if r.bool("multi_modal_projector_bias"):
        raise r._error("multi_modal_projector_bias", True, "false", "transformers 5.23 builds the projector without bias")
    fields = dict(vision_tower="llama4", vision_hidden_size=hidden, vision_num_layers=r.int("num_hidden_layers"),
                  vision_num_heads=r.int("num_attention_heads"), vision_intermediate_size=inner,
                  vision_patch_size=r.int("patch_size"), vision_image_size=r.int("image_size"),
                  vision_spatial_merge_size=merge, vision_projector_size=width)
    return fields, [f"vision_config.{k}" for k in sorted(vc) if k not in _LLAMA4_VISION_KEYS]


def vision_fields(config: dict, text_hidden: int) -> tuple[dict[str, Any], list[str]]:
    """The vision fields of a multimodal file, and the vision_config keys not read; none for a text model."""
    model_type = config.get("model_type")
    if "vision_config" not in config or model_type not in ("qwen2_5_vl", "gemma3", "llama4"):
        return {}, []
    if model_type == "qwen2_5_vl":
        return _qwen2_5_vl_vision(config, text_hidden)
    if model_type == "llama4":
        return _llama4_vision(config)
    return _siglip_vision(config)


def _qwen2_5_vl(r: _Reader) -> tuple[dict[str, Any], list[str]]:
    """Qwen2.5-VL's text model (transformers 5.23 Qwen2_5_VLTextModel): Qwen2's decoder, mrope positions."""
    return _llama_like(_Reader(r.config, "qwen2", r.prefix))


VISION_FAMILIES = {
    "qwen2_5_vl": Family(  # Qwen2_5_VLTextConfig
        build=_qwen2_5_vl,
        defaults=dict(vocab_size=152064, hidden_size=8192, intermediate_size=29568, num_hidden_layers=80,
                      num_attention_heads=64, num_key_value_heads=8, head_dim=None, max_position_embeddings=32768,
                      tie_word_embeddings=False, use_sliding_window=False, sliding_window=4096),
        keys=frozenset({'use_mrope', 'image_token_id', 'video_token_id', 'vision_start_token_id', 'vision_end_token_id',
                        'vision_token_id', 'mm_tokens_per_image'})),
}
FAMILIES.update(VISION_FAMILIES)
