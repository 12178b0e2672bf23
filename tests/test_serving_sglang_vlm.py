"""Vision-language models served by SGLang 0.5.23 (issue 24): Qwen2.5-VL (served multimodal by default) and Gemma 3
(text-only unless --enable-multimodal), by hand from SGLang's source (estimator/serving/sglang_vlm.py). SGLang's own
resolution and pool sizing for them are held exactly in tests/test_serving_sglang.py (its records include these
models, made by validation/sglang/pool_records.py)."""

from __future__ import annotations

import pytest

from estimator.models.presets import get_architecture, get_hf_config
from estimator.serving.checkpoint import checkpoint_format, context_length
from estimator.serving.encoder import encoder_weights
from estimator.serving.sglang_engine import estimate_sglang
from estimator.serving.sglang_vlm import vlm_fraction
from estimator.serving.vllm_engine import estimate_vllm
from estimator.serving.weights import stage_weights
from estimator.spec.errors import ConfigError
from estimator.spec.hardware import Hardware
from estimator.spec.parallel import Parallel
from estimator.spec.serving import Serving

MiB = 2**20
H100_MIB = 81559  # the catalog's H100 80GB, as SGLang's get_device_memory_capacity answers in the records


def _sglang(model, tp=1, gpu="h100-80", **serving):
    return estimate_sglang(get_architecture(model), Serving(engine="sglang", **serving), Parallel(tp=tp),
                           Hardware(gpu), get_hf_config(model))


def _text_weights(model, tp):
    cfg = get_hf_config(model)
    arch = get_architecture(model)
    return stage_weights(arch, checkpoint_format(cfg, None), tp, 1, 1, 0, range(arch.num_layers),
                         context_length(cfg)).bytes


@pytest.mark.parametrize("model, tp", [("qwen2.5-vl-7b", 1), ("qwen2.5-vl-7b", 2), ("gemma-3-27b", 1)])
def test_the_tower_is_loaded_served_or_not(model, tp):
    """models/qwen2_5_vl.py and models/gemma3_mm.py build the tower in __init__, with no --enable-multimodal check:
    its weights (its linears over TP, as vLLM's) are in the static share even for Gemma 3 served text-only."""
    e = _sglang(model, tp)
    assert e.stages[0].weights == _text_weights(model, tp) + encoder_weights(get_architecture(model), tp, 2)
    assert "vision encoder" in {c.key: c for c in e.stages[0].components}["weights"].formula


def test_qwen2_5_vl_share_and_pool_by_hand():
    """H100, TP 1: chunked_prefill_size 8192 and 256 decode graphs; served multimodal, the prefill graphs are off
    (Qwen2.5-VL is not on the breakable allow-list), so the reserve is 512 + 1.5 x 8192 + 1/8 x 1024 + 2 x 256 =
    13,440 MiB: round((81,559 - 13,440) / 81,559, 3) = 0.835, times 0.95 x (1 - 0.1 x (32 x 1280^2 / (24 x 1024^2)
    - 1)) for the 32-layer tower (its config says "depth"; transformers maps num_hidden_layers to it). The pools
    get pre-load x share - weights - the 100 MiB embedding cache."""
    e = _sglang("qwen2.5-vl-7b")
    share = 0.835 * 0.95 * (1 - 0.1 * (32 * 1280**2 / (24 * 1024**2) - 1))
    assert f"mem_fraction_static {share:g} " in e.notes[0]
    pre = e.total_bytes - e.context_bytes
    assert e.stages[0].available == int(pre * share) - e.stages[0].weights - 100 * MiB
    assert {c.key: c.bytes for c in e.stages[0].components}["mm_embedding_cache"] == 100 * MiB
    # --enable-multimodal off: the share of a text model (the prefill graphs' 58 x 8 MiB reserved too), no cache
    text = _sglang("qwen2.5-vl-7b", enable_multimodal=False)
    assert f"mem_fraction_static {round((H100_MIB - 13440 - 58 * 8) / H100_MIB, 3):g} " in text.notes[0]
    assert text.stages[0].available == int(pre * 0.83) - text.stages[0].weights
    assert "mm_embedding_cache" not in {c.key for c in text.stages[0].components}


def test_gemma3_vision_served_on_request():
    """--enable-multimodal for Gemma 3: its SigLIP (27 layers of 1152) lowers the share by 0.95 x (1 - 0.1 x
    (27 x 1152^2 / (24 x 1024^2) - 1)), the prefill graphs go, and 100 MiB is held; the weights do not move."""
    off, on = _sglang("gemma-3-27b"), _sglang("gemma-3-27b", enable_multimodal=True)
    share = 0.835 * 0.95 * (1 - 0.1 * (27 * 1152**2 / (24 * 1024**2) - 1))
    assert f"mem_fraction_static {share:g} " in on.notes[0] and "mem_fraction_static 0.83 " in off.notes[0]
    assert on.stages[0].weights == off.stages[0].weights
    pre = on.total_bytes - on.context_bytes
    assert on.stages[0].available == int(pre * share) - on.stages[0].weights - 100 * MiB


def test_vision_config_depth():
    assert vlm_fraction(0.835, {"architectures": ["Qwen2_5_VLForConditionalGeneration"],
                                "vision_config": {"depth": 32, "hidden_size": 1280}}) == pytest.approx(
        0.835 * 0.95 * (1 - 0.1 * (32 * 1280**2 / (24 * 1024**2) - 1)))


def test_enable_multimodal_refusals():
    with pytest.raises(ConfigError, match="empty with vLLM"):
        estimate_vllm(get_architecture("gemma-3-27b"), Serving(enable_multimodal=True), Parallel(),
                      Hardware("h100-80"), get_hf_config("gemma-3-27b"))
    with pytest.raises(ConfigError, match="empty for a text-only model"):
        _sglang("llama-3.1-8b", enable_multimodal=True)


def test_sglang_own_resolution_for_the_vlms():
    """SGLang's ServerArgs resolution, recorded on CPU (tests/data/serving/sglang-0.5.23.json): the prefill graphs
    off for a served VLM and kept for Qwen2.5-VL served text-only, and the share by hand above."""
    import json
    from pathlib import Path
    data = json.loads((Path(__file__).parent / "data" / "serving" / "sglang-0.5.23.json").read_text())
    vlm = {(r["case"]["model"], r["case"]["gpu"], r["case"]["tp"], r["case"]["pp"],
            r["case"]["serving"].get("enable_multimodal")): r["sglang"] for r in data["records"]
           if r["case"]["model"] in ("qwen2.5-vl-7b", "gemma-3-27b")}
    assert len(vlm) == 8
    served = vlm[("qwen2.5-vl-7b", "h100-80", 1, 1, None)]
    assert served["prefill_cuda_graph_backend"] == "disabled"
    assert served["mem_fraction_static"] == pytest.approx(0.835 * 0.95 * (1 - 0.1 * (32 * 1280**2 / (24 * 1024**2) - 1)))
    assert vlm[("qwen2.5-vl-7b", "h100-80", 1, 1, False)]["prefill_cuda_graph_backend"] == "breakable"
    assert vlm[("gemma-3-27b", "h100-80", 1, 1, None)]["mem_fraction_static"] == 0.83
    assert vlm[("gemma-3-27b", "h100-80", 1, 1, True)]["prefill_cuda_graph_backend"] == "disabled"
