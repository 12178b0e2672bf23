"""Megatron-Core 0.16.1's DeepSeek Sparse Attention run for real on the CPU, its storages logged by the
harness's tracker (validation/core/tracker.py): what one DSAttention layer keeps for backward and the
peaks of its forward and backward, for the estimator's formulas (estimator/memory/activations/sparse.py).

The real DSAttention.forward and DSAIndexer.forward_with_scores run (transformer/experimental_attention_
variant/dsa.py: the indexer, unfused_dsa_fn, compute_dsa_indexer_loss, DSAIndexerLossAutoScaler), on
module objects given only the attributes those methods read, with plain linears for the indexer's
projections (their inputs are the detached hidden states and compressed query, which MLA keeps anyway),
a torch LayerNorm for k_norm and Megatron's RotaryEmbedding. Two stand-ins: the Hadamard rotation is the
identity (fast_hadamard_transform is CUDA-only; its autograd Function keeps nothing), and
torch.cuda.current_device() answers "cpu" for RotaryEmbedding.get_emb. What the tracker sees and the
estimator's CUDA figures differ only in: storages rounded up to 512 bytes (the loss scalar), and the CPU
layer_norm's mean and rstd in bf16 where CUDA keeps them in fp32.
"""

from __future__ import annotations

import types


def measure(b: int, s: int, heads: int, index_heads: int, index_dim: int = 128, topk: int = 64, hidden: int = 64,
            q_lora: int = 32, nope: int = 128, rope: int = 64, v_dim: int = 128) -> dict:
    import torch
    import torch.nn.functional as F
    from megatron.core.models.common.embeddings import RotaryEmbedding
    from megatron.core.transformer.enums import AttnMaskType
    from megatron.core.transformer.experimental_attention_variant import dsa
    from ..core.tracker import StorageTracker

    torch.manual_seed(0)
    bf, ns = torch.bfloat16, types.SimpleNamespace
    config = ns(rope_type="rope", sequence_parallel=False, apply_rope_fusion=False, rotary_interleaved=False,
                multi_latent_attention=True, mrope_section=None, dsa_indexer_loss_coeff=1.0,
                dsa_indexer_use_sparse_loss=False, num_layers=1, context_parallel_size=1,
                tensor_model_parallel_size=1)
    weights = []

    def linear(inp: int, out: int):
        w = torch.randn(out, inp, dtype=bf, requires_grad=True)
        weights.append(w)
        return lambda x: (F.linear(x, w), None)

    indexer = object.__new__(dsa.DSAIndexer)
    torch.nn.Module.__init__(indexer)
    indexer.config, indexer.qk_pos_emb_head_dim = config, rope
    indexer.index_n_heads, indexer.index_head_dim, indexer.index_topk = index_heads, index_dim, topk
    indexer.softmax_scale = index_dim ** -0.5
    indexer.pg_collection = ns(tp=ns(size=lambda: 1), cp=ns(size=lambda: 1, rank=lambda: 0))
    indexer.rotary_pos_emb = RotaryEmbedding(rope, rotary_percent=1.0, rotary_base=10000, cp_group=None,
                                             use_cpu_initialization=True)
    indexer.linear_wq_b = linear(q_lora, index_heads * index_dim)
    indexer.linear_wk = linear(hidden, index_dim)
    indexer.linear_weights_proj = linear(hidden, index_heads)
    indexer.k_norm = torch.nn.LayerNorm(index_dim, eps=1e-6, dtype=bf)
    weights += list(indexer.k_norm.parameters())
    attention = ns(training=True, indexer=indexer, softmax_scale=(nope + rope) ** -0.5, config=config,
                   layer_number=None)
    saved_rotate, saved_device = dsa.rotate_activation, torch.cuda.current_device
    dsa.rotate_activation = lambda x: x
    torch.cuda.current_device = lambda: "cpu"
    try:
        rope_cache = indexer.rotary_pos_emb(s, packed_seq=False)  # its lru_cache: one table per model
        x = torch.randn(s, b, hidden, dtype=bf)  # MLA's input and compressed query: kept by MLA
        qr = torch.randn(s, b, q_lora, dtype=bf)
        # leaves standing for MLA's weights, from which its q, k, v are made (as MLA makes them: not leaves,
        # so that nothing but what autograd saves holds them)
        bases = [torch.randn(s, b, heads, d, dtype=bf, requires_grad=True) for d in (nope + rope, nope + rope, v_dim)]
        tracker = StorageTracker()
        for t in (*weights, x, qr, rope_cache, *bases):
            tracker.ignore(t)
        with tracker:
            tracker.start()
            query, key, value = (base * 1 for base in bases)
            start = len(tracker.events)
            out = dsa.DSAttention.forward(attention, query, key, value, None, x, qr, attn_mask_type=AttnMaskType.causal)
            forward_peak, forward_at = _peak(tracker, start)
            del query, key  # MLA.forward's locals end with it; only what autograd saved stays
            value_key = tracker.key(value)
            del value
            saved = _live(tracker)
            out_bytes = saved.pop(tracker.key(out))
            grad = torch.ones_like(out)
            start_backward = len(tracker.events)
            live_backward = sum(_live(tracker).values())
            out.backward(grad)
            backward_peak, backward_at = _peak(tracker, start_backward)
    finally:
        dsa.rotate_activation, torch.cuda.current_device = saved_rotate, saved_device
    return {"saved_bytes": sum(saved.values()), "value_kept": value_key in saved, "out_bytes": out_bytes,
            "forward_extra": forward_peak - sum(saved.values()) - out_bytes,
            "backward_extra": backward_peak - live_backward,
            "saved": _labelled(tracker, saved),
            "forward_peak": _labelled(tracker, {k: n for k, n in tracker.live_at(forward_at).items()
                                                if k not in saved}),
            "backward_peak": _labelled(tracker, tracker.live_at(backward_at))}


def _labelled(tracker, live: dict[int, int]) -> list[tuple[int, str]]:
    return sorted(((n, tracker.labels.get(k, "")) for k, n in live.items()), reverse=True)


def _live(tracker) -> dict[int, int]:
    return tracker.live_at(len(tracker.events))


def _peak(tracker, start: int) -> tuple[int, int]:
    """The most bytes alive at any moment since event `start`, and the number of events to that moment."""
    live = sum(tracker.live_at(start).values())
    best, at = live, start
    for i, (_, delta) in enumerate(tracker.events[start:], start + 1):
        live += delta
        if live > best:
            best, at = live, i
    return best, at
