"""Megatron-Core's MoE and MLA layers in the allocator replay (megatron_replay.py): where the expert parameters live
and who steps them, and the order an MoE or MLA layer allocates in.

- The model: TransformerEngine's GroupedLinear (Megatron-Core 0.16.1 transformer/moe/experts.py TEGroupedMLP over
  extensions/transformer_engine.py TEGroupedLinear; TE pytorch/module/grouped_linear.py registers `weight{i}`, one
  parameter per local expert) holds each of the rank's num_experts / EP experts' fc1 and fc2 as tensors of their own,
  each split over expert-TP. The legacy GroupedMLP (experts.py GroupedMLP, `--moe-use-legacy-grouped-gemm`) holds
  weight1 and weight2, one parameter each for all the local experts (split over expert-TP); its forward makes what
  TEGroupedMLP's does (grouped_gemm's gmm outputs, the fused weighted activation's output), and its gmm returns the
  weights' gradients to DDP's hooks whatever gradient-accumulation fusion says (megatron_replay.py `_Walk`).
- DDP (distributed/distributed_data_parallel.py `__init__`): the dense parameters' buffers first
  (`self.buffers`, over the data-parallel x context-parallel group), then the expert parameters' own
  (`self.expert_parallel_buffers`, over the expert-data-parallel group); each `_ParamAndGradBuffer` makes its
  `param_data`, its `grad_data`, then frees its parameters' own storage.
- The optimizer (optimizer/__init__.py `get_megatron_optimizer`): a ChainedOptimizer of the dense parameters'
  distributed optimizer (sharded over data-parallel x context-parallel) and then the expert parameters' (sharded over
  the expert-data-parallel group, (TP x CP x DP) / (EP x expert-TP)); their main parameters made in that order.
- A layer's forward (`plan`): the ledger's tensors (activations/attention.py, mlp.py) and the MoE moments
  (moe_moments.py) in Megatron-Core's order: MLA's up-projections and fused RoPE, the MoE layer's shared experts,
  router, all-to-all dispatch, experts and combine.
On SimuMax's four DeepSeek-V2/V3 B200 runs (tests/test_published_megatron_reserved.py) the replay is 0.15% under to
0.3% over (the flat share: 4.5% to 7.0% over). It follows the allocated ledger, so that its tensors are the allocated
peak's, and that ledger follows Megatron's order too: the combine's moment comes before the loss makes the logits
(moe_moments.py combine_before_the_loss), and TE's GroupedLinear under gradient-accumulation fusion writes the experts'
weight gradients into main_grad (activations/moe.py TE_GROUPED_LINEAR: DeepSeek-V3's 1,792 MiB fc2 weight gradient
is made only without the fusion). Before both the replay was 1.0% to 2.3% over.
"""

from __future__ import annotations

from typing import NamedTuple

from ..spec.tensors import EXPERT_COLUMN, EXPERT_ROW
from .reserved_layers import requests

SOURCE = ("Megatron-Core 0.16.1 distributed/distributed_data_parallel.py (expert_parallel_buffers), "
          "optimizer/__init__.py (get_megatron_optimizer: ChainedOptimizer), transformer/moe/experts.py "
          "(TEGroupedMLP; GroupedMLP's weight1, weight2), transformer/moe/moe_layer.py (MoELayer.forward), "
          "transformer/moe/token_dispatcher.py "
          "(MoEAlltoAllTokenDispatcher), transformer/multi_latent_attention.py (qkv_up_proj_and_rope_apply), "
          "fusions/fused_mla_yarn_rope_apply.py; TransformerEngine pytorch/module/grouped_linear.py (weight{i} per "
          "local expert) (estimator/memory/megatron_moe_replay.py)")


class ExpertShard(float):
    """One local expert's weight on this rank, its elements: DDP keeps it in the expert buffers and the expert
    optimizer steps it."""


def expert_shards(t, par, legacy: bool = False) -> list[float]:
    """An expert tensor (EXPERT_COLUMN/EXPERT_ROW: `copies` experts) as the rank's own parameters: num_experts / EP
    of them, each split over expert-TP (TE GroupedLinear's weight{i}); `legacy`: the legacy GroupedMLP's one
    parameter for all of them (experts.py GroupedMLP.__init__: weight1 [h, local experts x ffn (x 2 gated) / ETP],
    weight2 [local experts x ffn / ETP, h])."""
    assert t.split in (EXPERT_COLUMN, EXPERT_ROW)
    local = max(1, t.copies // par.ep)
    each = t.numel / t.copies / par.etp
    return [ExpertShard(local * each)] if legacy else [ExpertShard(each)] * local


def groups(cfg, order: list[float]) -> list[tuple[list[int], int]]:
    """The parameters' positions in `order` by DDP buffer, each with the ranks its optimizer shards over: the dense
    ones over DP x CP, then the experts' over the expert-data-parallel group (none where there are no experts)."""
    par = cfg.parallel
    dense = [i for i, n in enumerate(order) if not isinstance(n, ExpertShard)]
    experts = [i for i, n in enumerate(order) if isinstance(n, ExpertShard)]
    return [(dense, par.dp * par.cp)] + ([(experts, par.expert_data_parallel)] if experts else [])


def moe_rule(cfg) -> str | None:
    """Why an MoE model is not replayed (None: it is, or there is no MoE): the all-to-all dispatcher over
    TransformerEngine's grouped GEMM, as SimuMax's B200 runs measured it (tests/test_published_megatron_reserved.py),
    its experts TE's GroupedLinear or the legacy GroupedMLP (tests/test_megatron_legacy_grouped_gemm.py)."""
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


QKV = "q, k, v kept by flash attention"  # activations/attention.py's entry; the names' starts below, mlp.py's
ROUTER = "router logits and probabilities"
DISPATCHED = "dispatched tokens"
ROUTED = ("experts", "expert outputs", "routing weights", DISPATCHED)
SHARED = "shared experts:"
SENT = "permuted tokens sent by the all-to-all"  # moe_moments.py's combine moment: its first part with EP

KEEP, HOLD, RELEASE, MOMENT = "keep", "hold", "release", "moment"  # a Plan's steps


class Plan(NamedTuple):
    """A layer's forward as the replay runs it: its first `start` requests made and kept as they come (the ledger's
    order), then `steps`: (KEEP, bytes) made and kept for backward, (HOLD, bytes) made and held to the next
    (RELEASE,), (MOMENT, [bytes]) made together and freed. `backward`: the experts' backward moment of an MoE layer,
    made and freed where the walk reaches the layer's last expert weight (TE `_GroupedLinear.backward`)."""

    start: int
    steps: tuple
    backward: tuple = ()


def plans(cfg, shared, sp) -> dict:
    """The plans of the stage's layer kinds that have MLA's or an MoE block's allocations (`plan`)."""
    kinds = {kind for kind, n in sp.kind_counts if n}
    out = {kind: plan(cfg, shared, sp, kind) for kind in kinds}
    return {kind: p for kind, p in out.items() if p is not None}


def plan(cfg, shared, sp, kind: str) -> Plan | None:
    """A layer's plan (None: the ledger's order as it is). MLA (multi_latent_attention.py `qkv_up_proj_and_rope_apply`,
    Megatron-LM's default --rope-fusion): q up-projected (linear_q_up_proj), RoPE applied in place
    (fused_apply_mla_rope_for_q); kv up-projected (linear_kv_up_proj), then the key and the value made by
    fused_apply_mla_rope_for_kv, the up-projection's output freed as the function returns. An MoE layer
    (moe_layer.py MoELayer.forward `custom_forward`): the shared experts first (`shared_experts_compute`), the router
    (`route`), the permute of the tokens to send (`preprocess`: token_dispatcher.py dispatch_preprocess; TE's fused
    permute with --moe-permute-fusion), held until the layer returns, the all-to-all into the dispatched tokens
    (`dispatch`), the experts (`routed_experts_compute`), then the combine (combine_preprocess's unsort copy and the
    returning all-to-all's output beside the experts' outputs: moe_moments.py's moment)."""
    from .activations.recompute import dropped

    entries = [e for e in shared.entries[kind] if not dropped(e, shared.recomputed)]
    names = [e.name for e in entries]
    mla = cfg.architecture.uses_mla and QKV in names
    router = next((k for k, name in enumerate(names) if name.startswith(ROUTER)), None) if kind == "moe" else None
    if not mla and router is None:
        return None
    first = names.index(QKV) if mla else router
    order = entries[first:]
    sent, combine, backward = _moments(cfg, sp) if router is not None else ([], [], [])
    if router is not None:  # the shared experts' tensors before the router's
        ours = [e for e in order if e.name.startswith(SHARED)]
        order = [e for e in order if not e.name.startswith(SHARED)]
        at = next(k for k, e in enumerate(order) if e.name.startswith(ROUTER))
        order = order[:at] + ours + order[at:]
        last = max(k for k, e in enumerate(order) if e.name.startswith(ROUTED + (SHARED,)))
    steps: list = []
    for k, e in enumerate(order):
        if mla and e.name == QKV:
            steps += _mla_steps(cfg.architecture, e.bytes(shared.parallel))
            continue
        if router is not None and e.name.startswith(DISPATCHED):
            steps += [(HOLD, b) for b in sent]
        steps += [(KEEP, b) for b in requests([e], shared.parallel)]
        if router is not None and k == last:
            steps += [(MOMENT, tuple(combine))] + ([(RELEASE,)] if sent else [])
    return Plan(len(requests(entries[:first], shared.parallel)), tuple(steps), tuple(backward))


def _mla_steps(arch, qkv: float) -> list:
    """MLA's q, k and v (the ledger's one entry, `qkv` bytes: a*(d_nope + d_rope) + a*(d_nope + d_rope) + a*d_v
    per token) and the kv up-projection's output (a*(d_nope + d_v) per token) between them."""
    a, nope, v_dim = arch.num_attention_heads, arch.qk_nope_head_dim, arch.v_head_dim
    per = qkv / (2 * arch.q_width + a * v_dim)  # bytes per element of one token's widths
    return [(KEEP, per * arch.q_width), (HOLD, per * a * (nope + v_dim)), (KEEP, per * arch.q_width),
            (KEEP, per * a * v_dim), (RELEASE,)]


def _moments(cfg, sp) -> tuple[list, list, list]:
    """moe_moments.py's MoE moments as bytes: the all-to-all's send buffer, the rest of the combine, the experts'
    backward."""
    from .moe_moments import moe_moments

    forward, backward, _ = moe_moments(cfg.architecture, cfg.training, cfg.parallel, sp)
    return ([c.bytes for c in forward if c.label.startswith(SENT)],
            [c.bytes for c in forward if not c.label.startswith(SENT)], [c.bytes for c in backward])


def made(program, plan: Plan, sizes: list[int], offset: int) -> list:
    """A layer's requests from index `offset` of its own (`sizes`: those left) made by its plan: what it keeps."""
    out = program.many(sizes[:max(0, plan.start - offset)])
    held: list = []
    for step in plan.steps:
        if step[0] == KEEP:
            out.append(program.alloc(step[1]))
        elif step[0] == HOLD:
            held.append(program.alloc(step[1]))
        elif step[0] == MOMENT:
            program.transient(step[1])
        else:
            program.free(*held)
            held = []
    return out
