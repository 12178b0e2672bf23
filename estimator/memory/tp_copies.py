"""What plain tensor parallelism with sequence parallelism reserves beyond async TP under FSDP2
(torchtitan), a share of the reserved peak the allocated one does not see.

A row-parallel linear (attention's output projection, the MLP's down projection) ends in a
reduce-scatter along the sequence (dim 1 of [b, s, h]). Plain TP runs it through torch's functional
collectives, which cut the full-sequence partial sums into chunks and cat them along dim 0 first
(reduce_scatter_single -> _chunk_or_narrow_cat), so the partial sums and their cat (B*s*b*h each) are
alive together: a block's largest moment. Async TP (training.async_tp; Inductor's micro-pipeline pass
replaces that split/cat/reduce_scatter pattern) runs fused_matmul_reduce_scatter, whose matmul writes its
chunks straight into one stacked_partials buffer (the p2p workspace is symmetric memory, outside the
caching allocator): one full-sequence buffer where plain TP holds two.

The peak itself is not there: it comes at the loss, outside the compiled blocks, where both hold the
same tensors. What reaches the reserved peak is the segment the allocator mapped for the cat, kept
through the step (segments are never given back) and too small for the loss's tensors (s*b*V/t in
fp32). The estimate counts that one B*s*b*h (the all-gather's cat before the column-parallel linears,
freed before it, and the backward's copies, made after the peak in segments the loss frees, add
none). Measured: torchtitan's Dec 2024 Table 4 holds the same Llama 3.1 70B run with and without async
TP 4.3 GiB apart in max_reserved; this term explains 2 GiB of it, the rest is the allocator's segment
layout (not replayed). Not the cause: ProcessGroupNCCL's recordStream on the collectives' tensors, which
delays their reuse (torchtitan #737); torchtitan 9dec370 utils.init_distributed sets
TORCH_NCCL_AVOID_RECORD_STREAMS=1 before the process groups exist.
"""

from __future__ import annotations

from .activations.entries import tokens_per_gpu
from ..spec.architecture import Architecture
from .components import Component, component
from ..spec.dtypes import bytes_per_element
from ..spec.parallel import Parallel
from ..spec.training import Training

PLAIN_TP_SOURCE = ("read at torch 2.13 (the Dec 2024 commit 1963fc83 was not readable here): "
                   "distributed/_functional_collectives.py reduce_scatter_single (scatter_dim != 0: "
                   "_chunk_or_narrow_cat into one buffer before reduce_scatter_tensor), used by DTensor's "
                   "Partial -> Shard(1) redistribute; _inductor/fx_passes/micro_pipeline_tp.py "
                   "find_reduce_scatter_patterns (the split/cat form replaced) and "
                   "distributed/_symmetric_memory/__init__.py _fused_matmul_reduce_scatter_impl (chunks written "
                   "into one stacked_partials; the p2p workspace from get_symm_mem_workspace, outside the "
                   "caching allocator); torchtitan 9dec370 parallelisms/parallelize_llama.py apply_tp "
                   "(rowwise_parallel(output_layouts=Shard(1)) for attention.wo and feed_forward.w2; async TP "
                   "sets _micro_pipeline_tp); measured gap: benchmarks/llama3_h100_202412_torchtitan.md Table 4 "
                   "(2D 71.9 GiB, 2D + AsyncTP 67.6 GiB)")


def plain_tp_reserved(arch: Architecture, training: Training, par: Parallel) -> Component | None:
    """The segment plain TP's reduce-scatter cat keeps reserved (see the module's note), or None where
    it does not apply: fsdp2 training with TP and sequence parallelism and no async TP."""
    if not (training.framework == "fsdp2" and training.mode == "training" and par.tp > 1
            and par.sequence_parallel and not training.async_tp):
        return None
    B = bytes_per_element(training.compute_dtype)  # the partial sums: the matmul's output (float8 linears too)
    return component("fragmentation", "Plain TP's reduce-scatter cat of the partial sums (a cached segment)",
                     B * tokens_per_gpu(training, par) * arch.hidden_size, "B*s*b*h", PLAIN_TP_SOURCE)
