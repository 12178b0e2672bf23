"""TransformerEngine kernels' memory, emulated on the CPU with Megatron-Core's local layer spec.

TE cannot run here (no CUDA), so the local spec is used and the two places where the local
modules keep something different from TE's fused kernels are replaced by stand-ins that make
exactly the allocations the TE kernels make; on a real CPU run their values come from reference
maths computed where the storage tracker does not look (`tracker.hidden()`):

- Core attention: the local `DotProductAttention` materialises the s x s scores and keeps the
  softmax probabilities. `FusedCoreAttention` stands in for TE's `DotProductAttention` with the
  cuDNN fused backend (the default for bf16 on Hopper): TE 2.x
  `transformer_engine/pytorch/attention/dot_product_attention/backends.py`, `FusedAttnFunc`,
  saves q, k, v, the output and `aux_ctx_tensors` (softmax statistics fp32 [b, np, sq, 1] and a
  small rng state) and, for the `sbhd` layout Megatron uses, returns the output in [s, b, np*hn]
  without a copy. Its backward allocates dq, dk, dv like q, k, v.
- Norms: `WrappedTorchNorm` refuses sequence parallelism and torch's CPU RMSNorm keeps other
  intermediates. `FusedNorm` stands in for TE's `RMSNorm`/`LayerNorm`
  (`transformer_engine/pytorch/ops/basic/rmsnorm.py`, `layer_norm.py`: the forward saves the
  input and the fp32 inverse standard deviation per token, plus the fp32 means for LayerNorm;
  the output is a new tensor like the input; backward returns dx like x and dgamma (dbeta) like
  the weight).
"""

from __future__ import annotations

import contextlib
import math

import torch
import torch.nn.functional as F
from torch._subclasses.fake_tensor import FakeTensor

# The running tracker's `hidden` context (set by the harness for the duration of a measurement):
# reference maths inside it are not counted.
HIDDEN = {"context": contextlib.nullcontext}


def _hidden():
    return HIDDEN["context"]()


def _is_real(t: torch.Tensor) -> bool:
    return not isinstance(t, FakeTensor)


class _FusedNormFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, eps, rms):
        out = torch.empty_like(x)
        rstd = x.new_empty(x.shape[:-1], dtype=torch.float32)  # rsigma / rstdevs, fp32 per token
        mean = None if rms else x.new_empty(x.shape[:-1], dtype=torch.float32)
        if _is_real(x):
            with _hidden(), torch.no_grad():
                out.copy_(_reference_norm(x, weight, bias, eps, rms))
        ctx.save_for_backward(x, weight, bias, rstd, mean)
        ctx.eps, ctx.rms = eps, rms
        return out

    @staticmethod
    def backward(ctx, grad_out):
        x, weight, bias, rstd, mean = ctx.saved_tensors
        dx, dw = torch.empty_like(x), torch.empty_like(weight)
        db = None if bias is None else torch.empty_like(bias)
        if _is_real(x):
            with _hidden(), torch.enable_grad():
                leaves = [t.detach().requires_grad_() for t in (x, weight)]
                b = None if bias is None else bias.detach().requires_grad_()
                ref = _reference_norm(*leaves, b, ctx.eps, ctx.rms)
                grads = torch.autograd.grad(ref, leaves + ([b] if b is not None else []), grad_out)
                for buf, g in zip((dx, dw, db), grads):
                    buf.copy_(g)
        return dx, dw, db, None, None


def _reference_norm(x, weight, bias, eps, rms):
    if rms:
        return F.rms_norm(x.float(), weight.shape, weight.float(), eps).to(x.dtype)
    return F.layer_norm(x.float(), weight.shape, weight.float(), bias.float(), eps).to(x.dtype)


class DuplicatedLinear(torch.nn.Module):
    """TE's Linear in "duplicated" mode, as DSAIndexer builds its projections (TEBackendSpecProvider.linear):
    the whole weight on every rank, no bias here; keeps its input for the weight's gradient."""

    def __init__(self, input_size: int, output_size: int, *, config, init_method=None, bias: bool = False,
                 skip_bias_add: bool = False, skip_weight_param_allocation: bool = False, parallel_mode=None,
                 **_):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.empty(output_size, input_size, dtype=config.params_dtype,
                                                     device=torch.cuda.current_device()))

    def forward(self, x):
        return torch.nn.functional.linear(x, self.weight), None


class FusedNorm(torch.nn.Module):
    """TE's RMSNorm / LayerNorm as Megatron builds them (`TENorm`): same signature as
    `WrappedTorchNorm`; the weight is marked `sequence_parallel` as TE marks it so Megatron's DDP
    all-reduces its gradient over the TP group."""

    def __init__(self, config, hidden_size: int, eps: float = 1e-5, persist_layer_norm: bool = False,
                 zero_centered_gamma: bool = False, normalization: str = "LayerNorm"):
        super().__init__()
        self.rms = config.normalization == "RMSNorm"
        self.eps = eps
        dtype, device = config.params_dtype, torch.cuda.current_device()
        self.weight = torch.nn.Parameter(torch.empty(hidden_size, dtype=dtype, device=device))
        self.bias = None if self.rms else torch.nn.Parameter(
            torch.empty(hidden_size, dtype=dtype, device=device))
        for p in self.parameters():
            p.sequence_parallel = config.sequence_parallel

    def forward(self, x):
        return _FusedNormFunction.apply(x, self.weight, self.bias, self.eps, self.rms)


class _FusedAttentionFunction(torch.autograd.Function):
    """q [sq, b, np, hn], k, v [sk, b, ng, hn(v)] -> out [sq, b, np, hn(v)] (causal, GQA native)."""

    @staticmethod
    def forward(ctx, q, k, v, scale):
        s, b, heads, _ = q.shape
        out = q.new_empty((s, b, heads, v.shape[-1]))  # sbhd output, contiguous (MLA: v's width)
        stats = q.new_empty((b, heads, s, 1), dtype=torch.float32)  # softmax statistics
        if _is_real(q):
            with _hidden(), torch.no_grad():
                out.copy_(_reference_attention(q, k, v, scale))
        ctx.save_for_backward(q, k, v, out, stats)
        ctx.scale = scale
        return out

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v, out, stats = ctx.saved_tensors
        dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
        if _is_real(q):
            with _hidden(), torch.enable_grad():
                leaves = [t.detach().requires_grad_() for t in (q, k, v)]
                ref = _reference_attention(*leaves, ctx.scale)
                for buf, g in zip((dq, dk, dv), torch.autograd.grad(ref, leaves, grad_out)):
                    buf.copy_(g)
        return dq, dk, dv, None


def _reference_attention(q, k, v, scale):
    bhsd = [t.permute(1, 2, 0, 3) for t in (q, k, v)]
    out = F.scaled_dot_product_attention(*bhsd, is_causal=True, scale=scale, enable_gqa=True)
    return out.permute(2, 0, 1, 3)


def fused_core_attention_class():
    """A subclass of Megatron's local `DotProductAttention` whose forward is TE's fused
    attention (built lazily: Megatron must be imported under the shims)."""
    from megatron.core.transformer.dot_product_attention import DotProductAttention

    class FusedCoreAttention(DotProductAttention):
        def __init__(self, *args, k_channels=None, v_channels=None, **kwargs):
            # MLA passes its q/k and v head widths (TE's DotProductAttention takes them); the
            # fused kernel reads them from the tensors' shapes
            super().__init__(*args, **kwargs)

        def forward(self, query, key, value, attention_mask, attn_mask_type=None,
                    attention_bias=None, packed_seq_params=None):
            assert attention_bias is None and packed_seq_params is None
            scale = self.softmax_scale if self.softmax_scale else 1 / math.sqrt(query.shape[-1])
            out = _FusedAttentionFunction.apply(query, key, value, scale)
            return out.view(out.shape[0], out.shape[1], -1)

    return FusedCoreAttention


class _TECrossEntropyFunction(torch.autograd.Function):
    """TE's `parallel_cross_entropy` (TE 2.x `transformer_engine/pytorch/cross_entropy.py`
    `CrossEntropyFunction`, `pytorch/triton/cross_entropy.py` `cross_entropy_forward`): the forward
    allocates the fp32 per-token loss and this rank's fp32 (max, sum, logit of the label) triple per
    token, gathered over the TP group into a tp-times larger fp32 buffer when tp > 1; its kernel
    writes the gradient of the loss into the logits in place, and only the logits are saved. The
    backward scales them in place by the incoming gradient (`element_mul_kernel`) and returns them:
    no allocation. So at the TE each Megatron release pins (versions.py: 0.16.1 rev 5671fd36 = TE
    2.12, 0.19.0 rev 4329ff84 = TE 2.17.1); TE v2.18 (commit 01bbe3ee) allocates and saves an fp32
    gradient instead. Left out: the one-element int64 count of non-ignored tokens and its clamp."""

    @staticmethod
    def forward(ctx, logits, target, tp_group):
        import torch.distributed as dist

        rows = logits.shape[0] * logits.shape[1]
        loss_1d = torch.zeros(rows, dtype=torch.float32, device=logits.device)
        m_d_x_y = torch.zeros(rows * 3, dtype=torch.float32, device=logits.device)
        world = 1 if tp_group is None else dist.get_world_size(tp_group)
        if world > 1:
            gathered = torch.zeros(rows * 3 * world, dtype=torch.float32, device=logits.device)
            dist.all_gather_into_tensor(gathered, m_d_x_y, group=tp_group)
        if _is_real(logits):
            with _hidden(), torch.no_grad():
                # this rank's vocabulary shard stands for the whole vocabulary (values do not matter)
                flat = logits.float().view(rows, -1)
                labels = target.reshape(-1) % flat.shape[1]
                lse = torch.logsumexp(flat, dim=-1)
                loss_1d.copy_(lse - flat.gather(1, labels[:, None]).squeeze(1))
                grad = torch.softmax(flat, dim=-1)
                grad[torch.arange(rows), labels] -= 1
                logits.copy_(grad.view_as(logits))
        ctx.save_for_backward(logits.detach())
        return loss_1d.view(logits.shape[:2])

    @staticmethod
    def backward(ctx, grad_output):
        (logits,) = ctx.saved_tensors
        logits.mul_(grad_output.unsqueeze(-1))
        return logits, None, None


def te_parallel_cross_entropy(logits, labels, tp_group, is_cg_capturable=False):
    """megatron/core/extensions/transformer_engine.py `te_parallel_cross_entropy` on the emulated
    TE kernel (label smoothing 0, ignore index -100, loss not reduced)."""
    return _TECrossEntropyFunction.apply(logits, labels, tp_group)


# --- the grouped_gemm package (legacy GroupedMLP, --moe-grouped-gemm on the local spec) -------------
# transformer/moe/experts.py GroupedMLP calls `grouped_gemm_util.ops.gmm` (github.com/fanshiqing/
# grouped_gemm, a CUDA extension). Its ops.py: `GroupedGemm.forward` saves (a, b, batch_sizes) and
# returns backend.gmm(a, b, batch_sizes, trans_b) (one new [tokens, n] output); `backward` makes the
# gradient contiguous, then agrad = gmm(grad, b, trans_b=not trans_b) ([tokens, k]) and bgrad =
# gmm(a, grad, trans_a=True) ([experts, k, n], b's shape). The stand-in allocates exactly those
# outputs; on a real run it fills them with the per-expert matmuls.
def _reference_gmm(a, b, batch_sizes, trans_a=False, trans_b=False):
    sizes = [int(n) for n in batch_sizes.tolist()]
    if trans_a:  # a: [tokens, k], b: [tokens, n] -> [experts, k, n]
        return torch.stack([x.t() @ y for x, y in zip(a.split(sizes), b.split(sizes))])
    parts = [x @ (w.t() if trans_b else w) for x, w in zip(a.split(sizes), b)]
    return torch.cat(parts)


def _gmm_output(a, b, batch_sizes, trans_a=False, trans_b=False):
    if trans_a:
        out = a.new_empty(batch_sizes.shape[0], a.shape[1], b.shape[1])
    else:
        out = a.new_empty(a.shape[0], b.shape[1] if trans_b else b.shape[2])
    if _is_real(a):
        with _hidden(), torch.no_grad():
            out.copy_(_reference_gmm(a, b, batch_sizes, trans_a, trans_b))
    return out


class _GroupedGemm(torch.autograd.Function):
    @staticmethod
    def forward(ctx, a, b, batch_sizes, trans_b):
        ctx.save_for_backward(a, b, batch_sizes)
        ctx.trans_b = trans_b
        return _gmm_output(a, b, batch_sizes, trans_b=trans_b)

    @staticmethod
    def backward(ctx, grad):
        grad = grad.contiguous()
        a, b, batch_sizes = ctx.saved_tensors
        agrad = _gmm_output(grad, b, batch_sizes, trans_b=not ctx.trans_b) if ctx.needs_input_grad[0] else None
        bgrad = None
        if ctx.needs_input_grad[1]:
            lhs, rhs = (grad, a) if ctx.trans_b else (a, grad)
            bgrad = _gmm_output(lhs, rhs, batch_sizes, trans_a=True)
        return agrad, bgrad, None, None


def gmm(a, b, batch_sizes, trans_b=False):
    return _GroupedGemm.apply(a, b, batch_sizes, trans_b)
