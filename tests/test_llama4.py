"""Llama 4 Scout (issue 28): its config.json mapped (chunked attention, NoPE layers, MoE with a shared expert),
its parameters written out and checked against transformers on the meta device, the chunked layers in the
roofline and the KV caches (HF generate, vLLM by version, SGLang), and the HF harness's records of its training
step (validation/llama4)."""

import json
from pathlib import Path

import pytest

from estimator import estimate_config
from estimator.models.hf_config import architecture_from_hf_config
from estimator.serving import kv_cache
from estimator.spec.architecture import Architecture, parameter_counts
from estimator.spec.errors import ConfigError
from estimator.speed.layer_operations import attended_keys

HF_CONFIGS = Path(__file__).parent / "data" / "hf_configs"
MEASURED = Path(__file__).parent / "data" / "measured"
SCOUT = json.loads((HF_CONFIGS / "llama-4-scout-17b-16e.json").read_text())
SCOUT_RECORDS = sorted(MEASURED.glob("llama-4-scout-*.json"))


def scout() -> Architecture:
    arch, _ = architecture_from_hf_config(SCOUT)
    return arch


def test_the_config_maps_chunked_attention_nope_layers_and_the_shared_expert():
    arch, ignored = architecture_from_hf_config(SCOUT)
    assert (arch.hidden_size, arch.num_layers, arch.num_attention_heads, arch.num_kv_heads, arch.head_dim) == \
        (5120, 48, 40, 8, 128)
    assert (arch.num_experts, arch.num_experts_per_token, arch.moe_intermediate_size) == (16, 1, 8192)
    assert (arch.num_shared_experts, arch.shared_expert_intermediate_size, arch.intermediate_size) == (1, 8192, None)
    assert (arch.first_dense_layers, arch.moe_layer_frequency) == (0, 1)
    # no_rope_layers [1, 1, 1, 0] x 12: layers 3, 7, ... are global (NoPE), the other 36 attend within 8192 tokens
    assert (arch.attention_chunk_size, arch.sliding_window_pattern, arch.sliding_window) == (8192, 4, None)
    assert arch.global_attention_layers_in(0, 48) == 12 and arch.global_attention_layers_in(0, 3) == 0
    assert arch.variant_counts() == {("moe", False): 12, ("moe", True): 36}
    assert arch.qk_l2_norm and arch.moe_dense_experts and arch.eager_softmax_in_compute_dtype and not arch.qk_norm
    assert ignored == []
    assert (arch.vision_tower, arch.vision_hidden_size, arch.vision_num_layers, arch.vision_num_heads) == \
        ("llama4", 1408, 34, 16)
    assert (arch.vision_intermediate_size, arch.vision_patch_size, arch.vision_image_size) == (5632, 14, 336)
    assert (arch.vision_spatial_merge_size, arch.vision_projector_size) == (2, 4096)


def test_scout_text_parameters_by_hand():
    """Per layer: q and o 5120 x 5120, k and v 1024 x 5120, two RMSNorms, the router 16 x 5120, 16 routed
    experts and one shared expert of gate, up and down 5120 x 8192; the L2 q/k norm has no weight. Embedding
    and LM head 202048 x 5120 (untied) and the final norm."""
    h, kv, f, e, v = 5120, 1024, 8192, 16, 202_048
    attention = 2 * h * h + 2 * kv * h
    expert = 3 * h * f
    layer = attention + 2 * h + e * h + e * expert + expert
    assert layer == 2_202_101_760
    total = 48 * layer + 2 * v * h + h
    assert total == 107_769_861_120
    arch = scout()
    text = parameter_counts(arch).total - sum(t.numel for t in arch.vision_tensors())
    assert text == total
    assert total - 48 * (e - 1) * expert == 17_172_894_720  # the card's "17B active" (the text model's)


def test_scout_vision_tower_by_hand():
    """Llama4VisionModel: the unfold patch embedding 1408 x 588 (no bias), the class token, 577 positions
    ((336 / 14)^2 + the class token), the pre- and post-LayerNorms; 34 blocks of two LayerNorms, q, k, v, o with
    biases, fc1 5632 x 1408 and fc2 with biases; the pixel-shuffle adapter 4096 x 5632 and 4096 x 4096, the
    projector 5120 x 4096, all bias-free. The sum with the text model is what transformers builds."""
    c, f = 1408, 5632
    block = 4 * c + 4 * (c * c + c) + (f * c + f) + (c * f + c)
    tower = c * 588 + c + 577 * c + 4 * c + 34 * block + 4096 * f + 4096 * 4096 + 5120 * 4096
    assert tower == 871_932_416
    arch = scout()
    assert sum(t.numel for t in arch.vision_tensors()) == tower
    assert parameter_counts(arch).total == 107_769_861_120 + tower == 108_641_793_536


def test_the_full_model_count_is_what_transformers_builds():
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from validation.llama4.models import text_config_keys

    keys = {k: v for k, v in SCOUT.items() if k not in ("architectures", "transformers_version")}
    config = transformers.Llama4Config(**dict(keys, text_config=text_config_keys(SCOUT)))
    with torch.device("meta"):
        model = transformers.Llama4ForConditionalGeneration(config)
    assert sum(p.numel() for p in model.parameters()) == parameter_counts(scout()).total


@pytest.mark.parametrize("size,tiles,tokens", [(336, 1, 144), (672, 5, 720), (896, 10, 1440), (2000, 17, 2448)])
def test_an_image_in_tiles(size, tiles, tokens):
    """Llama4ImageProcessor: the smallest n x n canvas of 336-px tiles that holds the image (at most 4 x 4),
    the global tile beside more than one; 144 tokens a tile after the 2 x 2 pixel shuffle."""
    from estimator.spec import vision

    arch = scout()
    assert vision.tiles_per_image(arch, size) == tiles and vision.tokens_per_image(arch, size) == tokens
    assert vision.patches_per_image(arch, size) == tiles * 577


def test_a_tile_keeps_by_hand():
    """Per 336-px tile, bf16: 576 patches of 588 pixels (the batch and the unfold's copy) and the shuffle's copy
    (2c); 577 positions through 34 blocks of 8 x 2c + 16 + 4 x 16 + 2 x 2f and two LayerNorms (2c + 8 each); 144
    tokens of 4 x 2q in the adapter."""
    from estimator.memory.activations.vision import llama4_tile_bytes
    from estimator.spec.training import Training

    c, f, q = 1408, 5632, 4096
    block = 16 * c + 16 + 64 + 4 * f
    tile = 576 * (4 * 588 + 2 * c) + 577 * (34 * block + 2 * (2 * c + 8)) + 144 * 8 * q
    assert llama4_tile_bytes(scout(), Training(seq_len=4096, images_per_sample=1), 2)[0] == tile
    recomputed = 576 * (4 * 588 + 2 * c) + 577 * (34 * 2 * c + 2 * (2 * c + 8)) + 144 * 8 * q
    assert llama4_tile_bytes(scout(), Training(seq_len=4096, images_per_sample=1, recompute="full"), 2)[0] == recomputed
    frozen = Training(seq_len=4096, images_per_sample=1, freeze_vision=True)
    assert llama4_tile_bytes(scout(), frozen, 2)[0] == 576 * 2 * 588 + 144 * 2 * q


def test_vllm_profiles_the_16_to_1_dummy_image():
    """mllama4.py: the dummy image is 16 tiles tall (h:w = 16:1) and the global tile: 17 x 144 = 2,448 encoder
    rows in 2,467 contiguous tokens; 3 fit a budget of 8192 tokens. The cache holds their outputs and, until
    profile_run returns, the batch's pixels (17 tiles of 3 x 336 x 336 each) in the model dtype."""
    from estimator.serving.encoder import encoder_profile

    profile = encoder_profile(scout(), 8192, 1024, 131_072, tp=4, act_bytes=2, engine_version="0.33.0")
    assert (profile.items, profile.tokens_per_item, profile.budget) == (3, 2467, 8192)
    assert profile.cache_bytes == 3 * 2448 * 5120 * 2 + 3 * 17 * 3 * 336 * 336 * 2


def _transformers_count(text_config: dict, causal_lm: bool = True) -> int:
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from validation.llama4.models import text_config_keys

    config = transformers.AutoConfig.for_model(**text_config_keys({"text_config": text_config}))
    with torch.device("meta"):
        model = transformers.Llama4ForCausalLM(config)
    return sum(p.numel() for p in model.parameters())


def test_scout_text_count_is_what_transformers_builds():
    """The text_config alone (model_type llama4_text, Llama4ForCausalLM) maps to the text model."""
    text, ignored = architecture_from_hf_config(SCOUT["text_config"])
    assert ignored == [] and text.vision_tower is None
    assert _transformers_count(SCOUT["text_config"]) == parameter_counts(text).total == 107_769_861_120


def test_maverick_layout_dense_layers_between_moe_layers():
    """Maverick's layout on Scout's sizes: MoE every 2nd layer (interleave_moe_layer_step 2: layers 1, 3, ...),
    the others a dense MLP of intermediate_size_mlp, 128 experts, no q/k norm: the count transformers builds."""
    text = {k: v for k, v in SCOUT["text_config"].items() if k != "moe_layers"}
    text.update(interleave_moe_layer_step=2, num_local_experts=128, use_qk_norm=False)
    arch, _ = architecture_from_hf_config(text)
    assert (arch.first_dense_layers, arch.moe_layer_frequency, arch.intermediate_size) == (1, 2, 16384)
    assert arch.kind_counts() == (("dense", 24), ("moe", 24)) and not arch.qk_l2_norm
    assert parameter_counts(arch).total == _transformers_count(text)


@pytest.mark.parametrize("key,value", [("no_rope_layers", [1, 0, 1, 1] * 12), ("no_rope_layers", [1, 0, 0, 1] * 12),
                                       ("moe_layers", [0, 2, 3]), ("no_rope_layers", [1, 1])])
def test_placements_that_cannot_be_represented_are_refused(key, value):
    with pytest.raises(ConfigError) as error:
        architecture_from_hf_config(dict(SCOUT, text_config=dict(SCOUT["text_config"], **{key: value})))
    assert error.value.field == f"model.text_config.{key}"


def test_chunk_and_window_do_not_combine():
    with pytest.raises(ConfigError) as error:
        Architecture(hidden_size=64, num_layers=4, num_attention_heads=4, vocab_size=100, intermediate_size=128,
                     sliding_window=32, attention_chunk_size=64)
    assert error.value.field == "model.attention_chunk_size"


def test_a_chunked_query_attends_within_its_chunk():
    """s = 20000 over chunks of 8192: two whole chunks and 3616 tokens; (2 x 8192^2 + 3616^2) / (2 x 20000)."""
    assert attended_keys(20_000, 8192, chunked=True) == (2 * 8192 ** 2 + 3616 ** 2) / 40_000
    assert attended_keys(4096, 8192, chunked=True) == 2048 == attended_keys(4096, None)  # under the chunk: causal


def test_hf_generate_keeps_one_chunk_in_the_chunked_layers():
    """transformers' DynamicCache gives a chunked_attention layer a sliding-window layer of the chunk: at 32768
    tokens the 12 NoPE layers keep all of them, the 36 chunked ones 8192; 2 x 8 heads x 128 x 2 B per token."""
    result = estimate_config({"model": SCOUT, "training": {"mode": "inference", "seq_len": 32768, "framework": "hf",
                                                           "param_dtype": "bf16"},
                              "hardware": {"gpu": "h200"}})
    stage = result.stages[0]
    kv = next(c for p in stage.phases for c in p.components if c.key == "kv_cache")
    assert kv.bytes == 4096 * (12 * 32768 + 36 * 8192)
    assert "36 chunked-attention layers keep at most 8,192 tokens" in kv.formula


def test_vllm_chunked_layers_keep_one_chunk_from_0_15():
    """vLLM registers ChunkedLocalAttentionSpec for the RoPE layers (models/llama4.py); with the hybrid KV cache
    manager one request holds cdiv(min(chunk + in-flight, len), block) blocks there (kv_cache_interface.py). 0.11
    turns the manager off for chunked attention (VLLM_ALLOW_CHUNKED_LOCAL_ATTN_WITH_HYBRID_KV_CACHE=0), so every
    layer keeps the whole request; 0.15 on keep the manager unless an EAGLE drafter runs."""
    arch = scout()
    specs = kv_cache.layer_specs(arch, tp=1, block_size=16, kv_bytes=2)
    page = 16 * 4096
    assert [s.kind for s in specs[:4]] == ["chunked_local"] * 3 + ["full"] and specs[0].page_bytes == page
    length, in_flight = 131_072, 8192
    assert specs[0].max_memory_usage_bytes(length, in_flight) == (8192 + 8192) // 16 * page
    groups = kv_cache.kv_groups(kv_cache.without_hybrid_allocator(specs, (0, 33), eagle=False), (0, 33))
    # 36 chunked layers in 3 groups of 12 beside the 12 full ones: 4 groups, a block holds 12 pages
    assert len(groups.members) == 4 and groups.block_bytes_on(range(48)) == 12 * page
    assert groups.blocks_per_request(length, in_flight) == 3 * 1024 + 131_072 // 16
    old = kv_cache.kv_groups(kv_cache.without_hybrid_allocator(specs, (0, 11), eagle=False), (0, 11))
    assert old.uniform_type is False and len(old.members) == 1 and old.blocks_per_request(length, in_flight) == 8192
    eagle = kv_cache.without_hybrid_allocator(specs, (0, 33), eagle=True)
    assert {s.kind for s in eagle} == {"full"}


def test_sglang_serves_scout_with_its_hybrid_swa_pools():
    from estimator.serving.sglang_pools import is_hybrid_swa

    assert is_hybrid_swa(scout(), {"architectures": ["Llama4ForConditionalGeneration"]})


def test_the_training_records_are_there():
    ids = {p.stem for p in SCOUT_RECORDS}
    assert len(ids) >= 6 and any("-recompute-" in i for i in ids) and any("-eager-" in i for i in ids)


@pytest.mark.parametrize("path", SCOUT_RECORDS, ids=lambda p: p.stem)
def test_every_phase_of_the_scout_step_as_measured(path):
    """Forward: every token through all 16 experts (5 x E x tokens x width tensors a layer) beside attention's;
    held to 1% where forward or its activations peak (the backward's end, every gradient and no activation, is
    below the optimizer step and is not modelled: tests/test_accuracy.py)."""
    record = json.loads(path.read_text())
    stage = estimate_config(record["config"]).stages[0]
    forward = next(p for p in stage.phases if p.name == "forward")
    assert forward.allocated_bytes == pytest.approx(record["measured"]["phases"]["forward"]["total"], rel=0.01)
    assert stage.allocated_peak_bytes == pytest.approx(record["measured"]["peak_bytes"], rel=0.01)


def test_a_scout_layer_keeps_by_hand():
    """One MoE layer at 2048 tokens, bf16: the 16 experts' rows (16 x 2048) keep the repeated and the scaled
    tokens (2 x 2h), gate and up, SiLU and the product (4f); the router its input, its int64 indices, fp32 sigmoid
    and the bf16 score column; the RoPE layers (3 of 4) the fp32 upcast of q and k and a rsqrt per head."""
    from estimator.memory.activations.llama4 import dense_moe_entries, l2_qk_norm_entries
    from estimator.spec.parallel import Parallel
    from estimator.spec.training import Training

    arch, training, par = scout(), Training(seq_len=2048, framework="hf", param_dtype="bf16"), Parallel()
    rows, h, f = 16 * 2048, 5120, 8192
    router = sum(e.bytes(par) for e in dense_moe_entries(arch, training, par))
    assert router == 2048 * h * 2 + 2048 * 8 + rows * 4 + rows * 2 + rows * 2 * h * 2
    # under autocast the repeated tokens are the fp32 norm output's, and three linears keep their own 16-bit casts
    amp = Training(seq_len=2048, framework="hf", param_dtype="fp32")
    assert sum(e.bytes(par) for e in dense_moe_entries(arch, amp, par)) == \
        3 * 2048 * h * 2 + 2048 * 8 + rows * 4 + rows * 2 + rows * h * (4 + 2)
    from estimator.memory.activations.mlp import mlp_entries
    experts = sum(e.bytes(par) for e in mlp_entries(arch, training, par, "moe") if e.name.startswith("experts (every"))
    assert experts == rows * 4 * f * 2
    l2 = sum(e.bytes(par) for e in l2_qk_norm_entries(arch, training, par))
    assert l2 == 2048 * 3 / 4 * ((5120 + 1024) * 4 + 48 * 4)


@pytest.mark.parametrize("run", [("tiny-llama-4", 24, 2, "none", "sdpa"), ("tiny-llama-4", 24, 2, "full", "sdpa"),
                                 ("tiny-llama-4", 64, 2, "none", "eager")], ids=lambda r: f"{r[3]}-{r[4]}-s{r[1]}")
def test_fake_measurement_equals_real_cpu_run(run):
    """Two layers (a chunked RoPE layer, a global NoPE one), four experts: the fake-tensor step allocates what a
    real CPU step does, byte for byte; under the 32-token chunk SDPA takes the flash path, past it (eager) the
    chunked layer gets its own 4-D mask."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from validation.hf.step import Run, measure

    model, seq, batch, recompute, attention = run
    step = Run(model, seq, batch, recompute=recompute, attention=attention)
    assert measure(step, fake=True) == measure(step, fake=False)


def test_the_roofline_runs_every_token_through_every_expert_under_transformers():
    """Under the HF Trainer the experts' GEMMs see E x tokens rows (16 x 4096 per micro-batch), under torchtitan
    the routed top-1 tokens: the experts' forward FLOPs differ by E / k = 16; the MFU counts the useful top-1
    work in both, so transformers' is the lower."""
    from estimator import load_config
    from estimator.speed.roofline import roofline_config

    def experts_forward(framework):
        config = load_config({"model": "llama-4-scout", "training": {"framework": framework, "seq_len": 4096},
                              "parallel": {"dp": 64}, "hardware": {"gpu": "h100-80"}})
        roof = roofline_config(config)
        flops = sum(o.flops for o in roof.operations if o.name.startswith("experts") and o.phase == "forward"
                    and o.kind == "matmul" and o.scope == "layer (moe, attention chunk)")
        return flops, roof.to_json()["step"]["mfu"]

    (hf, hf_mfu), (titan, titan_mfu) = experts_forward("hf"), experts_forward("fsdp2")
    h, f = 5120, 8192
    assert titan == 2 * 4096 * (h * 2 * f + f * h)  # gate/up and down over the routed 4096 tokens
    assert hf == 16 * titan and hf_mfu < titan_mfu


@pytest.mark.parametrize("size,freeze", [(56, False), (112, False), (112, True)])
def test_fake_vision_step_equals_real_cpu_run(size, freeze):
    """The tiny Llama 4 with its tower (56-px tiles): one tile, then 2 x 2 and the global one; frozen or trained."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from validation.hf.step import Run, measure

    step = Run("tiny-llama-4-vl", 48, 1, images=1, image_size=size, freeze_vision=freeze)
    assert measure(step, fake=True) == measure(step, fake=False)


def test_a_megatron_command_refuses_the_chunk_it_cannot_write():
    from estimator.importers.emit_megatron import megatron_model

    with pytest.raises(ConfigError) as error:
        megatron_model(scout())
    assert error.value.field == "model.attention_chunk_size"


def test_a_layer_count_beyond_the_fields_bound_is_refused_before_the_layers_are_walked():
    """The reader marks each layer's MoE flag from moe_layers (_moe_interval), a list of num_hidden_layers entries:
    a config of 10^12 layers ran out of memory (found by fuzzing). The count is held to the Layers field's bound
    first."""
    config = json.loads(json.dumps(SCOUT))
    config["text_config"]["num_hidden_layers"] = 10**12
    config["text_config"]["moe_layers"] = [1, 3]
    with pytest.raises(ConfigError) as err:
        architecture_from_hf_config(config)
    assert err.value.field == "model.text_config.num_hidden_layers"
    assert "an integer from 1 to 16,384" in str(err.value)
