"""The math libraries' workspaces: allocated through PyTorch's caching allocator once and kept for
the process's life, so `torch.cuda.max_memory_allocated()` counts them although no model tensor
does (fake tensors never see them).

- PyTorch's cuBLAS workspace, one per (cuBLAS handle, stream) (aten/src/ATen/cuda/CublasHandlePool.cpp
  `setWorkspaceForHandle`): a training step runs matrix products on two threads, the forward's and
  the autograd engine's backward thread (each with a handle of its own), so two; inference one.
  Measured: `clearCublasWorkspaces` freed 2 x 32 MiB after every training step on an H200
  (tests/data/measured/gpu). Its size is the GPU architecture's default (hardware.DeviceRuntime) unless
  CUBLAS_WORKSPACE_CONFIG sets it (`cublas_workspace_bytes`).
- TransformerEngine's own cuBLASLt workspace under Megatron-Core with `--transformer-impl
  transformer_engine` (the default; the local spec runs no TE GEMM): one, plus one per compute
  stream (4) for its grouped GEMM on MoE stages with `--moe-grouped-gemm` (TE 2.x
  cpp_extensions/gemm.py `get_cublas_workspace`, `tex.get_num_cublas_streams()`), not where the experts are the
  legacy GroupedMLP (`--moe-use-legacy-grouped-gemm`: the grouped_gemm package's gmm, no TE GEMM).
"""

from __future__ import annotations

import re

from .activations.moe import legacy_grouped_mlp
from .components import Component, component
from ..spec.hardware import Hardware
from ..spec.training import Training

TORCH_THREADS = {"training": 2, "inference": 1}  # forward thread + autograd's backward thread
TE_GROUPED_GEMM_STREAMS = 4  # TE 2.x tex.get_num_cublas_streams() (the JAX binding: num_cublas_streams = 4)
TE_SOURCE = ("TransformerEngine 2.x transformer_engine/pytorch/cpp_extensions/gemm.py get_cublas_workspace "
             "(one workspace; one per stream for grouped GEMM); Megatron-Core --transformer-impl "
             "transformer_engine (default)")
MiB = 1024**2


CONFIG_SOURCE = ("PyTorch aten/src/ATen/cuda/CublasHandlePool.cpp parseChosenWorkspaceSize: CUBLAS_WORKSPACE_CONFIG "
                 "is the sum of SIZE KiB x COUNT over its :SIZE:COUNT pairs (the count multiplies since PyTorch 2.0, "
                 "pytorch/pytorch#89027); one per cuBLAS handle and stream, through the caching allocator")


def cublas_workspace_bytes(config: str) -> int:
    """CUBLAS_WORKSPACE_CONFIG in bytes (CONFIG_SOURCE): ``:4096:8`` is 32 MiB, ``:4096:2:16:8`` 8.125 MiB."""
    return sum(int(size) * 1024 * int(count) for size, count in re.findall(r":(\d+):(\d+)", config))


def library_workspaces(training: Training, hardware: Hardware, moe_stage: bool) -> Component:
    runtime = hardware.device.runtime
    threads = TORCH_THREADS["inference" if training.mode == "inference" else "training"]
    config = hardware.cublas_workspace_config
    each = cublas_workspace_bytes(config) if config else runtime.blas_workspace_bytes
    total = threads * each
    formula = (f"{threads} x {each / MiB:g} MiB cuBLAS (CUBLAS_WORKSPACE_CONFIG={config})" if config else
               f"{threads} x {each / MiB:g} MiB cuBLAS ({runtime.architecture})")
    source = CONFIG_SOURCE if config else runtime.workspace_source
    if training.framework == "megatron" and training.mode != "inference" and \
            training.transformer_impl == "transformer_engine":
        te_grouped = training.moe_grouped_gemm and not legacy_grouped_mlp(training)
        te = 1 + (TE_GROUPED_GEMM_STREAMS if te_grouped and moe_stage else 0)
        total += te * runtime.te_workspace_bytes
        formula += f" + {te} x {runtime.te_workspace_bytes / MiB:.4g} MiB TransformerEngine"
        source += "; " + TE_SOURCE
    return component("workspace", "Library workspaces (cuBLAS, TransformerEngine)"
                     if training.framework == "megatron" else "cuBLAS workspaces", total, formula, source)
