"""One case run for real on a device, in a process of its own, and what the device reports.

The step is the fake-tensor harness's own (validation/step.py for the HF Trainer's step,
validation/peft/step.py for a LoRA step): step 1 creates the optimizer states, step 2 is measured.
On a GPU it records the three numbers people compare:
- allocated: `torch.cuda.max_memory_allocated()` over step 2, and per phase (the peak statistic is
  reset at each phase's start, after a synchronize);
- reserved: `torch.cuda.max_memory_reserved()` over the whole run and over step 2;
- the device's own count: `torch.cuda.mem_get_info()` (total - free) right after CUDA starts (the
  CUDA context and the allocator's first segment), and at the end of step 2; `nvidia-smi`'s
  used memory for this process at the same moment.
And what fake tensors cannot see: the cuBLAS / cuBLASLt workspaces that PyTorch allocates through
its caching allocator (aten/src/ATen/cuda/CublasHandlePool.cpp: one per (handle, stream); the
autograd engine's backward thread has a handle of its own), measured as the allocated bytes that
`torch._C._cuda_clearCublasWorkspaces()` gives back after the step.
On the CPU (`--device cpu`, the self-test in CI) the same code runs a tiny model and records the
model states only.
"""

from __future__ import annotations

import gc
import json
import os
import platform
import subprocess
import sys
import time
from contextlib import contextmanager

import torch

STATS = ("allocated_bytes.all.peak", "reserved_bytes.all.peak", "requested_bytes.all.peak",
         "inactive_split_bytes.all.peak", "segment.all.peak", "segment.large_pool.peak",
         "segment.small_pool.peak", "num_alloc_retries", "num_ooms", "num_device_alloc",
         "num_device_free", "oversize_allocations.peak")


def cuda_used_bytes() -> int:
    free, total = torch.cuda.mem_get_info()
    return total - free


def nvidia_smi_used_bytes() -> int | None:
    """This process's used memory as nvidia-smi prints it (MiB), or None where it cannot say."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=20).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    for line in out.splitlines():
        pid, _, used = line.partition(",")
        if pid.strip() == str(os.getpid()):
            return int(used.strip()) * 1024**2
    rows = [line for line in out.splitlines() if line.strip()]  # a sandbox may hide the pid
    return int(rows[0].partition(",")[2].strip()) * 1024**2 if len(rows) == 1 else None


def versions(device: str) -> dict:
    from importlib.metadata import PackageNotFoundError, version

    found = {"python": platform.python_version(), "torch": torch.__version__}
    for name in ("transformers", "peft", "accelerate", "bitsandbytes", "flash_attn", "mamba_ssm"):
        try:
            found[name] = version(name)
        except PackageNotFoundError:
            found[name] = None
    if device == "cuda":
        props = torch.cuda.get_device_properties(0)
        found |= {"cuda": torch.version.cuda, "gpu": props.name, "capability": f"{props.major}.{props.minor}",
                  "gpu_total_bytes": props.total_memory, "cudnn": torch.backends.cudnn.version()}
        try:
            found["driver"] = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                             capture_output=True, text=True, timeout=20).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            found["driver"] = None
    return found


def build_hf(run, device: str):
    from ..hf.step import build

    return build(run, None if device == "cpu" else device)


def build_peft(run, device: str):
    from ..peft.build import build, meta_peft_model

    model = meta_peft_model(run)
    return build(model, run, device)


def build_bnb(run, device: str):
    from .bnb import build

    return build(run, device)


BUILDERS = {"hf": build_hf, "peft": build_peft, "bnb": build_bnb}


def step_function(harness: str, run, inputs: dict | None = None):
    if harness == "hf":
        from ..hf.step import train_step

        return lambda model, opt, ids, phase: train_step(model, opt, ids, run, phase, inputs)
    from ..peft.step import train_step

    return lambda model, opt, ids, phase: train_step(model, opt, ids, phase)


def tensor_bytes(tensors) -> int:
    seen, total = set(), 0
    for t in tensors:
        storage = t.untyped_storage()
        if storage.data_ptr() not in seen:
            seen.add(storage.data_ptr())
            total += storage.nbytes()
    return total


def model_states(model, opt) -> dict:
    params = list(model.parameters())
    # a step counter on the host (foreach AdamW's) takes no device memory; fused AdamW's is on the device
    states = [t for s in opt.state.values() for name, t in s.items()
              if torch.is_tensor(t) and not (name == "step" and t.device.type == "cpu")]
    return {"parameters": tensor_bytes(params), "optimizer_states": tensor_bytes(states),
            "trainable_parameters": tensor_bytes(p for p in params if p.requires_grad)}


def step_inputs(harness: str, run, model, device: str) -> tuple[torch.Tensor, dict | None]:
    """The step's token ids, and a vision-language run's whole batch: the fake harness's own (validation/vlm/
    vision.py batch, real values: images through the tower, their tokens in the sequence)."""
    if harness == "hf" and run.images:
        from ..vlm import vision

        grid = vision.grid_of(model.config, run.images, run.image_size)
        inputs = vision.batch(model.config, grid, run.micro_batch_size, run.seq_len, fake=False)[0]
        inputs = {k: v.to(device) for k, v in inputs.items()}
        return inputs["input_ids"], inputs
    return torch.randint(0, vocab_size(model.config), (run.micro_batch_size, run.seq_len), device=device), None


def vision_attention(model) -> str | None:
    """The fake harness runs a vision-language model's tower (and Gemma 3's decoder) on flash_attention_2
    (validation/vlm/vision.py vision_emulation); a GPU run does the same where flash-attn is installed and
    keeps SDPA otherwise. Returns the implementation the tower ran (None for a text model)."""
    import importlib.util

    if not hasattr(model.config, "vision_config") or model.config.model_type == "llama4":
        return None  # Llama 4's tower runs SDPA unmasked in the harness too
    if importlib.util.find_spec("flash_attn") is None:
        return "sdpa"
    scope = model if model.config.model_type == "gemma3" else model.model.visual
    for config in {id(c): c for c in [getattr(m, "config", None) for m in scope.modules()] if c is not None}.values():
        if getattr(config, "_attn_implementation_internal", None) == "sdpa":
            config._attn_implementation_internal = "flash_attention_2"
    return "flash_attention_2"


def vocab_size(config) -> int:
    """The language model's vocabulary: a vision-language config (Qwen2_5_VLConfig, Gemma3Config) keeps it in
    its text config only under transformers 5.17 (the H200 machine's), so read it there."""
    return config.get_text_config().vocab_size


def segments() -> list[list]:
    """The caching allocator's segments as they stand: [size, allocated, active, pool] each."""
    return [[s["total_size"], s["allocated_size"], s["active_size"], s["segment_type"]]
            for s in torch.cuda.memory_snapshot()]


def measure(harness: str, run, device: str = "cuda", wrapper: str = "") -> dict:
    """Run two steps of the case on `device`; the record's `measured` object."""
    cuda = device == "cuda"
    out: dict = {}
    if cuda:
        torch.cuda.init()
        torch.zeros(1, device=device)
        out["context_used_bytes"] = cuda_used_bytes()  # the CUDA context + the first 2 MiB segment
        out["context_reserved_bytes"] = torch.cuda.memory_reserved()
    torch.manual_seed(0)
    model, opt = BUILDERS[harness](run, device)
    if wrapper:
        from .wrappers import WRAPPERS

        model = WRAPPERS[wrapper](model)
    ids, inputs = step_inputs(harness, run, model, device)
    attention = vision_attention(model) if cuda else None
    if attention:
        out["vision_attention"] = attention
    step = step_function(harness, run, inputs)
    start = time.perf_counter()
    step(model, opt, ids, lambda name: nullphase())  # step 1: the optimizer states are created
    gc.collect()
    out |= model_states(model, opt)
    if not cuda:
        return out
    out |= after_step1()
    phases: dict = {}
    step(model, opt, ids, phase_recorder(phases))
    torch.cuda.synchronize()
    out["step2_seconds"] = time.perf_counter() - start
    out |= step2_readings(phases)
    out["cublas_workspace_bytes"] = freed_cublas_workspaces()
    return out


def after_step1() -> dict:
    """Step 1's reserved peak and what is allocated before step 2, whose peaks are then counted afresh."""
    torch.cuda.synchronize()
    out = {"reserved_peak_step1_bytes": torch.cuda.max_memory_reserved(),
           "allocated_before_step2_bytes": torch.cuda.memory_allocated()}
    torch.cuda.reset_peak_memory_stats()
    return out


def phase_recorder(phases: dict):
    """Step 2's `phase(name)` context manager: each phase's allocated bytes at its start, and its allocated and
    reserved peaks, into `phases` (also the framework steps', framework_step.py)."""
    @contextmanager
    def phase(name):
        torch.cuda.synchronize()
        begin = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        yield
        torch.cuda.synchronize()
        phases[name] = {"start_bytes": begin, "peak_bytes": torch.cuda.max_memory_allocated(),
                        "reserved_peak_bytes": torch.cuda.max_memory_reserved()}

    return phase


def step2_readings(phases: dict) -> dict:
    """What a record keeps of step 2: its phases, the peaks over them, and the allocator and the device after it."""
    peak_phase = max(phases, key=lambda n: phases[n]["peak_bytes"])
    stats = torch.cuda.memory_stats()
    return {"phases": phases, "peak_bytes": phases[peak_phase]["peak_bytes"], "peak_phase": peak_phase,
            "reserved_peak_bytes": max(p["reserved_peak_bytes"] for p in phases.values()),
            "allocated_end_bytes": torch.cuda.memory_allocated(), "reserved_end_bytes": torch.cuda.memory_reserved(),
            "device_used_end_bytes": cuda_used_bytes(), "nvidia_smi_used_end_bytes": nvidia_smi_used_bytes(),
            "stats": {k: stats.get(k) for k in STATS}, "segments": segments()}


def freed_cublas_workspaces() -> int:
    """The bytes clearCublasWorkspaces frees: PyTorch's cuBLAS workspaces, one per (handle, stream) used."""
    before = torch.cuda.memory_allocated()
    torch._C._cuda_clearCublasWorkspaces()
    return before - torch.cuda.memory_allocated()


@contextmanager
def _null():
    yield


def nullphase():
    return _null()


def workspace_probe() -> dict:
    """In a fresh process: the allocated bytes each cuBLAS use leaves behind (its workspace), for the
    forward's thread and for the autograd engine's backward thread, bf16 and fp32."""
    torch.cuda.init()
    torch.zeros(1, device="cuda")
    rows = {"context_used_bytes": cuda_used_bytes(), "allocated_at_start": torch.cuda.memory_allocated(),
            "env": {k: os.environ.get(k) for k in ("CUBLAS_WORKSPACE_CONFIG", "TORCH_CUBLASLT_WORKSPACE_SIZE",
                                                   "PYTORCH_CUDA_ALLOC_CONF")}}
    x = torch.randn(1024, 1024, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    w = torch.randn(1024, 1024, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    b = torch.randn(1024, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    y = x @ w  # cuBLAS gemm (main thread)
    torch.cuda.synchronize()
    rows["after_mm_bf16"] = torch.cuda.memory_allocated() - base - y.untyped_storage().nbytes()
    z = torch.nn.functional.linear(x, w, b)  # addmm with bias: the cuBLASLt path
    torch.cuda.synchronize()
    rows["after_linear_bias_bf16"] = (torch.cuda.memory_allocated() - base - y.untyped_storage().nbytes()
                                      - z.untyped_storage().nbytes())
    mid = torch.cuda.memory_allocated()
    (y.sum() + z.sum()).backward()  # on the autograd engine's device thread
    torch.cuda.synchronize()
    grads = sum(t.grad.untyped_storage().nbytes() for t in (x, w, b))
    rows["after_backward"] = torch.cuda.memory_allocated() - mid - grads
    xf = torch.randn(1024, 1024, device="cuda")
    mid = torch.cuda.memory_allocated()
    yf = xf @ xf
    torch.cuda.synchronize()
    rows["after_mm_fp32"] = torch.cuda.memory_allocated() - mid - yf.untyped_storage().nbytes()
    before = torch.cuda.memory_allocated()
    torch._C._cuda_clearCublasWorkspaces()
    rows["cleared_bytes"] = before - torch.cuda.memory_allocated()
    rows["device_used_bytes"] = cuda_used_bytes()
    rows["nvidia_smi_used_bytes"] = nvidia_smi_used_bytes()
    rows["allocated_end"] = torch.cuda.memory_allocated()
    rows["reserved_end"] = torch.cuda.memory_reserved()
    return rows


def main(argv: list[str]) -> int:
    """`python -m validation.gpu.measure CASE_ID DEVICE` or `... probe`: one JSON line on stdout."""
    if argv[0] == "probe":
        print(json.dumps({"probe": workspace_probe(), "versions": versions("cuda")}))
        return 0
    from .cases import CASES

    case, device = CASES[argv[0]], argv[1]
    if case.harness == "kernel":
        from .kernels import measure_kernel

        measured = measure_kernel(case.run, device)
    elif case.harness in ("megatron", "deepspeed"):  # a framework's own step (framework_step.py)
        from .framework_records import measure_step

        measured = measure_step(case, device)
    else:
        measured = measure(case.harness, case.run, device, case.wrapper)
    print(json.dumps({"id": case.id, "measured": measured, "versions": versions(device)}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
