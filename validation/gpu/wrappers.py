"""The model as the HF Trainer hands it to its step: prepared by a real Accelerator.

transformers' Trainer builds `Accelerator(mixed_precision="bf16" | "fp16" | "no", ...)` from its
TrainingArguments and calls `accelerator.prepare(model, ...)`. Under bf16/fp16 `Accelerator.prepare_model`
(accelerate 1.x accelerator.py, `if self.native_amp:`) replaces `model.forward` with
`convert_outputs_to_fp32(autocast(model.forward))` (accelerate utils/operations.py): every floating
output, the logits [b, s, V] among them, is copied to fp32 as the forward returns.
"""

from __future__ import annotations

import torch


def accelerate_prepare(model, mixed_precision: str = "bf16"):
    from accelerate import Accelerator

    accelerator = Accelerator(mixed_precision=mixed_precision, cpu=not torch.cuda.is_available())
    return accelerator.prepare_model(model)


WRAPPERS = {"accelerate": accelerate_prepare}
