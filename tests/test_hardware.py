"""The GPU catalog: every figure positive, the known reported capacities and datasheet numbers exact,
and a bad GPU id rejected with a message that says what is allowed.

Every number below is either computed here or quoted with its source in a comment.
"""

from __future__ import annotations

import dataclasses
import subprocess
import sys

import pytest

from estimator.spec.errors import ConfigError
from estimator.spec.gpus import GPU, GPUS, GiB
from estimator.spec.hardware import Hardware, get_gpu

MiB = 1024**2

# The ids the app offers, in catalog order (the task's list of GPUs to support).
EXPECTED_IDS = [
    "a100-40", "a100-80", "h100-80", "h100-nvl", "h100-pcie", "h800", "h100-96-500w", "h200", "gh200", "b200",
    "gb200", "b300",
    "mi300x", "mi325x", "mi355x", "l40s", "l4", "rtx-4090", "rtx-5090", "a10g",
]

# Marketing capacity in GB, as each vendor's datasheet / product page names the part:
# A100 40/80 GB, H100 80 GB, H100 NVL 94 GB, H800 80 GB, H200 141 GB, GH200 96 GB HBM3, B200 180 GB (HGX B200),
# B300 288 GB (HGX B300), H100 96 GB HBM2e (torchtitan's benchmark page), GB200 186 GB (GB200 NVL72),
# MI300X 192 GB, MI325X 256 GB, MI355X 288 GB, L40S 48 GB, L4 24 GB, RTX 4090 24 GB, RTX 5090 32 GB,
# A10G 24 GB (AWS G5 page).
NOMINAL_GB = {
    "a100-40": 40, "a100-80": 80, "h100-80": 80, "h100-nvl": 94, "h100-pcie": 80, "h800": 80, "h200": 141,
    "gh200": 96, "b200": 180, "b300": 288, "h100-96-500w": 96, "gb200": 186, "mi300x": 192, "mi325x": 256,
    "mi355x": 288,
    "l40s": 48, "l4": 24, "rtx-4090": 24, "rtx-5090": 32, "a10g": 24,
}

# "Total" memory as nvidia-smi / rocm-smi print it, in MiB, with the public capture it comes from.
REPORTED_MIB = {
    "h100-80": 81_559,  # nvidia-smi, "NVIDIA H100 80GB HBM3" (NVIDIA/nccl issue #1264)
    "h100-pcie": 81_559,  # nvidia-smi, "NVIDIA H100 PCIe" (public nvidia-smi captures)
    "h100-nvl": 95_830,  # nvidia-smi, "NVIDIA H100 NVL" (NVIDIA/gpu-admin-tools issue #4)
    "a100-80": 81_920,  # nvidia-smi, A100 80GB (modal-labs/modal-client PR #2797)
    "a100-40": 40_960,  # nvidia-smi, A100 40GB (modal-labs/modal-client PR #2797)
    "h200": 143_771,  # nvidia-smi, "NVIDIA H200" (NVIDIA/cuda-samples issue #311)
    "gh200": 97_871,  # nvidia-smi, "NVIDIA GH200 480GB" = 96 GB HBM3 variant (Lambda captures)
    "b200": 183_359,  # nvidia-smi, "NVIDIA B200" (NVIDIA/TensorRT-LLM issue #10278)
    "b300": 275_040,  # nvidia-smi, "NVIDIA B300 SXM6 AC" (public nvidia-smi captures)
    "gb200": 189_471,  # nvidia-smi, "NVIDIA GB200", 1200 W cap (public nvidia-smi captures)
    "l40s": 46_068,  # nvidia-smi, L40S, ECC on (modal-labs/modal-client PR #2797)
    "l4": 23_034,  # nvidia-smi, L4 (modal-labs/modal-client PR #2797)
    "a10g": 23_028,  # nvidia-smi, "NVIDIA A10G" (NVIDIA/DCGM issue #232)
    "rtx-4090": 24_564,  # nvidia-smi, "NVIDIA GeForce RTX 4090" (public nvidia-smi captures)
    "rtx-5090": 32_607,  # nvidia-smi, "NVIDIA GeForce RTX 5090" (noonghunna/club-3090 issue #617)
    "mi300x": 196_592,  # rocm-smi "VRAM Total Memory (B): 206141652992" (ROCm/legacy-rocm-build #4750)
}

# GPUs without fp8 tensor cores (Ampere: A100 datasheet and GA102 have no FP8 format).
NO_FP8 = {"a100-40", "a100-80", "a10g"}


@pytest.fixture(params=list(GPUS), ids=list(GPUS))
def gpu(request) -> GPU:
    return GPUS[request.param]


def test_catalog_has_exactly_the_expected_ids():
    assert list(GPUS) == EXPECTED_IDS
    for gpu_id, gpu in GPUS.items():
        assert gpu.id == gpu_id


def test_gpu_interface_is_unchanged():
    assert [f.name for f in dataclasses.fields(GPU)] == [
        "id", "name", "capacity_bytes", "bf16_flops", "fp8_flops", "memory_bandwidth",
        "intra_node_bandwidth", "inter_node_bandwidth", "gpus_per_node", "runtime", "source",
    ]
    assert dataclasses.is_dataclass(GPU) and GPU.__dataclass_params__.frozen


def test_every_field_is_positive_and_typed(gpu):
    assert isinstance(gpu.capacity_bytes, int) and gpu.capacity_bytes > 0
    assert gpu.bf16_flops > 0
    assert gpu.fp8_flops is None or gpu.fp8_flops > 0
    assert gpu.memory_bandwidth > 0
    assert gpu.intra_node_bandwidth > 0
    assert gpu.inter_node_bandwidth > 0
    assert isinstance(gpu.gpus_per_node, int) and gpu.gpus_per_node >= 1
    assert isinstance(gpu.cuda_context_bytes, int) and gpu.cuda_context_bytes > 0
    assert gpu.name and gpu.source


def test_capacity_is_near_the_nominal_size(gpu):
    # Reported memory is a little under the nominal size counted in GiB (HBM stacks are binary)
    # and never far under the nominal size counted in decimal GB.
    nominal = NOMINAL_GB[gpu.id]
    assert 0.95 * nominal * 10**9 <= gpu.capacity_bytes <= nominal * GiB


@pytest.mark.parametrize("gpu_id,mib", sorted(REPORTED_MIB.items()))
def test_reported_capacities_are_used_exactly(gpu_id, mib):
    assert GPUS[gpu_id].capacity_bytes == mib * MiB


def test_h100_capacity_and_bf16_quoted():
    h100 = GPUS["h100-80"]
    # nvidia-smi on H100 SXM: "0MiB / 81559MiB" (NVIDIA/nccl issue #1264).
    assert h100.capacity_bytes == 81559 * 1024**2
    # NVIDIA H100 datasheet, SXM: BF16 Tensor Core 1,979 TFLOPS "with sparsity"; dense is half:
    # 989.4 TFLOPS in the Hopper whitepaper, quoted as 989.
    assert h100.bf16_flops == 989e12
    assert h100.bf16_flops == pytest.approx(1979e12 / 2, rel=1e-3)
    # Same datasheet: FP8 3,958 TFLOPS with sparsity -> 1,979 dense; HBM3 3.35 TB/s.
    assert h100.fp8_flops == pytest.approx(3958e12 / 2, rel=1e-3)
    assert h100.memory_bandwidth == 3.35e12
    # Same datasheet: NVLink 900 GB/s (both directions) -> 450 GB/s one way; 8 GPUs per HGX board.
    assert h100.intra_node_bandwidth == 900e9 / 2
    assert h100.gpus_per_node == 8
    # DGX H100: one 400 Gb/s ConnectX-7 per GPU -> 400e9 / 8 bytes/s.
    assert h100.inter_node_bandwidth == 400e9 / 8


def test_h800_is_the_h100_with_its_nvlink_cut():
    """Issue 26: the README's "2,048 H800s" (DeepSeek-V3) names a catalog GPU. NVIDIA H800 SXM
    datasheet: the H100 SXM's compute (BF16 1,979 / FP8 3,958 TFLOPS with sparsity), 80 GB HBM3 at
    3.35 TB/s, NVLink 400 GB/s both directions; DeepSeek-V3 report (arXiv 2412.19437) section 3.2.2:
    IB 50 GB/s per GPU across nodes."""
    h800, h100 = GPUS["h800"], GPUS["h100-80"]
    assert (h800.bf16_flops, h800.fp8_flops, h800.memory_bandwidth) == (989e12, 1979e12, 3.35e12)
    assert (h800.bf16_flops, h800.fp8_flops, h800.memory_bandwidth) == \
        (h100.bf16_flops, h100.fp8_flops, h100.memory_bandwidth)
    assert h800.intra_node_bandwidth == 400e9 / 2  # one way
    assert h800.inter_node_bandwidth == 400e9 / 8  # 400 Gb/s = 50 GB/s
    assert h800.capacity_bytes == h100.capacity_bytes == 81_559 * MiB  # the H100's reported figure (no H800 capture)
    assert h800.gpus_per_node == 8 and "H800" in h800.name and "2412.19437" in h800.source


def test_torchtitans_h100_is_its_own_row():
    """Issue 22: torchtitan's published H100 runs (benchmarks/llama3_h100_202412_torchtitan.md) are on
    96 GB HBM2e parts at 2.4 TB/s and a 500 W limit, 'between SXM and NVL' in peak: the SXM's at the
    clock 500 W sustains, f ~ P^(1/3) (dynamic power C V^2 f, V ~ f): 989 x (500/700)^(1/3) = 884 TFLOPS.
    The same rule gives the 400 W H100 NVL 821, its datasheet 835.5 (within 2%). The H100 NVL is another
    part (94 GB HBM3, 3.9 TB/s, PCIe)."""
    meta, sxm, nvl = GPUS["h100-96-500w"], GPUS["h100-80"], GPUS["h100-nvl"]
    assert meta.bf16_flops == pytest.approx(884.07e12, rel=1e-4)
    assert meta.fp8_flops == pytest.approx(1769.0e12, rel=1e-4)
    assert nvl.bf16_flops < meta.bf16_flops < sxm.bf16_flops
    assert sxm.bf16_flops * (400 / 700) ** (1 / 3) == pytest.approx(nvl.bf16_flops, rel=0.02)
    assert meta.memory_bandwidth == 2.4e12 and nvl.memory_bandwidth == 3.9e12
    assert (meta.intra_node_bandwidth, meta.inter_node_bandwidth, meta.gpus_per_node) == (450e9, 50e9, 8)
    assert meta.capacity_bytes == 96 * 10**9 and "500 W" in meta.name


def test_gb200_nvl72_is_one_72_gpu_nvlink_domain():
    """GB200 NVL72 datasheet, the rack / 72: FP8 720 and BF16 360 PFLOPS with sparsity -> 5 and 2.5 dense
    per GPU, 576 TB/s -> 8 TB/s, NVLink 5 at 1.8 TB/s both ways to all 72 GPUs; one 400 Gb/s NIC per GPU
    between racks. Its B200 die runs faster than the HGX B200's (2.25 PFLOPS bf16 at 1,000 W)."""
    gb = GPUS["gb200"]
    assert (gb.bf16_flops, gb.fp8_flops) == (360e15 / 72 / 2, 720e15 / 72 / 2)
    assert gb.memory_bandwidth == pytest.approx(576e12 / 72)
    assert (gb.intra_node_bandwidth, gb.gpus_per_node, gb.inter_node_bandwidth) == (1.8e12 / 2, 72, 400e9 / 8)
    assert gb.bf16_flops > GPUS["b200"].bf16_flops


def test_h100_ridge_point_by_hand():
    h100 = GPUS["h100-80"]
    # 989e12 FLOP/s / 3.35e12 B/s = 295.22... FLOP per byte read from HBM.
    ridge = h100.bf16_flops / h100.memory_bandwidth
    assert ridge == pytest.approx(989 / 3.35)
    assert 295 < ridge < 296


def test_datasheet_dense_figures_are_half_the_sparse_headline():
    # (id, bf16 sparse, fp8 sparse) as printed, with "*" = with sparsity, in each NVIDIA datasheet.
    headlines = [
        ("h100-pcie", 1513e12, 3026e12),  # H100 datasheet, PCIe column
        ("h100-nvl", 1671e12, 3341e12),  # H100 datasheet, H100 NVL column (per GPU)
        ("h200", 1979e12, 3958e12),  # H200 datasheet, SXM column
        ("b200", 4.5e15, 9e15),  # HGX B200 datasheet, per GPU
        ("l4", 242e12, 485e12),  # L4 datasheet
    ]
    for gpu_id, bf16_sparse, fp8_sparse in headlines:
        gpu = GPUS[gpu_id]
        assert gpu.bf16_flops == pytest.approx(bf16_sparse / 2, rel=2e-3), gpu_id
        assert gpu.fp8_flops == pytest.approx(fp8_sparse / 2, rel=2e-3), gpu_id
    # The L40S datasheet prints dense and sparse side by side, and they are not exactly 1:2 for
    # BF16 (362.05 | 733*) nor 1:2 against each other (FP8 733 | 1,466*); the dense figures are used.
    assert GPUS["l40s"].bf16_flops == 362.05e12
    assert GPUS["l40s"].fp8_flops == 733e12


def test_amd_figures_quoted():
    mi300x = GPUS["mi300x"]
    # AMD Instinct MI300X datasheet: FP16/BF16 1,307.4 and FP8 2,614.9 TFLOPS dense; 5.3 TB/s.
    assert mi300x.bf16_flops == 1307.4e12
    assert mi300x.fp8_flops == 2614.9e12
    assert mi300x.memory_bandwidth == 5.3e12
    # Same datasheet: 7 Infinity Fabric links at 128 GB/s peak each (both directions).
    assert mi300x.intra_node_bandwidth == pytest.approx(7 * 128e9 / 2)
    # MI325X datasheet: 6 TB/s; MI355X datasheet: 8 TB/s, 7 links at 153.6 GB/s.
    assert GPUS["mi325x"].memory_bandwidth == 6e12
    assert GPUS["mi355x"].memory_bandwidth == 8e12
    assert GPUS["mi355x"].intra_node_bandwidth == pytest.approx(7 * 153.6e9 / 2)


def test_fp8_only_where_the_tensor_cores_have_it(gpu):
    if gpu.id in NO_FP8:
        assert gpu.fp8_flops is None
    else:
        assert gpu.fp8_flops is not None


def test_fp8_is_faster_than_bf16(gpu):
    if gpu.fp8_flops is None:
        pytest.skip("no fp8 tensor cores")
    assert gpu.fp8_flops > gpu.bf16_flops
    # Every fp8-capable part here runs fp8 at twice its bf16 rate in its vendor's table, to within
    # the L40S datasheet's own rounding (733 / 362.05 = 2.025).
    assert gpu.fp8_flops == pytest.approx(2 * gpu.bf16_flops, rel=0.02)


def test_fabric_is_not_slower_inside_the_node_than_between_nodes(gpu):
    assert gpu.intra_node_bandwidth >= gpu.inter_node_bandwidth


def test_the_runtime_follows_the_architecture(gpu):
    """Hopper: the CUDA context and kernels measured on an H200 (766.8 MiB outside the allocator) and
    PyTorch's 32 MiB cuBLAS workspace; Blackwell the same workspace (compute capability 10.x, 12.x) and
    the Hopper figure for the context; Ampere/Ada the 512 MiB low end of Bekman's 0.5-2 GB and
    2 x 4096 KiB + 8 x 16 KiB; AMD's gfx94x/gfx95x hipBLAS 128 MiB (CublasHandlePool.cpp)."""
    runtime = gpu.runtime
    if gpu.id.startswith(("h100", "h200", "gh200", "h800")):
        assert (runtime.context_bytes, runtime.blas_workspace_bytes) == (804_061_184, 32 * MiB)
        assert "measured on an H200" in runtime.context_source
    elif gpu.id.startswith(("b200", "b300", "gb200", "rtx-5090")):
        assert (runtime.context_bytes, runtime.blas_workspace_bytes) == (804_061_184, 32 * MiB)
        assert "not measured on Blackwell" in runtime.context_source
    elif gpu.id.startswith("mi3"):
        assert (runtime.context_bytes, runtime.blas_workspace_bytes) == (512 * MiB, 128 * MiB)
    else:
        assert (runtime.context_bytes, runtime.blas_workspace_bytes) == (512 * MiB, 8 * MiB + 128 * 1024)
        assert "Preloaded CUDA kernels memory usage" in runtime.context_source
    assert gpu.cuda_context_bytes == runtime.context_bytes


def test_get_gpu_returns_the_catalog_entry():
    for gpu_id in GPUS:
        assert get_gpu(gpu_id) is GPUS[gpu_id]
        assert Hardware(gpu=gpu_id).device is GPUS[gpu_id]


def test_default_hardware_is_h100():
    assert Hardware().device.id == "h100-80"


@pytest.mark.parametrize("make", [lambda: Hardware(gpu="nope"), lambda: get_gpu("nope")])
def test_unknown_gpu_is_a_config_error_naming_field_value_and_choices(make):
    with pytest.raises(ConfigError) as info:
        make()
    error = info.value
    message = str(error)
    assert error.field == "hardware.gpu"
    assert error.value == "nope"
    assert "hardware.gpu" in message
    assert "'nope'" in message
    for gpu_id in GPUS:
        assert gpu_id in message
    assert isinstance(error, ValueError)


def test_bad_expandable_segments_is_a_config_error():
    with pytest.raises(ConfigError, match="hardware.expandable_segments"):
        Hardware(expandable_segments="yes")  # type: ignore[arg-type]


def test_import_pulls_in_no_ui_libraries():
    code = (
        "import sys, estimator, estimator.spec.hardware, estimator.memory.memory; "
        "bad = {'streamlit', 'pandas'} & set(sys.modules); "
        "assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
