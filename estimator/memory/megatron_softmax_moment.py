"""The softmax moment of a layer Megatron-Core recomputes in backward, with its own unfused attention.

Under full recompute (transformer_block.py `_checkpointed_forward`, tensor_parallel/random.py
`CheckpointFunction.backward`: `torch.enable_grad()`, then the layer's forward again from its saved input)
the recomputed layer's largest moment is not the end of its forward (every tensor it keeps) but the softmax
inside its core attention (transformer/dot_product_attention.py `DotProductAttention.forward`, Megatron-Core
0.16.1): at that moment the layer holds what it kept before the softmax (norm and QKV inputs, q and k, v, the
causal mask), the softmax's kept outputs, and two tensors that are freed afterwards:

- the QK^T scores, `matmul_result = torch.baddbmm(...)` (B*a*s^2*b/t): a new tensor (beta=0 does not write
  into the global buffer), still referenced by `attention_scores` through the softmax and scores x V;
- with the torch softmax (fusions/fused_softmax.py `FusedScaleMaskSoftmax.forward_torch_softmax`,
  `attention_softmax_in_fp32`): `input.float()`, the scores' fp32 copy (4*a*s^2*b/t), alive until the
  softmax returns its 16-bit cast. The fused kernel (`scaled_upper_triang_masked_softmax`) reads the
  16-bit scores directly and makes no copy.

The MLP's tensors do not exist yet then, so the moment exceeds the layer's full ledger where the scores
are wider than the MLP's (long sequences, few heads per GPU: TP 1). Measured: the fake-tensor harness on
Llama-3.1-8B-like layers, TP 1, 4096 tokens, unfused softmax
(tests/data/measured/megatron/llama-3.1-8b-tp1-pp1-only-s4096-b1-full-uniform1-unfused.json).

Selective recompute of the core attention (recompute_modules core_attn) reruns only the core attention in
backward and differentiates it at once: the moment is then its softmax backward, beside every kept tensor
(`selective_core_softmax_moment`; the same layers' record ...-sel-core_attn-unfused.json).
"""

from __future__ import annotations

from .activations.attention import attention_entries, megatron_fused_softmax
from .activations.entries import ATTENTION_OUTPUT, CORE, Entry, tokens_per_gpu
from .activations.recompute import recomputed_modules
from .components import Component, component, entries_component, total_bytes
from .softmax_backward import AUTOGRAD_RELEASE_SOURCE, MEGATRON_SOFTMAX_SOURCE, SOFTMAX_BACKWARD_SOURCE, \
    freed_after_softmax, softmax_parts, temporary_entry
from ..spec.architecture import Architecture
from ..spec.dtypes import bytes_per_element
from ..spec.parallel import Parallel
from ..spec.training import Training

SOFTMAX_MOMENT_SOURCE = ("Megatron-Core 0.16.1 transformer/dot_product_attention.py DotProductAttention.forward "
                         "(baddbmm scores, scale_mask_softmax), fusions/fused_softmax.py forward_torch_softmax "
                         "(input.float() with attention_softmax_in_fp32), tensor_parallel/random.py "
                         "CheckpointFunction.backward (the layer's forward rerun in backward); measured, "
                         "tests/data/measured/megatron/*-full-uniform1-unfused.json")

# what the attention keeps that is made after its softmax: the output projection's input, the dropout's
# tensors, the post-attention norm's input (attention.py `_output_entries`, `_unfused_entries`)
_AFTER_SOFTMAX = {ATTENTION_OUTPUT, "attention dropout mask", "attention dropout output", "post-attention norm input",
                  "attention residual dropout mask"}


def runs_megatron_unfused_attention(arch: Architecture, training: Training) -> bool:
    """Megatron's own DotProductAttention: the core attention of the local spec (gpt_layer_specs.py
    get_gpt_layer_local_spec, transformer_impl local), not DSA's. TransformerEngine's unfused attention
    (--attention-backend unfused under the TE spec) is TE's code, not modelled here."""
    return training.framework == "megatron" and training.transformer_impl == "local" \
        and not arch.uses_sparse_attention and not arch.is_hybrid


def softmax_transients(arch: Architecture, training: Training, par: Parallel) -> list[Entry]:
    """The tensors alive only around the softmax: the 16-bit QK^T scores and, with the torch softmax, their
    fp32 copy (module note)."""
    B = bytes_per_element(training.compute_dtype)
    scores = training.micro_batch_size * arch.num_attention_heads * (training.seq_len / par.cp) * training.seq_len
    out = [Entry("QK^T scores (baddbmm output, alive through the softmax)", scores, B, "tp", "B*a*s^2*b",
                 recompute=CORE)]
    if not megatron_fused_softmax(arch, training, par):
        out.append(Entry("fp32 copy of the scores (torch softmax input, freed when it returns)", scores, 4, "tp",
                         "4*a*s^2*b", recompute=CORE))
    return out


def recomputed_softmax_moment(arch: Architecture, training: Training, par: Parallel) -> Component | None:
    """A recomputed layer at its core attention's softmax (module note), or None where Megatron's
    DotProductAttention does not run."""
    if not runs_megatron_unfused_attention(arch, training):
        return None
    before = [e for e in attention_entries(arch, training, par) if e.name not in _AFTER_SOFTMAX]
    return entries_component("transient", "Recomputed layer at its attention softmax (kept so far, scores and "
                             "their softmax copies)", before + softmax_transients(arch, training, par), par, 1,
                             SOFTMAX_MOMENT_SOURCE)


SELECTIVE_SOURCE = ("Megatron-Core 0.16.1 transformer/attention.py Attention._checkpointed_attention_forward "
                    "(recompute_modules core_attn: tensor_parallel.checkpoint over the core attention, rerun in "
                    "backward), fusions/fused_softmax.py forward_torch_softmax; measured, tests/data/measured/megatron/"
                    "llama-3.1-8b-tp1-pp1-only-s4096-b1-sel-core_attn-unfused (the backward peak in the last layer's "
                    "recomputed softmax backward: the fp32 softmax output, the fp32 gradient of the probabilities, "
                    "_softmax_backward_data's two fp32 tensors, the causal mask and k expanded to every head beside "
                    "the kept tensors; the last layer's fc1 output, SwiGLU output, fc1 and MLP norm inputs and attention "
                    "output gone, the residual stream's, the core output's and v's 16-bit gradients alive: "
                    "validation/megatron/harness.py traced_step through validation/core/explain.py explain_trace)")


def selective_core_softmax_moment(arch: Architecture, training: Training, par: Parallel,
                                  kind: str | None = None) -> list[Component]:
    """Selective recompute of the core attention with Megatron's own unfused softmax: the ledger keeps none of
    the core's tensors; each layer's backward reruns its core attention from the checkpointed q, k, v and
    differentiates it at once, so the last layer's (the first backward reaches, beside every kept tensor) holds
    the softmax's recomputed fp32 output (kept for its backward), the causal mask made again and, with grouped KV
    heads, k expanded to every head (repeat_interleave, kept by QK^T's baddbmm), with the softmax backward's three
    fp32 tensors (`softmax_backward.softmax_parts`); the recomputed scores, their fp32 copy, the 16-bit
    probabilities and the expanded v are freed by then (scores x V's backward ran first). The last layer (of
    `kind`, the stage's last layer's; the model's last where not given) has freed its MLP's tensors and its attention
    output (autograd releases a node's saved tensors once it has run; softmax_backward.freed_after_softmax), not v,
    the checkpoint's input until its whole backward has run; three 16-bit gradients are alive: the residual
    stream's, the core's output (the checkpoint's incoming gradient) and v's (scores x V's, accumulated into the
    detached input's .grad until CheckpointFunction.backward returns). [] where it does not apply."""
    entry = temporary_entry(arch, training, par)
    if entry is None or not runs_megatron_unfused_attention(arch, training) or training.offload_activations \
            or not recomputed_modules(training) & set(CORE) or training.recompute != "selective":
        return []
    size, formula = entry.bytes(par), entry.shown_formula(par)
    mask = training.seq_len / par.cp * training.seq_len
    remade = (component("transient", "Recomputed softmax output (fp32, kept for its backward)", size, formula,
                        SELECTIVE_SOURCE),
              component("transient", "Recomputed causal mask (bool)", mask, "s^2", SELECTIVE_SOURCE))
    parts = remade + _expanded_k(arch, training, par) \
        + tuple(p for p in softmax_parts(entry, training, par, MEGATRON_SOFTMAX_SOURCE) if p.bytes > 0) \
        + _selective_layer_parts(arch, training, par, kind or arch.layer_kinds()[-1])
    return [Component("transient", "The last layer's recomputed core attention at its softmax backward (selective "
                      "recompute, unfused softmax)", sum(p.bytes for p in parts), " + ".join(p.formula for p in parts),
                      SELECTIVE_SOURCE + "; " + SOFTMAX_BACKWARD_SOURCE, parts)]


def _expanded_k(arch: Architecture, training: Training, par: Parallel) -> tuple[Component, ...]:
    """The recomputed k expanded to every query head (DotProductAttention.forward repeat_interleave where a query
    group has more than one head), saved by QK^T's baddbmm until its backward: none without grouped KV heads
    (q and k reach baddbmm as views of the checkpoint's inputs)."""
    if arch.num_kv_heads >= arch.num_attention_heads:
        return ()
    B, T = bytes_per_element(training.compute_dtype), tokens_per_gpu(training, par)
    t = "/t" if par.tp > 1 else ""
    return (component("transient", "Recomputed k expanded to every head (kept by QK^T for its backward)",
                      T * arch.q_width * B / par.tp, f"B*s*b*a*d_head{t}", SELECTIVE_SOURCE),)


def _selective_layer_parts(arch: Architecture, training: Training, par: Parallel,
                           kind: str) -> tuple[Component, ...]:
    """The last layer's tensors freed by the selective moment (its MLP's, its attention output) and the three
    gradients alive then (`selective_core_softmax_moment`)."""
    if kind not in ("dense", "moe"):
        return ()
    B, T = bytes_per_element(training.compute_dtype), tokens_per_gpu(training, par)
    sp, tp = ("/t", par.tp) if par.tp > 1 and par.sequence_parallel else ("", 1)
    t = "/t" if par.tp > 1 else ""
    residual = T * arch.hidden_size * B / tp  # the sequence-parallel region splits the sequence
    heads = T * (arch.attention_output_width + arch.num_attention_heads * arch.head_dim) * B / par.tp
    return (component("transient", f"The last layer's MLP ({kind}) and attention output, freed by their backward",
                      -freed_after_softmax(arch, training, par, kind, v_freed=False),
                      "-(MLP tensors + B*s*b*a*d_v)", SELECTIVE_SOURCE + "; " + AUTOGRAD_RELEASE_SOURCE),
            component("transient", "Gradients alive at the moment (residual stream, core attention output, v)",
                      residual + heads, f"B*s*b*h{sp} + B*s*b*a*d_v{t} + B*s*b*a*d_head{t}", SELECTIVE_SOURCE))


CHECKPOINTED_FORWARD_SOURCE = (
    "Megatron-Core 0.16.1 tensor_parallel/random.py CheckpointFunction.forward (`with torch.no_grad()`: the "
    "checkpointed layer keeps nothing, its tensors live as long as the code refers to them), "
    "fusions/fused_softmax.py forward_torch_softmax (`input.float()`, the softmax, `probs.bfloat16()` while the "
    "fp32 input and output are still referred to); measured on an H200: "
    "tests/data/measured/gpu/megatron/*-full-uniform1-* (the forward phase peaks there, 6.82 GB over its start)")


def checkpointed_forward_moment(arch: Architecture, training: Training, par: Parallel,
                                loss_saved: float) -> list[Component]:
    """Under full recompute, a checkpointed layer's forward at its softmax: the same tensors as its recomputation
    in backward (`recomputed_softmax_moment`: q, k, v, the mask, the 16-bit scores, their fp32 copy, the fp32
    softmax and its 16-bit cast), beside the layers' kept inputs but before the loss exists (its saved tensors,
    `loss_saved` bytes, are charged to the forward phase: taken out). [] where no layer is checkpointed or
    Megatron's DotProductAttention does not run."""
    from .activations.recompute import recomputed_layer_count
    if training.recompute != "full" or not recomputed_layer_count(training, arch.num_layers):
        return []
    softmax = recomputed_softmax_moment(arch, training, par)
    if softmax is None:
        return []
    out = [softmax._replace(label="Checkpointed layer's forward at its attention softmax (no_grad: the same "
                            "tensors as its recomputation)", source=CHECKPOINTED_FORWARD_SOURCE)]
    if loss_saved:
        out.append(Component("transient", "The loss's saved tensors, not made yet", -int(loss_saved),
                             "-(the loss's saved tensors)", CHECKPOINTED_FORWARD_SOURCE))
    return out


def with_checkpointed_forward(arch: Architecture, training: Training, par: Parallel, loss_saved: tuple,
                              loss_forward: list, exchange: list, tr) -> list[Component]:
    """The forward phase's moment beside the saved tensors: `loss_forward` (the loss's working set), or a
    checkpointed layer's softmax (`checkpointed_forward_moment`) where that is larger than it, the MoE
    exchange (`exchange`) and the transients' forward end (`tr.forward_end`)."""
    checkpointed = checkpointed_forward_moment(arch, training, par, total_bytes(loss_saved))
    others = max(total_bytes(loss_forward), total_bytes(exchange), total_bytes(tr.forward_end))
    return checkpointed if total_bytes(checkpointed) > others else loss_forward
