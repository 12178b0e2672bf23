"""One HF-Trainer training step of a hybrid model, measured as validation/step.py measures the
transformer records (same Run, same step, same tracker and categories), with the hybrid layers'
CUDA kernels emulated (kernels.py) on top of the flash-attention emulation."""

from __future__ import annotations

import gc
from contextlib import nullcontext

import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from ..emulation import cuda_emulation
from ..step import Run, train_step
from ..tracker import StorageTracker, categories, phase_summary
from .kernels import hybrid_kernels
from .models import MODELS


def build(run: Run):
    from transformers import AutoModelForCausalLM

    if run.recipe != "bf16":
        # transformers runs MoE experts with torch grouped_mm, which takes bf16 only (validation/cases.py)
        raise NotImplementedError("the hybrid records are pure bf16")
    model = AutoModelForCausalLM.from_config(MODELS[run.model].hf_config(run.attention), dtype=torch.bfloat16)
    model.train()
    if run.recompute == "full":  # TrainingArguments(gradient_checkpointing=True): every layer, non-reentrant
        model.activation_checkpointing_enable({"use_reentrant": False})
    params = [p for p in model.parameters() if p.requires_grad]
    if run.optimizer == "adamw":
        opt = torch.optim.AdamW(params, lr=1e-5, weight_decay=0.01, foreach=True)
    else:
        opt = torch.optim.SGD(params, lr=1e-3, momentum=0.9, foreach=True)
    return model, opt


def traced_step(run: Run, fake: bool = True, seed: int = 0):
    """Two training steps, the second logged; the tracker and the category of each storage."""
    tracker = StorageTracker()
    tracker.recording = False
    torch.manual_seed(seed)
    with FakeTensorMode() if fake else nullcontext(), cuda_emulation(tracker), hybrid_kernels(tracker):
        model, opt = build(run)
        input_ids = torch.randint(0, model.config.vocab_size, (run.micro_batch_size, run.seq_len))
        with tracker:
            train_step(model, opt, input_ids, run)  # step 1 creates the optimizer states
            gc.collect()
            tracker.start()
            params = {tracker.adopt(p) for p in model.parameters()}
            for b in model.buffers():
                tracker.adopt(b)
            tracker.adopt(input_ids)
            states = set()
            for state in opt.state.values():
                for name, t in state.items():
                    if name == "step":  # AdamW's step counters stay on the CPU in a GPU run
                        tracker.ignore(t)
                    elif torch.is_tensor(t):
                        states.add(tracker.adopt(t))
            grads = set()

            def phase(name):
                if name == "optimizer":
                    grads.update(tracker.key(p.grad) for p in model.parameters() if p.grad is not None)
                return tracker.phase(name)

            train_step(model, opt, input_ids, run, phase)
            tracker.stop()
    return tracker, categories(params, grads, states)


def measure(run: Run, fake: bool = True, seed: int = 0) -> dict:
    tracker, category = traced_step(run, fake, seed)
    return phase_summary(tracker, category)
