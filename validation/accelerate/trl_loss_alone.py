"""TRL's `_chunked_cross_entropy_loss` (trl 1.9.0 sft_trainer.py) run alone under fake tensors with the CUDA
emulation, with and without autocast: what it keeps from forward to backward and holds at each pass's peak, above
its inputs (the final norm's output and the head's weight).

The whole SFTTrainer step is measured under Accelerate's autocast (validation/accelerate/trl_sft.py); a 16-bit model
run without autocast (DeepSpeed ZeRO 0-2, the HF Trainer's FSDP2) calls the same function on 16-bit tensors, and
this run measures that call the way compute_loss makes it: the loss kept, the metrics' tensors (correct tokens,
entropy sum, valid count) dropped before the backward, so that autograd frees the recomputed chunk's entropy
branch (non-reentrant checkpointing keeps a recomputed tensor only for a saved-tensor holder still alive)."""

from __future__ import annotations

import gc
import importlib

CHUNK = 256  # trl 1.9.0 sft_trainer.py _CHUNKED_LM_HEAD_CHUNK_SIZE


def measure(batch: int, seq: int, hidden_size: int, vocab: int, autocast: bool) -> dict:
    """Bytes above the inputs: `saved` after the forward, `forward` and `backward` at each pass's peak."""
    import torch

    from ..core.emulation import cuda_emulation
    from ..core.steps import fake_mode
    from ..core.tracker import StorageTracker
    from .trl_sft import check_release, sft_emulation

    check_release()
    tracker = StorageTracker()
    with fake_mode(True, real_inputs=False), cuda_emulation(tracker), sft_emulation(True), tracker:
        sft = importlib.import_module("trl.trainer.sft_trainer")
        hidden = torch.randn(batch, seq, hidden_size, dtype=torch.bfloat16).requires_grad_()
        weight = torch.nn.Parameter(torch.randn(vocab, hidden_size, dtype=torch.bfloat16))
        labels = torch.randint(0, vocab, (batch, seq))
        tracker.start()
        inputs = sum(tracker._size.values())
        with tracker.phase("forward"), torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            loss = sft._chunked_cross_entropy_loss(hidden, weight, CHUNK, labels=labels)[0]  # the metrics dropped
        gc.collect()
        saved = sum(tracker._size.values()) - inputs
        with tracker.phase("backward"):
            loss.backward()
        tracker.stop()
    peaks = tracker.peaks(lambda key: "activations")
    return {"saved": saved, "forward": peaks["forward"]["total"] - inputs,
            "backward": peaks["backward"]["total"] - inputs}
