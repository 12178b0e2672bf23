"""The LM head and loss as Liger-Kernel's fused linear cross-entropy runs them (training.loss "chunked" under the
HF Trainer's frameworks: its use_liger_kernel, importers/liger.py), in place of `head_operations`' one LM head
GEMM and PyTorch's cross-entropy.

liger-kernel 0.8.5 ops/fused_linear_cross_entropy.py ``fused_linear_cross_entropy_forward`` does the head's
forward and backward inside the autograd forward, chunk by chunk of `liger_chunk_tokens` rows:
``torch.mm(_input_chunk, weight.t(), out=logits_storage)`` (the logits GEMM), ``liger_cross_entropy_kernel`` on
the chunk (ops/cross_entropy.py: one pass reads the row for the running max and sum, a second reads it again and
writes the gradient over the logits: 3 passes over chunk x V), ``torch.mm(grad_logits_chunk, weight,
out=grad_input[chunk])`` (the input gradient) and ``torch.addmm(grad_weight, grad_logits_t, input_chunk,
out=grad_weight)`` (the weight gradient, accumulated: each chunk reads and writes the whole V x h accumulator,
in the weight's dtype, fp32 under autocast). Its ``backward`` (``fused_linear_cross_entropy_backward``) scales
the saved gradients by grad_output with ``element_mul_kernel`` unless grad_output is exactly 1; the Trainer's
loss is a sum divided by num_items_in_batch (transformers/model/loss_utils.py
``fixed_fused_linear_cross_entropy``), so it runs: one read and write of grad_input and of grad_weight.
"""

from __future__ import annotations

import dataclasses
import math

from . import kernels
from ..memory.activations.entries import autocast
from ..memory.activations.loss import LIGER_FLCE_SOURCE, liger_chunk_tokens
from ..memory.liger import FRAMEWORKS, RELEASE
from ..spec.training import Training
from .operations import SOFTMAX_FLOPS, Operation, _Context, _gemm

SOURCE = (f"{LIGER_FLCE_SOURCE}; liger-kernel {RELEASE} ops/cross_entropy.py liger_cross_entropy_kernel (two "
          "passes over each row, the gradient written over the logits); fused_linear_cross_entropy_backward "
          "element_mul_kernel; transformers/model/loss_utils.py fixed_fused_linear_cross_entropy (sum / "
          "num_items_in_batch)")


def runs_liger_flce(training: Training) -> bool:
    """Whether the loss is Liger's fused linear cross-entropy: "chunked" under the Trainer's frameworks (fsdp2's and
    torchtune's chunked losses are their own, memory/activations/loss.py)."""
    return training.loss == "chunked" and training.framework in FRAMEWORKS


def flce_operations(ctx: _Context, training: Training, hidden: int, vocab: float, count: int) -> list[Operation]:
    """The head's GEMMs over all chunks (forward, input and weight gradients, all in the forward pass), the
    cross-entropy kernel over all chunks, and the backward's scaling of the two gradients. Each GEMM is `_gemm`'s
    with one weight matrix per chunk: every chunk reads the whole V x h weight (and writes the whole gradient sum)
    and runs at the GEMM efficiency of its own rows."""
    T, h, V = ctx.T, hidden, vocab
    chunk = liger_chunk_tokens(T, h, int(V))
    chunks = math.ceil(T / chunk)
    gemms = _gemm(ctx, "head", "LM head (Liger FLCE)", T, h, V, count, weights=chunks,
                  formula=f"2*T*h*V in {chunks} chunks of {chunk:g} rows (chunk = next_power_of_2(cdiv(T, cdiv(V, "
                          f"h)))), each reading the V x h weight, M={T:g} K={h} N={V:g}")
    accumulator = V * h * ctx.grad * chunks  # addmm(grad_weight, ...) reads the running sum before writing it
    ops = []
    for op in gemms:
        if op.phase == "backward":
            op = dataclasses.replace(op, formula=op.formula + ", chunk by chunk inside the forward")
        if op.name.endswith("(weight gradient)"):
            op = dataclasses.replace(op, bytes=op.bytes + accumulator,
                                     formula=op.formula + "; addmm into the V x h sum: read and written each chunk")
        ops.append(dataclasses.replace(op, phase="forward", kernels=chunks, source=SOURCE))
    logits = T * V
    ops.insert(1, Operation("cross-entropy (Liger kernel)", "forward", "head", "elementwise",
                            SOFTMAX_FLOPS * logits, 3 * logits * ctx.B, ctx.peak, ctx.bandwidth, count,
                            f"read s*b*V logits twice, write their gradient in place ({chunks} chunks)", (), 1.0,
                            kernels.BANDWIDTH_EFFICIENCY, 1.0, chunks, SOURCE))
    frozen = "head" in ctx.frozen
    weight_elements = 0 if frozen else V * h
    scaled = T * h * (4 if autocast(training) else ctx.B) + weight_elements * ctx.grad
    ops.append(Operation("LM head gradients x grad_output (Liger element_mul)", "backward", "head", "elementwise",
                         T * h + weight_elements, 2 * scaled, ctx.peak, ctx.bandwidth, count,
                         "read and write grad_input (s*b*h)" + ("" if frozen else " and grad_weight (V*h)"), (), 1.0,
                         kernels.BANDWIDTH_EFFICIENCY, 1.0, 1 if frozen else 2, SOURCE))
    return ops
