"""A pipelined FSDP2 rank that runs every forward before its first backward: its layer inputs and its
unsharded gradients never peak together.

torch.distributed.pipelining's Schedule1F1B warms a rank up with min(n_microbatches, num_stages -
stage_index) forwards, then runs a backward before each further forward (the "1B1F" loop), so rank 0 with
as many micro-batches as stages (torchtitan's default) runs every forward first and no forward after its
first backward. Under a pipeline FSDP2 makes a unit's unsharded gradient (in the reduce dtype) at the unit's
first backward and accumulates the later micro-batches' into it. So that rank holds, one moment at a time:
- the first backward's start: k micro-batches' layer inputs, one unit's gradient made;
- its end (the stage's first layer): the first layer's input of that micro-batch beside the k - 1 others,
  every layer's gradient, the embedding's not yet (the root unit's backward comes last);
- each later backward's start: k - 1 micro-batches, every gradient.
Between them a backward trades one layer's inputs for one layer's gradient at a time, so the largest of the
three is the rank's backward peak, where the estimate without this rule holds k micro-batches beside every
gradient. Other 1F1B ranks run a forward after their first backward (k in flight again, every gradient
made): that rule stands there. Under the interleaved schedule a rank's chunks begin their backwards apart,
so every rank is replayed from torch's own order (pp_interleaved_moments.py; the loss's, pp_last_rank.py). Megatron's
schedules keep persistent gradient buffers and are not concerned. The harness (validation/torchtitan) runs
no pipeline (one process, PP 1): the moments are read from these sources, not measured.
"""

from __future__ import annotations

from typing import Callable

from .components import Component
from .sharding import StageParameters
from ..spec.dtypes import bytes_per_element
from ..spec.parallel import Parallel
from ..spec.training import Recipe, Training
from .pp_interleaved_moments import SOURCE as INTERLEAVED_SOURCE, most_received, rank_operations, \
    replayed_saving, saving_parts
from .pp_last_rank import fewer_on_the_last_rank
from .pp_receive import Receiving, received_parts

SOURCE = ("torch 2.6.0 and 2.13 distributed/pipelining/schedules.py Schedule1F1B._step_microbatches (warmup_chunks = "
          "min(n_microbatches, num_stages - stage_index); then backward_one_chunk before each further forward); "
          "pipelining/stage.py backward_maybe_with_nosync (FSDP2: set_requires_gradient_sync(False) until the last "
          "backward); distributed/fsdp/_fully_shard/_fsdp_param.py to_accumulated_grad_if_needed (a unit's unsharded "
          "gradient in reduce_dtype from its first backward)")


def runs_every_forward_first(training: Training, par: Parallel, sp: StageParameters, m: int) -> bool:
    """Whether the rule applies: torch pipelining's 1F1B over FSDP2 (a training run of full weights, the
    gradients accumulated unsharded, `transients._pipelined_fsdp2_gradients`), on rank 0 when the
    micro-batches are no more than the stages (its warm-up is all of them)."""
    return (training.framework == "fsdp2" and training.mode == "training" and par.pp > 1
            and par.schedule == "1f1b" and sp.first and not sp.last and m <= par.pp
            and not training.adapter and not training.optimizer_in_backward and not training.offload_activations)


def interleaved_applies(training: Training, par: Parallel, sp: StageParameters) -> bool:
    """torch pipelining's interleaved 1F1B over FSDP2 (as `runs_every_forward_first`), on any rank (the last
    rank's: pp_last_rank.py)."""
    return (training.framework == "fsdp2" and training.mode == "training" and par.pp > 1
            and par.schedule == "interleaved" and len(sp.chunks) == par.vpp
            and not training.adapter and not training.optimizer_in_backward and not training.offload_activations)


def fewer_at_first_backward(training: Training, recipe: Recipe, par: Parallel, sp: StageParameters, m: int,
                            inflight: float, held: Callable[[float], int],
                            outside_layers: float, loss_margin: int = 0,
                            rx: Receiving | None = None) -> tuple[Component, ...]:
    """What the backward's peak holds less than `inflight` micro-batches' stored activations beside every
    unsharded gradient, as negative parts: of the activations (key "activations") and of the unsharded
    gradients (key "transient"), each no larger than what it is taken from; () where the rule does not apply.
    `held(k)`: the stage's stored activations with k micro-batches in flight; `outside_layers`: a
    micro-batch's share of them that is not its layers' (the embedding's, a vision tower's), freed after the
    stage's first layer; `loss_margin`: on the last rank, its loss's backward moment less its other moments, as
    charged (static_stage); `rx`: an interleaved rank's receiving chunks (pp_receive.py), whose buffers and .grad
    at the replayed moment come back as positive parts (key "buffers")."""
    if interleaved_applies(training, par, sp) and sp.last:
        return fewer_on_the_last_rank(recipe, par, sp, m, inflight, held, loss_margin, rx)
    if interleaved_applies(training, par, sp):
        return _interleaved(recipe, par, sp, m, inflight, held, rx)
    if not runs_every_forward_first(training, par, sp, m) or inflight < 1 or not sp.num_layers:
        return ()
    G = bytes_per_element(recipe.grad_dtype)
    gib = 2**30
    k, n = int(inflight), sp.num_layers
    one = held(inflight) - held(inflight - 1) if k >= 2 else held(inflight)
    layers = one - outside_layers
    moments = []
    if k >= 2:  # each later backward's start: one micro-batch fewer, every gradient
        moments.append((_activations(
            "One micro-batch fewer once every gradient exists (all forwards ran first)", one,
            f"one micro-batch's stored activations: the {m} forwards ran before the first backward, which made "
            f"every unsharded gradient; the later backwards hold {k - 1} micro-batches beside them"),))
    not_made = int(round(G * (sp.local - sp.largest_layer_local)))
    moments.append((_gradients(
        "Unsharded gradients not made yet at the first backward's start", not_made,
        f"{G:g} B x (the stage's parameters - one layer's): {k} micro-batches' inputs beside one unit's gradient"),))
    freed, root = int(round(layers * (n - 1) / n)), int(round(G * sp.root_local))
    moments.append(tuple(c for c in (
        _activations("The first backward's end: its micro-batch's later layers freed", freed,
                     f"{layers / gib:,.2f} GiB x {n - 1}/{n} layers of one micro-batch"),
        _gradients("The root unit's gradient, not made before the first backward's end", root,
                   f"{G:g} B x the root unit's {sp.root_local / 1e6:,.1f}M parameters")) if c.bytes))
    return max(moments, key=lambda parts: sum(c.bytes for c in parts))  # the smallest saving: the largest moment


def _activations(label: str, freed: int, why: str) -> Component:
    return Component("activations", label, -freed, f"-{freed / 2**30:,.2f} GiB: {why}", SOURCE)


def _gradients(label: str, not_made: int, why: str) -> Component:
    return Component("transient", label, -not_made, f"-{not_made / 2**30:,.2f} GiB: {why}", SOURCE)


def _interleaved(recipe: Recipe, par: Parallel, sp: StageParameters, m: int, inflight: float,
                 held: Callable[[float], int], rx: Receiving | None) -> tuple[Component, ...]:
    """An interleaved rank's largest moment, replayed (pp_interleaved_moments.py), less than the in-flight
    inputs beside every gradient, with its receive buffers; where the replay's most inputs are not the in-flight
    count's (a micro-batch group other than torch's rounds) the charge stands, beside the most receive buffers
    any backward start holds."""
    sizes = tuple(len(c) for c in sp.chunks)
    total = sum(sizes)
    if not total:
        return ()
    G = bytes_per_element(recipe.grad_dtype)
    root = sp.root_local if sp.first else 0.0
    per_layer = (sp.local - sp.root_local) / total
    grads = tuple(G * (per_layer * n + (root if c == 0 else 0.0)) for c, n in enumerate(sizes))
    saving = replayed_saving(G, par, sp, m, inflight, held, grads, G * root, 0.0,
                             rx.along(sp.stage, par.pp, par.vpp) if rx else None)
    if saving is None:
        return received_parts(rx, most_received(rank_operations(sp.stage, par.pp, par.vpp, m), par.vpp,
                                                  rx.along(sp.stage, par.pp, par.vpp))
                              if rx else None, "the latest backward's start")
    moment, inputs, not_made, top = saving
    return saving_parts(moment, inputs, not_made, top, total, f"at the replayed schedule's largest moment "
                        f"({moment.what})", f"{SOURCE}; {INTERLEAVED_SOURCE}") \
        + received_parts(rx, moment, f"at {moment.what}")
