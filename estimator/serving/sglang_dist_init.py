"""What SGLang's distributed initialisation holds on each GPU before it reads the pre-load memory (modelled).

SGLang reads ``pre_model_load_memory`` after it has built its process groups (0.4.9 and 0.5.5
model_runner.py init_torch_distributed: get_available_gpu_memory after init_distributed_environment,
initialize_model_parallel and initialize_dp_attention; 0.5.23 distributed/bootstrap.py
measure_pre_model_load_memory, after init_parallel_runtime), and its pools get pre x mem_fraction_static
- weights, so whatever those groups allocate lowers the pools by that x mem_fraction_static.

What the groups allocate with the default flags (read in 0.4.9, 0.5.5 and 0.5.23):
- the WORLD group: no pynccl and no custom all-reduce (parallel_state.py init_world_group); torch creates
  its NCCL group without a device_id, so no communicator exists until a collective runs on it, and none
  does before the reading (0.5.23 bootstrap.py _prewarm_nccl: --pre-warm-nccl is on for AMD only);
- the TP group and, under PP, the PP group (init_model_parallel_group, use_pynccl on CUDA): a
  PyNcclCommunicator each, whose constructor runs a one-element all_reduce (pynccl.py "A small all_reduce
  for warmup"), so one NCCL communicator with its ring connected (serving/nccl_comm.py). SGLang sets
  NCCL_CUMEM_ENABLE=0 and NCCL_NVLS_ENABLE=0 unless --enable-symm-mem / --enable-nccl-nvls
  (entrypoints/engine.py _set_envs_and_config; 0.4.9 sets both unconditionally): no NVLS buffers, and
  cudaMalloc instead of cuMem, so NCCL's small device structures (the device comm, each channel's peer
  tables: KiB each) are no longer a 2 MiB granule each and are left out; the ring's connection buffers keep
  their CUDA_IPC_MIN alignment (transport/p2p.cc ALIGN_SIZE): 24 channels x (10 MiB + 2 MiB);
- the custom all-reduce of the TP group (TP 2, 4, 6 or 8 on full NVLink; PP's group has none):
  * up to 0.5.5 (custom_all_reduce.py CustomAllreduce, _MAX_CAR_SIZE 8 MiB; read in 0.4.9 and 0.5.5): a
    cudaMalloc of meta_size() + 8 MiB and one of 8 MiB (create_shared_buffer, 2 MiB pages: 10 + 8 MiB), and
    rank_data, torch.empty(8 MiB), which torch's caching allocator serves from a 20 MiB segment (kLargeBuffer
    for requests between 1 and 10 MiB);
  * 0.5.23 (custom_all_reduce_v2.py CustomAllReduceV2, on by default: SGLANG_OPT_USE_CUSTOM_ALL_REDUCE_V2):
    one torch symmetric-memory slab of 2 x TP push slots + the pull buffer + 64 x 128 B semaphores
    (_init_workspace), push and pull clipped to SGLANG_CUSTOM_ALL_REDUCE_V2_MAX_SIZE_KB (16 MiB) from the
    SM90 table (configs/custom_all_reduce_v2.py _sm90_configs: the larger one-shot push threshold of its
    graph and eager rows; every SM90 row's two-shot pull is at least 16 MiB), plus torch's 9,216 B signal
    pad (c10d CUDASymmetricMemoryTypes.hpp default_signal_pad_size), rounded to 2 MiB; graph_params,
    131,072 x TP x 8 B from a 20 MiB segment; the push counter (a 4 B word an SM) from a 2 MiB small-pool
    segment. Where multicast binds the slab (TP >= 4) a coarser multicast granularity is not modelled.
  The release that switched to v2 lies between 0.5.5 and 0.5.23 and was not read: 0.5.6 on takes 0.5.23's.
- the attention-TP group: no pynccl unless SYNC_TOKEN_IDS_ACROSS_TP (layers/dp_attention.py); the MoE groups
  are the TP group when EP is 1 or TP (parallel_state.py initialize_model_parallel, 0.5.5 and 0.5.23).

NCCL: each release's torch pin (sglang METADATA: 0.4.9 torch 2.7.1, 0.5.5 torch 2.8.0, 0.5.23 torch
2.14.1) brings its own NCCL (torch 2.7.1 installs nvidia-nccl-cu12 2.26.2 and 2.8.0 2.27.3, as public
environment listings show; 2.14.1's not read). The ring's channel count and buffer sizes are nccl_comm.py's
reading of NCCL 2.27.5 / 2.28.9 on H100 / H200 SXM, not re-read for 2.26.2; the CUDA_IPC_MIN alignment of a
connection's buffers (p2p.cc p2pSendSetup / p2pRecvSetup) holds with cuMem off as on.

Published start-up logs print this term ("Init torch distributed ends. mem usage", up to 0.5.5): 0.22-0.27
GB a rank at TP 16 over two H100 nodes with the custom all-reduce off (sglang PR #3888, 0.4.3 line), but
1.77-2.01 GB a rank at TP 8 on H200 (sglang PR #11716, 0.5.3 line, a development branch) — six times what
these allocations come to; what else ran there is not in the source read. 0.5.23 prints "Memory baseline
taken. mem usage" across the reading alone, which is not this term.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..memory.allocator import allocation_size
from ..memory.components import Component, component
from .nccl_comm import NVSWITCH_SM90, RING_CHANNELS, ring_connection_bytes

MiB = 1024**2
KiB = 1024
GRANULE = 2 * MiB  # cudaMalloc's and cuMem's 2 MiB pages on Hopper
CUSTOM_AR_SIZES = (2, 4, 6, 8)  # CustomAllreduce._SUPPORTED_WORLD_SIZES
LEGACY_MAX = 8 * MiB  # CustomAllreduce._MAX_CAR_SIZE
V2_FROM = (0, 5, 6)  # first release taken to build CustomAllReduceV2 (0.5.5 read without it, 0.5.23 with it)
V2_MAX = 16 * MiB  # SGLANG_CUSTOM_ALL_REDUCE_V2_MAX_SIZE_KB = 16 x 1024
# _sm90_configs: max(graph, eager) one-shot push threshold per world size (two-shot push off on SM90)
V2_SM90_PUSH = {2: 32 * MiB, 3: 3 * MiB, 4: 896 * KiB, 5: 384 * KiB, 6: 192 * KiB, 7: 128 * KiB, 8: 128 * KiB}
V2_PULL_BLOCKS, V2_SEMAPHORE = 64, 128
V2_GRAPH_INPUTS = 131_072  # _MAX_GRAPH_INPUTS
SIGNAL_PAD = 32 * 72 * 4  # torch symmetric memory: symm_max_nblocks x max_cuda_p2p_domain_size x 4 B
SOURCE = ("SGLang 0.4.9 / 0.5.5 model_runner.py init_torch_distributed, 0.5.23 distributed/bootstrap.py "
          "measure_pre_model_load_memory; parallel_state.py GroupCoordinator, pynccl.py, custom_all_reduce.py, "
          "0.5.23 custom_all_reduce_v2.py; entrypoints/engine.py _set_envs_and_config (estimator/serving/"
          "sglang_dist_init.py)")


@dataclass(frozen=True)
class DistInit:
    bytes: int
    component: Component | None
    note: str | None  # what is not modelled, said rather than dropped


def _round(value: int) -> int:
    """Up to whole 2 MiB pages (cudaMalloc, cuMem)."""
    return -(-value // GRANULE) * GRANULE


def _nccl_ring() -> tuple[int, str]:
    ring = RING_CHANNELS * ring_connection_bytes()
    return ring, f"{RING_CHANNELS} ring channels x (10 MiB receive + 2 MiB send) = {ring / MiB:.0f} MiB"


def _legacy_custom_ar() -> tuple[int, str]:
    meta = _round(LEGACY_MAX + 1)  # meta_size() (the Signal flags, KiB) + 8 MiB, in 2 MiB pages
    total = meta + LEGACY_MAX + allocation_size(LEGACY_MAX)  # rank_data: torch.empty(8 MiB), a 20 MiB segment
    return total, (f"custom all-reduce: meta + buffer {meta // MiB} + {LEGACY_MAX // MiB} MiB + rank_data 8 MiB "
                   f"in a 20 MiB segment = {total / MiB:.0f} MiB")


def _v2_custom_ar(tp: int, num_sm: int) -> tuple[int, str]:
    push = min(V2_SM90_PUSH[tp], V2_MAX)
    slab = 2 * tp * push + V2_MAX + V2_PULL_BLOCKS * V2_SEMAPHORE
    held = _round(slab + SIGNAL_PAD)
    graph_params = allocation_size(V2_GRAPH_INPUTS * tp * 8)  # 1-10 MiB: a 20 MiB segment
    counter = allocation_size(num_sm * 4)  # a small-pool segment
    total = held + graph_params + counter
    return total, (f"custom all-reduce v2: symmetric slab 2 x {tp} x {push / KiB:,.0f} KiB push + 16 MiB pull + "
                   f"8 KiB semaphores + 9 KiB signal pad -> {held / MiB:.0f} MiB, graph_params "
                   f"{V2_GRAPH_INPUTS:,} x {tp} x 8 B in a 20 MiB segment, push counter 2 MiB = {total / MiB:.0f} MiB")


def held_before_load(release: tuple[int, int, int], tp: int, pp: int, ep: int, gpu_id: str,
                     num_sm: int = 132) -> DistInit:
    """One rank's device memory from SGLang's process groups before its pre-load reading, for this release and
    layout; on GPUs whose NCCL channel count was not derived (other than H100 / H200 SXM) nothing, with a note."""
    if tp * pp == 1:
        return DistInit(0, None, None)
    if gpu_id not in NVSWITCH_SM90:
        return DistInit(0, None, f"SGLang: what its process groups hold before the pre-load reading (NCCL "
                                  f"communicators, custom all-reduce) is not modelled on {gpu_id}; only on H100 / "
                                  "H200 SXM (serving/sglang_dist_init.py).")
    ring, ring_text = _nccl_ring()
    groups = [n for n, size in (("TP", tp), ("PP", pp)) if size > 1]
    total, parts = ring * len(groups), [f"{g} group's NCCL communicator: {ring_text}" for g in groups]
    v2 = release >= V2_FROM
    if tp in (V2_SM90_PUSH if v2 else CUSTOM_AR_SIZES):
        ar, ar_text = _v2_custom_ar(tp, num_sm) if v2 else _legacy_custom_ar()
        total, parts = total + ar, parts + [ar_text]
    note = None
    if 1 < ep < tp:
        note = (f"SGLang: EP {ep} under TP {tp} builds MoE process groups of their own, whose communicators are "
                "not modelled in the memory held before the pre-load reading.")
    formula = (" + ".join(parts) + " (NCCL_CUMEM_ENABLE=0, NCCL_NVLS_ENABLE=0)")
    return DistInit(total, component("dist_init", "Process groups (outside the static share)", total,
                                     formula + " (modelled)", SOURCE), note)
