"""Context parallelism by TransformerEngine's all-to-all (Megatron-LM's --cp-comm-type a2a, the Ulysses scheme) in
the Megatron replay (megatron_replay.py): a dense layer's requests in their order, forward and backward, on the stream
that makes each.

TransformerEngine v2.11 (transformer_engine/pytorch/attention/dot_product_attention/context_parallel.py) runs a
layer's attention through `AttnFuncWithCPAndQKVOA2A`:
- forward: `flash_attn_a2a_communicate([q, k, v], before_attn=True)` makes, tensor by tensor, the input's
  contiguous head-split copy (`movedim(-3, 0).contiguous()`) and the all-to-all's output (`torch.empty_like`) on
  the current stream, then on TE's CP stream (`with torch.cuda.stream(cp_stream)`) the output's sequence chunks
  reordered (`reorder_seq_chunks_for_a2a_before_attn`: torch.compile'd by TE's jit_fuser, pytorch/jit.py, one
  result), the all-to-all's output then dropped; the inputs' copies die as it returns. The attention (cuDNN's fused
  attention on Hopper and later: dot_product_attention/utils.py prefers it to flash) makes its output, then the
  softmax statistics; the output goes back the same way (`before_attn=False`: the reorder on the current stream
  first, the all-to-all's output, the result made on the CP stream). Kept for backward: the reordered q, k and v (CP
  stream), the attention's output before the all-to-all and its statistics (current stream); the output projection
  keeps the result (CP stream). The rotary embedding's q and k and the QKV projection's output (v a view of it) die
  as the attention module returns (Megatron-Core's linear_qkv keeps its input, the fused rotary embedding nothing);
  before the rotary embedding the query's reshape out of the split QKV output copies it (Megatron-Core 0.14/0.16
  transformer/attention.py get_query_key_value_tensors), a copy dropped once the rotary q exists.
- backward: the output's gradient through `flash_attn_a2a_communicate(before_attn=True)` alike, the attention's
  backward making dq, dk, dv (pytorch/csrc/extensions/attention.cpp fused_attn_bwd: `torch::empty`, then cuDNN's
  workspace, freed as it returns: cudnn-frontend's CompositeSDPABackwardNode, at TE v2.11's submodule 0258951d, puts
  an fp32 dQ accumulator of b x h x s x d and the fp32 softmax sum in it), and those three back through
  `before_attn=False`: their results on the CP stream. Then the rotary embedding's backward (TE FusedRoPEFunc: a
  new tensor each for k, then q: autograd runs the later node first) and TE's SplitAlongDim backward (`torch.cat` of
  the three: the QKV output's gradient).
The layer's linears, their sequence-parallel gathers and the activation gradients around them: megatron_te_linears.py.
Each stream keeps its own cached blocks (allocator.py): what the CP stream frees only its requests reuse.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..spec.dtypes import bytes_per_element
from .activations.entries import tokens_per_gpu
from .megatron_te_linears import Linears, column_backward, column_forward, linears, row_backward, row_forward

CP_STREAM = 1  # TE's cp_stream; 0 is the current stream
ROPE = "q and k after the rotary embedding"  # activations/attention.py's Megatron flash entries
QKV_INPUT = "QKV projection input"
QKV = "QKV projection output (v is a view of it)"
OUTPUT = "attention output (output projection input)"
MLP = ("MLP norm input", "fc1 input", "fc1 output (gate and up, kept by fused SwiGLU)", "fc2 input (SwiGLU output)")


@dataclass(frozen=True)
class Plan:
    """Where a layer's attention sits among its requests (`qkv`, `rope`, `output`: indexes of those entries'
    requests; the QKV projection's input just before its output, the gated MLP's four right after the attention's
    output), the bytes of its q, k, v and output on this GPU, and its hidden states' (`lin`)."""
    qkv: int
    rope: int
    output: int
    q: float
    k: float
    v: float
    lin: Linears

    @property
    def kept_output(self) -> int:
        """The index, in `forward`'s blocks, of the output projection's input (the all-to-all's result)."""
        return self.output + 2


def cp_rule(cfg) -> str | None:
    """Why a layout with context parallelism is not replayed (None: it is, or CP is off): TransformerEngine's
    all-to-all over dense decoder layers with a gated MLP and fused attention, whose requests `plan` finds. The last
    check is the walk's own (`unplanned`): a layer kind without a plan keeps the flat share, whatever the others let
    by."""
    par, arch, training = cfg.parallel, cfg.architecture, cfg.training
    if par.cp == 1:
        return None
    checks = (
        (par.cp_comm_type != "a2a", f"context parallelism by {par.cp_comm_type} (only the all-to-all's order is "
                                    "replayed: the ring's and the gathers' buffers are not)"),
        (arch.is_moe or arch.uses_mla or arch.is_hybrid or arch.qk_norm,
         "context parallelism over MoE, MLA, QK-norm or state-space layers (the all-to-all is replayed on dense "
         "layers)"),
        (not arch.gated_mlp or arch.position_embedding != "rope" or training.attention != "flash"
         or training.transformer_impl != "transformer_engine",
         "context parallelism without TransformerEngine's fused attention, rotary positions and a gated MLP (the "
         "replayed layer)"),
        (training.dropout > 0, "context parallelism with dropout (the replayed layer keeps no dropout masks)"),
    )
    why = next((why for failed, why in checks if failed), None)
    if why is None and (kinds := unplanned(cfg)):
        why = (f"context parallelism over layers whose saved tensors are not the replayed layer's ({', '.join(kinds)}: "
               "the all-to-all's requests are placed among a dense layer's QKV, rotary, attention and gated-MLP "
               "tensors)")
    return why


def unplanned(cfg, shared=None) -> list[str]:
    """The model's layer kinds without a `plan` (the walk replays the all-to-all only where it has one); `shared`:
    the stage's (memory.py's `_Shared`), else the ledger of `cfg` (stage_shared.py, remembered per architecture)."""
    if shared is None:
        from .stage_shared import _shared

        shared = _shared(cfg.architecture, cfg.training, cfg.parallel, cfg.hardware, cfg.zero_stage,
                         cfg.padded_vocab)
    return [kind for kind in sorted(set(cfg.architecture.layer_kinds())) if plan(cfg, shared, kind) is None]


def plan(cfg, shared, kind: str) -> Plan | None:
    """The layer's plan, or None where its ledger has no such layer (or CP is off)."""
    from .activations.recompute import dropped
    from .reserved_layers import requests

    if cfg.parallel.cp == 1:
        return None
    entries = [e for e in shared.entries[kind] if not dropped(e, shared.recomputed)]
    names = [e.name for e in entries]
    if not {QKV_INPUT, QKV, ROPE, OUTPUT} <= set(names) or any(e.tensors != 1 for e in entries):
        return None
    qkv, rope, output = (names.index(name) for name in (QKV, ROPE, OUTPUT))
    if not (names[qkv - 1] == QKV_INPUT and qkv < rope < output and tuple(names[output + 1:]) == MLP):
        return None
    at = [len(requests(entries[:k], shared.parallel)) for k in (qkv, rope, output)]
    if at != [qkv, rope, output]:  # an empty entry among them
        return None
    arch, par = cfg.architecture, cfg.parallel
    each = tokens_per_gpu(cfg.training, par) * bytes_per_element(cfg.training.compute_dtype) / par.tp
    return Plan(*at, q=each * arch.q_width, k=each * arch.kv_width, v=each * arch.kv_width, lin=linears(cfg))


def forward(program, sizes: list, p: Plan, carried) -> tuple[list, object]:
    """The layer's forward requests (`sizes`, the ledger's); returns its blocks kept for backward and the output
    its residual add will consume (`carried`: the last layer's, freed once this layer's input, their sum, exists).
    Kept, in order: the ledger's up to the QKV projection's output, the reordered q, k, v, the attention's output
    and what the ledger has up to the output projection's input, that input (the all-to-all's result), the MLP's."""
    lin = p.lin
    before = [program.alloc(sizes[0])]  # the residual sum: the attention norm's input
    program.free(carried)
    before += program.many(sizes[1:p.qkv - 1])
    before += column_forward(program, lin, sizes[p.qkv - 1], sizes[p.qkv])  # the QKV projection's input, output
    before += program.many(sizes[p.qkv + 1:p.rope])
    # attention.py get_query_key_value_tensors: the query's reshape out of the split QKV output copies it (its
    # strides do not merge); the fused rotary embedding (TE FusedRoPEFunc) makes q's, the copy dies, then k's
    copy = program.alloc(p.q)
    rotary = [program.alloc(p.q)]
    program.free(copy)
    rotary.append(program.alloc(p.k))
    qkv = _a2a(program, [p.q, p.k, p.v], into_attention=True)
    attention = [program.alloc(p.q)]  # the attention's output (heads split, the whole sequence)
    attention += program.many(sizes[p.rope + 1:p.output])  # its softmax statistics
    result = _a2a(program, [p.q], into_attention=False)
    program.free(*rotary, before.pop(p.qkv))  # as the attention module returns
    row = row_forward(program, lin)  # the output projection
    mlp = [program.alloc(sizes[p.output + 1])]  # the residual sum: the MLP norm's input
    program.free(row)
    mlp += column_forward(program, lin, sizes[p.output + 2], sizes[p.output + 3])  # fc1's input, output
    mlp.append(program.alloc(sizes[p.output + 4]))  # SwiGLU's output, fc2's input
    return before + qkv + attention + result + mlp, row_forward(program, lin)


def backward(program, held: list, sizes: list, p: Plan, weights: list[float], gradient) -> None:
    """The layer's backward over its kept blocks (`held`, forward's, all freed), the residual's gradient (held by
    the caller) feeding both blocks: fc2, SwiGLU and fc1, then the output projection, TE's attention, the rotary
    embedding, the QKV split and projection. `weights`: the layer's, in module order; `gradient(n)` makes one's
    gradient (megatron_replay._Walk._gradient), fc2's first."""
    lin, k, o = p.lin, p.kept_output, p.output
    mid, fc1_input, fc1, swiglu = held[k + 1:k + 5]
    rest = list(reversed(weights))

    def grads(count: int):
        return lambda: [gradient(rest.pop(0)) for _ in range(min(count, len(rest)))]

    grad = row_backward(program, lin, sizes[o + 4], grads(1))  # fc2
    program.free(swiglu)
    fc1_grad = program.alloc(sizes[o + 3])  # fused_bias_swiglu.py SwiGLUFunction.backward: one tensor
    program.free(grad, fc1)
    column_backward(program, lin, fc1_input, mid, fc1_grad, grads(1), grads(1))  # fc1, the MLP norm
    grad = row_backward(program, lin, p.q, grads(len(rest) - 1))  # the output projection (and what precedes it)
    program.free(held[k])
    into = _a2a(program, [p.q], into_attention=True)
    made = [program.alloc(n) for n in (p.q, p.k, p.v)]  # dq, dk, dv
    # cuDNN's workspace (TE extensions/attention.cpp fused_attn_bwd allocates it after dq, dk, dv; cudnn-frontend
    # CompositeSDPABackwardNode: an fp32 dQ accumulator, b x h x s x d, and the softmax sum, b x h x s, fp32)
    program.transient([2 * p.q + sum(sizes[p.rope + 1:p.output])])
    out = _a2a(program, [p.q, p.k, p.v], into_attention=False)
    program.free(*made, *into, grad)  # as TE's backward returns, then the gradient it was given
    program.free(*reversed(held[p.qkv:k]))  # the attention's saved tensors (from the reordered q)
    # the rotary embedding's backward (TE FusedRoPEFunc: a new tensor), k's node first (the later one), then q's;
    # TE's SplitAlongDim.backward cats the three gradients into the QKV output's (torch.cat: a new tensor)
    dk = program.alloc(p.k)
    program.free(out[1])
    dq = program.alloc(p.q)
    program.free(out[0])
    qkv_grad = program.alloc(sizes[p.qkv])
    program.free(dq, dk, out[2])
    column_backward(program, lin, held[p.qkv - 1], held[0], qkv_grad, grads(1), grads(len(rest)))
    program.release(held[1:p.qkv - 1])
    held.clear()


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
