"""vLLM's MXFP4 experts (gpt-oss) by release and GPU (estimator/serving/mxfp4_experts.py): the backend each
release picks, the Triton swizzle on Hopper against the sizes each release's own triton_kernels produces
(tests/data/serving/mxfp4-hopper-swizzle.json, validation/vllm/mxfp4_swizzle.py), the layouts by hand."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from estimator.models.presets import get_architecture, get_hf_config
from estimator.serving.mxfp4_experts import INTERMEDIATE_ALIGN, LAYOUTS, triton_hopper_layout
from estimator.serving.vllm_engine import estimate_vllm
from estimator.serving.weights import WeightFormat, stage_weights
from estimator.spec.hardware import Hardware
from estimator.spec.parallel import Parallel
from estimator.spec.serving import Serving

SWIZZLE = json.loads((Path(__file__).parent / "data" / "serving" / "mxfp4-hopper-swizzle.json").read_text())


def serve(model: str, gpu: str = "h100-80", tp: int = 1, **serving):
    return estimate_vllm(get_architecture(model), Serving(**serving), Parallel(tp=tp), Hardware(gpu),
                         get_hf_config(model))


@pytest.mark.parametrize("record", SWIZZLE["records"], ids=lambda r: r["vllm_version"])
def test_swizzled_sizes_are_each_release_triton_kernels(record):
    """Values and scales of one expert as each release's bundled triton_kernels swizzles them on Hopper, for
    gpt-oss's gate-up and down at 2880, 1472 and 768 intermediate columns a rank: our layout of that release."""
    assert "-m validation.vllm.mxfp4_swizzle --out" in SWIZZLE["command"]
    release = tuple(int(x) for x in record["vllm_version"].split(".")[:2])
    layout = triton_hopper_layout(release)
    for m in record["matrices"]:
        loaded_scales = m["rows"] * (m["inputs"] // 32) if layout.scales_kept else 0
        assert layout.matrix_bytes(m["rows"], m["inputs"]) == m["value_bytes"] + m["scale_bytes"] + loaded_scales


def test_swizzle_records_cover_every_layout():
    """Each layout record is checked against its release's triton_kernels; the 64 pre-pad shows in 0.17-0.21."""
    recorded = {tuple(int(x) for x in r["vllm_version"].split(".")[:2]) for r in SWIZZLE["records"]}
    assert {layout.release for layout in LAYOUTS} <= recorded and INTERMEDIATE_ALIGN == 64
    by_release = {r["vllm_version"]: r["matrices"] for r in SWIZZLE["records"]}
    down_1472 = lambda v: next(m for m in by_release[v] if m["inputs"] == 1472)["value_bytes"]  # noqa: E731
    assert down_1472("0.19.0") == 2880 * 768 and down_1472("0.15.0") == down_1472("0.25.0") == 2880 * 736


# gpt-oss-20b at TP 2: 32 experts a rank, hidden 2880, intermediate 2880 / 2 = 1440 padded to 1472 (multiple of
# 64); gate-up (2944 x 2880) and down (2880 x 1472), values half a byte, one uint8 scale per 32 inputs
_E, _H, _I = 32, 2880, 1472
_BIAS_FP32 = _E * 4 * (2 * _I + _H)
_LOADED_SCALES = _E * (2 * _I * 90 + _H * 46)
_SWIZZLED_SCALES = _E * (3072 * 90 + 3072 * 46)  # rows to 256: 2944 -> 3072, 2880 -> 3072
_VALUES_MMA = _E * (2 * _I * 1440 + _H * 736)  # rows to 16, packed inputs to 32: nothing to pad
_VALUES_PREPAD_64 = _E * (2 * _I * 1472 + _H * 768)  # packed inputs 1440 -> 1472, 736 -> 768


@pytest.mark.parametrize("version, per_layer", [
    ("0.15", _VALUES_MMA + _SWIZZLED_SCALES + _LOADED_SCALES + _BIAS_FP32),
    ("0.17", _VALUES_PREPAD_64 + _SWIZZLED_SCALES + _LOADED_SCALES + _BIAS_FP32),
    ("0.19", _VALUES_PREPAD_64 + _SWIZZLED_SCALES + _LOADED_SCALES + _BIAS_FP32),
    ("0.21", _VALUES_PREPAD_64 + _SWIZZLED_SCALES + _LOADED_SCALES + _BIAS_FP32),
    ("0.25", _VALUES_MMA + _SWIZZLED_SCALES + _BIAS_FP32),
    ("0.33", _VALUES_MMA + _E * (3072 * 92 + 3072 * 48) + _BIAS_FP32),  # scale groups to 4: 90 -> 92, 46 -> 48
])
def test_rule_mxfp4_triton_hopper_layout(version, per_layer):
    """On Hopper from 0.15 the 'TRITON' backend swizzles gpt-oss's experts for triton_kernels
    (serving/mxfp4_triton.py); the unswizzled layout (values, scales, bf16 biases, unpadded) is the reference."""
    arch = get_architecture("gpt-oss-20b")
    plain_layer = _E * (2 * 1440 * _H * (1 / 2 + 1 / 32) + _H * 1440 * (1 / 2 + 1 / 32) + 2 * (2 * 1440 + _H))
    fmt = serve("gpt-oss-20b", tp=2, max_model_len=8192, engine_version=version).resolved.weights
    swizzled = stage_weights(arch, fmt, 2, 1, 1, 0, range(24)).bytes
    plain = stage_weights(arch, WeightFormat("mxfp4"), 2, 1, 1, 0, range(24)).bytes
    assert swizzled - plain == round(24 * (per_layer - plain_layer))


def test_rule_mxfp4_backend_by_architecture():
    """Marlin padding below sm90, on sm120 and everywhere in 0.11; the Triton layout on Hopper from 0.15;
    FlashInfer TRTLLM's padding with fp32 biases on sm100; gpt-oss's fp32 RoPE cache (131,072 x 64 x 4 B)."""
    fmt = lambda gpu, v: serve("gpt-oss-20b", gpu, max_model_len=8192, engine_version=v).resolved.weights  # noqa: E731
    marlin = ((128, 256), False, None)
    layout = lambda f: (f.mxfp4_padding, f.mxfp4_fp32_bias, f.mxfp4_triton and f.mxfp4_triton.release)  # noqa: E731
    assert layout(fmt("a100-80", "0.19")) == layout(fmt("rtx-5090", "0.19")) == marlin
    assert layout(fmt("h100-80", "0.11")) == layout(fmt("b200", "0.11")) == layout(fmt("l40s", "0.33")) == marlin
    assert layout(fmt("h200", "0.19")) == (None, False, (0, 17))
    assert layout(fmt("h100-80", "0.15")) == (None, False, (0, 15))
    assert layout(fmt("b200", "0.15")) == layout(fmt("b300", "0.25")) == ((256, 256), True, None)
    assert layout(fmt("gb200", "0.33")) == ((128, 256), True, None)
    assert layout(fmt("mi300x", "0.11")) == ((256, 256), False, None)
    assert layout(fmt("mi300x", "0.19")) == (None, False, None)
    arch = get_architecture("gpt-oss-20b")
    with_rope = stage_weights(arch, WeightFormat("mxfp4"), 1, 1, 1, 0, range(24), 131072, rope_dtype_bytes=4).bytes
    assert with_rope - stage_weights(arch, WeightFormat("mxfp4"), 1, 1, 1, 0, range(24)).bytes == 131072 * 64 * 4


@pytest.mark.parametrize("version, inter", [("0.19", 3072), ("0.33", 2944)])
def test_rule_mxfp4_flashinfer_trtllm_padding(version, inter):
    """gpt-oss-20b on a B200 (32 experts, 2880 x 2880): the intermediate size padded to 256 (3072; 0.33: to 128,
    2944) and the hidden size to 256 (3072), the biases in fp32."""
    arch = get_architecture("gpt-oss-20b")
    fmt = serve("gpt-oss-20b", "b200", max_model_len=8192, engine_version=version).resolved.weights
    per_layer = lambda i, h, bias: 32 * (3 * i * h * (1 / 2 + 1 / 32) + bias * (2 * i + h))  # noqa: E731
    padded = stage_weights(arch, fmt, 1, 1, 1, 0, range(24)).bytes
    plain = stage_weights(arch, WeightFormat("mxfp4"), 1, 1, 1, 0, range(24)).bytes
    assert padded - plain == round(24 * (per_layer(inter, 3072, 4) - per_layer(2880, 2880, 2)))
