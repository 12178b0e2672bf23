"""Record what vLLM's own code computes for Qwen2.5-VL's profiling item, on CPU (issue 24).

Run inside a venv holding one vLLM release (as kv_records.py):

    PYTHONPATH=/work/venvs/vlmserve-torchvision /work/venvs/vllm/0.11.0/bin/python -m validation.vllm.mm_records \\
        --out tests/data/serving/vlm/vllm-0.11.0-qwen2.5-vl.json

(torchvision 0.28.0 from PyPI installed with ``pip install --no-deps --target`` into that folder: the processors
need its transforms; neither the venv nor the system torch is touched.)

For each case (max_model_len, max_num_batched_tokens, max_num_seqs, --limit-mm-per-prompt) it asks vLLM's Qwen2.5-VL processing info
(model_executor/models/qwen2_5_vl.py, qwen2_vl.py) for each modality's largest item in tokens, as the
multimodal budget does (seq_len = max_model_len, one item of each modality whose limit is above 0, and those
modalities kept); runs vLLM's
compute_mm_encoder_budget and the budget's get_max_items / get_modality_with_max_tokens over them; builds the
dummy item with vLLM's dummy-inputs builder (get_dummy_mm_data with one item of the profiled modality) and
runs it through transformers' processor for that modality, configured from the checkpoint's
preprocessor_config.json (PREPROCESSOR below; the video processor falls back to that file). It records the
tokens per modality, the modality and items profiled, the encoder budget, the dummy item's frames and size,
and the processed grid (t, h, w) and pixel rows the tower receives (the processor's dtype: vLLM then casts
floating outputs to the model dtype, multimodal/processing.py _postprocess_output).

Stand-ins: the processing info's hf_config (transformers' Qwen2_5_VLConfig from the preset's config.json) and
its image processor (transformers' Qwen2VLImageProcessor from PREPROCESSOR) replace the ones vLLM would load
from the checkpoint; the scheduler config is a stand-in with the fields the budget reads. No tokenizer is
needed: the placeholder count is the grid's, as vLLM's prompt update computes it (grid product / merge^2).
"""

from __future__ import annotations

import argparse
import importlib
import sys
import types

from validation.core.record import write_json

# Qwen/Qwen2.5-VL-7B-Instruct preprocessor_config.json (the Hub file's values)
PREPROCESSOR = {"min_pixels": 3136, "max_pixels": 12845056, "patch_size": 14, "temporal_patch_size": 2,
                "merge_size": 2, "image_mean": [0.48145466, 0.4578275, 0.40821073],
                "image_std": [0.26862954, 0.26130258, 0.27577711]}
MM_LIMIT = 999  # vLLM's default limit per prompt (config/multimodal.py)

CASES = [
    # (max_model_len, max_num_batched_tokens, max_num_seqs, --limit-mm-per-prompt as serving.limit_mm_per_prompt)
    (128000, 8192, 1024, None),  # the checkpoint's context, H100 defaults
    (65536, 131072, 256, None),  # a budget of two videos
    (32768, 8192, 256, None),
    (16384, 8192, 256, None),  # image and video tie
    (128000, 8192, 1024, "image=1,video=0"),  # the usual workaround: the image is profiled
    (65536, 131072, 2, "image=1,video=0"),  # eight images fit the budget; two prompts of one image do
    (131072, 262144, 1, "image=3,video=0"),  # the per-prompt limit under max_model_len // tokens (8)
    (65536, 131072, 256, "image=0"),  # videos only
    (16384, 8192, 256, "image=0"),  # the tie's video, whatever the release
    (128000, 8192, 1024, "image=0,video=0"),  # no encoder profile
]


def _stub_missing(*names):
    """Empty modules for optional packages the model module's imports reach (the GGUF loader's gguf) and
    the venv lacks: nothing here calls them."""
    for name in names:
        try:
            importlib.import_module(name)
        except ImportError:
            sys.modules[name] = types.ModuleType(name)


def _torchvision_transforms_only():
    """transformers' Qwen2-VL processors import torchvision's v2 functional transforms (torch ops in Python). The
    PyPI torchvision 0.28 wheel's compiled ops need CUDA torch; skipping the fake kernels it registers for them
    (detection ops: nms, roi_align) leaves the transforms working on CPU torch 2.13."""
    sys.modules.setdefault("torchvision._meta_registrations", types.ModuleType("torchvision._meta_registrations"))


def _info(hf_config):
    _stub_missing("gguf")
    _torchvision_transforms_only()
    models = importlib.import_module("vllm.model_executor.models.qwen2_5_vl")
    from transformers.models.qwen2_vl.image_processing_qwen2_vl import Qwen2VLImageProcessor
    image_processor = Qwen2VLImageProcessor(**PREPROCESSOR)
    # 0.11 reads min_pixels / max_pixels off the processor, which transformers 4.5x (0.11's) set from the config;
    # 5.x keeps them in size only
    image_processor.min_pixels, image_processor.max_pixels = PREPROCESSOR["min_pixels"], PREPROCESSOR["max_pixels"]
    info = object.__new__(models.Qwen2_5_VLProcessingInfo)
    info.get_hf_config = lambda: hf_config
    info.get_image_processor = lambda **kwargs: image_processor
    # no configured mm_processor_kwargs: the merge returns what it is given (0.33's ctx.get_merged_mm_kwargs)
    info.ctx = types.SimpleNamespace(get_merged_mm_kwargs=lambda kwargs, **_: dict(kwargs))
    info.__dict__["supported_mm_processor_kwargs"] = frozenset()  # 0.33's cached property, read by that merge only
    builder = object.__new__(models.Qwen2_5_VLDummyInputsBuilder)
    builder.info = info
    return info, builder


def _limits(text):
    """serving.limit_mm_per_prompt's text as vLLM's per-modality limits (999 where not named)."""
    given = dict((m, int(n)) for m, n in (pair.split("=") for pair in text.split(","))) if text else {}
    return {m: given.get(m, MM_LIMIT) for m in ("image", "video")}


def _budget(max_model_len, batched, seqs, max_toks, limits):
    sched = types.SimpleNamespace(max_num_encoder_input_tokens=batched, encoder_cache_size=batched,
                                  max_num_batched_tokens=batched, disable_chunked_mm_input=False,
                                  enable_chunked_prefill=True, max_num_seqs=seqs)
    try:  # 0.33
        module = importlib.import_module("vllm.multimodal.encoder_budget")
        cls, get_items = module.MultiModalBudget, "_get_max_items"
        from vllm.v1.core.encoder_cache_manager import compute_mm_encoder_budget
    except ImportError:  # 0.11
        module = importlib.import_module("vllm.v1.worker.utils")
        cls, get_items = module.MultiModalBudget, "get_max_items"
        from vllm.v1.core.encoder_cache_manager import compute_mm_encoder_budget
    compute, cache = compute_mm_encoder_budget(sched, max_toks)  # (0, 0) when every modality is off
    if not max_toks:
        return min(compute, cache), None, 0
    budget = object.__new__(cls)
    budget.scheduler_config, budget.max_model_len, budget.max_num_reqs = sched, max_model_len, seqs
    budget.mm_limits = dict(limits)
    budget.encoder_compute_budget, budget.encoder_cache_size = compute, cache
    budget.max_tokens_by_modality = budget.mm_max_toks_per_item = dict(max_toks)
    modality = budget.get_modality_with_max_tokens()
    _, items = getattr(budget, get_items)(modality, max_toks[modality])
    return budget.get_encoder_budget(), modality, items


def _processed(builder, modality, max_model_len):
    import inspect
    args = {"seq_len": max_model_len, "mm_counts": {modality: 1}}
    if "mm_options" in inspect.signature(builder.get_dummy_mm_data).parameters:
        args["mm_options"] = {}
    item = builder.get_dummy_mm_data(**args)[modality][0]
    if modality == "video":
        from transformers.models.qwen2_vl.video_processing_qwen2_vl import Qwen2VLVideoProcessor
        video = item[0] if isinstance(item, tuple) else item  # 0.33: (frames, metadata)
        out = Qwen2VLVideoProcessor(**PREPROCESSOR)(videos=[video], return_tensors="pt")
        frames, size = video.shape[0], [int(video.shape[2]), int(video.shape[1])]
        grid, pixels = out["video_grid_thw"][0], out["pixel_values_videos"]
    else:
        from transformers.models.qwen2_vl.image_processing_qwen2_vl import Qwen2VLImageProcessor
        out = Qwen2VLImageProcessor(**PREPROCESSOR)(images=[item], return_tensors="pt")
        frames, size = 1, list(item.size)
        grid, pixels = out["image_grid_thw"][0], out["pixel_values"]
    return {"frames": int(frames), "width_height": size, "grid_thw": [int(x) for x in grid],
            "pixel_rows": int(pixels.shape[0]), "pixel_row_values": int(pixels.shape[1]),
            "processor_pixel_dtype": str(pixels.dtype).replace("torch.", "")}


def run_case(case, hf_config) -> dict:
    max_model_len, batched, seqs, limit_text = case
    info, builder = _info(hf_config)
    limits = _limits(limit_text)
    on = [m for m in limits if limits[m] > 0]
    # the registry asks for one item of each modality whose limit is above 0 and keeps those modalities only
    # (0.11.0 multimodal/registry.py get_max_tokens_per_item_by_nonzero_modality; 0.33.0 encoder_budget.py
    # tower_modalities): that filter is repeated here, as the registry needs a loaded model config
    asked = dict(info.get_mm_max_tokens_per_item(seq_len=max_model_len, mm_counts=dict.fromkeys(on, 1)))
    max_toks = {m: asked[m] for m in on}
    encoder_budget, modality, items = _budget(max_model_len, batched, seqs, max_toks, limits)
    out = {"case": {"model": "qwen2.5-vl-7b", "max_model_len": max_model_len, "max_num_batched_tokens": batched,
                    "max_num_seqs": seqs, "limit_mm_per_prompt": limit_text},
           "vllm": {"max_tokens_per_item": max_toks, "profiled_modality": modality, "items_per_batch": items,
                    "encoder_budget": encoder_budget}}
    if modality is not None:
        item = _processed(builder, modality, max_model_len)
        g = item["grid_thw"]
        out["vllm"].update(item_tokens=g[0] * g[1] * g[2] // PREPROCESSOR["merge_size"] ** 2, **item)
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    import vllm
    from transformers import AutoConfig
    import transformers
    from estimator.models.presets import get_hf_config
    config = dict(get_hf_config("qwen2.5-vl-7b"))
    hf_config = AutoConfig.for_model(config.pop("model_type"), **config)
    records = [run_case(case, hf_config) for case in CASES]
    import os
    import torchvision
    command = (f"PYTHONPATH={os.environ.get('PYTHONPATH', '')} {sys.executable} -m validation.vllm.mm_records --out "
               f"{args.out}  (vllm=={vllm.__version__}, transformers=={transformers.__version__}, "
               f"torchvision=={torchvision.__version__}; CPU only)")
    write_json(args.out, {"command": command, "vllm_version": vllm.__version__, "preprocessor_config": PREPROCESSOR,
                          "records": records})
    print(f"{len(records)} records -> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
