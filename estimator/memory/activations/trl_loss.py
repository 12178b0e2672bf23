"""TRL's SFTTrainer loss (`training_loop` "trl_sft"), trl 1.9.0, under the HF Trainer through Accelerate.

- `loss` "chunked" without Liger is its `chunked_nll`, the default from trl v1.7.0 (sft_config.py __post_init__:
  "nll" if use_liger_kernel else "chunked_nll"). SFTTrainer.__init__ patches the causal LM's forward
  (sft_trainer.py `_patch_chunked_ce_lm_head`, before Accelerate wraps it): the decoder runs to the final norm,
  the targets (every position but each sequence's last, `labels[..., 1:]`) are gathered to the front
  (`hidden[order]`, kept for backward), and the head and its cross-entropy run on 256 of them at a time, each
  chunk under torch.utils.checkpoint (`_chunk`: `h.float() @ w.float().t()`, log_softmax, nll, argmax, entropy),
  so no [b, s, V] tensor exists. Each chunk makes an fp32 copy of the head's weight and, under Accelerate's
  autocast, the matmul's 16-bit cast of it (autocast caches no cast of a non-leaf tensor); in backward each
  chunk makes them again, beside the head weight's gradient summed over the chunks done (autograd's input
  buffer of the weight's AccumulateGrad, which runs once, after the last chunk) and the gathered input's
  gradient. Without autocast (DeepSpeed ZeRO 0-2, the HF Trainer's FSDP2: a 16-bit model run as it is) the
  chunk's matmul is fp32, its logits and their gradient fp32, and the weight copy's gradient an fp32 matrix
  beside its cast to the weight's dtype (measured alone: tests/test_trl_loss.py runs TRL's own function under
  fake tensors with and without autocast). Under ZeRO-3 TRL gathers the partitioned weight inside each chunk
  (`maybe_gather_lm_head_ctx`): not modelled.
- `loss` "standard" is its `nll` (the default before v1.7.0): the model's own loss (`_pytorch_cross_entropy`),
  then compute_loss keeps the outputs (Accelerate's fp32 copy of the logits) for the entropy and token accuracy
  (`entropy_from_logits`, 128 rows at a time, of `logits[..., :-1, :]`, reshaped: a copy above one sample):
  `nll_metrics`, a moment after the loss's forward beside what the loss keeps.
- With Liger (`liger_kernel`) TRL runs Liger's loss and skips its metrics (the Trainer's path).
- Earlier releases (training.trl_version, spec/trl.py): no metrics before 0.15.0; the accuracy's shifted copy and
  int64 argmax alone from 0.16.0; from 0.22.0 the entropy first, of a whole sample's logits at once in 0.22.x and of
  128 rows from 0.23.0, each a moment of its own before the accuracy's, until 1.3.0 shifts first (the 1.9.0 moment).

Measured: tests/data/measured/accelerate/*-trl-sft-* (validation/accelerate/trl_sft.py, the real
SFTTrainer.training_step).
"""

from __future__ import annotations

from ...spec.architecture import Architecture
from ...spec.dtypes import bytes_per_element
from ...spec.parallel import Parallel
from ...spec.training import Training
from ...spec.trl import ENTROPY_FROM, METRICS_FROM, ROW_CHUNKS_FROM, SHIFT_BEFORE_ENTROPY, trl_release
from .entries import Entry, autocast, tokens_per_gpu

CHUNK = 256  # trl 1.9.0 sft_trainer.py _CHUNKED_LM_HEAD_CHUNK_SIZE
METRIC_ROWS = 128  # trl 1.9.0 trainer/utils.py entropy_from_logits(chunk_size=128)
SOURCE = ("trl 1.9.0 trainer/sft_trainer.py (_chunked_cross_entropy_loss, _chunk, _patch_chunked_ce_lm_head, "
          "compute_loss) and trainer/utils.py entropy_from_logits; sft_config.py (loss_type chunked_nll the default "
          "without Liger from v1.7.0); measured: tests/data/measured/accelerate/*-trl-sft-*")


def trl_chunked(training: Training) -> bool:
    """TRL's chunked_nll: loss "chunked" under its SFTTrainer without Liger."""
    return training.training_loop == "trl_sft" and training.loss == "chunked" and not training.liger_kernel


def chunked_unmodelled(framework: str, compute_dtype: str, param_dtype: str, zero: int | None) -> str | None:
    """Why chunked_nll is not modelled on a stack, or None where it is: under the Trainer's autocast (hf, fsdp1 in
    bf16/fp16: the whole step measured) and over a 16-bit head run as it is (DeepSpeed ZeRO 0-2, the HF Trainer's
    FSDP2: the function measured alone). The estimate refuses it there (memory/validation.py); the importers fall
    back to the standard loss, saying why (importers/hf_trainer.py)."""
    from ..trainer_loop import TRAINER_FRAMEWORKS  # through_accelerate's stacks
    if framework in TRAINER_FRAMEWORKS and compute_dtype in ("bf16", "fp16"):
        return None
    if framework == "deepspeed" and zero == 3:
        return ("under ZeRO-3 TRL gathers the head's partitioned weight inside each chunk (trl 1.9.0 utils.py "
                "maybe_gather_lm_head_ctx)")
    if framework in ("deepspeed", "hf_fsdp2") and param_dtype in ("bf16", "fp16"):
        return None
    return "over fp32 weights TRL's w.float() copies nothing"


def trl_nll(training: Training) -> bool:
    """TRL's nll: the model's own loss, then compute_loss's metrics from the kept outputs (from trl 0.15.0)."""
    return (training.training_loop == "trl_sft" and training.loss == "standard" and not training.liger_kernel
            and trl_release(training) >= METRICS_FROM)


def _targets(training: Training, par: Parallel) -> float:
    """Every position but each sequence's last (`labels[..., 1:]`): all of them targets in a full batch."""
    return tokens_per_gpu(training, par) - training.micro_batch_size


def chunked_loss(arch: Architecture, training: Training, par: Parallel, vocab: int):
    """(saved, forward, backward) entries of chunked_nll beside the final norm's (module docstring)."""
    from ..trainer_loop import through_accelerate
    B = bytes_per_element(training.compute_dtype)
    P = bytes_per_element(training.param_dtype)  # the head weight's dtype, and its gradient's
    I = 4 if autocast(training) else B  # the final norm's output, in the residual stream's dtype
    n, h = _targets(training, par), arch.hidden_size
    cast = through_accelerate(training)  # the matmul runs on autocast's 16-bit casts
    L = B if cast else 4  # a chunk's logits: autocast's matmul output, else the fp32 operands'
    saved = [Entry("LM head input gathered to the targets (hidden[order])", n * h, I, "none", f"{I:g}*(s-1)*b*h"),
             Entry("the targets' order and labels (int64)", n, 16, "none", "2*8*(s-1)*b")]
    weight = [Entry("fp32 copy of the LM head weight (w.float(), one chunk's)", vocab * h, 4, "none", "4*V*h",
                    split_by_cp=False)]
    if cast:
        weight.append(Entry("autocast's cast of it for the matmul", vocab * h, B, "none", f"{B:g}*V*h",
                            split_by_cp=False))
    logits = Entry(f"one chunk's logits ({CHUNK} targets)", CHUNK * vocab, L, "none", f"{L:g}*{CHUNK}*V",
                   split_by_cp=False)
    backward = weight + [logits,
                         Entry("the head weight's gradient, summed over the chunks done", vocab * h, P, "none",
                               f"{P:g}*V*h", split_by_cp=False, for_weights=("head",)),
                         Entry("gradient of the gathered LM head input", n * h, I, "none", f"{I:g}*(s-1)*b*h")]
    if not cast:  # the fp32 matmul's weight gradient, before ToCopyBackward casts it to the weight's dtype
        backward.append(Entry("fp32 gradient of the weight copy (before its cast)", vocab * h, 4, "none", "4*V*h",
                              split_by_cp=False, for_weights=("head",)))
    return saved, weight + [logits], backward


def nll_metrics(arch: Architecture, training: Training, par: Parallel, vocab: int) -> list[Entry]:
    """compute_loss's metrics after the loss's forward, beside what the loss keeps for backward: the outputs'
    logits (Accelerate's fp32 copy under its autocast), their reshaped copy above one sample a micro-batch and
    one 128-row chunk's log-softmax, exp and product (module docstring)."""
    from ..trainer_loop import through_accelerate
    D = 4 if through_accelerate(training) else bytes_per_element(training.compute_dtype)
    T, b, version = tokens_per_gpu(training, par), training.micro_batch_size, trl_release(training)
    kept = Entry("the outputs' logits, kept by compute_loss for its metrics", T * vocab, D, "none", f"{D:g}*s*b*V")
    shifted = ("their reshaped copy (logits[..., :-1, :], not contiguous above one sample)"
               if version >= SHIFT_BEFORE_ENTROPY else "their shifted copy (logits[..., :-1, :].contiguous())")
    copy = [Entry(shifted, _targets(training, par) * vocab, D, "none", f"{D:g}*(s-1)*b*V")] if b > 1 else []
    rows = [Entry(f"entropy of {METRIC_ROWS} rows: log-softmax, exp and product", 3 * METRIC_ROWS * vocab, D,
                  "none", f"3*{D:g}*{METRIC_ROWS}*V", split_by_cp=False)]
    if version >= SHIFT_BEFORE_ENTROPY:  # the shifted logits' entropy (the 1.9.0 moment measured)
        return [kept] + copy + rows
    accuracy = copy + [Entry("the accuracy's argmax (int64)", _targets(training, par), 8, "none", "8*(s-1)*b")]
    if version >= ROW_CHUNKS_FROM:
        entropy = rows
    elif version >= ENTROPY_FROM:  # trl 0.22 utils.py entropy_from_logits(chunk_size=1) splits dim 0: one sample
        entropy = [Entry("entropy of one sample: log-softmax, exp and product", 3 * T / b * vocab, D, "none",
                         f"3*{D:g}*s*V")]
    else:
        entropy = []
    return [kept] + max(entropy, accuracy, key=lambda entries: sum(e.bytes(par) for e in entries))
