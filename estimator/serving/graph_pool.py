"""vLLM's CUDA-graph pool, replayed through the caching allocator: the segments a capture reserves, not only the
tensors it holds at once.

What a capture's memory reading sees (vLLM v1/worker/gpu_model_runner.py profile_cudagraph_memory and
capture_model, 0.19.0 to 0.33.0: torch.cuda.mem_get_info before and after): the device's free memory, so every
segment the caching allocator cudaMalloc'd in between, whether its blocks are live or not (segments go back only by
empty_cache). Where the allocations go (PyTorch c10/cuda/CUDACachingAllocator.cpp, Note [Interaction with CUDA graph
capture]; torch/cuda/graphs.py graph.__enter__):

- During a capture (torch.cuda.graph(pool=...) around each piece, compilation/cuda_graph.py), the capture stream's
  requests come from the graph's private pool, one pool for every graph (get_global_graph_pool; the profiler's own
  graph_pool_handle), with the usual size classes (estimator/memory/allocator.py: 1-10 MiB requests split a 20 MiB
  segment, >= 10 MiB ones their own, <= 1 MiB ones a 2 MiB small segment). "Within the private pool, allocations are
  freed and reassigned as usual during capture": a block freed with no other stream's use goes straight back to
  the pool's free list (`free` -> `free_block`; only blocks with recorded stream uses wait for events, deferred
  until no capture is under way), whether freed inside a piece's capture or between pieces.
- torch.cuda.graph.__enter__ calls torch.cuda.empty_cache() (read in the installed torch 2.13; 2.10, which vLLM
  0.19.0 pins, was not read), which returns every free segment of the default pools; vLLM patches it to a no-op for
  every piece but the first of a forward (compilation/cuda_graph.py: gc_disable, "we only run gc for the first
  graph"). So the eager warm-up run before a capture (_warmup_and_capture: cudagraph_num_of_warmups = 1,
  config/vllm.py) leaves nothing behind; what the capture run allocates outside the graphs after its first piece
  takes new segments of the capture stream that stay: _dummy_run's logit indices (int64) and, after the forward on
  the last pipeline stage, ``hidden_states[logit_indices_device]`` (one row per request, min(tokens, max_num_seqs)
  rows); the eager attention's small tensors between pieces share the small segment.
- Expandable segments are off: PyTorch's default, which vLLM leaves (its sleep-mode allocator,
  device_allocator/cumem.py, asserts expandable_segments:True is not set); the replay uses the default segments.

The sequence replayed per layer is what inductor's generated code for vLLM 0.19's Llama pieces allocates and frees
(validation/vllm/piece_allocations.py prints it: torch 2.13's inductor, the pieces of validation/vllm/piece_kernels.py
with the token dimension a symbol as vLLM compiles them, or fixed at 512: the same lines; buffers it reuses in place,
``buf5 = buf2; del buf2  # reuse``, take no new request; tests/test_serving_cuda_graphs.py holds the replay to it).
A piece's inputs stay allocated through it (the split module's caller holds them) and its outputs are ordinary
tensors of the pool until the split module drops them after their last use (torch.fx: a value is set to None after
its last user):
- the first piece (embedding, or a later stage's received hidden states and residual added): the residual h, the
  normed input, reused as q, the qkv projection (q + 2kv) and k after rotary (kv), then the attention's output
  buffer (o); every layer's q, k and qkv (v is a view of it) are freed after its attention call;
- a layer's MLP piece: the o_proj output h (reused as the attention's next output buffer), the normed input h
  (reused for the down projection and as the new residual), the gate-up output 2I, the SiLU-and-mul output I, the
  gate-up and activation freed after use, then the next layer's normed input (reused as q), qkv and k; the previous
  output buffer and residual are freed after the piece; the last piece frees all (its output is a weak reference:
  cuda_graph.py weak_ref_output).
A routed MoE layer's piece keeps only the boundary tensors here (its fused_moe buffers come from the worker's
workspace from 0.15; cuda_graphs.py). The FULL capture runs the same pieces in one graph, after the PIECEWISE ones
in the same pool (gpu_model_runner.py profiles PIECEWISE then FULL; capture_model captures every PIECEWISE size
then every FULL one, largest first), and FlashAttention 3 allocates per layer softmax_lse [heads, T], out_accum
[splits, heads, T, head_dim] and softmax_lse_accum [splits, heads, T], fp32 (hopper/flash_api.cpp mha_fwd, commit
000090d0), freed after the call.
At TP > 1 the MLP piece's two all-reduces are replayed out of place (_reduced_layer: vLLM's all_reduce custom op,
whose output the op requests from the pool; the first piece's embedding all-reduce takes the same sizes as TP 1's
residual and normed input). At 512 and 496 tokens this leaves every published TP 2 / 4 sample's pool as it was
(the extra h requests fit the 20 MiB segments' free blocks). Not replayed: FlashInfer's fused all-reduce + RMSNorm
(AllReduceFusionPass, on at TP 2 for every capture size on sm90 and at TP 4 up to 256 tokens for an h of 4,096:
allreduce_fusion.py; its AllReduceFusedAddRMSNormPattern writes the norm into the all-reduce's input and the residual
in place, norm_out=None, so a piece asks for one h fewer, and a clone of the residual it takes as an input: tried by
hand, the same segments at these sizes), and other models' own piece code (qkv bias, q/k norms, Gemma's extra
norms): each model's widths go through the Llama piece's sequence.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..memory.allocator import CachingAllocator
from ..spec.architecture import Architecture
from .kv_cache import kv_heads_per_rank

INDEX_BYTES = 8  # logit_indices_device: int64 (np.cumsum of the scheduled tokens, moved to the device)


@dataclass(frozen=True)
class Widths:
    hidden: int
    q: int  # a rank's query width
    kv: int  # a rank's key (and value) width, or MLA's latent + rope key
    out: int  # the attention's output width a rank
    dtype_bytes: int


def widths(arch: Architecture, tp: int, act_bytes: int) -> Widths:
    kv = kv_heads_per_rank(arch, tp) * arch.head_dim if not arch.uses_mla else arch.kv_lora_rank + arch.qk_rope_head_dim
    return Widths(arch.hidden_size, arch.q_width // tp, kv, arch.attention_output_width // tp, act_bytes)


def _intermediate(arch: Architecture, tp: int, layer: int) -> int:
    """A dense layer's MLP width a rank; 0 for a routed MoE layer (its piece is taken at the boundary tensors)."""
    return 0 if arch.is_moe_layer(layer) or not arch.intermediate_size else arch.intermediate_size // tp


def forward(pool: CachingAllocator, arch: Architecture, w: Widths, tp: int, tokens: int, layers: range,
            last: bool, accumulators: tuple[int, ...] = (), reduced: bool | None = None) -> None:
    """One captured forward of `tokens` tokens through the stage's `layers` (module docstring); `accumulators`: the
    bytes the attention allocates and frees in each layer inside the graph (FA3's split-KV buffers in a FULL graph);
    `reduced`: the pieces' all-reduces (TP > 1 by default: _reduced_layer)."""
    reduced = tp > 1 if reduced is None else reduced
    malloc, free = pool.malloc, pool.free

    def take(width: int) -> int:
        return malloc(tokens * width * w.dtype_bytes)

    def attention_inputs(then: int | None = None) -> tuple[int, int, int]:
        """The normed input, the qkv projection, q (the normed buffer itself where the widths match) and k; `then`:
        a block whose last use is the norm's kernel, freed after it."""
        normed = take(w.hidden)
        if then is not None:
            free(then)
        qkv = take(w.q + 2 * w.kv)
        if w.q != w.hidden:
            free(normed)
            normed = take(w.q)
        return normed, qkv, take(w.kv)

    residual = take(w.hidden)
    q, qkv, k = attention_inputs()
    out = take(w.out)
    for i, layer in enumerate(layers):
        for block in [malloc(size) for size in accumulators]:
            free(block)
        for block in (q, k, qkv):  # the attention call was their last use
            free(block)
        if reduced:
            nxt = _reduced_layer(free, take, w, _intermediate(arch, tp, layer), i == len(layers) - 1)
            free(out)  # the caller's output buffer and residual of the layer before, dropped after the piece
            free(residual)
            if nxt is not None:
                q, qkv, k, out, residual = nxt
            continue
        o_proj, normed = take(w.hidden), take(w.hidden)
        inter = _intermediate(arch, tp, layer)
        if inter:
            gate_up = take(2 * inter)
            act = take(inter)
            free(gate_up)
            free(act)
        if i < len(layers) - 1:
            # the o_proj output becomes the next output buffer where the widths match (inductor's reuse), else it
            # is freed after the residual's kernel and the buffer is a new request at the piece's end
            reuse = w.out == w.hidden
            q, qkv, k = attention_inputs(None if reuse else o_proj)
            if not reuse:
                o_proj = take(w.out)
            free(out)
            free(residual)
            out, residual = o_proj, normed
        else:
            for block in ((o_proj, normed) if last else (normed, o_proj)) + (out, residual):
                free(block)


def _reduced_layer(free, take, w: Widths, inter: int, last_layer: bool) -> tuple[int, ...] | None:
    """A TP > 1 layer's MLP piece (validation/vllm/piece_allocations.py --piece middle_tp: vLLM's all_reduce custom
    op, out of place, parallel_state.py all_reduce_fake = torch.empty_like, a fallback kernel in inductor's code whose
    output the op itself requests; custom_all_reduce.py all_reduce and pynccl's all_reduce take torch.empty_like(inp)
    too). The o_proj output is all-reduced into a new h (the residual, the add written in place), the o_proj buffer
    is reused for the normed input, the down projection and the next normed input, and the down projection is
    all-reduced into another new h (the next residual). Returns the next layer's q, qkv, k, output buffer and
    residual, or None after the last layer (the final norm written into the second output, a weak reference)."""
    o_proj, reduced = take(w.hidden), take(w.hidden)
    if inter:
        gate_up = take(2 * inter)
        act = take(inter)
        free(gate_up)
        free(act)
    following = take(w.hidden)
    if last_layer:  # the down projection's buffer after its all-reduce, the first output after the final add, then
        for block in (o_proj, reduced, following):  # the final norm's output (the second one, a weak reference)
            free(block)
        return None
    reuse = w.out == w.hidden  # the first output becomes the next attention output buffer where the widths match
    if not reuse:
        free(reduced)  # its last use: the add into the second all-reduce's output
    q = o_proj  # the normed input, reused as q where the widths match
    qkv = take(w.q + 2 * w.kv)
    if w.q != w.hidden:
        free(o_proj)
        q = take(w.q)
    k = take(w.kv)
    return q, qkv, k, reduced if reuse else take(w.out), following


def fa3_accumulators(arch: Architecture, tp: int, tokens: int, splits: int) -> tuple[int, ...]:
    """softmax_lse, out_accum and softmax_lse_accum of one FA3 call with `splits` splits (fp32)."""
    heads = arch.num_attention_heads // tp
    return (heads * tokens * 4, splits * heads * tokens * arch.head_dim * 4, splits * heads * tokens * 4)


@dataclass(frozen=True)
class PoolReplay:
    piecewise: int  # the pool's reserved bytes after the PIECEWISE captures of the two largest sizes
    full: int  # what the FULL capture of the largest FULL size adds to it (new segments)
    live: int  # the most the PIECEWISE captures hold at once (the pool's allocated peak)
    stream: int  # the capture stream's segments after the capture run's first piece (the last stage's gather)
    stream_held: int  # the same after capture_model's last capture (one row: size 1)


def replay(arch: Architecture, tp: int, act_bytes: int, sizes: tuple[int, ...], full_sizes: tuple[int, ...],
           layers: range, last: bool, max_num_seqs: int, accumulators: tuple[int, ...]) -> PoolReplay:
    """The pool through profile_cudagraph_memory's captures (PIECEWISE: the largest size, then the second; FULL: the
    largest, with `accumulators` in each layer), and the capture stream's segments after the first piece; remembered
    per architecture (a serve plan's layouts ask for the same stages again and again)."""
    key = ("graph pool", tp, act_bytes, sizes[-2:], full_sizes[-1:], layers.start, layers.stop, last, max_num_seqs,
           accumulators)
    return arch.cached(key, lambda: _replay(arch, tp, act_bytes, sizes, full_sizes, layers, last, max_num_seqs,
                                            accumulators))


def _replay(arch: Architecture, tp: int, act_bytes: int, sizes: tuple[int, ...], full_sizes: tuple[int, ...],
            layers: range, last: bool, max_num_seqs: int, accumulators: tuple[int, ...]) -> PoolReplay:
    w = widths(arch, tp, act_bytes)
    pool = CachingAllocator()
    for tokens in sizes[-1:-3:-1]:
        forward(pool, arch, w, tp, tokens, layers, last)
    piecewise, live = pool.reserved, pool.allocated_peak
    if full_sizes:
        forward(pool, arch, w, tp, full_sizes[-1], layers, last, accumulators)
    return PoolReplay(piecewise, pool.reserved - piecewise, live, _stream(w, sizes[-1], max_num_seqs, last),
                      _stream(w, 1, max_num_seqs, last))


def _stream(w: Widths, tokens: int, max_num_seqs: int, last: bool) -> int:
    """_dummy_run's allocations after the forward, on a capture stream whose free segments the first piece's
    empty_cache returned: the logit indices, and on the last stage the hidden states' rows they pick."""
    rows = min(tokens, max_num_seqs)
    stream = CachingAllocator()
    stream.malloc(rows * INDEX_BYTES)
    if last:
        stream.malloc(rows * w.hidden * w.dtype_bytes)
    return stream.reserved
