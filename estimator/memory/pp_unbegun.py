"""An interleaved last rank's unsharded FSDP2 gradients that do not exist yet at the loss's moment: torch's
interleaved schedule runs every backward of the rank's last chunk before its earlier chunks' first, so the earlier
chunks' gradients are not made while the loss's backward runs (static_stage.py takes them out of that moment)."""

from __future__ import annotations

from .components import Component
from .pipeline import microbatch_group
from .sharding import StageParameters
from .transients import PIPELINED_GRADIENTS_LABEL
from ..spec.dtypes import bytes_per_element
from ..spec.parallel import Parallel
from ..spec.training import Recipe, Training


INTERLEAVED_GRADIENTS_SOURCE = ("torch 2.6.0 and 2.13 distributed/pipelining/schedules.py ScheduleInterleaved1F1B (one "
                                "round of pp micro-batches per chunk: every backward of the rank's last chunk runs "
                                "before its earlier chunks' first) and stage.py backward_maybe_with_nosync; FSDP2 "
                                "_fsdp_param.py to_accumulated_grad_if_needed (a unit's unsharded gradient exists from "
                                "its first backward)")


def gradients_after_the_loss(training: Training, recipe: Recipe, par: Parallel, sp: StageParameters, m: int) -> float:
    """The unsharded gradients (reduce dtype) of an interleaved last rank's earlier chunks, which do not
    exist yet while the loss's backward runs: with the micro-batches in one round (m <= the group, pp by
    default), the last chunk's backwards all come first (INTERLEAVED_GRADIENTS_SOURCE). 0 elsewhere."""
    if len(sp.chunks) < 2 or sp.first or m > microbatch_group(par, training.microbatch_group_size) \
            or training.mode != "training":
        return 0.0
    earlier = sum(len(c) for c in sp.chunks[:-1]) * sp.largest_layer_local
    return bytes_per_element(recipe.grad_dtype) * earlier


def made_so_far(c: Component, unbegun: float) -> Component:
    """The pipelined FSDP2 gradients' component at the loss's moment, less `unbegun`."""
    if c.label != PIPELINED_GRADIENTS_LABEL:
        return c
    return Component(c.key, "Unsharded gradients accumulated so far (the last chunk's: the rank's earlier chunks "
                     "start their backward after the loss's last)", c.bytes - int(round(unbegun)),
                     f"{c.formula} - {unbegun / 2**30:,.2f} GiB of the earlier chunks' layers",
                     f"{c.source}; {INTERLEAVED_GRADIENTS_SOURCE}")
