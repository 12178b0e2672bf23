"""Vision-language models (issue 28) in the estimator: the HF mapping of vision_config, the vision tower's
weights by hand, what its blocks keep per patch by hand, the checks, the roofline's tower operations and
the breakdown's vision part."""

import json
from pathlib import Path

import pytest

from estimator import estimate_config, load_config
from estimator.memory.activations.vision import block_bytes_per_patch, tower_bytes_per_patch, vision_activation
from estimator.models.hf_config import architecture_from_hf_config
from estimator.models.presets import get_architecture
from estimator.spec.architecture import parameter_counts
from estimator.spec.errors import ConfigError
from estimator.spec.training import Training
from estimator.speed.roofline import roofline_config

QWEN_VL = json.loads((Path(__file__).parent / "data" / "hf_configs" / "qwen2.5-vl-7b-instruct.json").read_text())


def test_qwen2_5_vl_config_maps_its_vision_tower():
    arch, ignored = architecture_from_hf_config(QWEN_VL)
    assert ignored == []
    assert (arch.vision_tower, arch.vision_hidden_size, arch.vision_num_layers, arch.vision_num_heads) == \
        ("qwen2_5_vl", 1280, 32, 16)
    assert (arch.vision_intermediate_size, arch.vision_patch_size, arch.vision_temporal_patch_size) == (3420, 14, 2)
    assert (arch.vision_spatial_merge_size, arch.vision_window_size, arch.vision_full_attention_layers) == (2, 112, 4)
    assert arch.qkv_bias and arch.hidden_size == 3584 and arch.num_layers == 28


def test_qwen2_5_vl_7b_parameters_by_hand():
    """Written out: the ViT block (two norms, qkv and proj with biases, gated MLP with biases), the Conv3d
    patch embedding (no bias), the merger (norm, 5120 x 5120 and 3584 x 5120 with biases); the text model
    is Qwen2.5-7B's 7,615,616,512 (tests/test_presets.py). The sum is the checkpoint's index total
    (16,584,333,312 bytes / 2)."""
    c, f = 1280, 3420
    block = 2 * c + (3 * c * c + 3 * c) + (c * c + c) + 2 * (f * c + f) + (c * f + c)
    tower = 1280 * 3 * 2 * 14 * 14 + 32 * block + (c + 5120 * 5120 + 5120 + 3584 * 5120 + 3584)
    assert tower == 676_550_144
    arch = get_architecture("qwen2.5-vl-7b")
    assert sum(t.numel for t in arch.vision_tensors()) == tower
    assert parameter_counts(arch).total == 7_615_616_512 + tower == 8_292_166_656


def test_gemma3_maps_siglip_and_its_pooled_tokens():
    arch = get_architecture("gemma-3-27b")
    assert (arch.vision_tower, arch.vision_image_size, arch.vision_tokens_per_image) == ("siglip", 896, 256)
    assert parameter_counts(arch).total == 27_432_406_640  # the Hub's safetensors total, tower included


def test_a_qwen_vision_block_keeps_by_hand():
    """Per patch, bf16: two eager RMSNorms (fp32 copy 4c, rsqrt 4, normalised 2c, output 2c), q and k after
    rope (2 x 2c), the qkv output (6c: v is a view of it), the attention output (2c), the fp32 lse (4 x 16
    heads), gate, SiLU, up and product (4 x 2f)."""
    arch = get_architecture("qwen2.5-vl-7b")
    c, f = 1280, 3420
    assert block_bytes_per_patch(arch, 2) == 2 * (8 * c + 4) + 12 * c + 64 + 8 * f == 63_272
    # the tower: fp32 pixels and their bf16 copy (1176 per patch), cos and sin (2 x 4 x 80), the merger
    assert tower_bytes_per_patch(arch, 2) == 6 * 1176 + 640 + (4 * c + 4 + 8 * c)
    training = Training(seq_len=4096, images_per_sample=2, image_size=896, attention="flash")
    total, formula = vision_activation(arch, training)
    assert total == 2 * 64 * 64 * (32 * 63_272 + 6 * 1176 + 640 + 12 * c + 4)
    assert "8,192 patches" in formula
    recomputed, _ = vision_activation(arch, Training(seq_len=4096, images_per_sample=2, image_size=896,
                                                     recompute="full"))
    assert recomputed == 2 * 64 * 64 * (32 * 2 * c + 6 * 1176 + 640 + 12 * c + 4)


def _config(**training):
    return {"model": "qwen2.5-vl-7b", "training": dict(dict(seq_len=4096, images_per_sample=2, image_size=896,
                                                            framework="hf", param_dtype="bf16"), **training)}


def test_the_breakdown_names_the_vision_tower():
    result = estimate_config(_config())
    stage = result.stages[0]
    forward = next(p for p in stage.phases if p.name == "forward")
    activations = next(c for c in forward.components if c.key == "activations")
    part = next(p for p in activations.parts if p.label == "vision tower")
    arch = get_architecture("qwen2.5-vl-7b")
    assert part.bytes == vision_activation(arch, load_config(_config()).training)[0]
    assert "vision tower" in activations.source
    without = estimate_config(_config(images_per_sample=0))
    assert result.allocated_peak_bytes - without.allocated_peak_bytes == part.bytes


@pytest.mark.parametrize("training, field", [
    (dict(images_per_sample=5), "training.images_per_sample"),  # 5 x 1024 tokens > 4096
    (dict(image_size=900), "training.image_size"),  # not a multiple of 28
    (dict(image_size=None), "training.image_size"),  # Qwen2.5-VL takes any size: it must be given
    (dict(attention="eager"), "training.attention"),
    (dict(mode="inference"), "training.images_per_sample"),
])
def test_bad_image_settings_name_the_field(training, field):
    with pytest.raises(ConfigError) as err:
        estimate_config(_config(**training))
    assert err.value.field == field


def test_images_need_a_tower_whose_activations_are_modelled():
    with pytest.raises(ConfigError) as err:
        estimate_config({"model": "llama-3.1-8b", "training": {"images_per_sample": 1, "image_size": 448}})
    assert err.value.field == "training.images_per_sample"
    with pytest.raises(ConfigError) as err:
        estimate_config({"model": "gemma-3-27b", "training": {"images_per_sample": 1, "image_size": 448}})
    assert err.value.field in ("training.images_per_sample", "training.image_size")


def test_the_roofline_runs_the_tower_on_the_first_stage():
    """One micro-batch of 2 images of 896 px: 8,192 patches; qkv is 2 x 8192 x 1280 x 3840 per block, 32 blocks;
    the full-attention blocks attend over the image's 4,096 patches, the window blocks over 8 x 8 = 64."""
    ops = {op.name: op for op in roofline_config(load_config(_config())).operations if op.scope == "vision tower"}
    assert ops["vision qkv"].flops == 2 * 8192 * 1280 * 3840 * 32
    assert ops["vision attention core (full)"].flops == 4 * 8192 * 4096 * 1280 * 4
    assert ops["vision attention core (window)"].flops == 4 * 8192 * 64 * 1280 * 28
    assert ops["vision merger fc2"].flops == 2 * 2048 * 5120 * 3584
    with_images = roofline_config(load_config(_config())).stage_times_s[0]
    assert with_images > roofline_config(load_config(_config(images_per_sample=0))).stage_times_s[0]
