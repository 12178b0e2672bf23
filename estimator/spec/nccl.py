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
  records' allocations lie 2 MiB apart (cuMem on). That is the default (training.nccl_cumem empty), except beside an
  SGLang rollout engine; RL stacks turn cuMem off in their training processes, to match SGLang's and vLLM's
  engines for the weight sync (uses_cumem, RL_STACKS_CUMEM_OFF).
- Without cuMem (measured with NCCL 2.28.9 and NCCL_CUMEM_ENABLE=0, tests/data/measured/gpu/experiments/
  nccl-mechanism-h200.json), two things differ. (a) The small allocations are cudaMalloc's, which the driver packs
  into shared 2 MiB pages: the first communicator's 194 and its split's 194 (and the step's own small cudaMallocs)
  sit in one page (SMALL_PAGE), charged once a process. (b) Without cuMem there is no runtime connect
  (init.cc l. 1269: runtimeConn = cuMemSupport && NCCL_RUNTIME_CONNECT), so initialisation connects everything,
  which at one rank is only the local net proxy's shared init (init.cc l. 1307-1308, ncclProxyMsgSharedInit with
  p2pnChannels): one cudaMalloc of p2pnChannels x NCCL_SHARED_STEPS (16) x p2pChunkSize (transport/net.cc
  sharedNetBuffersInit l. 647, 656) a communicator, 64 x 16 x 512 KiB = 512 MiB there (P2P_NVL_CHUNKSIZE: one GPU
  is "all NVLink", graph/paths.cc l. 925-944). NCCL's kernels load the same 85 granules: the run's initialisation
  adds 342 = 85 + 1 + 256, the split 256 (its small allocations in the same page) and the step 75 (76 with cuMem,
  where the step's own small cudaMalloc opens the page).
- NCCL_CUMEM_ENABLE: NCCL reads it once (src/misc/cudawrap.cc ncclCuMemEnable: a value >= 0 is taken as it is,
  0 off; -2, the default, on where the driver supports it; other negatives off). Torch before 2.2 with cuMem turned
  on is refused (training.py): NCCL 2.14.3 has no cuMem and 2.18.1's is not read.
- PyTorch's NCCL (TORCH_NCCL): the torch-2.X.0 wheel on PyPI (cp311, manylinux x86_64) pins nvidia-nccl-cu11/-cu12/
  -cu13 in its METADATA (Requires-Dist, read with `pip install --dry-run --no-deps --report torch==2.X.0`): torch 2.0
  NCCL 2.14.3, 2.1 2.18.1, 2.2 2.19.3, 2.3 and 2.4 2.20.5, 2.5 and 2.6 2.21.5, 2.7 2.26.2, 2.8 2.27.3, 2.9 and 2.10
  2.27.5, 2.11 2.28.9 (the H200 records' `versions.nccl`), 2.12 and 2.13 2.29.7. NCCL only rises with torch, so cuMem
  is on by default from torch 2.2 (NCCL_CUMEM_FROM). Builds from other indexes (download.pytorch.org's cu118 and
  the like) may pin another NCCL: not modelled.
- By release (read at each tag; the first tag where each changes is a NCCL_*_FROM constant):
  * MAXCHANNELS is 32 through 2.24 (include/device.h l. 54 at v2.19.3-1, v2.20.5-1, v2.21.5-1) and 64 from v2.25.1-1
    (l. 62 v2.26.2-1, l. 87 v2.27.3-1 and v2.27.5-1, l. 86 v2.28.9-1). The one-GPU search is the same in each:
    ncclTopoSearchInit gives LOC_BW (graph/search.cc l. 41 v2.19.3-1 and v2.20.5-1, l. 42 v2.21.5-1, l. 43 from
    v2.26.2-1), the ring search fills ringGraph.maxChannels = MAXCHANNELS/2 (init.cc l. 920 v2.19.3-1, 1017
    v2.20.5-1, 1051 v2.21.5-1, 841 v2.26.2-1, 851 v2.27.3-1 and v2.27.5-1, 1019 v2.28.9-1), ncclTopoDupChannels
    stays within it and ncclTopoPostset doubles it (graph/connect.cc l. 396 v2.19.3-1, 442 v2.20.5-1, 443
    v2.21.5-1, 452 from v2.26.2-1): 32 channels through 2.24, 64 from 2.25.1. p2pnChannels is its next power of 2,
    the same (graph/paths.cc ncclTopoComputeP2pChannels, NCCL_MAX_P2P_NCHANNELS = MAXCHANNELS; from v2.26.2-1 also
    at most ncclDevMaxChannelsForArgsBytes(NCCL_WORK_ARGS_BYTES = INT64_MAX) = MAXCHANNELS), so it sets up no more.
  * initChannel: 3 device allocations a channel from v2.18.1-1 (channel.cc l. 40, 43, 54 at v2.19.3-1 and
    v2.20.5-1; l. 41, 44, 55 v2.21.5-1; l. 42, 45, 56 from v2.26.2-1), 2 before.
  * devCommSetup: 1 device allocation, ncclDevCommAndChannels (init.cc l. 415 v2.19.3-1, 401 v2.20.5-1, 402
    v2.21.5-1), 2 from v2.23.4-1 with rankToLocalRank (l. 436, 438 v2.26.2-1; 447, 449 v2.27.3-1 and v2.27.5-1;
    512, 514 v2.28.9-1); its work FIFO is host memory without GDRCopy, collNetDenseToUserRank only with CollNet.
  * Runtime connect from v2.22.3-1 (NCCL_RUNTIME_CONNECT, default 1; runtimeConn = cuMemSupport && it: init.cc
    l. 1135 v2.26.2-1, 1148 v2.27.3-1 and v2.27.5-1, 1269 v2.28.9-1). Before it initialisation connects everything,
    cuMem or not; at one rank the ring and tree loops skip (`if (comm->nRanks == 1) continue`: init.cc l. 1114, 1123
    v2.19.3-1; 1219, 1228 v2.20.5-1; 1260, 1269 v2.21.5-1), NVLS is off (ncclNvlsInit returns at gpuCount <= 2:
    transport/nvls.cc l. 251, 240, 241), NVB preconnect finds no peer, and the local net proxy's shared init runs
    (init.cc l. 1224, 1329, 1370): sharedNetBuffersInit's p2pnChannels x 16 x p2pChunkSize (transport/net.cc l. 492,
    497, 501), with cuMem through ncclP2pAllocateShareableBuffer, ncclCuMemAlloc (net.cc l. 499, 504, 508;
    transport/p2p.cc l. 190 and include/alloc.h l. 81-100 at v2.19.3-1: one cuMemCreate rounded up to the
    granularity), else ncclCudaCalloc (net.cc l. 501, 506, 510).
  * p2pChunkSize at one GPU: P2P_NVL_CHUNKSIZE (512 KiB) where ncclTopoPathAllNVLink holds, else P2P_PCI_CHUNKSIZE
    (128 KiB) (init.cc l. 551-553 v2.19.3-1, 564-566 v2.20.5-1 (MNNVL only above one node, l. 884), 564-566
    v2.21.5-1, 625-627 v2.26.2-1, 637-639 v2.27.x, 716-718 v2.28.9-1). Through 2.24 it takes the least path between
    two GPUs, which one GPU leaves at PATH_DIS: false, 128 KiB (graph/paths.cc l. 757-767 v2.19.3-1, 795-805
    v2.20.5-1 and v2.21.5-1); from v2.25.1-1 the greatest, from PATH_LOC: true, 512 KiB (l. 868-887 v2.26.2-1,
    894-913 v2.27.3-1, 906-925 v2.27.5-1, 925-944 v2.28.9-1).
  So, a communicator of one rank (one_rank_rule):
  * torch 2.2-2.6 (NCCL 2.19.3, 2.20.5, 2.21.5), cuMem on: (1 + 3 x 32) x 2 MiB + the shared buffer 32 x 16 x
    128 KiB = 64 MiB (32 granules) = 258 MiB, 98 allocations (the mechanism measured: NCCL 2.28.9 with
    NCCL_RUNTIME_CONNECT=0 adds its 512 MiB buffer through cuMem to each communicator's 194 granules,
    RUNTIME_CONNECT_RECORD); cuMem off: the 64 MiB buffer by cudaMalloc and 97 small
    allocations in the shared page, as 2.18.1.
  * torch 2.7-2.10 (NCCL 2.26.2, 2.27.3, 2.27.5): 2.28.9's, 388 MiB with cuMem, 512 MiB without.
  * torch 2.12 and 2.13 (NCCL 2.29.7), read in part: the same MAXCHANNELS (device.h l. 88), runtime connect
    (init.cc l. 1362), devCommSetup's 2 (l. 557, 559), initChannel's 3 (channel.cc l. 43, 46, 58), doubling
    (connect.cc l. 453) and one cuMemCreate an allocation (include/alloc.h l. 255-289: its memory manager only
    tracks it): 2.28.9's rule.
- Not modelled: NCCL's kernels (NCCL_KERNELS, 85 granules) are NCCL 2.28.9's as measured, charged for every
  release; the small allocations' requested bytes by release (only their count matters: each is its own granule
  with cuMem, in the shared page without); NCCL 2.22-2.25 (no torch wheel pins them).
- NCCL 2.14.3 and 2.18.1 (torch 2.0 and 2.1: no cuMem) are read, not measured: MAXCHANNELS is 32 (include/
  devcomm.h, v2.14.3-1 l. 50, v2.18.1-1 l. 52), so one rank sets up 2 x 16 = 32 channels (graph/connect.cc
  v2.14.3-1 l. 299, v2.18.1-1 l. 389) and p2pnChannels = 32 (graph/paths.cc nextPow2); the ring, tree and PAT
  connections skip a rank's own (transport.cc l. 48, 53: peer == comm->rank); the net proxy's shared init runs
  unconditionally (v2.14.3-1 init.cc l. 975, v2.18.1-1 l. 1139) with a chunk of 128 KiB (v2.14.3-1 net.cc l. 370
  p2pNetChunkSize; v2.18.1-1 init.cc l. 517-519 P2P_PCI_CHUNKSIZE, since its ncclTopoPathAllNVLink returns 0 for
  one GPU, paths.cc l. 757-767): 32 x 16 x 128 KiB = 64 MiB a communicator, plus its 1 + 2 x 32 (v2.14.3) or
  1 + 3 x 32 (v2.18.1) small allocations in the shared page.

Measured on an H200 (torch 2.11.0+cu130, NCCL 2.28.9, driver 580.159.04; the used bytes less the allocator's
reserved bytes): deepspeed.init_distributed, which makes one communicator, adds 585,105,408 B = 279 x 2 MiB
(tests/data/measured/gpu/experiments/nccl-world-h200.json); NCCL's own ALLOC log of the Megatron step
(tests/data/measured/gpu/megatron, `nccl`) shows 4 communicators of 194 allocations each, every pointer 2 MiB
from the last: 279 - 194 = 85 x 2 MiB are NCCL's kernels (NCCL_KERNELS).
"""

from __future__ import annotations

from dataclasses import dataclass

MiB = 1024**2
KiB = 1024
GRANULARITY = 2 * MiB  # cuMemGetAllocationGranularity(MINIMUM) for device memory; CUDA_IPC_MIN (comm.h)
MAXCHANNELS = 64  # NCCL include/device.h (v2.25.1-1 on; 32 before: OLD_MAXCHANNELS)
DEV_COMM_ALLOCATIONS = (23_648, 4)  # 2.28.9 init.cc devCommSetup: ncclKernelCommAndChannels, rankToLocalRank (nranks 1)
CHANNEL_ALLOCATIONS = (608, 24, 4)  # 2.28.9 channel.cc initChannel, nranks 1: sharedRes devPeers, devPeers, ring ranks
# NCCL's kernels, loaded with a process's first communicator: 279 - 194 granules (module docstring)
NCCL_KERNELS = 585_105_408 - 194 * GRANULARITY
RECORD = "tests/data/measured/gpu/experiments/nccl-world-h200.json"
MECHANISM_RECORD = "tests/data/measured/gpu/experiments/nccl-mechanism-h200.json"
# NCCL 2.28.9 with cuMem and NCCL_RUNTIME_CONNECT=0: each communicator's shared buffer through cuMem at initialisation,
# 194 + 256 granules (the mechanism of NCCL 2.19-2.21 at one rank, at 2.28.9's channels and chunk)
RUNTIME_CONNECT_RECORD = "tests/data/measured/gpu/experiments/nccl-runtime-connect-h200.json"
NCCL_SHARED_STEPS = 16  # transport/net.cc (v2.14.3-1 l. 351, v2.28.9-1 l. 628)
P2P_NVL_CHUNK = 512 * KiB  # init.cc P2P_NVL_CHUNKSIZE: NCCL 2.28.9's chunk at one GPU (isAllNvlink)
OLD_MAXCHANNELS = 32  # include/devcomm.h v2.14.3-1 l. 50, v2.18.1-1 l. 52; include/device.h v2.19.3-1..v2.21.5-1 l. 54
OLD_P2P_CHUNK = 128 * KiB  # P2P_NET_CHUNKSIZE (v2.14.3-1 net.cc l. 370) / P2P_PCI_CHUNKSIZE (v2.18.1-1 init.cc l. 519)
SMALL_PAGE = GRANULARITY  # the driver's shared page of a process's small cudaMallocs (measured: module docstring)
SOURCE = ("NCCL v2.28.9-1 init.cc devCommSetup, channel.cc initChannel, include/alloc.h ncclCuMemAlloc, "
          "graph/search.cc + connect.cc (64 channels at one rank), misc/cudawrap.cc NCCL_CUMEM_ENABLE (default on "
          "from v2.19.1-1), init.cc + transport/net.cc (the net proxy's shared buffer without runtime connect); each "
          "torch release's NCCL from its PyPI wheel's nvidia-nccl pin, read at v2.14.3-1, v2.18.1-1, v2.19.3-1, "
          "v2.20.5-1, v2.21.5-1, v2.26.2-1, v2.27.3-1, v2.27.5-1 (estimator/spec/nccl.py TORCH_NCCL)")

# The NCCL release each PyTorch release's CUDA wheels on PyPI pin: the wheel's METADATA Requires-Dist
# nvidia-nccl-cu11 / -cu12 / -cu13 == X (torch-2.X.0-cp311 manylinux x86_64, read with `pip install --dry-run --no-deps
# --report torch==2.X.0`). Other indexes' builds (download.pytorch.org cu118 and the like) may pin another NCCL.
TORCH_NCCL: dict[tuple[int, int], tuple[int, int, int]] = {
    (2, 0): (2, 14, 3), (2, 1): (2, 18, 1), (2, 2): (2, 19, 3), (2, 3): (2, 20, 5), (2, 4): (2, 20, 5),
    (2, 5): (2, 21, 5), (2, 6): (2, 21, 5), (2, 7): (2, 26, 2), (2, 8): (2, 27, 3), (2, 9): (2, 27, 5),
    (2, 10): (2, 27, 5), (2, 11): (2, 28, 9), (2, 12): (2, 29, 7), (2, 13): (2, 29, 7)}
# Where NCCL's one-rank allocations change (the first tag with each; module docstring, "By release")
NCCL_THREE_ALLOCATIONS_A_CHANNEL_FROM = (2, 18, 1)  # channel.cc initChannel + sharedRes->devPeers (v2.14.3-1 l. 23, 27;
#   v2.18.1-1 l. 40-52)
NCCL_CUMEM_FROM = (2, 19, 1)  # misc/cudawrap.cc NCCL_PARAM(CuMemEnable, "CUMEM_ENABLE", -2)
NCCL_RUNTIME_CONNECT_FROM = (2, 22, 3)  # init.cc NCCL_PARAM(RuntimeConnect, "RUNTIME_CONNECT", 1)
NCCL_RANK_TO_LOCAL_RANK_FROM = (2, 23, 4)  # init.cc devCommSetup: + rankToLocalRank
NCCL_64_CHANNELS_FROM = (2, 25, 1)  # MAXCHANNELS 64; ncclTopoPathAllNVLink true at one GPU (P2P_NVL_CHUNKSIZE)


@dataclass(frozen=True)
class OneRankCommunicator:
    """The device memory of one communicator of one rank, as one NCCL release allocates it."""

    allocations: int
    bytes: int
    formula: str


def nccl_release(torch_release: tuple[int, int]) -> tuple[int, int, int]:
    """The NCCL release this PyTorch release's CUDA wheels pin (TORCH_NCCL); a release past the table's last (or
    before its first) takes that one's."""
    known = [t for t in TORCH_NCCL if t <= torch_release]
    return TORCH_NCCL[max(known) if known else min(TORCH_NCCL)]


def cumem(torch_release: tuple[int, int]) -> bool:
    """Whether the NCCL that this PyTorch release ships allocates with cuMem by default (NCCL_CUMEM_FROM: torch 2.2)."""
    return nccl_release(torch_release) >= NCCL_CUMEM_FROM


def uses_cumem(torch_release: tuple[int, int], setting: bool | None, engine: str | None = None) -> bool:
    """Whether the run's NCCL allocates with cuMem: training.nccl_cumem where it is set (NCCL_CUMEM_ENABLE in the
    training processes); else off beside an SGLang rollout engine (`engine`, training.rl.engine): SGLang sets
    NCCL_CUMEM_ENABLE=0 in its processes unless --enable-symm-mem (entrypoints/engine.py _set_envs_and_config,
    serving/sglang_dist_init.py), and the trainers that sync weights to it over NCCL set the same (slime
    actor_group.py l. 65-67: "because sglang will always set NCCL_CUMEM_ENABLE to 0 we need also set it to 0 to
    prevent nccl error"; verl v0.7.0 workers/rollout/sglang_rollout/sglang_rollout.py l. 46-50, 81 patches
    SGLang's _set_envs_and_config to set it to 0 always); else the default of this PyTorch release's NCCL."""
    if setting is not None:
        return setting
    return False if engine == "sglang" else cumem(torch_release)


# The RL stacks whose training processes run NCCL without cuMem, and where their source says so. Not OpenRLHF
# v0.11.0 (3c3be623): its policy actor sets NCCL_CUMEM_ENABLE=0 before DeepSpeed's init only under vLLM < 0.16
# (openrlhf/trainer/ray/ppo_actor.py l. 501-508; from v0.5.5 to 39c78469 whenever the weights sync over NCCL), and
# its vllm extra pins 0.27.1 (setup.py l. 77); nor the engines' own processes (SGLang sets it to 0 in its server,
# entrypoints/engine.py _set_envs_and_config, which serving/sglang_dist_init.py models):
RL_STACKS_CUMEM_OFF = {
    "slime": "slime 624b824a slime/ray/actor_group.py l. 64, 67, 70 (_allocate_gpus_for_actor: the actors' env_vars "
             "NCCL_CUMEM_ENABLE = the driver's, else \"0\", then --train-env-vars; \"0\" since 0a0e08e1, 2025-06-23)",
    "verl": "verl v0.7.0 (f9c855f7) verl/trainer/constants_ppo.py l. 20, 33 (PPO_RAY_RUNTIME_ENV: "
            "NCCL_CUMEM_ENABLE \"0\" in ray.init's runtime_env, unless the driver's environment sets it "
            "(get_ppo_ray_runtime_env l. 52) or ray_kwargs.ray_init.runtime_env does (main_ppo.py run_ppo "
            "l. 64-75); from v0.6.0, b86cd96e)",
}


def shared_p2p_buffer(channels: int, chunk: int) -> int:
    """The local net proxy's shared buffer that initialisation allocates without runtime connect (module docstring):
    p2pnChannels x NCCL_SHARED_STEPS x p2pChunkSize (transport/net.cc sharedNetBuffersInit)."""
    return channels * NCCL_SHARED_STEPS * chunk


@dataclass(frozen=True)
class OneRankRule:
    """What one NCCL release's initialisation allocates on the device for a communicator of one rank (the module
    docstring, "By release")."""

    nccl: tuple[int, int, int]
    channels: int  # 2 x ringGraph->maxChannels (MAXCHANNELS/2): ncclTopoPostset's doubling; p2pnChannels the same
    per_channel: int  # initChannel's device allocations
    dev_comm: int  # devCommSetup's
    runtime_connect: bool  # with cuMem nothing is connected at initialisation (NCCL_RUNTIME_CONNECT)
    chunk: int  # p2pChunkSize at one GPU

    @property
    def small(self) -> int:
        """The small device allocations: devCommSetup's and initChannel's."""
        return self.dev_comm + self.per_channel * self.channels

    @property
    def shared_buffer(self) -> int:
        """The net proxy's shared buffer, what initialisation connects at one rank without runtime connect."""
        return shared_p2p_buffer(self.channels, self.chunk)


def one_rank_rule(nccl: tuple[int, int, int]) -> OneRankRule:
    """The rule of one NCCL release, from the tags where it changes (NCCL_*_FROM, module docstring)."""
    wide = nccl >= NCCL_64_CHANNELS_FROM
    return OneRankRule(nccl, MAXCHANNELS if wide else OLD_MAXCHANNELS,
                       3 if nccl >= NCCL_THREE_ALLOCATIONS_A_CHANNEL_FROM else 2,
                       2 if nccl >= NCCL_RANK_TO_LOCAL_RANK_FROM else 1, nccl >= NCCL_RUNTIME_CONNECT_FROM,
                       P2P_NVL_CHUNK if wide else OLD_P2P_CHUNK)


def one_rank_communicator(torch_release: tuple[int, int], cumem_setting: bool | None = None) -> OneRankCommunicator:
    """One communicator of one rank (the module docstring), for the NCCL of this PyTorch release (TORCH_NCCL), with
    cuMem as `cumem_setting` says (uses_cumem). Without cuMem the small allocations go in the process's shared page
    (SMALL_PAGE, charged once by the caller)."""
    rule = one_rank_rule(nccl_release(torch_release))
    small, channels = rule.small, rule.channels
    counted = f"({rule.dev_comm} + {rule.per_channel} x {channels} channels) allocations x 2 MiB"
    buffer = (f"net proxy's shared buffer {channels} channels x {NCCL_SHARED_STEPS} steps x {rule.chunk // KiB} KiB"
              f" = {rule.shared_buffer / MiB:.0f} MiB")
    if uses_cumem(torch_release, cumem_setting):
        if rule.runtime_connect:  # nothing connected at initialisation (init.cc runtimeConn)
            total = small * GRANULARITY
            return OneRankCommunicator(small, total, f"{counted} (cuMem) = {total / MiB:.0f} MiB")
        # no runtime connect: the shared buffer at initialisation, cuMem too (ncclP2pAllocateShareableBuffer)
        shared = -(-rule.shared_buffer // GRANULARITY) * GRANULARITY
        total = small * GRANULARITY + shared
        version = ".".join(map(str, rule.nccl))
        return OneRankCommunicator(small + 1, total, (
            f"{counted} = {small * GRANULARITY / MiB:.0f} MiB + {buffer} (cuMem; NCCL {version} has no runtime "
            f"connect: connected at initialisation) = {total / MiB:.0f} MiB"))
    why = "NCCL_CUMEM_ENABLE=0" if cumem(torch_release) else "NCCL before 2.19: no cuMem"
    return OneRankCommunicator(small + 1, rule.shared_buffer, f"{buffer} (cudaMalloc, {why}); its {small} small "
                                                              f"allocations in the shared page")


def measured_without_cumem(torch_release: tuple[int, int]) -> bool:
    """Whether this PyTorch release's NCCL with cuMem off is the rule the nccl-mechanism record measured (NCCL 2.28.9,
    NCCL_CUMEM_ENABLE=0: 536,870,912 B a communicator): 64 channels of 512 KiB, from NCCL 2.25.1."""
    return cumem(torch_release) and nccl_release(torch_release) >= NCCL_64_CHANNELS_FROM
