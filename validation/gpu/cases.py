"""The cases run for real on a lent GPU: the HF and PEFT cases the fake-tensor harnesses already
measure (same configuration, same step), those that one H200 (141 GB) holds, plus small models at
which what fake tensors cannot see (library workspaces, the allocator's segments) is a visible share.

A case is (harness, run, allocator, wrapper): the harness is "hf" (validation/step.py), "peft"
(validation/peft/step.py), "bnb" (validation/gpu/bnb.py) or "kernel" (one framework kernel,
validation/gpu/kernels.py); the allocator is "default" or "expandable" (PYTORCH_CUDA_ALLOC_CONF=
expandable_segments:True, set before CUDA starts: each case runs in a process of its own); the wrapper
is "" or "accelerate" (the model prepared by a real Accelerator(mixed_precision="bf16") as the HF
Trainer does: validation/gpu/wrappers.py).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path

from ..hf.cases import CASES as HF_CASES, SMALL_RUNS, case_id as hf_case_id
from ..peft.build import ALL_SEVEN
from ..peft.cases import CASES as PEFT_CASES, case_id as peft_case_id
from ..hf.step import Run
from .bnb import BnbRun
from .kernels import KernelRun
from .deepspeed_step import RUNS as DEEPSPEED_RUNS
from .megatron_step import RUNS as MEGATRON_RUNS

MEASURED = Path(__file__).resolve().parents[2] / "tests" / "data" / "measured"
# What one H200 holds with room for the CUDA context and the allocator's cache (143,771 MiB total):
# cases whose fake-tensor peak is above this are left to a larger GPU.
H200_FITS_BYTES = 120 * 1024**3

# Small cases first (the workspaces' and segments' share is largest there), then the larger ones.
SMALL_HF = list(SMALL_RUNS)


@dataclass(frozen=True)
class GpuCase:
    harness: str  # "hf", "peft", "bnb", "kernel", or a framework's own step: "megatron", "deepspeed"
    run: object  # validation.step.Run, validation.peft.build.LoraRun or validation.gpu.kernels.KernelRun
    allocator: str = "default"  # or "expandable"
    wrapper: str = ""  # or "accelerate"

    @property
    def base_id(self) -> str:
        if self.harness in ("kernel", *FRAMEWORK_STEPS):
            return self.run.id
        if self.harness == "hf":
            return hf_case_id(self.run)
        base = peft_case_id(self.run)
        if self.harness == "bnb":
            base = peft_case_id(replace(self.run, prepare=False))  # nodq is the peft id's own
            base = base.replace("-qlora-", "-qlora-bnb-") + ("-prepared" if self.run.prepare else "")
        return base

    @property
    def id(self) -> str:
        suffix = ("" if self.allocator == "default" else "-expandable") + (f"-{self.wrapper}" if self.wrapper else "")
        return self.base_id + suffix

    @property
    def fake_record(self) -> Path:
        """The fake-tensor record of the same run (absent for a case measured on the GPU only)."""
        if self.harness in ("kernel", *FRAMEWORK_STEPS) or self.wrapper:
            return MEASURED / "none"
        base = hf_case_id(self.run) if self.harness == "hf" else peft_case_id(self.run)
        return MEASURED / ("" if self.harness == "hf" else "peft") / f"{base}.json"


# Mamba-2 hybrids whose GPU run would measure only transformers' torch fallback. The lent machines have no
# mamba-ssm (PyPI ships its source only, whose build fetches or compiles CUDA code; the machines have no network), so
# transformers 5.17 runs the reference `mamba2_chunk_scan` in place of mamba-ssm's fused
# `mamba_split_conv1d_scan_combined`, which the fake-tensor records (validation/hybrid/kernels.py) model. That
# fallback materialises per-chunk products the kernel never makes (Nemotron-H's
# `G = C[..., None, :, :] * B[..., None, :, :, :]`, 32 to 128 GiB at one request): on the H200 (2026-11-26)
# every Nemotron-H-8B and Falcon-H1-7B case ran out of memory there (the estimate with ssm_kernels 'torch_5.17':
# 155 to 591 GB, tests/test_ssm_torch.py). Falcon-H1-0.5B's two cases ran and are recorded (3.9x and 5.3x the
# kernel path's peak; their configs say ssm_kernels 'torch_5.17': records.py ran_ssm_kernels).
FALLBACK_ONLY_MODELS = ("nemotron-h-8b", "falcon-h1-7b")


def _fits(case: GpuCase) -> bool:
    if getattr(case.run, "model", "") in FALLBACK_ONLY_MODELS:
        return False
    path = case.fake_record
    if not path.exists():
        return True  # the small cases
    return json.loads(path.read_text())["measured"]["peak_bytes"] <= H200_FITS_BYTES


def cases() -> list[GpuCase]:
    small = [GpuCase("hf", r) for r in SMALL_HF]
    # the same allocations under expandable segments: reserved minus allocated, segment by segment
    expandable = [GpuCase("hf", SMALL_HF[0], "expandable"), GpuCase("hf", SMALL_HF[1], "expandable"),
                  GpuCase("hf", HF_CASES["llama-3.1-8b-bf16-adamw-norecompute-sdpa-s4096-b1"], "expandable")]
    first = [GpuCase("hf", HF_CASES[i]) for i in FIRST_HF] + [GpuCase("peft", PEFT_CASES[i]) for i in FIRST_PEFT]
    # a vision tower's attention is what the machine has (measure.py vision_attention), not a case of its own: the
    # fake harness's -sdpavision runs are the records a GPU without flash-attn is held to (records.py as_ran)
    # Falcon's flash_attention_2 runs need flash-attn's own import on the machine (modeling_falcon.py lines 51-52),
    # which the fake harness stands in for (validation/hf/falcon.py): not GPU cases until the machine has it
    rest = [GpuCase("hf", r) for r in HF_CASES.values()
            if r.vision_attention == "flash_attention_2" and r.attention != "flash_attention_2"]
    # QLoRA's torchao NF4 is not on the GPU machine; bitsandbytes neither
    rest += [GpuCase("peft", r) for r in PEFT_CASES.values() if r.base == "bf16"]
    bnb = [GpuCase("bnb", r) for r in BNB]
    ordered = ROUND_3 + ROUND_2 + bnb + first + small + expandable + [c for c in rest if c not in first]
    return [c for c in ordered if _fits(c)]


# QLoRA with bitsandbytes (validation/gpu/bnb.py): the two fake-tensor QLoRA records' runs, without
# double quantization, and with peft's prepare_model_for_kbit_training.
BNB = [BnbRun("llama-3.1-8b", 4096, rank=16, alpha=32, targets=ALL_SEVEN, recompute="full", base="nf4"),
       BnbRun("llama-3.1-8b", 2048, rank=64, alpha=16, targets="all-linear", base="nf4"),
       BnbRun("llama-3.1-8b", 2048, rank=64, alpha=16, targets="all-linear", base="nf4", double_quant=False),
       BnbRun("llama-3.1-8b", 4096, rank=16, alpha=32, targets=ALL_SEVEN, recompute="full", base="nf4", prepare=True),
       BnbRun("qwen2.5-7b", 4096, 2, rank=64, alpha=128, targets=ALL_SEVEN, recompute="full", base="nf4")]

# The larger cases a short lease runs first: each model and attention kind, recompute or not, LoRA
# on dense and MoE models.
FIRST_HF = ("llama-3.1-8b-bf16-adamw-norecompute-sdpa-s4096-b1", "qwen3-8b-bf16-adamw-norecompute-sdpa-s4096-b1",
            "qwen2.5-7b-bf16-adamw-norecompute-sdpa-s4096-b1", "gemma-2-9b-bf16-adamw-norecompute-eager-s2048-b1",
            "llama-3.1-8b-bf16-adamw-recompute-sdpa-s8192-b1", "llama-3.1-8b-amp-sgd-recompute-sdpa-s4096-b2")
FIRST_PEFT = ("llama-3.1-8b-lora-r16-qv-norecompute-drop00-s4096-b1", "llama-3.1-8b-lora-r16-all7-recompute-drop00-s4096-b1",
              "qwen2.5-7b-lora-r16-alllinear-recompute-drop00-s8192-b1", "qwen3-30b-a3b-lora-r8-qv-norecompute-drop00-s2048-b1",
              "llama-3.1-8b-dora-r16-qv-norecompute-drop00-s2048-b1")

# Second session with a GPU: what the first round could not see.
# - Accelerate's mixed-precision wrapping (accelerator.py prepare_model: autocast + convert_outputs_to_fp32),
#   on runs the first round measured without it: the difference is the wrapper's own.
# - bitsandbytes' paged optimizers (managed memory: outside max_memory_allocated/reserved).
# - Megatron-Core's native fused cross-entropy against the unfused one (the fp32 copy read from CPU
#   Inductor code in tests/data/measured/compile/).
ROUND_2 = [
    GpuCase("hf", Run("llama-3.2-1b", 2048), wrapper="accelerate"),
    GpuCase("hf", Run("qwen2.5-0.5b", 2048, 2), wrapper="accelerate"),
    GpuCase("hf", Run("llama-3.2-1b", 2048, recipe="amp"), wrapper="accelerate"),
    GpuCase("hf", Run("llama-3.1-8b", 4096), wrapper="accelerate"),
    GpuCase("peft", PEFT_CASES["llama-3.1-8b-lora-r16-qv-norecompute-drop00-s4096-b1"], wrapper="accelerate"),
    GpuCase("peft", PEFT_CASES["qwen2.5-7b-lora-r16-alllinear-recompute-drop00-s8192-b1"], wrapper="accelerate"),
    GpuCase("kernel", KernelRun("megatron-cross-entropy", 4096, 1, 128256)),
    GpuCase("kernel", KernelRun("megatron-cross-entropy", 4096, 2, 151936)),
    GpuCase("hf", Run("llama-3.2-1b", 2048, optimizer="paged_adamw")),
    GpuCase("hf", Run("llama-3.2-1b", 2048, optimizer="paged_adamw8bit")),
]

# Third session with a GPU: a framework's own training step (validation/gpu/megatron_step.py,
# deepspeed_step.py; records in tests/data/measured/gpu/<harness>/)
FRAMEWORK_STEPS = ("megatron", "deepspeed")
# in priority order (a run cut short by its budget keeps the first): Qwen's ZeRO-3 row, Megatron's step, then
# what separates their causes (the fused optimizer, recompute, the length, ZeRO-2, two sequences)
_D, _M = DEEPSPEED_RUNS, MEGATRON_RUNS
ROUND_3 = [GpuCase("deepspeed", _D[0]), GpuCase("megatron", _M[0]), GpuCase("deepspeed", _D[1]),
           GpuCase("megatron", _M[1]), GpuCase("deepspeed", _D[2]), GpuCase("deepspeed", _D[3]),
           GpuCase("megatron", _M[2])]

CASES: dict[str, GpuCase] = {c.id: c for c in cases()}
