"""Make a CPU run (fake or real) allocate what a CUDA run of the same step allocates.

Five differences between the CPU build and an H100 run matter for memory, and are patched
here for the duration of a measurement:

1. `F.scaled_dot_product_attention`: on CUDA with bf16 inputs, no mask and `enable_gqa`, SDPA
   dispatches to FlashAttention-2, which handles GQA natively and keeps only q, k, v, the
   output and its log-sum-exp. The CPU kernels keep other things. `FlashAttention` below makes
   exactly the allocations of PyTorch's flash path (`_scaled_dot_product_flash_attention` ->
   `_flash_attention_forward/backward` -> FlashAttention-2's `mha_fwd`/`mha_bwd`); the values
   of a real run come from the CPU math kernel, computed where the tracker does not look.
   fp32 inputs with grouped KV heads take the math backend on CUDA (`_math_sdpa`), and so does a masked call
   with fewer KV heads than query heads and no `enable_gqa` (transformers' multi-query Falcon: `_masked_math_sdpa`).
2. transformers' `find_packed_sequence_indices` reads the position ids to detect packed
   sequences; for a fake tensor (which has no values) it gives up and returns a packing mask,
   which makes `create_causal_mask` build a full 4-D mask and sends SDPA down the masked,
   KV-repeating path. A GPU run reads the values: our position ids are one `arange` per row,
   never packed, so the function returns None there, and so does the patch.
3. `aten._softmax_backward_data` (the backward of every softmax, eager attention's included): CUDA's
   kernel (aten/src/ATen/native/cuda/SoftMax.cu, `softmax_backward_cuda_out`) first makes
   `Tensor tmp = grad * output`, a copy of the gradient's size and dtype, alive until the kernel has
   written the input's gradient; the CPU kernel and the meta kernel fake tensors run make none. The
   tracker counts that temporary (`_softmax_backward_temporary`; `cuda_softmax_backward` installs it, inside
   `cuda_emulation` and in the Megatron harness). The H200 records of DeepSeek-V3.2's
   eager attention (128 heads, the softmax in fp32) showed it: 4 b a s^2 bytes over the fake peak.
4. Autocast: CPU autocast leaves in bf16 ops CUDA autocast runs in fp32 (`pow`, `exp`, `layer_norm`, `softmax`,
   `sum`, ...); `cuda_autocast_lists` (autocast.py) gives the CPU's autocast CUDA's fp32 lists.
5. The caching allocator's 512-byte rounding and host-resident scalars live in `tracker.py`;
   foreach AdamW/SGD is requested explicitly (`foreach=True`) where the optimizer is built.
"""

from __future__ import annotations

import math
from contextlib import contextmanager, nullcontext

import torch
import torch.nn.functional as F
from torch._subclasses.fake_tensor import FakeTensor

from .autocast import cuda_autocast_lists

_ORIGINAL_SDPA = F.scaled_dot_product_attention


def _round_up(x: int, m: int) -> int:
    return -(-x // m) * m


class FlashAttention(torch.autograd.Function):
    """FlashAttention-2 as PyTorch's CUDA SDPA runs it; inputs (b, heads, s, d) like SDPA's."""

    @staticmethod
    def forward(ctx, q, k, v, scale, is_causal, hidden):
        # _scaled_dot_product_flash_attention_cuda hands the kernel (b, s, h, d) views.
        q_t, k_t, v_t = (x.transpose(1, 2) for x in (q, k, v))
        b, s, h, _ = q_t.shape
        out = torch.empty_like(q_t)  # mha_fwd: at::empty_like(q), so q's physical layout
        lse = q.new_empty((b, h, s), dtype=torch.float32)  # softmax_lse
        if not isinstance(q, FakeTensor):
            with hidden(), torch.no_grad():
                ref = _ORIGINAL_SDPA(q, k, v, is_causal=is_causal, scale=scale, enable_gqa=True)
                out.copy_(ref.transpose(1, 2))
        out = out.transpose(1, 2)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.scale, ctx.is_causal, ctx.hidden = scale, is_causal, hidden
        return out

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v, out, lse = ctx.saved_tensors
        q_t, k_t, v_t = (x.transpose(1, 2) for x in (q, k, v))
        # _flash_attention_backward: "CUDA code assumes that dout is contiguous"
        dout = grad_out.transpose(1, 2).contiguous()
        out_c = out.transpose(1, 2).contiguous()
        b, s, h, d = q_t.shape
        kv_heads = k_t.shape[2]
        # mha_bwd, in allocation order
        dq, dk, dv = torch.empty_like(q_t), torch.empty_like(k_t), torch.empty_like(v_t)
        s_rounded = _round_up(s, 128)
        softmax_d = q.new_empty((b, h, s_rounded), dtype=torch.float32)
        d_rounded = _round_up(d, 32) if d <= 192 else 256
        dq_accum = q.new_empty((b, s_rounded, h, d_rounded), dtype=torch.float32)
        if kv_heads != h:  # GQA: per-query-head dK, dV, summed over each group at the end
            # allocated only to be alive, as the kernel's buffers are, until the gradients return
            dk_expanded, dv_expanded = q.new_empty((b, s, h, d)), q.new_empty((b, s, h, d))  # noqa: F841
        if not isinstance(q, FakeTensor):
            with ctx.hidden(), torch.enable_grad():
                leaves = [x.detach().requires_grad_() for x in (q, k, v)]
                ref = _ORIGINAL_SDPA(*leaves, is_causal=ctx.is_causal, scale=ctx.scale, enable_gqa=True)
                grads = torch.autograd.grad(ref, leaves, dout.transpose(1, 2))
                for buf, g in zip((dq, dk, dv), grads):
                    buf.copy_(g.transpose(1, 2))
        del dout, out_c, softmax_d, dq_accum
        if kv_heads != h:
            del dk_expanded, dv_expanded
        return dq.transpose(1, 2), dk.transpose(1, 2), dv.transpose(1, 2), None, None, None


def _math_sdpa(query, key, value, is_causal, scale):
    """fp32 query/key/value with grouped KV heads (enable_gqa): on CUDA, torch 2.11 sends them to the
    math backend, which materialises the fp32 scores and keeps their softmax for backward: flash and
    cuDNN take fp16/bf16 only, and memory-efficient attention refuses unequal q/kv head counts
    (aten/src/ATen/native/transformers/cuda/sdp_utils.cpp, check_batch_size_and_num_heads_dense;
    pytorch/pytorch#181528; pytorch/pytorch#191085 adds GQA to memory-efficient attention later).
    (What peft's prepare_model_for_kbit_training leads to: an fp32 residual stream.)

    `_scaled_dot_product_attention_math` (aten/src/ATen/native/transformers/attention.cpp) is
    composite, the same ATen calls on every device, but two of its branches differ under a
    measurement: with a dispatch mode active (the tracker) `isTensorSubclassLike` is true, so it adds
    the causal mask out of place where a GPU run adds it in place; and `_safe_softmax` is a
    CompositeExplicitAutograd kernel whose temporaries (the bool mask of the -inf scores, its
    all-reduced rows, one scalar) the tracker cannot see (SoftMax.cpp; torch 2.13's writes its
    result into the softmax output). This replays the function op by op as a GPU run makes them."""
    aten = torch.ops.aten
    d = query.shape[-1]
    factor = math.sqrt(scale if scale is not None else 1.0 / math.sqrt(d))
    q = aten.mul.Scalar(query, factor)
    mask = None
    if is_causal:
        length, source = query.shape[-2], key.shape[-2]
        causal = torch.ones(length, source, dtype=torch.bool, device=query.device).tril()
        zero = torch.scalar_tensor(0.0, dtype=query.dtype, device=query.device)
        mask = torch.where(causal.logical_not(), -math.inf, zero)  # convert_boolean_attn_mask
        del causal, zero
    groups = query.shape[-3] // key.shape[-3]
    k = key.repeat_interleave(groups, -3) if groups > 1 else key
    v = value.repeat_interleave(groups, -3) if groups > 1 else value
    scores = torch.matmul(q, aten.mul.Scalar(k.transpose(-2, -1), factor))
    if mask is not None:
        scores.add_(mask)
    probs = _safe_softmax(scores)
    del scores
    return torch.matmul(probs, v)


def _safe_softmax(scores):
    """aten._safe_softmax over the last dimension, with its temporaries made beside it, alive while it runs:
    isneginf's bool mask, its all() over the rows, the zero its where writes (SoftMax.cpp)."""
    hidden = [torch.empty_like(scores, dtype=torch.bool), scores.new_empty((*scores.shape[:-1], 1), dtype=torch.bool),
              scores.new_empty(())]
    probs = torch.ops.aten._safe_softmax(scores, -1)
    del hidden
    return probs


def _masked_math_sdpa(query, key, value, attn_mask, scale):
    """A masked call with fewer key/value heads than query heads and no enable_gqa (transformers' multi-query
    Falcon, which always hands SDPA its 4-D mask): no fused CUDA backend takes it (sdp_utils_cpp.h
    check_batch_size_and_num_heads_dense), so torch runs `_scaled_dot_product_attention_math`
    (aten/src/ATen/native/transformers/attention.cpp), replayed op by op as the H200 ran it (torch 2.11: tests/data/
    measured/gpu/experiments/sdpa-mask-h200.json, Falcon-7B's requests in this order): the bool mask made an
    additive one in q's dtype (convert_boolean_attn_mask, through two scalars); q, k, v upcast to fp32 (allow-
    FP16BF16ReductionMathSDP off); q and k^T each scaled by sqrt(scale); their matmul (the one k head broadcast);
    the bias added in place (as on the GPU; under a dispatch mode torch's own adds it out of place); _safe_softmax
    with its temporaries (`_math_sdpa`); the weights cast back (returned, dropped by SDPA); the matmul with v and its
    cast back; the upcast q and k, the weights and the bias freed as the function returns."""
    aten = torch.ops.aten
    origin = query.dtype
    if attn_mask.dtype == torch.bool:
        zero = torch.scalar_tensor(0.0, dtype=origin, device=query.device)
        minus = torch.scalar_tensor(-math.inf, dtype=origin, device=query.device)
        bias = torch.where(attn_mask, zero, minus)
        del zero, minus
    else:
        bias = attn_mask
    upcast = origin in (torch.bfloat16, torch.float16)
    query_acc, key_acc, value_acc = ((x.to(torch.float32) if upcast else x) for x in (query, key, value))
    factor = math.sqrt(scale if scale is not None else 1.0 / math.sqrt(query.shape[-1]))
    q = aten.mul.Scalar(query_acc, factor)
    scores = torch.matmul(q, aten.mul.Scalar(key_acc.transpose(-2, -1), factor))
    scores.add_(bias)
    probs = _safe_softmax(scores)
    del scores
    weights = probs.to(origin)
    out_acc = torch.matmul(probs, value_acc)
    out = out_acc.to(origin)
    del out_acc, key_acc, query_acc, weights, bias
    return out


def _flash_sdpa(hidden):
    def sdpa(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
        device = query.device.type
        if torch.is_autocast_enabled(device):
            # CUDA autocast lists scaled_dot_product_attention as lower-precision: cast inputs.
            dtype = torch.get_autocast_dtype(device)
            query, key, value = (x.to(dtype) for x in (query, key, value))
        if attn_mask is not None and not dropout_p and not is_causal and not enable_gqa \
                and key.shape[1] != query.shape[1]:
            with torch.autocast(device, enabled=False) if torch.is_autocast_enabled(device) else nullcontext():
                return _masked_math_sdpa(query, key, value, attn_mask, scale)
        if attn_mask is not None or dropout_p:
            raise NotImplementedError("only the flash path (no mask, no dropout) and the masked math path of "
                                      "unequal head counts are emulated")
        if query.dtype == torch.float32 and enable_gqa and key.shape[1] != query.shape[1]:
            return _math_sdpa(query, key, value, is_causal, scale)
        if query.dtype not in (torch.bfloat16, torch.float16) or query.shape[-1] > 256:
            raise NotImplementedError("FlashAttention-2 takes fp16/bf16 with head_dim <= 256")
        if key.shape[1] != query.shape[1] and not enable_gqa:
            raise ValueError("grouped key/value heads need enable_gqa=True")
        with torch.autocast(device, enabled=False) if torch.is_autocast_enabled(device) else nullcontext():
            return FlashAttention.apply(query, key, value, scale, is_causal, hidden)

    return sdpa


def _unpacked_sequences(original):
    def find_packed_sequence_indices(position_ids):
        if isinstance(position_ids, FakeTensor):
            return None  # what the real function returns for our arange position ids
        return original(position_ids)

    return find_packed_sequence_indices


@contextmanager
def cuda_emulation(tracker):
    """Patch torch/transformers for the duration of a measured run (see module docstring)."""
    import transformers.masking_utils as masking

    saved = (F.scaled_dot_product_attention, masking.find_packed_sequence_indices)
    F.scaled_dot_product_attention = _flash_sdpa(tracker.hidden)
    masking.find_packed_sequence_indices = _unpacked_sequences(saved[1])
    try:
        with cuda_softmax_backward(tracker), cuda_autocast_lists():
            yield
    finally:
        F.scaled_dot_product_attention, masking.find_packed_sequence_indices = saved


@contextmanager
def cuda_softmax_backward(tracker):
    """Count CUDA's softmax-backward temporary (module docstring, item 3) for the duration of a run: every
    harness whose framework runs torch's softmax on the scores (transformers' eager attention, Megatron-Core's
    unfused FusedScaleMaskSoftmax path and its DSA)."""
    softmax_backward = torch.ops.aten._softmax_backward_data.default
    tracker.kernel_temporaries[softmax_backward] = _softmax_backward_temporary
    try:
        yield
    finally:
        tracker.kernel_temporaries.pop(softmax_backward, None)


def _softmax_backward_temporary(args) -> torch.Tensor:
    """CUDA's `softmax_backward_cuda_out` (aten/src/ATen/native/cuda/SoftMax.cu, PyTorch 2.x): `tmp = grad *
    output` before the kernel, in the gradient's dtype (module docstring, item 3)."""
    return torch.empty_like(args[0], memory_format=torch.contiguous_format)  # values unused: only its bytes count


# torch 2.13's `aten::rms_norm` calls `at::_fused_rms_norm` (aten/src/ATen/native/layer_norm.cpp,
# `rms_norm_symint`); the CPU build has no kernel for it, so its composite path runs op by op and
# autograd keeps fp32 copies a GPU never makes. On CUDA autograd saves the input, the weight and the
# rstd (derivatives.yaml `_fused_rms_norm`); the kernels allocate Y and an fp32 rstd per row, dX and
# dgamma in backward (layer_norm_kernel.cu). Registering CPU kernels (torch's own decompositions,
# which fake tensors run too) for the measurement makes the CPU run take the CUDA path, in real and
# fake runs alike (validation/torchtitan/shims.py, item 6, has the details).
@contextmanager
def fused_rms_norm():
    """CPU kernels for `aten::_fused_rms_norm` and its backward (see above)."""
    from torch._decomp import decomposition_table

    aten = torch.ops.aten
    lib = torch.library.Library("aten", "IMPL")
    for op in (aten._fused_rms_norm.default, aten._fused_rms_norm_backward.default):
        lib.impl(op.__name__.split(".")[0], decomposition_table[op], "CPU")
    try:
        yield
    finally:
        lib._destroy()


# A storage resized in place (`UntypedStorage.resize_`) is reported to no dispatch mode; FSDP frees
# and re-allocates its unsharded parameters that way, each a caching-allocator free or allocation on
# a GPU. The functions that do it are wrapped to tell the tracker the storage's new size.
def _then_adopt(tracker, original):
    def resize(tensor, *args):
        original(tensor, *args)
        tracker.adopt(tensor)

    return resize


@contextmanager
def storage_resizes(tracker, *places):
    """Each `(module, name)` function, which resizes its first argument's storage, reports the
    new size to `tracker` for the duration."""
    originals = [(module, name, getattr(module, name)) for module, name in places]
    for module, name, original in originals:
        setattr(module, name, _then_adopt(tracker, original))
    try:
        yield
    finally:
        for module, name, original in originals:
            setattr(module, name, original)


def fsdp2_storage(tracker):
    """FSDP2's `alloc_storage` / `free_storage` of the unsharded parameters (torch 2.13
    distributed/fsdp/_fully_shard/_fsdp_param.py, also imported by _fsdp_param_group.py)."""
    import torch.distributed.fsdp._fully_shard._fsdp_param as fsdp_param
    import torch.distributed.fsdp._fully_shard._fsdp_param_group as fsdp_group

    return storage_resizes(tracker, (fsdp_param, "alloc_storage"), (fsdp_param, "free_storage"),
                           (fsdp_group, "alloc_storage"))


def fsdp1_storage(tracker):
    """FSDP1's unsharded FlatParameters (`_full_param_padded`) and low-precision shards (`_mp_shard`),
    allocated and freed by `_alloc_storage` / `_free_storage` (torch 2.13 distributed/utils.py, called
    from fsdp/_flat_param.py)."""
    import torch.distributed.fsdp._flat_param as flat

    return storage_resizes(tracker, (flat, "_alloc_storage"), (flat, "_free_storage"))
