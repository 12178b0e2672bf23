"""The HF harness's fake-tensor step with transformers' torch fallbacks in place of the hybrid models' CUDA
kernels: what a GPU without mamba-ssm / causal-conv1d / flash-linear-attention runs (transformers logs "falling
back to its reference PyTorch implementation"). The H200 ran Falcon-H1-0.5B that way under transformers 5.17
(tests/test_accuracy.py MAMBA_FALLBACK_FAKE_PEAKS: the estimate's `ssm_kernels: torch_5.17`); under 5.23 the
estimate's `ssm_kernels: torch` is held to the records this writes (tests/data/measured/ssm_torch/,
tests/test_ssm_torch.py). A Jamba or Qwen3-Next case runs its Mamba-1 or Gated DeltaNet fallback the same way.

    python -m validation.gpu.fallback CASE_ID...           # one JSON line per case: the peak and each phase's
    python -m validation.gpu.fallback --write CASE_ID...   # the records, under tests/data/measured/ssm_torch/
"""

from __future__ import annotations

import contextlib
import json
import sys

from ..core.record import MEASURED, write_record

RECORDS = MEASURED / "ssm_torch"  # apart from the fused-kernel records of the same cases (tests/data/measured/)
NOTE = ("Hybrid models' SSM kernels: transformers' torch fallback (no mamba-ssm, causal-conv1d or "
        "flash-linear-attention installed): validation/hybrid/kernels.py's emulation of the CUDA kernels is off, so the "
        "reference PyTorch functions transformers falls back to (mamba2_chunk_scan, causal_conv1d_fn, ...) run as they "
        "are, under the same fake-tensor tracking.")


@contextlib.contextmanager
def torch_fallback():
    """validation/hf/step.py's `hybrid_kernels` replaced by a null context while inside."""
    from ..hf import step

    emulated = step.hybrid_kernels
    step.hybrid_kernels = lambda tracker: contextlib.nullcontext()
    try:
        yield
    finally:
        step.hybrid_kernels = emulated


def fallback_peaks(case_id: str) -> dict:
    """The case's measured step (validation/hf/step.py) on the torch fallback."""
    from ..hf import step
    from ..hf.cases import CASES

    with torch_fallback():
        measured = step.measure(CASES[case_id])
    return {"peak_bytes": measured["peak_bytes"], "phases": {p: v["total"] for p, v in measured["phases"].items()}}


def fallback_record(case_id: str) -> dict:
    """The HF harness's record of the case (validation/core/harness.py) on the torch fallback: its configuration with
    `ssm_kernels: torch`, the method with NOTE, the command that makes it."""
    from ..core.harness import harnesses

    with torch_fallback():
        record = harnesses()["hf"].record(case_id)
    record["config"]["training"]["ssm_kernels"] = "torch"
    record["description"] += "; transformers' torch fallback of the SSM kernels"
    record["method"] = record["method"] + " " + NOTE
    record["command"] = f"python -m validation.gpu.fallback --write {case_id}"
    return record


def main(argv: list[str]) -> int:
    import transformers

    if argv[:1] == ["--write"]:
        for case_id in argv[1:]:
            print(write_record(fallback_record(case_id), RECORDS))
        return 0
    for case_id in argv:
        print(json.dumps({"id": case_id, "transformers": transformers.__version__, **fallback_peaks(case_id)}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
