"""One measured step of recipes/full_finetune_single_device.py (torchtune 0.6.1), per batch:

    labels = batch.pop("labels"); with activations_handling_ctx: logits = model(tokens)
    labels = hstack(labels[..., 1:], ignore_labels_cache); loss = loss_fn(logits, labels); del logits
    current_loss = loss * current_num_tokens; current_loss.backward()
    if not optimizer_in_bwd: scale_grads(model, 1 / num_tokens); optimizer.step(); zero_grad(set_to_none)

(clip_grad_norm is null in the recipes' configs.) Step 1 creates the optimizer states; step 2 is
measured. CUDA is emulated as for the HF records (validation/core/emulation.py: FlashAttention-2 for
SDPA, 512-byte blocks, host scalars not counted; F.rms_norm dispatched as on CUDA, validation/core/emulation.py
fused_rms_norm: torchtune's RMSNorm passes an fp32 input with a bf16 scale, which layer_norm.cpp
refuses to fuse, so its composite ops run there as here) and for activation offloading
(validation/torchtune/emulation.py); fused AdamW keeps its step counters on the GPU; torchao's
AdamW8bit steps run eagerly, uncounted, beside the scratch its compiled kernels allocate, counted
(validation/torchtune/emulation.py, eager_compiled_steps).
"""

from __future__ import annotations

from contextlib import nullcontext

import torch

from ..core.emulation import cuda_emulation, fsdp2_storage, fused_rms_norm
from ..core.steps import fake_mode, log_second_step
from ..core.tracker import UnwrappingTracker, phase_summary
from ..core.world import end_world
from .build import TuneRun, meta_model, setup, shard
from .emulation import eager_compiled_steps, offload_emulation

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
    tracker = UnwrappingTracker()
    torch.manual_seed(seed)
    hooked: set[int] = set()  # gradients an in-backward step frees before the optimizer phase
    model = meta_model(run)
    if run.world > 1:
        shard(model, run)  # on meta, outside fake mode (as torchtitan's harness parallelizes)
    else:
        end_world()
    buffers: set[int] = set()
    with fake_mode(fake), cuda_emulation(tracker), offload_emulation(tracker), eager_compiled_steps(tracker), \
            fused_rms_norm(), fsdp2_storage(tracker):
        optimizer, states_of, loss_fn, offload = setup(
            model, run, on_grad=lambda p: hooked.update(tracker.adopt_all(p.grad)) if tracker.recording else None)
        vocab = model.tok_embeddings.num_embeddings
        tokens = torch.randint(0, vocab, (run.batch_size, run.seq_len))
        labels = torch.randint(0, vocab, (run.batch_size, run.seq_len))
        ignore_cache = torch.full((run.batch_size, 1), IGNORE_INDEX)
        args = (model, optimizer, loss_fn, offload, tokens, labels, ignore_cache)

        def owners():
            params = set().union(*(tracker.adopt_all(p) for p in model.parameters()))
            buffers.update(*(tracker.adopt_all(b) for b in model.buffers()))
            for t in (tokens, labels, ignore_cache):
                tracker.adopt(t)
            return params, {k for s in states_of() for t in s.values() if torch.is_tensor(t) for k in tracker.adopt_all(t)}

        category = log_second_step(
            tracker, lambda phase: train_step(*args, phase=phase), owners,
            lambda: hooked | {k for p in model.parameters() if p.grad is not None for k in tracker.adopt_all(p.grad)})
    return tracker, category, model, buffers


def measure(run: TuneRun, fake: bool = True, seed: int = 0) -> dict:
    """Bytes per category at each phase's peak of the second step, the buffers' bytes (RoPE
    caches, counted with the activations) and the parameter count."""
    tracker, category, model, buffers = traced_step(run, fake, seed)
    sizes = tracker.live_at(tracker.marks[0][0])
    return {**phase_summary(tracker, category),
            "buffer_bytes": sum(sizes.get(k, 0) for k in buffers),
            "parameter_count": sum(p.numel() for p in model.parameters())}
