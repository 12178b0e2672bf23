"""The HF Trainer's loop: the model's forward as Accelerate's mixed precision wraps it (`training_loop`).

transformers' Trainer always trains through an Accelerator (transformers 5.23 trainer.py
`_prepare_for_training`: `self.accelerator.prepare(self.model, self.optimizer)`), built with
`mixed_precision` "bf16"/"fp16" from `TrainingArguments(bf16=True / fp16=True)` (training_args.py). With
those and neither DeepSpeed nor Megatron-LM, Accelerate sets `native_amp` (accelerate 1.15 accelerator.py
`Accelerator.__init__`; FSDP included), and `prepare_model` replaces `model.forward` by
`convert_outputs_to_fp32(autocast(forward))` (accelerator.py `prepare_model`, "if self.native_amp:"; the
same in accelerate main, 1.15.0.dev0 at 16cb6eb). Two things follow for memory, measured through the real
Accelerate (validation/accelerate, tests/data/measured/accelerate):

- the forward runs under autocast in the compute dtype: peft's fp32 adapters of a 16-bit base compute in
  it. peft still casts each adapted module's input to fp32 (`_cast_input_dtype`), but `lora_A`'s linear
  casts it back and keeps that 16-bit copy, and `lora_A`'s r-wide output is 16-bit; autocast's 16-bit
  copies of the fp32 adapter weights are kept for the input's gradient (not A's where the input needs
  none: the first layer's q, k, v under frozen embeddings). Adapter dropout runs on the fp32 cast before
  `lora_A` (its mask is kept; its output is not, only the 16-bit copy). A LoRA run without recompute keeps
  5-15% less than the plain loop (`adapter_entries`);
- every 16-bit tensor the forward returns is copied to fp32 (utils/operations.py `convert_to_fp32`):
  the logits [b, s, V]. transformers' ForCausalLMLoss has already upcast them to fp32 inside the forward
  and freed that upcast after the log-softmax, so the copy's moment holds the 16-bit logits, the kept
  fp32 log-softmax and the fp32 copy: as many bytes as the loss's own moment, and the Trainer's
  compute_loss drops the outputs before backward. The peak does not move (full fine-tuning records equal
  the plain loop's to 512 bytes); the component says which fp32 logits the moment holds (`LOGITS_ENTRY`).

A plain loop (`training_loop` "plain": the model called directly, as validation/hf and validation/peft
measure) runs autocast only where the weights are wider than the compute dtype (AMP).
Under the Trainer, peft's prepare_model_for_kbit_training (fp32 embeddings, norms and head) keeps the fp32 ledger
of its plain loop but for two things autocast changes (kbit.py): SDPA gets autocast's 16-bit q, k, v, so the fused
kernel runs (no math backend), and the fp32 LM head is cast for its matmul, whose 16-bit copy is kept for backward
(measured through the real Accelerate, tests/data/measured/accelerate/*-prepared-accelerate-bf16).
"""

from __future__ import annotations

SOURCE = ("accelerate 1.15 accelerator.py Accelerator.prepare_model (native_amp: forward = "
          "convert_outputs_to_fp32(autocast(forward))) and utils/operations.py convert_to_fp32; transformers 5.23 "
          "trainer.py _prepare_for_training, compute_loss; measured: tests/data/measured/accelerate")
TRAINER_FRAMEWORKS = ("hf", "fsdp1")  # the stacks the Trainer runs through Accelerate (fsdp1: always)
LOGITS_ENTRY = ("fp32 logits, one at a time: the loss's upcast (log-softmax input), then Accelerate's fp32 copy "
                "of the output (convert_outputs_to_fp32)")


def through_accelerate(training) -> bool:
    """The forward runs under Accelerate's mixed precision: the Trainer's loop with a 16-bit compute dtype
    (TrainingArguments bf16/fp16 -> native_amp)."""
    return (training.framework in TRAINER_FRAMEWORKS and training.training_loop in ("trainer", "trl_sft")
            and training.compute_dtype in ("bf16", "fp16") and training.mode == "training")


def autocast_adapters(training) -> bool:
    """peft's fp32 adapters computed under the Trainer's autocast (module docstring)."""
    from ..spec.dtypes import bytes_per_element
    from ..spec.training import resolve_recipe
    from .adapters import adapter_dtype
    from .kbit import prepared
    if training.adapter is None or training.framework != "hf" or prepared(training):
        return False
    wider = bytes_per_element(adapter_dtype(training, resolve_recipe(training)))
    return through_accelerate(training) and wider > bytes_per_element(training.compute_dtype)


def adapter_entries(training, par, m, first: bool) -> list:
    """What one adapted module keeps under the Trainer's autocast: the dropout mask (where the input needs a
    gradient), the 16-bit copy of lora_A's input, lora_A's 16-bit output and autocast's 16-bit copies of the
    adapter weights (A's only where the input needs a gradient)."""
    from ..spec.dtypes import bytes_per_element
    from .activations.entries import Entry, tokens_per_gpu
    C, T, n = bytes_per_element(training.compute_dtype), tokens_per_gpu(training, par), m.copies
    dtype, width = training.compute_dtype, f"in_{m.name}" + (f"*{n}" if n > 1 else "")
    needs_grad = not (first and m.name in ("q", "k", "v"))  # the first layer's q, k, v under frozen embeddings
    r = training.adapter.rank * m.rank_factor
    out = []
    if training.adapter.dropout and needs_grad:
        out.append(Entry(f"{m.name} adapter: dropout mask", T * m.in_features * n, 1, "none", f"s*b*{width}"))
    out.append(Entry(f"{m.name} adapter: lora_A input, autocast's {dtype} copy", T * m.in_features * n, C, "none",
                     f"{C:g}*s*b*{width}"))
    out.append(Entry(f"{m.name} adapter: lora_A output ({dtype}, lora_B input)", T * r * n, C, "none",
                     f"{C:g}*s*b*r" + (f"*{n}" if n > 1 else "")))
    weights = r * (m.out_features + (m.in_features if needs_grad else 0)) * n
    out.append(Entry(f"{m.name} adapter: autocast's {dtype} copies of the adapter weights", weights, C, "none",
                     f"{C:g}*r*({'in+' if needs_grad else ''}out)" + (f"*{n}" if n > 1 else ""), split_by_cp=False))
    return out
