"""Device memory of one NCCL communicator on one rank, as NCCL 2.27-2.28 builds it on an NVSwitch node (modelled).

Where it shows in vLLM: from 0.19 the FlashInfer all-reduce fusion workspace (serving/allreduce_fusion.py) is
built while the model compiles, after the start-up snapshot, and FlashInfer exchanges its handles with
all_gather_object and barrier over the TP group's torch ProcessGroupNCCL (vLLM 0.19.0 flashinfer_all_reduce.py
_create_workspace: TorchDistBackend). vLLM creates that process group without a device_id, so torch builds its
NCCL communicator lazily, on that first collective (the 0.19 logs print torch's "barrier(): using the device
under current context" warning there, after the snapshot), and the communicator's buffers are counted in
non-torch memory. vLLM's own pynccl communicator was built and warmed up before the snapshot.

By release (tp_group_nccl): the fusion pass exchanges over the TP group's device (NCCL) group in 0.19.0, 0.20.0,
0.25.0 and 0.26.0 (compilation/passes/fusion/allreduce_rms_fusion.py: self.group = get_tp_group().device_group)
and over its gloo cpu_group from 0.27.0 (read in 0.27.0 and 0.33.0), so no NCCL communicator is built there. The
device group stays lazy in those releases: init_distributed_environment and GroupCoordinator's new_group pass no
device_id (distributed/parallel_state.py, 0.20.0-0.26.0; the eager split_group path of 0.25.0 on is off by default,
envs.py VLLM_DISTRIBUTED_USE_SPLIT_GROUP=0). The NCCL is the one in the torch each release pins (wheel METADATA,
generated from requirements/cuda.txt): 0.19 torch 2.10.0 -> nvidia-nccl-cu12 2.27.5; 0.20-0.26 torch 2.11.0 ->
nvidia-nccl-cu13 2.28.9; 0.27-0.32 torch 2.13.0 -> 2.29.7; 0.33 torch 2.14.0 -> 2.30.7 (those two not built).
2.28.9 keeps 2.27.5's buffer sizes, sm90 speed arrays, SM90_NVLINK_BW and allocation calls (read at v2.28.9-1),
but from 2.28.7 ncclNvlsInit returns only below 2 GPUs (gpuCount < 2), so the NVLS buffers come at TP 2 as well,
and from 2.28 ncclNvlsSetup loops over comm->nvlsChannels (NVLS_NCHANNELS_SM90 = 16) instead of comm->nChannels
(24 ring channels in 2.27.5): 16 nvlsDevPeers (channel.cc initNvlsChannel) + 1 credit buffer, 34 MiB.

NCCL 2.27.5 (the version the 0.19 logs print: "vLLM is using nccl==2.27.5", torch's libnccl), read at tag
v2.27.5-1. With cuMem on (NCCL_CUMEM_ENABLE auto, vLLM sets nothing) every device allocation is rounded up to
the 2 MiB allocation granularity (include/alloc.h ncclCuMemAlloc, ncclCudaCallocAsync):
- devCommSetup (init.cc): the device comm + channels and rankToLocalRank: 2 allocations;
- initChannel (channel.cc) for each of p2pnChannels channels: sharedRes devPeers, devPeers, devRingUserRanks:
  3 allocations a channel; p2pnChannels = pow2Up(nChannels) (graph/paths.cc ncclTopoComputeP2pChannels);
- NVLS (transport/nvls.cc ncclNvlsSetup, only above 2 ranks: ncclNvlsInit returns for gpuCount <= 2): one
  nvlsDevPeers allocation a channel and the credit buffer (UC memory at the 2 MiB granularity);
- the ring, connected at the first collective (NCCL_RUNTIME_CONNECT=1 connects only the algorithm a collective
  takes). all_gather_object's all-gathers and barrier's 1-element all-reduce take the ring: for a few bytes
  the time is graph/tuning.cc's latency, ring LL 6.6 + 2(n-1) x 0.6 us against tree LL 6.8 + 2(n-1) x 0.6 us
  and NVLS (Simple only) 25 us on NVLink. Per channel one send and one receive connection (transport/p2p.cc).
  On sm90 P2P read is off (graph/paths.cc: read only for compute capability 80), so the receiver holds all three protocol
  buffers: LL 512 KiB + LL128 4,800 KiB + SIMPLE 4 MiB + ncclRecvMem 4 KiB, aligned to CUDA_IPC_MIN (2 MiB)
  = 10 MiB; the sender ncclSendMem 4 KiB -> 2 MiB (init.cc DEFAULT_*_BUFFSIZE, include/device.h, comm.h).

Channel count (graph/search.cc, connect.cc) on H100/H200 SXM: each GPU reaches the NVSwitches over 18 NVLinks
of SM90_NVLINK_BW 20.6 GB/s = 370.8 GB/s; the ring search starts at sm90SpeedArrayIntra's 60 GB/s and keeps
floor(370.8 / 60) = 6 channels (no lower speed gives a larger channels x speed), ncclTopoDupChannels doubles
them (bwIntra 60 >= 50) to 12 and ncclTopoPostset doubles again: 24 channels, 32 p2p channels. The same at 2,
4 or 8 ranks: the node's NVSwitch gives every GPU the same bandwidth.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..spec.nccl import GRANULARITY  # cuMem's allocation granularity, 2 MiB (spec/nccl.py)

MiB = 1024**2
LL_BUFFER = 8 * 512 * 8 * 16  # NCCL_LL_LINES_PER_THREAD x NCCL_LL_MAX_NTHREADS x NCCL_STEPS x 16 B
LL128_BUFFER = 120 * 640 * 8 * 8  # NCCL_LL128_ELEMS_PER_THREAD x NCCL_LL128_MAX_NTHREADS x NCCL_STEPS x 8 B
SIMPLE_BUFFER = 1 << 22  # DEFAULT_BUFFSIZE (NCCL_BUFFSIZE)
CONN_HEADER = 4096  # sizeof(ncclSendMem) = sizeof(ncclRecvMem) = MEM_ALIGN
# GPUs whose ring channel count was derived (module docstring): 18 NVLink-4 links to the NVSwitches
NVSWITCH_SM90 = ("h100-80", "h200")
RING_CHANNELS = 24
# (first vLLM release, first release after, torch pin, NCCL of that torch, TP group's communicator built after the
# snapshot): the module docstring cites each
TORCH_NCCL = (((0, 19), (0, 20), "2.10.0", "2.27.5", True), ((0, 20), (0, 27), "2.11.0", "2.28.9", True),
              ((0, 27), (0, 33), "2.13.0", "2.29.7", False), ((0, 33), (0, 34), "2.14.0", "2.30.7", False))
NVLS_AT_TWO_GPUS = (2, 28, 7)  # transport/nvls.cc ncclNvlsInit: "gpuCount <= 2" before, "gpuCount < 2" from 2.28.7
NVLS_CHANNELS_FROM = (2, 28, 3)  # ncclNvlsSetup's channel loops: comm->nChannels in 2.27.5, comm->nvlsChannels from 2.28.3
NVLS_NCHANNELS_SM90 = 16  # transport/nvls.cc


@dataclass(frozen=True)
class CommunicatorMemory:
    bytes: int
    formula: str
    source: str


def _round_up(value: int, step: int = GRANULARITY) -> int:
    return -(-value // step) * step


def _pow2_up(value: int) -> int:
    return 1 << (value - 1).bit_length()


def ring_connection_bytes() -> int:
    """One channel's send + receive connection on one rank (p2p.cc p2pSendSetup / p2pRecvSetup, no P2P read)."""
    receive = _round_up(CONN_HEADER + LL_BUFFER + LL128_BUFFER + SIMPLE_BUFFER)
    send = _round_up(CONN_HEADER)
    return send + receive


def tp_group_nccl(release: tuple[int, int]) -> str | None:
    """The NCCL version whose communicator the TP group's torch process group builds after vLLM's start-up
    snapshot in this release; None where none is built (before 0.19 not read; 0.27 on: the gloo group)."""
    for first, after, _torch, nccl, built in TORCH_NCCL:
        if first <= release < after:
            return nccl if built else None
    return None


def communicator_bytes(ranks: int, gpu_id: str, nccl: str = "2.27.5") -> CommunicatorMemory | None:
    """One rank's device memory for a communicator of `ranks` GPUs on one NVSwitch node after its first ring
    collective, for NCCL `nccl` (2.27.5 or 2.28.9, read); None where the channel count was not derived (other GPUs,
    a single rank)."""
    if ranks < 2 or gpu_id not in NVSWITCH_SM90:
        return None
    channels, p2p_channels = RING_CHANNELS, _pow2_up(RING_CHANNELS)
    dev_comm = 2 * GRANULARITY
    channel_setup = 3 * GRANULARITY * p2p_channels
    ring = channels * ring_connection_bytes()
    release = tuple(int(x) for x in nccl.split("."))
    nvls_channels = NVLS_NCHANNELS_SM90 if release >= NVLS_CHANNELS_FROM else channels
    nvls = (nvls_channels + 1) * GRANULARITY if ranks >= (2 if release >= NVLS_AT_TWO_GPUS else 3) else 0
    total = dev_comm + channel_setup + ring + nvls
    formula = (f"NCCL {nccl}, {channels} ring channels: dev comm 2 x 2 MiB + {p2p_channels} channels x 3 x "
               f"2 MiB + {channels} x (10 MiB receive + 2 MiB send)"
               + (f" + NVLS {nvls_channels + 1} x 2 MiB" if nvls else "") + f" = {total / MiB:.0f} MiB")
    source = (f"NCCL v{nccl}-1 init.cc devCommSetup, channel.cc initChannel, transport/p2p.cc, "
              "transport/nvls.cc ncclNvlsSetup, graph/search.cc + connect.cc channel count "
              "(estimator/serving/nccl_comm.py)")
    return CommunicatorMemory(total, formula, source)
