"""vLLM's CUDA-graph memory: the shared graph pool, and vLLM's own estimate of it from 0.20 (modelled).

Capture (cudagraph_mode FULL_AND_PIECEWISE, the V1 default: 0.11.0 config/__init__.py, 0.20.0 / 0.27.0 /
0.33.0 config/vllm.py optimization-level defaults; the 0.19.0 logs print "PIECEWISE=51 ..., FULL=51"): every
capture size is captured as PIECEWISE graphs (one per piece between attention calls) and, for uniform decode
batches, as one FULL graph; sizes 1, 2, 4, 8-248 by 8 and 256 up to min(2 x max_num_seqs, 512) by 16 (0.20.0
config/vllm.py _set_cudagraph_sizes). All graphs share one pool (compilation/cuda_graph.py
get_global_graph_pool), and FULL and PIECEWISE graphs are never replayed at once, so vLLM's estimate takes the
larger of the two first captures, not their sum (0.20.0 v1/worker/gpu_model_runner.py profile_cudagraph_memory: "the
pool overlays their memory. Take the max"); what FULL adds to the pool after PIECEWISE is counted once either way.
Smaller sizes reuse the largest one's blocks.

- The pool's size is what the caching allocator reserves for the pieces' tensors, replayed request by request
  (serving/graph_pool.py: the sequence inductor's generated code makes for vLLM 0.19's Llama pieces, through
  estimator/memory/allocator.py's rules): what mem_get_info around a capture sees is the segments cudaMalloc'd, not
  the tensors live at once (Llama-3.1-8B at 512 tokens: 64 MiB of segments, 20 + 2 + 28 + 14, for 58 MiB of tensors;
  this module took the MLP piece's 54 MiB, o + 2h + 3I, before: piecewise_bytes). Each piece's outputs are ordinary
  tensors of the pool, released after their last use (compilation/cuda_graph.py: weak_ref_output only for the last
  graph), and a block freed during a capture goes back to the pool at once (CUDACachingAllocator.cpp). A routed MoE
  layer's piece is taken at its boundary tensors (0.15 on its fused_moe buffers come from the worker's workspace,
  outside the pool; 0.11's were not modelled here).
- FULL (FlashAttention 3, Hopper): a FULL graph fixes num_splits at flash_attn_max_num_splits_for_cuda_graph = 32
  (config/attention.py, 0.15.0 to 0.33.0; 0.11.0 envs.py VLLM_FLASH_ATTN_MAX_NUM_SPLITS_FOR_CUDA_GRAPH;
  v1/attention/backends/flash_attn.py sets max_num_splits from it
  "so that large enough intermediate buffers are pre-allocated during capture"), and FA3's mha_fwd allocates
  fp32 out_accum [splits, heads, total_q, head_dim_v] and softmax_lse_accum [splits, heads, total_q] per call
  when num_splits > 1 (Dao-AILab/flash-attention hopper/flash_api.cpp, commit 000090d0, the source of vLLM's
  vllm-flash-attn); each layer's call reuses the last one's freed blocks. Replayed after the PIECEWISE captures in
  the same pool, out_accum (32 x T x heads a rank x head_dim x 4 B, 256 MiB for Llama-3.1-8B) takes a new segment
  and the smaller buffers fit blocks the pieces freed: full_pool. The 0.19.0 logs' "FULL first-capture" is this and
  its graph's driver memory within 0.6 MiB above to 7.9 below, every stage of the 16-bit-weight logs that run FA3
  (tests/test_serving_cuda_graphs.py).
- PIECEWISE: the first capture of profile_cudagraph_memory also holds the capture stream's segments made after its
  first piece (graph_pool.py: torch.cuda.graph's empty_cache runs for the first piece only, vLLM's gc_disable): on
  the last pipeline stage _dummy_run's picked rows, min(T, max_num_seqs) x h (a 20 MiB segment for Llama at 512),
  and the logit indices' 2 MiB small segment; with the pool, the graphs' driver memory and the stream's cuBLAS
  workspace it is 12.9-15.8 MiB below the 0.19.0 logs for Llama-3.1-8B in bf16 on every stage (25-48 MiB before), and
  0.4-22.3 MiB below over the 16-bit-weight logs at TP 1. At TP > 1 the pieces' out-of-place all-reduce outputs
  are replayed (graph_pool.py _reduced_layer) and fit the segments the pieces already take, so ours is still up to
  18 MiB above the logs at TP 2 and 4 (Llama-3.1-8B; Qwen2.5-7B 2.2-2.3 below). Not modelled: FlashInfer's fused
  all-reduce + RMSNorm (allreduce_fusion.py), other models' own piece code (one Llama sequence at their widths), and
  what else the capture adds. The capture stream's cuBLAS workspace is there only where a piece runs a cuBLAS
  GEMM: fp8, int8 and int4 weights run CUTLASS / Marlin kernels (profile_buffers.py capture_blas_bytes), which
  takes the logs' dense fp8 / int8 / GPTQ first captures (Llama-3.1-8B 98, 112, 126 MiB against 138 in bf16) from
  24.2 MiB above ours to 3.8 below, to 2.3-35.8 below (the rest: the formats' own kernels' allocations, not
  replayed: the activations' quantized copies and scales, Marlin's buffers); an fp8 KV cache (124 MiB) keeps it.
- Other backends add nothing here: FlashInfer (Blackwell's default) keeps one persistent workspace of
  VLLM_FLASHINFER_WORKSPACE_BUFFER_SIZE (394 MiB, 0.33.0 envs.py) made by its metadata builder outside the
  graphs (v1/attention/backends/flashinfer.py _get_workspace_buffer); whether vLLM's profiler counts it in a
  first capture was not established. MLA backends' FULL graphs are not modelled (DeepSeek-V2-Lite's FULL
  first-capture is 522 MiB in the 0.19.0 logs).
- The graph executables' driver memory (outside the pool; driver_memory): the graphs and kernel nodes vLLM 0.19
  captures (serving/graph_nodes.py, counted from its source) at the bytes measured per graph and per node
  (serving/graph_driver.py, an H200 on driver 580.159.04). It is part of what 0.19 prints after capturing and of
  what the device holds in every release; what 0.20+ subtracts is vLLM's own estimate (below), whose samples
  (mem_get_info around a capture) hold the driver memory of the graphs they capture.

vLLM's estimate (v1/worker/gpu_model_runner.py profile_cudagraph_memory, read in 0.19.0, 0.20.0 and 0.33.0): it
captures the two largest sizes of each mode into a scratch pool and returns max(first captures) + sum over modes of
(captures - 1) x max(second capture, 1 MiB) (0.33.0 adds the vision encoder's graphs, off by default:
compilation.py cudagraph_mm_encoder = False). Ours (vllm_estimate): each first capture is what its mode's capture
adds to the pool and its graphs' driver memory (the PIECEWISE one, captured first on graph_capture's new stream, also
that stream's segments and cuBLAS workspace); each further capture is the second size's graphs' driver memory, at
least the source's 1 MiB. Where it goes, by release (v1/worker/gpu_worker.py determine_available_memory and
envs.py): 0.19 computes it inside memory_profiling but does not subtract it (VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS
defaults to 0; the graphs are captured after the KV cache is sized, on top of the budget); 0.20.0 to 0.33.0 default
it to 1 and set available KV memory = requested - non-KV memory - the estimate (read in 0.20.0, 0.21.0, 0.25.0,
0.26.0, 0.27.0, 0.33.0); 0.20.0-0.25.0 profile on CUDA only (ROCm's estimate is 0), 0.26.0 on include ROCm.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..spec.architecture import Architecture
from . import graph_pool
from .graph_driver import driver_cost
from .graph_nodes import GraphSet, counted, full_set, piecewise_set
from .kv_cache import kv_heads_per_rank

MiB = 1024**2
MAX_CAPTURE = 512
FA3_SPLITS = 32  # flash_attn_max_num_splits_for_cuda_graph (vLLM 0.20.0-0.33.0 config/attention.py)
FP32 = 4
PER_GRAPH_FLOOR = MiB  # profile_cudagraph_memory: "Use at least 1 MiB per graph for driver overhead"
SM90 = ("h100-80", "h100-nvl", "h100-pcie", "h200", "gh200")  # FlashAttention 3 (fa_utils.py: compute capability 9.0)


@dataclass(frozen=True)
class GraphMemory:
    pool: int  # the shared pool's reserved bytes after the profiler's captures (PIECEWISE, then FULL)
    full_pool: int  # what the FULL capture adds to the pool: FA3's split-KV accumulators' segments (0 without FA3)
    piecewise_pool: int  # the pool's reserved bytes after the PIECEWISE captures (serving/graph_pool.py)
    piecewise_captures: int
    full_captures: int  # uniform-decode sizes only: those <= max_num_seqs (v1/cudagraph_dispatcher.py)
    formula: str
    stream: int = 0  # the capture stream's segments the largest size's capture run leaves (graph_pool.py)
    stream_held: int = 0  # the same after capture_model's last capture (size 1)
    live: int = 0  # the most the PIECEWISE pieces hold at once

    @property
    def captured_pool(self) -> int:
        """The pool capture_model leaves: it captures every PIECEWISE size, then every FULL one
        (v1/cudagraph_dispatcher.py get_capture_descs, 0.19.0), and FA3's accumulators, each larger than any
        block the pieces freed, take new segments of the pool: the sum, where vLLM's estimate takes the max."""
        return self.full_pool + self.piecewise_pool


def model_max_capture(arch: Architecture, release: tuple[int, int]) -> int | None:
    """A model's own max_cudagraph_capture_size: gpt-oss (the one family with attention sinks) raises it to 1024
    (model_executor/models/config.py GptOssForCausalLMConfig, 0.33.0; the 0.19.0 logs: 'PIECEWISE=83
    (largest=1024)'; absent in 0.11.0, 0.15-0.18 not read)."""
    return 1024 if arch.attention_sinks and release >= (0, 19) else None


def capture_sizes(max_num_seqs: int, model_max: int | None = None, max_tokens: int | None = None) -> tuple[int, ...]:
    """cudagraph_capture_sizes by default (0.20.0 config/vllm.py; the 0.19.0 logs: 51 sizes up to 512): up to
    min(2 x max_num_seqs, 512), or a model's own maximum capped at max_num_batched_tokens."""
    largest = min(2 * max_num_seqs, MAX_CAPTURE) if model_max is None else min(model_max, max_tokens or model_max)
    sizes = {s for s in (1, 2, 4) if s <= largest} | set(range(8, min(largest + 1, 256), 8))
    sizes |= set(range(256, largest + 1, 16))
    return tuple(sorted(sizes))


def fa3_full_graphs(arch: Architecture, gpu_id: str, act_bytes: int) -> bool:
    """Where the FULL graphs run FlashAttention 3's split-KV kernel: Hopper, 16-bit activations (FA has no fp32),
    standard attention (MLA has its own backends; gpt-oss's sinks and the 0.19 logs' Gemma-3 pick other ones:
    their FULL first-capture is 4-8 MiB)."""
    return (gpu_id in SM90 and act_bytes == 2 and not arch.uses_mla and not arch.attention_sinks
            and arch.vision_tower is None)


def split_kv_bytes(arch: Architecture, tp: int, tokens: int) -> int:
    heads = arch.num_attention_heads // tp
    return FA3_SPLITS * tokens * heads * (arch.head_dim + 1) * FP32


def piecewise_bytes(arch: Architecture, tp: int, tokens: int, act_bytes: int) -> int:
    """The widest piece's boundary tensors (q + 2kv + o + h) or a dense MLP piece's o + 2h + 3I, the live-tensor
    figure this module took for the pool before the allocator replay (serving/graph_pool.py); kept for comparison."""
    kv = kv_heads_per_rank(arch, tp) * arch.head_dim if not arch.uses_mla else arch.kv_lora_rank + arch.qk_rope_head_dim
    o = arch.attention_output_width // tp
    boundary = arch.q_width // tp + 2 * kv + o + arch.hidden_size
    dense = arch.intermediate_size and arch.moe_layers_in(0, arch.num_layers) < arch.num_layers
    mlp = o + 2 * arch.hidden_size + 3 * arch.intermediate_size // tp if dense else 0
    return tokens * max(boundary, mlp) * act_bytes


def graph_memory(arch: Architecture, max_num_seqs: int, tp: int, act_bytes: int, gpu_id: str,
                 model_max: int | None = None, max_tokens: int | None = None, layers: range | None = None,
                 last: bool = True) -> GraphMemory:
    """The pool of one pipeline stage (`layers`, the whole model by default; `last`: it ends the model), replayed
    through the caching allocator (serving/graph_pool.py)."""
    sizes = capture_sizes(max_num_seqs, model_max, max_tokens)
    full_sizes = tuple(s for s in sizes if s <= max_num_seqs)
    tokens, decode = sizes[-1], full_sizes[-1]
    fa3 = fa3_full_graphs(arch, gpu_id, act_bytes)
    accumulators = graph_pool.fa3_accumulators(arch, tp, decode, FA3_SPLITS) if fa3 else ()
    stage = layers if layers is not None else range(arch.num_layers)
    run = graph_pool.replay(arch, tp, act_bytes, sizes, full_sizes, stage, last, max_num_seqs, accumulators)
    formula = (f"the pool's segments, replayed (caching allocator, serving/graph_pool.py): PIECEWISE at {tokens} and "
               f"{sizes[-2] if len(sizes) > 1 else tokens} tokens {run.piecewise / MiB:.0f} MiB reserved (its tensors "
               f"{run.live / MiB:.0f} MiB at most at once), then FULL at {decode}"
               + (f" with FA3's split-KV accumulators ({FA3_SPLITS} x {decode} x heads/TP x (head_dim + 1) x 4 B = "
                  f"{split_kv_bytes(arch, tp, decode) / MiB:.0f} MiB)" if fa3 else "")
               + f" adding {run.full / MiB:.0f} MiB")
    return GraphMemory(run.piecewise + run.full, run.full, run.piecewise, len(sizes), len(full_sizes), formula,
                       run.stream, run.stream_held, run.live)


def profiler_total(first: dict[str, int], per_graph: dict[str, int], captures: dict[str, int]) -> int:
    """profile_cudagraph_memory's return value from its measurements per mode (0.20.0 gpu_model_runner.py):
    max of the first captures + sum of (captures - 1) x max(per-graph sample, 1 MiB)."""
    return max(first.values()) + sum((captures[m] - 1) * max(per_graph[m], PER_GRAPH_FLOOR) for m in first)


def vllm_estimate(graphs: GraphMemory, driver: DriverMemory | None = None, workspace: int = 0) -> tuple[int, str]:
    """profile_cudagraph_memory's total as we model it from what each of its samples holds (mem_get_info before
    and after a warm-up and capture): a first capture is what its mode adds to the pool, its graphs' driver memory
    and, for the first mode (PIECEWISE), the segments and cuBLAS workspace of graph_capture's new stream (the warm-up's
    segments go back at the first piece's empty_cache; the FULL capture's empty_cache returns the stream's free
    segments and its run makes them again); a second capture reuses the pool, so it is its graphs' driver memory, at
    the source's 1 MiB floor ("for driver overhead")."""
    pw_first, full_first, pw_second, full_second = driver.samples if driver else (0, 0, 0, 0)
    first = {"FULL": graphs.full_pool + full_first,
             "PIECEWISE": graphs.piecewise_pool + graphs.stream + pw_first + workspace}
    captures = {"FULL": graphs.full_captures, "PIECEWISE": graphs.piecewise_captures}
    total = profiler_total(first, {"FULL": full_second, "PIECEWISE": pw_second}, captures)
    return total, (f"max(FULL first capture {first['FULL'] / MiB:.0f} MiB, PIECEWISE {first['PIECEWISE'] / MiB:.0f} "
                   f"MiB) + ({graphs.piecewise_captures} - 1) x {max(pw_second, PER_GRAPH_FLOOR) / MiB:.1f} MiB + "
                   f"({graphs.full_captures} - 1) x {max(full_second, PER_GRAPH_FLOOR) / MiB:.1f} MiB further "
                   f"captures (their graphs' driver memory, at least 1 MiB); {graphs.formula}")


@dataclass(frozen=True)
class DriverMemory:
    bytes: int
    graphs: int
    small_nodes: int
    large_nodes: int
    formula: str
    source: str
    # the driver memory of profile_cudagraph_memory's samples: the largest and second-largest capture's graphs,
    # PIECEWISE first, FULL second
    samples: tuple[int, int, int, int] = (0, 0, 0, 0)


def driver_memory(arch: Architecture, max_num_seqs: int, tp: int, gpu_id: str, act_bytes: int, layers: range,
                  first: bool, last: bool, fusion_tokens: int | None, model_max: int | None = None,
                  max_tokens: int | None = None) -> DriverMemory:
    """The graph executables of one rank: per capture size its PIECEWISE graphs and, up to max_num_seqs, its FULL
    graph (serving/graph_nodes.py), at the measured bytes per graph and per node (serving/graph_driver.py).
    fusion_tokens: the all-reduce + RMSNorm fusion's max_token_num (None where the pass is off)."""
    cost = driver_cost()
    if gpu_id.startswith("mi"):
        return DriverMemory(0, 0, 0, 0, "not modelled on ROCm: HIP graphs' memory was not measured", cost.source)
    if not counted(arch):
        return DriverMemory(0, 0, 0, 0, "not modelled: MLA, recurrent and MXFP4 layers' kernels were not counted",
                            cost.source)
    sizes = capture_sizes(max_num_seqs, model_max, max_tokens)
    split_kv = fa3_full_graphs(arch, gpu_id, act_bytes)

    def piecewise(size: int) -> GraphSet:
        return piecewise_set(arch, layers, first, last, tp, fusion_tokens is not None and size <= fusion_tokens)

    def full(size: int) -> GraphSet:
        return full_set(piecewise(size), len(layers), split_kv)

    def bytes_of(graphs: GraphSet) -> int:
        return cost.per_graph * graphs.graphs + cost.per_small_node * graphs.small + cost.per_large_node * graphs.large

    full_sizes = [size for size in sizes if size <= max_num_seqs]
    total = GraphSet(0, 0, 0)
    for size in sizes:
        total += piecewise(size) + full(size) if size <= max_num_seqs else piecewise(size)
    samples = (bytes_of(piecewise(sizes[-1])), bytes_of(full(full_sizes[-1])),
               bytes_of(piecewise(sizes[-2])) if len(sizes) > 1 else 0,
               bytes_of(full(full_sizes[-2])) if len(full_sizes) > 1 else 0)
    formula = (f"{total.graphs:,} graphs x {cost.per_graph:,} B + {total.small:,} small kernel nodes x "
               f"{cost.per_small_node:,} B + {total.large:,} GEMM/attention nodes x {cost.per_large_node:,} B "
               f"({len(sizes)} sizes x ({len(layers)} + 1) PIECEWISE graphs + 1 FULL graph a size up to "
               f"{max_num_seqs}; driver {cost.driver}, CUDA {cost.cuda}: the run's driver may differ)")
    source = f"{cost.source}; applied whatever the run's driver: the published vLLM 0.19 logs name none"
    return DriverMemory(bytes_of(total), total.graphs, total.small, total.large, formula, source, samples)
