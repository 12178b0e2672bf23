"""The last rank of torch pipelining's interleaved 1F1B over FSDP2 (the rank with the loss), replayed.

Its warm-up is (v - 1) x round chunk-forwards (torch 2.6.0 and 2.13 distributed/pipelining/schedules.py
ScheduleInterleaved1F1B._get_warmup_ops: 2(p - 1 - rank) = 0 on rank p - 1), then a forward and a backward of
its last chunk each step, then the earlier chunks' backwards. Two kinds of moment hold its backward's peak:
- the loss's (its saved tensors and working copies), in the last chunk's backwards only: the estimate charges
  them beside the in-flight inputs and every gradient less the earlier chunks'
  (pp_unbegun.gradients_after_the_loss, which is the replay of those moments: every loss comes before the
  earlier chunks' first backward when the micro-batches are one round);
- every other backward moment (a recomputed layer, or none), charged beside the in-flight inputs and every
  gradient: replayed here from torch's order (pp_interleaved_moments.largest_moment), the head's gradient made
  at the last chunk's first backward (autograd runs the head first), the blocks' as in the other ranks.
The estimate charges the larger of the two; `loss_margin` (static_stage: the loss's moment less the other's, as
charged) says which, so the replay lowers only the other kind's charge, and never below the loss's moment.
"""

from __future__ import annotations

from typing import Callable

from .components import Component
from .sharding import StageParameters
from ..spec.dtypes import bytes_per_element
from ..spec.parallel import Parallel
from ..spec.training import Recipe
from .pp_interleaved_moments import SOURCE as INTERLEAVED_SOURCE, most_received, rank_operations, \
    replayed_saving, saving_parts
from .pp_receive import Receiving, received_parts

SOURCE = ("torch 2.6.0 and 2.13 distributed/pipelining/schedules.py ScheduleInterleaved1F1B (_get_warmup_ops: "
          "(v - 1) x microbatches_per_round on the last rank) and stage.py backward_maybe_with_nosync; "
          "distributed/fsdp/_fully_shard/_fsdp_param.py to_accumulated_grad_if_needed (a unit's unsharded gradient "
          f"from its first backward); {INTERLEAVED_SOURCE}")


def fewer_on_the_last_rank(recipe: Recipe, par: Parallel, sp: StageParameters, m: int, inflight: float,
                           held: Callable[[float], int], loss_margin: int,
                           rx: Receiving | None = None) -> tuple[Component, ...]:
    """What the last rank's backward peak holds less than its charge, as negative parts (keys "activations",
    "transient"), and its receive buffers (`rx`, pp_receive.py; key "buffers"): none of the former where the
    loss's moment is the charged one (`loss_margin` >= 0) or where the replay's most inputs are not the in-flight
    count's. The loss's moments are the last chunk's backwards: the latest holds the most receive buffers."""
    sizes = tuple(len(c) for c in sp.chunks)
    total = sum(sizes)
    ops = rank_operations(sp.stage, par.pp, par.vpp, m)
    along = rx.along(sp.stage, par.pp, par.vpp) if rx else None
    at_loss = most_received(ops, len(sizes), along, len(sizes) - 1) if rx else None
    loss_rx = received_parts(rx, at_loss, "at the last chunk's latest backward, the loss's")
    if loss_margin >= 0 or not total:
        return loss_rx
    G = bytes_per_element(recipe.grad_dtype)
    per_layer = (sp.local - sp.root_local) / total
    head = G * sp.root_local  # the final norm's and the head's: the FSDP root unit of the last model part
    grads = tuple(G * per_layer * n + (head if c == len(sizes) - 1 else 0.0) for c, n in enumerate(sizes))
    saving = replayed_saving(G, par, sp, m, inflight, held, grads, 0.0, head, along)
    if saving is None:
        return received_parts(rx, most_received(ops, len(sizes), along) if rx else None,
                              "the latest backward's start")
    moment, inputs, not_made, top = saving
    loss_received = sum(c.bytes for c in loss_rx)
    if moment.received - (inputs + not_made) < loss_margin + loss_received:  # the loss's moment is the larger
        return (Component("transient", "The loss's moment, the largest (interleaved schedule replayed)", loss_margin,
                          f"-{-loss_margin / 2**30:,.2f} GiB: the loss's saved tensors and working copies beside the "
                          f"last chunk's gradients, less than the recomputed layer beside every gradient and input; "
                          f"the replay's largest other moment ({moment.what}) is lower still", SOURCE),) + loss_rx
    return saving_parts(moment, inputs, not_made, top, total,
                        f"at the replayed schedule's largest moment outside the loss ({moment.what})", SOURCE) \
        + received_parts(rx, moment, f"at {moment.what}")
