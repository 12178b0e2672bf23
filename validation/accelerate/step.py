"""The HF Trainer's training step, run through the real Accelerate (no re-implementation of it).

`Trainer` always trains through an `Accelerator` (transformers 5.23 trainer.py
`_prepare_for_training`: `model, self.optimizer = self.accelerator.prepare(self.model, self.optimizer)`
whenever the model is not wrapped by the Trainer itself), built with `mixed_precision` "bf16" for
`TrainingArguments(bf16=True)` (training_args.py: `self.mixed_precision = "bf16"`). With bf16 or fp16
and neither DeepSpeed nor Megatron-LM, Accelerate sets `native_amp` (accelerate 1.15 accelerator.py,
`__init__`: bf16 on any device outside DeepSpeed/Megatron; fp16 on a GPU), and `prepare_model` then
replaces `model.forward` by `convert_outputs_to_fp32(autocast(forward))` (accelerator.py
`prepare_model`, "if self.native_amp:"): every fp16/bf16 tensor the forward returns is copied to fp32
(utils/operations.py `convert_to_fp32`: `tensor.float()` through `recursively_apply`, which rebuilds the
`ModelOutput` with the copies). The logits, [batch, seq, vocab], are such a tensor.

The Trainer's step around it (trainer.py `training_step` and `compute_loss`):
    outputs = model(**inputs)                   # compute_loss: the outputs (fp32 logits) stay alive
    loss = outputs["loss"]                      # until compute_loss returns the loss alone
    accelerator.backward(loss)                  # bf16: loss.backward() (no scaler)
    accelerator.clip_grad_norm_(params, 1.0)    # _inner_training_loop, max_grad_norm's default 1.0
    optimizer.step(); model.zero_grad()         # grads set to None
"""

from __future__ import annotations

from contextlib import nullcontext

import torch


def make_accelerator(mixed_precision: str = "bf16", cpu: bool = False):
    """A fresh `Accelerator`: its state is a process-wide singleton that refuses a second, different
    mixed precision, so the previous one is reset first (the harness measures several cases a process)."""
    from accelerate import Accelerator
    from accelerate.state import AcceleratorState, GradientState, PartialState

    AcceleratorState._reset_state(True)
    GradientState._reset_state()
    PartialState._reset_state()
    return Accelerator(mixed_precision=mixed_precision, cpu=cpu)


def compute_loss(model, input_ids: torch.Tensor) -> torch.Tensor:
    """Trainer.compute_loss without a label smoother or loss function: `outputs` is a local, so the
    forward's outputs are freed when it returns, before the backward."""
    outputs = model(input_ids=input_ids, labels=input_ids)
    return outputs["loss"]


def trainer_step(model, opt, accelerator, input_ids, phase=lambda name: nullcontext(), clip: bool = True):
    with phase("forward"):
        loss = compute_loss(model, input_ids)
    with phase("backward"):
        accelerator.backward(loss)
        del loss
    with phase("optimizer"):
        if clip:
            accelerator.clip_grad_norm_([p for p in model.parameters() if p.requires_grad], 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)


def fp32_output_copy_active(accelerator) -> bool:
    """Whether `prepare_model` wraps the forward in `convert_outputs_to_fp32` (its `native_amp`)."""
    return bool(accelerator.native_amp)
