"""DeepSpeed ZeRO-2 over more than one micro-batch a step: a second gradient partition in every backward after the
first, from DeepSpeed v0.19.5's source (runtime/zero/stage_1_and_2.py), contiguous_gradients on (the default).

- The first reduction of each backward makes `grads_in_partition` (copy_grads_in_partition l. 1643-1653: torch.empty
  when the name is None) and points the rank's reduced gradients into it.
- The backward's epilogue (independent_gradient_partition_epilogue l. 898-946) keeps the first micro-batch's
  gradients in `all_grad_tensors` (l. 916-918: the .grad tensors, views of that buffer), adds every later
  micro-batch's into them (l. 919-923, `add_`), then drops the name `grads_in_partition` (_release_ipg_buffers
  l. 807-813, called l. 939) and every .grad (_clear_param_grad_only, l. 945): the first buffer lives on through
  all_grad_tensors, so the next backward's first reduction makes another beside it, freed at that backward's
  epilogue.
- So from the second micro-batch on backward holds two partitions from its first reduction to its end; the step
  holds one (averaged_gradients: views of the first, l. 924-931). DeepSpeed of the v0.1x line of v0.12.3 does the
  same with `averaged_gradients` in place of all_grad_tensors (independent_gradient_partition_epilogue: the first
  micro-batch's get_flat_partition(return_tensor_list=True) kept, `avg_new` added into it, then
  _release_ipg_buffers; read in a public copy of that code, its release not pinned: line numbers unchecked).
Measured per rank and micro-batch on real DeepSpeed 0.19.5 over 2 gloo ranks, gradient_accumulation_steps 2 and 3,
overlap_comm on and off (validation/gpu/deepspeed_accumulation.py, tests/test_deepspeed_accumulation.py). The
one-GPU replay of the caching allocator (deepspeed_replay._micro_batches) makes and frees it likewise.
contiguous_gradients off: no grads_in_partition, each later backward's own .grad of the rank's tensors grow beside
the kept ones, two partitions at its end too (measured; deepspeed_noncontiguous holds the rest of that backward).
Not modelled: offload_optimizer (accumulated_grads_in_cpu, deepspeed_offload).
"""

from __future__ import annotations

from .components import Component, component
from .pipeline import microbatches
from ..spec.parallel import Parallel
from ..spec.training import Training

SOURCE = ("DeepSpeed v0.19.5 runtime/zero/stage_1_and_2.py independent_gradient_partition_epilogue (l. 916-923: "
          "the first micro-batch's gradients kept in all_grad_tensors, later ones added), _release_ipg_buffers "
          "(l. 807-813), copy_grads_in_partition (l. 1643-1653: a new torch.empty each backward); v0.12.3 the same "
          "through averaged_gradients; measured: tests/data/measured/deepspeed_partitions/"
          "zero12-accumulation-cpu-gloo.json")


def second_partition(training: Training, par: Parallel, zero: int, partitions: bool, grads: float) -> list[Component]:
    """The backward's own `grads_in_partition` beside the kept one (`grads` bytes: the busiest rank's partition,
    deepspeed_zero2) where ZeRO-2's partitions are on the GPU in backward (`partitions`:
    deepspeed_step.zero2_backward) and a step runs more than one micro-batch; else []."""
    m = microbatches(training, par)
    if training.framework != "deepspeed" or zero != 2 or not partitions or m < 2 or grads <= 0:
        return []
    if training.contiguous_gradients is False:  # ZeRO-2 without offload: it is not turned back on
        return [component("transient", "Gradients of this micro-batch's partition (its own .grad, beside the kept "
                          "ones)", grads, f"{grads:,.0f} B: the busiest GPU's own gradients again, whole "
                          f"(micro-batches 2 to {m}; contiguous_gradients off: no grads_in_partition)", SOURCE)]
    return [component("transient", "Gradient partition of this micro-batch (grads_in_partition, beside the kept one)",
                      grads, f"{grads:,.0f} B: the busiest GPU's gradient partition again (micro-batches 2 to {m} "
                      "of each step: the first one's is kept in all_grad_tensors)", SOURCE)]
