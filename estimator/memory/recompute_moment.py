"""Backward's recompute moment: what one layer rematerialised in backward holds (its working set, one layer at a
time) and the moments beside it (a recomputed MoE layer's, the softmax backward's, torch's ring attention's, the
block method's freed later layers), and the recomputed layer by kind for backward's last moments
(trainer_backward_end). Read by static_stage.py.
"""

from __future__ import annotations

from .activations.entries import KORTHIKANTI
from .activations.recompute import op_level, recomputed_layer_count
from ..spec.architecture import Architecture
from .backward_moments import block_backward_extras
from .components import Component, component, total_bytes
from .cp_ring import ring_backward_moment
from ..spec.dtypes import bytes_per_element
from .fsdp1 import is_fsdp1, softmax_moment_parts as fsdp1_softmax_parts
from .mamba_torch_moment import ssm_torch_backward_moment
from .megatron_softmax_moment import recomputed_softmax_moment, selective_core_softmax_moment
from ..spec.parallel import Parallel
from .sharding import StageParameters, chunk_kind_counts, padded_vocab_size
from .softmax_backward import softmax_backward_moment, softmax_backward_temporary
from .stage_shared import _Shared
from ..spec.training import Recipe, Training


def recompute_working_set(training: Training, sp: StageParameters, shared: _Shared,
                          kinds: tuple[str, ...] | None = None) -> float:
    """What one layer rematerialises in backward, one layer at a time: all it keeps without
    recompute under full recompute, the tensors the policy recomputes under torchtitan's
    operator-level checkpointing; nothing else. The largest of the stage's kinds, or of `kinds`."""
    kinds = kinds if kinds is not None else tuple(k for k, _ in sp.kind_counts)
    if recomputed_layer_count(training, sp.num_layers):
        # with offloaded activations the layer's input comes back from the host beside it
        reload = shared.kept_input if training.offload_activations else 0.0
        return max((shared.full_layer[k] for k in kinds), default=0.0) + reload
    if training.offload_activations:  # one layer's saved tensors copied back for its backward
        return max((shared.full_layer[k] for k in kinds), default=0.0)
    if op_level(training):
        return max((shared.full_layer[k] - shared.per_layer[k] for k in kinds), default=0.0)
    return 0.0


def recompute_moment(arch: Architecture, training: Training, recipe: Recipe, par: Parallel, sp: StageParameters,
                     shared: _Shared, working: float, in_moe_layer: list,
                     grads_live: bool) -> tuple[float, list, bool]:
    """Backward's recompute moment: (the recomputed layer's working set, the components beside it, whether it is
    the layer's kind's own: a ring attention moment that outgrows it replaces it)."""
    # Moments inside a phase that never coexist: the loss's working set, a layer being recomputed
    # (after the loss's backward, one at a time), an MoE layer's all-to-all exchange (inside a
    # layer) and a parameter's step when the optimizer runs in backward. Each phase takes the
    # largest of its moments.
    extras = block_backward_extras(arch, training, recipe, par, sp)  # beside the recomputed layer (torchtitan)
    counted = recomputed_layer_count(training, sp.num_layers)
    freed = freed_before_recompute(arch, training, sp, shared) if working and counted else []
    if working and counted:  # a recomputed MoE layer's own moments
        extras = list(extras) + list(in_moe_layer) + freed \
            + (softmax_backward_moment(arch, training, par, recomputed=True, stage=sp)
               or softmax_backward_temporary(arch, training, par, [k for k, n in sp.kind_counts if n])) \
            + ssm_torch_backward_moment(arch, training, par)
    elif not counted:  # no layer recomputed: its in-layer moment (FSDP1's held gradients and units beside it)
        moment = softmax_backward_moment(arch, training, par,
                                         *_made_before_last_attention(arch, training, recipe, par, sp, grads_live),
                                         stage=sp)
        held = fsdp1_softmax_parts(arch, training, par, recipe, sp) if moment and is_fsdp1(training) \
            and not grads_live and sp.last else []
        extras = list(extras) + moment + held \
            + selective_core_softmax_moment(arch, training, par, arch.layer_kind(sp.chunks[-1].stop - 1)) \
            + ssm_torch_backward_moment(arch, training, par)
    ring = ring_backward_moment(arch, training, par) if working else []  # torch's ring attention (cp_ring.py)
    if ring and total_bytes(ring) > int(round(working)) + total_bytes(extras):
        return 0.0, ring, False
    # Megatron's unfused attention: the recomputed layer's softmax moment, before its MLP's tensors exist, beside
    # the later layers' freed activations (block method) but not the MoE moments (megatron_softmax_moment.py)
    softmax = recomputed_softmax_moment(arch, training, shared.parallel) if working and counted else None
    if softmax:
        moment = [softmax] + freed
        if total_bytes(moment) > int(round(working)) + total_bytes(extras):
            return 0.0, moment, False
    return working, extras, True


def _made_before_last_attention(arch: Architecture, training: Training, recipe: Recipe, par: Parallel,
                                sp: StageParameters, grads_live: bool) -> tuple[float, float]:
    """(the gradients an HF full fine-tune has made when the last layer's attention backward runs, none before
    backward: zero_grad(set_to_none=True); the autocast copies of the same weights, freed by their matmuls'
    backward, under autocast: the norms' few elements, never cast, counted). (0, 0) where the gradients are
    counted already (`grads_live`), under an adapter (the base's weights get none; the adapters' few are left
    out) and under the other frameworks (their own gradient buffers and shards)."""
    if training.framework != "hf" or grads_live or training.adapter or not sp.last:
        return 0.0, 0.0
    from .dsa_hf_moments import last_layer_gradients
    grads = last_layer_gradients(arch, recipe, sp, padded_vocab_size(arch.vocab_size, par.tp, training.framework))
    copies = grads / bytes_per_element(recipe.grad_dtype) * bytes_per_element(recipe.compute_dtype)
    return grads, copies if recipe.autocast_weight_copies else 0.0


def freed_before_recompute(arch: Architecture, training: Training, sp: StageParameters,
                           shared: _Shared) -> list[Component]:
    """Megatron's block method checkpoints a stage's first n layers (transformer_block.py _checkpointed_forward,
    Megatron-Core 0.16.1: `layer_idx < recompute_num_layers`); backward reaches them only after the later layers'
    backward freed what those keep, so the micro-batch being recomputed holds its layer inputs alone then: a
    negative part of the recompute moment (measured: deepseek-v2-lite-dsa-*-full-block1). One chunk per rank
    only (with virtual chunks, another chunk's layers of that micro-batch may still wait for their backward)."""
    n = recomputed_layer_count(training, sp.num_layers)
    if training.framework != "megatron" or training.recompute_layers is None or n >= sp.num_layers \
            or len(sp.chunks) != 1:
        return []
    stored = [(kind, count) for kind, count in chunk_kind_counts(arch, sp.chunks, skip=n) if count]
    freed = sum(shared.per_layer[kind] * count for kind, count in stored)
    layers = " + ".join(f"{shared.per_layer[k] / 2**20:,.1f} MiB x {c} {k} layers" for k, c in stored)
    return [component("transient", "The later layers' activations, freed before the first n are recomputed", -freed,
                      f"-({layers}) of the micro-batch being recomputed",
                      "Megatron-Core 0.16.1 transformer/transformer_block.py _checkpointed_forward (block)")]


def recomputed_layer(arch: Architecture, training: Training, recipe: Recipe, par: Parallel, sp: StageParameters,
                     shared: _Shared, working: float, extras: list[Component], by_kind: bool):
    """A recomputed layer's working set and extras by its kind, for trainer_backward_end (None: none is
    recomputed). `by_kind`: the working set is the layer's own (else a moment that replaced it, ring or
    math attention, stands for every kind); the in-layer moments a kind has (DSA's) are its own."""
    if not (working or extras):
        return None

    def layer(kind: str) -> list[Component]:
        size, more = working, list(extras)
        if by_kind:
            size = recompute_working_set(training, sp, shared, (kind,))
            more = list(block_backward_extras(arch, training, recipe, par, sp))
            more += (softmax_backward_moment(arch, training, par, recomputed=True, kinds=(kind,))
                     or softmax_backward_temporary(arch, training, par, [kind])) if recomputed_layer_count(
                training, sp.num_layers) else []
            if arch.uses_sparse_attention and recomputed_layer_count(training, sp.num_layers):
                from .dsa_moments import dsa_stage_moments
                more += max(*dsa_stage_moments(arch, training, par, [kind], 0.0), key=total_bytes)
        return ([component("transient", "One recomputed layer's activations", size, "per-layer ledger of one layer",
                           KORTHIKANTI)] if size else []) + more
    return layer
