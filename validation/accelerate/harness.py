"""One measured HF-Trainer step through the real Accelerate, under fake tensors.

The model and optimizer are those of the plain harnesses (validation/hf/step.py `build` for full
fine-tuning, foreach AdamW; validation/peft/build.py for LoRA, fused AdamW), so a record differs from
its plain-loop sibling by what Accelerate and the Trainer's step add alone. `Accelerator(mixed_precision,
cpu=True).prepare(model, optimizer)` wraps the forward as on a GPU (accelerate 1.15 `prepare_model`
takes the same `native_amp` branch on the CPU: validation/accelerate/step.py), with autocast on the
CPU device (as the plain harness's AMP recipe runs it). The step is `trainer_step` (validation/
accelerate/step.py), or with `trainer=True` the real `transformers.Trainer.training_step` for the
forward and backward (tests/test_harness_accelerate.py checks that both allocate alike). With `trl_sft` set
it is TRL's `SFTTrainer.training_step` (validation/accelerate/trl_sft.py: trl 1.9.0, loss_type "nll" or
"chunked_nll", the latter's forward patched by TRL before `prepare`), on the collator's batch with an
attention mask; those records have no separate forward phase either.
CUDA emulation and the tracker are the plain harnesses' (validation/core/emulation.py, validation/peft/step.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..core.emulation import cuda_emulation
from ..core.steps import fake_mode, log_second_step
from ..core.tracker import UnwrappingTracker, phase_summary
from ..hf.step import Run
from ..peft.build import LoraRun
from ..peft.step import adopt_model, cuda_dropout, parameter_counts
from . import trl_sft
from .step import fp32_output_copy_active, make_accelerator, trainer_step


@dataclass(frozen=True)
class AccelerateRun:
    base: Run | LoraRun  # the plain harness's run: full fine-tuning (Run) or LoRA (LoraRun)
    mixed_precision: str = "bf16"  # Accelerator(mixed_precision=...): TrainingArguments bf16=True
    trl_sft: str = ""  # TRL's SFTTrainer's step with this SFTConfig.loss_type ("nll", "chunked_nll"): trl_sft.py

    @property
    def lora(self) -> bool:
        return isinstance(self.base, LoraRun)


def meta_model(run: AccelerateRun):
    """LoRA: the peft model on the meta device, built outside FakeTensorMode as the peft harness builds
    it (validation/peft/build.py `build`); full fine-tuning: None (built under the mode)."""
    if not run.lora:
        return None
    from ..peft.build import meta_peft_model

    return meta_peft_model(run.base)


def build(run: AccelerateRun, meta):
    """The plain harness's model and optimizer (under the caller's FakeTensorMode)."""
    if run.lora:
        from ..peft.build import build as build_peft

        return build_peft(meta, run.base)
    from ..hf.step import build as build_hf

    return build_hf(run.base)


def trainer_of(model, accelerator, args=None):
    """A real `transformers.Trainer` whose `training_step` runs our prepared model: its own Accelerator
    replaced by ours (the one that prepared the model), nothing else of its loop used. The model is on its
    device already: `place_model_on_device` is False, the documented override (transformers 5.23
    training_args.py: "Can be subclassed and overridden"), as `.to` cannot swap fake parameters."""
    import tempfile

    from transformers import Trainer, TrainingArguments

    class Arguments(TrainingArguments):
        @property
        def place_model_on_device(self):
            return False

    if args is None:
        args = Arguments(output_dir=tempfile.mkdtemp(), bf16=True, use_cpu=True, report_to=[],
                         per_device_train_batch_size=1, max_grad_norm=1.0)
    trainer = Trainer(model=model, args=args)
    trainer.accelerator = accelerator
    trainer.current_gradient_accumulation_steps = 1  # what _inner_training_loop sets for each step
    return trainer


def run_step(model, opt, accelerator, inputs, phase, trainer):
    if trainer is None:
        return trainer_step(model, opt, accelerator, inputs["input_ids"], phase)
    # the Trainer's own training_step for forward and backward (it marks no phases inside: the forward's
    # peak is the backward phase's too, so the whole step is one "backward" phase plus the optimizer)
    with phase("backward"):
        trainer.training_step(model, dict(inputs))  # a fresh dict: SFTTrainer.compute_loss adds keys to it
    with phase("optimizer"):
        accelerator.clip_grad_norm_([p for p in model.parameters() if p.requires_grad], 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)


def traced_step(run: AccelerateRun, fake: bool = True, seed: int = 0, trainer: bool = False):
    """Two steps, the second logged (validation/core/steps.py): the tracker, the category of each storage,
    the prepared model, the accelerator and the keys of the trainable parameters. `run.trl_sft`: TRL's
    SFTTrainer.training_step (trl_sft.py), whatever `trainer` says."""
    tracker = UnwrappingTracker()
    torch.manual_seed(seed)
    accelerator = make_accelerator(run.mixed_precision, cpu=True)
    meta = meta_model(run)
    trainable: set[int] = set()
    if run.trl_sft:
        trl_sft.check_release()
    with fake_mode(fake), cuda_emulation(tracker), cuda_dropout(), trl_sft.sft_emulation(fake and bool(run.trl_sft)):
        model, opt = build(run, meta)
        if run.trl_sft == "chunked_nll":  # SFTTrainer.__init__ patches the forward before Accelerate wraps it
            trl_sft.patch_head(model)
        # no device placement: the model is on its device already (a GPU run builds it there, making
        # prepare's `model.to(device)` a no-op), and `.to` cannot swap fake parameters
        model, opt = accelerator.prepare(model, opt, device_placement=[False, False])
        if run.trl_sft:
            config = trl_sft.sft_config(run.trl_sft, run.base.micro_batch_size)
            real_trainer = trl_sft.sft_trainer_of(trainer_of(model, accelerator, config))
        else:
            real_trainer = trainer_of(model, accelerator) if trainer else None
        input_ids = torch.randint(0, model.config.vocab_size, (run.base.micro_batch_size, run.base.seq_len))
        inputs = trl_sft.batch(input_ids) if run.trl_sft else {"input_ids": input_ids, "labels": input_ids}

        def owners():
            params = adopt_model(tracker, model, input_ids, trainable)
            if run.trl_sft:
                tracker.adopt(inputs["attention_mask"])  # the batch's, with the input ids
            states = set()
            for state in opt.optimizer.state.values():
                for name, t in state.items():
                    if name == "step" and not run.lora:  # foreach AdamW's counters: on the host in a GPU run
                        tracker.ignore(t)
                    elif torch.is_tensor(t):  # fused AdamW's counters are on the device (peft/step.py)
                        states.add(tracker.adopt(t))
            return params, states

        category = log_second_step(
            tracker, lambda phase: run_step(model, opt, accelerator, inputs, phase, real_trainer), owners,
            lambda: {tracker.key(p.grad) for p in model.parameters() if p.grad is not None})
    return tracker, category, model, accelerator, trainable


def measure(run: AccelerateRun, fake: bool = True, seed: int = 0, trainer: bool = False) -> dict:
    """Bytes per category at each phase's peak of the second step, what prepare did and, for LoRA, the
    plain peft record's parameter split and counts."""
    tracker, category, model, accelerator, trainable = traced_step(run, fake, seed, trainer)
    summary = phase_summary(tracker, category)
    out = {**summary, "accelerate": {"mixed_precision": accelerator.mixed_precision,
                                     "native_amp": fp32_output_copy_active(accelerator)}}
    if run.lora:
        sizes = tracker.live_at(tracker.marks[0][0])
        trainable_bytes = sum(sizes.get(k, 0) for k in trainable)
        out["parameter_bytes"] = {"frozen": summary["parameters"] - trainable_bytes, "trainable": trainable_bytes}
        out["parameter_counts"] = parameter_counts(model)
    return out
