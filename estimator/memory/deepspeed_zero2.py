"""DeepSpeed ZeRO-2's gradient partition on the GPU (contiguous_gradients on, DeepSpeed's default), from DeepSpeed
v0.19.5's source, runtime/zero/stage_1_and_2.py (v0.12.6 reads the same: copy_grads_in_partition l. 1296-1306).

- __init__ partitions each optimizer parameter group on its own (l. 515-517): the group's flat 16-bit tensor,
  padded to a multiple of 2 x dp (l. 389, align_dense_tensors), cut into dp equal shares; get_partition_info
  (l. 1959) lists in params_in_partition every parameter of the group overlapping the rank's share, whole.
- The first reduction in backward makes `grads_in_partition` (copy_grads_in_partition l. 1643-1653: torch.empty of
  the numel summed over every group's params_in_partition) and each of the rank's reduced gradients is copied
  into it whole; it lives to the step (_release_ipg_buffers, l. 812; over several micro-batches the first one's
  is kept and each later backward makes another beside it: deepspeed_accumulation). ZeRO-2 frees the other ranks'
  gradients as they are reduced (reduce_ipg_grads, clear_grad_attribute), so it is the gradient memory from then on.
- The groups: the HF Trainer's two (trainer.py create_optimizer, the ds_config naming no optimizer): the
  weight-decay parameters (every matrix, the embedding and head included), then the rest (norms and biases,
  get_decay_parameter_names), each in module order as transformers' modules hold them (q, k and v biases three
  tensors); under tensor parallelism the rank's shards. ZeRO-1 partitions the same groups the same way
  (deepspeed_zero1.layout).
Measured per rank on real DeepSpeed 0.19.5 over 2 and 4 gloo ranks, ZeRO-1 and ZeRO-2, overlap_comm on and off
(validation/gpu/deepspeed_partitions.py, tests/data/measured/deepspeed_partitions/).
So a rank holds more than N/dp where a large tensor (the embedding, the head) straddles a share's edge; the GPU
the estimate is for is the busiest: the rank whose two groups' overlapping tensors sum to the most.
"""

from __future__ import annotations

from .components import once
from .deepspeed_offload import rank_overlaps, stage_tensors, trainable_sizes
from .reserved_tensors import _split
from .sharding import StageParameters, local_numel
from .states import ModelStates
from ..spec.architecture import Architecture
from ..spec.dtypes import bytes_per_element
from ..spec.parallel import Parallel
from ..spec.training import Recipe, Training


def applies(training: Training, par: Parallel, zero: int) -> bool:
    """ZeRO-2 under DeepSpeed, its gradient partition on the GPU (no offload_optimizer), full fine-tuning or an
    adapter run, over more than one data-parallel rank, neither context nor expert parallelism (the ZeRO groups would
    not be the DP ranks alone: not measured). An MoE model without EP counts as a dense one
    (deepspeed_zero1.zero1_dense says why)."""
    return (training.framework == "deepspeed" and zero == 2 and training.offload_optimizer == "none"
            and par.dp > 1 and par.cp == par.ep == 1)


def _pieces(arch: Architecture, tensors: list, par: Parallel, expert: bool = False) -> list[tuple]:
    """(elements, whether it decays) of `tensors` (spec ParameterTensor) as transformers' modules hold them on this
    rank: a gated MLP's gate and up apart (reserved_tensors._split), the q, k and v biases three tensors
    (Qwen2Attention's q_proj, k_proj, v_proj biases), a shared q/k norm two (q_norm, k_norm). A tensor of more
    than one dimension decays (HF Trainer get_decay_parameter_names: not biases, not norms). With `expert` a third
    field says whether it is a routed expert's (sharding.local_numel: 1/(EP x expert-TP) of it on this rank)."""
    def split(t) -> list[tuple[float, bool]]:
        if t.name == "qkv_bias":
            return [(float(arch.q_width), False)] + [(float(arch.kv_width), False)] * 2
        if t.name == "qk_norm":
            return [(float(arch.head_dim), False)] * 2
        return _split(t, arch.gated_mlp)
    return [(n * local_numel(t, par) / t.numel, len(t.shape) > 1) + ((t.is_expert,) if expert else ())
            for t in tensors for n, _ in split(t)]


def trainer_pieces(arch: Architecture, sp: StageParameters, par: Parallel) -> tuple[tuple[float, bool], ...]:
    """`_pieces` of the stage's parameters in module order (embedding, layers, final norm and head)."""
    return arch.cached(("trainer pieces", sp.layer_indices, sp.first, sp.last, par.tp, par.ep, par.etp),
                       lambda: tuple(_pieces(arch, stage_tensors(arch, sp), par)))


def expert_pieces(arch: Architecture, sp: StageParameters, par: Parallel) -> tuple[tuple[float, bool, bool], ...]:
    """`trainer_pieces` with whether each is a routed expert's, as this rank holds them under expert parallelism."""
    return arch.cached(("trainer expert pieces", sp.layer_indices, sp.first, sp.last, par.tp, par.ep, par.etp),
                       lambda: tuple(_pieces(arch, stage_tensors(arch, sp), par, expert=True)))


def pieces_made_last(arch: Architecture, sp: StageParameters, par: Parallel) -> int:
    """How many of `trainer_pieces`, first in module order, backward makes at or after the first layer's: the
    embedding's and the first layer's."""
    kinds = arch.layer_kinds()
    first = (arch.embedding_tensors() if sp.first else []) + (arch.layer_tensors(kinds[sp.layer_indices[0]])
                                                             if sp.layer_indices else [])
    return len(_pieces(arch, first, par))


def trainer_groups(arch: Architecture, sp: StageParameters, par: Parallel) -> tuple[tuple, tuple]:
    """(weight-decay tensors, the others): `trainer_pieces` split as the HF Trainer splits them, each in module
    order (trainer.py create_optimizer's two groups)."""
    pieces = trainer_pieces(arch, sp, par)
    return tuple(n for n, decay in pieces if decay), tuple(n for n, decay in pieces if not decay)


def busiest_rank(groups: tuple, d: int) -> float:
    """The most elements of `grads_in_partition` on one of `d` ranks: the rank's overlapping tensors summed over the
    groups, each group partitioned on its own."""
    return max(map(sum, zip(*(rank_overlaps(g, d) for g in groups))), default=0.0)


def with_partition(ms: ModelStates, arch: Architecture, training: Training, recipe: Recipe, par: Parallel,
                   sp: StageParameters, zero: int) -> ModelStates:
    """`ms` with its gradients the busiest rank's `grads_in_partition` where `applies` and the Trainer's groups
    make up the trained parameters (a frozen vision tower, a padded vocabulary: N/dp kept). An adapter run's
    trainable tensors (its adapters' matrices, in module order: deepspeed_offload.trainable_sizes) are one group:
    the Trainer's no-decay group is empty and DeepSpeed drops it (engine.py _configure_optimizer l. 2002), as
    measured (tests/test_deepspeed_partitions.py, a LoRA run over 2 and 4 ranks)."""
    if not applies(training, par, zero):
        return ms
    if training.adapter is not None:
        groups = (trainable_sizes(arch, training, recipe, sp),)
        which = "the adapters' one parameter group"
    else:
        groups, which = trainer_groups(arch, sp, par), "the Trainer's two parameter groups"
    G = bytes_per_element(recipe.grad_dtype)
    if abs(G * sum(map(sum, groups)) / par.dp - ms.gradients) >= 1:
        return ms
    n = arch.cached(("zero2 busiest", sp.layer_indices, sp.first, sp.last, par.tp, par.dp, training.adapter, recipe),
                    lambda: busiest_rank(groups, par.dp))
    text = (f"{G:g} B x {n:,.0f} elements: the whole of every tensor overlapping the busiest GPU's share of each of "
            f"{which}, over {par.dp} ranks ("
            + ("the tensors' own .grad, contiguous_gradients off" if training.contiguous_gradients is False
               else "grads_in_partition")
            + f"; N/d would be {sum(map(sum, groups)) / par.dp:,.0f})")

    def formulas() -> dict[str, str]:
        return {**ms.formulas(), "gradients": text}

    return ms._replace(gradients=G * n, formulas=once(formulas))
