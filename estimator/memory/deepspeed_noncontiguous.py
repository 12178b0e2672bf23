"""DeepSpeed ZeRO-2 with contiguous_gradients off: the gradients in backward, from DeepSpeed v0.19.5's source
(runtime/zero/stage_1_and_2.py).

- No reduce bucket buffer (setup_buckets l. 2471: torch.empty(reduce_bucket_size) only `if self.contiguous_gradients`)
  and no `grads_in_partition` (copy_grads_in_partition is called only `elif self.contiguous_gradients`, reduce_ipg_grads
  l. 1723): a gradient's hook adds the parameter's own .grad to the bucket's list (l. 1222), reducing the bucket
  first when it would pass reduce_bucket_size elements (l. 1176); whole tensors, one over the bucket too.
- After each reduction (buffered_reduce_fallback, the .grad tensors all-reduced in place) ZeRO-2 frees the other
  ranks' gradients (clear_grad_attribute, l. 1721); with overlap_comm it keeps them in previous_reduced_grads (l. 1717)
  until the next reduction's allreduce_and_copy (l. 1861) or the epilogue (l. 912). The rank's own stay whole as
  their .grad to the step: the partition is the same elements as with it on (deepspeed_zero2), its own tensors.
- Over more than one micro-batch the epilogue keeps the first backward's own gradients (all_grad_tensors, l. 916) and
  each later backward's own grow beside them (deepspeed_accumulation.second_partition).
So a rank holds, at each hook, the own gradients made so far, the bucket's other-rank gradients, the one just made
(and with overlap_comm the last bucket's other-rank ones): walked here in reverse module order (backward's) over
each rank's tensors of the Trainer's groups (deepspeed_zero2.trainer_groups; get_partition_info's
params_in_partition: deepspeed_offload.partition_windows).
Measured per rank on real DeepSpeed 0.19.5 over 2 gloo ranks, overlap_comm off, 2 and 3 micro-batches
(tests/test_deepspeed_accumulation.py), less allreduce_bucket's flat copy of the bucket in the reduction (a new
tensor of the bucket's elements where it holds more than one: charged, not in the record, which samples gradient
attributes only).
"""

from __future__ import annotations

from .components import Component, component
from .deepspeed_offload import partition_windows, trainable_sizes
from .deepspeed_step import deepspeed_settings
from .deepspeed_zero2 import _pieces as _zero2_pieces, applies
from .sharding import StageParameters
from ..spec.architecture import Architecture
from ..spec.dtypes import bytes_per_element
from ..spec.parallel import Parallel
from ..spec.training import Recipe, Training

SOURCE = ("DeepSpeed v0.19.5 runtime/zero/stage_1_and_2.py reduce_independent_p_g_buckets_and_remove_grads "
          "(l. 1176 reduce before overflow, l. 1222 the .grad itself in the bucket), reduce_ipg_grads (l. 1717-1723: "
          "other ranks' gradients freed, or kept to the next reduction with overlap_comm; no grads_in_partition), "
          "setup_buckets (l. 2471: no bucket buffer); measured: tests/data/measured/deepspeed_partitions/"
          "zero12-accumulation-cpu-gloo.json")


FLAT_SOURCE = ("DeepSpeed v0.19.5 runtime/zero/stage_1_and_2.py allreduce_bucket (`self.flatten(bucket)`: "
               "torch _flatten_dense_tensors, a new tensor for more than one), allreduce_no_retain, "
               "buffered_reduce_fallback; not in the CPU record (it samples gradient attributes only)")


def contiguous(training: Training) -> bool:
    """Whether ZeRO-1/2 run with contiguous_gradients: DeepSpeed's default, and always with the optimizer offloaded
    (stage_1_and_2.py l. 259: `contiguous_gradients or self.cpu_offload`)."""
    return training.contiguous_gradients is not False or training.offload_optimizer != "none"


def modelled(training: Training, par: Parallel, zero: int) -> bool:
    """ZeRO-2 with contiguous_gradients off, its partition on the GPU (validation refuses the rest)."""
    return not contiguous(training) and applies(training, par, zero)


def _pieces(arch: Architecture, training: Training, recipe: Recipe, sp: StageParameters,
            par: Parallel) -> list[tuple[float, int, int]]:
    """(elements, group, index in the group's module order) of the trained tensors in the order forward runs them:
    full fine-tuning's in the HF Trainer's two groups (decay, then the rest: deepspeed_zero2.trainer_groups), each
    layer's input norm moved ahead of its attention (the spec lists a layer's two norms together after o_proj); an
    adapter run's trainable tensors one group, in module order."""
    if training.adapter is not None:
        return [(n, 0, i) for i, n in enumerate(trainable_sizes(arch, training, recipe, sp))]
    kinds = arch.layer_kinds()
    blocks = ([arch.embedding_tensors()] if sp.first else []) + [arch.layer_tensors(kinds[i])
                                                                 for i in sp.layer_indices]
    blocks += [arch.head_tensors()] if sp.last else []
    out, count = [], [0, 0]
    for tensors in blocks:
        block = []
        for t in tensors:
            pieces = []
            for n, decay in _zero2_pieces(arch, [t], par):
                g = 0 if decay else 1
                pieces.append((n, g, count[g]))
                count[g] += 1
            if t.name == "norm" and len(pieces) == 2:  # input_layernorm runs first, post_attention_layernorm here
                block.insert(0, pieces.pop(0))
            block += pieces
        out += block
    return out


def held_beside_partition(pieces: list[tuple[float, int, int]], d: int, bucket: int,
                          overlap: bool) -> tuple[float, float]:
    """(gradient elements beyond the rank's own partition, elements of the bucket's flat copy) at the fullest moment
    of any of `d` ranks' backward. Walking backward (the pieces reversed), at each hook a rank holds its own
    gradients made so far, the bucket's other-rank gradients, the one just made and (with `overlap`) the last
    reduced bucket's other-rank ones; reducing a bucket of more than one tensor, allreduce_and_copy first frees
    those last ones (l. 1861) and allreduce_bucket flattens the bucket (a new tensor of its elements;
    _flatten_dense_tensors views a lone tensor)."""
    groups: dict[int, list[float]] = {}
    for n, g, _ in sorted(pieces, key=lambda p: (p[1], p[2])):  # each group flat in module order
        groups.setdefault(g, []).append(n)
    windows = {g: partition_windows(tuple(sizes), d) for g, sizes in groups.items()}
    best = (0.0, 0.0)
    for r in range(d):
        def own(g: int, i: int) -> bool:
            first, last, _ = windows[g][r]
            return first <= i < last
        total = sum(n for n, g, i in pieces if own(g, i))
        made = waiting = previous = filled = 0.0
        members = 0
        moments = []
        for n, g, i in reversed(pieces):
            mine = own(g, i)
            made += n if mine else 0.0
            arriving = 0.0 if mine else n
            moments.append((made + waiting + previous + arriving - total, 0.0))
            if filled + n > bucket and filled > 0:  # reduce_ipg_grads before this gradient joins the bucket
                if members > 1:
                    moments.append((made + waiting + arriving - total, filled))
                previous = waiting if overlap else 0.0
                waiting = filled = 0.0
                members = 0
            filled += n
            members += 1
            waiting += arriving
        moments.append((made + waiting + previous - total, 0.0))  # the epilogue's reduce_ipg_grads
        if members > 1:
            moments.append((made + waiting - total, filled))
        best = max([best] + moments, key=sum)
    return best


def pending(arch: Architecture, training: Training, recipe: Recipe, sp: StageParameters, par: Parallel,
            zero: int) -> list[Component]:
    """The other ranks' gradients held beside the partition at backward's fullest moment, and the flat copy of the
    bucket being reduced then (`held_beside_partition`)."""
    ds = deepspeed_settings(arch, training, zero)
    pieces = _pieces(arch, training, recipe, sp, par)
    key = ("zero2 noncontiguous", sp.layer_indices, sp.first, sp.last, par.tp, par.dp, training.adapter, recipe,
           ds.reduce_bucket_size, ds.overlap_comm)
    n, flat = arch.cached(key, lambda: held_beside_partition(pieces, par.dp, ds.reduce_bucket_size,
                                                             ds.overlap_comm))
    G = bytes_per_element(recipe.grad_dtype)
    kept = " and the last reduced bucket's (overlap_comm)" if ds.overlap_comm else ""
    out = [component("transient", "Other ranks' gradients awaiting reduction (contiguous_gradients off)", G * n,
                     f"{G:g} B x {n:,.0f} elements: at backward's fullest moment, the bucket's gradients of other "
                     f"ranks' tensors and the one just made{kept}, whole (reduce_bucket_size "
                     f"{ds.reduce_bucket_size:,})", SOURCE)]
    if flat:
        out.append(component("transient", "Flat copy of the bucket being all-reduced (allreduce_bucket)", G * flat,
                             f"{G:g} B x {flat:,.0f} elements: the bucket's gradients flattened then", FLAT_SOURCE))
    return out
