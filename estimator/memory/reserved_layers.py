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
    before the softmax's (the ledger's freed_entries); the softmax's own tensors are the core's."""

    sizes: list[int]
    core: Core | None
    first: tuple[bool, ...] = ()
    scan: Scan | None = None  # a Mamba-2 scan's broadcast products on transformers 5.17's fallback (reserved_mamba)


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
    if at is None:
        return Layer(sizes, None, (), products)
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
    return Layer(sizes, core, first, products)


def layers_by_kind(cfg, shared, kinds) -> dict[str, Layer]:
    """Each of `kinds`' requests and eager attention's scores among them (`layer`)."""
    return {kind: layer(cfg, shared, kind) for kind in set(kinds)}


def made(prog, layer: Layer) -> list[int]:
    """A layer's kept tensors, made in order. Eager attention's scores (module docstring) pass through three
    compute-dtype tensors, each freed once the next exists, and the fp32 copy that softmax makes of its input
    (`at::softmax` with a dtype casts first), freed once the softmax exists; the softmax is kept, with its cast
    back (as recorded: tests/data/measured/allocator), or, with dropout, the dropout's mask and output (ATen
    Dropout.cu dropout_cuda: the mask made first), the cast freed once they exist."""
    core, sizes, products = layer.core, layer.sizes, layer.scan
    if products is not None and (core is None or products.start > core.at):
        return scan_made(prog, sizes, products)  # eager attention's scores made as plain requests
    if core is None:
        return prog.many(sizes)
    at = core.at
    out = prog.many(sizes[:at - core.capped])
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
        return out + prog.many(sizes[at + 2:])
    out += prog.many(sizes[at + 1:at + 3])  # the mask, the output
    prog.free(cast)
    return out + prog.many(sizes[at + 3:])


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
