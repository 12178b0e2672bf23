"""Qwen2.5-VL served by vLLM (issue 24): the profiling run's dummy item, by hand and against what vLLM's own code
computes on CPU (tests/data/serving/vlm/vllm-*-qwen2.5-vl.json, made by validation/vllm/mm_records.py), the
tower's weights over TP and its share of the profile by release."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from estimator.models.presets import get_architecture, get_hf_config
from estimator.serving import qwen_vl_profile as qwen
from estimator.serving.encoder import encoder_profile, encoder_weights, modality_limits
from estimator.serving.vllm_engine import estimate_vllm
from estimator.spec.hardware import Hardware
from estimator.spec.parallel import Parallel
from estimator.spec.serving import Serving

CUBLAS_HOPPER = 4096 * 8 * 1024  # torch CublasHandlePool.cpp, compute capability 9.x

DATA = Path(__file__).parent / "data" / "serving" / "vlm"
ARCH = get_architecture("qwen2.5-vl-7b")
C, F, D = 1280, 3420, 3584  # vision hidden, vision MLP, text hidden (the checkpoint's config.json)
PIXELS = 3 * 2 * 14 * 14  # a patch: RGB x 2 frames x 14 x 14


@pytest.mark.parametrize("max_model_len, frames, patches", [
    (128000, 14, 7 * 256 * 256),  # 15 frames pad to 16: 8 x 16,384 = 131,072 tokens > 128,000
    (65536, 8, 4 * 256 * 256),
    (32768, 4, 2 * 256 * 256),
    (16384, 1, 256 * 256),  # a 2-frame video has the image's 16,384 tokens: either is profiled
])
def test_dummy_item_by_hand(max_model_len, frames, patches):
    """max_pixels 12,845,056 = 16,384 x 28^2: the squarest pair 128 x 128 merged patches, 3,584 x 3,584 pixels,
    (3584 / 14)^2 = 65,536 patches a frame pair; the most frames whose tokens (patches / 4) fit max_model_len,
    at most 14."""
    item = qwen.dummy_item(ARCH, max_model_len)
    assert (item.width, item.height) == (3584, 3584)
    assert (item.frames, item.patches, item.tokens) == (frames, patches, patches // 4)


def _records():
    for path in sorted(DATA.glob("vllm-*-qwen2.5-vl.json")):
        data = json.loads(path.read_text())
        assert "-m validation.vllm.mm_records --out" in data["command"]
        for record in data["records"]:
            yield pytest.param(data["vllm_version"], record,
                               id=f"{data['vllm_version']}-len{record['case']['max_model_len']}")


@pytest.mark.parametrize("version, record", list(_records()))
def test_profile_item_matches_vllm(version, record):
    """Our items, tokens, budget and the tower's input rows against vLLM's budget and its dummy item as
    transformers' processor turns it into patches, under each case's --limit-mm-per-prompt."""
    case, vllm = record["case"], record["vllm"]
    limits = modality_limits(ARCH, case["limit_mm_per_prompt"])
    ours = encoder_profile(ARCH, case["max_num_batched_tokens"], case["max_num_seqs"], case["max_model_len"], 1, 2,
                           version, limits)
    if vllm["profiled_modality"] is None:  # every modality at 0: an empty budget, no encoder profile
        assert ours is None and vllm["encoder_budget"] == vllm["items_per_batch"] == 0
        return
    item = qwen.dummy_item(ARCH, case["max_model_len"], frozenset(m for m, n in limits.items() if n))
    assert ours.tokens_per_item == vllm["item_tokens"] == max(vllm["max_tokens_per_item"].values())
    assert (ours.items, ours.budget) == (vllm["items_per_batch"], vllm["encoder_budget"])
    assert item.patches == vllm["pixel_rows"] and vllm["pixel_row_values"] == PIXELS
    # the processor's float32 rows, which vLLM casts to the model dtype (processing.py _postprocess_output)
    assert [item.width, item.height] == vllm["width_height"] and vllm["processor_pixel_dtype"] == "float32"
    if item.modality in ("video", "image"):
        assert (vllm["profiled_modality"], vllm["frames"]) == (item.modality, item.frames)


def test_records_cover_both_releases_and_a_tie():
    records = [(v, r["vllm"]) for v, r in (p.values for p in _records()) if r["case"]["limit_mm_per_prompt"] is None]
    assert {v for v, _ in records} == {"0.11.0", "0.33.0"}
    ties = {v: r["profiled_modality"] for v, r in records if len(set(r["max_tokens_per_item"].values())) == 1}
    assert ties == {"0.11.0": "image", "0.33.0": "video"}  # 0.11: the first maximum; 0.33: the tie key


def test_forward_and_cache_by_hand():
    """max_model_len 65,536 with a 131,072-token budget: two 8-frame videos, 2 x 262,144 patches. Per patch the
    pixels (1,176 x 2 B, bf16 as vLLM casts them) and 2c x 2 B, then 0.11's rotary step (10c x 2 B + 4c x 4 B =
    46,080 B) and 0.33's MLP (3f x 2 B = 20,520 B > 7c x 2 B = 17,920 B). The cache: each video's 65,536 output
    rows of 3,584, 0.11 expanded to the budget's 131,072 rows, and the pixels."""
    old = encoder_profile(ARCH, 131072, 256, 65536, 1, 2, "0.11")
    new = encoder_profile(ARCH, 131072, 256, 65536, 1, 2, "0.33")
    patches = 2 * 4 * 256 * 256
    assert old.forward_bytes == patches * (PIXELS * 2 + 2 * C * 2 + 10 * C * 2 + 4 * C * 4)
    assert new.forward_bytes == patches * (PIXELS * 2 + 2 * C * 2 + 3 * F * 2)
    assert old.cache_bytes == 2 * 131072 * D * 2 + patches * PIXELS * 2
    assert new.cache_bytes == 2 * 65536 * D * 2 + patches * PIXELS * 2
    # TP 2 halves the block's projections, not the pixels or the residual
    half = encoder_profile(ARCH, 131072, 256, 65536, 2, 2, "0.33")
    assert half.forward_bytes == patches * (PIXELS * 2 + 2 * C * 2 + 3 * F * 2 // 2)


def test_tower_weights_over_tp():
    """Qwen2.5-VL's tower in vLLM (qwen2_5_vl.py): qkv, gate_up and the merger's fc1 split with their biases,
    proj, down and fc2 split their weights only; the Conv3d, the norms and the row-parallel biases stay whole."""
    layers, m = 32, 4 * C
    split = (layers * (3 * C * C + 3 * C + C * C + 2 * F * C + 2 * F + C * F) + m * m + m + D * m)
    whole = sum(t.numel for t in ARCH.vision_tensors()) - split
    assert whole == C * PIXELS + layers * (2 * C + C + C) + C + D  # patch embed, norms, proj/down biases, merger
    assert encoder_weights(ARCH, 1, 2) == 2 * (split + whole)
    assert encoder_weights(ARCH, 2, 2) == 2 * (split // 2 + whole)


def test_serving_qwen2_5_vl_by_release():
    """The preset is served (it was refused): at its 128,000-token context on an H100 the 14-frame video's tower
    pass sets the profile peak, 0.11's float32 rotation making it larger than 0.33's."""
    def serve(version):
        return estimate_vllm(ARCH, Serving(engine_version=version), Parallel(), Hardware("h100-80"),
                             get_hf_config("qwen2.5-vl-7b"))
    old, new = serve("0.11"), serve("0.33")
    patches = 7 * 256 * 256
    # + the cuBLAS workspace the tower's first GEMM allocates (serving/profile_buffers.py)
    assert old.stages[0].activation == patches * (PIXELS * 2 + 2 * C * 2 + 10 * C * 2 + 4 * C * 4) + CUBLAS_HOPPER
    assert new.stages[0].activation == patches * (PIXELS * 2 + 2 * C * 2 + 3 * F * 2) + CUBLAS_HOPPER
    assert "14-frame video" in {c.key: c for c in new.stages[0].components}["activation_peak"].formula
    assert new.capacity.tokens > old.capacity.tokens > 0
