"""A stage's memory that does not depend on the micro-batches in flight: model states (ZeRO,
offload, paged optimizers), transients, moments of the backward, and their phases. The recomputed
layer's moment in backward: recompute_moment.py.
"""

from __future__ import annotations

from functools import partial
from typing import Callable, NamedTuple

from .activations.entries import KORTHIKANTI
from .activations.loss import DEFER_WGRAD_SOURCE, deferred_wgrad_microbatches
from .activations.recompute import recomputed_layer_count
from ..spec.architecture import Architecture
from .deepspeed_offload import host_buffers as deepspeed_host_buffers
from .deepspeed_step import gradients_source, keeps_gradient_buffer
from .deepspeed_zero1 import reduction_end as zero1_reduction_end, step_gradients as zero1_step_gradients
from .deepspeed_zero1_overlap import deepspeed_in_backward, overlap_end as zero1_overlap_end
from .deepspeed_zero2 import with_partition as zero2_partition
from .components import Component, component, entries_component, fold, once, total_bytes
from ..spec.hardware import Hardware
from ..spec.parallel import Parallel
from .sharding import StageParameters, padded_vocab_size
from .offload import OFFLOAD_SOURCES, Placement, placement
from ..spec.optimizers import OPTIMIZERS
from .adapters import adapter_states, inventory
from .kbit import autocast_head_copy, ledger_training, math_attention, under_autocast
from .fsdp1 import frozen_weights_train, is_fsdp1, no_shard_backward_end, shard_group
from .activations.trl_loss import SOURCE as TRL_SOURCE, nll_metrics, trl_nll
from .hf_fsdp2 import backward_end as hf_fsdp2_backward_end, block_moment, is_hf_fsdp2, tail_unit
from .states import FP8_SOURCE, ZERO_SOURCE, fsdp2_gathered_block_bytes, model_states
from .megatron_fsdp import with_global_moments
from .pp_buffers import reduce_scatter_pool
from ..spec.choices import FSDP_FRAMEWORKS
from ..spec.training import Recipe, Training
from .backward_moments import BackwardEnd, fsdp2_backward_end
from .moe_moments import ChargedMoments, combine_before_the_loss, moe_moments
from .trainer_backward_end import trainer_backward_end
from .transients import OPTIMIZER_IN_BACKWARD_SOURCE, Transients, transients
from ..spec.dtypes import bytes_per_element
from .workspaces import library_workspaces
from .wgrad_cache import wgrad_cache
from .mtp import mtp_activations, mtp_kind
from .stage_shared import _Shared, stage_communication
from .pp_unbegun import gradients_after_the_loss, made_so_far
from .megatron_softmax_moment import with_checkpointed_forward
from .recompute_moment import recompute_moment, recompute_working_set, recomputed_layer


class _StaticParts(NamedTuple):
    """A stage's components that do not depend on its micro-batches in flight."""

    kept: tuple[Component, ...]  # parameters, master weights, optimizer states, persistent buffers
    grads_forward: Component
    grads_backward: Component
    grads_full: Component
    loss_saved: tuple[Component, ...]
    folded: dict  # phase name -> the folded transient component
    grads_end: Component | None = None  # the gradients at backward's last moments, where not all of them
    loss_saved_backward: tuple[Component, ...] = ()  # the loss's saved tensors at backward's largest moment


class _StaticStage(NamedTuple):
    """The part of a stage that does not depend on its micro-batches in flight: every middle
    stage of a pipeline shares one. The totals are computed at once; the components (formulas,
    sources) are built by `parts` on first read, from the same pieces."""

    totals: tuple[int, int, int]  # forward, backward, step bytes without the activations
    communication: Component  # outside the allocator: NCCL (and DeepEP on MoE stages)
    outside_allocator: int  # communication + CUDA context
    layers: int
    parameters_per_gpu: int  # before ZeRO sharding
    parts: Callable[[], _StaticParts]  # builds them on the first call, then returns them again
    # its model states and transients, a value of the stage memo of its own: what the static part holds of them
    # it reaches through this one object, which the memo counts once (memory._StageMemo)
    step: StepPart
    backward_end: int  # backward's last moments when gradients are created in it (fsdp2), else 0
    # reserved, unused through forward and backward: a pipelined FSDP2 stage's reduce-scatter pool (pp_buffers.py)
    stream_pool: Component | None = None
    # (a block's gathered bytes per parameter, its formula, the parameters' bytes): what the all-gather pool of
    # each of the rank's chunks reads (pp_buffers.all_gather_pool, over the stage's own chunks)
    gathered: tuple[float, str, float] | None = None
    # backward's loss moment less its other moments (a recomputed layer's, or none), as charged: which of them the
    # totals hold (>= 0: the loss's); what a pipelined last rank's replay reads (pp_last_rank.py)
    loss_margin: int = 0

    @property
    def host(self) -> tuple[Component, ...]:
        """Offloaded to host memory (offload.py), paged optimizer states paged out included."""
        return self.step.host

    @property
    def nvme(self) -> tuple[Component, ...]:
        """Offloaded to NVMe."""
        return self.step.place.nvme

    @property
    def managed(self) -> Component | None:
        """Paged optimizer states in managed memory, outside the allocator (paged.py)."""
        return self.step.managed


class StepPart(NamedTuple):
    """A stage's model states where they live and its transients: all its optimizer step reads (`step_floors`
    wants that alone), and what the rest of its static part (`_static_stage`) builds on."""

    inv: object  # what an adapter run trains (adapters.inventory), else None
    ms: object  # the model states (states.ModelStates), less paged ones
    managed: Component | None  # paged optimizer states in managed memory (paged.py)
    paged_host: tuple[Component, ...]
    tr: Transients  # the persistent workspaces included; no optimizer temporaries when the step runs on the host
    place: Placement
    states: int  # on the GPU through every phase: parameters, master weights, optimizer states, FP8 copies, buffers
    grads: int  # the gradients, whole (ZeRO-1's before its reduction)
    outside_allocator: int  # communication + CUDA context + managed memory
    host: tuple[Component, ...]  # offloaded to host memory: the placement's and paged-out optimizer states
    at_step: Component | None  # ZeRO-1's gradients at the step, its partition alone (deepspeed_zero1), else None

    @property
    def step_bytes(self) -> int:
        """The allocated bytes of the optimizer step (`_StaticStage.totals[2]`; the planner's states floor)."""
        grads = self.grads if self.at_step is None else int(round(self.at_step.bytes))
        return self.states + grads + total_bytes(self.tr.optimizer)


class StepShared(NamedTuple):
    """What a step part reads of the part its stages share (`stage_shared._Shared`): none of it reads the
    micro-batch or the loss, which the step part's setup may seal (step_setup.py); the rest of `_Shared` does."""

    communication: Component  # NCCL's buffers
    moe_communication: Component  # ... and DeepEP's, on stages with MoE layers
    runtime: Component  # the CUDA context
    hardware: Hardware
    edge_communication: tuple | None = None  # the first and last stages' where they hold more (stage_shared)


def step_part(arch: Architecture, training: Training, recipe: Recipe, par: Parallel, sp: StageParameters,
              zero: int, shared: StepShared, pieces: dict) -> StepPart:
    """The stage's `StepPart`. `training`: its setup, the fields it does not read sealed (step_setup.py);
    `pieces`: the memo of step parts of that setup (`_workspaces`)."""
    inv = inventory(arch, training, recipe, sp) if training.adapter else None  # what an adapter run trains
    # FSDP1 units holding frozen and trainable weights give the frozen ones gradients too (fsdp1.py)
    frozen_grads = sp.local - sp.root_local if frozen_weights_train(training) else 0.0
    at = (arch, training, recipe, par, sp, zero)
    ms = zero2_partition(adapter_states(inv, training, recipe, par, zero, frozen_grads) if inv else
                         with_global_moments(model_states(sp, training, recipe, par, zero), *at), *at)
    ms, managed, paged_host = _paged_states(ms, arch, training, recipe, par, sp, inv, zero)
    tr = transients(arch, training, recipe, par, sp, zero, inv)
    workspaces = _workspaces(arch, training, par, sp, shared.hardware, pieces)
    tr = tr._replace(persistent=tr.persistent + workspaces)
    partition = _optimizer_partition(sp, par, zero, inv.trainable if inv else None, shard_group(training, par))
    place = placement(training, recipe, {"parameters": ms.parameters, "master_weights": ms.master_weights,
                                         "optimizer_states": ms.optimizer_states, "gradients": ms.gradients},
                      partition, zero)
    on_gpu = place.gpu
    if place.step_on_host:
        tr = tr._replace(optimizer=[])  # the step and its temporaries run on the CPU
    states = (int(round(on_gpu["parameters"])) + int(round(on_gpu["master_weights"]))
              + int(round(on_gpu["optimizer_states"])) + int(round(ms.fp8_weight_copies)) + total_bytes(tr.persistent))
    grads = 0 if training.optimizer_in_backward else int(round(on_gpu["gradients"]))
    moe_stage = any(kind == "moe" for kind, n in sp.kind_counts if n)
    communication = stage_communication(shared, sp.first, sp.last, moe_stage)
    outside = communication.bytes + shared.runtime.bytes + (managed.bytes if managed else 0)
    ds_host = deepspeed_host_buffers(arch, training, recipe, sp, zero, partition, par)  # beside the moved states
    at_step = zero1_step_gradients(arch, training, recipe, sp, par, zero, grads)  # ZeRO-1's partition alone
    return StepPart(inv, ms, managed, paged_host, tr, place, states, grads, outside, place.host + ds_host + paged_host,
                    at_step)


def _static_stage(arch: Architecture, training: Training, recipe: Recipe, par: Parallel, sp: StageParameters,
                  zero: int, m: int, shared: _Shared, pieces: dict, step: StepPart) -> _StaticStage:
    """The stage's `_StaticStage`: its totals at once, its components (`_static_parts`) on first read."""
    tr, states, grads, last = step.tr, step.states, step.grads, sp.last
    loss_saved, loss_forward, loss_backward = shared.loss_components if last else ((), [], [])
    after_loss: tuple = ()  # what of the loss's saved tensors outlives the loss's backward
    if last:
        loss_saved, after_loss = _held_with_the_loss(arch, training, par, m, shared, loss_saved)
        loss_saved += tail_unit(arch, training, recipe, sp, zero)  # the HF Trainer's FSDP2 (hf_fsdp2.py)
    working = recompute_working_set(training, sp, shared)
    moe_stage = any(kind == "moe" for kind, n in sp.kind_counts if n)
    moments = _moe_moments(arch, training, par, sp, pieces)
    charged = _charged_moments(arch, training, recipe, par, sp, m, shared, moments, total_bytes(loss_saved))
    exchange, exchange_backward, in_moe_layer = charged
    # else none before backward (see `_static_parts`); ZeRO-3 keeps a flat buffer of them (deepspeed_step.py)
    grads_live = _grads_live(training, par, m) or keeps_gradient_buffer(training, zero)
    working, extras, by_kind = recompute_moment(arch, training, recipe, par, sp, shared, working, in_moe_layer,
                                                grads_live)
    extras = extras + block_moment(arch, training, recipe, par, sp, zero, step.inv)  # hf_fsdp2's units (hf_fsdp2.py)
    if math_attention(arch, training) and last:  # SDPA's math backend in fp32: its moments (kbit.py)
        (working, extras, by_kind), loss_forward = _with_math_attention(
            arch, training, recipe, sp, shared, (working, extras, by_kind), loss_saved, loss_forward, exchange,
            grads_live)
    loss_forward = _with_trl_metrics(arch, training, par, shared, loss_forward) if last else loss_forward
    loss_forward = with_checkpointed_forward(arch, training, shared.parallel, loss_saved, loss_forward, exchange, tr)
    # after the loss: a recomputed layer, or the largest tensor's compiled step in backward (transients.py)
    recomputed_bytes = max(int(round(working)) + total_bytes(extras), total_bytes(tr.step_after_loss))
    forward_moment = max(total_bytes(loss_forward), total_bytes(exchange), total_bytes(tr.forward_end))
    # a layer is recomputed after the loss's backward, whose node frees the loss's saved tensors as it runs (torch
    # autograd engine: release_variables after apply, without retain_graph); the other moments are charged beside them
    beside_loss = max(total_bytes(loss_backward), total_bytes(exchange_backward), total_bytes(tr.step_in_backward))
    # an interleaved FSDP2 rank's other chunks make their unsharded gradients only after the loss's last backward
    pipelined_fsdp2 = training.framework == "fsdp2" and par.pp > 1
    unbegun = gradients_after_the_loss(training, recipe, par, sp, m) if pipelined_fsdp2 and last else 0.0
    beside_loss -= int(round(unbegun))
    grads_early = grads if grads_live else 0
    largest = step.inv.largest if step.inv else sp.total.largest_tensor
    partitions, pending = deepspeed_in_backward(arch, training, recipe, par, sp, zero, largest, step.grads)
    recomputed_bytes += (grads - grads_early if partitions else 0) + total_bytes(pending)
    recompute_wins = total_bytes(after_loss) + recomputed_bytes > total_bytes(loss_saved) + beside_loss
    saved = total_bytes(loss_saved)
    at_step = step.at_step
    totals = (states + grads_early + saved + forward_moment + total_bytes(tr.forward),
              states + grads_early + total_bytes(tr.backward) + max(saved + beside_loss,
                                                                     total_bytes(after_loss) + recomputed_bytes),
              step.step_bytes)
    end, backward_end = _backward_end(arch, training, recipe, par, sp, zero, shared, step, grads_live, working,
                                      extras, by_kind)
    communication = stage_communication(shared, sp.first, sp.last, moe_stage)
    # the MoE moments as the stage memo holds them (counted once there), unless DSA's replaced one of them
    pair = charged if isinstance(charged, ChargedMoments) else (exchange, exchange_backward)
    parts = once(partial(_static_parts, step, pair, loss_saved, loss_forward,
                         loss_backward, working, grads_live, training,
                         extras + pending if recompute_wins else extras, end,
                         after_loss if recompute_wins else None, 0.0 if recompute_wins else unbegun,
                         partitions and recompute_wins, at_step))
    return _StaticStage(totals, communication, step.outside_allocator, sp.num_layers, int(round(sp.local)), parts,
                        step, backward_end, reduce_scatter_pool(training, par, grads, m),
                        _gathered(training, recipe, par, sp),
                        saved + beside_loss - total_bytes(after_loss) - recomputed_bytes)


def _with_trl_metrics(arch: Architecture, training: Training, par: Parallel, shared: _Shared,
                      loss_forward: list) -> list:
    """The larger of the loss's forward moment and TRL's SFTTrainer's metrics from the kept logits (its nll), a
    moment after it beside the same saved tensors (activations/trl_loss.py)."""
    if not trl_nll(training):
        return loss_forward
    vocab = padded_vocab_size(arch.vocab_size, par.tp, training.framework)
    metrics = [entries_component("transient", "TRL SFTTrainer's metrics from the kept logits",
                                 nll_metrics(arch, training, shared.parallel, vocab), shared.parallel, 1, TRL_SOURCE)]
    return max(loss_forward, metrics, key=total_bytes)


def _held_with_the_loss(arch: Architecture, training: Training, par: Parallel, m: int, shared: _Shared,
                        loss_saved: tuple) -> tuple[tuple, tuple]:
    """The last stage's tensors held from the loss's forward to its backward: the loss's own, then the MTP
    module's, the LM head's autocast copy and the deferred weight-gradient inputs; and what of them outlives the
    loss's backward (the deferred inputs, else nothing)."""
    mtp = mtp_activations(arch, training, shared.parallel, 0.0 if training.recompute == "full" else
                          shared.per_layer.get(mtp_kind(arch), 0.0), total_bytes(loss_saved))
    if mtp:  # held with the loss's tensors, for the micro-batch whose forward just ended (mtp.py)
        loss_saved = loss_saved + (mtp,)
    if under_autocast(training):  # the LM head's autocast copy, from its forward to its backward (kbit.py)
        loss_saved = loss_saved + (autocast_head_copy(arch, training, par,
                                                      padded_vocab_size(arch.vocab_size, par.tp, training.framework)),)
    deferred = deferred_wgrad_microbatches(training, m)
    after_loss: tuple = ()
    if deferred:  # held through the last micro-batch's forward and backward, drained before the step
        after_loss = (entries_component(
            "logits", "Deferred output-layer weight-gradient inputs", shared.deferred_wgrad, shared.parallel,
            deferred, DEFER_WGRAD_SOURCE),)
        loss_saved = loss_saved + after_loss
    return loss_saved, after_loss


def _charged_moments(arch: Architecture, training: Training, recipe: Recipe, par: Parallel, sp: StageParameters,
                     m: int, shared: _Shared, moments: tuple[list, list, list], loss: int) -> ChargedMoments | tuple:
    """The MoE `moments` as the stage charges them beside the loss's saved tensors (`loss` bytes): the forward's net
    of the loss's own where Megatron makes them after it (moe_moments.combine_before_the_loss), then each the larger
    of it and DSA's of the same place (`_with_dsa_moments`)."""
    charged = combine_before_the_loss(training, par, moments, shared.loss_components[0] if sp.last else ())
    if arch.uses_sparse_attention:
        return _with_dsa_moments(arch, training, recipe, par, sp, m, shared, loss, tuple(charged))
    return charged


def _with_dsa_moments(arch: Architecture, training: Training, recipe: Recipe, par: Parallel, sp: StageParameters,
                      m: int, shared: _Shared, loss: int, moments: tuple[list, list, list]) -> tuple[list, list, list]:
    """The MoE `moments` (forward's, backward's, inside a recomputed layer), each the larger of it and DSA's
    in-layer moment of the same place (dsa_moments.py); `loss`: the bytes of the loss's saved tensors."""
    from .dsa_moments import dsa_stage_moments
    exchange, exchange_backward, in_moe_layer = moments
    kinds = [k for k, n in sp.kind_counts if n]
    every = recomputed_layer_count(training, sp.num_layers) == sp.num_layers
    dsa_forward, dsa_backward = dsa_stage_moments(arch, training, par, kinds, loss, every)
    # a recomputed layer runs after the loss's backward freed the loss's tensors, and its DSA moment and its
    # MoE exchange are different moments of it (measured: deepseek-v2-lite-dsa-*-full-*)
    in_layer = dsa_stage_moments(arch, training, par, kinds, 0.0)
    # the gradients made before a layer's DSA backward (HF); with recompute, trainer_backward_end holds the
    # first layer's recomputation, its moments included, beside every later gradient
    if training.framework == "hf" and not _grads_live(training, par, m) \
            and not recomputed_layer_count(training, sp.num_layers):
        from .dsa_hf_moments import FIRST_FORMULA, LAST_FORMULA, end_kinds, gradients_at_moment, with_gradients
        vocab = padded_vocab_size(arch.vocab_size, par.tp, training.framework)
        at_last, at_first = gradients_at_moment(arch, recipe, sp, shared.per_layer, vocab)
        first, last = end_kinds(arch, sp)  # each end's moment net of its own layer's tensors after the core
        dsa_backward = max(
            with_gradients(dsa_stage_moments(arch, training, par, [last], loss)[1], at_last, LAST_FORMULA),
            with_gradients(dsa_stage_moments(arch, training, par, [first], loss)[1], at_first, FIRST_FORMULA),
            key=total_bytes)
    # a recomputed layer's DSA moment (inside its core attention) and its MoE block's (combine, experts'
    # backward) never coexist: the block runs after the attention in forward, before it in backward, each
    # freeing its temporaries as it returns; the layer holds the larger beside its recomputed tensors
    return (max(exchange, dsa_forward, key=total_bytes), max(exchange_backward, dsa_backward, key=total_bytes),
            max(in_moe_layer, *in_layer, key=total_bytes))


def _with_math_attention(arch: Architecture, training: Training, recipe: Recipe, sp: StageParameters,
                         shared: _Shared, recompute: tuple[float, list, bool], loss_saved: tuple, loss_forward: list,
                         exchange: list, grads_live: bool) -> tuple[tuple[float, list, bool], list]:
    """The last stage's `recompute` moment (`recompute_moment`'s) and the loss's forward moment, each replaced by
    its layer's attention on SDPA's math backend (`_math_attention_moment`) where that one is larger. A full
    fine-tune of Falcon under the HF Trainer without recompute holds at the last layer's moment the gradients made
    before it (the head's, the tied embedding's, the layer's own after its core: dsa_hf_moments.py; measured by the
    fake-tensor harness, tests/data/measured/falcon-7b-8layers-*-sdpa-*)."""
    from .activations.sdpa_math import falcon_math_sdpa
    working, extras, _ = recompute
    attention = _math_attention_moment(arch, training, sp, shared, 0, "backward")  # the loss's are freed
    if falcon_math_sdpa(arch, training) and training.framework == "hf" and training.adapter is None \
            and not grads_live and not recomputed_layer_count(training, sp.num_layers):
        from .dsa_hf_moments import LAST_FORMULA, last_layer_gradients, with_gradients
        vocab = padded_vocab_size(arch.vocab_size, shared.parallel.tp, training.framework)
        attention = with_gradients(attention, last_layer_gradients(arch, recipe, sp, vocab), LAST_FORMULA)
    if total_bytes(attention) > int(round(working)) + total_bytes(extras):
        recompute = (0.0, attention, False)
    attention = _math_attention_moment(arch, training, sp, shared, total_bytes(loss_saved), "forward")
    if total_bytes(attention) > max(total_bytes(loss_forward), total_bytes(exchange)):
        loss_forward = attention
    return recompute, loss_forward


def _backward_end(arch: Architecture, training: Training, recipe: Recipe, par: Parallel, sp: StageParameters,
                  zero: int, shared: _Shared, step: StepPart, grads_live: bool, working: float,
                  extras: list[Component], by_kind: bool) -> tuple[BackwardEnd | None, int]:
    """Backward's last moments (FSDP2's, FSDP1 NO_SHARD's, else trainer_backward_end's): their parts (None where
    none is modelled) and their bytes (`_StaticStage.backward_end`; 0 where none is modelled)."""
    states, grads = step.states, step.grads
    # FSDP2 without accumulation creates its gradients in backward: its last moments hold nearly every
    # sharded gradient beside a unit's unsharded parameters and gradients and the first layer being
    # recomputed (measured, tests/data/measured/torchtitan); the activations are gone by then
    late = training.framework in FSDP_FRAMEWORKS and not grads_live and not training.optimizer_in_backward
    end = fsdp2_backward_end(arch, training, recipe, par, sp, zero, grads, working, extras, shared) if late else None
    hf_end = hf_fsdp2_backward_end(arch, training, recipe, par, sp, zero, grads, step.inv) if late else None
    end = BackwardEnd(*hf_end) if hf_end else end  # the HF Trainer's FSDP2 (hf_fsdp2.py)
    no_shard_end = None if late else no_shard_backward_end(training, par, recipe, sp, grads, step.inv)
    end = BackwardEnd(*no_shard_end) if no_shard_end else end  # FSDP1 NO_SHARD's (fsdp1.py)
    end = end or zero1_reduction_end(arch, training, recipe, sp, par, zero, grads)  # DeepSpeed ZeRO-1's reduction
    recomputed = recomputed_layer(arch, training, recipe, par, sp, shared, working, extras, by_kind)
    end = end or zero1_overlap_end(arch, training, recipe, sp, par, zero, grads, recomputed, step.tr.backward)
    if end is None:  # HF's and one-GPU torchtune's: the first layer's recomputation, a tied embedding's sum
        end = trainer_backward_end(arch, training, recipe, par, sp, zero, grads, grads_live, recomputed,
                                   step.tr.backward if training.recompute == "full" else [])
    if end:
        return end, states + int(round(end.gradients)) + total_bytes(end.transients)
    recomputed_bytes = int(round(working)) + total_bytes(extras)
    return end, states + grads + recomputed_bytes + total_bytes(step.tr.backward) if late else 0


def _workspaces(arch: Architecture, training: Training, par: Parallel, sp: StageParameters, hardware: Hardware,
                pieces: dict) -> list[Component]:
    """A step part's persistent workspaces: the libraries' from the first matrix product on (workspaces.py) and
    TransformerEngine's dummy weight gradients from the first backward on (wgrad_cache.py, whose shapes are the
    kinds' and the head's). They read of the stage only which kinds of layer it has and whether it holds the
    head: the step parts of one setup (`pieces`: their memo, memory._step_memo, whose key holds all else they
    read) share them, each a part of its own, which the memo counts once (the step parts hold them directly)."""
    kinds = _kinds(sp)
    library = pieces.get(("workspaces", kinds, sp.last))
    if library is None:  # the cache first: a library part found means the cache was decided too
        cache = wgrad_cache(arch, training, par, sp, padded_vocab_size(arch.vocab_size, par.tp, training.framework))
        if cache:
            pieces[("wgrad cache", kinds, sp.last)] = cache
        library = pieces[("workspaces", kinds, sp.last)] = library_workspaces(training, hardware, "moe" in kinds)
    cache = pieces.get(("wgrad cache", kinds, sp.last))
    return [library] + ([cache] if cache else [])


def _moe_moments(arch: Architecture, training: Training, par: Parallel, sp: StageParameters,
                 pieces: dict) -> tuple[list, list, list]:
    """An MoE layer's moments (moe_moments.py: forward's, backward's, those inside a recomputed layer), which read
    of the stage only whether it has MoE layers: the static parts of one setup (`pieces`: their stage memo,
    memory._stage_memo) share them, and hold this tuple itself, which the memo counts once (`_static_stage`); a
    search builds about ten static parts per memo (the lists are never changed in place)."""
    key = ("moments", _kinds(sp), sp.last)
    known = pieces.get(key)
    if known is None:
        known = pieces[key] = moe_moments(arch, training, par, sp)
    return known


def _kinds(sp: StageParameters) -> tuple[str, ...]:
    return tuple(sorted({kind for kind, n in sp.kind_counts if n}))


def _gathered(training: Training, recipe: Recipe, par: Parallel, sp: StageParameters) -> tuple | None:
    """`_StaticStage.gathered` for a pipelined FSDP2 training stage, else None."""
    if training.framework != "fsdp2" or par.pp == 1 or training.mode != "training":
        return None
    P = bytes_per_element(recipe.param_dtype)
    return (*fsdp2_gathered_block_bytes(training, P, sp), P)


def _paged_states(ms, arch: Architecture, training: Training, recipe: Recipe, par: Parallel, sp: StageParameters,
                  inv, zero: int) -> tuple:
    """A paged optimizer's large states leave the allocator for managed memory (paged.py): the model
    states less them, their component on the GPU and the host memory they need when paged out."""
    from .paged import components as paged_components, is_paged, paged_bytes
    if not is_paged(training):
        return ms, None, ()
    shards = shard_group(training, par) * par.cp if zero >= 1 else 1  # FSDP1 HYBRID_SHARD: its group
    on_gpu, elements = paged_bytes(arch, training, sp, inv, shards)
    managed, host = paged_components(on_gpu, elements, training)
    written = ms.formulas

    def formulas() -> dict[str, str]:
        text = written()
        return {**text, "optimizer_states": text["optimizer_states"] + f", less {on_gpu / 2**30:,.2f} GiB paged to "
                                                                      "managed memory (outside the allocator)"}
    return ms._replace(optimizer_states=ms.optimizer_states - on_gpu, formulas=once(formulas)), managed, (host,)


def _math_attention_moment(arch: Architecture, training: Training, sp: StageParameters, shared: _Shared,
                           loss_saved: float, phase: str) -> list[Component]:
    """The last layer's attention on SDPA's math backend (kbit.py) in `phase`, over the phase's
    activations and the loss's saved tensors."""
    from .activations.sdpa_math import MATH_SOURCE as FALCON_MATH_SOURCE, falcon_math_sdpa
    from .kbit import MATH_SOURCE
    from .kbit_attention import attention_moment
    kind = sp.kind_counts[-1][0]
    recomputed = bool(recomputed_layer_count(training, sp.num_layers))
    moment, formula = attention_moment(arch, ledger_training(training), shared.parallel, kind, recomputed,
                                       shared.full_layer[kind], loss_saved, phase)
    return [component("transient", f"Attention {phase} on SDPA's math backend (fp32 scores)", moment, formula,
                      FALCON_MATH_SOURCE if falcon_math_sdpa(arch, training) else MATH_SOURCE)]


def _grads_live(training: Training, par: Parallel, m: int) -> bool:
    """Gradients live through forward with a persistent buffer (Megatron), accumulation or a pipeline; else
    zero_grad(set_to_none=True) freed them after the last step. FSDP1 and the HF Trainer's FSDP2 accumulate under
    no_sync (fsdp1.py, hf_fsdp2.py); FSDP2 under a pipeline keeps its gradients unsharded until the last micro-batch
    (transients.py)."""
    pipelined_fsdp2 = training.framework == "fsdp2" and par.pp > 1
    no_sync = is_fsdp1(training) or is_hf_fsdp2(training)
    return training.framework == "megatron" or (((m > 1 and not no_sync) or par.pp > 1) and not pipelined_fsdp2)


def _optimizer_partition(sp: StageParameters, par: Parallel, zero: int, trainable: float | None = None,
                         group: int | None = None) -> float:
    """The parameters whose optimizer state one GPU keeps: its stage's (an adapter run's `trainable`
    ones, expert parallelism excluded), divided by the shard group from ZeRO 1 (states.py; `group`: DP, or
    FSDP1 HYBRID_SHARD's shard group)."""
    d = group or par.dp
    if trainable is not None:
        return trainable / (d if zero >= 1 else 1)
    if zero < 1:
        return sp.local
    return sp.dense_local / (d * par.cp) + sp.expert_local / max(1, par.expert_data_parallel)


def _static_parts(step: StepPart, exchange: tuple[list, ...], loss_saved: tuple, loss_forward: list,
                  loss_backward: list, working: float, grads_live: bool, training: Training, extras: list[Component] = (),
                  end: BackwardEnd | None = None, after_loss: tuple | None = None, unbegun: float = 0.0,
                  grads_in_backward: bool = False, at_step: Component | None = None) -> _StaticParts:
    """The components behind `_static_stage`'s totals (the same pieces, with formulas and sources). `after_loss`:
    where backward's largest moment is a recomputed layer, what of the loss's saved tensors it holds; `unbegun`: the
    unsharded gradients not yet made at the loss's moment (`pp_unbegun.gradients_after_the_loss`); `grads_in_backward`: all the
    gradients at backward's largest moment, none in forward (ZeRO-2's partitions); `at_step`: ZeRO-1's at the step."""
    ms, place, tr = step.ms, step.place, step.tr

    def state(key: str, label: str, source: str) -> Component:
        if key in place.moved:
            field = "offload_parameters" if key == "parameters" else "offload_optimizer"
            return component(key, label, 0, f"0: on the {'host' if place.moved[key] == 'cpu' else 'NVMe'} "
                             f"({field} {place.moved[key]})", OFFLOAD_SOURCES[training.framework])
        parts = ()
        if key == "parameters" and ms.vision_parameters:  # a vision-language model's tower, named (spec/vision.py)
            parts = (component(key, "text model", ms.parameters - ms.vision_parameters, "the rest", source),
                     component(key, "vision tower", ms.vision_parameters,
                               "its share of the parameters (patch embedding, blocks, merger or projector)", source))
        return component(key, label, getattr(ms, key), ms.formula(key), source, parts)

    base = (state("parameters", "Parameters", ZERO_SOURCE),
            state("master_weights", "Master weights (fp32)", ZERO_SOURCE),
            state("optimizer_states", "Optimizer states",
                  "; ".join(filter(None, (OPTIMIZERS[training.optimizer].source, ms.optimizer_source)))))
    if ms.fp8_weight_copies:
        base += (component("fp8_weight_copies", "FP8 weight copies", ms.fp8_weight_copies,
                           ms.formula("fp8_weight_copies"), FP8_SOURCE),)
    grads_full = component("gradients", "Gradients", 0, "none kept: each is stepped and freed in backward",
                           OPTIMIZER_IN_BACKWARD_SOURCE) if training.optimizer_in_backward else \
        state("gradients", "Gradients", gradients_source(training, ZERO_SOURCE))
    # zero_grad(set_to_none=True) frees them after each step; backward's peak is its first moment
    # (the loss's gradients beside every activation), before any gradient exists, and its end (every
    # gradient, activations gone) is the optimizer phase without its temporaries.
    grads_early = grads_full if grads_live else component(
        "gradients", "Gradients", 0, "none yet: set to None after the last step",
        "torch.optim.Optimizer.zero_grad(set_to_none=True)")
    label = ("One layer's activations copied back from the host" if training.offload_activations
             and training.recompute == "none" else "One recomputed layer's activations")
    recomputed = ([component("transient", label, working, "per-layer ledger of one layer", KORTHIKANTI)]
                  if working else []) + list(extras)  # a block's backward beyond its saved tensors (torchtitan)
    after = recomputed if total_bytes(recomputed) >= total_bytes(tr.step_after_loss) else list(tr.step_after_loss)

    def largest(*moments: list[Component]) -> list[Component]:  # the first of the largest, as the totals
        return max(moments, key=total_bytes)

    backward = [made_so_far(c, unbegun) for c in tr.backward] if unbegun else tr.backward
    folded = {"forward": fold(largest(loss_forward, exchange[0], tr.forward_end) + tr.forward),
              "backward": fold((after if after_loss is not None else
                                largest(loss_backward, exchange[1], tr.step_in_backward)) + backward),
              "backward_end": fold(end.transients if end else recomputed + tr.backward),
              "optimizer": fold(tr.optimizer)}
    grads_end = None
    if end and end.gradients_formula:
        grads_end = component("gradients", end.gradients_label, end.gradients, end.gradients_formula,
                              end.gradients_source)
    return _StaticParts(base + tuple(tr.persistent), grads_early, grads_full if grads_in_backward else grads_early,
                        at_step or grads_full, loss_saved, folded,
                        grads_end, loss_saved if after_loss is None else after_loss)
