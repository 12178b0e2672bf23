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
    "Megatron-Core tensor_parallel/layers.py LinearWithGradAccumulationAndAsyncCommunication: the input gradient's "
    "all-reduce / reduce-scatter runs while the weight gradient is computed",
    "TP comm overlap: Wang et al. 2023, Overlap Communication with Dependent Computation via Decomposition (ASPLOS); "
    "TransformerEngine userbuffers (Megatron --tp-comm-overlap); torch/_inductor/fx_passes/micro_pipeline_tp.py "
    "(torchtitan async TP: the forward's all-gather+matmul and matmul+reduce-scatter patterns)",
)
RING_NICS = ("NCCL ring algorithm: a ring leaves each node through the NIC of the GPU where it leaves, r ranks in a "
             "node drive r NICs (NVIDIA/nccl issue #1168: busbw ~45 GB/s with 4 GPUs per node, ~90 with 8)")
ALL_TO_ALL = ("MoE all-to-all across nodes: NVLink and NIC at once (DeepEP README: ~155 GB/s NVLink, 43-58 GB/s RDMA "
              "on H800); DeepSeek-V3 report (arXiv 2412.19437) section 3.2.2: a token once per target node over IB, "
              "then NVLink")

# Fraction of the one-way line rate a ring reaches as busbw: 370 / 450 on NVLink 4 (issue #212).
NVLINK_RING = 370 / 450
# NVLink SHARP (NVLS) all-reduce inside an NVSwitch node: ~480 GB/s busbw on H100 (issues #212, #290).
NVLS_ALL_REDUCE = 480 / 450
# InfiniBand/RoCE NIC: 47 of 50 GB/s (the middle of issue #290's 46-48).
NETWORK = 47 / 50
# Seconds per collective call on top of its bandwidth time (nccl-tests small sizes; see above).
LATENCY_S = {"intra-node": 10e-6, "inter-node": 30e-6}
# GPUs on NVSwitch baseboards that run NVLS (Hopper and later, NCCL >= 2.17): the HGX H100 boards of Meta's
# Grand Teton too, and GB200 NVL72's NVLink Switch trays. Not the H800: its users find NCCL building no NVLS
# channels on it (NVIDIA/nccl issue #892, "0 nvls channels").
NVLS_GPUS = ("h100-80", "h100-96-500w", "h200", "b200", "gb200", "b300")


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


def ranks_per_node(gpu: GPU, size: int, stride: int) -> int:
    """Ranks of a group of `size` ranks `stride` apart that share a node."""
    return max(1, min(size, gpu.gpus_per_node // max(1, stride)))


def ring_line_rate(gpu: GPU, link: str, size: int, stride: int) -> float:
    """One-way line rate per GPU of a ring collective (all-reduce, all-gather, reduce-scatter). Across
    nodes NCCL runs one ring per channel and each ring leaves a node once, through the NIC of the GPU
    where it leaves: a group with r ranks in each node crosses nodes through r NICs at once, so its
    busbw is r x one NIC's, up to the NVLink ring it also runs through (NCCL's ring algorithm; Patarasuk
    & Yuan 2009; NVIDIA/nccl issue #1168: all-reduce busbw about 45 GB/s with 4 GPUs per node and 90
    GB/s with 8 on the same 4 nodes). Every GPU has its own NIC (inter_node_bandwidth), and the groups
    that run at once (one per TP rank) each use their own ranks' NICs."""
    if link != "inter-node":
        return gpu.intra_node_bandwidth
    return min(gpu.inter_node_bandwidth * ranks_per_node(gpu, size, stride), gpu.intra_node_bandwidth)


def bus_bandwidth(gpu: GPU, link: str, all_reduce: bool = False, ring_size: int = 0, stride: int = 1) -> float:
    """The busbw nccl-tests measures on this link for large messages, bytes/s. Across nodes a ring
    collective of `ring_size` ranks goes through the NICs of its ranks in each node (`ring_line_rate`);
    point-to-point traffic (ring_size 0) through one NIC."""
    if link == "inter-node":
        nics = ranks_per_node(gpu, ring_size, stride) if ring_size else 1
        return min(gpu.inter_node_bandwidth * NETWORK * nics, gpu.intra_node_bandwidth * NVLINK_RING)
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


def _rates(gpu: GPU, roof: bool) -> tuple[float, float, float]:
    """(NVLink rate, NIC rate, latency per call) of point-to-point traffic: line rates at the roof,
    nccl-tests' bus bandwidths and latency as expected."""
    if roof:
        return gpu.intra_node_bandwidth, gpu.inter_node_bandwidth, 0.0
    return bus_bandwidth(gpu, "intra-node"), bus_bandwidth(gpu, "inter-node"), LATENCY_S["inter-node"]


def split_all_to_all(gpu: GPU, size: int, stride: int, sent_bytes: float, calls: float,
                     roof: bool) -> tuple[float, float]:
    """(seconds, bytes that leave the GPU) of all-to-alls over a group wider than a node. A balanced
    all-to-all sends 1/size of `sent_bytes` to each rank: the r - 1 peers in the node over NVLink, the
    size - r others through the GPU's NIC, both at once (NCCL's all-to-all is point-to-point sends and
    receives; DeepEP's README measures the two links apart on H800: about 155 GB/s over NVLink,
    43-58 GB/s over 400 Gb/s RDMA); the slower sets the time. r = the group's ranks in a node."""
    r = ranks_per_node(gpu, size, stride)
    nvlink_bytes, nic_bytes = sent_bytes * (r - 1) / size, sent_bytes * (size - r) / size
    nvlink, nic, latency = _rates(gpu, roof)
    return max(nvlink_bytes / nvlink, nic_bytes / nic) + calls * latency, nvlink_bytes + nic_bytes


def remote_nodes_per_token(nodes: int, k: int) -> float:
    """Other nodes a token's k experts are on, on average, with the experts spread evenly over `nodes`
    nodes and a balanced router: (nodes - 1)(1 - (1 - 1/nodes)^k)."""
    return (nodes - 1) * (1 - (1 - 1 / nodes) ** k)


def node_deduplicated_all_to_all(gpu: GPU, size: int, stride: int, copy_bytes: float, k: int, tokens: float,
                                 calls: float, roof: bool) -> tuple[float, float, float]:
    """(seconds, bytes through the NIC, bytes over NVLink) of a dispatch and combine that sends each
    token once to every other node its experts are on and forwards it there over NVLink (DeepSeek-V3
    technical report, arXiv 2412.19437 section 3.2.2: tokens go 'via IB to the GPUs with the same
    in-node index on its target nodes' and are then 'forwarded via NVLink'; DeepEP's internode kernels
    and Megatron-Core's HybridEP do the same). Per token: `remote_nodes_per_token` copies through the
    NIC; over NVLink the copies for its own node's other GPUs and, on the receiving side, the arrived
    copies for the GPUs other than the receiver."""
    r = ranks_per_node(gpu, size, stride)
    nodes = max(1, size // r)
    nic_bytes = tokens * remote_nodes_per_token(nodes, k) * copy_bytes
    forwarded = k * (size - r) / size * (r - 1) / r
    nvlink_bytes = tokens * (k * (r - 1) / size + forwarded) * copy_bytes
    nvlink, nic, latency = _rates(gpu, roof)
    return max(nic_bytes / nic, nvlink_bytes / nvlink) + calls * latency, nic_bytes, nvlink_bytes

