"""The GPU catalog: memory capacity, peak dense throughput, bandwidths, each with its source.

`capacity_bytes` is the memory the device reports to CUDA/ROCm (``torch.cuda.mem_get_info`` total,
``nvidia-smi`` "Total"), which is a little less than the marketing figure; the fit verdict
compares the estimate with it.
"""

from __future__ import annotations

from dataclasses import dataclass

from .errors import ConfigError

GiB = 1024**3


@dataclass(frozen=True)
class GPU:
    id: str
    name: str
    capacity_bytes: int
    bf16_flops: float  # peak dense (no sparsity) bf16/fp16 tensor FLOP/s
    fp8_flops: float | None  # peak dense fp8 FLOP/s; None where the GPU has no fp8 tensor cores
    memory_bandwidth: float  # bytes/s
    intra_node_bandwidth: float  # bytes/s per GPU, one direction (NVLink/NVSwitch, Infinity Fabric, PCIe)
    inter_node_bandwidth: float  # bytes/s per GPU, one direction (the usual one NIC per GPU)
    gpus_per_node: int
    cuda_context_bytes: int  # driver context, kernels and library handles outside the allocator
    source: str


@dataclass(frozen=True)
class Hardware:
    gpu: str = "h100-80"
    expandable_segments: bool = False  # PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True

    def __post_init__(self) -> None:
        if self.gpu not in GPUS:
            raise ConfigError("hardware.gpu", self.gpu, ", ".join(GPUS))
        if not isinstance(self.expandable_segments, bool):
            raise ConfigError("hardware.expandable_segments", self.expandable_segments, "true or false")

    @property
    def device(self) -> GPU:
        return GPUS[self.gpu]


# CUDA context on Hopper with lazy module loading (CUDA >= 11.7 default) plus cuBLAS/cuDNN handles:
# stas00, ml-engineering "training/performance" measures 0.5-2 GiB; we use the low end for a
# single training process with lazy loading.
_CONTEXT = 512 * 1024**2

GPUS: dict[str, GPU] = {
    gpu.id: gpu
    for gpu in (
        GPU("h100-80", "NVIDIA H100 SXM 80GB", 81_559 * 1024**2, 989e12, 1979e12, 3.35e12,
            450e9, 50e9, 8, _CONTEXT,
            "NVIDIA H100 Tensor Core GPU datasheet (dense figures); nvidia-smi reports 81559 MiB"),
    )
}


def get_gpu(gpu_id: str) -> GPU:
    if gpu_id not in GPUS:
        raise ConfigError("hardware.gpu", gpu_id, ", ".join(GPUS))
    return GPUS[gpu_id]
