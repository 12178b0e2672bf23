"""One measured training step of a transformers model, the way the HF Trainer runs it.

The Trainer's loop, per optimizer step (transformers 5.x `Trainer.training_step`):
    with autocast (AMP only):  loss = model(**inputs).loss     # compute_loss returns the loss
                                                                # alone: the outputs, logits
                                                                # included, are dropped here
    loss.backward()                                             # outside autocast
    optimizer.step(); model.zero_grad()                         # grads set to None
Step 1 creates the optimizer states; step 2 is measured (steady state).
"""

from __future__ import annotations

from contextlib import ExitStack, nullcontext
from dataclasses import dataclass

import torch

from ..core.emulation import cuda_emulation
from ..core.steps import fake_mode, log_second_step
from ..core.tracker import StorageTracker, phase_summary
from ..hybrid.kernels import hybrid_kernels
from ..vlm import vision
from .models import MODELS


@dataclass(frozen=True)
class Run:
    model: str  # a key of MODELS
    seq_len: int
    micro_batch_size: int = 1
    recipe: str = "bf16"  # "bf16": pure bf16; "amp": bf16 autocast over fp32 parameters
    optimizer: str = "adamw"  # "adamw" or "sgd_momentum"
    recompute: str = "none"  # "none" or "full"
    # "sdpa" (flash), "eager", or "flash_attention_2" (flash-attn's kernel, emulated: Falcon, validation/hf/falcon.py)
    attention: str = "sdpa"
    images: int = 0  # images per sample (vision-language models, validation/vlm)
    image_size: int = 0  # pixels per side
    freeze_vision: bool = False  # the vision encoder frozen (requires_grad False), the merger or projector trained
    # what the vision tower runs: flash-attn's kernel, or SDPA where flash-attn is not installed (validation/vlm)
    vision_attention: str = "flash_attention_2"
    liger: bool = False  # the Trainer's use_liger_kernel: liger-kernel's defaults for the model type (liger.py)
    dropout: float = 0.0  # the model config's residual and embedding dropouts (validation/hf/dropout.py)


def build_model(run: Run, device: str | None = None):
    """The model of the run, in train mode with the Trainer's recompute. On a GPU it is initialised there
    (an 8B model's CPU initialisation would take minutes)."""
    from transformers import AutoModelForCausalLM, AutoModelForImageTextToText

    flash = run.attention == "flash_attention_2"
    config = MODELS[run.model].hf_config("sdpa" if flash else run.attention, **({"dropout": run.dropout} if run.dropout else {}))
    dtype = torch.bfloat16 if run.recipe == "bf16" else torch.float32
    auto = AutoModelForImageTextToText if hasattr(config, "vision_config") else AutoModelForCausalLM
    with torch.device(device) if device else nullcontext(), vision.initialisation(config):
        model = auto.from_config(config, dtype=dtype)
    if flash:
        from .falcon import to_flash
        to_flash(model)
    if hasattr(config, "vision_config"):  # tied weights, which building without initialisation leaves apart
        model.tie_weights()
    if run.freeze_vision:
        vision.freeze_encoder(model)
    model.train()
    if run.liger:
        from .liger import apply as apply_liger
        apply_liger(model)
    if run.recompute == "full":
        # What `TrainingArguments(gradient_checkpointing=True)` turns on: every decoder layer,
        # non-reentrant torch.utils.checkpoint (the method's name before transformers 5.2x as well)
        if hasattr(model, "activation_checkpointing_enable"):
            model.activation_checkpointing_enable({"use_reentrant": False})
        else:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    return model


def build_optimizer(run: Run, model):
    params = [p for p in model.parameters() if p.requires_grad]
    if run.optimizer == "adamw":
        # foreach=True: the implementation torch picks by default for CUDA tensors. States are
        # kept in each parameter's dtype (bf16 under the pure-bf16 recipe).
        return torch.optim.AdamW(params, lr=1e-5, weight_decay=0.01, foreach=True)
    if run.optimizer in ("paged_adamw", "paged_adamw8bit"):  # the Trainer's optim="paged_adamw_32bit"/"_8bit"
        import bitsandbytes as bnb

        paged = bnb.optim.PagedAdamW if run.optimizer == "paged_adamw" else bnb.optim.PagedAdamW8bit
        return paged(params, lr=1e-5, weight_decay=0.01)
    return torch.optim.SGD(params, lr=1e-3, momentum=0.9, foreach=True)


def build(run: Run, device: str | None = None):
    model = build_model(run, device)
    return model, build_optimizer(run, model)


def train_step(model, opt, input_ids, run: Run, phase=lambda name: nullcontext(), inputs: dict | None = None):
    """`inputs`: the whole batch of a vision-language step (validation/vlm/vision.py batch), else the text."""
    # autocast on the batch's device: "cpu" for the fake and CPU runs, "cuda" on a real GPU
    amp = torch.autocast(input_ids.device.type, dtype=torch.bfloat16) if run.recipe == "amp" else nullcontext()
    with phase("forward"), amp:
        loss = model(**(inputs or dict(input_ids=input_ids, labels=input_ids))).loss
    with phase("backward"):
        loss.backward()
        del loss
    with phase("optimizer"):
        opt.step()
        opt.zero_grad(set_to_none=True)


def traced_step(run: Run, fake: bool = True, seed: int = 0):
    """Run two training steps, logging the second; returns the tracker and the category of
    each storage key."""
    tracker = StorageTracker()
    torch.manual_seed(seed)
    with fake_mode(fake, real_inputs=False), cuda_emulation(tracker), hybrid_kernels(tracker), ExitStack() as stack:
        if run.dropout:  # CUDA's fused dropout: a bool mask kept (validation/peft/step.py)
            from ..peft.step import cuda_dropout
            stack.enter_context(cuda_dropout())
        if run.attention == "flash_attention_2":
            from .falcon import falcon_flash
            stack.enter_context(falcon_flash(tracker))
        if run.liger:
            from .liger import liger_emulation
            stack.enter_context(liger_emulation())
        model, opt = build(run)
        inputs = None
        if run.images:  # a vision-language step: its batch and its vision tower's emulation (validation/vlm)
            grid = vision.grid_of(model.config, run.images, run.image_size)
            inputs, precomputed, splits = vision.batch(model.config, grid, run.micro_batch_size, run.seq_len, fake)
            stack.enter_context(vision.vision_emulation(tracker, model, precomputed, splits, run.vision_attention))
            input_ids = inputs["input_ids"]
        else:
            input_ids = torch.randint(0, model.config.vocab_size, (run.micro_batch_size, run.seq_len))

        def owners():
            params = {tracker.adopt(p) for p in model.parameters()}
            for t in (*model.buffers(), *(inputs or {"input_ids": input_ids}).values()):
                tracker.adopt(t)
            states = set()
            for state in opt.state.values():
                for name, t in state.items():
                    if name == "step":  # AdamW's step counters stay on the CPU in a GPU run
                        tracker.ignore(t)
                    elif torch.is_tensor(t):
                        states.add(tracker.adopt(t))
            return params, states

        category = log_second_step(
            tracker, lambda phase: train_step(model, opt, input_ids, run, phase, inputs), owners,
            lambda: {tracker.key(p.grad) for p in model.parameters() if p.grad is not None})
    return tracker, category


def measure(run: Run, fake: bool = True, seed: int = 0) -> dict:
    """Bytes per category at each phase's peak of the second training step."""
    return phase_summary(*traced_step(run, fake, seed))
