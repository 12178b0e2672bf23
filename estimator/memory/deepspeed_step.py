"""DeepSpeed ZeRO's optimizer step and its gradient partitions, from DeepSpeed v0.19.5's source, held to four real
steps of Qwen-1.8B on an H200 (tests/data/measured/gpu/deepspeed, tests/test_gpu_deepspeed.py).

- ZeRO-3 allocates one flat buffer for every gradient partition when it builds its optimizer and keeps it
  (stage3.py __init__: `grad_partitions_flat_buffer = torch.zeros(sum of partition_numel, gradient_accumulation_dtype)`,
  each parameter's partition a narrow() view of it): the partitioned gradients exist through every phase
  (on the host when the optimizer is offloaded: `self.device`).
- The step walks the sub-groups one at a time (stage3.py step): `_prepare_fp32_grad_for_sub_group` flattens the
  sub-group's 16-bit gradients (torch.cat) and casts the copy to fp32, the flat copy freed as the statement ends;
  the torch optimizer then steps the sub-group's one flat fp32 tensor and `_release_sub_group` drops the fp32
  gradient. A sub-group closes once its partitions reach sub_group_size (stage3.py _create_fp16_sub_groups), in
  each of the optimizer's parameter groups: the HF Trainer's weight-decay group (every matrix, registration order)
  and its no-decay group (norms, biases: Trainer.get_decay_parameter_names).
- ZeRO-1/2 step each parameter group's partition at once (stage_1_and_2.py step): the epilogue left
  `averaged_gradients` a list of views of the partition's gradients (independent_gradient_partition_epilogue,
  get_flat_partition(return_tensor_list=True)); the step flattens them (`self.flatten`, torch.cat: a new 16-bit
  copy, _get_preflattened_grad_partition being None outside DeepCompile) and casts that to fp32
  (`flat_grad_partition.to(fp32)`, then `del flat_grad_partition`): the cast's moment holds both, (G + 4) B an
  element, as ZeRO-3's does (v0.12.3's step does the same in one statement). What follows allocates nothing: the
  fp32 -> 16-bit update is `bit16_partitions[partition_id].data.copy_(fp32_partition.data)`, in place in a view of
  `bit16_groups_flat`, and all_gather_dp_groups gathers into that flat buffer itself
  (runtime/utils.py all_gather_into_tensor_dp_groups: `all_gather_into_tensor(group_flat, partition)`;
  _update_model_bit16_weights re-points the parameters at views of it).
- torch's foreach AdamW (torch/optim/adam.py _multi_tensor_adam, torch 2.11: `exp_avg_sq_sqrt =
  torch._foreach_sqrt(device_exp_avg_sqs)`) makes sqrt(v) of the whole flat tensor it steps, in its dtype; a fused
  kernel (DeepSpeed's FusedAdam, torch's fused AdamW) works in place.
- In backward ZeRO-2 allocates its flat gradient partitions at the first bucket's reduction, and both stages keep a
  gradient larger than the bucket (the head's) whole until a later reduction, ZeRO-2 with the optimizer offloaded
  too (no GPU partition then, but an fp64 copy of the rank's slice of that gradient for its norm); the ZeRO settings
  ('auto' as the HF Trainer fills them) live here too (`deepspeed_settings`).
"""

from __future__ import annotations

from typing import NamedTuple

from .components import Component, component
from .sharding import StageParameters
from ..spec.architecture import Architecture
from ..spec.training import Training
from ..spec.versions import TORCH_FOREACH_ADD_IN_PLACE, torch_release


class DeepSpeedBuffers(NamedTuple):
    """The ZeRO settings a run uses, 'auto' decided as the HF Trainer decides it."""

    reduce_bucket_size: int
    overlap_comm: bool
    prefetch_bucket_size: int
    max_live_parameters: int
    persistence_threshold: int


def deepspeed_settings(arch: Architecture, training: Training, zero: int) -> DeepSpeedBuffers:
    """`training`'s DeepSpeed fields with None ('auto') resolved: the HF Trainer's hidden-size rules
    (transformers integrations/deepspeed.py trainer_config_finalize) for the bucket sizes and the
    persistence threshold, DeepSpeed's own defaults for the rest (overlap_comm: true under ZeRO-3)."""
    h = arch.hidden_size
    return DeepSpeedBuffers(
        reduce_bucket_size=training.reduce_bucket_size if training.reduce_bucket_size is not None else h * h,
        overlap_comm=training.overlap_comm if training.overlap_comm is not None else zero == 3,
        prefetch_bucket_size=(training.stage3_prefetch_bucket_size if training.stage3_prefetch_bucket_size
                              is not None else int(0.9 * h * h)),
        max_live_parameters=training.stage3_max_live_parameters or 1_000_000_000,
        persistence_threshold=(training.stage3_param_persistence_threshold
                               if training.stage3_param_persistence_threshold is not None else 10 * h))


SUB_GROUP_SIZE = 1_000_000_000  # DeepSpeed v0.19.5 runtime/zero/config.py sub_group_size (Qwen's ds_configs: 1e9)
STEP_SOURCE = ("DeepSpeed v0.19.5 runtime/zero/stage3.py step, _prepare_fp32_grad_for_sub_group, _release_sub_group, "
               "_create_fp16_sub_groups (sub_group_size 1e9); stage_1_and_2.py step (l. 2330-2335: the partition's "
               "gradients flattened, `self.flatten(averaged_gradients[i])`, then cast to fp32; v0.12.3 l. 1764-1768 "
               "the same), update_lp_params and runtime/utils.py all_gather_dp_groups (in place: nothing allocated)")
FOREACH_DENOM_SOURCE = ("torch 2.0.1 (e9ebda29) torch/optim/adamw.py _multi_tensor_adamw l. 564-568: `denom = "
                        "torch._foreach_add(exp_avg_sq_sqrt, eps)` out of place, beside exp_avg_sq_sqrt; torch 2.1.0 "
                        "(7bcf7da3) l. 602: `torch._foreach_add_(exp_avg_sq_sqrt, eps)`, in place")
FOREACH_SOURCE = ("torch 2.11 torch/optim/adam.py _multi_tensor_adam (torch._foreach_sqrt of the second moments: one "
                  "temporary the size of the flat fp32 tensor stepped); measured: tests/data/measured/gpu/deepspeed")
GRADIENT_BUFFER_SOURCE = ("DeepSpeed v0.19.5 runtime/zero/stage3.py __init__ (grad_partitions_flat_buffer: torch.zeros "
                          "of every partition in the gradient-accumulation dtype, kept; measured: allocated before "
                          "step 2 of tests/data/measured/gpu/deepspeed/*zero3*)")


def gradients_source(training: Training, source: str) -> str:
    """The gradients' source, with DeepSpeed's buffers where DeepSpeed runs."""
    if training.framework != "deepspeed":
        return source
    return f"{source}; ZeRO-3: {GRADIENT_BUFFER_SOURCE}; ZeRO-2: {ZERO2_BACKWARD_SOURCE}"


def runs_foreach(training: Training) -> bool:
    """DeepSpeed steps torch's foreach AdamW on the GPU: the client optimizer the HF Trainer passes (adamw_torch) where
    the ds_config names none (`adamw_implementation` 'foreach'); an offloaded optimizer steps on the host."""
    return training.framework == "deepspeed" and training.adamw_implementation == "foreach" \
        and training.offload_optimizer == "none"


def foreach_temporaries(training: Training) -> int:
    """The temporaries of its own size torch's foreach AdamW holds as it steps one flat tensor: sqrt(v), and before
    torch 2.1 sqrt(v) + eps beside it (FOREACH_DENOM_SOURCE)."""
    return 2 if torch_release(training.torch_version) < TORCH_FOREACH_ADD_IN_PLACE else 1


def keeps_gradient_buffer(training: Training, zero: int) -> bool:
    """ZeRO-3's flat gradient partitions live on the GPU from initialisation (GRADIENT_BUFFER_SOURCE): every phase
    holds them. Offloading the optimizer puts the buffer on the host."""
    return training.framework == "deepspeed" and zero == 3 and training.offload_optimizer == "none"


def _decay_partitions(arch: Architecture, stage: StageParameters, d: int) -> list[int]:
    """The partitions (ceil(numel / d): ZeRO-3 pads each parameter to the ranks) of the weight-decay group's
    tensors in registration order: the embedding, each layer's matrices (a gated MLP's gate and up projections
    two, as transformers makes them), the head."""
    from .reserved_tensors import _split

    tensors = []
    if stage.first:
        tensors += arch.embedding_tensors()
    kinds = arch.layer_kinds()
    for i in stage.layer_indices:
        tensors += arch.layer_tensors(kinds[i])
    if stage.last:
        tensors += arch.head_tensors()
    return [-(-int(n) // d) for t in tensors if len(t.shape) > 1 for n, _ in _split(t, arch.gated_mlp)]


def sub_groups(arch: Architecture, stage: StageParameters, d: int, shard: float) -> list[float]:
    """ZeRO-3's sub-groups on this GPU, in order: the weight-decay group's partitions cut where a sub-group first
    reaches SUB_GROUP_SIZE (stage3.py _create_fp16_sub_groups), then the no-decay group's (norms and biases, the
    rest of `shard`, far under it)."""
    key = ("zero3 decay partitions", stage.layer_indices, stage.first, stage.last, d)
    partitions = arch.cached(key, lambda: _decay_partitions(arch, stage, d))
    out, run = [], 0
    for n in partitions:
        run += n
        if run >= SUB_GROUP_SIZE:
            out, run = out + [float(run)], 0
    out += [float(run)] if run else []
    rest = shard - sum(partitions)
    return out + ([rest] if rest > 0 else [])


def largest_sub_group(arch: Architecture, stage: StageParameters, d: int, shard: float, whole: bool) -> float:
    """ZeRO-3's largest sub-group on this GPU (`whole`: every weight of the stage trains; else, an adapter run or a
    frozen tower, min(SUB_GROUP_SIZE, shard))."""
    if not whole:
        return min(SUB_GROUP_SIZE, shard)
    return max(sub_groups(arch, stage, d, shard))


def step_transients(arch: Architecture, training: Training, stage: StageParameters, zero: int,
                    shard: float, d: int, G: float, whole: bool) -> list[Component]:
    """The step's transients under ZeRO 1-3 with fp32 master weights, at its largest moment: the fp32 gradient of
    the sub-group (ZeRO-3) or partition (ZeRO-1/2) stepped, with the foreach AdamW's sqrt(v) of it, or, without
    foreach, the flat 16-bit copy it was cast from (every stage flattens before the cast: the cast's moment,
    (G + 4) B an element, is the larger then; with foreach the step's 8 B an element are)."""
    n = largest_sub_group(arch, stage, d, shard, whole) if zero == 3 else shard
    size = (f"largest sub-group, {n:,.0f} elements (sub_group_size {SUB_GROUP_SIZE:,.0f})" if zero == 3 else
            f"gradient partition, {n:,.0f} elements")
    out = [component("transient", "fp32 copy of the gradient partition for the step", 4 * n, f"4 B x {size}",
                     STEP_SOURCE)]
    if runs_foreach(training):
        out.append(component("transient", "foreach AdamW temporary (sqrt of the second moment)", 4 * n,
                             f"4 B x {size}", FOREACH_SOURCE))
        if foreach_temporaries(training) == 2:
            out.append(component("transient", "foreach AdamW's sqrt(v) + eps, out of place (torch before 2.1)",
                                 4 * n, f"4 B x {size}", FOREACH_DENOM_SOURCE))
    else:
        out.append(component("transient", "flat copy of the sub-group's gradients, cast to fp32" if zero == 3 else
                             "flat copy of the partition's gradients, cast to fp32", G * n, f"{G:g} B x {size}",
                             STEP_SOURCE))
    return out


ZERO2_BACKWARD_SOURCE = ("DeepSpeed v0.19.5 runtime/zero/stage_1_and_2.py copy_grads_in_partition (the flat gradient "
                         "partition, torch.empty at the first bucket's reduction), reduce_independent_p_g_buckets_and_"
                         "remove_grads (a tensor over reduce_bucket_size is kept whole as extra_large_param_to_reduce "
                         "until the next reduction); measured: tests/data/measured/gpu/deepspeed/*zero2* (peak_blocks)")
ZERO2_OFFLOAD_SOURCE = ("DeepSpeed v0.19.5 runtime/zero/stage_1_and_2.py reduce_independent_p_g_buckets_and_remove_grads "
                        "(l. 1203: a gradient over reduce_bucket_size kept whole as extra_large_param_to_reduce; l. 1179: "
                        "the next hook's reduce_ipg_grads reduces it), reduce_ipg_grads (l. 1722 frees another rank's, "
                        "l. 1724 copy_grads_in_partition), copy_grads_in_partition under cpu_offload (l. 1635 "
                        "set_norm_for_param_grad_in_gpu: `.double().norm(2)` of the rank's slice, l. 1561; l. 1639 "
                        "async_inplace_copy_grad_to_fp32_buffer_from_gpu: `.to(fp32)` of it, l. 1575, then "
                        "clear_grad_attribute, l. 1578)")


def zero2_backward(arch: Architecture, training: Training, zero: int, largest: float, G: float,
                   overlap: float = 0.0) -> tuple[bool, list]:
    """ZeRO-2 (contiguous gradients) in backward: whether its flat gradient partitions exist after the loss's
    backward (allocated at the first bucket's reduction, a few layers in), and the gradient they are allocated beside:
    the first tensor backward makes, the head's, is over reduce_bucket_size, kept whole until that reduction.
    Offloading the optimizer allocates no partition on the GPU, but the head's gradient is kept whole all the same
    until the next hook, which takes the rank's slice of it (`overlap` elements) in fp64 for its norm, then in fp32
    for the host, one after the other, before freeing it: its moment is the whole gradient and the fp64 slice."""
    if training.framework != "deepspeed" or zero != 2:
        return False, []
    bucket = deepspeed_settings(arch, training, zero).reduce_bucket_size
    offloaded = training.offload_optimizer != "none"
    if largest <= bucket:
        return not offloaded, []
    size = f"{largest:,.0f} elements (over reduce_bucket_size {bucket:,})"
    overlap = min(overlap, largest)  # the slices are counted on whole tensors: a tensor-parallel shard bounds them
    if not offloaded:
        return True, [component("transient", "The largest tensor's gradient, whole until the first reduction",
                                G * largest, f"{G:g} B x {size}", ZERO2_BACKWARD_SOURCE)]
    return False, [component("transient", "The largest tensor's gradient, whole until the next gradient's hook",
                             G * largest, f"{G:g} B x {size}", ZERO2_OFFLOAD_SOURCE),
                   component("transient", "fp64 copy of this GPU's slice of it (its norm, offload_optimizer)",
                             8 * overlap, f"8 B x {overlap:,.0f} elements of it in this GPU's partition",
                             ZERO2_OFFLOAD_SOURCE)]


ZERO3_WHOLE_SOURCE = ("DeepSpeed v0.19.5 runtime/zero/stage3.py reduce_independent_p_g_buckets_and_remove_grads, "
                      "__add_grad_to_ipg_bucket (a gradient that does not fit the bucket stays the parameter's own "
                      "until the next gradient's hook reduces the bucket); measured: backward of "
                      "tests/data/measured/gpu/deepspeed/*zero3*-s256")


def zero3_whole_gradient(arch: Architecture, training: Training, zero: int, largest: float, G: float) -> list:
    """ZeRO-3 in backward, after the loss's: the head's gradient, over reduce_bucket_size, whole (unpartitioned)
    until the next gradient arrives; a moment of its own (transients.Transients.step_after_loss)."""
    if training.framework != "deepspeed" or zero != 3:
        return []
    bucket = deepspeed_settings(arch, training, zero).reduce_bucket_size
    if largest <= bucket:
        return []
    return [component("transient", "The largest tensor's gradient, whole until the next gradient's hook",
                      G * largest, f"{G:g} B x {largest:,.0f} elements (over reduce_bucket_size {bucket:,})",
                      ZERO3_WHOLE_SOURCE)]
