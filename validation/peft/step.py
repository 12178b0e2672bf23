"""One measured LoRA / QLoRA training step, the way the HF Trainer (transformers 5.x) runs it over
a peft model:

    loss = model(**inputs).loss; loss.backward()                  # Trainer.training_step
    clip_grad_norm_(trainable parameters, max_norm=1.0)           # TrainingArguments.max_grad_norm
    optimizer.step(); model.zero_grad()                           # fused AdamW, grads set to None

Step 1 creates the optimizer states; step 2 is measured. Besides validation/core/emulation.py's CUDA
emulation (FlashAttention-2, packed-sequence check, 512-byte rounding), two CUDA behaviours matter
here and are emulated:
- dropout (LoRA dropout): on CUDA `at::dropout` runs the fused `native_dropout`, which keeps a
  bool mask for the backward; the CPU build instead multiplies by a noise tensor of the input's
  dtype (aten/src/ATen/native/Dropout.cpp, `is_fused_kernel_acceptable` needs a CUDA tensor).
  `F.dropout` is routed to `native_dropout` for the measurement.
- fused AdamW keeps its `step` counters on the parameter's device (torch/optim/adam.py: "host
  step on CPU if both capturable and fused are off"): 0-dim fp32 tensors, one 512-byte block each
  on the GPU, counted with the optimizer states.
`clip_grad_norm_` on CPU takes the per-tensor path (the foreach kernels are listed for CUDA only);
it allocates what the CUDA foreach path does: one 0-dim norm per gradient, their stack, the total
norm and the clip coefficient.
"""

from __future__ import annotations

from contextlib import contextmanager, nullcontext

import torch
import torch.nn.functional as F

from ..core.emulation import cuda_emulation
from ..core.steps import fake_mode, log_second_step
from ..core.tracker import UnwrappingTracker, phase_summary
from .bnb import logical_numel, state_tensors
from .build import LoraRun, build, meta_peft_model, trainable_parameters


_ORIGINAL_DROPOUT = F.dropout


def _cuda_dropout(input, p=0.5, training=True, inplace=False):
    if not training or p == 0 or p == 1 or inplace or input.numel() == 0:
        return _ORIGINAL_DROPOUT(input, p, training, inplace)
    return torch.native_dropout(input, p, training)[0]


@contextmanager
def cuda_dropout():
    F.dropout = _cuda_dropout
    try:
        yield
    finally:
        F.dropout = _ORIGINAL_DROPOUT


def train_step(model, opt, input_ids, phase=lambda name: nullcontext()):
    with phase("forward"):
        loss = model(input_ids=input_ids, labels=input_ids).loss
    with phase("backward"):
        loss.backward()
        del loss
    with phase("optimizer"):
        torch.nn.utils.clip_grad_norm_(trainable_parameters(model), max_norm=1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)


def adopt_model(tracker, model, input_ids, trainable: set) -> set:
    """Register the model's storages with the tracker at the measured step's start: its parameters (the
    returned keys; the trainable ones also added to `trainable`), bitsandbytes' quantization states
    beside them, its buffers and the batch."""
    params = set()
    for p in model.parameters():
        keys = tracker.adopt_all(p)
        params |= keys
        if p.requires_grad:
            trainable.update(keys)
    for t in state_tensors(model):  # bitsandbytes' quantization states: with the parameters
        params.add(tracker.adopt(t))
    for b in model.buffers():
        tracker.adopt_all(b)
    tracker.adopt(input_ids)
    return params


def traced_step(run: LoraRun, fake: bool = True, seed: int = 0, make_model=meta_peft_model):
    """Two training steps, the second logged; returns the tracker, the category of each storage
    key, the model (for its counts) and the keys of the trainable parameters. `make_model`: the
    peft model before `build` (bnb.real_peft_model: real bitsandbytes, for the tiny CPU check)."""
    tracker = UnwrappingTracker()
    torch.manual_seed(seed)
    model = make_model(run)
    trainable: set[int] = set()
    with fake_mode(fake), cuda_emulation(tracker), cuda_dropout():
        model, opt = build(model, run)
        input_ids = torch.randint(0, model.config.vocab_size, (run.micro_batch_size, run.seq_len))

        def owners():
            params = adopt_model(tracker, model, input_ids, trainable)
            return params, {tracker.adopt(t) for s in opt.state.values() for t in s.values() if torch.is_tensor(t)}

        category = log_second_step(
            tracker, lambda phase: train_step(model, opt, input_ids, phase), owners,
            lambda: {tracker.key(p.grad) for p in model.parameters() if p.grad is not None})
    return tracker, category, model, trainable


def parameter_counts(model) -> dict:
    """Element counts: peft's own count of trainable parameters, and all parameters (an NF4
    weight counted by its logical shape)."""
    trainable, _ = model.get_nb_trainable_parameters()
    return {"trainable": trainable, "total": sum(p.numel() for p in model.parameters()) + logical_numel(model)}


def measure(run: LoraRun, fake: bool = True, seed: int = 0, make_model=meta_peft_model) -> dict:
    """Bytes per category at each phase's peak of the second training step, the frozen and
    trainable parameter bytes, and the parameter counts."""
    tracker, category, model, trainable = traced_step(run, fake, seed, make_model)
    summary = phase_summary(tracker, category)
    sizes = dict(tracker.live_at(tracker.marks[0][0]))
    trainable_bytes = sum(sizes.get(k, 0) for k in trainable)
    return {**summary,
            "parameter_bytes": {"frozen": summary["parameters"] - trainable_bytes, "trainable": trainable_bytes},
            "parameter_counts": parameter_counts(model)}
