"""The GPU catalog: memory capacity, peak dense throughput, bandwidths, each with its source.

`capacity_bytes` is the memory the device reports to CUDA/ROCm (``torch.cuda.mem_get_info`` total,
``nvidia-smi`` "Total"), which is a little less than the marketing figure; the fit verdict
compares the estimate with it.
"""

from __future__ import annotations

from dataclasses import dataclass
from .memo import not_owned
from .cuda_modules import H200_STACK, ModuleStack

GiB = 1024**3


@not_owned
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
    runtime: "DeviceRuntime"  # what the CUDA/ROCm runtime and the BLAS library take, by architecture
    source: str

    @property
    def cuda_context_bytes(self) -> int:
        """Driver context and loaded kernels, outside PyTorch's allocator."""
        return self.runtime.context_bytes


@dataclass(frozen=True)
class DeviceRuntime:
    """What a training process holds besides its tensors, by GPU architecture and software stack:
    the CUDA context with the kernels it loads (outside PyTorch's allocator: nvidia-smi shows it,
    `max_memory_reserved` does not), and the cuBLAS workspace PyTorch allocates through its caching
    allocator once per (cuBLAS handle, stream): the forward's thread has one, the autograd engine's
    backward thread another (so `max_memory_allocated` holds two in training, one in inference)."""

    architecture: str
    context_bytes: int
    blas_workspace_bytes: int  # per (handle, stream)
    te_workspace_bytes: int  # TransformerEngine's own cuBLASLt workspace, one per stream it uses
    context_source: str
    workspace_source: str
    # the context and kernel modules part by part, by CUDA_MODULE_LOADING, where they were measured on the
    # architecture (cuda_modules.py); None: `context_bytes` alone, whatever the run
    modules: ModuleStack | None = None


MiB = 1024**2
# PyTorch aten/src/ATen/cuda/CublasHandlePool.cpp `parseChosenWorkspaceSize` (main, 2026): without
# CUBLAS_WORKSPACE_CONFIG, 4096 KiB x 8 = 32 MiB on compute capability 9.x, 10.x and 12.x (Hopper,
# Blackwell; 9.0 only before 2.8), else :4096:2:16:8 = 2 x 4096 KiB + 8 x 16 KiB; on ROCm 32 MiB, 128 MiB for
# gfx94x/gfx95x (MI300X, MI325X, MI355X). cuBLASLt shares it (TORCH_CUBLASLT_UNIFIED_WORKSPACE, default on).
_WORKSPACE_SOURCE = ("PyTorch aten/src/ATen/cuda/CublasHandlePool.cpp parseChosenWorkspaceSize (default without "
                     "CUBLAS_WORKSPACE_CONFIG); one per cuBLAS handle and stream, through the caching allocator")
_MEASURED_H200 = ("measured on an H200 (torch 2.11.0+cu130, driver 580.159.04; tests/data/measured/gpu): "
                  "torch.cuda.mem_get_info used minus max_memory_reserved after a training step = 766.8 MiB "
                  "(619 MiB of CUDA context at start + cuBLAS and FlashAttention kernels loaded lazily; 750.8 MiB "
                  "with eager attention); clearCublasWorkspaces freed 2 x 32 MiB")
# Stas Bekman, ml-engineering "Preloaded CUDA kernels memory usage": 0.5-2 GB once PyTorch first uses
# CUDA, 0.47 GB with lazy module loading (PyTorch 2.1.1, CUDA 12.1): the low end for the architectures
# not measured here; no ROCm/HIP figure was found, so the AMD parts use it too.
_BEKMAN = ("Stas Bekman, Machine Learning Engineering (stas00/ml-engineering), training/performance, \"Preloaded "
           "CUDA kernels memory usage\": 0.5-2 GB, 0.47 GB with lazy module loading (PyTorch 2.1.1, CUDA 12.1); "
           "the low end, 512 MiB (not measured on this architecture)")
# TransformerEngine 2.x transformer_engine/pytorch/cpp_extensions/gemm.py `get_cublas_workspace_size_bytes`:
# 32 MiB + 1 KiB (NVFP4 GEMMs and their scales) on compute capability >= 9, else 4 MiB; ROCm's TE fork:
# 32 MiB, 64 MiB on gfx950.
_TE_HOPPER_ON = 32 * MiB + 1024
# 766.8 MiB: mem_get_info used - max_memory_reserved after a training step with FlashAttention, lazy loading
# (tests/data/measured/gpu): the sum of the H200 stack's LAZY parts (cuda_modules.py); what serving charges
_MEASURED_OUTSIDE = H200_STACK.loaded("lazy").total(flash=True)
_HOPPER = DeviceRuntime("Hopper (sm90)", _MEASURED_OUTSIDE, 32 * MiB, _TE_HOPPER_ON, _MEASURED_H200,
                        _WORKSPACE_SOURCE + "; measured: 2 x 32 MiB after a training step on an H200 "
                        "(tests/data/measured/gpu)", H200_STACK)
_NOT_ON_BLACKWELL = "not measured on Blackwell: the Hopper measurement (same CUDA 13 toolkit and driver branch); "
# Blackwell takes the Hopper stack's LAZY parts; EAGER loads every module of a library, whose size follows the
# kernels compiled for the architecture, so the Hopper EAGER figures are not offered for it
_BLACKWELL = DeviceRuntime(
    "Blackwell (sm100/sm120)", _MEASURED_OUTSIDE, 32 * MiB, _TE_HOPPER_ON, _NOT_ON_BLACKWELL + _MEASURED_H200,
    _WORKSPACE_SOURCE, ModuleStack(_NOT_ON_BLACKWELL + H200_STACK.stack, H200_STACK.torch, H200_STACK.cuda,
                                   H200_STACK.driver, (("lazy", H200_STACK.loaded("lazy")),)))
_AMPERE_ADA = DeviceRuntime("Ampere/Ada (sm80-sm89)", 512 * MiB, 2 * 4096 * 1024 + 8 * 16 * 1024, 4 * MiB, _BEKMAN,
                            _WORKSPACE_SOURCE)
_HIPBLAS = _WORKSPACE_SOURCE + " (hipBLAS; hipBLASLt keeps a 76 MiB workspace of its own, not counted)"
_CDNA3 = DeviceRuntime("CDNA 3 (gfx942)", 512 * MiB, 128 * MiB, 32 * MiB, _BEKMAN + "; no ROCm figure found", _HIPBLAS)
_CDNA4 = DeviceRuntime("CDNA 4 (gfx950)", 512 * MiB, 128 * MiB, 64 * MiB, _BEKMAN + "; no ROCm figure found", _HIPBLAS)
# The runtime component's source (each GPU row's `runtime` cites its architecture's)
CUDA_CONTEXT_SOURCE = "the GPU catalog's runtime record for the GPU's architecture (estimator/spec/gpus.py)"
# A node with one 100 Gb/s uplink shared by its 8 GPUs: 100e9 bits/s / 8 bits per byte / 8 GPUs.
_100G_SHARED_BY_8 = 100e9 / 8 / 8
# The clock a 500 W cap sustains on an H100 SXM rated at 700 W: dynamic power ~ C V^2 f and V ~ f, so f ~ P^(1/3)
_POWER_500W = (500 / 700) ** (1 / 3)

# Conventions for the catalog (read before editing a row):
# - capacity_bytes: the "Total" nvidia-smi / rocm-smi prints (MiB), where a public capture of it was
#   found; otherwise the vendor's nominal capacity, and the source says which.
# - bf16_flops / fp8_flops: peak DENSE tensor throughput. Vendor datasheets headline 2:4-sparsity
#   figures (marked "*"); those are halved here. GeForce cards run bf16/fp8 with FP32 accumulate at
#   half the FP16-accumulate rate; training accumulates in FP32, so the FP32-accumulate figure is used.
# - intra_node_bandwidth: one direction, per GPU: NVLink/NVSwitch (half the bidirectional figure
#   vendors quote), Infinity Fabric (links x per-link bidirectional / 2), or the PCIe x16 link where
#   GPUs talk over PCIe (Gen4 x16 = 64 GB/s bidirectional -> 32e9, Gen5 x16 = 128 GB/s -> 64e9).
# - inter_node_bandwidth: one direction, per GPU, for the usual deployment: one 400 Gb/s NIC per GPU
#   (50e9) on DGX/HGX H100/H200/B200-class nodes (NVIDIA DGX BasePOD RA: 8x single-port ConnectX-7,
#   up to 400 Gb/s), 800 Gb/s (100e9) on HGX/DGX B300 (ConnectX-8), 200 Gb/s (25e9) on DGX A100
#   (8x ConnectX-6 HDR).
# - gpus_per_node: 8 for SXM/OAM baseboards. PCIe cards are modelled as the 8-card PCIe server
#   (AWS g5/g6/g6e.48xlarge, NVIDIA's PCIe-optimized Enterprise RA, 8-card GeForce rental boxes);
#   their intra-node bandwidth is the PCIe link, and their inter-node figure is an assumption stated
#   in the row. GH200 is modelled as the one-superchip node (cloud GH200 instances, MGX servers).
#   GB200 NVL72 is one NVLink domain of 72 GPUs (the NVLink Switch trays join the 18 compute trays):
#   gpus_per_node 72 is that domain; its NICs only leave the rack.

GPUS: dict[str, GPU] = {
    gpu.id: gpu
    for gpu in (
        # ---------------------------------------------------------------- NVIDIA Ampere
        GPU("a100-40", "NVIDIA A100 SXM4 40GB", 40_960 * MiB, 312e12, None, 1.555e12,
            300e9, 25e9, 8, _AMPERE_ADA,
            "NVIDIA A100 Tensor Core GPU datasheet: BF16 312 TFLOPS dense (624 sparse), HBM2 "
            "1,555 GB/s, NVLink 600 GB/s; no FP8. DGX A100 user guide: 8x ConnectX-6 200 Gb/s. "
            "nvidia-smi reports 40960 MiB (modal-labs/modal-client PR #2797)"),
        GPU("a100-80", "NVIDIA A100 SXM4 80GB", 81_920 * MiB, 312e12, None, 2.039e12,
            300e9, 25e9, 8, _AMPERE_ADA,
            "NVIDIA A100 Tensor Core GPU datasheet: BF16 312 TFLOPS dense (624 sparse), HBM2e "
            "2,039 GB/s (SXM), NVLink 600 GB/s; no FP8. DGX A100: 8x ConnectX-6 200 Gb/s. "
            "nvidia-smi reports 81920 MiB (modal-labs/modal-client PR #2797)"),
        # ---------------------------------------------------------------- NVIDIA Hopper
        GPU("h100-80", "NVIDIA H100 SXM 80GB", 81_559 * MiB, 989e12, 1979e12, 3.35e12,
            450e9, 50e9, 8, _HOPPER,
            "NVIDIA H100 Tensor Core GPU datasheet (SXM): BF16 1,979 / FP8 3,958 TFLOPS sparse -> "
            "989 / 1,979 dense, HBM3 3.35 TB/s, NVLink 900 GB/s; DGX H100: 8x ConnectX-7 400 Gb/s. "
            "nvidia-smi reports 81559 MiB (NVIDIA/nccl issue #1264)"),
        GPU("h100-nvl", "NVIDIA H100 NVL 94GB", 95_830 * MiB, 835.5e12, 1670.5e12, 3.9e12,
            64e9, 25e9, 8, _HOPPER,
            "NVIDIA H100 Tensor Core GPU datasheet (H100 NVL, per GPU): BF16 1,671 / FP8 3,341 "
            "TFLOPS sparse -> 835.5 / 1,670.5 dense, 94 GB HBM3 3.9 TB/s, NVLink bridge 600 GB/s "
            "between a pair only, PCIe Gen5 128 GB/s. In an 8-card server the group spans PCIe Gen5 "
            "x16 (64e9 one way). Inter-node: NVIDIA PCIe-optimized Enterprise RA (2-8-5-200, 200 Gb/s "
            "per GPU). nvidia-smi reports 95830 MiB (NVIDIA/gpu-admin-tools issue #4)"),
        GPU("h100-pcie", "NVIDIA H100 PCIe 80GB", 81_559 * MiB, 756e12, 1513e12, 2.0e12,
            64e9, 25e9, 8, _HOPPER,
            "NVIDIA H100 Tensor Core GPU datasheet (PCIe): BF16 1,513 / FP8 3,026 TFLOPS sparse -> "
            "756 / 1,513 dense, HBM2e 2 TB/s, PCIe Gen5 128 GB/s (64e9 one way; optional NVLink "
            "bridge pairs ignored). Inter-node: NVIDIA PCIe-optimized Enterprise RA (200 Gb/s per "
            "GPU). nvidia-smi reports 81559 MiB (public nvidia-smi captures of 'NVIDIA H100 PCIe')"),
        GPU("h800", "NVIDIA H800 SXM 80GB", 81_559 * MiB, 989e12, 1979e12, 3.35e12,
            200e9, 50e9, 8, _HOPPER,
            "NVIDIA H800 Tensor Core GPU datasheet (SXM): the H100 SXM's compute, BF16 1,979 / FP8 "
            "3,958 TFLOPS sparse -> 989 / 1,979 dense, 80 GB HBM3 3.35 TB/s, NVLink 400 GB/s "
            "bidirectional (the H100's 900 cut for export) -> 200e9 one way. Inter-node: 400 Gb/s "
            "InfiniBand per GPU, the 50 GB/s of DeepSeek-V3's H800 cluster (arXiv 2412.19437, sections "
            "3.1 and 3.2.2). Capacity: no public nvidia-smi capture of an H800 found; the H100 SXM's "
            "reported 81559 MiB for the same 80 GB HBM3 part"),
        GPU("h100-96-500w", "NVIDIA H100 SXM 96GB HBM2e at 500 W (Meta Grand Teton)", 96 * 10**9,
            989e12 * _POWER_500W, 1979e12 * _POWER_500W, 2.4e12, 450e9, 50e9, 8, _HOPPER,
            "torchtitan benchmarks/llama3_h100_202412_torchtitan.md (pytorch/torchtitan b5bcd76c), the GPU of "
            "its published runs: 96 GB HBM2e at 2.4 TB/s (torchao torchao/testing/training/roofline_utils.py, "
            "pytorch/ao 36027d82: 2.4e12, 'custom to Meta's H100 variant'), 8 per host over NVLink, 400 Gb/s "
            "RDMA per GPU, the default 500 W power limit; its footnote 2: the peak 'is between SXM and NVL, and "
            "we don't know its exact value'. Here the H100 SXM's dense 989 / 1,979 TFLOPS (700 W) scaled to "
            "500 W by the clock a power cap sustains: dynamic power C V^2 f with the voltage following the "
            "clock grows as f^3, so f scales as (500/700)^(1/3) = 0.894 (884 / 1,769 TFLOPS); the same rule "
            "puts the H100 NVL (400 W) at 821 against its datasheet's 835.5. Not the H100 NVL, which is a 94 GB "
            "HBM3 PCIe card at 3.9 TB/s (row h100-nvl). Capacity: the nominal 96 GB (no nvidia-smi capture "
            "found)"),
        GPU("h200", "NVIDIA H200 SXM 141GB", 143_771 * MiB, 989e12, 1979e12, 4.8e12,
            450e9, 50e9, 8, _HOPPER,
            "NVIDIA H200 Tensor Core GPU datasheet (SXM): BF16 1,979 / FP8 3,958 TFLOPS sparse -> "
            "989 / 1,979 dense, 141 GB HBM3e 4.8 TB/s, NVLink 900 GB/s; DGX H200: 8x ConnectX-7 "
            "400 Gb/s. nvidia-smi reports 143771 MiB (NVIDIA/cuda-samples issue #311)"),
        GPU("gh200", "NVIDIA GH200 Grace Hopper 96GB HBM3 (GH200 480GB)", 97_871 * MiB, 989e12,
            1979e12, 4.0e12, 450e9, 50e9, 1, _HOPPER,
            "NVIDIA GH200 Grace Hopper Superchip datasheet, 96 GB HBM3 variant (not the 144 GB HBM3e "
            "one): Hopper GPU BF16 1,979 / FP8 3,958 TFLOPS sparse -> 989 / 1,979 dense, HBM3 4 TB/s, "
            "NVLink 900 GB/s (only reachable in NVLink-switch systems such as DGX GH200). Node = one "
            "superchip with one 400 Gb/s ConnectX-7. nvidia-smi reports 97871 MiB for 'NVIDIA GH200 "
            "480GB' (public captures on Lambda GH200 instances)"),
        # ---------------------------------------------------------------- NVIDIA Blackwell
        GPU("b200", "NVIDIA B200 SXM 180GB", 183_359 * MiB, 2.25e15, 4.5e15, 7.7e12,
            900e9, 50e9, 8, _BLACKWELL,
            "NVIDIA HGX B200 datasheet (per GPU): FP16/BF16 4.5 / FP8 9 PFLOPS sparse -> 2.25 / 4.5 "
            "dense, 180 GB HBM3e 7.7 TB/s, NVLink 5 1.8 TB/s. DGX B200 (NVIDIA DGX BasePOD RA): 8x "
            "single-port ConnectX-7 up to 400 Gb/s. nvidia-smi reports 183359 MiB "
            "(NVIDIA/TensorRT-LLM issue #10278)"),
        GPU("gb200", "NVIDIA GB200 NVL72 (Blackwell GPU, 186 GB, 72-GPU NVLink domain)", 189_471 * MiB, 2.5e15,
            5.0e15, 8.0e12, 900e9, 50e9, 72, _BLACKWELL,
            "NVIDIA GB200 NVL72 datasheet, per GPU (the rack's figures / 72): FP8 720 / BF16 360 PFLOPS sparse "
            "-> 5 / 2.5 PFLOPS dense, 13.4 TB HBM3e at 576 TB/s -> 186 GB at 8 TB/s, NVLink 5 1.8 TB/s "
            "(900e9 one way) to every GPU of the rack through the NVLink Switch system: the 72 GPUs are one "
            "NVLink domain (gpus_per_node 72). Between racks one 400 Gb/s ConnectX-7 per GPU (4 per compute "
            "tray). nvidia-smi reports 189471 MiB with a 1200 W cap (public nvidia-smi captures of "
            "'NVIDIA GB200')"),
        GPU("b300", "NVIDIA B300 SXM (Blackwell Ultra) 288GB", 275_040 * MiB, 2.25e15, 4.5e15,
            8.0e12, 900e9, 100e9, 8, _BLACKWELL,
            "NVIDIA HGX B300 datasheet: FP16/BF16 36 / FP8 72 PFLOPS sparse per 8 GPUs -> 2.25 / 4.5 "
            "PFLOPS dense per GPU, 288 GB HBM3e 8 TB/s, NVLink 5 1.8 TB/s, networking 1.6 TB/s per "
            "node = 8x ConnectX-8 800 Gb/s. nvidia-smi reports 275040 MiB for 'NVIDIA B300 SXM6 AC' "
            "(public nvidia-smi captures)"),
        # ---------------------------------------------------------------- AMD Instinct
        GPU("mi300x", "AMD Instinct MI300X 192GB", 196_592 * MiB, 1307.4e12, 2614.9e12, 5.3e12,
            7 * 128e9 / 2, 50e9, 8, _CDNA3,
            "AMD Instinct MI300X datasheet: FP16/BF16 1,307.4 / FP8 2,614.9 TFLOPS dense (2x with "
            "sparsity), 192 GB HBM3 5.3 TB/s, 7 Infinity Fabric links x 128 GB/s (896 GB/s "
            "bidirectional). Inter-node: one 400 Gb/s NIC per GPU (assumed, usual 8x MI300X "
            "training build). rocm-smi reports 206141652992 B = 196592 MiB "
            "(ROCm/legacy-rocm-build issue #4750)"),
        GPU("mi325x", "AMD Instinct MI325X 256GB", 256 * GiB, 1307.4e12, 2614.9e12, 6.0e12,
            7 * 128e9 / 2, 50e9, 8, _CDNA3,
            "AMD Instinct MI325X datasheet: same CDNA 3 compute as MI300X (FP16/BF16 1,307.4 / FP8 "
            "2,614.9 TFLOPS dense), 256 GB HBM3E 6 TB/s, 7 Infinity Fabric links x 128 GB/s. "
            "Capacity: nominal 256 GiB (no rocm-smi capture found; the MI300X's reported 192 GiB - "
            "16 MiB shows AMD's 'GB' is binary here, so this may overstate by ~16 MiB). Inter-node: "
            "one 400 Gb/s NIC per GPU (assumed)"),
        GPU("mi355x", "AMD Instinct MI355X 288GB", 288 * GiB, 2.5e15, 5.0e15, 8.0e12,
            7 * 153.6e9 / 2, 50e9, 8, _CDNA4,
            "AMD Instinct MI355X datasheet: FP16/BF16 2.5 / FP8 5.0 PFLOPS dense (2x with "
            "sparsity), 288 GB HBM3E 8 TB/s, 7 Infinity Fabric links x 153.6 GB/s (1,075.2 GB/s "
            "bidirectional). Capacity: nominal 288 GiB (no rocm-smi capture found; see MI325X). "
            "Inter-node: one 400 Gb/s NIC (AMD Pollara 400) per GPU (assumed)"),
        # ---------------------------------------------------------------- NVIDIA Ada / PCIe
        GPU("l40s", "NVIDIA L40S 48GB", 46_068 * MiB, 362.05e12, 733e12, 864e9,
            32e9, 25e9, 8, _AMPERE_ADA,
            "NVIDIA L40S datasheet: BF16 362.05 / FP8 733 TFLOPS dense (733 / 1,466 sparse), 48 GB "
            "GDDR6 864 GB/s, PCIe Gen4 x16 64 GB/s bidirectional, no NVLink. Inter-node: NVIDIA "
            "PCIe-optimized Enterprise RA (200 Gb/s per GPU). nvidia-smi reports 46068 MiB with ECC "
            "on (modal-labs/modal-client PR #2797)"),
        GPU("l4", "NVIDIA L4 24GB", 23_034 * MiB, 121e12, 242.5e12, 300e9,
            32e9, _100G_SHARED_BY_8, 8, _AMPERE_ADA,
            "NVIDIA L4 datasheet: BF16 242 / FP8 485 TFLOPS sparse -> 121 / 242.5 dense, 24 GB GDDR6 "
            "300 GB/s, PCIe Gen4 x16 64 GB/s bidirectional. Node = 8-card cloud instance (AWS "
            "g6.48xlarge) with 100 Gb/s shared by 8 (assumed). nvidia-smi reports 23034 MiB "
            "(modal-labs/modal-client PR #2797)"),
        GPU("rtx-4090", "NVIDIA GeForce RTX 4090 24GB", 24_564 * MiB, 165.2e12, 330.3e12, 1.008e12,
            32e9, _100G_SHARED_BY_8, 8, _AMPERE_ADA,
            "NVIDIA Ada Lovelace architecture whitepaper (RTX 4090): BF16 165.2 / FP8 330.3 TFLOPS "
            "dense with FP32 accumulate (half the FP16-accumulate rate), GDDR6X 1,008 GB/s, PCIe "
            "Gen4 x16, no NVLink. Node = 8-card rental box with 100 Gb/s shared (assumed). "
            "nvidia-smi reports 24564 MiB (public nvidia-smi captures)"),
        GPU("rtx-5090", "NVIDIA GeForce RTX 5090 32GB", 32_607 * MiB, 209.5e12, 419e12, 1.792e12,
            64e9, _100G_SHARED_BY_8, 8, _BLACKWELL,
            "NVIDIA RTX Blackwell GPU architecture whitepaper (RTX 5090): BF16 209.5 / FP8 419 "
            "TFLOPS dense with FP32 accumulate (FP16 accumulate: 419 / 838), GDDR7 1,792 GB/s, PCIe "
            "Gen5 x16, no NVLink. Node = 8-card rental box with 100 Gb/s shared (assumed). "
            "nvidia-smi reports 32607 MiB (noonghunna/club-3090 issue #617)"),
        # ---------------------------------------------------------------- NVIDIA Ampere / PCIe
        GPU("a10g", "NVIDIA A10G (AWS G5)", 23_028 * MiB, 70e12, None, 600e9,
            32e9, _100G_SHARED_BY_8, 8, _AMPERE_ADA,
            "No NVIDIA datasheet for the AWS-only A10G. BF16 ~70 TFLOPS dense (FP32 accumulate) per "
            "Baseten 'NVIDIA A10 vs A10G' (the A10's 125 TFLOPS does not apply; 80 SMs x 512 "
            "FLOP/clk x 1.71 GHz = 70e12, unconfirmed by NVIDIA); GDDR6 600 GB/s; no "
            "FP8; PCIe Gen4 x16. Node = AWS g5.48xlarge (8 GPUs, 100 Gb/s per instance, shared by "
            "8). nvidia-smi reports 23028 MiB (NVIDIA/DCGM issue #232)"),
    )
}
