"""The vision-language architectures measured: each model's published config.json (tests/data/hf_configs/,
the same files the parameter-count tests build) and its canonical architecture object with the vision fields
issue 28 adds (`vision_*`, estimator/spec/vision.py)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

HF_CONFIGS = Path(__file__).resolve().parents[2] / "tests" / "data" / "hf_configs"


@dataclass(frozen=True)
class VisionModel:
    id: str
    hf: dict  # the config.json keys (model_type included)
    canonical: dict  # the contract's architecture object

    def hf_config(self, attn_implementation: str):
        """`attn_implementation` throughout; under SDPA the step then sends the vision tower to
        flash_attention_2 (validation/vlm/vision.py vision_emulation: transformers refuses that name at
        build time without the flash-attn package)."""
        from transformers import AutoConfig

        config = AutoConfig.for_model(**self.hf)
        config._attn_implementation = attn_implementation
        config.use_cache = False  # the Trainer's setting: no cache in training
        config.text_config.use_cache = False
        return config

    def architecture(self) -> dict:
        return dict(self.canonical, name=self.id)


def _published(name: str) -> dict:
    return json.loads((HF_CONFIGS / f"{name}.json").read_text())


def _qwen2_5_vl(hf: dict) -> dict:
    """Qwen2.5-VL: Qwen2's decoder (qkv biases) and a ViT of RMSNorm blocks with window attention, a 2x2
    patch merger (estimator/spec/vision.py)."""
    vc = hf["vision_config"]
    return dict(
        hidden_size=hf["hidden_size"], num_layers=hf["num_hidden_layers"], num_attention_heads=hf["num_attention_heads"],
        num_kv_heads=hf["num_key_value_heads"], intermediate_size=hf["intermediate_size"], vocab_size=hf["vocab_size"],
        tie_embeddings=hf["tie_word_embeddings"], qkv_bias=True,
        vision_tower="qwen2_5_vl", vision_hidden_size=vc["hidden_size"], vision_num_layers=vc["depth"],
        vision_num_heads=vc["num_heads"], vision_intermediate_size=vc["intermediate_size"],
        vision_patch_size=vc["patch_size"], vision_temporal_patch_size=vc["temporal_patch_size"],
        vision_spatial_merge_size=vc["spatial_merge_size"], vision_window_size=vc["window_size"],
        vision_full_attention_layers=len(vc["fullatt_block_indexes"]))


def _gemma3(hf: dict) -> dict:
    """Gemma 3: Gemma 3's text decoder (q/k norms, 4 norms a layer, (1 + w) RMSNorms, 5 sliding-window layers to
    each global one, tied 262k vocabulary) and SigLIP without its head, pooled to mm_tokens_per_image."""
    t, vc = dict(GEMMA_3_4B_TEXT, **hf["text_config"]), hf["vision_config"]
    return dict(
        hidden_size=t["hidden_size"], num_layers=t["num_hidden_layers"], num_attention_heads=t["num_attention_heads"],
        num_kv_heads=t["num_key_value_heads"], head_dim=t["head_dim"], intermediate_size=t["intermediate_size"],
        vocab_size=t.get("vocab_size", 262208), tie_embeddings=True, qk_norm=True, norms_per_layer=4,
        sliding_window=t["sliding_window"], sliding_window_pattern=6, norm_unit_offset=True,
        vision_tower="siglip", vision_hidden_size=vc["hidden_size"], vision_num_layers=vc["num_hidden_layers"],
        vision_num_heads=vc["num_attention_heads"], vision_intermediate_size=vc["intermediate_size"],
        vision_patch_size=vc["patch_size"], vision_image_size=vc["image_size"],
        vision_tokens_per_image=hf["mm_tokens_per_image"])


def _llama4(hf: dict) -> dict:
    """Llama 4 Scout: its language model (validation/llama4/models.py) and its tiled ViT, pixel-shuffle adapter and
    projector (estimator/spec/vision.py)."""
    from ..llama4.models import _llama4_text

    vc = hf["vision_config"]
    return dict(_llama4_text(hf["text_config"]), vision_tower="llama4", vision_hidden_size=vc["hidden_size"],
                vision_num_layers=vc["num_hidden_layers"], vision_num_heads=vc["num_attention_heads"],
                vision_intermediate_size=vc["intermediate_size"], vision_patch_size=vc["patch_size"],
                vision_image_size=vc["image_size"], vision_spatial_merge_size=round(1 / vc["pixel_shuffle_ratio"]),
                vision_projector_size=vc["projector_input_dim"])


QWEN2_5_VL_7B = _published("qwen2.5-vl-7b-instruct")
GEMMA_3_27B = _published("gemma-3-27b-pt")
GEMMA_3_4B = _published("gemma-3-4b-it")
# Gemma3TextConfig's defaults the 4B file leaves out (transformers 5.23 configuration_gemma3.py)
GEMMA_3_4B_TEXT = dict(num_attention_heads=8, num_key_value_heads=4, head_dim=256)
TINY_GEMMA_3 = dict(GEMMA_3_27B, mm_tokens_per_image=4,
                    text_config=dict(GEMMA_3_27B["text_config"], hidden_size=64, num_hidden_layers=6,
                                     num_attention_heads=4, num_key_value_heads=2, head_dim=16, intermediate_size=96,
                                     query_pre_attn_scalar=16, sliding_window=32),
                    vision_config=dict(GEMMA_3_27B["vision_config"], hidden_size=32, intermediate_size=48,
                                       num_attention_heads=2, num_hidden_layers=2, image_size=56))
TINY_QWEN2_5_VL = dict(QWEN2_5_VL_7B, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                       intermediate_size=128, vocab_size=152064, max_position_embeddings=4096,
                       rope_scaling={"type": "mrope", "mrope_section": [2, 3, 3]},
                       vision_config=dict(QWEN2_5_VL_7B["vision_config"], depth=4, hidden_size=64, num_heads=4,
                                          intermediate_size=96, out_hidden_size=64, fullatt_block_indexes=[1, 3]))

def _llama4_published() -> dict:
    from ..llama4.models import text_config_keys

    hf = _published("llama-4-scout-17b-16e")
    return dict({k: v for k, v in hf.items() if k not in ("architectures", "transformers_version")},
                text_config=text_config_keys(hf))


LLAMA_4_SCOUT = _llama4_published()
TINY_LLAMA_4 = dict(LLAMA_4_SCOUT, text_config=dict(LLAMA_4_SCOUT["text_config"], hidden_size=64, num_hidden_layers=2,
                                                    num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                                                    intermediate_size=96, intermediate_size_mlp=128, vocab_size=201000,
                                                    num_local_experts=4, attention_chunk_size=64, moe_layers=[0, 1],
                                                    no_rope_layers=[1, 0], max_position_embeddings=16384),
                    vision_config=dict(LLAMA_4_SCOUT["vision_config"], hidden_size=32, intermediate_size=128,
                                       num_attention_heads=2, num_hidden_layers=2, image_size=56,
                                       projector_input_dim=48, projector_output_dim=48, vision_output_dim=48))

MODELS = {m.id: m for m in [
    VisionModel("qwen2.5-vl-7b", QWEN2_5_VL_7B, _qwen2_5_vl(QWEN2_5_VL_7B)),
    VisionModel("tiny-qwen2.5-vl", TINY_QWEN2_5_VL, _qwen2_5_vl(TINY_QWEN2_5_VL)),
    VisionModel("gemma-3-27b", GEMMA_3_27B, _gemma3(GEMMA_3_27B)),
    VisionModel("gemma-3-4b", GEMMA_3_4B, _gemma3(GEMMA_3_4B)),
    VisionModel("tiny-gemma-3", TINY_GEMMA_3, _gemma3(TINY_GEMMA_3)),
    VisionModel("llama-4-scout-vl", LLAMA_4_SCOUT, _llama4(LLAMA_4_SCOUT)),
    VisionModel("tiny-llama-4-vl", TINY_LLAMA_4, _llama4(TINY_LLAMA_4)),
]}

# The measured runs, as validation/hf/step.Run's arguments (registered in validation/hf/cases.py)
VISION_RUNS = [
    (("qwen2.5-vl-7b", 4096), {"images": 2, "image_size": 896}),
    (("qwen2.5-vl-7b", 8192), {"images": 2, "image_size": 1344, "recompute": "full"}),
    (("qwen2.5-vl-7b", 2048, 2), {"images": 4, "image_size": 448}),
    (("gemma-3-27b", 2048), {"images": 2, "image_size": 896}),
    (("gemma-3-27b", 4096), {"images": 4, "image_size": 896, "recompute": "full"}),
    # Gemma 3 4B: the tower is a larger share of the step
    (("gemma-3-4b", 2048, 2), {"images": 4, "image_size": 896}),
    (("gemma-3-4b", 4096), {"images": 8, "image_size": 896, "recompute": "full"}),
    # Llama 4 Scout: 672 px images on 2 x 2 tiles and the global one (5 x 577 positions, 720 tokens each)
    (("llama-4-scout-vl", 4096), {"images": 2, "image_size": 672}),
    (("llama-4-scout-vl", 4096), {"images": 1, "image_size": 1344, "recompute": "full"}),
    # the encoder frozen, the merger / projector trained
    (("qwen2.5-vl-7b", 4096), {"images": 2, "image_size": 896, "freeze_vision": True}),
    (("gemma-3-27b", 2048), {"images": 2, "image_size": 896, "freeze_vision": True}),
    (("llama-4-scout-vl", 2048), {"images": 2, "image_size": 336, "freeze_vision": True}),
    # Qwen2.5-VL's tower on SDPA, what the H200 ran (no flash-attn there; validation/gpu/measure.py
    # vision_attention): its four GPU records are held to these
    (("qwen2.5-vl-7b", 4096), {"images": 2, "image_size": 896, "vision_attention": "sdpa"}),
    (("qwen2.5-vl-7b", 2048, 2), {"images": 4, "image_size": 448, "vision_attention": "sdpa"}),
    (("qwen2.5-vl-7b", 8192), {"images": 2, "image_size": 1344, "recompute": "full", "vision_attention": "sdpa"}),
    (("qwen2.5-vl-7b", 4096), {"images": 2, "image_size": 896, "freeze_vision": True, "vision_attention": "sdpa"}),
]

KERNELS = {
    "gemma-3-27b": "the decoder and the SigLIP tower through flash-attn's kernel (flash_attention_2, emulated as "
                   "PyTorch's FlashAttention-2 path: the sliding window changes no allocation), no token_type_ids "
                   "(the images attend causally, so no 4-D mask)",
    "qwen2.5-vl-7b": "the vision tower's window and full attention through flash-attn's variable-length kernel "
                     "(flash_attention_2, emulated: Dao-AILab/flash-attention v2.7 flash_attn_interface.py "
                     "FlashAttnVarlenFunc)",
}
KERNELS["gemma-3-4b"] = KERNELS["gemma-3-27b"]
# the tower on SDPA (validation/vlm/vision.py vision_emulation, attention "sdpa")
SDPA_VISION = {
    "qwen2.5-vl-7b": "the vision tower on SDPA, as transformers runs it without flash-attn (modeling_qwen2_5_vl.py "
                     "Qwen2_5_VLVisionAttention: one unmasked call per window or image, through PyTorch's "
                     "FlashAttention-2 path, the outputs concatenated for the output projection)",
    # a GPU run's description only: the harness refuses it (vision_emulation)
    "gemma-3-27b": "the SigLIP tower and the decoder on SDPA, as transformers runs them without flash-attn (the "
                   "decoder's sliding-window layers with a 4-D mask, SDPA's masked path, which the fake-tensor harness "
                   "does not emulate), no token_type_ids",
}
SDPA_VISION["gemma-3-4b"] = SDPA_VISION["gemma-3-27b"]
KERNELS["llama-4-scout-vl"] = ("the tower's 34 blocks through SDPA's FlashAttention-2 path (unmasked, non-causal: the "
                               "harness's emulation), the decoder's chunked layers under the 8192-token chunk on the "
                               "flash path too, every token through all 16 experts (transformers 5.23 Llama4TextMoe)")
