"""DeepEP's fixed communication buffers, as Megatron-Core's flex dispatcher sizes them.

With ``--moe-token-dispatcher-type flex --moe-enable-deepep`` every MoE layer dispatches and
combines tokens through one process-wide ``deep_ep.Buffer``. Megatron-Core creates it on the first
dispatch (NVIDIA/Megatron-LM ``megatron/core/transformer/moe/fused_a2a.py`` @ 02ad939b,
``get_buffer(group, hidden_bytes)``)::

    num_nvl_bytes, num_rdma_bytes = 0, 0
    for config in (Buffer.get_dispatch_config(group.size()), Buffer.get_combine_config(group.size())):
        num_nvl_bytes = max(config.get_nvl_buffer_size_hint(hidden_bytes, group.size()), num_nvl_bytes)
        num_rdma_bytes = max(config.get_rdma_buffer_size_hint(hidden_bytes, group.size()), num_rdma_bytes)
    _buffer = Buffer(group, num_nvl_bytes, num_rdma_bytes)

with ``hidden_bytes = x.size(1) * max(x.element_size(), 2)`` (``get_hidden_bytes``) and the group
the dispatcher's expert-TP x EP group (``MoEFlexTokenDispatcher``: ``_DeepepManager(group=
self.tp_ep_group, ...)``, ``token_dispatcher.py`` @ 0014f137).

The buffer lives outside PyTorch's caching allocator: ``deep_ep::Buffer::Buffer`` cudaMallocs the
NVLink buffer plus its metadata and a 32 MiB workspace, and ``Buffer::sync`` places the RDMA
buffer in the NVSHMEM symmetric heap (deepseek-ai/DeepEP ``csrc/deep_ep.cpp`` @ 011d766f).

Everything below reproduces deepseek-ai/DeepEP: the per-rank-count configs of
``deep_ep/buffer.py`` @ dcfd9548 and the size hints of ``csrc/config.hpp`` @ 3861241a, with the
constants of ``csrc/kernels/configs.cuh`` @ 10e8a3b4 and ``sizeof(SourceMeta)`` of
``csrc/kernels/internode.cu`` @ 008e399e. Not modelled: NVSHMEM's own state and the rounding of
its symmetric heap (``NVSHMEM_CUMEM_GRANULARITY`` = 512 MiB set in ``buffer.py``), and the pinned
host counters (host memory).
"""

from __future__ import annotations

from typing import NamedTuple

from ..spec.errors import ConfigError

MiB = 1024**2

# csrc/kernels/configs.cuh @ 10e8a3b4
NUM_MAX_NVL_PEERS = 8  # GPUs DeepEP reaches over NVLink; rank // 8 is the RDMA (node) rank
NUM_WORKSPACE_BYTES = 32 * 1024 * 1024
NUM_BUFFER_ALIGNMENT_BYTES = 128
TOPK_IDX_BYTES = 8  # topk_idx_t = int64_t (TOPK_IDX_BITS defaults to 64)
# csrc/kernels/internode.cu @ 008e399e: struct SourceMeta { int src_rdma_rank, is_token_in_nvl_rank_bits; }
SOURCE_META_BYTES = 8
INT4_BYTES = 16  # sizeof(int4), CUDA's 4 x int32 vector
# csrc/config.hpp @ 3861241a, get_*_buffer_size_hint
K_NUM_MAX_TOPK = 128
K_NUM_MAX_SCALES = 128
# csrc/deep_ep.cpp @ 011d766f: barrier_signal_bytes + buffer_ptr_bytes + barrier_signal_ptr_bytes
# = 8 x sizeof(int) + 8 x sizeof(void*) + 8 x sizeof(int*), cudaMalloc'ed after the NVL buffer
NVL_METADATA_BYTES = NUM_MAX_NVL_PEERS * 4 + NUM_MAX_NVL_PEERS * 8 + NUM_MAX_NVL_PEERS * 8

# SMs of the high-throughput kernels: DeepEP's ``Buffer.num_sms = 20``; Megatron-Core sets it from
# ``--moe-deepep-num-sms`` (TransformerConfig.moe_deepep_num_sms, default 20).
NUM_SMS = 20

# deep_ep/buffer.py @ dcfd9548: Config(num_sms, nvl_chunked_send_tokens, nvl_chunked_recv_tokens,
# rdma_chunked_send_tokens, rdma_chunked_recv_tokens) per number of ranks
DISPATCH_CONFIGS: dict[int, tuple[int, int, int, int]] = {
    2: (24, 256, 6, 128),
    4: (6, 256, 6, 128),
    8: (6, 256, 6, 128),
    16: (36, 288, 20, 128),
    24: (8, 288, 32, 128),
    32: (32, 288, 32, 128),
    64: (20, 288, 28, 128),
    128: (20, 560, 32, 128),
    144: (32, 720, 12, 128),
    160: (28, 720, 12, 128),
}
COMBINE_CONFIGS: dict[int, tuple[int, int, int, int]] = {
    2: (10, 256, 6, 128),
    4: (9, 256, 6, 128),
    8: (4, 256, 6, 128),
    16: (4, 288, 12, 128),
    24: (1, 288, 8, 128),
    32: (1, 288, 8, 128),
    64: (1, 288, 20, 128),
    128: (1, 560, 12, 128),
    144: (2, 720, 8, 128),
    160: (2, 720, 8, 128),
}
GROUP_SIZES = tuple(DISPATCH_CONFIGS)  # Buffer.get_dispatch_config asserts 'Unsupported number of EP ranks'

SOURCE = ("deepseek-ai/DeepEP deep_ep/buffer.py @ dcfd9548 (get_dispatch_config/get_combine_config), "
          "csrc/config.hpp @ 3861241a (get_nvl/rdma_buffer_size_hint), csrc/deep_ep.cpp @ 011d766f; "
          "NVIDIA/Megatron-LM megatron/core/transformer/moe/fused_a2a.py @ 02ad939b (get_buffer, get_hidden_bytes)")


def _align_up(a: int, b: int) -> int:
    return (a + b - 1) // b * b


class Config(NamedTuple):
    """``deep_ep::Config`` after its constructor ran (it rounds the RDMA receive tokens up)."""

    num_sms: int
    nvl_send_tokens: int
    nvl_recv_tokens: int
    rdma_send_tokens: int
    rdma_recv_tokens: int


def make_config(row: tuple[int, int, int, int], num_sms: int = NUM_SMS) -> Config:
    nvl_send, nvl_recv, rdma_send, rdma_recv = row
    # Config::Config: num_max_rdma_chunked_recv_tokens = align_up(recv, send)
    return Config(num_sms, nvl_send, nvl_recv, rdma_send, _align_up(rdma_recv, rdma_send))


def hidden_bytes(hidden_size: int, element_size: float) -> int:
    """fused_a2a.get_hidden_bytes: ``x.size(1) * max(x.element_size(), 2)``."""
    return int(hidden_size * max(element_size, 2))


def nvl_buffer_size_hint(config: Config, hidden_bytes: int, num_ranks: int) -> int:
    """Config::get_nvl_buffer_size_hint (csrc/config.hpp @ 3861241a), NVSHMEM build."""
    num_rdma_ranks = max(num_ranks // NUM_MAX_NVL_PEERS, 1)
    num_nvl_ranks = min(num_ranks, NUM_MAX_NVL_PEERS)
    num_channels = config.num_sms // 2
    slots = num_channels * num_nvl_ranks * config.nvl_recv_tokens
    num_bytes = num_channels * num_nvl_ranks * (2 * num_rdma_ranks + 3) * 4
    num_bytes += slots * hidden_bytes
    num_bytes += slots * SOURCE_META_BYTES
    num_bytes += slots * K_NUM_MAX_TOPK * TOPK_IDX_BYTES
    num_bytes += slots * K_NUM_MAX_TOPK * 4  # float top-k weights
    num_bytes += slots * K_NUM_MAX_SCALES * 4  # float scales
    return _align_up(num_bytes, NUM_BUFFER_ALIGNMENT_BYTES)


def rdma_buffer_size_hint(config: Config, hidden_bytes: int, num_ranks: int) -> int:
    """Config::get_rdma_buffer_size_hint (csrc/config.hpp @ 3861241a): 0 within one NVLink node."""
    if num_ranks <= NUM_MAX_NVL_PEERS:
        return 0
    num_rdma_ranks = num_ranks // NUM_MAX_NVL_PEERS
    num_channels = config.num_sms // 2
    slots = num_channels * num_rdma_ranks * config.rdma_recv_tokens
    num_bytes = num_channels * num_rdma_ranks * (NUM_MAX_NVL_PEERS * 2 + 2) * 2 * 4
    num_bytes += slots * hidden_bytes * 2
    num_bytes += slots * SOURCE_META_BYTES * 2
    num_bytes += slots * K_NUM_MAX_TOPK * TOPK_IDX_BYTES * 2
    num_bytes += slots * K_NUM_MAX_TOPK * 4 * 2
    num_bytes += slots * K_NUM_MAX_SCALES * 4 * 2
    num_bytes += slots * INT4_BYTES * 2
    return _align_up(num_bytes, NUM_BUFFER_ALIGNMENT_BYTES)


class DeepEPBuffers(NamedTuple):
    group_size: int  # expert-TP x EP ranks of the dispatcher's group
    hidden_bytes: int
    nvl_ranks: int
    rdma_ranks: int  # nodes the group spans (1 = NVLink only)
    num_nvl_bytes: int  # Megatron's max over the dispatch and combine hints
    num_rdma_bytes: int
    nvl_allocation: int  # cudaMalloc: num_nvl_bytes + barrier signals and peer pointers (0 if no NVL buffer)
    workspace: int  # cudaMalloc(NUM_WORKSPACE_BYTES), always

    @property
    def total(self) -> int:
        return self.nvl_allocation + self.num_rdma_bytes + self.workspace


def deepep_buffers(hidden_size: int, element_size: float, group_size: int, gpus_per_node: int,
                   num_sms: int = NUM_SMS) -> DeepEPBuffers:
    """The bytes one GPU holds for Megatron-Core's DeepEP buffer (fused_a2a.get_buffer)."""
    if group_size not in DISPATCH_CONFIGS:
        raise ConfigError("parallel.ep", group_size, "ep x etp in " + ", ".join(map(str, GROUP_SIZES)),
                          "DeepEP's Buffer.get_dispatch_config has configs only for these EP group sizes")
    nvl_ranks = min(group_size, NUM_MAX_NVL_PEERS)
    if gpus_per_node < nvl_ranks:
        # DeepEP maps rank % 8 to a peer on the same NVLink node (csrc/deep_ep.cpp: nvl_rank = rank % 8)
        raise ConfigError("training.moe_dispatcher", "deepep", "'alltoall' on this GPU",
                          f"DeepEP needs {nvl_ranks} GPUs of the EP group on one NVLink node; the catalog's node "
                          f"has {gpus_per_node}")
    hb = hidden_bytes(hidden_size, element_size)
    nvl = rdma = 0
    for table in (DISPATCH_CONFIGS, COMBINE_CONFIGS):
        config = make_config(table[group_size], num_sms)
        nvl = max(nvl_buffer_size_hint(config, hb, group_size), nvl)
        rdma = max(rdma_buffer_size_hint(config, hb, group_size), rdma)
    return DeepEPBuffers(
        group_size=group_size, hidden_bytes=hb, nvl_ranks=nvl_ranks,
        rdma_ranks=max(group_size // NUM_MAX_NVL_PEERS, 1), num_nvl_bytes=nvl, num_rdma_bytes=rdma,
        nvl_allocation=nvl + NVL_METADATA_BYTES if nvl > 0 else 0, workspace=NUM_WORKSPACE_BYTES)
