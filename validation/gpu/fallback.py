"""The HF harness's fake-tensor step with transformers' torch fallbacks in place of the hybrid models' CUDA
kernels: what a GPU without mamba-ssm / causal-conv1d / flash-linear-attention runs (transformers logs "falling
back to its reference PyTorch implementation"). The H200 ran Falcon-H1-0.5B that way (tests/test_accuracy.py
KNOWN_GPU_GAPS, MAMBA_FALLBACK_FAKE_PEAKS); this gives the peak that run is compared with.

    python -m validation.gpu.fallback CASE_ID...   # one JSON line per case: the peak and each phase's
"""

from __future__ import annotations

import contextlib
import json
import sys


def fallback_peaks(case_id: str) -> dict:
    """The case's measured step (validation/hf/step.py) with `hybrid_kernels` replaced by a null context."""
    from ..hf import step
    from ..hf.cases import CASES

    emulated = step.hybrid_kernels
    step.hybrid_kernels = lambda tracker: contextlib.nullcontext()
    try:
        measured = step.measure(CASES[case_id])
    finally:
        step.hybrid_kernels = emulated
    return {"peak_bytes": measured["peak_bytes"], "phases": {p: v["total"] for p, v in measured["phases"].items()}}


def main(argv: list[str]) -> int:
    import transformers

    for case_id in argv:
        print(json.dumps({"id": case_id, "transformers": transformers.__version__, **fallback_peaks(case_id)}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
