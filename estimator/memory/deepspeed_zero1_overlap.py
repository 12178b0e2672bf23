"""DeepSpeed ZeRO-1 with overlap_comm on: its gradients in backward and at its end, from DeepSpeed v0.19.5's source
(runtime/zero/stage_1_and_2.py, runtime/engine.py; v0.12.3 reads the same: hooks made only `if
self.partition_gradients or self.overlap_comm`, reduce_ready_partitions_and_remove_grads at the boundary, the same
reduce_ipg_grads and epilogue). contiguous_gradients on (DeepSpeed's default).

- With overlap_comm each gradient's hook reduces (process_gradients l. 1737), for ZeRO-1 only at the accumulation
  boundary (reduce_ready_partitions_and_remove_grads l. 1742): earlier micro-batches accumulate whole 16-bit
  gradients in .grad (the engine's allreduce_gradients reduces ZeRO-1 at the boundary alone, engine.py l. 2862).
- At the boundary each hook copies the gradient into the current one of the two reduce buckets (setup_buckets
  l. 2476-2488: two of reduce_bucket_size with overlap_comm) and points its storage there, the whole freed
  (l. 1208-1212); a gradient over reduce_bucket_size is not copied: it is reduced where it is at the next hook
  (extra_large_param_to_reduce, l. 1203, reduce_ipg_grads l. 1680-1690).
- After each reduction ZeRO-1 copies the gradients of this rank's partition into `grads_in_partition` (the whole of
  every tensor overlapping the partition, torch.empty at the first copy, copy_grads_in_partition l. 1651) and leaves
  the others (reduce_ipg_grads l. 1722-1724: `else:  # zero stage 1`, no clear_grad_attribute): another rank's
  gradient is a view of a bucket, but one over the bucket stays whole, its own storage, until the epilogue's
  _clear_param_grad_only (l. 2017) drops every .grad. Under offload_optimizer the partition's gradients go to the
  host slice by slice instead (l. 1561 fp64 norm, l. 1578 freed).
- So at the end of backward a rank holds its partition and every extra-large gradient of the other ranks; early in
  backward, at the head's reduction, the partition is allocated beside the head's whole gradient (deepspeed_step's
  ZeRO-2 moment, with ZeRO-1's partition). The step holds `grads_in_partition` alone (deepspeed_zero1.step_gradients).
Not modelled (the old rule, every gradient whole to the step, stays): offload_optimizer with more than one micro-batch
a step (accumulated_grads_in_cpu through the GPU staging buffer).
"""

from __future__ import annotations

from itertools import accumulate

from .backward_moments import BackwardEnd
from . import deepspeed_noncontiguous as noncontiguous
from .components import Component, component
from .deepspeed_accumulation import second_partition
from .deepspeed_offload import largest_overlap, largest_slice, partition_windows
from .deepspeed_step import deepspeed_settings, zero2_backward
from .deepspeed_zero1 import busiest_whole, layout, modelled
from .deepspeed_zero2 import pieces_made_last
from .pipeline import microbatches
from .transients import ZERO12_BUCKET_SOURCE
from .sharding import StageParameters
from ..spec.architecture import Architecture
from ..spec.dtypes import bytes_per_element
from ..spec.parallel import Parallel
from ..spec.training import Recipe, Training

SOURCE = ("DeepSpeed v0.19.5 runtime/zero/stage_1_and_2.py process_gradients (l. 1737), "
          "reduce_ready_partitions_and_remove_grads (l. 1742: ZeRO-1 at the boundary), setup_buckets (l. 2476-2488), "
          "reduce_independent_p_g_buckets_and_remove_grads (l. 1203 extra_large_param_to_reduce, l. 1208-1212), "
          "reduce_ipg_grads (l. 1722-1724: ZeRO-1 copies its partition's, leaves the rest), copy_grads_in_partition "
          "(l. 1651), independent_gradient_partition_epilogue (l. 2017 _clear_param_grad_only); engine.py "
          "allreduce_gradients (l. 2862); v0.12.3 the same (stage_1_and_2.py l. 491, 1328, 1306-1320)")


def overlaps(arch: Architecture, training: Training, par: Parallel, zero: int) -> bool:
    """ZeRO-1 reducing in backward's hooks: deepspeed_zero1's setting (dense, no pipeline, each rank's
    tensor-parallel shards) with overlap_comm on; under offload_optimizer one micro-batch a step (`modelled`)."""
    return modelled(arch, training, par, zero) and deepspeed_settings(arch, training, zero).overlap_comm


def kept_elements(sizes: tuple, d: int, bucket: float, made_from: int = 0, own: bool = True,
                  groups: tuple | None = None) -> float:
    """The most gradient elements one of `d` ranks holds once the tensors from index `made_from` on were reduced:
    the whole of every tensor overlapping its partition of each group (`groups`, tuples of indices into `sizes`; one
    group of them all by default) (`grads_in_partition`; none with `own` False, offload) and every tensor over
    `bucket` from `made_from` on that does not (left whole until the epilogue)."""
    per_rank = [0.0] * d
    for group in groups or (tuple(range(len(sizes))),):
        large = [sizes[i] if i >= made_from and sizes[i] > bucket else 0.0 for i in group]
        large_sums = [0.0] + list(accumulate(large))
        for r, (first, last, touched) in enumerate(partition_windows(tuple(sizes[i] for i in group), d)):
            others = large_sums[-1] - (large_sums[last] - large_sums[first] if last > first else 0.0)
            per_rank[r] += (touched if own else 0.0) + others
    return max(per_rank)


def _made_last(arch: Architecture, training: Training, recipe: Recipe, sp: StageParameters) -> int:
    """How many trainable tensors, first in module order, backward makes at or after the first layer's: the
    embedding's and the first layer's."""
    from .deepspeed_offload import _Cfg
    from .reserved_tensors import tensors

    key = ("deepspeed made last", sp.layer_indices, sp.first, sp.last, training.adapter, recipe)

    def count() -> int:
        w = tensors(_Cfg(arch, training, recipe), sp)
        return sum(1 for t in w.embedding + (w.layers[0] if w.layers else []) if t.grad)
    return arch.cached(key, count)


def _layout(arch: Architecture, training: Training, recipe: Recipe, sp: StageParameters, par: Parallel, zero: int,
            grads: float) -> tuple | None:
    """deepspeed_zero1.layout (the tensors and the groups) where `overlaps`; else None."""
    return layout(arch, training, recipe, sp, par, zero, grads, overlaps)


def in_backward(arch: Architecture, training: Training, recipe: Recipe, sp: StageParameters, par: Parallel,
                zero: int, grads: float) -> list[Component]:
    """Backward's moment after the loss's (a recomputed layer): the busiest rank's `grads_in_partition`, allocated
    at the head's reduction, beside the head's whole gradient where it is over the bucket (with more micro-batches
    it is among the accumulated gradients, counted already); under offload the fp64 copy of the rank's slice of it
    instead of the partition. [] where `overlaps` does not apply."""
    found = _layout(arch, training, recipe, sp, par, zero, grads)
    if found is None:
        return []
    sizes = found[0]
    d, G, m = par.dp, bytes_per_element(recipe.grad_dtype), microbatches(training, par)
    bucket = deepspeed_settings(arch, training, zero).reduce_bucket_size
    offloaded = training.offload_optimizer != "none"
    out = []
    if not offloaded:
        whole = busiest_whole(arch, sp, par, found)
        out.append(component("transient", "Gradient partition (grads_in_partition, allocated at the first reduction)",
                             G * whole, f"{G:g} B x {whole:,.0f} elements: the whole of every tensor overlapping the "
                             "busiest GPU's partition of each parameter group", SOURCE))
    largest = max(sizes)
    if largest > bucket and m == 1:
        out.append(component("transient", "The largest tensor's gradient, whole until the next gradient's hook",
                             G * largest, f"{G:g} B x {largest:,.0f} elements (over reduce_bucket_size {bucket:,})",
                             SOURCE))
        if offloaded:
            part = largest_overlap(sizes, d)
            out.append(component("transient", "fp64 copy of this GPU's slice of it (its norm, offload_optimizer)",
                                 8 * part, f"8 B x {part:,.0f} elements of it in this GPU's partition", SOURCE))
    return out


def overlap_end(arch: Architecture, training: Training, recipe: Recipe, sp: StageParameters, par: Parallel,
                zero: int, grads: float, recomputed, backward: list[Component]) -> BackwardEnd | None:
    """Backward's last moments: the larger of the first layer's recomputation (`recomputed`: a kind's working set,
    None without recompute) and the epilogue. The gradients then: the busiest rank's partition and the other ranks'
    extra-large gradients already made (the embedding's and the first layer's come after the recomputation; with
    more micro-batches those are whole already, all of them). Under offload no partition on the GPU."""
    found = _layout(arch, training, recipe, sp, par, zero, grads)
    if found is None:
        return None
    sizes, groups = found
    d, G, m = par.dp, bytes_per_element(recipe.grad_dtype), microbatches(training, par)
    bucket = deepspeed_settings(arch, training, zero).reduce_bucket_size
    own = training.offload_optimizer == "none"  # offloaded, the partition's gradients are on the host
    at_epilogue = kept_elements(sizes, d, bucket, own=own, groups=groups)
    buckets = [c for c in backward if c.bytes and c.source.startswith(ZERO12_BUCKET_SOURCE)]
    # backward's other transients as trainer_backward_end counts them: one layer's autocast copies under full
    # recompute, else none at the end (the whole model's were for the layers' saved inputs)
    beside = [c for c in backward if c.bytes] if training.recompute == "full" else buckets
    moments = [(at_epilogue, buckets, "at the epilogue")]
    if recomputed is not None and sp.layer_indices:
        # the layout's tensors: the Trainer's pieces for full fine-tuning on the GPU, else the trainable tensors
        trainer = own and training.adapter is None
        last = pieces_made_last(arch, sp, par) if trainer else _made_last(arch, training, recipe, sp)
        kept = kept_elements(sizes, d, bucket, last, own, groups) + (sum(sizes[:last]) if m > 1 else 0.0)
        kind = arch.layer_kinds()[sp.layer_indices[0]]
        moments.append((kept, list(recomputed(kind)) + beside,
                        "at the first layer's recomputation"))
    n, transients, when = max(moments, key=lambda mo: G * mo[0] + sum(c.bytes for c in mo[1]))
    formula = (f"{G:g} B x {n:,.0f} elements {when}: the whole of every tensor overlapping the busiest GPU's "
               f"partition and the other ranks' tensors over reduce_bucket_size {bucket:,}, left whole"
               + (" (the embedding's and the first layer's accumulated, not reduced yet)" if m > 1 and
                  when != "at the epilogue" else ""))
    return BackwardEnd(G * n, formula, transients, "Gradients (reduced in backward's hooks, overlap_comm)", SOURCE)


def deepspeed_in_backward(arch: Architecture, training: Training, recipe: Recipe, par: Parallel, sp: StageParameters,
                          zero: int, largest: float, grads: float) -> tuple[bool, list[Component]]:
    """DeepSpeed's gradients a few layers into backward: whether ZeRO-2's partitions exist then, and what is held
    beside them (the head's whole gradient, `largest` elements; from the second micro-batch on a second partition,
    deepspeed_accumulation), or ZeRO-1's with overlap_comm (`in_backward`)."""
    if noncontiguous.modelled(training, par, zero):  # no bucket copies: the other ranks' .grad held instead
        partitions, pending = True, noncontiguous.pending(arch, training, recipe, sp, par, zero)
    else:
        partitions, pending = zero2_backward(arch, training, zero, largest, bytes_per_element(recipe.grad_dtype),
                                             largest_slice(arch, training, recipe, sp, zero, par))
    return partitions, (pending + second_partition(training, par, zero, partitions, grads)
                        + in_backward(arch, training, recipe, sp, par, zero, grads))
