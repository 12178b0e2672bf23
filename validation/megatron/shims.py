"""What Megatron-Core 0.16.1 needs to run on a CPU-only torch build, in one process playing one
rank of a large world. Every patch is local and undone on exit (`megatron_shims()`); none changes
what a CUDA run allocates for the model's tensors, only how the CPU build is reached.

Found by running `GPTModel` with the local spec (see the research note
shared/research/framework-harness-feasibility.md for how each was found):
- `torch.cuda.current_device()` (parameters, DDP buffers, masks: ~175 call sites) -> "cpu".
- `transformer/utils.py` builds the causal mask with `device="cuda"` -> the same on the CPU.
- CUDA RNG states (`tensor_parallel/random.py`): the tracker's fork and the recompute's
  save/restore read and set a CUDA generator -> a constant state, nothing set.
- `torch.cuda.Stream`/`Event`/`current_stream`/`stream` (MoE all-to-all dispatcher, DDP overlap)
  -> inert stand-ins.
- `moe_utils.te_general_gemm` exists without TE in 0.16.1 only as None when TE import fails;
  kept None so the router uses torch's matmul in `router_dtype`.
- `--moe-token-dispatcher-type allgather`: its permutation's data-dependent sizes (masked_select,
  tokens per expert read back to the host) under fake tensors -> balanced routing's sizes
  (`BalancedRouting`, the size a real run's drop-and-pad routing gives).
- `gloo` process groups (the distributed optimizer asserts they exist) -> the fake backend.
- `megatron.core.jit.jit_fuser` is `torch.compile` (importing megatron.core already decorates
  most fused functions with it); Dynamo does not compile under a dispatch mode and would run their
  bodies op by op, so every compiled function is replaced by a stand-in allocating only its outputs,
  as the compiled kernel does (fused.py).
"""

from __future__ import annotations

import contextlib
import sys
import types

import torch
from torch._subclasses.fake_tensor import FakeTensor
from torch.utils._python_dispatch import TorchDispatchMode


class _InertStream:
    """torch.cuda.Stream stand-in: every method is a no-op; waits complete at once."""

    def __init__(self, *args, **kwargs):
        pass

    def __getattr__(self, name):
        return lambda *a, **k: None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


class _InertEvent(_InertStream):
    def query(self):
        return True


@contextlib.contextmanager
def _stream_context(stream=None):
    yield


_RNG_STATE = torch.zeros(16, dtype=torch.uint8)  # a CPU tensor made before any fake mode


def _known_value(func, args, kwargs):
    """Answer `.tolist()` / `.item()` / `int()` of a fake tensor whose value is known."""
    if not args or not isinstance(args[0], FakeTensor) or id(args[0]) not in _KNOWN:
        return None
    value = _KNOWN[id(args[0])]
    if func is torch.Tensor.tolist:
        return [value] * args[0].numel() if args[0].dim() else value
    if func in (torch.Tensor.item, torch.Tensor.__int__, torch.Tensor.__index__):
        return value
    return None


def _is_cuda(device) -> bool:
    if isinstance(device, torch.device):
        return device.type == "cuda"
    return isinstance(device, str) and device.startswith("cuda")


# Values of fake tensors whose value does not depend on data: `torch.full` results (MoE
# drop-and-pad token counts per expert, token_dispatcher.py) and what is derived from them by
# casts and sums. Keyed by id with a weakref finalizer clearing the entry.
_KNOWN: dict[int, int | float] = {}


def _remember(t, value):
    import weakref

    _KNOWN[id(t)] = value
    weakref.finalize(t, _KNOWN.pop, id(t), None)
    return t


class CudaToCpu(torch.overrides.TorchFunctionMode):
    """`device="cuda"` in factory calls, `.cuda()` and `.to("cuda")` (the optimizer's scale
    tensor, the MoE aux-loss tracker, ...) land on the CPU, where the run's tensors live; a
    tensor's `.type()` name reads as on a GPU."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        if _is_cuda(kwargs.get("device")):
            kwargs["device"] = "cpu"
        if func is torch.Tensor.cuda:
            return args[0]
        if func is torch.Tensor.type and len(args) == 1 and not kwargs:
            # the distributed optimizer checks `param.type()` against torch.cuda.*Tensor names
            return func(*args).replace("torch.", "torch.cuda.", 1)
        if func is torch.Tensor.to and args[1:] and _is_cuda(args[1]):
            args = (args[0], "cpu") + tuple(args[2:])
        known = _known_value(func, args, kwargs)
        if known is not None:
            return known
        out = func(*args, **kwargs)
        if func is torch.full and isinstance(out, FakeTensor):
            _remember(out, args[1] if len(args) > 1 else kwargs["fill_value"])
        elif isinstance(out, FakeTensor) and args and id(args[0]) in _KNOWN:
            value = _KNOWN[id(args[0])]
            if func in (torch.Tensor.long, torch.Tensor.cpu, torch.Tensor.to, torch.Tensor.int):
                _remember(out, value)
            elif func in (torch.Tensor.sum, torch.sum) and len(args) == 1 and not kwargs:
                _remember(out, value * args[0].numel())
        return out


class BalancedRouting(TorchDispatchMode):
    """The stand-in for the data-dependent ops of MoEAllGatherTokenDispatcher.dispatch_postprocess
    (token_dispatcher.py), which FakeTensorMode refuses: `local_map.sum(dim=0)` (tokens per local
    expert, read back with `.cpu()` / `.tolist()`) and `masked_select` (the permutation's token
    indices, `moe_utils.permute`, and the local routing weights). Under balanced routing, the
    assumption the estimator makes for every dispatcher (activations._routed: k*phi routed
    tokens per token, spread evenly over the E experts), a fraction k*phi/E of any slice of the
    routing map is set: every expert column of the gathered [N, E_local] map holds N*k*phi/E
    tokens and every masked_select keeps numel*k*phi/E elements. The harness's routing is balanced
    so by construction: drop-and-pad (moe_utils.apply_router_token_dropping with
    pad_to_capacity) gives every expert exactly its capacity ceil(T*k*phi/E) of each rank's T
    tokens, which is T*k*phi/E when that is whole (checked). Fake runs only; a real run computes
    the same sizes (tests/test_harness_megatron.py compares them byte for byte)."""

    def __init__(self, fraction: float):
        super().__init__()
        self.fraction = fraction

    def _count(self, numel: int) -> int:
        count = numel * self.fraction
        if count != int(count):
            raise RuntimeError(f"balanced routing of {numel} routing-map entries x {self.fraction} is not whole")
        return int(count)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is torch.ops.aten.masked_select.default and isinstance(args[1], FakeTensor):
            source, mask = args
            numel = torch.broadcast_shapes(source.shape, mask.shape).numel()
            return torch.empty(self._count(numel), dtype=source.dtype, device=source.device)
        out = func(*args, **kwargs)
        if func is torch.ops.aten.sum.dim_IntList and isinstance(out, FakeTensor) \
                and args[0].dtype == torch.bool and list(args[1]) == [0] and args[0].dim() == 2:
            _remember(out, self._count(args[0].shape[0]))  # every expert column: N*k*phi/E tokens
        return out


def _balanced_dispatch_postprocess(original):
    def dispatch_postprocess(self, hidden_states, probs):
        if not isinstance(hidden_states, FakeTensor):
            return original(self, hidden_states, probs)
        c = self.config
        with BalancedRouting(c.moe_router_topk * c.moe_expert_capacity_factor / c.num_moe_experts):
            return original(self, hidden_states, probs)

    return dispatch_postprocess


# The running StorageTracker's `adopt` (set by the harness): re-reads a storage's size.
STORAGE_RESIZED = {"adopt": None}


def _resized_after(method):
    def wrapper(self, *args):
        outputs = self.outputs
        result = method(self, *args)
        if STORAGE_RESIZED["adopt"] is not None and outputs is not None:
            for t in outputs:
                STORAGE_RESIZED["adopt"](t)
        return result

    return wrapper


@contextlib.contextmanager
def _no_fork(self, name=None):
    yield


def _patch(obj, name, value, saved):
    saved.append((obj, name, getattr(obj, name, None), hasattr(obj, name)))
    setattr(obj, name, value)


def _cpu_causal_mask(sq, skv=None):
    # transformer/utils.py get_default_causal_mask / get_sliding_window_causal_mask: the same
    # boolean mask, made where the model lives
    skv = sq if skv is None else skv
    return torch.triu(torch.ones(sq, skv, device="cpu"), diagonal=1).bool()


@contextlib.contextmanager
def megatron_shims():
    """Patch torch.cuda and Megatron-Core for a CPU process; restore everything on exit."""
    from . import fused

    register_coalesced_collectives()
    saved: list = [(owner, name, value, True) for owner, name, value in fused.install()]
    cuda = torch.cuda
    _patch(cuda, "current_device", lambda: torch.device("cpu"), saved)
    _patch(cuda, "Stream", _InertStream, saved)
    _patch(cuda, "Event", _InertEvent, saved)
    _patch(cuda, "current_stream", lambda *a, **k: _InertStream(), saved)
    _patch(cuda, "default_stream", lambda *a, **k: _InertStream(), saved)
    _patch(cuda, "stream", _stream_context, saved)
    _patch(cuda, "synchronize", lambda *a, **k: None, saved)
    _patch(cuda, "empty_cache", lambda: None, saved)
    _patch(cuda, "manual_seed", lambda seed: None, saved)

    import megatron.core.fusions.fused_softmax as fused_softmax
    import megatron.core.tensor_parallel.random as mrandom
    import megatron.core.transformer.utils as tutils

    _patch(mrandom, "_get_cuda_rng_state", lambda *a, **k: _RNG_STATE, saved)
    _patch(mrandom, "_set_cuda_rng_state", lambda *a, **k: None, saved)
    _patch(cuda, "get_rng_state", lambda *a, **k: _RNG_STATE, saved)
    # the tracker's fork compares CPU generator states with `.item()`; under fake tensors it
    # cannot, and there is no CUDA generator to fork
    _patch(mrandom.CudaRNGStatesTracker, "fork", _no_fork, saved)
    _patch(tutils, "get_default_causal_mask", _cpu_causal_mask, saved)
    # the step's gradient norm (logged; used only for clipping, which the runs switch off) ends
    # in float(tensor), which fake tensors cannot answer; its temporaries are a few scalars
    from megatron.core.optimizer.optimizer import ChainedOptimizer, MegatronOptimizer

    _patch(MegatronOptimizer, "get_grad_norm", lambda self: 0.0, saved)
    _patch(ChainedOptimizer, "get_grad_norm", lambda self: 0.0, saved)
    # CheckpointWithoutOutput.__init__ sets `self.fp8 = fp8 is not None`, true for the default
    # fp8=False, and then calls TE's FP8GlobalStateManager (a 0.16.1 bug without TE)
    original_init = mrandom.CheckpointWithoutOutput.__init__

    def init_without_fp8(self, fp8=False):
        original_init(self, fp8)
        self.fp8 = bool(fp8)

    _patch(mrandom.CheckpointWithoutOutput, "__init__", init_without_fp8, saved)
    # CheckpointWithoutOutput frees its outputs with `untyped_storage().resize_(0)` and grows
    # them back when recomputing; storage resizes are not tensor ops, so the tracker is told
    _patch(mrandom.CheckpointWithoutOutput, "discard_output_and_register_recompute",
           _resized_after(mrandom.CheckpointWithoutOutput.discard_output_and_register_recompute), saved)
    _patch(mrandom.CheckpointWithoutOutput, "_recompute",
           _resized_after(mrandom.CheckpointWithoutOutput._recompute), saved)
    # moe_utils.py refers to te_general_gemm, defined only when TE imports (a 0.16.1 bug);
    # None sends the router to torch's matmul
    import megatron.core.transformer.moe.moe_utils as moe_utils

    _patch(moe_utils, "te_general_gemm", None, saved)
    # --moe-grouped-gemm on the local spec: the legacy GroupedMLP's grouped_gemm package (a CUDA
    # extension), emulated (kernels.gmm)
    import megatron.core.transformer.moe.grouped_gemm_util as gg

    from .kernels import gmm

    _patch(gg, "grouped_gemm", types.SimpleNamespace(ops=types.SimpleNamespace(gmm=gmm)), saved)
    _patch(gg, "ops", types.SimpleNamespace(gmm=gmm), saved)
    # --moe-token-dispatcher-type allgather: its permutation's data-dependent sizes under fake
    # tensors come from balanced routing (BalancedRouting)
    from megatron.core.transformer.moe.token_dispatcher import MoEAllGatherTokenDispatcher

    _patch(MoEAllGatherTokenDispatcher, "dispatch_postprocess",
           _balanced_dispatch_postprocess(MoEAllGatherTokenDispatcher.dispatch_postprocess), saved)
    # multi_latent_attention.py sets HAVE_TE when megatron's TE extension module imports, even
    # with TELinear None, then calls isinstance(x, None)
    import megatron.core.transformer.multi_latent_attention as mla

    _patch(mla, "HAVE_TE", False, saved)
    # FakeTensor.tolist is a Python method (no torch-function dispatch): consult known values
    original_tolist = FakeTensor.tolist

    def tolist(self):
        if id(self) in _KNOWN:
            return [_KNOWN[id(self)]] * self.numel() if self.dim() else _KNOWN[id(self)]
        return original_tolist(self)

    _patch(FakeTensor, "tolist", tolist, saved)
    _patch(fused_softmax, "get_default_causal_mask", _cpu_causal_mask, saved)
    # --cross-entropy-fusion-impl te: TE's cross-entropy kernel, emulated (kernels.py)
    import megatron.core.models.common.language_module.language_module as language_module

    from .kernels import te_parallel_cross_entropy

    _patch(language_module, "te_parallel_cross_entropy", te_parallel_cross_entropy, saved)
    try:
        with CudaToCpu():
            yield
    finally:
        for obj, name, value, existed in reversed(saved):
            if existed:
                setattr(obj, name, value)
            else:
                delattr(obj, name)


@contextlib.contextmanager
def gloo_as_fake():
    """parallel_state makes gloo groups for the distributed optimizer's CPU-side collectives;
    on the fake process group they are fake groups too. `all_gather_object` returns this
    rank's object for every rank."""
    import torch.distributed as dist

    original = dist.new_group

    def new_group(*args, **kwargs):
        if kwargs.get("backend") == "gloo":
            kwargs["backend"] = None
        return original(*args, **kwargs)

    def all_gather_object(object_list, obj, group=None):
        # the fake backend moves no Python objects; every rank of a uniform run holds the same
        # (the optimizer's parameter-group keys)
        object_list[:] = [obj] * len(object_list)

    saved_gather = dist.all_gather_object
    dist.new_group, dist.all_gather_object = new_group, all_gather_object
    try:
        yield
    finally:
        dist.new_group, dist.all_gather_object = original, saved_gather


_COALESCED_LIBRARY = []


def register_coalesced_collectives() -> None:
    """Meta kernels for the four c10d `*_coalesced_` ops, which torch 2.13 leaves out
    (torch/distributed/_meta_registrations.py lists them as deprecated); Megatron's DDP and
    distributed optimizer call them through `torch.distributed._coalescing_manager`. They write
    into their output tensors in place and return a Work handle."""
    if _COALESCED_LIBRARY:
        return
    import torch.distributed._meta_registrations  # noqa: F401  (the other collectives' kernels)
    from torch.distributed._meta_registrations import create_fakework

    library = torch.library.Library("c10d", "IMPL")
    for op in ("allreduce_coalesced_", "allgather_coalesced_", "allgather_into_tensor_coalesced_",
               "reduce_scatter_tensor_coalesced_"):
        library.impl(op, lambda *args: create_fakework(args, return_first_arg=False), "Meta")
    _COALESCED_LIBRARY.append(library)
