"""Megatron-Core's MoE layers in the allocator replay (megatron_replay.py): where the expert parameters live and who
steps them.

- The model: TransformerEngine's GroupedLinear (Megatron-Core 0.16.1 transformer/moe/experts.py TEGroupedMLP over
  extensions/transformer_engine.py TEGroupedLinear; TE pytorch/module/grouped_linear.py registers `weight{i}`, one
  parameter per local expert) holds each of the rank's num_experts / EP experts' fc1 and fc2 as tensors of their own,
  each split over expert-TP.
- DDP (distributed/distributed_data_parallel.py `__init__`): the dense parameters' buffers first
  (`self.buffers`, over the data-parallel x context-parallel group), then the expert parameters' own
  (`self.expert_parallel_buffers`, over the expert-data-parallel group); each `_ParamAndGradBuffer` makes its
  `param_data`, its `grad_data`, then frees its parameters' own storage.
- The optimizer (optimizer/__init__.py `get_megatron_optimizer`): a ChainedOptimizer of the dense parameters'
  distributed optimizer (sharded over data-parallel x context-parallel) and then the expert parameters' (sharded over
  the expert-data-parallel group, (TP x CP x DP) / (EP x expert-TP)); their main parameters made in that order.
"""

from __future__ import annotations

from ..spec.tensors import EXPERT_COLUMN, EXPERT_ROW

SOURCE = ("Megatron-Core 0.16.1 distributed/distributed_data_parallel.py (expert_parallel_buffers), "
          "optimizer/__init__.py (get_megatron_optimizer: ChainedOptimizer), transformer/moe/experts.py "
          "(TEGroupedMLP); TransformerEngine pytorch/module/grouped_linear.py (weight{i} per local expert)")


class ExpertShard(float):
    """One local expert's weight on this rank, its elements: DDP keeps it in the expert buffers and the expert
    optimizer steps it."""


def expert_shards(t, par) -> list[float]:
    """An expert tensor (EXPERT_COLUMN/EXPERT_ROW: `copies` experts) as the rank's own parameters: num_experts / EP
    of them, each split over expert-TP (TE GroupedLinear's weight{i})."""
    assert t.split in (EXPERT_COLUMN, EXPERT_ROW)
    local = max(1, t.copies // par.ep)
    each = t.numel / t.copies / par.etp
    return [ExpertShard(each)] * local


def groups(cfg, order: list[float]) -> list[tuple[list[int], int]]:
    """The parameters' positions in `order` by DDP buffer, each with the ranks its optimizer shards over: the dense
    ones over DP x CP, then the experts' over the expert-data-parallel group (none where there are no experts)."""
    par = cfg.parallel
    dense = [i for i, n in enumerate(order) if not isinstance(n, ExpertShard)]
    experts = [i for i, n in enumerate(order) if isinstance(n, ExpertShard)]
    return [(dense, par.dp * par.cp)] + ([(experts, par.expert_data_parallel)] if experts else [])


def moe_rule(cfg) -> str | None:
    """Why an MoE model is not replayed (None: it is, or there is no MoE): the all-to-all dispatcher over
    TransformerEngine's grouped GEMM, as SimuMax's B200 runs measured it (tests/test_published_megatron_reserved.py)."""
    arch, training = cfg.architecture, cfg.training
    if not arch.is_moe:
        return None
    checks = (
        (training.moe_dispatcher != "alltoall",
         f"an MoE model under the {training.moe_dispatcher} dispatcher (the all-to-all one is replayed)"),
        (not training.moe_grouped_gemm or training.transformer_impl != "transformer_engine",
         "an MoE model without TransformerEngine's grouped GEMM (its expert parameters are laid out otherwise)"),
    )
    return next((why for failed, why in checks if failed), None)
