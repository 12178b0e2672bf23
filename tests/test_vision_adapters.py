"""LoRA adapters inside a vision-language model's tower. peft matches target_modules by name suffix over the
whole model (peft 0.21.2 tuners/tuners_utils.py check_target_module_exists) and "all-linear" takes every
nn.Linear but the output embedding (_maybe_include_all_linear_layers), so the tower's linears whose names match
are adapted too. Counted here by hand from transformers 5.23's module names; the real wrap of each model
(validation/peft/vlm_wrap.py on the bundled configs) is tests/data/measured/peft_wrap/vlm-lora-wrap.json."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from estimator import estimate_config
from estimator.memory.adapters import vision_adapter_count
from estimator.models.loading import load_config

RECORD = Path(__file__).parent / "data" / "measured" / "peft_wrap" / "vlm-lora-wrap.json"
SEVEN = ["q", "k", "v", "o", "gate", "up", "down"]
TARGETS = {"qv": ["q", "v"], "seven": SEVEN, "all-linear": "all-linear"}


def config(model: str, targets, rank: int = 16, **training) -> dict:
    return {"model": model, "training": {"framework": "hf", "seq_len": 4096, "training_loop": "plain", **training,
                                         "adapter": {"rank": rank, "target_modules": targets}}}


def vision_count(model: str, targets, **training) -> int:
    cfg = load_config(config(model, targets, **training))
    return vision_adapter_count(cfg.training.adapter, cfg.architecture, cfg.training.freeze_vision)


def test_siglip_q_and_v_adapters_by_hand():
    # Gemma 3's SigLIP (modeling_siglip.py SiglipAttention q_proj, v_proj): 27 blocks of width 1152
    assert vision_count("gemma-3-27b", ["q", "v"]) == 27 * 2 * 16 * (1152 + 1152) == 1_990_656
    # the decoder's: 62 layers, h 5376, q 32 x 128, v 16 x 128
    text = 62 * 16 * ((5376 + 4096) + (5376 + 2048))
    assert estimate_config(config("gemma-3-27b", ["q", "v"])).parameters_trainable == text + 1_990_656 == 18_751_488


def test_siglip_all_linear_takes_out_proj_and_the_mlp_but_not_the_projector_matrix():
    # q, k, v, out_proj (1152 -> 1152), fc1 (1152 -> 4304), fc2 (4304 -> 1152); Gemma3MultiModalProjector's
    # mm_input_projection_weight is an nn.Parameter, the patch embedding a Conv2d: neither is nn.Linear
    assert vision_count("gemma-3-27b", "all-linear") == 27 * 16 * (4 * 2304 + 2 * (1152 + 4304)) == 8_695_296
    # "o" names o_proj: SigLIP's out_proj does not end with it
    assert vision_count("gemma-3-27b", SEVEN) == 27 * 3 * 16 * 2304


def test_qwen2_5_vl_fused_qkv_is_not_q_proj_but_its_mlp_is_gate_up_down():
    # Qwen2_5_VLVisionAttention: qkv, proj; Qwen2_5_VLMLP: gate_proj, up_proj (1280 -> 3420), down_proj
    assert vision_count("qwen2.5-vl-7b", ["q", "v"]) == 0
    assert vision_count("qwen2.5-vl-7b", SEVEN) == 32 * 3 * 16 * (1280 + 3420) == 7_219_200
    # all-linear: qkv (1280 -> 3840), proj, and the merger's mlp.0 (5120 -> 5120), mlp.2 (5120 -> 3584)
    blocks = 7_219_200 + 32 * 16 * ((1280 + 3840) + (1280 + 1280))
    merger = 16 * (5120 + 5120) + 16 * (5120 + 3584)
    assert vision_count("qwen2.5-vl-7b", "all-linear") == blocks + merger == 11_454_464
    # the encoder frozen (LLaMA-Factory's freeze_vision_tower keeps it out of the targets): the merger's only
    assert vision_count("qwen2.5-vl-7b", "all-linear", freeze_vision=True) == merger == 303_104
    assert vision_count("qwen2.5-vl-7b", SEVEN, freeze_vision=True) == 0


def test_llama4_vision_all_linear_by_hand():
    # Llama4VisionAttention q/k/v/o_proj (1408), Llama4VisionMLP fc1, fc2 (1408 <-> 5632), 34 blocks; the unfold's
    # linear (3 x 14^2 -> 1408), the pixel-shuffle MLP (1408 x 4 -> 4096 -> 4096), the projector (4096 -> 5120)
    blocks = 34 * 16 * (4 * 2816 + 2 * (1408 + 5632))
    rest = 16 * ((588 + 1408) + (5632 + 4096) + (4096 + 4096) + (4096 + 5120))
    assert vision_count("llama-4-scout", "all-linear") == blocks + rest == 14_105_792 + 147_456
    assert vision_count("llama-4-scout", ["q", "v"]) == 34 * 2 * 16 * 2816 == 3_063_808


def test_the_tower_adapters_get_states_under_the_hf_trainer():
    # Gemma 3 q, v: fp32 adapters (peft autocast_adapter_dtype), fp32 gradients, AdamW's two fp32 moments, one
    # fused-AdamW step counter per matrix (62 + 27 blocks x 2 modules x A, B)
    result = estimate_config(config("gemma-3-27b", ["q", "v"]))
    stage = result.stages[0]
    step = {c.key: c.bytes for c in next(p for p in stage.phases if p.name == "optimizer").components}
    a = 18_751_488
    assert step["gradients"] == 4 * a
    assert step["optimizer_states"] == 8 * a + 512 * (62 + 27) * 4


CASES = [(model, label) for model in ("gemma-3-27b", "qwen2.5-vl-7b", "llama-4-scout") for label in TARGETS]


@pytest.mark.parametrize("model, label", CASES)
def test_trainable_parameters_match_the_real_peft_wrap(model, label):
    record = json.loads(RECORD.read_text())
    assert record["versions"]["peft"] == "0.21.2" and record["rank"] == 16
    measured = record["models"][model][label]
    vision = measured["lora_parameters"].get("vision", 0) + measured["lora_parameters"].get("projector", 0)
    assert vision_count(model, TARGETS[label]) == vision
    assert estimate_config(config(model, TARGETS[label])).parameters_trainable == measured["trainable"]
