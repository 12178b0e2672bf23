"""What vLLM's profiling run allocates through torch's caching allocator besides the model's own tensors.

`determine_available_memory` takes the rise of ``allocated_bytes.all.peak`` over the profiling run
(utils/mem_utils.py memory_profiling, 0.19.0), so two buffers that torch and inductor allocate during it
count as activation memory:

- the cuBLAS workspace: torch allocates it through the caching allocator at the first GEMM on a (cuBLAS
  handle, stream) pair and keeps it (aten/src/ATen/cuda/CublasHandlePool.cpp; its size by architecture is
  the GPU catalog's `runtime.blas_workspace_bytes`, estimator/spec/gpus.py). The profiling run's forward is
  the worker's first GEMM, so it stays allocated under the sampler too. Every published 0.15-0.19 log whose
  sampler sets the peak prints 29-40 MiB over the sampler's tensors alone (tests/test_serving_published.py).
- the autotuner's L2 flush buffer: a compiled piece's Triton kernels run for the first time in the profiling
  run, and a pointwise kernel with two candidate configs (torch/_inductor/runtime/triton_heuristics.py
  `pointwise`, autotune_pointwise on by default) is benchmarked at that first launch
  (CachingAutotuner.benchmark_all_configs) by InductorBenchmarker.benchmark_gpu, which allocates
  ``L2_cache_size // 4`` int32 (one L2's worth of bytes) to flush the cache while the kernel's arguments
  are live (torch/_inductor/runtime/benchmarking.py; config.use_experimental_benchmarker, default True).
  At the MLP's SiLU-and-mul kernel that is on top of the forward's peak. Read in torch 2.13's source; vLLM
  0.19.0 pins torch==2.10.0 (its wheel's METADATA), whose source was not read: the rule is keyed on 0.19,
  the first release whose start-up logs (a dense forward at the peak: CodeLlama-7B, Llama-3.1-8B's middle
  pipeline stages) show it. Under --enforce-eager nothing is compiled (config/vllm.py, 0.19.0;
  config/__init__.py, 0.11.0), so neither the buffer nor the compiled pieces' live set applies.
"""

from __future__ import annotations

from ..spec.gpus import GPUS

MiB = 1024**2
AUTOTUNE_FLUSH_FROM = (0, 19)
# cudaDeviceProp.l2CacheSize by GPU, from NVIDIA's architecture whitepapers and datasheets (MB there are
# MiB here, as deviceQuery prints them): A100 40 MB, H100 (SXM5, PCIe, NVL; H800 is the same die) 50 MB,
# L40S 96 MB, L4 48 MB, RTX 4090 72 MB, A10G (GA102) 6 MB. GPUs without a figure here (H200, GH200, the
# 96 GB H100, the Blackwell parts, the AMD parts, whose ROCm property torch reads differently) are not modelled.
L2_CACHE_BYTES = {"a100-40": 40 * MiB, "a100-80": 40 * MiB, "h100-80": 50 * MiB, "h100-pcie": 50 * MiB,
                  "h100-nvl": 50 * MiB, "h800": 50 * MiB, "l40s": 96 * MiB,
                  "l4": 48 * MiB, "rtx-4090": 72 * MiB, "a10g": 6 * MiB}


def blas_workspace_bytes(gpu_id: str) -> int:
    """The cuBLAS workspace the profiling run's first GEMM allocates (one handle and stream)."""
    return GPUS[gpu_id].runtime.blas_workspace_bytes


# Weight formats whose linear layers run no cuBLAS GEMM on CUDA (vLLM's quantization kernels, read at vLLM main commit
# 03fad5d4, model_executor/layers/quantization/kernels/scaled_mm/__init__.py, cutlass.py, flashinfer.py; the 0.19.0
# tag was not read): fp8 picks FlashInferFP8ScaledMMLinearKernel from compute capability 100, else
# CutlassFP8ScaledMMLinearKernel (ops.cutlass_scaled_mm); int8 w8a8 CutlassInt8ScaledMMLinearKernel
# (ops.scaled_int8_quant, then cutlass_scaled_mm); GPTQ / AWQ int4 the Marlin (or Machete) kernels and nvfp4 CUTLASS
# or FlashInfer ones. None of them asks torch for a cuBLAS handle.
CUBLAS_FREE_FORMATS = frozenset({"fp8", "int8", "gptq_int4", "awq_int4", "nvfp4"})


def capture_blas_bytes(gpu_id: str, weight_format: str, moe: bool, mla: bool) -> int:
    """The cuBLAS workspace of the capture stream (graph_capture's new stream): made by the first GEMM that goes
    through cuBLAS on it (the warm-up before a capture), so only where a piece runs one: 16-bit weights, or a
    quantized model's unquantized linears inside the pieces (a MoE router: ReplicatedLinear with quant_config None,
    models/mixtral.py; MLA's absorbed projections, torch.bmm). On ROCm the table's hipBLAS workspace whatever the
    format (its kernels were not read)."""
    if weight_format in CUBLAS_FREE_FORMATS and not moe and not mla and not gpu_id.startswith("mi"):
        return 0
    return blas_workspace_bytes(gpu_id)


def autotune_flush_bytes(release: tuple[int, int], gpu_id: str, compiled: bool) -> int | None:
    """The L2 flush buffer beside the compiled MLP's peak: 0 where it does not apply (eager, or a release
    before 0.19), None where it applies but the GPU's L2 size is not in the table."""
    if not compiled or release < AUTOTUNE_FLUSH_FROM:
        return 0
    return L2_CACHE_BYTES.get(gpu_id)
