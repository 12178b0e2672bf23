"""DeepSpeed ZeRO-1's gradients from the end of backward to the step, from DeepSpeed v0.19.5's source
(runtime/zero/stage_1_and_2.py, runtime/engine.py), with overlap_comm off (ZeRO-1's default) and contiguous_gradients
on (DeepSpeed's default, forced under offload_optimizer: stage_1_and_2.py l. 259).

- In backward each hook only allocates the reduce bucket (process_gradients l. 1731: no reduction without
  partition_gradients or overlap_comm, l. 1737): every parameter's 16-bit gradient is whole, G x N.
- After autograd (engine.py allreduce_gradients l. 2862-2865, at the accumulation boundary) reduce_gradients
  (l. 853) walks the parameters in group order: each gradient is copied into the bucket and its storage replaced
  by a view of it (reduce_independent_p_g_buckets_and_remove_grads l. 1208-1212), one over reduce_bucket_size kept
  whole until the next reduction (l. 1203). At each reduction reduce_ipg_grads (l. 1726-1727) copies this rank's
  partition's gradients out with copy_grads_in_partition: without offload into `grads_in_partition`, one buffer of
  the whole of every parameter overlapping the partition, allocated at the first (l. 1651); with offload each
  slice is taken in fp64 for its norm (l. 1561), then in fp32 for the host (l. 1575), and the gradient freed
  (l. 1578). Rank 0's partition starts with the first parameter: its first reduction comes while every other
  gradient is still whole.
- The epilogue (l. 898) keeps views of the partition's gradients (averaged_gradients, l. 925) and drops every
  parameter's `.grad` (_clear_param_grad_only, l. 2017): the step holds `grads_in_partition` alone (the other
  ranks' gradients, views of the bucket or whole, are freed), and with offload no gradient on the GPU.
The partitions: each optimizer group's flat tensor padded to a multiple of 2 x dp and cut in dp shares, the whole of
every tensor overlapping a share in the rank's params_in_partition (deepspeed_offload.partition_windows), the groups
the HF Trainer's two as for ZeRO-2 (deepspeed_zero2.trainer_pieces; under offload_optimizer one group): measured
per rank on DeepSpeed 0.19.5 over 2 and 4 gloo ranks (tests/data/measured/deepspeed_partitions/).
With overlap_comm on the hooks reduce in backward instead: deepspeed_zero1_overlap.py; the step is the same.
"""

from __future__ import annotations

from .backward_moments import BackwardEnd
from .components import Component, component
from .deepspeed_offload import partition_share, rank_overlaps, trainable_sizes
from .deepspeed_step import deepspeed_settings
from .deepspeed_zero2 import busiest_rank, trainer_pieces
from .pipeline import microbatches
from .sharding import StageParameters
from ..spec.architecture import Architecture
from ..spec.dtypes import bytes_per_element
from ..spec.parallel import Parallel
from ..spec.training import Recipe, Training

SOURCE = ("DeepSpeed v0.19.5 runtime/zero/stage_1_and_2.py process_gradients (l. 1737), reduce_gradients (l. 853), "
          "reduce_independent_p_g_buckets_and_remove_grads (l. 1203, 1208-1212), reduce_ipg_grads (l. 1726-1727), "
          "copy_grads_in_partition (l. 1651; cpu_offload: l. 1561 fp64 norm, l. 1575 fp32 cast, l. 1578 freed), "
          "independent_gradient_partition_epilogue (l. 925 averaged_gradients, l. 2017 _clear_param_grad_only); "
          "runtime/engine.py allreduce_gradients (l. 2862-2865)")


def applies(arch: Architecture, training: Training, par: Parallel, zero: int) -> bool:
    """ZeRO-1 reducing after backward: `zero1_dense` with overlap_comm off (on: deepspeed_zero1_overlap.py)."""
    return zero1_dense(arch, training, par, zero) and not deepspeed_settings(arch, training, zero).overlap_comm


def modelled(arch: Architecture, training: Training, par: Parallel, zero: int) -> bool:
    """ZeRO-1 whose gradients this module and deepspeed_zero1_overlap.py count: `zero1_dense`, with overlap_comm
    off, or on without offload_optimizer or with one micro-batch a step (offload accumulating micro-batches with
    overlap_comm goes through the host and the GPU staging buffer: not modelled, every gradient counted whole)."""
    overlap = deepspeed_settings(arch, training, zero).overlap_comm
    return zero1_dense(arch, training, par, zero) and (
        not overlap or training.offload_optimizer == "none" or microbatches(training, par) == 1)


def zero1_dense(arch: Architecture, training: Training, par: Parallel, zero: int) -> bool:
    """ZeRO-1 whose partitions this module counts: DeepSpeed, stage 1, no pipeline (DeepSpeed's pipeline
    engine makes its own bucket, l. 845), no context parallelism (its ZeRO group would be DP x SP), no expert
    parallelism. Under tensor parallelism each rank flattens its own shards (`trainable_sizes` with `par`) and ZeRO
    partitions them over the data-parallel ranks alone (engine.py l. 1798 seq_data_parallel_group, utils/groups.py
    _get_data_parallel_group: the TP mesh's data_parallel dimension or the mpu's group); a dense model only: an MoE
    model under TP keeps every gradient whole, as under EP with TP (`expert_groups` is counted without TP), so more
    EP never raises its states. An MoE model without EP (or TP) is
    counted as a dense one: the engine finds no MoE layer in a transformers model (engine.py l. 1735-1739:
    has_moe_layers only for deepspeed.moe's MoE or AutoEP's layer), so its experts (transformers' fused 3-D
    tensors) are ordinary parameters of the Trainer's groups, partitioned over every data-parallel rank with the
    rest. With EP DeepSpeed's expert groups are partitioned over the expert-data-parallel group (moe/utils.py
    split_params_into_different_moe_groups_for_optimizer, stage_1_and_2.py _configure_moe_settings): the step's
    gradients are `expert_groups`'; backward keeps every gradient whole to the reduction."""
    return (training.framework == "deepspeed" and zero == 1 and par.pp == par.cp == par.ep == 1
            and (par.tp == 1 or not arch.is_moe))


def layout(arch: Architecture, training: Training, recipe: Recipe, sp: StageParameters, par: Parallel, zero: int,
           grads: float, rule=applies) -> tuple[tuple, tuple] | None:
    """(the stage's trainable tensors in module order, the optimizer's groups as tuples of their indices) where
    `rule` applies and they make up this GPU's gradients (`grads`); else None (a vision-language model's tower is not
    among them: its gradients stay counted whole, as before the reduction). The groups: the HF Trainer's two
    (deepspeed_zero2.trainer_pieces: weight decay, then the rest, each partitioned on its own, stage_1_and_2.py
    __init__ l. 371-520 for every stage); under offload_optimizer DeepSpeed's own optimizer's one group
    (deepspeed_offload.py), and for an adapter run one group of its trainable tensors."""
    if not rule(arch, training, par, zero) or not grads:
        return None
    if training.offload_optimizer != "none" or training.adapter is not None:
        # an adapter run's trainable tensors are its adapters' matrices: the Trainer's no-decay group is empty and
        # DeepSpeed drops it (engine.py _configure_optimizer l. 2002): one group, as measured
        sizes = trainable_sizes(arch, training, recipe, sp, par)
        groups = (tuple(range(len(sizes))),)
    else:
        pieces = trainer_pieces(arch, sp, par)
        sizes = tuple(n for n, _ in pieces)
        groups = tuple(tuple(i for i, (_, decay) in enumerate(pieces) if decay is want) for want in (True, False))
    return (sizes, groups) if abs(bytes_per_element(recipe.grad_dtype) * sum(sizes) - grads) < 1 else None


def group_sizes(sizes: tuple, groups: tuple) -> tuple[tuple, ...]:
    """Each group's tensors' elements, in group order."""
    return tuple(tuple(sizes[i] for i in g) for g in groups)


def _first_reduction(sizes: tuple, share: float, bucket: int) -> tuple[float, float]:
    """Rank 0's first reduction: (the elements of the gradients already turned into bucket views, the most
    elements of one of them in rank 0's share `share`). A first tensor over the bucket is reduced alone, whole."""
    if not sizes:
        return 0.0, 0.0
    if sizes[0] > bucket:
        return 0.0, min(sizes[0], share)
    moved, start, largest = 0.0, 0.0, 0.0
    for n in sizes:
        if moved + n > bucket:
            break
        largest = max(largest, max(0.0, min(start + n, share) - start))
        moved, start = moved + n, start + n
    return moved, largest


def reduction_end(arch: Architecture, training: Training, recipe: Recipe, sp: StageParameters, par: Parallel,
                  zero: int, grads: float) -> BackwardEnd | None:
    """Backward's last moment under ZeRO-1: rank 0's first reduction after autograd, every gradient (`grads`) but
    those already in the bucket, beside the bucket and either `grads_in_partition` (allocated then) or, under
    offload, the fp64 copy of the reduced gradient's slice for its norm. None where `applies` does not."""
    found = layout(arch, training, recipe, sp, par, zero, grads)
    if found is None:
        return None
    sizes, groups = found
    d, P, G = par.dp, bytes_per_element(recipe.param_dtype), bytes_per_element(recipe.grad_dtype)
    bucket = deepspeed_settings(arch, training, zero).reduce_bucket_size
    per_group = group_sizes(sizes, groups)
    # reduce_gradients walks the groups in order (l. 854-858); rank 0's share of the first group
    moved, slice_ = _first_reduction(sum(per_group, ()), partition_share(per_group[0], d), bucket)
    kept = [component("transient", "Gradient reduction bucket", bucket * P,
                      f"reduce_bucket_size {bucket:,} x {P:g} B", SOURCE)]
    if training.offload_optimizer != "none":
        kept.append(component("transient", "fp64 copy of a reduced gradient's slice (its norm, offload_optimizer)",
                              8 * slice_, f"8 B x {slice_:,.0f} elements in rank 0's partition", SOURCE))
    else:
        first = sum(rank_overlaps(g, d)[0] for g in per_group)
        kept.append(component("transient", "Gradient partition (grads_in_partition, allocated at the first reduction)",
                              G * first, f"{G:g} B x {first:,.0f} elements: the whole of every tensor overlapping "
                              f"rank 0's partition of each of the {len(groups)} parameter group(s)", SOURCE))
    return BackwardEnd(grads - G * moved, f"{G:g} B x the stage's parameters" + (
        f" - {moved:,.0f} already in the bucket" if moved else ""), kept,
        "Gradients (whole, being reduced after backward)", SOURCE)


def step_gradients(arch: Architecture, training: Training, recipe: Recipe, sp: StageParameters, par: Parallel,
                   zero: int, grads: float) -> Component | None:
    """ZeRO-1's gradients at the step: `grads_in_partition`, the whole of every tensor overlapping the busiest
    rank's partition, or none on the GPU under offload, whether the reduction ran after backward or in its hooks
    (overlap_comm: the epilogue drops every .grad all the same). None where neither is modelled."""
    if expert_groups(arch, training, par, zero):
        return _expert_group_gradients(arch, training, recipe, sp, par, grads)
    found = layout(arch, training, recipe, sp, par, zero, grads, modelled)
    if found is None:
        return None
    if training.offload_optimizer != "none":
        return component("gradients", "Gradients", 0, "0: each slice copied to the host in the reduction, the "
                         "GPU's freed (offload_optimizer)", SOURCE)
    G = bytes_per_element(recipe.grad_dtype)
    whole = busiest_whole(arch, sp, par, found)
    return component("gradients", "Gradients", G * whole, f"{G:g} B x {whole:,.0f} elements: the whole of every "
                     f"tensor overlapping the busiest GPU's partition of each of the {len(found[1])} parameter "
                     "group(s) (grads_in_partition)", SOURCE)


def busiest_whole(arch: Architecture, sp: StageParameters, par: Parallel, found: tuple) -> float:
    """The busiest rank's `grads_in_partition` (deepspeed_zero2.busiest_rank over `layout`'s groups)."""
    sizes, groups = found
    key = ("zero1 busiest", sp.layer_indices, sp.first, sp.last, par.tp, par.dp, groups, sizes)
    return arch.cached(key, lambda: busiest_rank(group_sizes(sizes, groups), par.dp))


EXPERT_SOURCE = ("DeepSpeed v0.19.5 runtime/engine.py (l. 1735-1739 has_moe_layers; l. 2189-2190 "
                 "split_params_into_different_moe_groups_for_optimizer: the expert parameters in groups of their own), "
                 "runtime/zero/stage_1_and_2.py _configure_moe_settings (real_dp_process_group of an expert group: the "
                 "expert-data-parallel group), copy_grads_in_partition (l. 1651: grads_in_partition sums every group's "
                 "params_in_partition); v0.12.3 the same but for the split, left to the caller "
                 "(moe/utils.py split_params_into_different_moe_groups_for_optimizer; _configure_moe_settings asserts it)")


def expert_groups(arch: Architecture, training: Training, par: Parallel, zero: int) -> bool:
    """ZeRO-1 of an MoE model under expert parallelism (DeepSpeed's MoE or AutoEP layers), otherwise as `modelled`:
    its expert parameters form groups of their own, partitioned over the expert-data-parallel group."""
    return (training.framework == "deepspeed" and zero == 1 and par.pp == par.tp == par.cp == 1 and par.ep > 1
            and arch.is_moe and (not deepspeed_settings(arch, training, zero).overlap_comm
                                 or training.offload_optimizer == "none" or microbatches(training, par) == 1))


def _expert_group_gradients(arch: Architecture, training: Training, recipe: Recipe, sp: StageParameters,
                            par: Parallel, grads: float) -> Component | None:
    """ZeRO-1's gradients at the step under expert parallelism: `grads_in_partition` holds the whole of every
    tensor overlapping this rank's partition of each group, the dense tensors' over the DP ranks and this rank's
    experts' over the expert-data-parallel ranks (DP / EP): data-parallel rank r is rank r // EP of its expert-data-
    parallel group (utils/groups.py _create_expert_and_data_parallel: expert-parallel groups of EP consecutive ranks,
    expert-data-parallel groups of the ranks EP apart), and the busiest rank's sum is the step's. Backward keeps the
    whole-gradient rule (every gradient whole to the reduction). The dense tensors are the Trainer's two groups
    (`layout`), the experts one group (all matrices). Not modelled: moe/utils.py
    split_params_into_different_moe_groups_for_optimizer, which the caller runs on a client optimizer's groups,
    packs the expert parameters into sub-groups of at most max_group_size (178,956,971 by default) elements, each
    partitioned on its own."""
    from .deepspeed_zero2 import expert_pieces

    pieces = expert_pieces(arch, sp, par)
    G = bytes_per_element(recipe.grad_dtype)
    if abs(G * sum(n for n, _, _ in pieces) - grads) >= 1:  # a frozen part (a vision tower): left as it was
        return None
    if training.offload_optimizer != "none":
        return component("gradients", "Gradients", 0, "0: each slice copied to the host in the reduction, the "
                         "GPU's freed (offload_optimizer)", EXPERT_SOURCE)
    de = par.expert_data_parallel
    # the Trainer's two groups' dense tensors, each group over the DP ranks; the experts (matrices: the decay group)
    dense_by_rank = [sum(ranks) for ranks in zip(*(rank_overlaps(tuple(
        n for n, decay, expert in pieces if not expert and decay is want), par.dp) for want in (True, False)))]
    experts_by_rank = rank_overlaps(tuple(n for n, _, expert in pieces if expert), de)
    rank = max(range(par.dp), key=lambda r: dense_by_rank[r] + experts_by_rank[r // par.ep])
    dense, experts = dense_by_rank[rank], experts_by_rank[rank // par.ep]
    return component("gradients", "Gradients", G * (dense + experts), f"{G:g} B x ({dense:,.0f} + {experts:,.0f}) "
                     f"elements on the busiest rank ({rank} of {par.dp}): the whole of every dense tensor overlapping "
                     f"its partition and of every local expert tensor overlapping its partition of {de} "
                     "(grads_in_partition)", EXPERT_SOURCE)
