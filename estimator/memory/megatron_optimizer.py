"""Megatron-Core's optimizer step where neither TransformerEngine nor Apex is installed (training.te_version
"not_installed"): megatron/core/optimizer/__init__.py (core_v0.16.1) imports TE's FusedAdam, else Apex's, else
`from torch.optim import AdamW as Adam` (USING_PYTORCH_OPTIMIZER). torch's AdamW runs its foreach implementation
on CUDA (_multi_tensor_adam), which materialises sqrt(v) of a whole parameter group before its addcdiv: one
temporary of the optimizer states' dtype per parameter of the group, on the rank's shard under the distributed
optimizer. Measured on an H200 (tests/data/measured/gpu/megatron: the optimizer phase rises from its start by
exactly 4 B x the decay group's parameters, every weight but the norms'); the estimate charges the rank's whole
shard (the no-decay group is the norms' few elements).
"""

from __future__ import annotations

from .components import Component, component
from ..spec.dtypes import bytes_per_element
from ..spec.optimizers import MEGATRON_TORCH_ADAMW_SOURCE, megatron_torch_adamw
from ..spec.training import Recipe, Training


def torch_adamw_step(training: Training, recipe: Recipe, trainable: float, d: int) -> list[Component]:
    """The foreach step's temporary over the rank's 1/d of the `trainable` parameters (d: the distributed
    optimizer's data-parallel shards), or [] where Megatron runs a fused Adam (or no AdamW)."""
    if training.optimizer != "adamw" or not megatron_torch_adamw(training.framework, training.te_version):
        return []
    size = bytes_per_element(recipe.optimizer_dtype)
    shard = trainable / max(1, d)
    return [component("transient", "foreach AdamW temporary (sqrt of the second moment)", size * shard,
                      f"{size:g} B x parameters on this GPU" + (f" / d ({d})" if d > 1 else ""),
                      "torch.optim.AdamW foreach implementation (_multi_tensor_adam); " + MEGATRON_TORCH_ADAMW_SOURCE)]
