"""Falcon-7B's decoder layer in the allocator replay (reserved.py): the multi-query Falcon of transformers (one key/
value head, a fused query_key_value, attention and MLP in parallel off one layer norm) full fine-tuned in the compute
dtype, on eager attention or on SDPA, which runs its math backend here (activations/sdpa_math.py), replayed request by
request as transformers 5.17-5.23 models/falcon/modeling_falcon.py and torch 2.11-2.13 make them.

Why the layer has its own sequence: the ledger's kept tensors alone, made one after another (reserved_layers.made),
leave out what Falcon's layer makes and frees around them, and the caching allocator's segments follow from those
transients. Before, the replay of the four H200 runs (tests/data/measured/gpu/falcon-7b-8layers-bf16-*) made 135 to 181
segments where the GPU made 66 to 112: every hidden-sized tensor (18, 20 and 72 MiB segments at s 2048) got a
segment of its own, where on the GPU they are cut from the score-sized blocks the layer's transients leave cached
(22 segments of the 568 MiB scores against the replay's 15; the reserved peak 7-14% over). The fake-tensor
harness's sequence of the same runs (validation/allocator_trace.py, transformers' own code) replays within 0.5% of
max_memory_reserved; the requests below are that sequence's, by the source lines that make them:

Forward (FalconDecoderLayer.forward; FalconAttention.forward):
- input_layernorm: its output (kept: both branches read it), mean and rstd (kept);
- query_key_value: the fused output (b, s, (a + 2) d), alive until the attention returns (the local `fused_qkv`
  holds it: query is a view of it, `_split_heads` multi_query branch);
- key and value by advanced indexing (`fused_qkv[..., [-2], :]`): copies, the key's freed once rotated, the
  value kept; `query.transpose(1, 2).reshape(...)` keeps the shape: a view;
- apply_rotary_pos_emb: `q * cos`, rotate_half's `-x2` (half the width) and `torch.cat`, `* sin`, the sum (kept);
  the same on k;
- eager: `query @ key^T` (one score tensor), `/=` in place, `+ attention_mask` (a second), softmax in the compute
  dtype (`dtype=hidden_states.dtype`: kept), the sum and the product freed; `scores @ value` and the
  view-permute-reshape's copy (kept: dense's input), the product freed;
- SDPA's math backend (aten/src/ATen/native/transformers/attention.cpp _scaled_dot_product_attention_math, as the
  H200 ran it: validation/core/emulation.py `_masked_math_sdpa`): the additive mask (b, 1, s, s) in q's dtype, q,
  k, v upcast to fp32 (v kept), q and k^T scaled by sqrt(scale) (kept), the fp32 scores, _safe_softmax's
  temporaries (a bool of the scores' shape, its rows' all(), a scalar) and its fp32 output (kept), the scores freed,
  the weights cast back (dropped), the fp32 output and its cast back; the upcasts, the weights and the mask freed as
  the function returns; `transpose(1, 2).reshape(...)`'s copy (kept: dense's input);
- dense: its output; `fused_qkv`, the rotated q and k and the value copy (SDPA's math path keeps its own copies)
  freed as the attention returns;
- the MLP (dense_h_to_4h, GELU, dense_4h_to_h: the first two outputs kept), `mlp_output += attention_output` in place,
  dropout_add: native_dropout's mask (kept) and output where config.hidden_dropout > 0, `residual + out` (the
  layer's output: the next layer's input, kept by its norm), the attention's and the MLP's outputs freed.
Backward (autograd's order, each node freeing its saved tensors and its input gradient once it has made its own:
torch/csrc/autograd/engine.cpp), from the gradient of the layer's output, which lives across the layer: the
dropout's; dense_4h_to_h's weight gradient then its input's; GELU's; dense_h_to_4h's weight and input gradients;
dense's; the reshape's copy; scores x V's (the probabilities' gradient, v's); the softmax's (CUDA's tmp, then its
output: softmax_backward.py); the division's (eager) or the fp32 path's (SDPA); QK^T's (the broadcast key's
gradient at every head, then q's, the key's summed); each upcast's; the rotary's; `_split_heads`' (a zero-filled
fused gradient per piece, summed); query_key_value's; the two norm-output gradients summed; the norm's; the residual's
sum, the layer's input gradient.
Parameter gradients (reserved_layers.gradient) in that order: the MLP's matrices from the last, dense, the fused
q, k, v, the norm's scale and shift. The index tensors of a few bytes are left out (the small pool's 2 MiB segments
hold them). At more than one sequence a micro-batch SDPA's math path keeps matmul's copies of q, k and v at every head
(the broadcast key's reshape copies, activations/sdpa_math.py) in place of the scaled q and k and the upcast v, and
its backward makes v's gradient at every head before summing it (the harness's sequence of the s1024 b2 run).
"""

from __future__ import annotations

from typing import NamedTuple

from ..spec.dtypes import bytes_per_element
from .reserved_layers import gradient, rotated


class Sizes(NamedTuple):
    """One layer's request sizes in bytes (T = s x b tokens, B the compute dtype's bytes)."""

    hidden: int  # T h B: the residual stream, the norm's output, dense's output
    stats: int  # T x 4: the norm's fp32 mean (and rstd)
    fused: int  # T (a + 2) d B: query_key_value's output
    q: int  # T a d B: q, the attention's output
    kv: int  # T d B: the one key (value) head
    scores: int  # b a s^2 B
    ffn: int  # T f B
    mask: int  # the residual dropout's bool mask, T h (0: no dropout)
    sdpa: bool  # SDPA's math backend (else eager)
    sdpa_mask: int  # b s^2 B: the additive mask in q's dtype
    row: int  # b a s: _safe_softmax's all() over each row (bool)
    elements: int  # b a s^2: _safe_softmax's bool of the -inf scores
    batched: bool  # b > 1 on SDPA's math path: matmul copies q, k and v at every head (activations/sdpa_math.py)


def program(cfg) -> Sizes | None:
    """The sizes where the replay runs Falcon's layer (module docstring), else None: transformers' multi-query Falcon
    (a fused q, k, v of one key head, parallel attention off one norm) full fine-tuned without autocast, on eager
    attention (its softmax in the compute dtype) at one sequence a micro-batch (the H200's runs; at more, matmul's
    reshape would copy the broadcast key and value to every head, which the ledger's eager entries do not count) or
    SDPA's math backend, with no attention dropout."""
    from .activations.entries import config_dropout, eager_softmax_16_bit
    from .activations.sdpa_math import falcon_math_sdpa
    arch, training = cfg.architecture, cfg.training
    sdpa = falcon_math_sdpa(arch, training)
    if not (arch.fused_qkv and arch.parallel_attention and arch.num_kv_heads == 1 and arch.norms_per_layer == 1
            and not arch.gated_mlp and not arch.is_moe and not arch.is_hybrid  # Falcon's one GELU MLP
            and training.adapter is None and not training.dropout and cfg.parallel.tp == 1
            and eager_softmax_16_bit(arch, training)
            and ((training.attention == "eager" and arch.eager_kv_broadcast and training.micro_batch_size == 1)
                 or sdpa)):
        return None
    B = bytes_per_element(training.compute_dtype)
    b, s = training.micro_batch_size, training.seq_len
    T, a, d = b * s, arch.num_attention_heads, arch.head_dim
    mask = config_dropout(arch.mlp_residual_dropout, training)
    return Sizes(T * arch.hidden_size * B, T * 4, T * (a + 2) * d * B, T * a * d * B, T * d * B, b * a * s * s * B,
                 T * arch.intermediate_size * B, T * arch.hidden_size if mask else 0, sdpa, b * s * s * B, b * a * s,
                 b * a * s * s, sdpa and b > 1)


class Kept(NamedTuple):
    """A layer's blocks kept for its backward (module docstring)."""

    input: int | None  # the layer's input (the previous layer's output; the first layer's made by it)
    norm: list  # the norm's output, mean, rstd
    attention: list  # eager: v, q, k rotated, the softmax; SDPA: v, q, k (fp32, scaled), the softmax (fp32)
    dense_input: int
    mlp: list  # dense_h_to_4h's output, GELU's
    mask: int | None


def forward(prog, z: Sizes, layer_input: int | None) -> tuple[Kept, int | None]:
    """One layer's forward (module docstring). `layer_input`: the previous layer's output, or None for the first
    layer (its input, the embedding's output, made here, as the ledger's layer entries count it). Returns what it
    keeps and its output (the next layer's input)."""
    alloc, free = prog.alloc, prog.free
    if layer_input is None:
        layer_input = alloc(z.hidden)
    norm = [alloc(z.hidden), alloc(z.stats), alloc(z.stats)]
    fused = alloc(z.fused)
    key, value = alloc(z.kv), alloc(z.kv)
    q = rotated(prog, z.q)
    k = rotated(prog, z.kv)
    free(key)
    out, attention = (_sdpa if z.sdpa else _eager)(prog, z, q, k, value)
    dense_input = alloc(z.q)
    free(out)
    dense = alloc(z.hidden)
    free(fused)
    if z.sdpa:
        free(q, k, value)
    mlp = [alloc(z.ffn), alloc(z.ffn)]
    fc2 = alloc(z.hidden)
    mask = None
    if z.mask:
        mask = alloc(z.mask)
        dropped = alloc(z.hidden)
        output = alloc(z.hidden)
        free(dropped)
    else:
        output = alloc(z.hidden)
    free(dense, fc2)
    return Kept(layer_input, norm, attention, dense_input, mlp, mask), output


def _rotary_backward(prog, n: int, grad: int) -> int:
    """The rotary's backward on one of q, k: the sum's gradient through `* sin`, the cat and the negation, and
    `* cos`, summed; `grad` freed once read."""
    alloc, free = prog.alloc, prog.free
    first = alloc(n)
    half = alloc(n / 2)
    cat = alloc(n)
    free(half)
    second = alloc(n)
    free(first)
    third = alloc(n)
    free(cat, second)
    fourth = alloc(n)
    free(grad)
    total = alloc(n)
    free(third, fourth)
    return total


def backward(prog, z: Sizes, kept: Kept, tensors, index: int, grads: dict, carry: int | None) -> tuple[int, int]:
    """One layer's backward (module docstring). `tensors`: the layer's parameters (reserved_tensors: the fused
    q, k, v, dense, the norm's two, the MLP's two), ending at `index`; `carry`: the gradient of the layer's
    output (None: the last layer's, made here). Returns the index of the layer's first parameter and the gradient
    of its input."""
    alloc, free = prog.alloc, prog.free
    first = index - len(tensors)
    matrices = [first + j for j, t in enumerate(tensors) if t.matrix]
    vectors = [first + j for j, t in enumerate(tensors) if not t.matrix]
    grad_of = {first + j: t.grad for j, t in enumerate(tensors)}
    fc2_w, fc1_w, dense_w, qkv_w = matrices[::-1]
    if carry is None:
        carry = alloc(z.hidden)
    branch = carry
    if z.mask:  # native_dropout_backward: a new tensor, the mask released
        branch = alloc(z.hidden)
        free(kept.mask)
    fc1_out, gelu_out = kept.mlp
    gradient(prog, grads, fc2_w, grad_of[fc2_w])
    g = alloc(z.ffn)
    free(gelu_out)
    g2 = alloc(z.ffn)
    free(g, fc1_out)
    gradient(prog, grads, fc1_w, grad_of[fc1_w])
    g_mlp = alloc(z.hidden)
    free(g2)
    gradient(prog, grads, dense_w, grad_of[dense_w])
    g_dense = alloc(z.q)
    free(kept.dense_input)
    if branch is not carry:
        free(branch)
    g_v, g_k, g_q = (_sdpa_backward if z.sdpa else _eager_backward)(prog, z, kept.attention, g_dense)
    g_k = _rotary_backward(prog, z.kv, g_k)
    g_q = _rotary_backward(prog, z.q, g_q)
    g_fused = _split_backward(prog, z.fused, g_v, g_k, g_q)
    gradient(prog, grads, qkv_w, grad_of[qkv_w])
    g_attn = alloc(z.hidden)
    free(g_fused)
    norm_out, mean, rstd = kept.norm
    free(norm_out)
    g_norm = alloc(z.hidden)
    free(g_mlp, g_attn)
    g_in = alloc(z.hidden)
    for v in vectors:
        gradient(prog, grads, v, grad_of[v])
    free(g_norm, kept.input, mean, rstd)
    total = alloc(z.hidden)  # the residual's and the norm's gradients of the input, summed
    free(carry, g_in)
    return first, total


def _split_backward(prog, n: int, g_v: int, g_k: int, g_q: int) -> int:
    """`_split_heads`' backward: each piece's gradient into a zero-filled fused gradient (index's backward for v and
    k, the slice's for q), summed as they arrive."""
    alloc, free = prog.alloc, prog.free
    zeros = alloc(n)
    v = alloc(n)
    free(zeros, g_v)
    zeros = alloc(n)
    k = alloc(n)
    free(zeros, g_k)
    total = alloc(n)
    free(v, k)
    q = alloc(n)
    free(g_q)
    fused = alloc(n)
    free(total, q)
    return fused


def _eager(prog, z: Sizes, q: int, k: int, value: int) -> tuple[int, list]:
    """Eager attention (module docstring): returns scores x V's output and what it keeps (v, q, k, the softmax)."""
    alloc, free = prog.alloc, prog.free
    product, masked = alloc(z.scores), alloc(z.scores)
    softmax = alloc(z.scores)
    free(masked, product)
    return alloc(z.q), [value, q, k, softmax]


def _sdpa(prog, z: Sizes, q: int, k: int, value: int) -> tuple[int, list]:
    """SDPA's math backend (module docstring): returns its output (cast back) and what it keeps (v, q, k in fp32, the
    fp32 softmax); the rotated q and k and the value copy are freed by the caller as the attention returns."""
    alloc, free = prog.alloc, prog.free
    bias = alloc(z.sdpa_mask)
    q32, k32, v32 = alloc(2 * z.q), alloc(2 * z.kv), alloc(2 * z.kv)
    qs, ks = alloc(2 * z.q), alloc(2 * z.kv)
    if z.batched:  # matmul's reshape of the broadcast key to every head copies q and k (kept, not qs and ks)
        qs_kept, ks_kept = alloc(2 * z.q), alloc(2 * z.q)
    scores = alloc(2 * z.scores)
    if z.batched:
        free(ks)
        ks = ks_kept
    temporaries = [alloc(z.elements), alloc(z.row), alloc(4)]
    softmax = alloc(2 * z.scores)
    free(*reversed(temporaries), scores)
    weights = alloc(z.scores)
    v_kept = alloc(2 * z.q) if z.batched else v32  # and v for scores x V
    out32 = alloc(2 * z.q)
    out = alloc(z.q)
    free(out32, k32, q32, weights, bias)
    if z.batched:
        free(v32, qs)
        qs = qs_kept
    return out, [v_kept, qs, ks, softmax]


def _eager_backward(prog, z: Sizes, kept: list, g_dense: int) -> tuple[int, int, int]:
    """Eager attention's backward from the output's gradient (module docstring): returns v's, k's and q's."""
    alloc, free = prog.alloc, prog.free
    value, q, k, softmax = kept
    g_view = alloc(z.q)
    g_probs = alloc(z.scores)
    free(g_dense, value)
    g_v = alloc(z.kv)
    free(g_view)
    tmp = alloc(z.scores)
    g_softmax = alloc(z.scores)
    free(tmp, g_probs, softmax)
    g_scores = alloc(z.scores)  # the in-place division's
    free(g_softmax)
    g_k_all, g_q = alloc(z.q), alloc(z.q)  # the broadcast key's at every head, q's
    free(g_scores)
    g_k = alloc(z.kv)
    free(g_k_all, k, q)
    return g_v, g_k, g_q


def _sdpa_backward(prog, z: Sizes, kept: list, g_dense: int) -> tuple[int, int, int]:
    """SDPA's math backend's backward from the output's gradient (module docstring): returns v's, k's and q's in
    the compute dtype."""
    alloc, free = prog.alloc, prog.free
    v32, qs, ks, softmax = kept
    g32 = alloc(2 * z.q)  # the output's cast back
    free(g_dense)
    g_out = alloc(2 * z.q)
    if z.batched:  # v's gradient at every head first, summed to its one head once the probabilities' is made
        free(g32)
        g_v_all = alloc(2 * z.q)
        g_probs = alloc(2 * z.scores)
        free(g_out, v32)
        g_v = alloc(2 * z.kv)
        free(g_v_all)
    else:
        g_probs = alloc(2 * z.scores)
        free(g32, v32)
        g_v = alloc(2 * z.kv)
        free(g_out)
    tmp = alloc(2 * z.scores)
    g_scores = alloc(2 * z.scores)
    free(tmp, g_probs, softmax)
    g_k, g_q = alloc(2 * z.q), alloc(2 * z.q)
    free(g_scores, ks, qs)
    g_k1 = alloc(2 * z.kv)
    free(g_k)
    g_k2 = alloc(2 * z.kv)  # k's scaling
    free(g_k1)
    g_q2 = alloc(2 * z.q)  # q's scaling
    free(g_q)
    out = []
    for size, grad in ((z.kv, g_v), (z.kv, g_k2), (z.q, g_q2)):  # the upcasts' backward, each freeing its input
        out.append(alloc(size))
        free(grad)
    return tuple(out)
