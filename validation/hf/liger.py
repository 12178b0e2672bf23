"""Liger-Kernel's patched model in the HF harness (training.liger_kernel, estimator/memory/liger.py).

The model is patched as the Trainer's use_liger_kernel patches it (transformers 5.23 integrations/liger.py:
liger_kernel.transformers._apply_liger_kernel_to_instance(model=...) with no kernel_config, i.e. the model type's
defaults). Liger's Python wrappers allocate every tensor with torch.empty*/zeros* and launch Triton kernels on
them; under FakeTensorMode the allocations are seen and the launches do nothing (`triton_launches_stubbed`). The
wrappers also branch on the device; a CPU run takes branches a CUDA run does not, so those conditions are
rewritten to the CUDA answer (an H100: compute capability 9.0, 132 SMs) in a copy of the function
(`cuda_branches`), and the two values a fake tensor cannot give (.item(), torch.equal) are replaced by what the
measured step has (every target counted; the loss is a mean, so its gradient is 1.0, which skips an in-place
scale). Needs liger-kernel 0.8.5 (its own venv, /work/venvs/liger: pip install liger-kernel==0.8.5 --no-deps with
torch pinned); triton 3.9 imports on the CPU.
"""

from __future__ import annotations

import inspect
from contextlib import ExitStack, contextmanager

import torch

RELEASE = "0.8.5"
H100_SMS = 132

# (module, function, [(the CPU-side condition or value, the CUDA run's)]) of liger-kernel 0.8.5's ops
_FLCE = "liger_kernel.ops.fused_linear_cross_entropy"
_REWRITES = (
    (_FLCE, "_can_use_mm_out", [
        ('_input.device.type != "cuda"', "False"),
        # the CUDA autocast the CUDA run asks about is this harness's autocast on the batch's device
        ("torch.is_autocast_enabled()", "torch.is_autocast_enabled(_input.device.type)"),
        ('torch.get_autocast_dtype("cuda")', "torch.get_autocast_dtype(_input.device.type)"),
    ]),
    (_FLCE, "fused_linear_cross_entropy_forward", [
        ("target_mask.sum().item()", "target_mask.numel()"),
        ('grad_weight.device.type == "cuda"', "True"),
        ("torch.cuda.get_device_capability(grad_weight.device)[0] >= 8", "True"),
    ]),
    (_FLCE, "fused_linear_cross_entropy_backward", [
        ("not torch.equal(grad_output, torch.tensor(1.0, device=grad_output.device))", "False"),
    ]),
    ("liger_kernel.ops.rms_norm", "rms_norm_backward", [
        ('X.device.type == "cuda"', "True"),
        ("torch.cuda.get_device_properties(X.device).multi_processor_count", str(H100_SMS)),
    ]),
)


def apply(model) -> None:
    """What the Trainer's use_liger_kernel does to the model (liger's defaults for its model type)."""
    from importlib.metadata import version

    from liger_kernel.transformers import _apply_liger_kernel_to_instance

    if version("liger-kernel") != RELEASE:  # the records name the release, and the rewrites are its source's
        raise RuntimeError(f"liger-kernel {version('liger-kernel')} installed; the Liger cases measure {RELEASE}")
    _apply_liger_kernel_to_instance(model=model)


@contextmanager
def liger_emulation():
    """The Triton launches stubbed and the device branches answered as on CUDA, for the duration of a run."""
    with ExitStack() as stack:
        stack.enter_context(triton_launches_stubbed())
        for module, name, rewrites in _REWRITES:
            stack.enter_context(cuda_branches(module, name, rewrites))
        yield


@contextmanager
def triton_launches_stubbed():
    """`kernel[grid](...)` launches nothing (triton.runtime.jit.KernelInterface.__getitem__, JITFunction's and
    the autotuner's): the kernels write into tensors the wrappers allocated, which fake tensors hold no data of."""
    from triton.runtime.jit import KernelInterface

    saved = KernelInterface.__getitem__
    KernelInterface.__getitem__ = lambda self, grid: (lambda *args, **kwargs: None)
    try:
        yield
    finally:
        KernelInterface.__getitem__ = saved


@contextmanager
def cuda_branches(module_name: str, name: str, rewrites: list[tuple[str, str]]):
    """`module.name` replaced by a copy of its source with each condition rewritten (each must occur)."""
    import importlib

    module = importlib.import_module(module_name)
    original = getattr(module, name)
    source = inspect.getsource(original)
    if source.split("\n", 1)[0].startswith("@"):
        raise RuntimeError(f"{module_name}.{name} is decorated: its copy would lose the decorator")
    for old, new in rewrites:
        if old not in source:
            raise RuntimeError(f"liger-kernel {RELEASE}'s {module_name}.{name} no longer has {old!r}")
        source = source.replace(old, new)
    scope: dict = {}
    exec(compile(source, inspect.getsourcefile(original), "exec"), module.__dict__, scope)
    setattr(module, name, scope[name])
    try:
        yield
    finally:
        setattr(module, name, original)

