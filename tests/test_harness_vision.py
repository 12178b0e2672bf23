"""The vision-language harness (validation/vlm): the checkpoints' parameter counts built by transformers, the
emulated FlashAttention-2 varlen path gives the numbers of transformers' own SDPA path (one call per window)
on a tiny real CPU run, and the fake-tensor measurement equals a real CPU run byte for byte. Needs torch and
transformers."""

import json
from contextlib import nullcontext
from pathlib import Path

import pytest

torch = pytest.importorskip("torch", reason="the measuring harness needs torch (the [validate] extra)")
pytest.importorskip("transformers", reason="the measuring harness needs transformers (the [validate] extra)")

from validation.core.tracker import StorageTracker  # noqa: E402
from validation.hf.cases import CASES, contract_config  # noqa: E402
from validation.hf.step import Run, build, measure  # noqa: E402
from validation.vlm import vision  # noqa: E402

HF_CONFIGS = Path(__file__).parent / "data" / "hf_configs"

# The sums this test writes out (transformers 5.23), each the checkpoint's: Qwen2.5-VL-7B-Instruct's
# model.safetensors.index.json gives total_size 16,584,333,312 bytes of bf16, 8,292,166,656 parameters.
# Gemma 3 27B: the Hub's safetensors total for google/gemma-3-27b-pt, 27,432,406,640; its SigLIP tower and projector
# 423,060,336.
CHECKPOINTS = {"qwen2.5-vl-7b-instruct": ("Qwen2_5_VLForConditionalGeneration", 8_292_166_656, 676_550_144),
               "gemma-3-27b-pt": ("Gemma3ForConditionalGeneration", 27_432_406_640, 423_060_336),
               # google/gemma-3-4b-it: 4,300,079,472, the count public code quotes for the checkpoint
               "gemma-3-4b-it": ("Gemma3ForConditionalGeneration", 4_300_079_472, 419_816_304)}
TOWER = ("model.visual.", "model.vision_tower.", "model.multi_modal_projector.")


@pytest.mark.parametrize("name", sorted(CHECKPOINTS))
def test_the_checkpoint_built_by_transformers(name):
    import transformers

    cls, total, tower = CHECKPOINTS[name]
    config = transformers.AutoConfig.for_model(**json.loads((HF_CONFIGS / f"{name}.json").read_text()))
    with torch.device("meta"):
        model = getattr(transformers, cls)._from_config(config)
    counts = {"all": 0, "visual": 0}
    for n, p in model.named_parameters():
        counts["all"] += p.numel()
        counts["visual"] += p.numel() if n.startswith(TOWER) else 0
    print(f"{name}: {counts['all']:,} parameters, {counts['visual']:,} in the vision tower")
    assert (counts["all"], counts["visual"]) == (total, tower)


def loss_and_grads(emulated: bool):
    """Tiny Qwen2.5-VL's loss and gradients on one real batch (fp32): the vision tower through the emulated
    varlen flash kernel, or through transformers' SDPA path with its own vision inputs."""
    torch.manual_seed(0)
    run = Run("tiny-qwen2.5-vl", 160, 2, images=2, image_size=112)
    model, _ = build(run)
    model.float()
    grid = vision.grid_of(model.config, run.images, run.image_size)
    inputs, precomputed, splits = vision.batch(model.config, grid, 2, 160, fake=False)
    with vision.vision_emulation(StorageTracker(), model, precomputed, splits) if emulated else nullcontext():
        loss = model(**inputs).loss
        loss.backward()
    return loss.detach(), {n: p.grad for n, p in model.named_parameters()}


def test_the_emulated_flash_varlen_gives_transformers_numbers():
    ref_loss, ref = loss_and_grads(emulated=False)
    loss, grads = loss_and_grads(emulated=True)
    assert torch.allclose(loss, ref_loss, rtol=1e-5)
    for name, g in grads.items():
        assert g is not None and torch.allclose(g, ref[name], rtol=1e-4, atol=1e-6), name


@pytest.mark.parametrize("run", [Run("tiny-qwen2.5-vl", 256, 2, images=2, image_size=112),
                                 Run("tiny-qwen2.5-vl", 256, 1, images=3, image_size=168, recompute="full"),
                                 Run("tiny-qwen2.5-vl", 256, 1, images=2, image_size=112, freeze_vision=True),
                                 Run("tiny-gemma-3", 64, 2, images=2, image_size=56),
                                 Run("tiny-gemma-3", 64, 1, images=3, image_size=56, recompute="full"),
                                 Run("tiny-gemma-3", 64, 1, images=2, image_size=56, freeze_vision=True)],
                         ids=["qwen-b2-i2x112", "qwen-recompute-i3x168", "qwen-frozen", "gemma-b2-i2", "gemma-recompute-i3",
                              "gemma-frozen"])
def test_fake_equals_real(run):
    assert measure(run, fake=True) == measure(run, fake=False)


def test_the_cases_and_their_configs():
    for family in ("qwen2.5-vl-7b", "gemma-3-27b"):
        ids = [c for c in CASES if c.startswith(family)]
        assert len(ids) >= 3 and all("-i" in c for c in ids) and any(c.endswith("-frozenvision") for c in ids)
    frozen = contract_config(CASES["gemma-3-27b-bf16-adamw-norecompute-sdpa-s2048-b1-i2x896-frozenvision"])
    assert frozen["training"]["freeze_vision"] is True and frozen["model"]["vision_tower"] == "siglip"
    config = contract_config(CASES["qwen2.5-vl-7b-bf16-adamw-norecompute-sdpa-s4096-b1-i2x896"])
    assert config["training"]["images_per_sample"] == 2 and config["training"]["image_size"] == 896
    assert config["model"]["vision_tower"] == "qwen2_5_vl" and config["model"]["vision_full_attention_layers"] == 4


def test_the_canonical_architectures_are_the_mappings():
    """The harness's hand-written architecture objects equal what the estimator reads from the same config.json."""
    from estimator.models.hf_config import architecture_from_hf_config
    from validation.vlm.models import MODELS

    for name, model_id in (("qwen2.5-vl-7b-instruct", "qwen2.5-vl-7b"), ("gemma-3-27b-pt", "gemma-3-27b"),
                           ("gemma-3-4b-it", "gemma-3-4b")):
        mapped, _ = architecture_from_hf_config(json.loads((HF_CONFIGS / f"{name}.json").read_text()), name=model_id)
        for field, value in MODELS[model_id].architecture().items():
            assert getattr(mapped, field) == value, (model_id, field)


def test_the_tower_on_sdpa_fake_equals_real():
    """Qwen2.5-VL's tower on SDPA (what a GPU without flash-attn runs): one call per window or image, whose lengths
    a fake cu_seqlens cannot list (validation/vlm/vision.py _known_split_lengths); the fake measurement equals a
    real CPU run, and keeps one activation of the tower's width per block more than the varlen kernel: the
    concatenated output beside the per-window outputs the kernel saves (tiny tower: 4 blocks of width 64, 2 x 2
    images of (112 / 14)^2 = 64 patches, 2 bytes: 4 x 256 x 64 x 2 = 131,072 bytes), less 1,024 bytes of the
    small blocks that differ (the varlen kernel's rng state, 512 bytes a block; the per-window log-sum-exps)."""
    sdpa = Run("tiny-qwen2.5-vl", 256, 2, images=2, image_size=112, vision_attention="sdpa")
    fake = measure(sdpa, fake=True)
    assert fake == measure(sdpa, fake=False)
    flash = measure(Run("tiny-qwen2.5-vl", 256, 2, images=2, image_size=112), fake=True)
    assert fake["phases"]["forward"]["activations"] - flash["phases"]["forward"]["activations"] == \
        4 * 256 * 64 * 2 - 1024


def test_gemma_3_on_sdpa_is_refused():
    with pytest.raises(NotImplementedError, match="4-D mask"):
        measure(Run("tiny-gemma-3", 64, 1, images=1, image_size=56, vision_attention="sdpa"), fake=True)
