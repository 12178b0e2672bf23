"""Megatron-Core's `jit_fuser` functions as the compiled kernels they are in production.

`megatron/core/jit.py` (0.16.1) sets `jit_fuser = torch.compile` when megatron.core is imported,
and every `@jit_fuser` function (the SwiGLU/GeLU activations and their backward,
`fusions/fused_bias_swiglu.py` / `fused_bias_gelu.py`, the fused cross-entropy pieces
`fusions/fused_cross_entropy.py`, ...) is one Inductor kernel (or a few) on a GPU: it writes its
outputs and allocates nothing else. Under the harness's dispatch mode Dynamo refuses to compile
(torch/_dynamo/convert_frame.py: "non-infra torch dispatch mode present") and runs the Python body
eagerly, one aten op at a time, so every intermediate of the expression would be measured, e.g.
`weighted_swiglu_back`'s fp64 products under `--moe-router-dtype fp64` (three [tokens, f] fp64
products and the [tokens, 2f] concatenation), none of which a compiled kernel allocates.

`FusedExpression` stands in for each compiled function: the body runs where the storage tracker
does not look (`tracker.hidden()`, the reference maths of kernels.py) and only its outputs are
allocated where it does: a new storage per output, shaped, strided and typed as the eager output;
an output that is an input (or a view of one, as in-place work on an input that the compiled
function writes back into it) is returned as it is, as the compiled function returns it.

One compiled function allocates more than its outputs (`SCRATCH`): the native fused cross-entropy's
backward, `calculate_gradients`, scatters the label's -1 into the fp32 softmax with an index_put,
which Inductor lowers into a copy (torch 2.13 torch/_inductor/lowering.py `index_put`:
`index_put_impl_(clone(x), ...)`, a lowering that does not depend on the device) before it
multiplies by the loss's gradient and casts to bf16: an fp32 buffer like the softmax lives beside it
and the bf16 output (Inductor's generated code, tests/data/measured/compile/
megatron-fused-cross-entropy-bf16-s16-b2-v512.json). Its other functions allocate their outputs and,
in calculate_predicted_logits, two per-token fp32 reductions (1/V of the logits; left out). Where
Inductor's CPU code differs from its CUDA code the stand-ins follow the CUDA lowering:
weighted_swiglu_back's CPU code concatenates into an fp32 [n, 2f] buffer (`cat` lowers to a
ConcatKernel on CPU only; on CUDA a pointwise_cat fuses it with the cast), so no scratch there.

Every call the measured records make is one with autograd off or with no input needing a gradient:
inside an autograd Function's forward or backward (which chooses what is saved, the same compiled
or not) or `TopKRouter._apply_expert_bias` (no tensor output). A call that would build an autograd
graph (an input requiring a gradient, grad mode on) runs eagerly: what the compiled function saves
for its backward there is AOTAutograd's partitioner's choice, not emulated: `EAGER_CALLS` counts
them and the harness refuses such a run (harness.traced_step). One exception, `POINTWISE_GRAPHS`:
the legacy GroupedMLP's `activation_func_with_probs` (experts.py: act(x) * probs, elementwise), which
moe_act's recompute (CheckpointWithoutOutput._recompute) runs under autograd. For an elementwise
graph AOTAutograd's min-cut partitioner keeps the graph's inputs (the cheapest cut: anything else
costs a new tensor at least as large, and every intermediate is recomputable from them) and its
backward kernel writes the input gradients only; `_PointwiseGraph` allocates exactly that (an
assumption about the partitioner, not a measurement of it).

The stand-ins replace the compiled functions in every loaded megatron.core module and class, and
`jit_fuser` itself for functions decorated later (modules imported during the run, GroupedMLP's
closures), before the model is built; `install()` returns what to restore.
"""

from __future__ import annotations

import collections
import contextlib
import functools
import sys

import torch
from torch.utils._pytree import tree_flatten, tree_unflatten

from . import kernels

EAGER_CALLS: collections.Counter = collections.Counter()  # name -> calls run eagerly (autograd)
_DEPTH = [0]  # > 0 inside a stand-in's hidden body (nested jit functions are one kernel)


def _measuring() -> bool:
    return kernels.HIDDEN["context"] is not contextlib.nullcontext


def _storages(values) -> set[int]:
    leaves, _ = tree_flatten(values)
    return {t.untyped_storage()._cdata for t in leaves if isinstance(t, torch.Tensor)}


def _needs_graph(args, kwargs) -> bool:
    if not torch.is_grad_enabled():
        return False
    leaves, _ = tree_flatten((args, kwargs))
    return any(isinstance(t, torch.Tensor) and t.requires_grad for t in leaves)


def _as_output(t, inputs: set[int]):
    """A compiled kernel's output: the input itself where the body returned (a view of) one, else a
    new storage like the eager result, its values copied on a real run."""
    if not isinstance(t, torch.Tensor) or t.untyped_storage()._cdata in inputs:
        return t
    out = torch.empty_like(t)  # same strides where dense, else contiguous
    with kernels._hidden(), torch.no_grad():
        out.copy_(t)
    return out


class FusedExpression:
    """A `@jit_fuser` function as one compiled kernel (see the module's docstring)."""

    def __init__(self, fn):
        self.fn = fn
        self.name = getattr(fn, "__qualname__", repr(fn))
        functools.update_wrapper(self, fn)

    def __get__(self, obj, objtype=None):  # methods (TopKRouter._apply_expert_bias)
        return self if obj is None else functools.partial(self, obj)

    def __call__(self, *args, **kwargs):
        if _DEPTH[0] or not _measuring():
            return self.fn(*args, **kwargs)
        if _needs_graph(args, kwargs):
            if self.name in POINTWISE_GRAPHS and not kwargs and all(isinstance(a, torch.Tensor) for a in args):
                return _PointwiseGraph.apply(self.fn, *args)
            EAGER_CALLS[self.name] += 1
            return self.fn(*args, **kwargs)
        inputs = _storages((args, kwargs))
        scratch = [torch.empty_like(t) for t in SCRATCH.get(self.name, _none)(*args, **kwargs)]
        _DEPTH[0] += 1
        try:
            with kernels._hidden():
                result = self.fn(*args, **kwargs)
        finally:
            _DEPTH[0] -= 1
        leaves, spec = tree_flatten(result)
        outputs = tree_unflatten([_as_output(t, inputs) for t in leaves], spec)
        del scratch  # the generated code frees its buffers when it returns
        return outputs


def _none(*args, **kwargs) -> tuple:
    return ()


# what a compiled function allocates beside its outputs (see the module's docstring): tensors whose
# like it allocates while its kernels run, from its arguments
SCRATCH = {
    # calculate_gradients(softmax, grad_output, target_mask, masked_target_1d): index_put's fp32 copy
    "calculate_gradients": lambda softmax, *rest, **kw: (softmax,),
}


# elementwise compiled functions run under autograd somewhere in the measured cases (see the docstring)
POINTWISE_GRAPHS = {"GroupedMLP.__init__.<locals>.activation_func_with_probs"}


class _PointwiseGraph(torch.autograd.Function):
    """An elementwise compiled function under autograd: saves its tensor inputs, returns one new
    output; the backward recomputes where the tracker does not look and allocates the input gradients."""

    @staticmethod
    def forward(ctx, fn, *inputs):
        ctx.fn = fn
        ctx.save_for_backward(*inputs)
        _DEPTH[0] += 1
        try:
            with kernels._hidden(), torch.no_grad():
                result = fn(*inputs)
        finally:
            _DEPTH[0] -= 1
        return _as_output(result, _storages(inputs))

    @staticmethod
    def backward(ctx, grad):
        inputs = ctx.saved_tensors
        wanted = [i for i, t in enumerate(inputs) if ctx.needs_input_grad[i + 1]]
        _DEPTH[0] += 1
        try:
            with kernels._hidden(), torch.enable_grad():
                leaves = [t.detach().requires_grad_(i in wanted) for i, t in enumerate(inputs)]
                out = ctx.fn(*leaves)
                grads = torch.autograd.grad(out, [leaves[i] for i in wanted], grad)
        finally:
            _DEPTH[0] -= 1
        result = [None] * len(inputs)
        for i, g in zip(wanted, grads):
            result[i] = _as_output(g, set())
        return (None, *result)


def fused(fn) -> FusedExpression:
    """The stand-in for `jit_fuser` (a decorator, as torch.compile is)."""
    return FusedExpression(fn)


def _original(value):
    """The Python function behind a torch.compile wrapper, else None."""
    return getattr(value, "_torchdynamo_orig_callable", None)


def install() -> list:
    """Replace every compiled function of the loaded megatron.core modules (module globals and class
    attributes) and `jit_fuser` itself by stand-ins; return (owner, name, old value) to restore.
    One stand-in per compiled function, wherever it is bound."""
    import megatron.core.jit as jit

    saved: list = []
    stand_ins: dict[int, FusedExpression] = {}

    def replace(owner, name, value):
        fn = _original(value)
        if fn is None:
            return
        saved.append((owner, name, value))
        setattr(owner, name, stand_ins.setdefault(id(value), FusedExpression(fn)))

    for module_name, module in list(sys.modules.items()):
        if module is None or not module_name.startswith("megatron.core"):
            continue
        for name, value in list(vars(module).items()):
            if name == "jit_fuser":
                saved.append((module, name, value))
                setattr(module, name, fused)
            elif isinstance(value, type) and value.__module__ == module_name:
                for attr, member in list(vars(value).items()):
                    replace(value, attr, member)
            else:
                replace(module, name, value)
    if jit.jit_fuser is not fused:
        saved.append((jit, "jit_fuser", jit.jit_fuser))
        jit.jit_fuser = fused
    return saved


def uninstall(saved: list) -> None:
    for owner, name, value in reversed(saved):
        setattr(owner, name, value)
