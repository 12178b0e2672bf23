"""Bundled presets: every computed parameter count against the publisher's figure, and recipes."""

from __future__ import annotations

import dataclasses

import subprocess
import sys
from pathlib import Path

import pytest

from estimator.spec.architecture import parameter_counts
from estimator.spec.errors import ConfigError
from estimator.spec.hardware import Hardware
from estimator.models.hf_config import architecture_from_hf_config
from estimator.spec.parallel import Parallel
from estimator.models.presets import get_architecture, get_hf_config, get_preset, list_presets, list_recipes, preset_ids
from estimator.spec.training import Training

REQUIRED = ["llama-3.1-8b", "llama-3.1-70b", "llama-3.1-405b", "llama-3.2-1b", "llama-3.2-3b", "qwen2.5-7b",
            "qwen2.5-72b", "qwen3-8b", "qwen3-32b", "qwen3-30b-a3b", "qwen3-235b-a22b", "mistral-7b",
            "mixtral-8x7b", "mixtral-8x22b", "deepseek-v3", "gemma-3-27b", "gpt-oss-20b", "gpt-oss-120b",
            "phi-4", "olmo-2-13b", "qwen3-next-80b-a3b", "nemotron-h-8b", "jamba-mini-1.5", "falcon-h1-7b", "qwen2.5-vl-7b",
            "deepseek-v3.2", "kimi-k2", "llama-4-scout"]

# Exact counts the project states as its reference (from the Hub's safetensors metadata, and for
# DeepSeek-V3 the checkpoint with its MTP module): quoted here independently of the data files.
KNOWN_EXACT = {
    "llama-3.1-8b": (8_030_261_248, None),
    "llama-3.1-70b": (70_553_706_496, None),
    "llama-3.1-405b": (405_853_388_800, None),
    "qwen3-8b": (8_190_735_360, None),
    "qwen2.5-7b": (7_615_616_512, None),
    "mixtral-8x7b": (46_702_792_704, 12_879_925_248),
    "qwen3-235b-a22b": (235_093_634_560, 22_190_763_520),
    # vision-language checkpoints, their vision towers counted (estimator/spec/vision.py): Qwen2.5-VL-7B's
    # model.safetensors.index.json total_size 16,584,333,312 bytes of bf16; Gemma 3 27B the Hub's safetensors total
    "qwen2.5-vl-7b": (8_292_166_656, None),
    "gemma-3-27b": (27_432_406_640, None),
}
DEEPSEEK_V3 = {"total_without_mtp": 671_026_419_200, "active_without_mtp": 37_552_297_472,
               "total_with_mtp": 684_489_845_504}


def within(value: int, published: int, rounding: dict) -> bool:
    """Whether `value` is shown as `published` under the publisher's rounding."""
    unit = rounding["unit"]
    if rounding["mode"] == "down":  # truncation: 1,235,814,400 shown as 1.23B
        return published <= value < published + unit
    return abs(value - published) <= unit // 2  # to the nearest unit


def siglip_vision_tower(vc: dict, text_hidden: int) -> int:
    """SigLIP vision encoder plus Gemma 3's projector, counted from vision_config (transformers
    SiglipVisionModel with vision_use_head False; Gemma3MultiModalProjector)."""
    h, inner, layers, patch, image = (vc["hidden_size"], vc["intermediate_size"], vc["num_hidden_layers"],
                                      vc["patch_size"], vc["image_size"])
    patch_embedding = 3 * patch * patch * h + h
    positions = (image // patch) ** 2 * h
    layer = 4 * (h * h + h) + 2 * 2 * h + (h * inner + inner) + (inner * h + h)
    post_layernorm = 2 * h
    projector = h * text_hidden + h  # mm_input_projection_weight, mm_soft_emb_norm
    return patch_embedding + positions + layers * layer + post_layernorm + projector


def test_required_presets_are_bundled():
    assert set(REQUIRED) <= set(preset_ids())
    infos = {info.id: info for info in list_presets()}
    for pid in REQUIRED:
        info = infos[pid]
        assert info.hub_id.count("/") == 1 and info.count_source and info.name
        assert isinstance(info.exact, bool) and info.published_total > 0
        assert info.exact or info.total_rounding  # a rounded figure says how it was rounded


@pytest.mark.parametrize("pid", REQUIRED)
def test_preset_parses_without_ignored_fields(pid):
    config = get_hf_config(pid)
    arch, ignored = architecture_from_hf_config(config)
    assert ignored == []
    assert get_architecture(pid).hidden_size == arch.hidden_size
    assert get_preset(pid)["config_source"].startswith("https://huggingface.co/" + get_preset(pid)["hub_id"])


@pytest.mark.parametrize("pid", REQUIRED)
def test_total_matches_the_published_count(pid):
    info = next(i for i in list_presets() if i.id == pid)
    arch = get_architecture(pid)
    total = parameter_counts(arch).total
    if info.counting.get("total_includes_vision_encoder"):
        total += siglip_vision_tower(get_hf_config(pid)["vision_config"], arch.hidden_size)
    if info.exact:
        assert total == info.published_total
    else:
        assert within(total, info.published_total, info.total_rounding), (total, info.published_total)


# MoE presets with a published active count (dense models have active = total); DeepSeek-V3's and
# DeepSeek-V3.2's active counts exclude the MTP module and are checked separately below.
WITH_ACTIVE = [i.id for i in list_presets() if i.published_active is not None
               and i.id not in ("deepseek-v3", "deepseek-v3.2")]


def test_moe_presets_publish_an_active_count():
    assert set(WITH_ACTIVE) == {"qwen3-30b-a3b", "qwen3-235b-a22b", "mixtral-8x7b", "mixtral-8x22b",
                                "gpt-oss-20b", "gpt-oss-120b", "jamba-mini-1.5", "kimi-k2"}


@pytest.mark.parametrize("pid", WITH_ACTIVE)
def test_active_matches_the_published_count(pid):
    info = next(i for i in list_presets() if i.id == pid)
    arch = get_architecture(pid)
    active = parameter_counts(arch).active
    if info.counting.get("active_excludes_embedding"):
        active -= arch.vocab_size * arch.hidden_size
    if info.active_exact:
        assert active == info.published_active
    else:
        assert within(active, info.published_active, info.active_rounding), (active, info.published_active)


def test_known_exact_counts():
    for pid, (total, active) in KNOWN_EXACT.items():
        counts = parameter_counts(get_architecture(pid))
        assert counts.total == total, pid
        if active is not None:
            assert counts.active == active, pid
        info = next(i for i in list_presets() if i.id == pid)
        assert info.exact and info.published_total == total


def test_deepseek_v3_with_and_without_mtp():
    arch = get_architecture("deepseek-v3")
    without = parameter_counts(arch, include_mtp=False)
    assert without.total == DEEPSEEK_V3["total_without_mtp"]
    assert without.active == DEEPSEEK_V3["active_without_mtp"]
    assert parameter_counts(arch).total == DEEPSEEK_V3["total_with_mtp"]
    info = next(i for i in list_presets() if i.id == "deepseek-v3")
    assert info.published_total == DEEPSEEK_V3["total_with_mtp"]
    assert info.published_active == DEEPSEEK_V3["active_without_mtp"] and info.counting["active_excludes_mtp"]
    assert info.counting["total_without_mtp"] == DEEPSEEK_V3["total_without_mtp"]


def test_deepseek_v32_with_and_without_mtp():
    """DeepSeek-V3 plus one lightning indexer per attention layer, the MTP block's included
    (13,959,424 each: tests/test_sparse_attention.py)."""
    arch = get_architecture("deepseek-v3.2")
    without = parameter_counts(arch, include_mtp=False)
    assert without.total == DEEPSEEK_V3["total_without_mtp"] + 61 * 13_959_424
    assert without.active == DEEPSEEK_V3["active_without_mtp"] + 61 * 13_959_424
    info = next(i for i in list_presets() if i.id == "deepseek-v3.2")
    assert info.published_total == parameter_counts(arch).total == DEEPSEEK_V3["total_with_mtp"] + 62 * 13_959_424
    assert info.published_active == without.active and info.counting["active_excludes_mtp"]
    assert info.counting["total_without_mtp"] == without.total


def test_gemma_3_27b_against_the_technical_report():
    """Gemma 3 technical report (arXiv 2503.19786) Table 1, 27B: vision encoder 417M,
    non-embedding parameters 25,600M of the text model (both to the nearest million). The estimator's
    vision tower is the hand count of SigLIP and the projector above."""
    arch = get_architecture("gemma-3-27b")
    counts = parameter_counts(arch)
    tower = sum(t.numel for t in arch.vision_tensors())
    config = get_hf_config("gemma-3-27b")
    assert tower == siglip_vision_tower(config["vision_config"], arch.hidden_size) == 423_060_336
    non_embedding = counts.total - counts.embedding - tower
    assert abs(non_embedding - 25_600_000_000) <= 500_000
    vision = tower - (1152 * 5376 + 1152)
    assert abs(vision - 417_000_000) <= 500_000


def test_unknown_preset():
    with pytest.raises(ConfigError) as caught:
        get_architecture("llama-9b")
    assert caught.value.field == "model" and caught.value.value == "llama-9b"
    assert "llama-3.1-8b" in caught.value.allowed
    with pytest.raises(ConfigError):
        get_hf_config("nope")


def test_hf_config_is_a_copy():
    config = get_hf_config("llama-3.1-8b")
    config["hidden_size"] = 1
    assert get_hf_config("llama-3.1-8b")["hidden_size"] == 4096


def test_import_does_no_file_reads():
    code = ("import estimator.models.presets as p; "
            "print(p._index.cache_info().currsize, p._recipes.cache_info().currsize, p._load.cache_info().currsize)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=Path(__file__).parents[1])
    assert out.stdout.split() == ["0", "0", "0"]


# --- recipes ------------------------------------------------------------------------------------

# The contract's fields (../shared/CONTRACT.md, tables `training`, `parallel`, `hardware`).
CONTRACT_FIELDS = {
    "training": {"mode", "framework", "seq_len", "micro_batch_size", "global_batch_size", "param_dtype",
                 "grad_dtype", "master_weights", "optimizer_dtype", "compute_dtype", "optimizer", "recompute",
                 "recompute_layers", "attention", "dropout", "loss", "fp8", "kv_cache_tokens", "kv_cache_dtype"},
    "parallel": {"tp", "sequence_parallel", "pp", "vpp", "pp_first_stage_layers", "pp_last_stage_layers", "dp",
                 "cp", "ep", "etp", "zero_stage"},
    "hardware": {"gpu"},
}
# The contract's "Additions" (../shared/CONTRACT.md) implemented so far
CONTRACT_ADDITIONS = {"recompute_every", "optimizer_in_backward", "offload_optimizer", "offload_parameters", "adapter", "rl",
                      "fp8_all_gather", "offload_activations", "compile", "framework_version", "microbatch_group_size"}
# Optional fields this project added to the contract (README, "Fields beyond the contract"), and the additions
EXTENSIONS = {
    "training": {"fp8_recipe", "recompute_modules", "moe_capacity_factor", "moe_dispatcher", "moe_router_dtype",
                 "attention_softmax_fusion", "cross_entropy_impl", "activation_func_fp8_input_store", "reduce_bucket_size",
                 "defer_embedding_wgrad_compute", "wgrad_deferral_limit", "moe_grouped_gemm",
                 "moe_use_legacy_grouped_gemm", "torch_version",
                 "stage3_prefetch_bucket_size", "stage3_max_live_parameters", "stage3_param_persistence_threshold",
                 "overlap_comm", "contiguous_gradients", "adamw_implementation", "training_loop", "async_tp",
                 "compile_loss", "transformer_impl",
                 "gradient_accumulation_fusion", "te_version", "liger_kernel", "nccl_cumem", "attn_implementation",
                 "overlap_p2p_comm", "overlap_p2p_comm_warmup_flush", "ssm_kernels", "trl_version",
                 "images_per_sample", "image_size", "freeze_vision"} | CONTRACT_ADDITIONS,  # vision-language models (issue 28)
    "parallel": {"world_size", "comm_overlap", "pp_schedule", "pp_account_for_embedding", "pp_account_for_loss",
                 "pp_layout", "fsdp_sharding_strategy", "fsdp_shard_group_size", "cp_comm_type"},
    "hardware": {"expandable_segments", "cublas_workspace_config", "cuda_module_loading"},
}


def test_the_estimator_accepts_exactly_the_contract_and_its_extensions():
    for section, cls in (("training", Training), ("parallel", Parallel), ("hardware", Hardware)):
        assert {f.name for f in dataclasses.fields(cls)} == CONTRACT_FIELDS[section] | EXTENSIONS[section]
# GPUs each recipe describes: its name / the cited source
WORLD = {"llama-3.1-70b-pretrain-64xh100": 64, "deepseek-v3-as-reported": 2048, "qwen3-8b-sft-8xh100": 8,
         "llama-3.1-8b-full-ft-8xa100": 8, "llama-3.1-70b-qlora-1xh100": 1, "llama-3.1-8b-lora-24gb": 1,
         "qwen2-7b-grpo-8xh100": 8, "qwen2.5-7b-grpo-slime-8xh100": 8, "qwen2.5-7b-grpo-slime-4xh100": 4}


def test_recipes_are_listed():
    recipes = list_recipes()
    assert {r.id for r in recipes} == set(WORLD)
    for recipe in recipes:
        assert recipe.name and recipe.description and recipe.source


@pytest.mark.parametrize("recipe", list_recipes(), ids=lambda r: r.id)
def test_recipe_config_has_only_contract_fields(recipe):
    config = recipe.config
    assert set(config) <= {"model", "training", "parallel", "hardware"}
    assert config["model"] in preset_ids()
    for section, allowed in CONTRACT_FIELDS.items():
        assert set(config.get(section, {})) <= allowed | EXTENSIONS[section], section
    training = Training(**config["training"])
    parallel = Parallel(**config["parallel"])
    Hardware(**config["hardware"])
    p = config["parallel"]
    world = p.get("tp", 1) * p.get("pp", 1) * p.get("cp", 1) * p.get("dp", 1)
    assert world == parallel.gpus == WORLD[recipe.id]
    if training.global_batch_size:
        assert training.global_batch_size % (training.micro_batch_size * parallel.dp) == 0
    assert (parallel.tp * parallel.cp * parallel.dp) % (parallel.ep * parallel.etp) == 0
    arch = get_architecture(config["model"])
    assert arch.num_layers >= parallel.pp * parallel.vpp
    if parallel.ep > 1:
        assert arch.num_experts % parallel.ep == 0
