"""A measured Megatron-Core case as the JSON record under tests/data/measured/megatron/."""

from __future__ import annotations

from pathlib import Path

from ..record import RECORDS as HF_RECORDS, load_all as load_records, package_versions, write_record

RECORDS = HF_RECORDS / "megatron"

METHOD = (
    "fake-tensor CPU emulation of one rank: Megatron-Core's GPTModel (local layer spec; TE's fused "
    "attention and RMSNorm/LayerNorm replaced by stand-ins making TE's allocations, see "
    "validation/megatron/kernels.py; Megatron's jit_fuser functions, torch.compile kernels in "
    "production, allocate only their outputs, see validation/megatron/fused.py) for this rank's "
    "pipeline stage, wrapped in Megatron's DDP (fp32 grad buffer) and optimizer (distributed "
    "where stated), runs under torch FakeTensorMode with torch's fake process group playing a "
    "world of tp x cp x dp x pp ranks. A TorchDispatchMode registers every storage when created "
    "and freed (512-byte rounding). One micro-batch: forward (the previous stage's hidden states received and kept; non-last "
    "stages' output pseudo-freed after sending) and backward (from the loss, or from a received "
    "output gradient). Step 2 is measured (step 1 made the optimizer states). Categories: "
    "parameters (the model's bf16 parameters / param buffer), gradients (DDP's fp32 main_grad "
    "buffers), optimizer_states (fp32 main parameters and Adam moments), activations "
    "(everything else). MoE runs use drop-and-pad to the capacity factor (static shapes). "
    "Validated byte for byte against real CPU runs of tiny models (tests/test_harness_megatron.py)."
)


def versions() -> dict:
    return package_versions("megatron-core", "torch")


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
                        "layers_built layers; per-layer figures are layer_kept_bytes")
        + ("; every layer is MoE (the local layer spec builds MoE layers throughout, so the config "
           "says first_dense_layers 0)" if setup.arch.num_experts else ""),
        "not_expressible": not_expressible(setup),
        "measured": measure(setup),
        "step_measured": 2,
        "micro_batches_measured": 1,
        "method": METHOD,
        "versions": versions(),
        "command": f"python -m validation.megatron measure {case}",
    }


def write(case: str, directory: Path = RECORDS) -> Path:
    return write_record(record(case), directory)


def load_all(directory: Path = RECORDS) -> list[dict]:
    return load_records(directory)
