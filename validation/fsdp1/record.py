"""A measured FSDP1 case as the JSON record under tests/data/measured/fsdp1/."""

from __future__ import annotations

from pathlib import Path

from ..record import RECORDS as HF_RECORDS, package_versions, write_record

RECORDS = HF_RECORDS / "fsdp1"

METHOD = (
    "fake-tensor CPU emulation of CUDA, rank 0 of a fake process group (FakeStore, backend 'fake'): the real "
    "transformers model code wrapped by torch's own FullyShardedDataParallel (FSDP1) as Accelerate's plugin "
    "configures it for the HF Trainer, run under torch FakeTensorMode on the CPU device handle; every tensor "
    "storage is logged when an op creates it and when it is freed (FSDP's storage resizes included), rounded up "
    "to 512 bytes as the CUDA caching allocator does. CUDA behaviour emulated as for the HF records: "
    "FlashAttention-2 allocations for SDPA, the packed-sequence check. Streams and events are the CPU handle's "
    "no-ops: allocations in the order the CPU issues them, without a GPU stream's delayed block reuse. Step 2 is "
    "measured. Phases: accumulate (micro-batches before the last, under no_sync), forward and backward (the last "
    "micro-batch), optimizer (FSDP clip_grad_norm_ and fused AdamW). Categories: parameters (each unit's sharded "
    "fp32 FlatParameter, `_local_shard`), gradients (the sharded gradients), optimizer_states (exp_avg, "
    "exp_avg_sq, step), activations (everything else: unsharded bf16 FlatParameters and gradients, saved tensors, "
    "temporaries, buffers, the batch). Validated byte for byte against real CPU runs of tiny models "
    "(tests/test_harness_fsdp1.py)."
)


def versions() -> dict:
    return package_versions("torch", "transformers", optional=("peft",))


def record(case: str) -> dict:
    from .cases import CASES, contract_config, describe
    from .step import measure

    run = CASES[case]
    return {"id": case, "description": describe(run), "config": contract_config(run), "measured": measure(run),
            "step_measured": 2, "method": METHOD, "versions": versions(),
            "command": f"python -m validation.fsdp1 measure {case}"}


def write(case: str, directory: Path = RECORDS) -> Path:
    return write_record(record(case), directory)
