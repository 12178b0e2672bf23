"""Collectives as NCCL runs them: the bus bandwidth nccl-tests measures on each kind of link, a
latency per call, the ring factors, and what each framework overlaps with compute.

nccl-tests reports `busbw` = algbw x (the ring factor): 2(n-1)/n for an all-reduce, (n-1)/n for an
all-gather or a reduce-scatter (nccl-tests doc/PERFORMANCE.md). So a collective on a buffer of S
bytes takes S x factor / busbw, and busbw is what a link sustains, whatever n is. Measured:

- NVLink/NVSwitch (H100): 450 GB/s line rate one way; "with the protocol overhead (~20%) NCCL can
  get an effective NVLink bandwidth of 370GB/s" for rings and non-all-reduce collectives; NVLink
  SHARP all-reduce on 8 GPUs "a peak busBw of ~480GB/s" (NVIDIA's S. Jeaugey, NVIDIA/nccl-tests
  issue #212), "476GB/s looks to be in the expected range for H100" (issue #290).
- InfiniBand NDR 400 Gb/s (50 GB/s line): "you should see 46-48GB/s per NIC" (NVIDIA's
  D. Addison, NVIDIA/nccl-tests issue #290).
- Small messages do not reach it: each call costs a latency (nccl-tests' smallest sizes take tens
  of microseconds: 8 KB all-reduce between two nodes ~30-35 us, NVIDIA/dgx-spark-playbooks PR
  #103), added to the bandwidth time.
"""

from __future__ import annotations

from ..spec.gpus import GPU

NCCL_TESTS = ("NVIDIA/nccl-tests issues #212 and #290 (busbw on H100 NVLink/NVSwitch: ~370 GB/s ring, ~480 GB/s "
              "NVLS all-reduce; NDR 400 Gb/s: 46-48 GB/s per NIC); nccl-tests doc/PERFORMANCE.md (busbw factors)")
OVERLAP_SOURCES = (
    "PyTorch FSDP2 fully_shard: implicit forward prefetch and explicit backward prefetch of one unit; the root "
    "unit gathered at the start of forward (torch/distributed/fsdp/_fully_shard)",
    "Megatron-Core distributed optimizer: --overlap-grad-reduce reduce-scatters gradient buckets during the "
    "backward of the last micro-batch, --overlap-param-gather all-gathers parameter buckets during the next "
    "forward (docs/source/api-guide/dist_optimizer.md); bucket of max(40M, 1M x DP) parameters",
    "DeepSpeed ZeRO-1/2: the updated partitions are all-gathered after the optimizer step, not overlapped "
    "(deepspeed/runtime/zero/stage_1_and_2.py, step -> all_gather_dp_groups)",
)

# Fraction of the one-way line rate a ring reaches as busbw: 370 / 450 on NVLink 4 (issue #212).
NVLINK_RING = 370 / 450
# NVLink SHARP (NVLS) all-reduce inside an NVSwitch node: ~480 GB/s busbw on H100 (issues #212, #290).
NVLS_ALL_REDUCE = 480 / 450
# InfiniBand/RoCE NIC: 47 of 50 GB/s (the middle of issue #290's 46-48).
NETWORK = 47 / 50
# Seconds per collective call on top of its bandwidth time (nccl-tests small sizes; see above).
LATENCY_S = {"intra-node": 10e-6, "inter-node": 30e-6}
# GPUs on NVSwitch baseboards that run NVLS (Hopper and later, NCCL >= 2.17). Not the H800: its
# users find NCCL building no NVLS channels on it (NVIDIA/nccl issue #892, "0 nvls channels").
NVLS_GPUS = ("h100-80", "h200", "b200", "b300")


def ring_factor(n: int, all_reduce: bool = False) -> float:
    """Share of a buffer each GPU sends in a ring collective: (n-1)/n for an all-gather or a
    reduce-scatter, 2(n-1)/n for an all-reduce."""
    return (2 if all_reduce else 1) * (n - 1) / n


def link_of(gpu: GPU, size: int, stride: int) -> tuple[str, float]:
    """(link, one-way line rate per GPU). A group of `size` ranks `stride` apart stays in one node
    when size*stride <= gpus_per_node (ranks are laid out TP innermost, then CP, then DP, PP
    outermost, as Megatron-Core orders them; the expert grid is expert-TP, EP, expert-DP)."""
    if size * stride <= gpu.gpus_per_node:
        return "intra-node", gpu.intra_node_bandwidth
    return "inter-node", gpu.inter_node_bandwidth


def bus_bandwidth(gpu: GPU, link: str, all_reduce: bool = False) -> float:
    """The busbw nccl-tests measures on this link for large messages, bytes/s."""
    if link == "inter-node":
        return gpu.inter_node_bandwidth * NETWORK
    if all_reduce and gpu.id in NVLS_GPUS:
        return gpu.intra_node_bandwidth * NVLS_ALL_REDUCE
    return gpu.intra_node_bandwidth * NVLINK_RING


def collective_time(gpu: GPU, link: str, wire_bytes: float, calls: float, all_reduce: bool = False) -> float:
    """Expected seconds of `calls` collectives that together put `wire_bytes` on each GPU's link
    (ring factors already applied): bandwidth time at busbw plus one latency per call."""
    return wire_bytes / bus_bandwidth(gpu, link, all_reduce) + calls * LATENCY_S[link]


def pipelined_exposure(comm_per_unit: float, compute_per_unit: float, units: int, first: float = 0.0) -> float:
    """Exposed seconds of a pass that prefetches one unit ahead (FSDP2, ZeRO-3): the first unit's
    transfer (`first`, or one unit's) waits in full, then each unit's transfer runs under the
    previous unit's compute and shows only where it is longer."""
    if units <= 0 or comm_per_unit <= 0:
        return first
    return (first or comm_per_unit) + max(0.0, comm_per_unit - compute_per_unit) * (units - 1)


def bucketed_exposure(comm: float, compute: float, buckets: float) -> float:
    """Exposed seconds of bucketed traffic overlapped with one pass of compute (DDP and Megatron
    gradient buckets, Megatron's parameter all-gather): the last (or first) bucket cannot overlap,
    and whatever exceeds the compute shows."""
    if comm <= 0:
        return 0.0
    last = comm / max(1.0, buckets)
    return max(last, comm - compute)
