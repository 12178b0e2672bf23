"""One measured step of recipes/full_finetune_single_device.py (torchtune 0.6.1), per batch:

    labels = batch.pop("labels"); with activations_handling_ctx: logits = model(tokens)
    labels = hstack(labels[..., 1:], ignore_labels_cache); loss = loss_fn(logits, labels); del logits
    current_loss = loss * current_num_tokens; current_loss.backward()
    if not optimizer_in_bwd: scale_grads(model, 1 / num_tokens); optimizer.step(); zero_grad(set_to_none)

(clip_grad_norm is null in the recipes' configs.) Step 1 creates the optimizer states; step 2 is
measured. CUDA is emulated as for the HF records (validation/emulation.py: FlashAttention-2 for
SDPA, 512-byte blocks, host scalars not counted; F.rms_norm dispatched as on CUDA, validation/emulation.py
fused_rms_norm: torchtune's RMSNorm passes an fp32 input with a bf16 scale, which layer_norm.cpp
refuses to fuse, so its composite ops run there as here) and for activation offloading
(validation/torchtune/emulation.py); fused AdamW keeps its step counters on the GPU; torchao's
AdamW8bit steps run eagerly, uncounted (validation/torchtune/emulation.py, eager_compiled_steps).
"""

from __future__ import annotations

import gc
from contextlib import nullcontext

import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from ..emulation import cuda_emulation, fused_rms_norm
from ..peft.step import Tracker
from ..tracker import categories, phase_summary
from .build import TuneRun, meta_model, setup, shard
from .emulation import eager_compiled_steps, fsdp_storage, offload_emulation

IGNORE_INDEX = -100  # CEWithChunkedOutputLoss / CrossEntropyLoss default, the recipe's ignore index


def train_step(model, optimizer, loss_fn, offload, tokens, labels, ignore_cache, phase=lambda n: nullcontext()):
    with phase("forward"):
        num_tokens = (labels != IGNORE_INDEX).sum()
        with offload:
            logits = model(tokens)
        shifted = torch.hstack((labels[..., 1:], ignore_cache[: labels.shape[0]]))
        if not isinstance(logits, list):
            shifted = shifted.reshape(-1)
            logits = logits.reshape(-1, logits.size(-1))
        loss = loss_fn(logits, shifted)
        del logits  # "free logits otherwise it peaks backward memory"
        current_loss = loss * num_tokens
        del loss
        running_loss = 0 + current_loss  # the recipe keeps the running loss to log after the step
    with phase("backward"):
        current_loss.backward()
        del current_loss
    with phase("optimizer"):
        if optimizer is not None:
            from torchtune import training

            world = torch.distributed.get_world_size() if torch.distributed.is_initialized() else 1
            if world > 1:  # lora_finetune_distributed: the tokens of every rank; undo FSDP2's 1 / world
                torch.distributed.all_reduce(num_tokens)
            training.scale_grads(model, world / num_tokens)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
    del running_loss


def traced_step(run: TuneRun, fake: bool = True, seed: int = 0):
    tracker = Tracker()
    tracker.recording = False
    torch.manual_seed(seed)
    grads: set[int] = set()
    model = meta_model(run)
    if run.world > 1:
        shard(model, run)  # on meta, outside fake mode (as torchtitan's harness parallelizes)
    elif torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()
    mode = FakeTensorMode(allow_non_fake_inputs=True) if fake else nullcontext()
    with mode, cuda_emulation(tracker), offload_emulation(tracker), eager_compiled_steps(tracker), fused_rms_norm(), \
            fsdp_storage(tracker):
        optimizer, states_of, loss_fn, offload = setup(
            model, run, on_grad=lambda p: grads.update(tracker.adopt_all(p.grad)) if tracker.recording else None)
        vocab = model.tok_embeddings.num_embeddings
        tokens = torch.randint(0, vocab, (run.batch_size, run.seq_len))
        labels = torch.randint(0, vocab, (run.batch_size, run.seq_len))
        ignore_cache = torch.full((run.batch_size, 1), IGNORE_INDEX)
        args = (model, optimizer, loss_fn, offload, tokens, labels, ignore_cache)
        with tracker:
            train_step(*args)  # step 1: creates the optimizer states
            gc.collect()
            tracker.start()
            params = set().union(*(tracker.adopt_all(p) for p in model.parameters()))
            buffers = set().union(set(), *(tracker.adopt_all(b) for b in model.buffers()))
            for t in (tokens, labels, ignore_cache):
                tracker.adopt(t)
            states = {k for s in states_of() for t in s.values() if torch.is_tensor(t) for k in tracker.adopt_all(t)}

            def phase(name):
                if name == "optimizer":
                    grads.update(k for p in model.parameters() if p.grad is not None for k in tracker.adopt_all(p.grad))
                return tracker.phase(name)

            train_step(*args, phase=phase)
            tracker.stop()

    category = categories(params, grads, states)

    return tracker, category, model, buffers


def measure(run: TuneRun, fake: bool = True, seed: int = 0) -> dict:
    """Bytes per category at each phase's peak of the second step, the buffers' bytes (RoPE
    caches, counted with the activations) and the parameter count."""
    tracker, category, model, buffers = traced_step(run, fake, seed)
    sizes = tracker.live_at(tracker.marks[0][0])
    return {**phase_summary(tracker, category),
            "buffer_bytes": sum(sizes.get(k, 0) for k in buffers),
            "parameter_count": sum(p.numel() for p in model.parameters())}
