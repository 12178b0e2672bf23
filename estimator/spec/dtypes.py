"""Numeric formats and how many bytes one element of each takes.

Block-scaled formats carry a scale per block of elements, so their cost per element is
fractional: NVFP4 stores 4-bit values with one FP8 (E4M3) scale per 16 elements, which is
0.5 + 1/16 = 0.5625 bytes (NVIDIA, "Introducing NVFP4", 2025; Megatron's
`elastification/memory_config.py` uses the same 0.5625). MXFP4 uses one 8-bit scale per 32
(OCP Microscaling spec v1.0): 0.5 + 1/32. int8/int4 weights for inference use one fp16 scale per
group of 128 (the common GPTQ/AWQ group size).
"""

from __future__ import annotations

BYTES_PER_ELEMENT: dict[str, float] = {
    "fp32": 4.0,
    "bf16": 2.0,
    "fp16": 2.0,
    "fp8": 1.0,
    "int8": 1.0 + 2.0 / 128,
    "int4": 0.5 + 2.0 / 128,
    "fp4": 0.5 + 1.0 / 16,  # NVFP4: one E4M3 scale per 16 values
    "mxfp4": 0.5 + 1.0 / 32,  # OCP MX: one E8M0 scale per 32 values
}

TRAINING_DTYPES = ("fp32", "bf16", "fp16", "fp8", "fp4")
INFERENCE_WEIGHT_DTYPES = ("fp32", "bf16", "fp16", "fp8", "int8", "int4", "fp4", "mxfp4")


def bytes_per_element(dtype: str) -> float:
    return BYTES_PER_ELEMENT[dtype]
