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
from torch.utils._python_dispatch import TorchDispatchMode
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
        out = func(*args, **(kwargs or {}))
        if self._hidden:
            return out
        for t in tree_leaves(out):
            if not isinstance(t, torch.Tensor):
                continue
            if func in HOST_OPS and t.dim() == 0 and id(t.untyped_storage()) not in self._keys:
                self.ignore(t)
            if id(t.untyped_storage()) not in self._host:
                key = self.adopt(t)
                self.labels.setdefault(key, f"{func.__name__} {str(t.dtype)[6:]} {tuple(t.shape)}")
        return out

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

