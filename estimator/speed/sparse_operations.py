"""The operations of DeepSeek Sparse Attention's core in training, as Megatron-Core 0.16.1 runs it
(transformer/experimental_attention_variant/dsa.py; its saved tensors: memory/activations/sparse.py).

Megatron-Core 0.16.1's DSA is unfused: every query scores every key and the top-k choice only masks the
scores, so the sparse attention costs what dense attention without causal skipping costs, 2 b (a/t) s^2
(d_qk + d_v) FLOPs forward; the lightning indexer scores all s^2 pairs per index head, 2 b s^2 H_I D_I
(replicated on every TP rank), then ReLU, weights and sums them; the KL loss computes the main attention's
scores and softmax once more (without gradients) and the KL over b s^2. Backward: twice the forward
matmuls with gradients (the loss's main scores have none), and the elementwise work again.

Megatron-Core 0.16.1 runs these matmuls on fp32 copies of q and k (`q.float()`); the GPU table holds the
16-bit tensor rates only, so they are timed at the compute dtype's roof: a lower bound on their time.
"""

from __future__ import annotations

from ..spec.architecture import Architecture
from ..spec.parallel import Parallel
from ..spec.training import Training
from . import kernels
from .operations import CORE_ATTN, SOFTMAX_FLOPS, Operation, _Context

FP32_NOTE = " (Megatron-Core 0.16.1 multiplies fp32 copies: timed at the 16-bit roof, a lower bound)"


def dsa_core_operations(ctx: _Context, arch: Architecture, training: Training, par: Parallel, scope: str,
                        count: int) -> list[Operation]:
    a_t = arch.num_attention_heads / par.tp
    b, s = training.micro_batch_size, training.seq_len
    qk, dv = arch.qk_nope_head_dim + arch.qk_rope_head_dim, arch.v_head_dim
    heads, dim = arch.index_n_heads, arch.index_head_dim
    scores, index_scores, pairs = b * a_t * s * s, b * heads * s * s, b * s * s
    gemm = kernels.gemm_efficiency(ctx.gpu, s, qk, s)

    def op(name, phase, kind, flops, moved, formula):
        efficiency = gemm if kind == "attention" else 1.0
        return Operation(name, phase, scope, kind, flops, moved, ctx.peak, ctx.bandwidth, count, formula, CORE_ATTN,
                         efficiency, kernels.BANDWIDTH_EFFICIENCY)

    if training.framework == "hf":
        return _hf_operations(ctx, op, scores, index_scores, pairs, qk, dv, heads, dim)
    forward = [
        op("sparse attention QK^T (DSA, unfused)", "forward", "attention", 2 * scores * qk,
           8 * ctx.T * a_t * qk + 4 * scores, "2*b*(a/t)*s^2*(d_nope + d_rope)" + FP32_NOTE),
        op("sparse attention top-k mask and softmax (DSA)", "forward", "elementwise", SOFTMAX_FLOPS * scores,
           3 * 4 * scores, "read and write b*(a/t)*s^2 in fp32"),
        op("sparse attention probabilities x V (DSA)", "forward", "attention", 2 * scores * dv,
           ctx.B * scores + 2 * ctx.B * ctx.T * a_t * dv, "2*b*(a/t)*s^2*d_v"),
        op("indexer scores (DSA, every index head)", "forward", "attention", 2 * index_scores * dim,
           4 * ctx.T * (heads + 1) * dim + 4 * index_scores, "2*b*s^2*H_I*D_I" + FP32_NOTE),
        op("indexer ReLU, head weights, sum and top-k (DSA)", "forward", "elementwise", 3 * index_scores,
           3 * 4 * index_scores + 2 * 4 * pairs, "read and write b*s^2*H_I in fp32"),
        op("indexer KL loss: the main scores again, without gradients (DSA)", "forward", "attention",
           2 * scores * qk, 8 * ctx.T * a_t * qk + 4 * scores, "2*b*(a/t)*s^2*(d_nope + d_rope)" + FP32_NOTE),
        op("indexer KL loss: softmaxes and the KL (DSA)", "forward", "elementwise",
           SOFTMAX_FLOPS * (scores + pairs) + 6 * pairs, 3 * 4 * scores + 8 * 4 * pairs,
           "softmax over b*(a/t)*s^2, then b*s^2 in fp32"),
    ]
    if not ctx.training:
        return forward
    with_grad = [o for o in forward if "without gradients" not in o.name]
    return forward + [Operation(f"{o.name} (backward)", "backward", o.scope, o.kind, 2 * o.flops, 2 * o.bytes,
                                o.peak_flops, o.bandwidth, o.count, "2 x forward", o.modules, o.compute_efficiency,
                                o.memory_efficiency) for o in with_grad]


def _hf_operations(ctx: _Context, op, scores: float, index_scores: float, pairs: float, qk: int, dv: int, heads: int,
                   dim: int) -> list[Operation]:
    """transformers 5.23's DeepSeek-V3.2 (models/deepseek_v32/modeling_deepseek_v32.py; its memory:
    memory/activations/sparse_hf.py): eager attention over every key in the compute dtype, the top-k folded into
    its mask; the indexer scores every pair in fp32 (`q.float()`), under no_grad: it has no backward and there is
    no KL loss."""
    forward = [
        op("attention QK^T over every key (DSA as a mask, eager)", "forward", "attention", 2 * scores * qk,
           2 * ctx.B * ctx.T * (scores / pairs) * qk + ctx.B * scores, "2*b*a*s^2*(d_nope + d_rope)"),
        op("attention top-k mask and softmax (fp32)", "forward", "elementwise", SOFTMAX_FLOPS * scores,
           (2 * ctx.B + 8) * scores, "read b*a*s^2 in the compute dtype, write it in fp32 and cast back"),
        op("attention probabilities x V (eager)", "forward", "attention", 2 * scores * dv,
           ctx.B * scores + 2 * ctx.B * ctx.T * (scores / pairs) * dv, "2*b*a*s^2*d_v"),
        op("indexer scores (DSA, every index head, no_grad)", "forward", "attention", 2 * index_scores * dim,
           4 * ctx.T * (heads + 1) * dim + 4 * index_scores, "2*b*s^2*H_I*D_I" + HF_FP32_NOTE),
        op("indexer scale, ReLU, head weights, sum and top-k (DSA, no_grad)", "forward", "elementwise",
           4 * index_scores, 5 * 4 * index_scores + 2 * 4 * pairs, "read and write b*s^2*H_I in fp32"),
    ]
    if not ctx.training:
        return forward
    attention = [o for o in forward if not o.name.startswith("indexer")]
    return forward + [Operation(f"{o.name} (backward)", "backward", o.scope, o.kind, 2 * o.flops, 2 * o.bytes,
                                o.peak_flops, o.bandwidth, o.count, "2 x forward", o.modules, o.compute_efficiency,
                                o.memory_efficiency) for o in attention]


HF_FP32_NOTE = " (transformers multiplies fp32 copies: timed at the 16-bit roof, a lower bound)"
