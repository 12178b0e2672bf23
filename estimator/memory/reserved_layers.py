"""A layer's requests in the allocator replay (reserved.py), a parameter's gradient, and transformers' eager
attention among a layer's requests: the scores its forward makes and frees, and the backward through its softmax
(and dropout) in autograd's order.

transformers 5.23 models/llama/modeling_llama.py eager_attention_forward (the other decoders' alike; Gemma 2's
soft-caps the scaled scores first, `/ softcap`, tanh, `* softcap`, modeling_gemma2.py):
    attn_weights = matmul(q, repeat_kv(k)^T) * scaling; attn_weights = attn_weights + mask
    attn_weights = softmax(attn_weights, dim=-1, dtype=float32).to(q.dtype)
    attn_weights = dropout(attn_weights, p); attn_output = matmul(attn_weights, repeat_kv(v))
Its backward runs, node by node, each freeing its saved tensors and its input gradient once it has made its own
(torch 2.13 torch/csrc/autograd/engine.cpp evaluate_function, release_variables): scores x V's (the probabilities'
gradient, and v's), the dropout's (native_dropout_backward: a new tensor, the mask freed), the cast's (to fp32),
the softmax's (_softmax_backward_data: its output, then CUDA's `tmp = grad * output` inside the kernel,
softmax_backward.py), the upcast's (back to the compute dtype), the scaling's, QK^T's (q's and k's gradients).
Full recompute under the HF Trainer (torch 2.13 torch/utils/checkpoint.py, use_reentrant=False, transformers 5.23
modeling_utils.py `_activation_checkpointing_enable`'s default) reruns the layer's forward at its first unpacked tensor
and hands each recomputed saved tensor to its node once (`unpack_hook` drops the frame's handle), so the
recomputed layer frees its tensors in the same order as a kept one. The sizes are the ledger's (the layer's
entries, CUDA's temporary: softmax_backward.temporary_entry) and the tensors it frees before the softmax's
backward are the ledger's too (softmax_backward.freed_entries), so the replay's moment is the ledger's.
"""

from __future__ import annotations

from typing import NamedTuple

from .reserved_mamba import Scan, made as scan_made, scan as mamba_scan
from .activations.attention import (DROPOUT_MASK, DROPOUT_OUTPUT, EAGER_SOFTMAX_FP32, QK_T_INPUTS, SCORES_V_INPUT,
                                    SOFTCAP_OUTPUT, SOFTMAX_CAST)


class Core(NamedTuple):
    """Eager attention's scores in a layer's requests: where the fp32 softmax is, and the sizes its backward
    makes (whole bytes, as `_Program.alloc` rounds them)."""

    at: int  # the request index of the fp32 softmax; the cast (or the dropout's mask and output) follow it
    capped: bool  # Gemma 2's soft-capping (tanh) before the softmax: its output, kept, the request before it
    softmax: int  # the fp32 softmax (and each fp32 score tensor its backward makes)
    scores: int  # one score tensor in the compute dtype
    dropout: bool
    temporary: int  # CUDA's softmax-backward tmp (0: none)
    v: int  # scores x V's gradient of the expanded v
    qk: tuple[int, ...]  # QK^T's gradients of q and the expanded k


class Layer(NamedTuple):
    """What one layer of a kind keeps, as requests (`requests`), and eager attention's scores among them (None:
    none, or a softmax this path does not model). `first`: per request, whether the layer's backward frees it
    before the softmax's (the ledger's freed_entries); the softmax's own tensors are the core's. `rotary_at`, `rotary`
    and `rotary_requests`: a partial rotary embedding's temporaries before the rotated q and k (`rotation`)."""

    sizes: list[int]
    core: Core | None
    first: tuple[bool, ...] = ()
    scan: Scan | None = None  # a Mamba-2 scan's broadcast products on transformers 5.17's fallback (reserved_mamba)
    rotary_at: int = -1  # the request of the rotated q (then k), which the rotation's temporaries precede
    rotary: tuple[int, ...] = ()  # the rotated part of q and of k (`rotation`)
    rotary_requests: int = 0  # the requests of the rotated q and k (ROTARY_QK's: one)


def rotation(cfg, par, names: list[str], sizes_before) -> tuple[int, tuple[int, ...], int]:
    """A partial rotary embedding's temporaries (`Architecture.partial_rotary_factor` below 1) under a fused QKV, as
    transformers 5.23 modeling_gpt_neox.py apply_rotary_pos_emb makes them: for q, then k, the rotated slice
    (rotary_dim = head_size x rotary_pct of each head) times cos, rotate_half's `-x2` (half of it) and its cat,
    that cat times sin (the cat freed), their sum (the products freed); then torch.cat of each sum with the
    unrotated rest, the new q and k the ledger keeps (ROTARY_QK), each sum freed as its cat exists. Pythia-1.4B
    (rotary_pct 0.25) at s 4096 b 2: 8 MiB products and 4 MiB halves, whose fragments decide where the last layer's
    output lands: the recorded sequence (validation/allocator_trace.py) replays within 0.2% of the GPU, without these
    requests -11.35%; the ledger's -11.2% without them, -0.2% with them (the GPU's five fp32-logits segments, not
    four: at the last layer's end no smaller cached block holds its 32 MiB output, which splits a logits-sized
    one). Returns (`Layer.rotary_at`, `Layer.rotary`, `Layer.rotary_requests`); (-1, (), 0) where the whole head
    turns: Phi-3's rotation (the same temporaries, q's cat before k's rotation) is not modelled, its runs within 1%
    without it."""
    from .activations.attention import ROTARY_QK
    from .activations.entries import tokens_per_gpu
    from ..spec.dtypes import bytes_per_element
    arch, training = cfg.architecture, cfg.training
    if arch.partial_rotary_factor >= 1 or ROTARY_QK not in names:
        return -1, (), 0
    k = names.index(ROTARY_QK)
    if sizes_before(k + 1) == sizes_before(k):  # no request (nothing kept)
        return -1, (), 0
    rotary_dim = int(arch.head_dim * arch.partial_rotary_factor)  # GPTNeoXAttention: int(head_size * rotary_pct)
    per_head = tokens_per_gpu(training, par) * rotary_dim * bytes_per_element(training.compute_dtype)
    rotated = tuple(int(per_head * heads + 0.5) for heads in (arch.num_attention_heads, arch.num_kv_heads))
    return sizes_before(k), rotated if all(rotated) else (), sizes_before(k + 1) - sizes_before(k)


def requests(entries, par) -> list[int]:
    """The entries' bytes as the allocator's requests, one per tensor an entry stands for, rounded as
    `_Program.alloc` rounds them (half up), the empty ones left out."""
    out = []
    for e in entries:
        size = int(e.bytes(par) / e.tensors + 0.5)
        if size > 0:
            out += [size] * e.tensors
    return out


def layer(cfg, shared, kind: str) -> Layer:
    """One `kind` layer's requests, as the ledger keeps them (less what recompute drops), and its eager
    softmax: the fp32 softmax followed by its cast (no dropout) or by the dropout's mask and output."""
    from .activations.recompute import dropped
    par = shared.parallel
    entries = [e for e in shared.entries[kind] if not dropped(e, shared.recomputed)]
    names = [e.name for e in entries]
    sizes = requests(entries, par)
    products = mamba_scan(cfg, entries, lambda some: requests(some, par))
    at = next((k for k in range(len(names) - 1) if names[k] == EAGER_SOFTMAX_FP32
               and (names[k + 1] == SOFTMAX_CAST or names[k + 1:k + 3] == [DROPOUT_MASK, DROPOUT_OUTPUT])), None)
    before = lambda k: len(requests(entries[:k], par))  # noqa: E731 (the requests of the first k entries)
    extra = rotation(cfg, par, names, before)
    if at is None:
        return Layer(sizes, None, (), products, *extra)
    from .softmax_backward import freed_entries, temporary_entry
    arch, training = cfg.architecture, cfg.training
    dropout = names[at + 1] == DROPOUT_MASK
    by_name = {e.name: e for e in entries}
    temporary = temporary_entry(arch, training, par)
    at_request = len(requests(entries[:at], par))
    capped = at > 0 and names[at - 1] == SOFTCAP_OUTPUT
    core = Core(at_request, capped, sizes[at_request], requests([entries[at + (2 if dropout else 1)]], par)[0], dropout,
                requests([temporary], par)[0] if temporary else 0,
                sum(requests([by_name[SCORES_V_INPUT]], par)) if SCORES_V_INPUT in by_name else 0,
                tuple(requests([by_name[QK_T_INPUTS]], par)) if QK_T_INPUTS in by_name else ())
    freed = {e.name for e in freed_entries(arch, training, par, kind)}
    first = tuple(f for e in entries for f in [e.name in freed] * len(requests([e], par)))
    return Layer(sizes, core, first, products, *extra)


def layers_by_kind(cfg, shared, kinds) -> dict[str, Layer]:
    """Each of `kinds`' requests and eager attention's scores among them (`layer`)."""
    return {kind: layer(cfg, shared, kind) for kind in set(kinds)}


def made(prog, layer: Layer) -> list[int]:
    """A layer's kept tensors, made in order. Eager attention's scores (module docstring) pass through three
    compute-dtype tensors, each freed once the next exists, and the fp32 copy that softmax makes of its input
    (`at::softmax` with a dtype casts first), freed once the softmax exists; the softmax is kept, with its cast
    back (as recorded: tests/data/measured/allocator), or, with dropout, the dropout's mask and output (ATen
    Dropout.cu dropout_cuda: the mask made first), the cast freed once they exist. A partial rotary embedding's
    temporaries (`rotation`) come before the rotated q and k, its sums freed as those exist."""
    sizes, products = layer.sizes, layer.scan
    if products is not None and (layer.core is None or products.start > layer.core.at):
        return scan_made(prog, sizes, products)  # eager attention's scores made as plain requests
    if not layer.rotary:
        def many(a: int, b: int | None = None) -> list[int]:
            return prog.many(sizes[a:b])
    else:
        first, last = layer.rotary_at, layer.rotary_at + layer.rotary_requests - 1

        def many(a: int, b: int | None = None) -> list[int]:
            end = len(sizes) if b is None else b
            if not a <= first < end:
                return prog.many(sizes[a:end])
            out = prog.many(sizes[a:first])
            sums = [rotated(prog, size) for size in layer.rotary]
            for k in range(first, last + 1):  # the cats of q and k (the ledger's one request: both sums freed)
                out.append(prog.alloc(sizes[k]))
                prog.free(*(sums if k == last else [sums.pop(0)]))
            return out + prog.many(sizes[last + 1:end])
    return many(0) if layer.core is None else _made_core(prog, layer, many)


def rotated(prog, size: int) -> int:
    """The rotation of one of q and k (`rotation`; Falcon's whole heads, reserved_falcon.py):
    `(x * cos) + (rotate_half(x) * sin)` on its rotated slice of `size` bytes, as transformers'
    apply_rotary_pos_emb makes it; returns the sum."""
    times_cos = prog.alloc(size)
    negated = prog.alloc(size / 2)  # rotate_half: torch.cat((-x2, x1), dim=-1)
    rotated = prog.alloc(size)
    prog.free(negated)
    times_sin = prog.alloc(size)
    prog.free(rotated)
    total = prog.alloc(size)
    prog.free(times_cos, times_sin)
    return total


def _made_core(prog, layer: Layer, many) -> list[int]:
    """`made` of a layer with eager attention's scores; `many(a, b)`: its requests a to b made."""
    core, sizes = layer.core, layer.sizes
    at = core.at
    out = many(0, at - core.capped)
    softmax, scores = core.softmax, core.scores
    product = prog.alloc(scores)
    scaled = prog.alloc(scores)
    prog.free(product)
    if core.capped:  # `/ softcap`, tanh (its output kept), `* softcap`
        divided = prog.alloc(scores)
        prog.free(scaled)
        out.append(prog.alloc(sizes[at - 1]))
        prog.free(divided)
        scaled = prog.alloc(scores)
    masked = prog.alloc(scores)
    prog.free(scaled)
    upcast = prog.alloc(softmax)
    out.append(prog.alloc(softmax))
    prog.free(upcast)
    cast = prog.alloc(scores)
    prog.free(masked)
    if not core.dropout:
        out.append(cast)
        return out + many(at + 2)
    out += many(at + 1, at + 3)  # the mask, the output
    prog.free(cast)
    return out + many(at + 3)


def backward(prog, layer: Layer, held: list, copies: list, tensors, index: int, grads: dict) -> int:
    """The backward of a layer with eager attention's scores (`layer.core`): its parameters' gradients from the
    last (`gradient`), the tensors the ledger frees before the softmax's backward (and the autocast
    copies of the weights used after the core) freed in reverse order of making as backward passes the weights
    that come after the core, then the core's backward (module docstring), then the rest freed over the weights
    before the core. The core runs once the last trainable weight after it has its gradient (a frozen weight's
    backward makes none). `held`: the layer's tensors as `made` returned them; `copies`: the autocast copies,
    one per matrix of `tensors` (None: none). Returns the index of the layer's first parameter."""
    core = layer.core
    at, n = core.at - core.capped, core.capped + (2 if not core.dropout else 3)  # the core's requests
    first = [b for k, (b, f) in enumerate(zip(held, layer.first)) if f and not at <= k < at + n]
    later = [b for k, (b, f) in enumerate(zip(held, layer.first)) if not f and not at <= k < at + n]
    for t, c in zip([t for t in tensors if t.matrix], copies):
        if c is not None:
            (later if t.before_core else first).append(c)
    rev = tensors[::-1]
    boundary = max((j + 1 for j, t in enumerate(rev) if t.grad and not t.before_core), default=0)
    n_first, n_later, weights = len(first), len(later), len(rev)
    free = prog.free
    for j, t in enumerate(rev):
        if j == boundary:
            free(*reversed(first))
            _core_backward(prog, core, list(held[at:at + n]))
        index -= 1
        gradient(prog, grads, index, t.grad)
        if j < boundary:
            while len(first) > n_first * (boundary - 1 - j) // boundary:
                free(first.pop())
        else:
            while len(later) > n_later * (weights - 1 - j) // (weights - boundary):
                free(later.pop())
    if boundary == weights:  # no weight before the core (not a layer this path sees)
        free(*reversed(first))
        _core_backward(prog, core, list(held[at:at + n]))
    free(*reversed(later))
    return index


def _core_backward(prog, core: Core, kept: list) -> None:
    """Eager attention's backward from scores x V to QK^T (module docstring); `kept`: the tanh's output where
    the scores are soft-capped, the softmax, and its cast or the dropout's mask and output."""
    alloc, free = prog.alloc, prog.free
    tanh = kept.pop(0) if core.capped else None
    softmax = kept[0]
    grad = alloc(core.scores)  # scores x V's backward: the probabilities' gradient, then v's
    v = alloc(core.v)
    free(kept[-1])  # its saved probabilities
    if core.dropout:  # native_dropout_backward (masked_scale): a new tensor; the mask released
        dropped = alloc(core.scores)
        free(grad, kept[1])
        grad = dropped
    upcast = alloc(core.softmax)  # the cast's backward: the gradient in fp32
    free(grad)
    grad = alloc(core.softmax)  # _softmax_backward_data's output, then CUDA's tmp inside its kernel
    free(alloc(core.temporary))
    free(softmax, upcast)
    cast = alloc(core.scores)  # the upcast's backward, to the compute dtype
    free(grad)
    if core.capped:  # `* softcap`'s, tanh's (its output released), `/ softcap`'s
        grad = alloc(core.scores)
        free(cast)
        cast = alloc(core.scores)
        free(grad, tanh)
        grad = alloc(core.scores)
        free(cast)
        cast = grad
    scaled = alloc(core.scores)  # the scaling's (the mask's add passes the gradient on)
    free(cast)
    qk = [alloc(size) for size in core.qk]  # QK^T's
    free(scaled, *qk, v)


def gradient(prog, grads: dict, index: int, nbytes: float) -> None:
    """A parameter's gradient from its backward: kept as its .grad when it has none, else added into
    it and freed (torch/csrc/autograd/functions/accumulate_grad.h, accumulateGrad: `variable_grad +=
    new_grad` in place); a frozen weight gets none."""
    if not nbytes:
        return
    if index in grads:
        prog.transient([nbytes])
    else:
        grads[index] = prog.alloc(nbytes)
