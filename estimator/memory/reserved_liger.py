"""The HF Trainer's loss under Liger-Kernel (training.liger_kernel with the chunked loss: liger-kernel 0.8.5's fused
linear cross-entropy, memory/liger.py) as the allocator replay (reserved.py) requests it.

liger-kernel 0.8.5 (line numbers of its wheel's files):
- transformers/model/loss_utils.py LigerForCausalLMLoss (lines 87-88): the labels padded by one position (b*(s+1)
  int64) and their shifted copy made contiguous (b*s int64), both alive until the loss returns.
- ops/fused_linear_cross_entropy.py fused_linear_cross_entropy_forward, called by
  LigerFusedLinearCrossEntropyFunction.forward (lines 530-551): grad_input = zeros_like(_input) (line 108), the head
  input's gradient in the input's dtype; grad_weight = zeros_like(weight) (line 116, accum_dtype None: the weight's
  dtype) where the head is trained; loss_1d, fp32 per token (line 125); target_mask, bool per token (line 131); then
  the logits: where `_can_use_mm_out` (lines 32-48: the input and weight of one dtype, and that dtype the autocast
  one under autocast; the Function's forward runs without grad) one [chunk, V] buffer in the input's dtype (lines
  150-154) that each chunk's torch.mm writes into (line 164) and whose gradient the cross-entropy kernel writes in
  place, freed after the loop (line 391); otherwise (fp32 weights under a 16-bit autocast) each chunk's
  `_input_chunk @ weight.t()` (line 168) under autocast: the chunk's input cast, the weight's transpose cast (a view:
  torch's autocast caches no cast of a view, aten/src/ATen/autocast_mode.cpp cached_cast `!arg.is_view()`), the
  chunk's logits, the two casts freed; `grad_logits_chunk @ weight` (line 322) casts the weight itself, cached by
  autocast from the first chunk on (a leaf that requires grad) until the forward's autocast exits, its [chunk, h]
  product freed once copied into grad_input; the fp32 grad_weight's addmm (lines 326-348, torch >= 2.8) casts the
  chunk's input (freed); the chunk's logits freed at the chunk's end (line 388).
  save_for_backward(grad_input, grad_weight) (lines 574-578): they live to the backward, which scales them in
  place (fused_linear_cross_entropy_backward, element_mul_kernel) and returns them: grad_weight becomes the head's
  .grad (torch's AccumulateGrad steals a gradient it holds the only reference to), no new tensor.
- The head's input (the final norm's output) is freed when the model's forward returns (the Function saves only the
  gradients), as are the labels' copies; the per-token loss and mask when the Function's forward returns.

As recorded by the fake-tensor harness with liger-kernel 0.8.5 (validation/hf/liger.py; the Triton launches
stubbed) for Qwen2.5-0.5B under autocast at s8192 b2: per chunk the weight's transpose cast (272,269,312 B) and the
chunk's logits (38,895,616 B), the cast freed before the logits, and one cached weight cast from the first chunk to
the forward's end.
"""

from __future__ import annotations

from .activations.entries import autocast
from .activations.loss import liger_chunk_tokens
from ..spec.dtypes import bytes_per_element

SOURCE = ("the loss in liger-kernel 0.8.5's order (ops/fused_linear_cross_entropy.py fused_linear_cross_entropy_forward; "
          "estimator/memory/reserved_liger.py): on the five real H200 Liger runs (tests/data/measured/gpu/*-liger.json) "
          "-7.6% to +0.5%, median 0.5% (the flat share: -0.7% to +7.85%, median 6.6%)")

GRAD_INPUT = "gradient of the LM head input (computed in forward)"  # activations/loss.py _liger_chunked_loss
GRAD_WEIGHT = "gradient of the LM head weight (computed in forward)"


def applies(training) -> bool:
    """The loss is Liger's fused linear cross-entropy under the Trainer (memory/liger.py, activations/loss.py)."""
    return training.framework == "hf" and training.liger_kernel and training.loss == "chunked"


def forward(prog, cfg, shared, sizes, head_weight) -> tuple[list, list, int | None]:
    """The loss's requests in Liger's order (this module's docstring). `sizes(entries)`: the requests of ledger
    entries (reserved._sizes); `head_weight`: the head's weight tensor (reserved_tensors.Tensor; the embedding's
    where tied). Returns (what the loss keeps for backward: the final norm's tensors and grad_input; [];
    grad_weight's block, None where the head is frozen)."""
    training, par = cfg.training, shared.parallel
    saved = {e.name: e for e in shared.loss.saved}
    norm = [e for e in shared.loss.saved if e.name not in (GRAD_INPUT, GRAD_WEIGHT)]
    kept = [prog.alloc(b) for b in sizes(norm)]  # the final norm's (LigerRMSNorm: its input and rstd)
    tokens = int(training.seq_len / par.cp * training.micro_batch_size)
    h = cfg.architecture.hidden_size
    vocab = int(head_weight.elements) // h
    compute = bytes_per_element(training.compute_dtype)
    head_input = saved[GRAD_INPUT].bytes(par)  # the final norm's output: the gradient's size and dtype
    y = prog.alloc(head_input)
    labels = [prog.alloc(8 * (tokens + training.micro_batch_size)), prog.alloc(8 * tokens)]
    kept.append(prog.alloc(head_input))  # grad_input
    grad_weight = prog.alloc(saved[GRAD_WEIGHT].bytes(par)) if GRAD_WEIGHT in saved else None
    per_token = [prog.alloc(4 * tokens), prog.alloc(tokens)]  # loss_1d, target_mask
    chunk = liger_chunk_tokens(tokens, h, vocab)
    if not autocast(training):  # _can_use_mm_out: one logits buffer for every chunk
        prog.free(prog.alloc(chunk * vocab * compute))
    else:
        cached = None
        for start in range(0, tokens, chunk):
            rows = min(chunk, tokens - start)
            cast_input = prog.alloc(rows * h * compute)
            cast_weight = prog.alloc(vocab * h * compute)  # weight.t(): a view, not cached
            logits = prog.alloc(rows * vocab * compute)
            prog.free(cast_weight, cast_input)
            if cached is None:
                cached = prog.alloc(vocab * h * compute)  # the weight's own cast, cached by autocast
            prog.transient([rows * h * compute, rows * h * compute])  # grad_logits @ weight; the input's cast
            prog.free(logits)
        labels.append(cached)  # freed at the autocast's exit, after the model's forward
    # the Function's locals when its forward returns, then the model forward's, then autocast's cache
    prog.free(*reversed(per_token), y, *labels)
    return kept, [], grad_weight
