"""Cases that run one framework kernel for real on the GPU rather than a whole training step: what the
kernel holds for backward and its transient peak, where the fake-tensor harness reads them from a
CPU emulation or from Inductor's CPU code.

- `megatron-cross-entropy`: Megatron-Core's vocab-parallel cross-entropy, unfused
  (tensor_parallel/cross_entropy.py `vocab_parallel_cross_entropy`) and the native fusion
  (fusions/fused_cross_entropy.py `fused_vocab_parallel_cross_entropy`, whose `jit_fuser` is
  torch.compile), on bf16 logits [s, b, V] at TP 1. Each implementation runs twice (the first call
  compiles) and the second is measured: allocated bytes above the logits after the forward (what it
  saves), the forward's and the backward's peaks above their starts, after the backward.
Megatron-Core is not on the GPU machine: it travels as its wheel (pure Python for these modules).
"""

from __future__ import annotations

import os
from contextlib import contextmanager
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class KernelRun:
    kernel: str
    seq_len: int
    micro_batch_size: int
    vocab: int

    @property
    def id(self) -> str:
        return f"{self.kernel}-bf16-s{self.seq_len}-b{self.micro_batch_size}-v{self.vocab}"


@contextmanager
def _megatron_world():
    """A world of one rank and Megatron's parallel state at TP 1, ended on the way out (a later harness in
    the same process, the Megatron one, sets up its own)."""
    import torch.distributed as dist
    from megatron.core import parallel_state

    from .framework_step import free_port

    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(free_port()))  # a fixed port collides with other processes
    if dist.is_initialized():
        dist.destroy_process_group()
    dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo", rank=0, world_size=1)
    parallel_state.initialize_model_parallel(1)
    try:
        yield
    finally:
        parallel_state.destroy_model_parallel()
        dist.destroy_process_group()


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def _allocated(device: str) -> int:
    return torch.cuda.memory_allocated() if device == "cuda" else 0


def _peak(device: str) -> int:
    return torch.cuda.max_memory_allocated() if device == "cuda" else 0


def _reset(device: str) -> None:
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()


def _measure_loss(fn, run: KernelRun, device: str) -> dict:
    s, b, v = run.seq_len, run.micro_batch_size, run.vocab
    logits = torch.randn(s, b, v, device=device, dtype=torch.bfloat16, requires_grad=True)
    target = torch.randint(0, v, (s, b), device=device)
    _sync(device)
    base = _allocated(device)
    _reset(device)
    loss = fn(logits, target)
    _sync(device)
    forward_peak, saved = _peak(device) - base, _allocated(device) - base
    _reset(device)
    middle = _allocated(device)
    loss.sum().backward()  # Megatron's loss_func: (loss * mask).sum() / tokens, a [s, b] gradient
    _sync(device)
    backward_peak, after = _peak(device) - middle, _allocated(device) - base
    grad = logits.grad.untyped_storage().nbytes()
    return {"logits_bytes": logits.untyped_storage().nbytes(), "forward_peak_above_start": forward_peak,
            "saved_after_forward": saved, "backward_peak_above_start": backward_peak,
            "after_backward_above_logits": after, "logits_grad_bytes": grad}


def megatron_cross_entropy(run: KernelRun, device: str = "cuda") -> dict:
    from megatron.core import parallel_state
    from megatron.core.fusions.fused_cross_entropy import fused_vocab_parallel_cross_entropy
    from megatron.core.tensor_parallel.cross_entropy import vocab_parallel_cross_entropy

    out = {}
    with _megatron_world():
        group = parallel_state.get_tensor_model_parallel_group()
        impls = {"unfused": vocab_parallel_cross_entropy,
                 "fused": lambda logits, target: fused_vocab_parallel_cross_entropy(logits, target, group)}
        for name, fn in impls.items():
            _measure_loss(fn, run, device)  # the first call compiles the fused kernels
            out[name] = _measure_loss(fn, run, device)
    import megatron.core

    out["megatron_core"] = getattr(megatron.core, "__version__", None)
    return out


KERNELS = {"megatron-cross-entropy": megatron_cross_entropy}


def measure_kernel(run: KernelRun, device: str) -> dict:
    if device == "cuda":
        torch.cuda.init()
        torch.zeros(1, device=device)
    return KERNELS[run.kernel](run, device)
