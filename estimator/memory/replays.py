"""Which replay of the caching allocator gives a stage's cache: DeepSpeed's own order (deepspeed_replay.py) for
DeepSpeed, the HF Trainer's (reserved.py) otherwise; each says why it does not apply where it does not."""

from __future__ import annotations

from . import deepspeed_replay, reserved
from .components import Component

FLAT_FOR_SEARCH = reserved.FLAT_FOR_SEARCH


def replay_rule(cfg) -> str | None:
    """Why no replay applies to this configuration (None: one does)."""
    if cfg.training.framework == "deepspeed":
        return deepspeed_replay.replay_rule(cfg)
    return reserved.replay_rule(cfg)


def replayed_cache(cfg, shared, sp, static) -> Component:
    """The stage's `fragmentation` component by the replay that applies (`replay_rule(cfg)` is None)."""
    if cfg.training.framework == "deepspeed":
        return deepspeed_replay.replayed_cache(cfg, shared, sp, static)
    return reserved.replayed_cache(cfg, shared, sp, static)
