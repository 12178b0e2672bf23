"""A measured Accelerate case as the JSON record under tests/data/measured/accelerate/."""

from __future__ import annotations

from pathlib import Path

from ..record import RECORDS as HF_RECORDS
from ..record import package_versions, write_record

RECORDS = HF_RECORDS / "accelerate"

METHOD = (
    "fake-tensor CPU emulation of CUDA, as for the HF and PEFT records (validation/record.py, validation/peft/"
    "record.py): the plain harness's model and optimizer (foreach AdamW for full fine-tuning, fused AdamW over "
    "fp32 LoRA adapters), prepared by the real accelerate Accelerator(mixed_precision, cpu=True).prepare, which "
    "replaces model.forward by convert_outputs_to_fp32(autocast(forward)) (native_amp; autocast on the CPU "
    "device), then the HF Trainer's step: compute_loss (the outputs, fp32 logits included, alive until it "
    "returns), accelerator.backward, accelerator.clip_grad_norm_(1.0), optimizer step, grads set to None. Every "
    "tensor storage is logged when an op creates it and when it is freed, rounded up to 512 bytes. CUDA "
    "behaviour emulated: FlashAttention-2 allocations for SDPA (inputs cast to the autocast dtype, as CUDA "
    "autocast lists SDPA), fused dropout, device step counters of fused AdamW, host scalars not counted. Step 2 "
    "is measured. Categories as the plain records'. The harness's step equals transformers.Trainer.training_step's "
    "allocations on tiny real CPU runs (tests/test_harness_accelerate.py)."
)


def versions() -> dict:
    return package_versions("torch", "transformers", "accelerate", optional=("peft",))


def record(case: str) -> dict:
    from .cases import CASES, contract_config, describe
    from .harness import measure

    run = CASES[case]
    return {
        "id": case,
        "description": describe(run),
        "config": contract_config(run),
        "measured": measure(run),
        "step_measured": 2,
        "method": METHOD,
        "versions": versions(),
        "command": f"python -m validation.accelerate measure {case}",
    }


def write(case: str, directory: Path = RECORDS) -> Path:
    return write_record(record(case), directory)
