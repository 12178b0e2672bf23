"""Megatron-Core's NCCL communicators on one rank of a layout of several GPUs (estimator/memory/nccl_groups.py,
stage_shared.megatron_world), by hand: each communicator of several ranks 0.5 GiB (Fujii et al. 2024), each of one
rank the measured 2 + 3 x 64 allocations of 2 MiB (388 MiB, spec/nccl.py), NCCL's kernels 85 x 2 MiB once."""

from __future__ import annotations

import json
from pathlib import Path

from estimator import estimate_config
from estimator.memory.nccl_groups import megatron_communicators
from estimator.memory.stage_shared import ONE_RANK_GROUPS, megatron_world
from estimator.spec.architecture import Architecture
from estimator.spec.parallel import Parallel
from estimator.spec.training import Training

MiB = 2**20
KERNELS = 85 * 2 * MiB  # NCCL's kernels, measured (nccl-world-h200.json: 279 - 194 granules)
SEVERAL = 512 * MiB  # a communicator of several ranks (Fujii et al. 2024)
ONE = 194 * 2 * MiB  # a communicator of one rank: 2 + 3 x 64 allocations, 2 MiB each under cuMem
DENSE = Architecture(hidden_size=1024, num_layers=8, num_attention_heads=16, num_kv_heads=8, vocab_size=32000,
                     intermediate_size=4096)
TIED = Architecture(hidden_size=1024, num_layers=8, num_attention_heads=16, num_kv_heads=8, vocab_size=32000,
                    intermediate_size=4096, tie_embeddings=True)
MOE = Architecture(hidden_size=1024, num_layers=8, num_attention_heads=16, num_kv_heads=4, vocab_size=32000,
                   intermediate_size=2048, num_experts=8, num_experts_per_token=2, moe_intermediate_size=512)


def _groups(par: Parallel, distributed_optimizer: bool = True, **kw) -> list[tuple[str, int]]:
    return [(c.group, c.ranks) for c in megatron_communicators(par, distributed_optimizer, **kw)]


def test_tp8_dp1():
    """TP 8 x DP 1, distributed optimizer: the world (8, the optimizer build's all_gather_object), TP (8), DP x CP of
    one rank (the gradients' reduce_scatter, no size test) and the instance group (the world: the gradient norm):
    170 + 3 x 512 + 388 = 2,094 MiB. Without the distributed optimizer the norm's group is TP x PP = 8: the same."""
    par = Parallel(tp=8)
    assert _groups(par) == [("world", 8), ("TP", 8), ("DP x CP", 1), ("distributed optimizer instance", 8)]
    assert _groups(par, False)[-1] == ("model-parallel (the gradient norm's)", 8)
    for zero in (1, 0):  # the formula below: zero_stage 0
        c = megatron_world(Training(), par, zero, DENSE)
        assert c.bytes == KERNELS + 3 * SEVERAL + ONE == 2094 * MiB
    assert c.formula == ("NCCL kernels 170 MiB + 0.5 GiB x 3 communicators (world, TP, model-parallel (the "
                         "gradient norm's)) + 1 of one rank x 388.0 MiB (DP x CP) = 2,094.0 MiB")
    assert [p.bytes for p in c.parts] == [KERNELS] + 3 * [SEVERAL] + [ONE]


def test_tp2_pp4_vpp2_dp4_distributed_optimizer():
    """TP 2 x PP 4 x VPP 2 x DP 4 (32 GPUs), distributed optimizer: world 32, TP 2, DP x CP 4, the instance group 32
    and, interleaved (Megatron-LM's overlap_p2p_comm: single isend/irecv), one 2-rank communicator per neighbour:
    the previous and the next stage (the ring: the last stage's next is the first): 170 + 6 x 512 = 3,242 MiB.
    Without interleaving (batch_p2p_comm) the activations go over the PP group's own communicator: 170 + 5 x 512.
    At PP 2 the two directions take the PP group and the world group (p2p_communication.py l. 66-74)."""
    par = Parallel(tp=2, pp=4, vpp=2, dp=4)
    assert _groups(par) == [("world", 32), ("TP", 2), ("DP x CP", 4), ("distributed optimizer instance", 32),
                            ("PP pair (the previous stage)", 2), ("PP pair (the next stage)", 2)]
    assert megatron_world(Training(), par, 1, DENSE).bytes == KERNELS + 6 * SEVERAL == 3242 * MiB
    batched = Parallel(tp=2, pp=4, dp=4)
    assert _groups(batched)[4:] == [("PP", 4)]
    assert megatron_world(Training(), batched, 1, DENSE).bytes == KERNELS + 5 * SEVERAL == 2730 * MiB
    assert _groups(Parallel(tp=2, pp=2, vpp=2, dp=4))[4:] == [("PP pair (the previous stage)", 2),
                                                              ("PP pair (the next stage)", 2)]
    assert "over the world group" in megatron_communicators(par, True)[-1].why


def test_ep8_moe():
    """EP 8 x DP 8 MoE, the all-to-all dispatcher, distributed optimizer, on a stage with MoE layers: world 8, TP of
    one rank, DP x CP 8, the instance group 8, expert DP of one rank (8 / (EP 8 x ETP 1)), the dispatcher's expert
    TP x EP 8 (its token counts' all_gather) and EP 8 (the all_to_all): 170 + 5 x 512 + 2 x 388 = 3,506 MiB. A stage
    without MoE layers holds the first four: 170 + 3 x 512 + 388 = 2,094 MiB."""
    par = Parallel(dp=8, ep=8)
    assert _groups(par, moe=True) == [("world", 8), ("TP", 1), ("DP x CP", 8), ("distributed optimizer instance", 8),
                                      ("expert DP", 1), ("expert TP x EP", 8), ("EP", 8)]
    assert megatron_world(Training(), par, 1, MOE, moe_stage=True).bytes == \
        KERNELS + 5 * SEVERAL + 2 * ONE == 3506 * MiB
    assert megatron_world(Training(), par, 1, MOE).bytes == KERNELS + 3 * SEVERAL + ONE == 2094 * MiB
    # without the distributed optimizer the experts' optimizer norms over expert TP x PP (one rank here) apart
    assert _groups(par, False, moe=True)[3:6] == [("model-parallel (the gradient norm's)", 1), ("expert DP", 1),
                                                  ("expert TP x PP (the experts' gradient norm)", 1)]
    # DeepEP's flex dispatcher: TP x EP only (its Buffer's group), no all_to_all over EP
    assert ("EP", 8) not in _groups(par, moe=True, dispatcher="deepep")


def test_tied_embeddings_under_pp():
    """PP 2 x TP 1 x DP 1 with tied embeddings (batch_p2p_comm): world 2, TP and DP x CP of one rank, the instance
    group 2, PP 2 and the embedding group of the first and last stage (2: the tied weights' all_reduce at the build
    and their gradients' in every step): 170 + 4 x 512 + 2 x 388 = 2,994 MiB; untied, or on a middle stage, no
    embedding group: 2,482 MiB. The position-embedding group is the first stage alone, skipped
    (finalize_model_grads.py: size > 1 only). In an estimate at PP 4 the first and last stages hold it."""
    par = Parallel(pp=2)
    assert _groups(par, tied=True)[-1] == ("embedding (first and last stage)", 2)
    assert megatron_world(Training(), par, 1, TIED).bytes == KERNELS + 4 * SEVERAL + 2 * ONE == 2994 * MiB
    assert megatron_world(Training(), par, 1, DENSE).bytes == KERNELS + 3 * SEVERAL + 2 * ONE == 2482 * MiB
    assert megatron_world(Training(), par, 1, TIED, edge_stage=False).bytes == 2482 * MiB
    assert _groups(Parallel(tp=2), tied=True)[-1] == ("distributed optimizer instance", 2)  # no PP: none
    result = estimate_config({"model": "llama-3.2-1b", "parallel": {"pp": 4}, "training": {"seq_len": 1024}})
    assert [s.component("communication").bytes for s in result.stages] == \
        [KERNELS + 4 * SEVERAL + 2 * ONE, KERNELS + 3 * SEVERAL + 2 * ONE, KERNELS + 3 * SEVERAL + 2 * ONE,
         KERNELS + 4 * SEVERAL + 2 * ONE]


def test_one_rank_world_is_the_same_list_at_world_size_one():
    """At world size 1 the list is the four groups the H200 record's NCCL log counts (ONE_RANK_GROUPS) and the charge
    the measured 85 + 4 x 194 granules = 1,722 MiB, as before."""
    assert [(g, w, s) for g, w, s in ONE_RANK_GROUPS["megatron"]] == \
        [(c.group, c.why, c.source) for c in megatron_communicators(Parallel(), True)]
    c = megatron_world(Training(), Parallel(), 1, DENSE)
    assert c.bytes == KERNELS + 4 * ONE == 1722 * MiB and c.label == "NCCL world of one rank (megatron)"


def test_an_estimate_charges_them():
    """The H200 Megatron record's configuration (Llama-3.1-8B, 4 layers) at TP 8: 2,094 MiB of communication; at
    TP 2 x PP 2 x DP 2 (batch_p2p_comm, untied): world 8, TP 2, DP x CP 2, the instance group 8, PP 2: 170 + 5 x 512
    = 2,730 MiB on every stage. Other frameworks keep 0.5 GiB per group of several ranks (DeepSpeed at DP 8: DP)."""
    path = Path(__file__).parent / "data/measured/gpu/megatron/megatron-llama-3.1-8b-tp1-pp1-only-s4096-b1-unfused" \
                                   "-4layers.json"
    run = json.loads(path.read_text())
    for layout, expected in (({"tp": 8}, 2094 * MiB), ({"tp": 2, "pp": 2, "dp": 2}, 2730 * MiB)):
        config = json.loads(json.dumps(run["config"]))
        config["parallel"].update(layout)
        config["training"]["global_batch_size"] = layout.get("dp", 1) * 2
        result = estimate_config(config)
        assert {s.component("communication").bytes for s in result.stages} == {expected}, layout
    deepspeed = estimate_config({"model": "llama-3.2-1b", "training": {"framework": "deepspeed"},
                                 "parallel": {"dp": 8, "zero_stage": 3}})
    assert deepspeed.stages[0].component("communication").bytes == SEVERAL
