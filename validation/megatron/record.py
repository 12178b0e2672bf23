"""A measured Megatron-Core case as the JSON record under tests/data/measured/megatron/."""

from __future__ import annotations

import json
import platform
from pathlib import Path

RECORDS = Path(__file__).resolve().parents[2] / "tests" / "data" / "measured" / "megatron"

METHOD = (
    "fake-tensor CPU emulation of one rank: Megatron-Core's GPTModel (local layer spec; TE's fused "
    "attention and RMSNorm/LayerNorm replaced by stand-ins making TE's allocations, see "
    "validation/megatron/kernels.py) for this rank's pipeline stage, wrapped in Megatron's DDP "
    "(fp32 grad buffer) and optimizer (distributed where stated), runs under torch FakeTensorMode "
    "with torch's fake process group playing a world of tp x cp x dp x pp ranks. A "
    "TorchDispatchMode registers every storage when created and freed (512-byte rounding). One "
    "micro-batch: forward (the previous stage's hidden states received and kept; non-last "
    "stages' output pseudo-freed after sending) and backward (from the loss, or from a received "
    "output gradient). Step 2 is measured (step 1 made the optimizer states). Categories: "
    "parameters (the model's bf16 parameters / param buffer), gradients (DDP's fp32 main_grad "
    "buffers), optimizer_states (fp32 main parameters and Adam moments), activations "
    "(everything else). MoE runs use drop-and-pad to the capacity factor (static shapes). "
    "Validated byte for byte against real CPU runs of tiny models (tests/test_harness_megatron.py)."
)


def versions() -> dict:
    from importlib.metadata import version

    import torch

    return {"megatron-core": version("megatron-core"), "torch": torch.__version__,
            "python": platform.python_version()}


def record(case: str) -> dict:
    from .cases import CASES, contract_config, describe, not_expressible
    from .harness import measure

    setup = CASES[case]
    return {
        "id": case,
        "description": describe(setup),
        "config": contract_config(setup),
        "stage": setup.stage_index,
        "layers_built": setup.stage_layers,
        "layers_note": ("the config's num_layers is layers_built x pp: every stage holds "
                        "layers_built layers; per-layer figures are layer_kept_bytes"),
        "not_expressible": not_expressible(setup),
        "measured": measure(setup),
        "step_measured": 2,
        "micro_batches_measured": 1,
        "method": METHOD,
        "versions": versions(),
        "command": f"python -m validation.megatron measure {case}",
    }


def write(case: str, directory: Path = RECORDS) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{case}.json"
    path.write_text(json.dumps(record(case), indent=2) + "\n")
    return path


def load_all(directory: Path = RECORDS) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted(directory.glob("*.json"))]
