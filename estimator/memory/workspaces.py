"""The math libraries' workspaces: allocated through PyTorch's caching allocator once and kept for
the process's life, so `torch.cuda.max_memory_allocated()` counts them although no model tensor
does (fake tensors never see them).

- PyTorch's cuBLAS workspace, one per (cuBLAS handle, stream) (aten/src/ATen/cuda/CublasHandlePool.cpp
  `setWorkspaceForHandle`): a training step runs matrix products on two threads, the forward's and
  the autograd engine's backward thread (each with a handle of its own), so two; inference one.
  Measured: `clearCublasWorkspaces` freed 2 x 32 MiB after every training step on an H200
  (tests/data/measured/gpu).
- TransformerEngine's own cuBLASLt workspace under Megatron-Core (whose default
  `--transformer-impl` is `transformer_engine`): one, plus one per compute stream (4) for its
  grouped GEMM on MoE stages with `--moe-grouped-gemm` (TE 2.x cpp_extensions/gemm.py
  `get_cublas_workspace`, `tex.get_num_cublas_streams()`).
The sizes are the GPU architecture's (hardware.DeviceRuntime).
"""

from __future__ import annotations

from .components import Component, component
from ..spec.hardware import Hardware
from ..spec.training import Training

TORCH_THREADS = {"training": 2, "inference": 1}  # forward thread + autograd's backward thread
TE_GROUPED_GEMM_STREAMS = 4  # TE 2.x tex.get_num_cublas_streams() (the JAX binding: num_cublas_streams = 4)
TE_SOURCE = ("TransformerEngine 2.x transformer_engine/pytorch/cpp_extensions/gemm.py get_cublas_workspace "
             "(one workspace; one per stream for grouped GEMM); Megatron-Core --transformer-impl "
             "transformer_engine (default)")
MiB = 1024**2


def library_workspaces(training: Training, hardware: Hardware, moe_stage: bool) -> Component:
    runtime = hardware.device.runtime
    threads = TORCH_THREADS["inference" if training.mode == "inference" else "training"]
    total = threads * runtime.blas_workspace_bytes
    formula = f"{threads} x {runtime.blas_workspace_bytes / MiB:g} MiB cuBLAS ({runtime.architecture})"
    source = runtime.workspace_source
    if training.framework == "megatron" and training.mode != "inference":
        te = 1 + (TE_GROUPED_GEMM_STREAMS if training.moe_grouped_gemm and moe_stage else 0)
        total += te * runtime.te_workspace_bytes
        formula += f" + {te} x {runtime.te_workspace_bytes / MiB:.4g} MiB TransformerEngine"
        source += "; " + TE_SOURCE
    return component("workspace", "Library workspaces (cuBLAS, TransformerEngine)"
                     if training.framework == "megatron" else "cuBLAS workspaces", total, formula, source)
