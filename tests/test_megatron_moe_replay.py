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
    assert megatron_replay._shards([order[i] for i in experts], expert_over) == [order[i] for i in experts]


def test_an_moe_layers_forward_in_megatrons_order():
    """The shared experts before the router, the all-to-all's send buffer (phi k s b h x 2 B = 6 x 4096 x 5120 x 2
    = 240 MiB) before the dispatched tokens, held through the experts; the combine: the experts' outputs, their
    unsorted copy (40 local experts) and the returning all-to-all's output, 240 MiB each."""
    cfg = resolved()
    from estimator.memory.stage_shared import _shared

    shared = _shared(cfg.architecture, cfg.training, cfg.parallel, cfg.hardware, cfg.zero_stage, cfg.padded_vocab)
    moe = megatron_moe_replay.moments(cfg, shared, cfg.stages[1])
    assert moe.sent == [240 * MiB] and moe.combine == [240 * MiB] * 3
    # MLA's (40, 40, 12, 4, 512, 2, 128 MiB), the MLP norm's input, the router's input, the shared experts' (48, 24),
    # the router's logits and probabilities (fp32, 5 MiB); then the dispatched tokens and the experts' (240, 144, 72
    # MiB) and the routing weights of the dispatched tokens (6 x 4096 x 2 B: the compute dtype, no router dtype)
    assert [b // MiB for b in moe.before] == [40, 40, 12, 4, 512, 2, 128, 40, 40, 48, 24, 5]
    assert moe.routed == [240 * MiB, 144 * MiB, 72 * MiB, 6 * 4096 * 2]


@pytest.mark.parametrize(("training", "why"), [
    ({"moe_dispatcher": "allgather"}, "an MoE model under the allgather dispatcher"),
    ({"moe_dispatcher": "deepep"}, "an MoE model under the deepep dispatcher"),
    ({"moe_grouped_gemm": False}, "an MoE model without TransformerEngine's grouped GEMM"),
    ({}, None),
])
def test_which_moe_layers_are_replayed(training, why):
    rule = megatron_replay.replay_rule(resolved(**training))
    assert rule == why if why is None else rule.startswith(why)
