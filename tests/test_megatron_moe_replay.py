"""Megatron-Core's MoE layers in the allocator replay (estimator/memory/megatron_moe_replay.py), against numbers
worked by hand from SimuMax's DeepSeek-V2 B200 run (tests/data/measured/published/simumax_b200: 160 experts over
EP 4, TP 1, DP 4, PP 2, h 5120, expert FFN 1536, shared FFN 3072, top-6, s 4096, b 1, bf16); its accuracy is held by
tests/test_published_megatron_reserved.py."""

from __future__ import annotations

import dataclasses

import pytest

from estimator.memory import megatron_moe_replay, megatron_replay
from estimator.memory.resolved import resolve
from estimator.models.loading import load_config
from validation.published_megatron.replay import imported, records

MiB = 2**20
RUN = "deepseekv2_tp1_ep4_pp2_dp4_l4_mbc4_cef"


def resolved(**training):
    record = next(r for r in records("simumax_b200") if r["id"] == RUN)
    cfg = load_config(imported(record).config)
    return resolve(cfg.architecture, dataclasses.replace(cfg.training, **training), cfg.parallel, cfg.hardware)


def test_an_moe_layers_parameters_are_megatrons_modules():
    """The last stage's MoE layer: MLA's down and up projections and their norms, the output projection, the two
    norms, the router (160 x 5120), then TE GroupedLinear's weight{i}: 160 / EP 4 = 40 local experts' fc1 (2 x 1536
    x 5120) and as many fc2 (5120 x 1536), each a parameter of its own in the expert buffers, then the shared
    experts' fc1 (2 x 3072 x 5120) and fc2 (5120 x 3072)."""
    cfg = resolved()
    _, layers, _ = megatron_replay.rank_tensors(cfg, cfg.stages[1])
    moe = layers[-1]
    mla = [1536 * 5120, 1536, 24576 * 1536, 576 * 5120, 512, 32768 * 512, 5120 * 16384, 5120, 5120]
    assert moe == mla + [160 * 5120] + [3072 * 5120] * 40 + [5120 * 1536] * 40 + [6144 * 5120, 5120 * 3072]
    experts = [n for n in moe if isinstance(n, megatron_moe_replay.ExpertShard)]
    assert len(experts) == 80


def test_the_expert_parameters_take_buffers_and_an_optimizer_of_their_own():
    """DDP's dense buffers over DP x CP = 4, then the expert buffers over the expert-data-parallel group:
    (TP 1 x CP 1 x DP 4) / (EP 4 x ETP 1) = 1, so this rank's expert optimizer steps the
    stage's two MoE layers' 80 expert weights each whole."""
    cfg = resolved()
    embedding, layers, head = megatron_replay.rank_tensors(cfg, cfg.stages[1])
    order = embedding + [n for layer in layers for n in layer] + head
    (dense, over), (experts, expert_over) = megatron_moe_replay.groups(cfg, order)
    assert (over, expert_over) == (4, 1)
    assert len(experts) == 2 * 80 and sorted(dense + experts) == list(range(len(order)))
    assert megatron_replay._shards([order[i] for i in experts], expert_over) == [order[i] for i in reversed(experts)]


def test_an_moe_layers_forward_in_megatrons_order():
    """The last stage's MoE layer: the attention's first four tensors as the ledger has them (norm input, QKV
    projection input, compressed q and kv: 40, 40, 12, 4 MiB), then MLA's up-projections: q (a*(d_nope + d_rope) =
    128 x 192 per token: 4096 x 24576 x 2 B = 192 MiB), the kv up-projection's output held (128 x (128 + 128):
    256 MiB) while fused RoPE makes k (192 MiB) and v (128 x 128: 128 MiB); the flash LSE (4 x 4096 x 128: 2 MiB),
    the attention output (128 MiB), the pre-MLP norm's and router's inputs (40 MiB each); the shared experts (fc1's
    gate and up 2 x 3072 x 4096 x 2 B = 48 MiB, fc2's input 24 MiB) before the router's fp32 logits and probabilities
    (2 x 4 x 4096 x 160 = 5 MiB); the all-to-all's send buffer held (phi k s b h x 2 B = 6 x 4096 x 5120 x 2 =
    240 MiB), the dispatched tokens (240 MiB), the experts' fc1 output (2 x 6 x 4096 x 1536 x 2 B = 144 MiB), fc2's
    input (72 MiB), the routing weights (6 x 4096 x 2 B); the combine: the experts' outputs, their copy unsorted by
    local expert (40 local experts) and the returning all-to-all's output, 240 MiB each; the send buffer released.
    The experts' backward: the outputs' gradient (240 MiB) and fc2's input gradient (72 MiB); TE's GroupedLinear
    under gradient-accumulation fusion (the run's default) writes the weight gradient into main_grad, where without
    the fusion the 40 local experts' fc2 weight gradient (40 x 1536 x 5120 x 2 B = 600 MiB) is made beside them."""
    from estimator.memory.stage_shared import _shared
    from estimator.memory.megatron_moe_replay import HOLD, KEEP, MOMENT, RELEASE

    cfg = resolved()
    shared = _shared(cfg.architecture, cfg.training, cfg.parallel, cfg.hardware, cfg.zero_stage, cfg.padded_vocab)
    plan = megatron_moe_replay.plan(cfg, shared, cfg.stages[1], "moe")
    assert plan.start == 4
    assert [in_mib(step) for step in plan.steps] == [(KEEP, 192), (HOLD, 256), (KEEP, 192), (KEEP, 128), (RELEASE,), (KEEP, 2), (KEEP, 128),
                   (KEEP, 40), (KEEP, 40), (KEEP, 48), (KEEP, 24), (KEEP, 5), (HOLD, 240), (KEEP, 240), (KEEP, 144),
                   (KEEP, 72), (KEEP, 6 * 4096 * 2 / MiB), (MOMENT, (240, 240, 240)), (RELEASE,)]
    assert [b / MiB for b in plan.backward] == [240, 72]
    unfused = resolved(gradient_accumulation_fusion=False)
    plan = megatron_moe_replay.plan(unfused, shared, unfused.stages[1], "moe")
    assert [b / MiB for b in plan.backward] == [240, 72, 600]


def in_mib(step: tuple) -> tuple:
    kind, *sizes = step
    if kind == megatron_moe_replay.MOMENT:
        return kind, tuple(b / MiB for b in sizes[0])
    return (kind, *(b / MiB for b in sizes))


def test_a_plan_keeps_what_the_ledger_keeps():
    """Each layer kind's plan keeps the ledger's bytes, no more and no fewer (MLA's q, k, v split in three)."""
    from estimator.memory.reserved_layers import requests
    from estimator.memory.stage_shared import _shared
    from estimator.memory.megatron_moe_replay import KEEP

    cfg = resolved()
    shared = _shared(cfg.architecture, cfg.training, cfg.parallel, cfg.hardware, cfg.zero_stage, cfg.padded_vocab)
    for kind in ("dense", "moe"):
        plan = megatron_moe_replay.plan(cfg, shared, cfg.stages[0], kind)
        ledger = requests(shared.entries[kind], shared.parallel)
        kept = sum(ledger[:plan.start]) + sum(step[1] for step in plan.steps if step[0] == KEEP)
        assert kept == pytest.approx(sum(ledger), abs=len(ledger))


@pytest.mark.parametrize(("training", "why"), [
    ({"moe_dispatcher": "allgather"}, "an MoE model under the allgather dispatcher"),
    ({"moe_dispatcher": "deepep"}, "an MoE model under the deepep dispatcher"),
    ({"moe_grouped_gemm": False}, "an MoE model without TransformerEngine's grouped GEMM"),
    ({}, None),
])
def test_which_moe_layers_are_replayed(training, why):
    rule = megatron_replay.replay_rule(resolved(**training))
    assert rule == why if why is None else rule.startswith(why)


def test_the_component_cites_the_moe_replay():
    from estimator import estimate_config

    record = next(r for r in records("simumax_b200") if r["id"] == RUN)
    for stage in estimate_config(imported(record).config).stages:
        source = stage.component("fragmentation").source
        assert "megatron_replay.py" in source and "megatron_moe_replay.py" in source
