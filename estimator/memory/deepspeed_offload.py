"""DeepSpeed's own buffers under ZeRO-Offload (`offload_optimizer`), beside the fp32 master partition, the optimizer
states and the fp32 gradient partition that offload.py moves to the host; from DeepSpeed v0.19.5's source.

- ZeRO-3 (runtime/zero/stage3.py __init__): `grad_partitions_flat_buffer`, one flat buffer of every trainable
  parameter's partition in the gradient-accumulation dtype (engine.py get_data_types: the model's dtype unless
  data_types.grad_accum_dtype says otherwise), is made on `self.device`, the CPU when the optimizer is offloaded
  (pinned with offload_optimizer.pin_memory); the partitioned gradients accumulate there (__param_id_to_grad_partition
  views of it) before _finalize_offload_gradient_accumulation copies them into the fp32 gradient partition.
- ZeRO-1/2 (runtime/zero/stage_1_and_2.py, cpu_offload): __init__ keeps a 16-bit copy of each group's partition on
  the host (`param_buffer_of_bit16_for_cpu_offload_groups`, the step's updated weights on their way back to the
  GPU), and two buffers of the largest trainable parameter in the 16-bit dtype (`self.dtype`):
  `temp_grad_buffer_for_cpu_offload` on the host and `temp_grad_buffer_for_gpu_offload` on the GPU. With more
  than one micro-batch a step, copy_grads_in_partition accumulates in `accumulated_grads_in_cpu`: one host buffer
  per parameter of the rank's partition, the parameter's whole size (async_accumulate_grad_in_cpu_via_gpu,
  buffer_to_accumulate_to_in_cpu: `torch.zeros(param.numel(), dtype=param.dtype)`), kept from step to step.
  A parameter belongs to a partition when it overlaps it (get_partition_info); the partitions are equal shares of
  the group's flat tensor padded to a multiple of 2 x dp (nccl_start_alignment_factor 2, align_dense_tensors).
  The group: the trainable parameters in module order (transformers integrations/deepspeed.py deepspeed_init
  passes them to DeepSpeed's own optimizer, the DeepSpeedCPUAdam ZeRO-Offload runs, as one group); under tensor
  or expert parallelism each rank's engine holds its shards and its experts alone (`trainable_sizes`), so the
  largest tensor and the tensors overlapping a partition are those.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from itertools import accumulate
from typing import NamedTuple

from .components import Component, component
from .pipeline import microbatches
from .sharding import StageParameters
from ..spec.architecture import Architecture
from ..spec.dtypes import bytes_per_element
from ..spec.parallel import Parallel
from ..spec.training import Recipe, Training

ZERO3_SOURCE = ("DeepSpeed v0.19.5 runtime/zero/stage3.py __init__ (grad_partitions_flat_buffer on self.device, the CPU "
                "under offload_optimizer; pinned with pin_memory), engine.py get_data_types (grad_accum_dtype: the "
                "model's dtype by default)")
ZERO12_SOURCE = ("DeepSpeed v0.19.5 runtime/zero/stage_1_and_2.py __init__ (cpu_offload: "
                 "param_buffer_of_bit16_for_cpu_offload_groups, temp_grad_buffer_for_cpu_offload, "
                 "temp_grad_buffer_for_gpu_offload of largest_param_numel in self.dtype)")
ACCUMULATION_SOURCE = ("DeepSpeed v0.19.5 runtime/zero/stage_1_and_2.py async_accumulate_grad_in_cpu_via_gpu "
                       "(accumulated_grads_in_cpu: each partition parameter's whole numel in its dtype, when a step "
                       "has more than one micro-batch), get_partition_info, align_dense_tensors (2 x dp)")


class _Cfg(NamedTuple):
    """What reserved_tensors.tensors reads of a resolved configuration."""

    architecture: Architecture
    training: Training
    recipe: Recipe


def trainable_sizes(arch: Architecture, training: Training, recipe: Recipe, sp: StageParameters,
                    par: Parallel | None = None) -> tuple:
    """The stage's trainable tensors' elements in module order (an adapter run's adapters and trained copies), as
    this GPU's DeepSpeed engine sees them: under tensor parallelism (`par`) each rank's engine is given its own
    shards (a column-, row- or vocabulary-parallel tensor's 1/t, a norm or bias whole), so its flat groups, its
    partitions and its largest tensor are the shards' (runtime/zero/stage_1_and_2.py __init__ flattens the
    parameters the rank's module holds)."""
    from .reserved_tensors import tensors

    if par is not None and (par.tp > 1 or par.ep > 1):  # full fine-tuning only: an adapter refuses TP and EP
        return tuple(n for n, _ in local_shards(arch, sp, par))
    key = ("deepspeed trainable sizes", sp.layer_indices, sp.first, sp.last, training.adapter, recipe)
    return arch.cached(key, lambda: tuple(t.elements for t in tensors(_Cfg(arch, training, recipe), sp).order()
                                          if t.grad))


def local_shards(arch: Architecture, sp: StageParameters, par: Parallel) -> tuple:
    """(elements, whether a routed expert's) of every tensor of the stage in module order (reserved_tensors' order:
    embedding, layers, final norm and head, a gated MLP's gate and up apart), each as one GPU holds it under tensor
    and expert parallelism (sharding.local_numel: an expert tensor's 1/(EP x expert-TP), this rank's experts)."""
    from .reserved_tensors import _split
    from .sharding import local_numel

    def shards() -> tuple:
        return tuple((n * local_numel(t, par) / t.numel, t.is_expert) for t in stage_tensors(arch, sp)
                     for n, _ in _split(t, arch.gated_mlp))
    return arch.cached(("deepspeed local shards", sp.layer_indices, sp.first, sp.last, par.tp, par.ep, par.etp),
                       shards)


def stage_tensors(arch: Architecture, sp: StageParameters) -> list:
    """The stage's parameter tensors (spec ParameterTensor, whole) in module order: embedding, layers, final norm
    and head."""
    kinds = arch.layer_kinds()
    return ((arch.embedding_tensors() if sp.first else []) + [t for i in sp.layer_indices
                                                              for t in arch.layer_tensors(kinds[i])]
            + (arch.head_tensors() if sp.last else []))


def partition_share(sizes: tuple, d: int) -> float:
    """One of `d` ranks' equal share of the tensors' flat concatenation, padded to a multiple of 2 x d
    (get_partition_info)."""
    return -(-sum(sizes) // (2 * d)) * 2


def partition_windows(sizes: tuple, d: int) -> list[tuple[int, int, float]]:
    """For each of `d` ranks, the tensors overlapping its `partition_share` (get_partition_info's
    params_in_partition): (the first's index, one past the last's, their elements summed, whole)."""
    ends = list(accumulate(sizes))
    share = partition_share(sizes, d)
    starts = [0.0] + ends[:-1]
    out = []
    for r in range(d):
        first = bisect_right(ends, r * share)  # the first tensor ending after the share's start
        last = bisect_left(starts, (r + 1) * share)  # one past the last tensor starting before its end
        out.append((first, last, ends[last - 1] - starts[first] if last > first else 0.0))
    return out


def rank_overlaps(sizes: tuple, d: int) -> list[float]:
    """For each of `d` ranks, the elements its partition touches: the whole size of every tensor overlapping the
    rank's `partition_share` (`partition_windows`)."""
    return [touched for _, _, touched in partition_windows(sizes, d)]


def overlapping_elements(sizes: tuple, d: int) -> float:
    """The most elements any of `d` ranks' partitions touches (`rank_overlaps`)."""
    return max(rank_overlaps(sizes, d), default=0.0)


def largest_overlap(sizes: tuple, d: int) -> float:
    """The most elements of the largest tensor (the first of them) that one of `d` ranks' partitions holds: its
    overlap with the rank's equal share of the flat concatenation padded to a multiple of 2 x d
    (get_partition_info, grad_position's num_elements)."""
    if not sizes:
        return 0.0
    largest = max(sizes)
    start = sum(sizes[:sizes.index(largest)])
    share = partition_share(sizes, d)
    return max(max(0.0, min(start + largest, (r + 1) * share) - max(start, r * share)) for r in range(d))


def busiest_partition(arch: Architecture, training: Training, recipe: Recipe, sp: StageParameters, d: int,
                      par: Parallel | None = None) -> float:
    """`overlapping_elements` of the stage's trainable tensors (this GPU's tensor-parallel shards under `par`) over
    `d` ranks, remembered per stage setup: what ZeRO-1's grads_in_partition and, under offload, the host's
    accumulated gradients hold."""
    tp, ep = (par.tp, par.ep) if par is not None else (1, 1)
    key = ("deepspeed overlapping", sp.layer_indices, sp.first, sp.last, training.adapter, recipe, d, tp, ep)
    return arch.cached(key, lambda: overlapping_elements(trainable_sizes(arch, training, recipe, sp, par), d))


def largest_slice(arch: Architecture, training: Training, recipe: Recipe, sp: StageParameters, zero: int,
                  par: Parallel) -> float:
    """ZeRO-2 under offload_optimizer: the elements of the largest trainable tensor in one rank's partition, the
    slice copy_grads_in_partition copies out of its whole gradient (deepspeed_step.zero2_backward); else 0."""
    if training.framework != "deepspeed" or training.offload_optimizer == "none" or zero != 2:
        return 0.0
    key = ("deepspeed largest slice", sp.layer_indices, sp.first, sp.last, training.adapter, recipe, par.dp, par.tp,
           par.ep)
    return arch.cached(key, lambda: largest_overlap(trainable_sizes(arch, training, recipe, sp, par), par.dp))


def host_buffers(arch: Architecture, training: Training, recipe: Recipe, sp: StageParameters, zero: int,
                 n: float, par: Parallel) -> tuple[Component, ...]:
    """DeepSpeed's host buffers under offload_optimizer for `n` trainable elements in this rank's partition, the
    data-parallel ranks sharing them."""
    if training.framework != "deepspeed" or training.offload_optimizer == "none":
        return ()
    d, m = par.dp, microbatches(training, par)
    P, G = bytes_per_element(recipe.param_dtype), bytes_per_element(recipe.grad_dtype)
    if zero == 3:
        return (component("host_buffers", "Gradient partitions (grad_partitions_flat_buffer)", G * n,
                          f"{G:g} B x {n:,.0f} parameters of this GPU's partition", ZERO3_SOURCE),)
    sizes = trainable_sizes(arch, training, recipe, sp, par)
    largest = max(sizes, default=0.0)
    out = [component("host_buffers", "16-bit copy of the partition (for the updated weights)", P * n,
                     f"{P:g} B x {n:,.0f} parameters of this GPU's partition", ZERO12_SOURCE),
           component("host_buffers", "Gradient staging buffer (temp_grad_buffer_for_cpu_offload)", P * largest,
                     f"{P:g} B x the largest trainable tensor, {largest:,.0f} elements", ZERO12_SOURCE)]
    if m > 1:
        whole = busiest_partition(arch, training, recipe, sp, d, par)
        out.append(component("host_buffers", "Accumulated gradients (accumulated_grads_in_cpu)", P * whole,
                             f"{P:g} B x {whole:,.0f} elements: the whole of every trainable tensor overlapping this "
                             f"GPU's partition ({m} micro-batches a step)", ACCUMULATION_SOURCE))
    return tuple(out)


def gpu_buffer(arch: Architecture, training: Training, recipe: Recipe, sp: StageParameters,
               zero: int, par: Parallel) -> list[Component]:
    """ZeRO-1/2's GPU-side staging buffer under offload_optimizer, kept from initialisation."""
    if training.framework != "deepspeed" or training.offload_optimizer == "none" or zero not in (1, 2):
        return []
    P = bytes_per_element(recipe.param_dtype)
    largest = max(trainable_sizes(arch, training, recipe, sp, par), default=0.0)
    return [component("buffers", "Gradient staging buffer (temp_grad_buffer_for_gpu_offload)", P * largest,
                      f"{P:g} B x the largest trainable tensor, {largest:,.0f} elements", ZERO12_SOURCE)]
