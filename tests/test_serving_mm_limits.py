"""serving.limit_mm_per_prompt (vLLM --limit-mm-per-prompt, issue 24): the field's form and refusals, and its effect
on the encoder's profile and the tower's weights by release. vLLM's own budget under these limits is held in
tests/test_serving_qwen_vl.py (records from validation/vllm/mm_records.py)."""

from __future__ import annotations

import pytest

from estimator.models.presets import get_architecture, get_hf_config
from estimator.serving.encoder import encoder_profile, encoder_weights, modality_limits, tower_built
from estimator.serving.sglang_engine import estimate_sglang
from estimator.serving.vllm_engine import estimate_vllm
from estimator.spec.errors import ConfigError
from estimator.spec.hardware import Hardware
from estimator.spec.mm_limits import parse_limits
from estimator.spec.parallel import Parallel
from estimator.spec.serving import Serving

CUBLAS_HOPPER = 4096 * 8 * 1024  # torch CublasHandlePool.cpp, compute capability 9.x

QWEN, GEMMA = get_architecture("qwen2.5-vl-7b"), get_architecture("gemma-3-27b")
C, F = 1280, 3420  # Qwen2.5-VL's vision hidden and MLP widths (config.json)
PIXELS = 3 * 2 * 14 * 14


def _serve(model, version, limits):
    return estimate_vllm(get_architecture(model), Serving(engine_version=version, limit_mm_per_prompt=limits),
                         Parallel(), Hardware("h100-80"), get_hf_config(model))


def test_parse_and_defaults():
    assert parse_limits("image=1,video=0") == {"image": 1, "video": 0}
    assert parse_limits(None) == {}
    assert modality_limits(QWEN, "video=0") == {"image": 999, "video": 0}  # vLLM's default: 999 per modality
    assert modality_limits(GEMMA, "image=2,video=0") == {"image": 2}  # video=0 asks what Gemma 3 does anyway


@pytest.mark.parametrize("text, why", [
    ("image=1,image=2", "'image' is named twice"),
    ("image:1", "modality=count pairs"),
    ("image=-1", "modality=count pairs"),
    ("audio=1", "modality=count pairs"),
    ("image=1,", "modality=count pairs"),
])
def test_bad_text_is_refused_naming_the_field(text, why):
    with pytest.raises(ConfigError) as err:
        Serving(limit_mm_per_prompt=text)
    assert "Multimodal items per prompt" in str(err.value) and why in str(err.value)


def test_limits_the_model_cannot_take_are_refused():
    with pytest.raises(ConfigError, match="gemma-3-27b takes no video input; allowed: limits above 0 for image"):
        modality_limits(GEMMA, "video=1")
    with pytest.raises(ConfigError, match="llama-3.1-8b takes no image input; allowed: empty for a text-only"):
        _serve("llama-3.1-8b", "0.33", "image=1")
    with pytest.raises(ConfigError, match="SGLang profiles no encoder"):
        estimate_sglang(GEMMA, Serving(engine="sglang", limit_mm_per_prompt="image=1"), Parallel(), Hardware("h100-80"),
                        get_hf_config("gemma-3-27b"))


def test_video_off_profiles_one_image_at_128k():
    """The usual workaround: at the checkpoint's 128,000 tokens the 14-frame video (7 x 65,536 patches) is profiled
    by default; with video=0 one 3,584 x 3,584 image of 65,536 patches is (budget max(8192, 16,384) = 16,384: one
    item). 0.33's moment per patch: the pixels, 2c and the MLP's 3f (> 7c), in bf16. One image's tower pass (1.8
    GiB) is now below its cache (16,384 output rows of 3,584 and the pixels, in bf16) held over the decoder's own
    profile (the text-only peak, every modality at 0)."""
    full, image = _serve("qwen2.5-vl-7b", "0.33", None), _serve("qwen2.5-vl-7b", "0.33", "image=1,video=0")
    text = _serve("qwen2.5-vl-7b", "0.33", "image=0,video=0").stages[0].activation
    per_patch = PIXELS * 2 + 2 * C * 2 + 3 * F * 2
    assert full.stages[0].activation == 7 * 65536 * per_patch + CUBLAS_HOPPER  # the tower's first GEMM allocates it
    cache = 16384 * 3584 * 2 + 65536 * PIXELS * 2
    assert image.stages[0].activation == cache + text > 65536 * per_patch
    assert image.stages[0].weights == full.stages[0].weights  # the tower is still built
    assert image.capacity.tokens > full.capacity.tokens


def test_per_prompt_limit_caps_the_items():
    """max_model_len 131,072 and a 262,144-token budget: 16 images by the budget, max_model_len // 16,384 = 8 per
    prompt, but image=3: 3 images a sequence (vLLM: tests/data/serving/vlm, the image=3 case), at most 16."""
    limits = modality_limits(QWEN, "image=3,video=0")
    assert encoder_profile(QWEN, 262144, 1, 131072, 1, 2, "0.33", limits).items == 3
    assert encoder_profile(QWEN, 262144, 2, 131072, 1, 2, "0.33", limits).items == 6
    assert encoder_profile(QWEN, 262144, 4, 131072, 1, 2, "0.33", limits).items == 12
    assert encoder_profile(QWEN, 262144, 8, 131072, 1, 2, "0.33", limits).items == 16  # the budget: 262,144 / 16,384


@pytest.mark.parametrize("model, version, dropped", [
    ("qwen2.5-vl-7b", "0.11", True),  # qwen2_5_vl.py: self.visual = None
    ("qwen2.5-vl-7b", "0.33", True),  # _mark_tower_model
    ("gemma-3-27b", "0.11", False),  # gemma3_mm.py builds SigLIP regardless
    ("gemma-3-27b", "0.20", False),  # between the releases read: 0.11's rule
    ("gemma-3-27b", "0.33", True),
])
def test_every_modality_off_skips_the_profile_and_maybe_the_tower(model, version, dropped):
    arch = get_architecture(model)
    off = "image=0,video=0" if model.startswith("qwen") else "image=0"
    limits = modality_limits(arch, off)
    assert encoder_profile(arch, 8192, 256, 32768, 1, 2, version, limits) is None
    assert tower_built(arch, limits, version) is not dropped
    full, text = _serve(model, version, None), _serve(model, version, off)
    tower = encoder_weights(arch, 1, 2)
    assert full.stages[0].weights - text.stages[0].weights == (tower if dropped else 0)
    assert "encoder" not in {c.key: c for c in text.stages[0].components}["activation_peak"].formula


def test_vllm_records_hold_each_limit_for_both_releases():
    """vLLM's own budget under each limit (validation/vllm/mm_records.py) is held case by case in
    tests/test_serving_qwen_vl.py test_profile_item_matches_vllm; here: both releases ran every limit."""
    import json
    from pathlib import Path
    seen = {}
    for path in (Path(__file__).parent / "data" / "serving" / "vlm").glob("vllm-*-qwen2.5-vl.json"):
        data = json.loads(path.read_text())
        seen[data["vllm_version"]] = {r["case"]["limit_mm_per_prompt"] for r in data["records"]}
    assert seen["0.11.0"] == seen["0.33.0"] == {None, "image=1,video=0", "image=3,video=0", "image=0",
                                                "image=0,video=0"}


def test_the_fields_round_trip_through_the_url_and_config():
    """The registry's fields: a URL parameter each, the config's serving object back."""
    from ui import fields
    model = fields.ModelChoice(source="preset", preset="qwen2.5-vl-7b")
    for serving, param in (({"limit_mm_per_prompt": "image=1,video=0"}, ("limit_mm_per_prompt", "image=1,video=0")),
                           ({"engine": "sglang", "enable_multimodal": False}, ("enable_multimodal", "false"))):
        values = fields.ui_values_from_config({"model": "qwen2.5-vl-7b", "serving": serving})
        assert fields.url_params(model, values)[param[0]].lower() == param[1]
        assert fields.sections_from_ui(values)["serving"] == serving
