"""A vision-language model served by SGLang 0.5.23 (issue 24): what its start-up accounting does differently.

SGLang runs no encoder pass before sizing its pools (mem_cache/kv_cache_configurator.py _profile_available_bytes
measures the memory free after loading; the vision encoder first runs on a request, inside the memory left
outside mem_fraction_static). What a VLM changes, when SGLang serves its images (ModelConfig.is_multimodal):
- the default share is lowered by the tower's size (arg_groups/memory_hook.py adjust_mem_fraction_for_vlm);
- the prefill CUDA graphs are off unless the architecture is allow-listed (arg_groups/cuda_graph_hook.py,
  "multimodal model"; configs/model_config.py multimodal_breakable_cuda_graph_supported_model_archs), and with
  them their reserve (memory_hook.py reserve_for_graph_mb);
- SGLANG_VLM_CACHE_SIZE_MB (100) of the pools' budget is held for the embedding cache
  (kv_cache_configurator.py mm_runtime_reservation_gb; single-node feature transport is "cpu", which adds no
  pool: serving_hook.py handle_multimodal_feature_transport).
Served or not, the tower's weights are loaded (with_tower).
"""

from __future__ import annotations

from dataclasses import replace

from ..spec.architecture import Architecture
from .encoder import encoder_weights

VLM_CACHE_MIB = 100  # environ.py SGLANG_VLM_CACHE_SIZE_MB: held out of a multimodal model's KV budget
# configs/model_config.py: multimodal is off unless --enable-multimodal for these architectures
MULTIMODAL_OFF = ("Gemma3ForConditionalGeneration", "Llama4ForConditionalGeneration", "Step3VLForConditionalGeneration",
                  "InklingForConditionalGeneration")
# configs/model_config.py multimodal_breakable_cuda_graph_supported_model_archs: served multimodal, these keep the
# prefill graphs (the breakable backend, CUDA's default)
PREFILL_GRAPHS_KEPT = frozenset({
    "MiniMaxM3SparseForConditionalGeneration", "Cohere2VisionForConditionalGeneration",
    "Glm5NextForConditionalGeneration", "InternS2MobiusForConditionalGeneration", "PaddleOCRVLForConditionalGeneration",
    "Qwen3_5ForConditionalGeneration", "Qwen3_5MoeForConditionalGeneration", "Qwen4ExpForConditionalGeneration",
    "MuseGlimmerForConditionalGeneration", "MuseSparkForConditionalGeneration", "KimiK3ForConditionalGeneration",
    "KimiK25ForConditionalGeneration"})


def _architecture(checkpoint: dict | None) -> str:
    return ((checkpoint or {}).get("architectures") or [""])[0]


def multimodal(checkpoint: dict | None, enabled: bool | None = None) -> bool:
    """SGLang serves the checkpoint's vision tower (ModelConfig.is_multimodal): --enable-multimodal when given
    (serving.enable_multimodal), else on unless the architecture is in MULTIMODAL_OFF."""
    if (checkpoint or {}).get("vision_config") is None:
        return False
    return _architecture(checkpoint) not in MULTIMODAL_OFF if enabled is None else enabled


def prefill_graphs_kept(checkpoint: dict | None, enabled: bool | None = None) -> bool:
    """Whether the prefill CUDA graphs (and their reserve) stay: always for a model served text-only."""
    return not multimodal(checkpoint, enabled) or _architecture(checkpoint) in PREFILL_GRAPHS_KEPT


def vision_layers(vision: dict) -> int:
    """The tower's depth as SGLang reads it, getattr(vision_config, "num_hidden_layers", 24): transformers maps
    that name to Qwen2.5-VL's "depth" (configuration_qwen2_5_vl.py attribute_map)."""
    return vision.get("num_hidden_layers", vision.get("depth", 24))


def vlm_fraction(fraction: float, checkpoint: dict | None, enabled: bool | None = None) -> float:
    """A served vision-language model's default share, lowered by its vision tower's size (memory_hook.py
    adjust_mem_fraction_for_vlm): x 0.95 x clamp(1 - 0.1 x (layers x hidden^2 / (24 x 1024^2) - 1), 0.8,
    1.05), the tower's layers and width from vision_config (24 and 1024 when absent)."""
    if not multimodal(checkpoint, enabled):
        return fraction
    vision = checkpoint["vision_config"]
    ratio = vision_layers(vision) * vision.get("hidden_size", 1024) ** 2 / (24 * 1024**2)
    return fraction * 0.95 * max(0.8, min(1.05, 1.0 - 0.1 * (ratio - 1.0)))


def with_tower(arch: Architecture, weights, tp: int, dtype_bytes: int):
    """A vision-language model's tower and projector on every rank, served or not: SGLang 0.5.23 builds them in
    the model's __init__ with no pipeline or --enable-multimodal check (models/gemma3_mm.py vision_tower and
    multi_modal_projector, models/qwen2_5_vl.py visual), so they are loaded and lie in the static share. Their
    linears split over TP as vLLM's do (models/siglip.py; layers/attention/vision.py VisionAttention's
    QKVParallelLinear and RowParallelLinear; qwen2_5_vl.py's MLP and merger; --mm-enable-dp-encoder, off by
    default, would replicate them), in the model's dtype (serving/encoder.py encoder_weights)."""
    if arch.vision_tower is None:
        return weights
    return replace(weights, bytes=weights.bytes + encoder_weights(arch, tp, dtype_bytes),
                   formula=f"{weights.formula} + vision encoder (its linears / TP)")
