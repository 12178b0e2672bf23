"""Which tensor storages are alive, and how many bytes the CUDA caching allocator gives them.

A `TorchDispatchMode` sees every aten op the step runs, below autograd, in the forward, the
backward and the optimizer step alike. Every storage an op returns that is new to us is
registered with its size rounded as the caching allocator rounds it, and a weakref finalizer on
the `UntypedStorage` (torch keeps one Python object per storage alive as long as the storage
lives) records the moment it is freed. The result is a log of +/- events; categories are given
afterwards by identity (a weight gradient is born in the backward as an `mm` output and only
then becomes `param.grad`), by replaying the log.
"""

from __future__ import annotations

import itertools
import weakref
from contextlib import contextmanager

import torch
from torch.utils._python_dispatch import TorchDispatchMode, is_traceable_wrapper_subclass
from torch.utils._pytree import tree_leaves

CATEGORIES = ("parameters", "gradients", "optimizer_states", "activations")

# c10/cuda/CUDACachingAllocator.cpp: every request is rounded up to a multiple of kMinBlockSize
# (512 bytes); an empty storage asks the allocator for nothing.
BLOCK = 512


def category_of(key: int, params: set, grads: set, states: set) -> str:
    """The category of a storage: its owner's, else an activation (everything else alive)."""
    if key in params:
        return "parameters"
    if key in grads:
        return "gradients"
    if key in states:
        return "optimizer_states"
    return "activations"


def categories(params: set, grads: set, states: set):
    """`category_of` over these sets as they are when asked (gradients join them during the step)."""
    return lambda key: category_of(key, params, grads, states)


def phase_summary(tracker: "StorageTracker", category) -> dict:
    """The record's `measured` core: bytes per category at each phase's peak, the overall peak and
    its phase, and the categories at that peak."""
    phases = {name: {c: p[c] for c in CATEGORIES} | {"total": p["total"]}
              for name, p in tracker.peaks(category).items()}
    peak_phase = max(phases, key=lambda name: phases[name]["total"])
    peak = phases[peak_phase]
    return {**{c: peak[c] for c in CATEGORIES}, "peak_bytes": peak["total"], "peak_phase": peak_phase,
            "phases": phases}


def cuda_block_bytes(nbytes: int) -> int:
    return -(-nbytes // BLOCK) * BLOCK


# `torch.tensor(python_number)` ends in aten.lift_fresh. Without an explicit device such a
# 0-dim tensor lives on the host in a GPU run (AdamW's `torch.tensor(1.0, device="cpu")` step
# increment, Gemma's embedding normaliser), so it never reaches the CUDA allocator.
HOST_OPS = {torch.ops.aten.lift_fresh.default, torch.ops.aten.lift_fresh_copy.default}


class StorageTracker(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self._keys: dict[int, int] = {}  # id(UntypedStorage) -> our key
        self._size: dict[int, int] = {}  # key -> rounded bytes currently accounted
        self._next = itertools.count()
        self.events: list[tuple[int, int]] = []  # (key, +/- rounded bytes), in order
        self.marks: list[tuple[int, str]] = []  # (index into events, phase starting there)
        self.labels: dict[int, str] = {}  # key -> the op, dtype and shape that allocated it
        self._host: set[int] = set()  # id(UntypedStorage) of host-resident storages
        self._hidden = 0
        self.recording = True
        # op -> a function of its arguments returning the temporaries a CUDA kernel of the op allocates
        # before its output and frees when it returns (validation/core/emulation.py installs them)
        self.kernel_temporaries: dict = {}

    # --- registration -------------------------------------------------------------------------
    def adopt(self, tensor: torch.Tensor) -> int:
        """Register a tensor's storage (if new) and return its key."""
        storage = tensor.untyped_storage()
        key = self._keys.get(id(storage))
        if key is None:
            key = next(self._next)
            self._keys[id(storage)] = key
            self._size[key] = 0
            weakref.finalize(storage, self._free, id(storage), key)
        self._resize(key, cuda_block_bytes(storage.nbytes()))
        return key

    def ignore(self, tensor: torch.Tensor) -> None:
        """Mark a storage as host memory in a GPU run: never counted, even when an in-place op
        returns it later."""
        storage = tensor.untyped_storage()
        if id(storage) not in self._host:
            self._host.add(id(storage))
            weakref.finalize(storage, self._host.discard, id(storage))

    def key(self, tensor: torch.Tensor) -> int:
        return self._keys[id(tensor.untyped_storage())]

    def _resize(self, key: int, size: int) -> None:
        # A new storage starts at 0; `resize_` and `out=` kernels may grow one afterwards.
        delta = size - self._size[key]
        if delta and self.recording:
            self.events.append((key, delta))
        self._size[key] = size

    def _free(self, storage_id: int, key: int) -> None:
        self._keys.pop(storage_id, None)
        size = self._size.pop(key)
        if size and self.recording:
            self.events.append((key, -size))

    # --- the dispatch hook ----------------------------------------------------------------------
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        temporaries = self.kernel_temporaries.get(func)
        held = temporaries(args) if temporaries and not self._hidden else None
        if held is not None:
            self.register_outputs(func, args, held)
        out = func(*args, **(kwargs or {}))
        if not self._hidden:
            self.register_outputs(func, args, out)
        del held  # the kernel's temporaries die when it returns, after its output is made
        return out

    def register_outputs(self, func, args, out) -> None:
        """Register the storages an op returned (a variant may first look at its arguments)."""
        for t in self.storages(out):
            if func in HOST_OPS and t.dim() == 0 and id(t.untyped_storage()) not in self._keys:
                self.ignore(t)
            if id(t.untyped_storage()) not in self._host:
                key = self.adopt(t)
                self.labels.setdefault(key, f"{func.__name__} {str(t.dtype)[6:]} {tuple(t.shape)}")

    def storages(self, out) -> list[torch.Tensor]:
        """The tensors of an op's output whose storages are counted: every one here."""
        return [t for t in tree_leaves(out) if isinstance(t, torch.Tensor)]

    @contextmanager
    def hidden(self):
        """Run work the tracker must not see: the reference maths that gives an emulated CUDA
        kernel its values on a real CPU run. Its storages are never registered, so their frees
        are not either; results must be copied into storages allocated outside."""
        self._hidden += 1
        try:
            yield
        finally:
            self._hidden -= 1

    @contextmanager
    def phase(self, name: str):
        self.marks.append((len(self.events), name))
        yield

    def start(self) -> None:
        """Begin the log with every storage alive now (the state the measured step starts from)."""
        self.events = [(key, size) for key, size in self._size.items() if size]
        self.recording = True

    def stop(self) -> None:
        self.recording = False

    # --- replay ------------------------------------------------------------------------------
    def peaks(self, category_of) -> dict:
        """Replay the log: per phase, the live bytes per category at that phase's peak.

        `category_of(key)` names the category of a storage; events before the first mark are
        the state alive when the measured step starts.
        """
        live = dict.fromkeys(CATEGORIES, 0)
        phases: dict[str, dict] = {}
        bounds = self.marks + [(len(self.events), None)]
        start = bounds[0][0]
        for key, delta in self.events[:start]:
            live[category_of(key)] += delta
        for (begin, name), (end, _) in zip(bounds, bounds[1:]):
            best = dict(live, total=sum(live.values()), at=begin)
            for i, (key, delta) in enumerate(self.events[begin:end], begin + 1):
                live[category_of(key)] += delta
                if delta > 0:
                    total = sum(live.values())
                    if total > best["total"]:
                        best = dict(live, total=total, at=i)
            phases[name] = best
        return phases

    def live_at(self, index: int) -> dict[int, int]:
        """Key -> bytes of every storage alive after the first `index` events."""
        live: dict[int, int] = {}
        for key, delta in self.events[:index]:
            live[key] = live.get(key, 0) + delta
            if not live[key]:
                del live[key]
        return live



# --- tensor subclasses ------------------------------------------------------------------------------
def plain_tensors(t: torch.Tensor) -> list[torch.Tensor]:
    """The tensors that own storage: a wrapper subclass (torchao's NF4) owns none itself."""
    if not is_traceable_wrapper_subclass(t):
        return [t]
    names, _ = t.__tensor_flatten__()
    inner = (getattr(t, name) for name in names)
    return [leaf for x in inner if isinstance(x, torch.Tensor) for leaf in plain_tensors(x)]


class UnwrappingTracker(StorageTracker):
    """A tracker that looks through a wrapper subclass an op returns (torchao's NF4, whose inner
    tensors are created outside any op the mode sees) to the plain tensors holding its storage."""

    def storages(self, out) -> list[torch.Tensor]:
        return [leaf for x in super().storages(out) for leaf in plain_tensors(x)]

    def adopt_all(self, t: torch.Tensor) -> set[int]:
        """Register the storages of a tensor alive when the log starts, host-resident ones
        (a CPU step counter created by torch.tensor) excepted."""
        return {self.adopt(leaf) for leaf in plain_tensors(t) if id(leaf.untyped_storage()) not in self._host}


WAIT = torch.ops._c10d_functional.wait_tensor.default


def _keep_alive(_):
    pass


class SubclassAwareTracker(StorageTracker):
    """A tracker for DTensors (FSDP2, TP) and torchao's Float8TrainingTensor: wrapper subclasses
    whose own "storage" is a data-less placeholder of the global (unsharded) size.

    A dispatch mode is called before the subclass and is popped while it runs, so by default it
    would log the placeholder (the global size, a phantom) and never see the local tensors the
    subclass actually allocates. Returning NotImplemented for an op with subclass arguments lets
    the subclass run it; its inner ops on plain local tensors then come back through the mode and
    are counted. DTensor's sharding propagation computes output shapes on the meta device: those
    tensors own no memory and are skipped.

    `_c10d_functional.wait_tensor` returns its input (the collective's output buffer) on a GPU and
    in a real CPU run; under fake tensors it returns a new fake storage. The tracker counts it as
    the input's buffer: the new storage is not counted, and it keeps the input alive as long as it
    lives, as the one real buffer would be.
    """

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if any(is_traceable_wrapper_subclass(t) for t in tree_leaves((args, kwargs))):
            return NotImplemented
        return super().__torch_dispatch__(func, types, args, kwargs)

    def register_outputs(self, func, args, out) -> None:
        if func is WAIT and out.untyped_storage() is not args[0].untyped_storage():
            self.ignore(out)
            weakref.finalize(out.untyped_storage(), _keep_alive, args[0])
        super().register_outputs(func, args, out)

    def storages(self, out) -> list[torch.Tensor]:
        return [t for t in super().storages(out)
                if t.device.type != "meta" and not is_traceable_wrapper_subclass(t)]
