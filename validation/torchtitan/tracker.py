"""validation/tracker.py's StorageTracker, made to see through tensor subclasses.

torchtitan's parameters, gradients and optimizer states are DTensors (FSDP2, TP) and, with
float8, torchao's Float8TrainingTensor: wrapper subclasses whose own "storage" is a data-less
placeholder of the global (unsharded) size. A dispatch mode is called before the subclass and is
popped while it runs, so by default it would log the placeholder (the global size, a phantom)
and never see the local tensors the subclass actually allocates. Returning NotImplemented for
an op with subclass arguments lets the subclass run it; its inner ops on plain local tensors then
come back through the mode and are counted. DTensor's sharding propagation computes output
shapes on the meta device: those tensors own no memory and are skipped.

`_c10d_functional.wait_tensor` returns its input (the collective's output buffer) on a GPU and
in a real CPU run; under fake tensors it returns a new fake storage. The tracker counts it as
the input's buffer: the new storage is not counted, and it keeps the input alive as long as it
lives, as the one real buffer would be.
"""

from __future__ import annotations

import torch
import weakref

from torch.utils._python_dispatch import is_traceable_wrapper_subclass
from torch.utils._pytree import tree_leaves

from ..tracker import HOST_OPS, StorageTracker


WAIT = torch.ops._c10d_functional.wait_tensor.default


def _keep_alive(_):
    pass


class SubclassAwareTracker(StorageTracker):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if any(is_traceable_wrapper_subclass(t) for t in tree_leaves((args, kwargs))):
            return NotImplemented
        out = func(*args, **(kwargs or {}))
        if self._hidden:
            return out
        if func is WAIT and out.untyped_storage() is not args[0].untyped_storage():
            self.ignore(out)
            weakref.finalize(out.untyped_storage(), _keep_alive, args[0])
        for t in tree_leaves(out):
            if not isinstance(t, torch.Tensor) or t.device.type == "meta" \
                    or is_traceable_wrapper_subclass(t):
                continue
            if func in HOST_OPS and t.dim() == 0 and id(t.untyped_storage()) not in self._keys:
                self.ignore(t)
            if id(t.untyped_storage()) not in self._host:
                key = self.adopt(t)
                self.labels.setdefault(key, f"{func.__name__} {str(t.dtype)[6:]} {tuple(t.shape)}")
        return out
