"""What it takes to run torchtitan 0.3.0 on a CPU-only machine with a CUDA run's allocations.

Each patch is local, applied for the duration of a measurement by `cpu_emulation(tracker)`, and
undone afterwards (except the device type, which torchtitan reads once at import):

1. Device: `torchtitan.tools.utils.device_type` is computed at import ("cuda" on a CPU build);
   the meshes, the trainer and `ParallelDims` must see "cpu". `use_cpu_device()` runs before
   any other torchtitan import.
2. FlexAttention: torchtitan's `FlexAttention` runs `torch.compile(flex_attention)`
   (models/common/attention.py); Inductor's Triton template is CUDA-only and the eager CPU
   fallback materialises the scores. `FlexKernel` makes the compiled CUDA kernel's
   allocations instead, from torch/_inductor/kernel/flex/flex_attention.py (torch 2.13):
   forward: `out` laid out like the query, fp32 `logsumexp` (B, Hq, L) and fp32 `max_scores`
   (B, Hq, L, returned by the kernel but not saved, so freed at once); saved for backward (by
   `FlexAttentionAutogradOp.forward`): q, k, v, out, logsumexp and the block mask's tensors.
   backward: fp32 `delta` = sum(out * grad_out, -1) (B, Hq, L) (mul and sum fuse into one
   reduction), `grad_query` like q, `broadcasted_grad_value` and `broadcasted_grad_key` shaped
   like v and k (B, Hkv, L, D): GQA is reduced inside the kernel, so nothing is expanded.
   The values of a real CPU run come from the math SDPA, where the tracker does not look.
3. The block mask: `create_attention_mask` is `torch.compile(create_block_mask)`; the eager
   function builds the same BlockMask (same tensors) and runs on CPU. Context parallelism
   rebuilds each rank's mask (its s/cp query rows against all s keys, the load balancer's
   order) through torch's own cached `torch.compile(create_block_mask)`
   (torch/distributed/tensor/experimental/_context_parallel/_attention.py,
   `_create_cp_block_mask`, module global `_compiled_create_block_mask`): the eager function
   takes its place too.
4. float8: torchtitan's Float8LinearConverter refuses to convert below SM 8.9; the check
   answers as an H100 (SM 9.0) would.
5. FSDP2 frees and re-allocates the unsharded parameters with `storage.resize_`
   (`free_storage` / `alloc_storage` in torch/distributed/fsdp/_fully_shard/_fsdp_param.py),
   which no dispatch mode sees; on a GPU each is a caching-allocator free / allocation. The
   patched versions tell the tracker the storage's new size (validation/core/emulation.py
   `fsdp2_storage`, shared with the torchtune harness).
6. RMSNorm: `nn.RMSNorm` -> `F.rms_norm` -> `aten::rms_norm` (CompositeImplicitAutograd) calls
   `at::_fused_rms_norm` (aten/src/ATen/native/layer_norm.cpp, `rms_norm_symint`). The CPU
   build registers no CPU kernel for it, so its CompositeImplicitAutograd kernel
   (`rms_norm_composite`) runs op by op and autograd keeps an fp32 upcast, the fp32 normalised
   copy and the rstd. On CUDA the op has a kernel, so autograd takes derivatives.yaml's formula
   for `_fused_rms_norm`: it saves `input`, `weight` and `result1` (the rstd) and calls
   `_fused_rms_norm_backward`. `_fused_rms_norm_cuda` (aten/src/ATen/native/cuda/
   layer_norm_kernel.cu) allocates Y = empty_like(input) and rstd = empty({M}, fp32) (M rows,
   viewed (..., 1)); `_fused_rms_norm_backward_cuda` allocates dX = empty_like(input) and
   dgamma = empty_like(gamma). `fused_rms_norm()` registers CPU kernels for both ops for the
   duration of a measurement, so the CPU run takes the CUDA dispatch path; they return those
   tensors, with values from torch's own decompositions (torch/_decomp/decompositions.py
   `_fused_rms_norm`, `_fused_rms_norm_backward`), which fake tensors run as well, unseen by
   the tracker (validation/core/emulation.py, shared with the torchtune harness). Left out:
   `LaunchGammaBetaBackwardCUDAKernel`'s partial dgamma buffer, made
   only when M > 65536 and N / 32 < SMs / 2 (the q/k norms): blocks.y x N in the weight's
   dtype with blocks.y <= 32768 / (N / 32), so at most 32768 x 32 elements (2 MiB), freed at once. With
   the optional nvidia-cutlass-dsl, torch 2.13 on SM 9.x/10.x runs quack's kernels instead
   (torch/_native/ops/norm/norms.py): the same outputs and saved tensors.
7. float8 matmuls on a real CPU run: torch 2.13's CPU kernel of `aten::_scaled_mm` takes
   seconds for one 512 x 256 x 768 product (an element-wise reference loop), so a float8 twin ran
   for minutes. For the duration of a measurement its CPU kernel is the same product in fp32,
   scaled and cast to `out_dtype` (`fast_scaled_mm`): one output of the kernel's shape and dtype,
   its temporaries unseen by the tracker, as for item 6; fake tensors keep the meta function.
"""

from __future__ import annotations

from contextlib import contextmanager

import torch
import torch.nn.functional as F
from torch._subclasses.fake_tensor import FakeTensor

from ..core.emulation import fsdp2_storage, fused_rms_norm


def use_cpu_device() -> None:
    """Point torchtitan at the CPU: its `tools.utils` and every torchtitan module already imported that
    bound `device_type` / `device_module` by name (`from torchtitan.tools.utils import device_type`:
    distributed/parallel_dims.py, distributed/utils.py, ...), which an import of torchtitan before the
    harness's (another test, a loss import) would otherwise leave at "cuda"."""
    import sys

    import torchtitan.tools.utils as utils

    found_type, found_module = utils.device_type, utils.device_module  # as computed at import
    for name, module in list(sys.modules.items()):
        if name == "torchtitan" or name.startswith("torchtitan."):
            if getattr(module, "device_type", None) == found_type:
                module.device_type = "cpu"
            if getattr(module, "device_module", None) is found_module:
                module.device_module = torch.cpu


# The compiled flex region reaches torchtitan's SelectiveAC policy as one op (the
# `inductor_compiled_code` HOP, in its must-save list), so its outputs (out and the logsumexp it
# saves) are kept, not recomputed. A custom op stands for it here and joins that list.
@torch.library.custom_op("titan_emulation::flex_forward", mutates_args=())
def flex_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float | None
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """Real CPU values (the math SDPA, unseen by the tracker: a dispatch mode does not see
    inside the op it is handling); the allocations are `_flex_outputs`."""
    out, lse = _flex_outputs(q, v)
    with torch.no_grad():
        out.copy_(F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale, enable_gqa=True))
    return out, lse


@flex_forward.register_fake
def _(q, k, v, scale):
    return _flex_outputs(q, v)


def _flex_outputs(q, v):
    """out: (B, Hq, L, Dv) in the query's dimension order; logsumexp: fp32 (B, Hq, L)."""
    b, hq, s, _ = q.shape
    return _dense_like(q, (b, hq, s, v.shape[-1])), q.new_empty((b, hq, s), dtype=torch.float32)


def _flex_setup(ctx, inputs, output):
    q, k, v, scale = inputs
    out, lse = output
    ctx.save_for_backward(q, k, v, out, lse)
    ctx.scale = scale


def _flex_backward(ctx, grad_out, grad_lse):
    q, k, v, out, lse = ctx.saved_tensors
    b, hq, s, _ = q.shape
    delta = q.new_empty((b, hq, s), dtype=torch.float32)
    grad_q, grad_k, grad_v = _dense_like(q), _dense_like(k), _dense_like(v)
    if not isinstance(q, FakeTensor):
        with _hidden[-1](), torch.enable_grad():
            leaves = [x.detach().requires_grad_() for x in (q, k, v)]
            ref = F.scaled_dot_product_attention(*leaves, is_causal=True, scale=ctx.scale,
                                                 enable_gqa=True)
            for buf, g in zip((grad_q, grad_k, grad_v), torch.autograd.grad(ref, leaves, grad_out)):
                buf.copy_(g)
    del delta
    return grad_q, grad_k, grad_v, None


flex_forward.register_autograd(_flex_backward, setup_context=_flex_setup)
_hidden = []  # the tracker's `hidden` context of the measurement in progress


def _dense_like(t: torch.Tensor, shape=None) -> torch.Tensor:
    """`infer_dense_strides(shape, t.stride())`: a dense tensor (of t's shape unless given)
    with t's dimension order."""
    shape = tuple(t.shape) if shape is None else shape
    order = sorted(range(t.dim()), key=lambda d: t.stride(d), reverse=True)
    physical = t.new_empty([shape[d] for d in order])
    return physical.permute([order.index(d) for d in range(t.dim())])


def _flex_forward():
    def forward(self, q_BLNH, k_BLNH, v_BLNH, *, attention_masks, score_mod=None, scale=None,
                enable_gqa=False, out_transform=None, **kwargs):
        if score_mod is not None or out_transform is not None:
            raise NotImplementedError("only the plain masked flex attention is emulated")
        out, lse = flex_forward(q_BLNH.transpose(1, 2), k_BLNH.transpose(1, 2),
                                v_BLNH.transpose(1, 2), scale)
        # max_scores: a kernel output nothing reads, freed by Inductor at once
        del lse
        max_scores = q_BLNH.new_empty(q_BLNH.shape[:3], dtype=torch.float32)
        del max_scores
        return out.transpose(1, 2)

    return forward


def _scaled_mm_in_fp32(self, mat2, scale_a, scale_b, bias=None, scale_result=None, out_dtype=None,
                       use_fast_accum=False):
    """`aten::_scaled_mm` (item 7): (A B) x scale_a x scale_b (+ bias), tensorwise scales or rowwise ones
    ((M, 1) and (1, N)), cast to `out_dtype`."""
    out = torch.mm(self.float(), mat2.float()) * scale_a.float() * scale_b.float()
    if bias is not None:
        out = out + bias.float()
    return out.to(out_dtype or self.dtype)


@contextmanager
def fast_scaled_mm():
    """The CPU kernel of `aten::_scaled_mm` is `_scaled_mm_in_fp32` for the duration (item 7)."""
    lib = torch.library.Library("aten", "IMPL")
    lib.impl("_scaled_mm", _scaled_mm_in_fp32, "CPU")
    try:
        yield
    finally:
        lib._destroy()


def _eager_block_mask(*args, **kwargs):
    from torch.nn.attention.flex_attention import create_block_mask

    return create_block_mask(*args, **kwargs)


@contextmanager
def cpu_emulation(tracker):
    """Patch torchtitan / torch for a measured run (see the module docstring)."""
    import torchtitan.components.quantization.float8 as float8
    import torchtitan.distributed.activation_checkpoint as ac
    import torchtitan.models.common.attention as attention
    import torchtitan.models.common.decoder as decoder
    from torch.distributed.tensor.experimental._context_parallel import _attention as cp_attention

    saved = [(attention.FlexAttention, "forward"), (decoder, "create_attention_mask"),
             (attention, "create_attention_mask"), (ac, "_get_default_save_ops"),
             (float8, "has_cuda_capability"), (cp_attention, "_compiled_create_block_mask")]
    originals = [getattr(obj, name) for obj, name in saved]
    cp_attention._compiled_create_block_mask = _eager_block_mask  # item 3, CP's per-rank mask
    attention.FlexAttention.forward = _flex_forward()
    float8.has_cuda_capability = lambda major, minor: (major, minor) <= (9, 0)  # an H100
    ac._get_default_save_ops = lambda: originals[3]() | {torch.ops.titan_emulation.flex_forward.default}
    decoder.create_attention_mask = attention.create_attention_mask = _eager_block_mask
    _hidden.append(tracker.hidden)
    try:
        with fsdp2_storage(tracker), fused_rms_norm(), fast_scaled_mm():
            yield
    finally:
        _hidden.pop()
        for (obj, name), value in zip(saved, originals):
            setattr(obj, name, value)
