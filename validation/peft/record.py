"""A measured LoRA / QLoRA case as the JSON record under tests/data/measured/peft/."""

from __future__ import annotations

from pathlib import Path

from ..record import RECORDS as HF_RECORDS, load_all as load_records, package_versions, write_record

RECORDS = HF_RECORDS / "peft"

METHOD = (
    "fake-tensor CPU emulation of CUDA, as for the HF records (validation/record.py): the real "
    "transformers model code wrapped by the real peft LoRA layers runs one HF-Trainer training "
    "step under torch FakeTensorMode on CPU; every tensor storage is logged when an op creates it "
    "and when it is freed, rounded up to 512 bytes as the CUDA caching allocator does. The model "
    "is built on the meta device, wrapped by get_peft_model there (adapters in fp32, peft's "
    "default for a bf16 base), then given fake CPU storage. QLoRA: every nn.Linear inside the "
    "decoder layers is bitsandbytes' Linear4bit as transformers' load_in_4bit builds it and peft's "
    "lora.bnb.Linear4bit wraps it, emulated from their source (validation/peft/bnb.py: Params4bit's "
    "packed codes and quantization state, MatMul4Bit's dequantized weight in forward and backward "
    "and what it keeps, by bitsandbytes release), equal byte for byte to real bitsandbytes 0.49.2 on "
    "tiny CPU runs. CUDA behaviour emulated: "
    "FlashAttention-2 allocations for SDPA, dropout as the fused native_dropout (bool mask), "
    "fused AdamW (the Trainer's default) over the trainable parameters with its step counters on "
    "the device, grad-norm clipping to 1.0, host scalars not counted. Gradient checkpointing as "
    "the Trainer turns it on (non-reentrant per layer; input embeddings require grad). Step 2 is "
    "measured; the logits are dropped before backward. Categories: parameters (frozen and "
    "trainable, 4-bit codes and quantization states included; split in parameter_bytes), gradients, "
    "optimizer_states (exp_avg, exp_avg_sq, step), activations (everything else). "
    "parameter_counts.trainable is peft's get_nb_trainable_parameters(). Validated byte for "
    "byte against real CPU runs of tiny models (tests/test_harness_peft.py)."
)


def versions() -> dict:
    return package_versions("torch", "transformers", "peft")


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
        "command": f"python -m validation.peft measure {case}",
    }


def write(case: str, directory: Path = RECORDS) -> Path:
    return write_record(record(case), directory)


def load_all(directory: Path = RECORDS) -> list[dict]:
    return load_records(directory)
