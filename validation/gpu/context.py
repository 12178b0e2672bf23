"""The CUDA context and kernel-module loading, stage by stage, under lazy and eager module loading (issue 23).

Qwen's HF LoRA rows (tests/test_published_finetune.py, CUDA 11.8 / PyTorch 2.0, nvidia-smi) read 1.4-2.4 GB
above our estimate; the context with its loaded kernel modules is the suspect. Under
CUDA_MODULE_LOADING=LAZY (PyTorch sets it where it is unset: torch/cuda/__init__.py _lazy_init) a kernel's
module is loaded at its first launch; under EAGER every module of a library is loaded with the context.

One process per mode (CUDA_MODULE_LOADING=LAZY, =EAGER, unset), each stage run once, in this order, and
after each: the device's used bytes (mem_get_info), the allocator's reserved and allocated bytes, this
process's nvidia-smi reading, seconds since the process started:
- context: torch.cuda.init() and the first mem_get_info (which makes the primary context);
- allocations: every tensor the later stages use, made with torch.empty (no kernel);
- elementwise: fill_ and add_ on them (the first kernels; no NCCL anywhere);
- gemm_bf16: the first cuBLAS GEMM (bf16 [1024, 1024] x [1024, 1024]: the handle and its workspace);
- sdpa_flash_forward / sdpa_flash_backward: scaled_dot_product_attention under the FLASH_ATTENTION backend
  (bf16 [1, 8, 1024, 64], causal), then its backward;
- adamw_foreach: one foreach AdamW step over four bf16 tensors (the multi-tensor-apply kernels).
"""

from __future__ import annotations

import json
import os
import sys
import time

import torch

from .devices import device_named

MODES = ("LAZY", "EAGER", None)  # None: CUDA_MODULE_LOADING unset
STAGES = ("context", "allocations", "elementwise", "gemm_bf16", "sdpa_flash_forward", "sdpa_flash_backward",
          "adamw_foreach")
GEMM, HEADS, TOKENS, HEAD_DIM = 1024, 8, 1024, 64


def _tensors(device: str) -> dict:
    bf16 = {"device": device, "dtype": torch.bfloat16}
    attention = (1, HEADS, TOKENS, HEAD_DIM)
    made = {"x": torch.empty(GEMM, GEMM, **bf16), "w": torch.empty(GEMM, GEMM, **bf16),
            "params": [torch.empty(GEMM, GEMM, **bf16) for _ in range(4)]}
    made |= {name: torch.empty(attention, **bf16).requires_grad_() for name in ("q", "k", "v")}
    return made


def _elementwise(t: dict) -> None:
    for name in ("x", "w", "q", "k", "v"):
        with torch.no_grad():
            t[name].fill_(0.01).add_(0.001)
    for p in t["params"]:
        p.fill_(0.01)


def _sdpa_forward(t: dict) -> None:
    from torch.nn.attention import SDPBackend, sdpa_kernel

    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
        t["out"] = torch.nn.functional.scaled_dot_product_attention(t["q"], t["k"], t["v"], is_causal=True)


def _adamw(t: dict) -> None:
    params = [torch.nn.Parameter(p) for p in t["params"]]
    for p in params:
        p.grad = torch.full_like(p, 0.001)
    torch.optim.AdamW(params, lr=1e-4, foreach=True).step()


STAGE_RUNS = {
    "elementwise": _elementwise,
    "gemm_bf16": lambda t: t.__setitem__("y", t["x"] @ t["w"]),
    "sdpa_flash_forward": _sdpa_forward,
    "sdpa_flash_backward": lambda t: t["out"].sum().backward(),
    "adamw_foreach": _adamw,
}


def stage_marker(dev, rows: list[dict]):
    """`mark(stage)`: the device's used, reserved and allocated bytes and nvidia-smi's reading after `stage`, with the
    seconds since the marker was made, appended to `rows` (this experiment's and nccl_world.py's)."""
    start = time.perf_counter()

    def mark(stage: str) -> None:
        dev.synchronize()
        rows.append({"stage": stage, "used_bytes": dev.used_bytes(), "reserved_bytes": dev.reserved_bytes(),
                     "allocated_bytes": dev.allocated_bytes(), "nvidia_smi_bytes": dev.process_bytes(),
                     "seconds": round(time.perf_counter() - start, 3)})

    return mark


def measure_context(device: str) -> dict:
    seen = os.environ.get("CUDA_MODULE_LOADING")
    dev = device_named(device)
    rows: list[dict] = []
    mark = stage_marker(dev, rows)

    if device == "cuda":
        torch.cuda.init()
    mark("context")
    tensors = _tensors(device)
    mark("allocations")
    for stage in STAGES[2:]:
        STAGE_RUNS[stage](tensors)
        mark(stage)
    return {"module_loading_env": seen, "module_loading_after_init": os.environ.get("CUDA_MODULE_LOADING"),
            "stages": rows, "deltas": stage_deltas(rows)}


def stage_deltas(rows: list[dict]) -> list[dict]:
    """Each stage's growth over the one before (the context's over nothing): of the device's used bytes, of
    the allocator's reserved bytes, and of what is outside the allocator (used - reserved)."""
    out, before = [], {"used_bytes": 0, "reserved_bytes": 0}
    for row in rows:
        used, reserved = row["used_bytes"] - before["used_bytes"], row["reserved_bytes"] - before["reserved_bytes"]
        out.append({"stage": row["stage"], "used_bytes": used, "reserved_bytes": reserved,
                    "outside_allocator_bytes": used - reserved})
        before = row
    return out


def main(argv: list[str]) -> int:
    """`python -m validation.gpu.context DEVICE`: one JSON line on stdout (the mode is the environment's)."""
    from .devices import driver_api_version
    from .measure import versions

    device = argv[0]
    measured = measure_context(device)
    found = versions(device) | {"cuda_driver_api": driver_api_version() if device == "cuda" else None}
    run = {"module_loading": measured["module_loading_env"]}
    print(json.dumps({"experiment": "cuda-context", "run": run, "measured": measured, "versions": found}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
