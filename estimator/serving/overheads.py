"""Memory outside the profiled tensors: non-torch memory and CUDA graphs (vLLM V1; modelled).

Non-torch memory, as vLLM counts it, is the growth of (device used - torch reserved) from the worker's
start-up snapshot to the end of the profiling run (utils memory_profiling ``non_torch_increase``). The
snapshot is taken after the CUDA context and the NCCL communicators exist (gpu_worker.py init_device:
"Initialize the distributed environment BEFORE taking memory snapshot"), so those sit outside the budget;
what grows inside it is cuBLAS/cuBLASLt workspaces and lazily loaded kernels, and under TP/PP the NCCL
buffers set up on the first collectives. Public start-up logs on H100: 0.16 GiB at TP 1 (vLLM PR #12126,
Llama-3.2-11B), 0.20 GiB per worker over 4 GPUs (vLLM PR #14447). Under TP > 1 from 0.17 FlashInfer's
all-reduce fusion workspace joins it (serving/allreduce_fusion.py); the NCCL communicator torch creates for the
TP group while that workspace's handles are exchanged is not modelled (tests/test_serving_published.py).

CUDA graphs (piecewise, the V1 default): the graphs of every capture size share one memory pool, and
the largest capture keeps each piece's outputs between the attention calls: per layer q, k, v, the
attention output and the residual stream for the largest batch (cudagraph_capture_sizes up to
min(2 x max_num_seqs, 512), vLLM 0.11 config/__init__.py). Captured after the KV cache is sized (on
top of the budget) up to 0.19; from 0.20 profile_cudagraph_memory() estimates them and the budget
gives them up before the KV cache is sized (gpu_worker.py, VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS=1).
"""

from __future__ import annotations

from ..spec.architecture import Architecture
from .kv_cache import kv_heads_per_rank

MiB = 1024**2
NON_TORCH_SINGLE = 164 * MiB  # 0.16 GiB at TP 1 (vLLM PR #12126 start-up log)
NON_TORCH_DISTRIBUTED = 205 * MiB  # 0.20 GiB per worker of a 4-GPU run (vLLM PR #14447 start-up log)
NON_TORCH_SOURCE = ("growth of device memory outside torch from vLLM's start-up snapshot (after CUDA context and "
                    "NCCL init) to the end of profiling (utils memory_profiling); start-up logs: 0.16 GiB at TP 1 "
                    "(vLLM PR #12126), 0.20 GiB per worker of 4 GPUs (vLLM PR #14447)")
MAX_CAPTURE = 512


def non_torch_bytes(tp: int, pp: int) -> int:
    return NON_TORCH_SINGLE if tp * pp == 1 else NON_TORCH_DISTRIBUTED


def capture_size(max_num_seqs: int) -> int:
    return min(2 * max_num_seqs, MAX_CAPTURE)


def cuda_graph_bytes(arch: Architecture, layers: int, max_num_seqs: int, tp: int, act_bytes: int) -> int:
    """The graph pool at the largest capture size: per layer its q, k, v, attention output and residual."""
    batch = capture_size(max_num_seqs)
    kv = kv_heads_per_rank(arch, tp) * arch.head_dim if not arch.uses_mla else arch.kv_lora_rank + arch.qk_rope_head_dim
    per_layer = arch.q_width // tp + 2 * kv + arch.attention_output_width // tp + arch.hidden_size
    return batch * layers * per_layer * act_bytes
