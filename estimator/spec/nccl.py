"""What NCCL allocates on a GPU for a communicator of one rank, by the NCCL release a PyTorch release ships.

A process that makes any NCCL communicator holds, outside PyTorch's caching allocator:
- NCCL's kernels, loaded once a process with its first communicator (NCCL_KERNELS, measured): a communicator's
  initialisation calls ncclInitKernelsForDevice (init.cc l. 1534), which takes cudaFuncGetAttributes of every NCCL
  kernel (enqueue.cc l. 28-52), loading each module under lazy loading, once a process (v2.14.3-1 does the same,
  enqueue.cc l. 100);
- per communicator, the device allocations its initialisation makes. At one rank (NCCL v2.28.9-1, read):
  devCommSetup (src/init.cc l. 512, 514) allocates the device comm with its channels and rankToLocalRank: 2
  allocations; every channel set up calls initChannel (src/channel.cc l. 42, 45, 56: sharedRes->devPeers,
  devPeers, devRingUserRanks): 3 allocations a channel. A communicator of one rank sets up MAXCHANNELS = 64
  channels (include/device.h): its topology holds one GPU, so ncclTopoSearchInit (graph/search.cc l. 42-45)
  gives it LOC_BW = 5000 GB/s, the ring search fills ringGraph->maxChannels = MAXCHANNELS/2 = 32 channels
  (init.cc l. 1019) and ncclTopoPostset doubles them (graph/connect.cc l. 452: min(MAXCHANNELS, 2 x 32));
  ncclTopoComputeP2pChannels (graph/paths.cc) adds none (pow2Up(64) = 64). Nothing is connected: a collective
  at one rank is ncclLaunchOneRank, a copy (enqueue.cc l. 2569), and no NVLS (transport/nvls.cc l. 161:
  ncclNvlsInit returns below 2 GPUs).
  So 2 + 3 x 64 = 194 allocations of 23,648 + 4 + 64 x (608 + 24 + 4) = 64,356 B requested.
- With cuMem (NCCL_CUMEM_ENABLE) each allocation is its own cuMemCreate rounded up to the allocation granularity,
  2 MiB on NVIDIA data-center GPUs (include/alloc.h ncclCuMemAlloc: cuMemGetAllocationGranularity(MINIMUM),
  ALIGN_SIZE): 194 x 2 MiB = 388 MiB a communicator. NCCL_CUMEM_ENABLE defaults to 0 through 2.18 and to -2
  (on where the driver supports it) from 2.19.1 (src/misc/cudawrap.cc NCCL_PARAM(CuMemEnable), v2.18.5-1 and
  v2.19.1-1); DeepSpeed 0.19.5 and Megatron-Core 0.16.1 do not set it (their sources), and under torch 2.11 the
  records' allocations lie 2 MiB apart (cuMem on). Frameworks that set NCCL_CUMEM_ENABLE=0 themselves (several RL
  stacks do) are not modelled: the choice is the torch release's default. Without cuMem, cudaMalloc
  packs the 194 small allocations into shared pages (the requested bytes are charged; not measured).
- PyTorch's NCCL: torch 2.0 ships NCCL 2.14.3, 2.1 ships 2.18.1, 2.2 ships 2.19.3 (pytorch/builder#1668, the
  2.2 wheels' NCCL), 2.11 ships 2.28.9 (the H200 records' `versions.nccl`); NCCL's releases only rise with
  torch's, so cuMem is on from torch 2.2 (TORCH_CUMEM_FROM).

Measured on an H200 (torch 2.11.0+cu130, NCCL 2.28.9, driver 580.159.04; the used bytes less the allocator's
reserved bytes): deepspeed.init_distributed, which makes one communicator, adds 585,105,408 B = 279 x 2 MiB
(tests/data/measured/gpu/experiments/nccl-world-h200.json); NCCL's own ALLOC log of the Megatron step
(tests/data/measured/gpu/megatron, `nccl`) shows 4 communicators of 194 allocations each, every pointer 2 MiB
from the last: 279 - 194 = 85 x 2 MiB are NCCL's kernels (NCCL_KERNELS).
"""

from __future__ import annotations

from dataclasses import dataclass

MiB = 1024**2
GRANULARITY = 2 * MiB  # cuMemGetAllocationGranularity(MINIMUM) for device memory; CUDA_IPC_MIN (comm.h)
MAXCHANNELS = 64  # NCCL include/device.h
ONE_RANK_CHANNELS = MAXCHANNELS  # 2 x ringGraph->maxChannels (MAXCHANNELS/2) at LOC_BW: module docstring
DEV_COMM_ALLOCATIONS = (23_648, 4)  # init.cc devCommSetup: ncclKernelCommAndChannels, rankToLocalRank (nranks 1)
CHANNEL_ALLOCATIONS = (608, 24, 4)  # channel.cc initChannel at nranks 1: sharedRes devPeers, devPeers, ring ranks
TORCH_CUMEM_FROM = (2, 2)  # torch 2.2 ships NCCL 2.19.3, the first with NCCL_CUMEM_ENABLE on by default
# NCCL's kernels, loaded with a process's first communicator: 279 - 194 granules (module docstring)
NCCL_KERNELS = 585_105_408 - 194 * GRANULARITY
RECORD = "tests/data/measured/gpu/experiments/nccl-world-h200.json"
SOURCE = ("NCCL v2.28.9-1 init.cc devCommSetup, channel.cc initChannel, include/alloc.h ncclCuMemAlloc, "
          "graph/search.cc + connect.cc (64 channels at one rank), misc/cudawrap.cc NCCL_CUMEM_ENABLE (default on "
          "from v2.19.1-1); torch 2.2 ships NCCL 2.19.3 (pytorch/builder#1668) (estimator/spec/nccl.py)")


@dataclass(frozen=True)
class OneRankCommunicator:
    """The device memory of one communicator of one rank, as one NCCL release allocates it."""

    allocations: int
    bytes: int
    formula: str


def cumem(torch_release: tuple[int, int]) -> bool:
    """Whether the NCCL that this PyTorch release ships allocates with cuMem by default (TORCH_CUMEM_FROM)."""
    return torch_release >= TORCH_CUMEM_FROM


def one_rank_communicator(torch_release: tuple[int, int]) -> OneRankCommunicator:
    """One communicator of one rank (the module docstring), for the NCCL of this PyTorch release."""
    allocations = len(DEV_COMM_ALLOCATIONS) + len(CHANNEL_ALLOCATIONS) * ONE_RANK_CHANNELS
    if cumem(torch_release):
        total = allocations * GRANULARITY
        return OneRankCommunicator(allocations, total, f"(2 + 3 x {ONE_RANK_CHANNELS} channels) allocations x "
                                                       f"2 MiB (cuMem) = {total / MiB:.0f} MiB")
    total = sum(DEV_COMM_ALLOCATIONS) + ONE_RANK_CHANNELS * sum(CHANNEL_ALLOCATIONS)
    return OneRankCommunicator(allocations, total, f"{allocations} cudaMalloc allocations of {total:,} B requested "
                                                   "(NCCL before 2.19: no cuMem)")
