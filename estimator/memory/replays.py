"""Which replay of the caching allocator gives a stage's cache: DeepSpeed's own order (deepspeed_replay.py) for
DeepSpeed, Megatron-Core's (megatron_replay.py) for Megatron, the HF Trainer's (reserved.py) otherwise; each says
why it does not apply where it does not."""

from __future__ import annotations

from . import deepspeed_replay, megatron_replay, reserved
from .components import Component

FLAT_FOR_SEARCH = reserved.FLAT_FOR_SEARCH

_BY_FRAMEWORK = {"deepspeed": deepspeed_replay, "megatron": megatron_replay}


def replay_rule(cfg) -> str | None:
    """Why no replay applies to this configuration (None: one does): a stage too deep for any (reserved.too_deep),
    else the framework's own rule."""
    return reserved.too_deep(cfg) or _BY_FRAMEWORK.get(cfg.training.framework, reserved).replay_rule(cfg)


def replayed_cache(cfg, shared, sp, static) -> Component:
    """The stage's `fragmentation` component by the replay that applies (`replay_rule(cfg)` is None)."""
    return _BY_FRAMEWORK.get(cfg.training.framework, reserved).replayed_cache(cfg, shared, sp, static)
