"""The graph executables vLLM 0.19 captures, and the kernel nodes in each (counted from vLLM 0.19.0's source).

Graphs (cudagraph_mode FULL_AND_PIECEWISE, config/vllm.py OPTIMIZATION_LEVEL_02): per capture size, PIECEWISE
graphs of the pieces between splitting ops, and for the uniform-decode sizes one FULL graph of the whole forward.
The splitting ops are the attention ops plus vllm::unified_kv_cache_update (config/compilation.py
set_splitting_ops_for_v1: FlashAttention and the other backends with forward_includes_kv_cache_update False);
split_graph (compilation/backends.py) keeps consecutive splitting ops in one piece and merges empty pieces, so a
stage of L attention layers has L + 1 PIECEWISE graphs a size, and the KV-cache write runs outside them.

Kernel nodes of one decoder layer, compiled by Inductor with every custom op off (custom_ops "none"; combo_kernels
on from torch 2.9, config/compilation.py, which joins the q and k rotary/norm kernels into one; inductor's own
schedule of a Llama middle piece, validation/vllm/piece_kernels.py on torch 2.13: 4 GEMMs, 4 Triton kernels):
- large (cuBLAS GEMMs): qkv_proj, o_proj, gate_up_proj, down_proj (4; the qkv bias in the GEMM's epilogue);
- small (Inductor's fused Triton kernels): one per RMSNorm with its residual add (norms_per_layer: 2, Gemma-2/3
  4), the rotary embedding (with Qwen3's q/k norms in the same combo kernel), SiLU x mul (4 a Llama layer);
- a MoE layer's MLP instead (model_executor/layers/fused_moe/fused_moe.py fused_experts_impl, Triton path): the
  router GEMM (large), topk_softmax, moe_align_block_size (or the naive assignment's fill), the W13 and W2 fused_moe
  Triton kernels, the activation and moe_sum (6 small); a shared expert adds gate_up, down (large) and its
  activation (small), Qwen2-MoE's sigmoid gate one more GEMM (large) and its mul (small);
- under TP > 1 one all-reduce after o_proj, one after the MLP and one after the vocabulary-parallel embedding:
  FlashInfer's fused all-reduce + add + RMSNorm replaces the norm kernel up to the fusion's max_token_num
  (compilation/passes/fusion/allreduce_rms_fusion.py is_applicable_for_range; config/vllm.py _set_compile_ranges
  splits the range there), else each is one more kernel (custom all-reduce or NCCL);
- the stage's ends: the embedding gather (first stage) and the final norm (last stage), small;
- FULL graphs add each layer's KV-cache write (reshape_and_cache_flash, small) and its attention: FlashAttention's
  forward and, with split-KV on Hopper (FA3), its combine kernel (large: CUTLASS kernels).
Not counted: cuBLAS split-K reduction kernels (the heuristics' choice per shape), the activation-quantization
kernels of FP8/INT8 checkpoints (Inductor fuses most into the norms), memset nodes. MLA, hybrid (recurrent) and
gpt-oss's MXFP4 MoE layers run other kernels and are not counted (`counted` is False: no driver memory, and the
formula says so). The same structure is taken for the other releases (0.11 to 0.33; their splitting ops and
fusion passes were not re-read for this count).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..spec.architecture import Architecture

GEMMS_DENSE = 4  # qkv, o, gate_up, down
ROUTED_SMALL = 6  # topk_softmax, moe_align_block_size, fused_moe W13, activation, fused_moe W2, moe_sum


@dataclass(frozen=True)
class GraphSet:
    """Graphs and kernel nodes captured for one capture size and mode."""

    graphs: int
    small: int  # kernel nodes with small parameter blocks
    large: int  # cuBLAS / CUTLASS kernel nodes

    def __add__(self, other: GraphSet) -> GraphSet:
        return GraphSet(self.graphs + other.graphs, self.small + other.small, self.large + other.large)


def counted(arch: Architecture) -> bool:
    return not (arch.uses_mla or arch.is_hybrid or arch.attention_sinks)


def _mlp(arch: Architecture, moe: bool) -> tuple[int, int]:
    """(small, large) kernels of one layer's MLP."""
    if not moe:
        return 1, 2
    small, large = ROUTED_SMALL, 1
    if arch.num_shared_experts or arch.shared_expert_gate:
        small, large = small + 1, large + 2
        if arch.shared_expert_gate:
            small, large = small + 1, large + 1
    return small, large


def layer_nodes(arch: Architecture, moe: bool) -> tuple[int, int]:
    """(small, large) kernels of one layer outside attention, at TP 1."""
    mlp_small, mlp_large = _mlp(arch, moe)
    return arch.norms_per_layer + 1 + mlp_small, GEMMS_DENSE - 2 + mlp_large


def piecewise_set(arch: Architecture, layers: range, first: bool, last: bool, tp: int, fused: bool) -> GraphSet:
    """One capture size's PIECEWISE graphs: `fused` where the all-reduce + RMSNorm fusion covers the size."""
    moe = arch.moe_layers_in(layers.start, layers.stop)
    dense = len(layers) - moe
    (ds, dl), (ms, ml) = layer_nodes(arch, False), layer_nodes(arch, True)
    small = dense * ds + moe * ms + int(first) + int(last)
    if tp > 1 and not fused:
        small += 2 * len(layers) + int(first)
    return GraphSet(len(layers) + 1, small, dense * dl + moe * ml)


def full_set(pieces: GraphSet, layers: int, split_kv: bool) -> GraphSet:
    """One capture size's FULL graph: the pieces' kernels plus each layer's KV-cache write and attention."""
    return GraphSet(1, pieces.small + layers, pieces.large + layers * (2 if split_kv else 1))
