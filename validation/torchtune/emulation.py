"""What a CPU run needs, beyond validation/core/emulation.py, to allocate what torchtune's activation
offloading allocates on a GPU.

`OffloadActivations` (torchtune/training/_activation_offloading.py) is a saved-tensors hook. In
the forward it copies every saved activation of at least 1024 bytes that is not a parameter or
buffer into a pinned host tensor on a side stream, and keeps the GPU original alive in
`fwd_stash` until 5 later activations have been packed (max_fwd_stash_size) or the backward
begins; in the backward it copies each one back to a new GPU tensor and frees it once the next
autograd node starts. Its code runs unchanged here, with:
- CUDA streams and events as no-ops (every copy is complete when issued, so a reference is
  dropped exactly where the code drops it: the GPU memory follows the code's own waits);
- the pinned host copy (`torch.empty_like(..., pin_memory=True, device="cpu")`) made where the
  tracker does not count it (host memory);
- `host_tensor.to("cuda")` a new storage of the same size, counted (the copy back);
- `record_stream` a no-op (the block is counted until its tensor is freed).
"""

from __future__ import annotations

import weakref
from contextlib import contextmanager, nullcontext

import torch


class _Stream:
    def wait_event(self, event) -> None:
        pass

    def wait_stream(self, stream) -> None:
        pass

    def record_event(self, event=None):
        return object()


def _names_cuda(value) -> bool:
    return (isinstance(value, str) and value.startswith("cuda")) or \
        (isinstance(value, torch.device) and value.type == "cuda")


def _copy_to_device(host_ref):
    """`host.to("cuda")` of a pinned host copy: a new device storage of its size."""
    def to(*args, **kwargs):
        host = host_ref()
        if any(_names_cuda(a) for a in args[:1]) or _names_cuda(kwargs.get("device")):
            return host.clone()
        return torch.Tensor.to(host, *args, **kwargs)

    return to


@contextmanager
def offload_emulation(tracker):
    cuda = torch.cuda
    saved = (cuda.default_stream, cuda.Stream, cuda.stream, torch.empty_like, torch.Tensor.record_stream)
    original_empty_like = saved[3]

    def empty_like(x, *args, pin_memory=False, **kwargs):
        if not pin_memory:
            return original_empty_like(x, *args, **kwargs)
        with tracker.hidden():  # host memory: never counted
            host = original_empty_like(x, *args, **kwargs)
        tracker.ignore(host)
        # only this tensor's `.to` changes (torch.Tensor.to itself is left alone: tensor
        # subclasses such as torchao's NF4 key their __torch_function__ tables on it)
        host.to = _copy_to_device(weakref.ref(host))
        return host

    cuda.default_stream = lambda *a, **k: _Stream()
    cuda.Stream = lambda *a, **k: _Stream()
    cuda.stream = lambda *a, **k: nullcontext()
    torch.empty_like = empty_like
    torch.Tensor.record_stream = lambda self, stream: None
    try:
        yield
    finally:
        cuda.default_stream, cuda.Stream, cuda.stream, torch.empty_like, torch.Tensor.record_stream = saved


def compiled_step_scratch(states) -> list:
    """The scratch Inductor's kernels for torchao's single_param_adam (torchao 0.7.0-0.10.0
    optim/adam.py, identical in those releases) allocate for one parameter: for each 8-bit state
    (OptimState8bit) its new uint8 codes and its new fp32 block scales, written by the fused
    reduction kernel and copied into the state afterwards; for states kept as plain tensors
    (under 4096 elements) one pointwise kernel writes in place and allocates nothing. Read from the
    Triton code Inductor (torch 2.13) generates for the step: validation/torchtune/inductor_scratch.py."""
    return [torch.empty_like(part) for s in states if hasattr(s, "codes") for part in (s.codes, s.scale)]


@contextmanager
def eager_compiled_steps(tracker):
    """torchao's low-bit AdamW steps each parameter with `torch.compile(single_param_adam,
    fullgraph=True)`; torch.compile cannot trace under a TorchDispatchMode. The function runs
    eagerly instead, where the tracker does not look (the compiled kernel updates the parameter
    and the 8-bit states in place), beside the scratch the compiled kernels allocate, counted
    (compiled_step_scratch: the arguments exp_avg and exp_avg_sq)."""
    original = torch.compile

    def compile(fn=None, **kwargs):
        def run_hidden(*args, **kw):
            scratch = compiled_step_scratch(args[3:5])
            with tracker.hidden():
                out = fn(*args, **kw)
            del scratch
            return out

        return run_hidden

    torch.compile = compile
    try:
        yield
    finally:
        torch.compile = original
