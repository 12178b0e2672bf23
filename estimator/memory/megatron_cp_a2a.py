"""Context parallelism by TransformerEngine's all-to-all (Megatron-LM's --cp-comm-type a2a, the Ulysses scheme) in
the Megatron replay (megatron_replay.py): the attention's requests in their order, on the stream that makes each.

TransformerEngine v2.11 (transformer_engine/pytorch/attention/dot_product_attention/context_parallel.py) runs a
layer's attention through `AttnFuncWithCPAndQKVOA2A`:
- forward: `flash_attn_a2a_communicate([q, k, v], before_attn=True)` makes, tensor by tensor, the input's
  contiguous head-split copy (`movedim(-3, 0).contiguous()`) and the all-to-all's output (`torch.empty_like`) on
  the current stream, then on TE's CP stream (`with torch.cuda.stream(cp_stream)`) the output's sequence chunks
  reordered (`reorder_seq_chunks_for_a2a_before_attn`: torch.compile'd by TE's jit_fuser, pytorch/jit.py, one
  result), the all-to-all's output then dropped; the inputs' copies die as it returns. The attention (fused or
  flash) makes its output, then the softmax statistics; the output goes back the same way (`before_attn=False`:
  the reorder on the current stream first, the all-to-all's output, the result made on the CP stream). Kept for
  backward: the reordered q, k and v (CP stream), the attention's output before the all-to-all and its statistics
  (current stream); the output projection keeps the result (CP stream). The rotary embedding's q and k and the
  QKV projection's output (v a view of it) die as the attention module returns (Megatron-Core's linear_qkv keeps
  its input, the fused rotary embedding nothing).
- backward: the output's gradient through `flash_attn_a2a_communicate(before_attn=True)` alike, the attention's
  backward making dq, dk, dv (`torch.empty_like`, or the fused backward's own) on the current stream, and those
  three back through `before_attn=False`: their results on the CP stream.
Each stream keeps its own cached blocks (allocator.py): what the CP stream frees only its requests reuse.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..spec.dtypes import bytes_per_element
from .activations.entries import tokens_per_gpu

CP_STREAM = 1  # TE's cp_stream; 0 is the current stream
ROPE = "q and k after the rotary embedding"  # activations/attention.py's Megatron flash entries
QKV = "QKV projection output (v is a view of it)"
OUTPUT = "attention output (output projection input)"


@dataclass(frozen=True)
class Plan:
    """Where a layer's attention sits among its requests (`qkv`, `rope`, `output`: indexes of those entries'
    requests) and the bytes of its q, k, v and output on this GPU."""
    qkv: int
    rope: int
    output: int
    q: float
    k: float
    v: float

    @property
    def kept_output(self) -> int:
        """The index, in `forward`'s blocks, of the output projection's input (the all-to-all's result)."""
        return self.output + 2


def plan(cfg, shared, kind: str) -> Plan | None:
    """The layer's plan, or None where its ledger has no such attention (or CP is off)."""
    from .activations.recompute import dropped
    from .reserved import _requests, _sizes

    if cfg.parallel.cp == 1:
        return None
    entries = [e for e in shared.entries[kind] if not dropped(e, shared.recomputed)]
    names = [e.name for e in entries]
    if not {QKV, ROPE, OUTPUT} <= set(names) or not names.index(QKV) < names.index(ROPE) < names.index(OUTPUT):
        return None
    at = [len(_requests(_sizes(entries[:names.index(name)], shared.parallel))) for name in (QKV, ROPE, OUTPUT)]
    arch, par = cfg.architecture, cfg.parallel
    each = tokens_per_gpu(cfg.training, par) * bytes_per_element(cfg.training.compute_dtype) / par.tp
    return Plan(*at, q=each * arch.q_width, k=each * arch.kv_width, v=each * arch.kv_width)


def forward(program, sizes: list, p: Plan) -> list:
    """The layer's forward requests (`sizes`, the ledger's); its blocks kept for backward, in order: the ledger's
    before the rotary embedding but the QKV projection's output, the reordered q, k, v, the attention's output and
    what the ledger has up to the output projection's input, that input (the all-to-all's result), the rest."""
    before = program.many(sizes[:p.rope])
    rotary = [program.alloc(p.q), program.alloc(p.k)]  # the fused rotary embedding's q and k
    qkv = _a2a(program, [p.q, p.k, p.v], into_attention=True)
    attention = [program.alloc(p.q)]  # the attention's output (heads split, the whole sequence)
    attention += program.many(sizes[p.rope + 1:p.output])  # its softmax statistics
    result = _a2a(program, [p.q], into_attention=False)
    program.free(*rotary, before.pop(p.qkv))  # as the attention module returns
    return before + qkv + attention + result + program.many(sizes[p.output + 1:])


def backward(program, held: list, p: Plan) -> None:
    """From the output projection's backward to the attention's end: `held` (forward's blocks, up to the output
    projection's input) loses what the attention keeps."""
    grad = program.alloc(p.q)  # the output projection's input gradient
    program.free(held.pop())  # the output projection's saved input
    into = _a2a(program, [p.q], into_attention=True)
    grads = [program.alloc(n) for n in (p.q, p.k, p.v)]  # dq, dk, dv
    out = _a2a(program, [p.q, p.k, p.v], into_attention=False)
    program.free(*grads, *into)  # as TE's backward returns
    while len(held) > p.rope - 1:  # the attention's saved tensors (from the reordered q), released by its node
        program.free(held.pop())
    # the output's gradient as the node returns; dq, dk, dv as the rotary embedding's and linear_qkv's backward take
    # them (the replay makes no activation gradient beyond the attention's)
    program.free(grad, *out)


def _a2a(program, sizes: list, into_attention: bool) -> list:
    """`flash_attn_a2a_communicate` over tensors of `sizes` bytes: its results (CP stream), in order."""
    count = len(sizes)
    inputs, outputs, results = [], [], []

    def result(i: int) -> None:  # on the CP stream: the all-to-all's output reordered into its result
        results.append(program.alloc(sizes[i], CP_STREAM))
        program.free(outputs[i])

    for i in range(count + 2):
        if 0 < i <= count:
            outputs.append(program.alloc(sizes[i - 1]))  # torch.empty_like: the all-to-all's output
        if i > 1 and into_attention:
            result(i - 2)
        if i < count:
            inputs.append(program.alloc(sizes[i]))  # the input's contiguous (after attention: reordered) copy
        if i > 1 and not into_attention:
            result(i - 2)
    program.free(*inputs)  # the function's list of inputs dies as it returns
    return results
