"""Models built on the meta device, outside FakeTensorMode (modules moved between devices under it
cannot swap their fake parameters), then given storage inside it."""

from __future__ import annotations

import torch
from torch import nn


def materialize(model: nn.Module, device: str = "cpu") -> None:
    """Replace every meta parameter by one on `device` (a fake CPU one under FakeTensorMode; a real
    GPU's for validation/gpu), N(0, 0.02) initialised so a real run computes finite values; shared
    parameters stay shared."""
    done: dict[int, nn.Parameter] = {}
    for module in model.modules():
        for name, p in list(module._parameters.items()):
            if p is None or not p.is_meta:
                continue
            if id(p) not in done:
                with torch.no_grad():
                    data = torch.empty_like(p, device=device).normal_(std=0.02)
                done[id(p)] = nn.Parameter(data, requires_grad=p.requires_grad)
            module._parameters[name] = done[id(p)]
