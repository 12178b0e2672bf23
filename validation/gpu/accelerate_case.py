"""A real-GPU case through the real Accelerate, as the HF Trainer runs it: the model built as
validation/gpu's other cases build it (validation/gpu/measure.py `build_hf` for full fine-tuning,
`build_peft` for LoRA), prepared by `Accelerator(mixed_precision="bf16").prepare(model, optimizer)`
(autocast and `convert_outputs_to_fp32` around the forward: validation/accelerate/step.py has the
sources), two steps of the Trainer's step (validation/accelerate/step.py `trainer_step`), the second
measured per phase exactly as validation/gpu/measure.py `measure` measures the other cases (same keys).

    from validation.gpu.accelerate_case import run_accelerate_case
    run_accelerate_case("qwen2.5-0.5b", 4096, 1, lora=False)

or `python -m validation.gpu.accelerate_case MODEL SEQ BATCH [lora] [cpu]` (one JSON line). On the CPU
(`device="cpu"`, the self-test) a tiny model runs and the model states alone are returned.
"""

from __future__ import annotations

import gc
import json
import sys
import time
from contextlib import contextmanager

import torch

# The LoRA case's adapters: rank 16, alpha 32 on the seven projections of every decoder layer (what
# the LoRA recipes of the fake-tensor records use most: validation/peft/cases.py)
LORA_RANK, LORA_ALPHA = 16, 32


def case_run(model_name: str, seq: int, batch: int, lora: bool):
    """The fake-tensor harness's run description of the case (validation/accelerate/cases.py ids)."""
    if lora:
        from ..peft.build import ALL_SEVEN, LoraRun

        return LoraRun(model_name, seq, batch, rank=LORA_RANK, alpha=LORA_ALPHA, targets=ALL_SEVEN)
    from ..hf.step import Run

    return Run(model_name, seq, batch)  # pure bf16 weights, foreach AdamW, no recompute, SDPA


def build(run, lora: bool, device: str):
    from .measure import build_hf, build_peft

    return build_peft(run, device) if lora else build_hf(run, device)


def run_accelerate_case(model_name: str, seq: int, batch: int, lora: bool, device: str = "cuda") -> dict:
    """Two Trainer steps through `Accelerator(mixed_precision="bf16")`; the second measured. Returns
    validation/gpu/measure.py `measure`'s keys, plus `accelerate` (what prepare did) and `versions`."""
    from ..accelerate.step import fp32_output_copy_active, make_accelerator, trainer_step
    from .measure import STATS, cuda_used_bytes, model_states, nvidia_smi_used_bytes, versions

    cuda = device == "cuda"
    out: dict = {"case": {"model": model_name, "seq_len": seq, "micro_batch_size": batch, "lora": lora}}
    if cuda:
        torch.cuda.init()
        torch.zeros(1, device=device)
        out["context_used_bytes"] = cuda_used_bytes()
        out["context_reserved_bytes"] = torch.cuda.memory_reserved()
    accelerator = make_accelerator("bf16", cpu=not cuda)
    torch.manual_seed(0)
    run = case_run(model_name, seq, batch, lora)
    model, opt = build(run, lora, device)
    model, opt = accelerator.prepare(model, opt)
    out["accelerate"] = {"mixed_precision": accelerator.mixed_precision,
                         "native_amp": fp32_output_copy_active(accelerator),
                         "distributed_type": str(accelerator.distributed_type)}
    config = model.config if hasattr(model, "config") else accelerator.unwrap_model(model).config
    ids = torch.randint(0, config.vocab_size, (batch, seq), device=device)
    start = time.perf_counter()
    trainer_step(model, opt, accelerator, ids)  # step 1: the optimizer states are created
    gc.collect()
    out |= model_states(model, opt.optimizer if hasattr(opt, "optimizer") else opt)
    if not cuda:
        return out | {"versions": versions(device)}
    torch.cuda.synchronize()
    out["reserved_peak_step1_bytes"] = torch.cuda.max_memory_reserved()
    out["allocated_before_step2_bytes"] = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    phases: dict = {}

    @contextmanager
    def phase(name):
        torch.cuda.synchronize()
        begin = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        yield
        torch.cuda.synchronize()
        phases[name] = {"start_bytes": begin, "peak_bytes": torch.cuda.max_memory_allocated(),
                        "reserved_peak_bytes": torch.cuda.max_memory_reserved()}

    trainer_step(model, opt, accelerator, ids, phase)
    torch.cuda.synchronize()
    out["step2_seconds"] = time.perf_counter() - start
    out["phases"] = phases
    peak_phase = max(phases, key=lambda n: phases[n]["peak_bytes"])
    out["peak_bytes"], out["peak_phase"] = phases[peak_phase]["peak_bytes"], peak_phase
    out["reserved_peak_bytes"] = max(p["reserved_peak_bytes"] for p in phases.values())
    out["allocated_end_bytes"] = torch.cuda.memory_allocated()
    out["reserved_end_bytes"] = torch.cuda.memory_reserved()
    out["device_used_end_bytes"] = cuda_used_bytes()
    out["nvidia_smi_used_end_bytes"] = nvidia_smi_used_bytes()
    stats = torch.cuda.memory_stats()
    out["stats"] = {k: stats.get(k) for k in STATS}
    before = torch.cuda.memory_allocated()
    torch._C._cuda_clearCublasWorkspaces()
    out["cublas_workspace_bytes"] = before - torch.cuda.memory_allocated()
    return out | {"versions": versions(device)}


def selftest() -> dict:
    """The same code on the CPU with a tiny model, full and LoRA (what CI can run)."""
    return {f"tiny-llama:{'lora' if lora else 'full'}": run_accelerate_case("tiny-llama", 64, 2, lora, "cpu")
            for lora in (False, True)}


def main(argv: list[str]) -> int:
    if argv and argv[0] == "selftest":
        print(json.dumps(selftest()))
        return 0
    model_name, seq, batch = argv[0], int(argv[1]), int(argv[2])
    lora, device = "lora" in argv[3:], "cpu" if "cpu" in argv[3:] else "cuda"
    print(json.dumps(run_accelerate_case(model_name, seq, batch, lora, device)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
