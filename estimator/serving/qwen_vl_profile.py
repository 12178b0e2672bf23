"""Qwen2.5-VL's dummy multimodal item in vLLM's profiling run (issue 24), as vLLM 0.11 and 0.33 build it.

The item's size (model_executor/models/qwen2_vl.py Qwen2VLProcessingInfo, which Qwen2.5-VL inherits; 0.11.0 and
0.33.0 read): the image "with most features" fills the image processor's max_pixels, 12,845,056 in the
checkpoint's preprocessor_config.json (Qwen/Qwen2.5-VL-7B-Instruct; min_pixels 3,136): 0.33 factorises
max_pixels // 28^2 = 16,384 merged patches into the squarest pair (get_image_size_with_most_features:
128 x 128), 0.11 smart-resizes a 9,999,999-pixel square under max_pixels; both give 3,584 x 3,584, so
(3584 / 14)^2 = 65,536 patches and 16,384 tokens. The dummy video repeats that frame: _get_max_video_frames
takes the most frames whose tokens fit max_model_len (frames padded to the temporal patch of 2, each pair
65,536 patches), get_num_frames_with_most_features caps them at _MAX_FRAMES_PER_VIDEO = 14. The video is
profiled when it has more tokens than the image; with equal tokens (max_model_len under 32,768) the image and
a 2-frame video have the same patches (0.11 picks the image, the first maximum; 0.33's tie key picks the video).

The frames stay 3,584 x 3,584 through transformers' video processor: without a video_preprocessor_config.json
the checkpoint's preprocessor_config.json is its config (video_processing_utils.py falls back to
IMAGE_PROCESSOR_NAME), whose max_pixels becomes the per-frame size["longest_edge"] (Qwen2VLVideoProcessor
__init__), and cap_pixels_per_frame is off unless asked for (5.23). validation/vllm/mm_records.py runs vLLM's
functions and that processor on CPU and records the grid (tests/data/serving/vlm/vllm-*-qwen2.5-vl.json).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

QWEN_MAX_PIXELS = 12_845_056  # preprocessor_config.json max_pixels (Qwen/Qwen2.5-VL-7B-Instruct)
MAX_FRAMES_PER_VIDEO = 14  # qwen2_vl.py _MAX_FRAMES_PER_VIDEO (0.11.0, 0.33.0)
ASPECT_LIMIT = 200  # qwen2_vl.py get_image_size_with_most_features: no factor pair wider than 200:1


@dataclass(frozen=True)
class QwenDummyItem:
    modality: str  # "video", or "image or video" when both have the same tokens
    frames: int  # the dummy video's frames (1 for an image)
    width: int
    height: int
    patches: int  # the tower's input rows: grid_t x grid_h x grid_w
    tokens: int  # the decoder's placeholder tokens: patches / merge^2


def _squarest_pair(n: int) -> tuple[int, int]:
    for d in range(math.isqrt(n), 0, -1):
        if n % d == 0:
            return d, n // d
    return 1, n


def image_size_with_most_features(arch) -> tuple[int, int]:
    """(width, height) of the dummy image: max_pixels' merged patches as the squarest factor pair."""
    unit = arch.vision_patch_size * arch.vision_spatial_merge_size
    for merged in range(QWEN_MAX_PIXELS // (unit * unit), 0, -1):
        h, w = _squarest_pair(merged)
        if w / h <= ASPECT_LIMIT:
            return unit * w, unit * h
    return unit, unit


def _patches(arch, width: int, height: int, frames: int) -> int:
    tps = arch.vision_temporal_patch_size
    grid_t = max((frames + (-frames % tps)) // tps, 1)
    return grid_t * (height // arch.vision_patch_size) * (width // arch.vision_patch_size)


def dummy_item(arch, max_model_len: int, modalities: frozenset[str] = frozenset({"image", "video"})) -> QwenDummyItem:
    """The item vLLM's profile_run sends through the tower, for a max_model_len, among the modalities whose
    --limit-mm-per-prompt is above 0 (the budget drops the others: 0.11.0 multimodal/registry.py
    get_max_tokens_per_item_by_nonzero_modality, 0.33.0 multimodal/encoder_budget.py tower_modalities). The
    video's frames do not depend on the limits: each modality's largest item is asked for with one item each."""
    width, height = image_size_with_most_features(arch)
    merge = arch.vision_spatial_merge_size ** 2
    frames = 1
    while _patches(arch, width, height, frames + 1) // merge <= max_model_len:
        frames += 1
    frames = max(min(frames, MAX_FRAMES_PER_VIDEO), 1)
    video = _patches(arch, width, height, frames)
    image = _patches(arch, width, height, 1)
    if "video" in modalities and (video > image or "image" not in modalities):
        return QwenDummyItem("video", frames, width, height, video, video // merge)
    if "video" not in modalities:
        return QwenDummyItem("image", 1, width, height, image, image // merge)
    return QwenDummyItem("image or video", 1, width, height, image, image // merge)


def rotary_in_fp32(engine_version: str | None) -> bool:
    """0.11's apply_rotary_pos_emb_vision (qwen2_vl.py) rotates a float32 copy of q and k; 0.33's ApplyRotaryEmb
    (rotary_embedding/common.py, enable_fp32_compute off) rotates them in the model dtype. Keyed on 0.33, the
    release read after 0.11 (those between were not read). None: the newest release."""
    from ..spec.serving import version_tuple
    return engine_version is not None and version_tuple(engine_version)[:2] < (0, 33)


def forward_bytes_per_patch(arch, tp: int, act_bytes: int, fp32_rotary: bool) -> int:
    """The tower's moment per input patch (qwen2_5_vl.py Qwen2_5_VisionTransformer and its blocks): the pixels
    stay referenced by the batch, in the model dtype (vLLM casts the processor's float32 output to it:
    multimodal/processing.py _postprocess_output, 0.11.0; processing/context.py, 0.33.0); a block's input and its norm (2c; the MLP's fused add-norm writes in
    place) beside the larger of the MLP's gate_up and SiLU-and-mul output (3f / TP) and the attention at its
    rotary step (flash attention's varlen kernel keeps no scores): 0.11 holds qkv, contiguous q, k, v, their
    q-k concatenation and its rotated bf16 copy (10c / TP) plus the float32 copy and float32 rotation of q and
    k (2 x 2c x 4 B / TP); 0.33 holds qkv, the contiguous q-k pair and its rotation (7c / TP)."""
    c, f = arch.vision_hidden_size, arch.vision_intermediate_size
    pixels = 3 * arch.vision_temporal_patch_size * arch.vision_patch_size ** 2
    if fp32_rotary:
        attention = (10 * c * act_bytes + 2 * 2 * c * 4) // tp
    else:
        attention = 7 * c * act_bytes // tp
    return pixels * act_bytes + 2 * c * act_bytes + max(attention, 3 * f * act_bytes // tp)


def pixel_bytes(arch, patches: int, act_bytes: int) -> int:
    """The dummy batch's pixel rows, in the model dtype: referenced by profile_run until it returns."""
    return patches * 3 * arch.vision_temporal_patch_size * arch.vision_patch_size ** 2 * act_bytes
