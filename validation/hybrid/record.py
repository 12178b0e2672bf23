"""A measured hybrid case as the JSON record under tests/data/measured/hybrid/."""

from __future__ import annotations

from pathlib import Path

from ..record import METHOD as HF_METHOD
from ..record import RECORDS as HF_RECORDS
from ..record import package_versions, write_record

RECORDS = HF_RECORDS / "hybrid"

KERNEL_VERSIONS = {  # the sources each emulation reads (validation/hybrid/kernels.py)
    "flash-linear-attention": "fla-org/flash-linear-attention@bc3b101 (v0.5.2-47)",
    "causal-conv1d": "Dao-AILab/causal-conv1d@0d2252d (v1.6.1.post4)",
    "mamba-ssm": "state-spaces/mamba@e9594ce (v2.3.2.post1-9)",
}

METHOD = HF_METHOD + (
    " Hybrid layers: the CUDA-only kernels transformers calls when their packages are installed are emulated "
    "as autograd Functions that allocate what the kernels' Python wrappers allocate, in order, and save what "
    "their ctx.save_for_backward saves (validation/hybrid/kernels.py): causal-conv1d's CausalConv1dFn, "
    "flash-linear-attention's ChunkGatedDeltaRuleFunction (l2-normalised q/k in the kernel, chunk 64), "
    "mamba-ssm's MambaSplitConv1dScanCombinedFn (conv, chunked scan, gated RMSNorm and output projection "
    "fused); their values on a real CPU run are transformers' torch fallbacks (tests/test_harness_hybrid.py)."
)


def record(case: str) -> dict:
    from .cases import CASES, contract_config, describe
    from .step import measure

    run = CASES[case]
    return {"id": case, "description": describe(run), "config": contract_config(run), "measured": measure(run),
            "step_measured": 2, "method": METHOD,
            "versions": package_versions("torch", "transformers") | {"kernels_emulated": KERNEL_VERSIONS},
            "command": f"python -m validation.hybrid measure {case}"}


def write(case: str, directory: Path = RECORDS) -> Path:
    return write_record(record(case), directory)
