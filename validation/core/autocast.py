"""CUDA autocast's fp32 lists, applied to a CPU run's autocast.

`torch.autocast("cpu", ...)` and `torch.autocast("cuda", ...)` cast different ops. CUDA's autocast runs
every op of `AT_FORALL_FP32` in fp32 (its floating-point tensor arguments cast to fp32 first) and gives
every op of `AT_FORALL_FP32_SET_OPT_DTYPE` `dtype=torch.float32` where the caller gave none
(aten/src/ATen/autocast_mode.h and autocast_mode.cpp, `TORCH_LIBRARY_IMPL(aten, Autocast, m)`; torch
2.11 and 2.13 alike, the header ships in the wheel as torch/include/ATen/autocast_mode.h). The CPU's
lists (`TORCH_LIBRARY_IMPL(aten, AutocastCPU, m)`) leave most of those ops alone: `pow`, `exp`, `rsqrt`,
`layer_norm`, `softmax`, `sum` keep a bf16 input in bf16 there.

What it changes for memory: the cast is recorded by autograd, so what the op saves for backward is the
fp32 copy, and the op's output (and what follows it) is fp32. GPT-2's `NewGELUActivation`
(transformers activations.py: `0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 * pow(x, 3))))`) is the
case the H200 showed: under CUDA autocast `pow` turns the MLP's bf16 activation into fp32, and the whole
tanh chain after it is fp32 (gpt2-medium-8layers-amp-...-eager-s1024-b4: 805,306,368 B more at the peak
than a CPU autocast run, 100,663,296 B a layer).

`cuda_autocast_lists` registers, for the duration of a measurement, a kernel on the `AutocastCPU`
dispatch key for each op CUDA lists and the CPU does not (the ops that already have an `AutocastCPU`
kernel, the losses, `cdist`, `prod`, are on the CPU's fp32 list already); the kernel casts as CUDA's
`cached_cast(at::kFloat, ...)` does (a floating-point tensor other than fp64 is cast; fp32 casts are
never cached) and redispatches below autocast. Only an enabled CPU autocast reaches the key, so runs
without autocast are unchanged. Not emulated (no model we measure calls them on half tensors): CUDA's
lower-precision ops the CPU does not list (`einsum`, `addmv`, `addr`, `mv`, `chain_matmul`,
`linalg_multi_dot`, the RNN cells) and the `norm` overloads CUDA redispatches with an fp32 dtype.
"""

from __future__ import annotations

from contextlib import contextmanager

import torch

# autocast_mode.h, AT_FORALL_FP32 (torch 2.13's; torch 2.11's is the same list)
FP32 = (
    "acos", "asin", "cosh", "erfinv", "exp", "expm1", "log", "log10", "log2", "log1p", "reciprocal", "rsqrt", "sinh",
    "tan", "pow.Tensor_Scalar", "pow.Tensor_Tensor", "pow.Scalar", "softplus", "layer_norm", "native_layer_norm",
    "rms_norm", "group_norm", "frobenius_norm.dim", "nuclear_norm", "nuclear_norm.dim", "cosine_similarity",
    "poisson_nll_loss", "cosine_embedding_loss", "nll_loss", "nll_loss2d", "hinge_embedding_loss", "kl_div", "l1_loss",
    "smooth_l1_loss", "huber_loss", "mse_loss", "margin_ranking_loss", "multilabel_margin_loss", "soft_margin_loss",
    "triplet_margin_loss", "multi_margin_loss", "binary_cross_entropy_with_logits", "dist", "pdist", "cdist", "renorm",
    "logsumexp", "upsample_nearest1d", "_upsample_nearest_exact1d", "upsample_nearest2d", "_upsample_nearest_exact2d",
    "upsample_nearest3d", "_upsample_nearest_exact3d", "upsample_linear1d", "upsample_bilinear2d",
    "_upsample_bilinear2d_aa", "upsample_trilinear3d", "upsample_bicubic2d", "_upsample_bicubic2d_aa",
)
# autocast_mode.h, AT_FORALL_FP32_SET_OPT_DTYPE: the op's own `dtype` argument set to fp32 when not given
FP32_SET_OPT_DTYPE = (
    "prod", "prod.dim_int", "softmax.int", "log_softmax.int", "cumprod", "cumsum", "linalg_vector_norm",
    "linalg_matrix_norm", "linalg_matrix_norm.str_ord", "sum", "sum.dim_IntList",
)

_CPU = torch._C.DispatchKey.AutocastCPU


def _eligible(x) -> bool:
    """autocast_mode.h `is_eligible`: a defined floating-point tensor on the device, not fp64."""
    return isinstance(x, torch.Tensor) and x.is_floating_point() and x.dtype != torch.float64 and x.device.type == "cpu"


def _fp32(x):
    if _eligible(x):
        return x.to(torch.float32)
    if isinstance(x, (list, tuple)):
        return type(x)(_fp32(y) for y in x)
    return x


def _op(name: str):
    packet, _, overload = name.partition(".")
    return getattr(getattr(torch.ops.aten, packet), overload or "default")


def _below_autocast():
    return torch._C._ExcludeDispatchKeyGuard(torch._C.DispatchKeySet(_CPU))


def _fp32_kernel(op):
    def kernel(*args, **kwargs):
        with _below_autocast():
            return op(*(_fp32(a) for a in args), **{k: _fp32(v) for k, v in kwargs.items()})
    return kernel


def _set_opt_dtype_kernel(op):
    # autocast_mode.cpp WrapFunction_ for CastPolicy::fp32_set_opt_dtype: `firstarg_is_eligible` ?
    # call with set_opt_dtype(at::kFloat, dtype) : call unchanged. The dtype is the op's last argument.
    dtype_at = next(i for i, a in enumerate(op._schema.arguments) if a.name == "dtype")

    def kernel(*args, **kwargs):
        with _below_autocast():
            if args and _eligible(args[0]):
                if len(args) > dtype_at:
                    if args[dtype_at] is None:
                        args = (*args[:dtype_at], torch.float32, *args[dtype_at + 1:])
                elif kwargs.get("dtype") is None:
                    kwargs = {**kwargs, "dtype": torch.float32}
            return op(*args, **kwargs)
    return kernel


def listed_on_cpu(name: str) -> bool:
    """Whether the CPU's autocast already has a kernel for the op (then its policy applies, not ours)."""
    packet, _, overload = name.partition(".")
    return torch._C._dispatch_has_kernel_for_dispatch_key(f"aten::{packet}" + (f".{overload}" if overload else ""),
                                                         "AutocastCPU")


@contextmanager
def cuda_autocast_lists():
    """Give CPU autocast CUDA's fp32 policies for the ops it does not list (module docstring)."""
    lib = torch.library.Library("aten", "IMPL")
    for names, make in ((FP32, _fp32_kernel), (FP32_SET_OPT_DTYPE, _set_opt_dtype_kernel)):
        for name in names:
            if not listed_on_cpu(name):
                lib.impl(name, make(_op(name)), "AutocastCPU")
    try:
        yield
    finally:
        lib._destroy()
