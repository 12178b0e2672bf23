"""A measured torchtune case as the JSON record under tests/data/measured/torchtune/."""

from __future__ import annotations

from pathlib import Path

from ..record import RECORDS as HF_RECORDS, load_all as load_records, package_versions, write_record

RECORDS = HF_RECORDS / "torchtune"

METHOD = (
    "fake-tensor CPU emulation of CUDA, as for the HF records (validation/record.py): torchtune's "
    "own model builder and the step of recipes/full_finetune_single_device.py (loss * tokens, "
    "backward, scale_grads, optimizer step, zero_grad; or per-parameter optimizers stepped in "
    "the backward) run under torch FakeTensorMode on CPU; every tensor storage is logged when "
    "an op creates it and when it is freed, rounded up to 512 bytes as the CUDA caching "
    "allocator does. The model is built on the meta device in bf16, its RoPE buffers computed "
    "for real (they stay on the GPU: counted with the activations, also given in buffer_bytes), "
    "then given fake CPU storage. CUDA behaviour emulated: FlashAttention-2 allocations for SDPA "
    "(torchtune expands the KV heads before it), F.rms_norm dispatched as on CUDA (validation/emulation.py "
    "fused_rms_norm; torchtune's fp32 input with a bf16 scale takes the composite path there too: "
    "layer_norm.cpp refuses the fused kernel on a dtype mismatch), fused AdamW with its step counters on the "
    "device, host scalars not counted. Activation offloading: torchtune's OffloadActivations "
    "runs unchanged with CUDA streams and events as no-ops, its pinned host copies not counted "
    "and each copy back a new device storage (validation/torchtune/emulation.py). torchao "
    "AdamW8bit: its 8-bit states (uint8 codes, fp32 scale per 256, qmap) are measured; its "
    "torch.compile'd per-parameter step runs eagerly and uncounted (updates in place). Step 2 "
    "is measured. Categories: parameters, gradients, optimizer_states, activations (everything "
    "else, buffers and the batch included). Validated byte for byte against real CPU runs of "
    "tiny models (tests/test_harness_torchtune.py)."
)


def versions() -> dict:
    return package_versions("torch", "torchtune", "torchao")


def record(case: str) -> dict:
    from .cases import CASES, contract_config, describe
    from .step import measure

    run = CASES[case]
    return {
        "id": case,
        "description": describe(run),
        "config": contract_config(run),
        "measured": measure(run),
        "step_measured": 2,
        "method": METHOD,
        "versions": versions(),
        "command": f"python -m validation.torchtune measure {case}",
    }


def write(case: str, directory: Path = RECORDS) -> Path:
    return write_record(record(case), directory)


def load_all(directory: Path = RECORDS) -> list[dict]:
    return load_records(directory)
