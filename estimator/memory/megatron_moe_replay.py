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

from typing import NamedTuple

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


SENT = "permuted tokens sent by the all-to-all"  # moe_moments.py's combine moment: its first part with EP
ROUTER = "router logits and probabilities"  # activations/moe.py's entries (their names' starts)
DISPATCHED = "dispatched tokens"
SHARED = "shared experts:"


class Moments(NamedTuple):
    """An MoE layer in the replay, as requests: its kept tensors in Megatron's order (`made`), the all-to-all's send
    buffer, the end of its forward (the combine) and its experts' backward; the tensors are the ledger's and the
    allocated peak's (moe_moments.py)."""

    before: list[int]  # the attention's and the pre-MLP norm's, then the shared experts', then the router's logits
    routed: list[int]  # from the dispatched tokens on: the routed experts'
    sent: list[float]
    combine: list[float]
    backward: list[float]


def moments(cfg, shared, sp) -> Moments | None:
    """The MoE layer's requests (None: the stage has none). Forward (Megatron-Core 0.16.1 moe_layer.py
    MoELayer.forward `custom_forward`): the shared experts first (`shared_experts_compute`), then the router
    (`route`), the permute of the tokens to send (`preprocess`: token_dispatcher.py dispatch_preprocess,
    moe_utils.permute; TE's fused permute with --moe-permute-fusion), held until the layer returns, the all-to-all
    into the dispatched tokens (`dispatch`), the experts (`routed_experts_compute`), then the combine
    (combine_preprocess's unsort copy and the returning all-to-all's output beside the experts' outputs), all freed
    as the layer returns. Backward: the combine's backward, then the grouped GEMMs' (TE GroupedLinear
    `_GroupedLinear.backward`) where the walk reaches the layer's last expert weight."""
    from .activations.recompute import dropped
    from .moe_moments import moe_moments
    from .reserved import _requests, _sizes

    if not any(kind == "moe" for kind, n in sp.kind_counts if n):
        return None
    entries = [e for e in shared.entries["moe"] if not dropped(e, shared.recomputed)]

    def requests(chosen) -> list[int]:
        return _requests(_sizes(chosen, shared.parallel))

    names = [e.name for e in entries]
    # the pre-MLP norm's output (the router's input) is the shared experts' input too: made before both
    router = next(k for k, name in enumerate(names) if name.startswith(ROUTER))
    routed = next(k for k, name in enumerate(names) if name.startswith(DISPATCHED))
    ours = [e for e in entries if e.name.startswith(SHARED)]
    rest = [e for e in entries[routed:] if not e.name.startswith(SHARED)]
    forward, backward, _ = moe_moments(cfg.architecture, cfg.training, cfg.parallel, sp)
    sent = [c.bytes for c in forward if c.label.startswith(SENT)]
    return Moments(requests(entries[:router]) + requests(ours) + requests(entries[router:routed]), requests(rest),
                   sent, [c.bytes for c in forward if not c.label.startswith(SENT)], [c.bytes for c in backward])


def made(program, moe: Moments) -> list:
    """An MoE layer's forward (`moments`): what it keeps, in order."""
    out = program.many(moe.before)
    sent = [program.alloc(b) for b in moe.sent]
    out += program.many(moe.routed)
    program.transient(moe.combine)
    program.free(*sent)
    return out
