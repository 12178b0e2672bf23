"""The NCCL communicators a Megatron-Core training step makes on one rank, by layout: which process groups issue a
collective (or a point-to-point op that gets a communicator of its own) and how many ranks each spans.

torch's ProcessGroupNCCL makes a group's communicator lazily, at its first collective (unless the default group is
bound to a device, init_process_group(device_id=...), which Megatron-LM's initialisation does not pass: the world
of one rank's communicators appear at the step's collectives, the nccl-mechanism record). A point-to-point op:
inside batch_isend_irecv (ncclGroupStart, coalesced) it takes the group's own communicator (ProcessGroupNCCL.cpp
pointToPoint: `batchP2P = ncclActiveGroupCounter_ > 0` -> key = getKeyFromDevice); a single isend/irecv outside a
batch takes a communicator of two ranks per peer pair (key = getKeySendRecv(rank_, peer), p2pRank 0/1), unless the
group was initialised eagerly. Every group below is its own ProcessGroup object (parallel_state.py makes each with
create_group), hence its own communicator, even where two span the same ranks.

Not listed (not charged): groups whose collectives Megatron-Core skips at size 1 (tensor_parallel/mappings.py
`if group.size() == 1: return`; finalize_model_grads.py l. 228: the embedding and position-embedding groups only
above one rank, so the position-embedding group, the first stage alone, never); Megatron-LM's own logging
collectives (the MoE aux-loss tracker's all_reduce over the PP, TP x CP and DP groups, moe_utils.py l. 939-951,
called from Megatron-LM's training_log); TransformerEngine's context-parallel point-to-point exchange, whose
communicators (pairs, or the CP group's when batched) are TE's, not Megatron-Core's; num_distributed_optimizer_instances
above 1 (the estimator has no such field; Megatron's default is 1).
"""

from __future__ import annotations

from typing import NamedTuple

from ..spec.parallel import Parallel

MCORE = "Megatron-Core 0.16.1"
# read in public copies of torch 2.x's torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp (the same branch from 2.0 to
# main, whose eager-init path reuses the group's communicator instead), not at a pinned 2.13 commit: no line numbers
TORCH_P2P = ("torch ProcessGroupNCCL.cpp pointToPoint (single isend/irecv: getKeySendRecv, a 2-rank communicator "
             "per peer pair; inside batch_isend_irecv: getKeyFromDevice, the group's)")


class Communicator(NamedTuple):
    """One NCCL communicator a rank holds: the process group, the ranks it spans, what makes it, the source."""

    group: str
    ranks: int
    why: str
    source: str


def megatron_communicators(par: Parallel, distributed_optimizer: bool, moe: bool = False, tied: bool = False,
                           dispatcher: str = "alltoall") -> tuple[Communicator, ...]:
    """The communicators one rank of a Megatron-Core training step holds (module docstring), each with its size:
    at world size 1 the four the H200 record's NCCL log shows (ONE_RANK_GROUPS). `distributed_optimizer`: the
    distributed optimizer (zero_stage >= 1); `moe`: the model has MoE layers; `tied`: the word embeddings are tied
    to the output layer, on a stage that holds them (the first or the last: the embedding group's ranks,
    parallel_state.py default_embedding_ranks); `dispatcher`: training.moe_dispatcher."""
    world = par.gpus
    comms = [
        Communicator("world", world, "all_gather_object while the optimizer is built",
                     f"{MCORE} optimizer/__init__.py l. 181 (the nccl-mechanism record's collectives)"),
        Communicator("TP", par.tp, "all_reduce in the loss" + (" and the layers' TP collectives" if par.tp > 1 else ""),
                     f"{MCORE} tensor_parallel/cross_entropy.py l. 130, 148, 154; tensor_parallel/mappings.py"),
        Communicator("DP x CP", par.dp * par.cp, "the gradients' reduce_scatter and the parameters' all_gather",
                     f"{MCORE} distributed/param_and_grad_buffer.py start_grad_sync l. 443, start_param_sync l. 285"),
    ]
    if distributed_optimizer:
        # one instance (num_distributed_optimizer_instances 1): the tp-ep-pp groups of every expert-DP rank, the world
        comms.append(Communicator(
            "distributed optimizer instance", world,
            "all_reduce of the gradient norm over grad_stats_parallel_group, the INTRA_DISTRIBUTED_OPTIMIZER_INSTANCE_"
            "GROUP, in every step: ChainedOptimizer.step takes the norm whatever clip_grad",
            f"{MCORE} optimizer/clip_grads.py get_grad_norm_fp32 l. 130, optimizer/optimizer.py l. 1277, 1314, "
            "optimizer/__init__.py l. 459, parallel_state.py l. 1329-1347"))
    else:
        comms.append(Communicator(
            "model-parallel (the gradient norm's)", par.tp * par.pp,
            "all_reduce of the gradient norm over grad_stats_parallel_group = model_parallel_group",
            f"{MCORE} optimizer/clip_grads.py l. 130, optimizer/__init__.py l. 462, 466"))
    if moe:
        comms += _experts(par, distributed_optimizer, dispatcher)
    if par.cp > 1:
        comms.append(Communicator("CP", par.cp, "the attention's context-parallel exchange (TransformerEngine)",
                                  f"{MCORE} extensions/transformer_engine.py l. 1234 (TEDotProductAttention's "
                                  "cp_group)"))
    comms += _pipeline(par)
    if tied and par.pp > 1:
        comms.append(Communicator(
            "embedding (first and last stage)", 2, "all_reduce of the tied word embeddings at the build and of "
            "their gradients in every step", f"{MCORE} models/common/language_module/language_module.py l. 245, "
            "distributed/finalize_model_grads.py l. 228-258, parallel_state.py l. 525-531"))
    return tuple(comms)


def _experts(par: Parallel, distributed_optimizer: bool, dispatcher: str) -> list[Communicator]:
    """The communicators of a stage with MoE layers: the experts' gradient sync over expert DP, the experts'
    gradient norm where its group is not the dense one's, and the dispatcher's (collectives of one rank skipped)."""
    comms = []
    edp = par.expert_data_parallel
    comms.append(Communicator("expert DP", edp, "the experts' gradients' reduce_scatter and parameters' all_gather",
                              f"{MCORE} optimizer/__init__.py l. 675 (intra_expt_dp_group), "
                              "distributed/param_and_grad_buffer.py l. 443, 285"))
    if not distributed_optimizer:  # the experts' optimizer norms over its own group (not the dense one's)
        comms.append(Communicator(
            "expert TP x PP (the experts' gradient norm)", par.etp * par.pp,
            "all_reduce of the experts' gradient norm: the chained optimizers' groups differ, each norms alone",
            f"{MCORE} optimizer/__init__.py l. 674 (expt_tp_pp_group), optimizer/optimizer.py l. 1254-1286"))
    if par.ep * par.etp > 1:  # the dispatchers' collectives, skipped at size 1 (mappings.py)
        comms.append(Communicator("expert TP x EP", par.ep * par.etp,
                                  "the dispatcher's all_gather of token counts (tokens, under 'allgather'; "
                                  "DeepEP's Buffer group under 'deepep')",
                                  f"{MCORE} transformer/moe/token_dispatcher.py l. 265-275, 539-540, 1345"))
    if par.ep > 1 and dispatcher == "alltoall":
        comms.append(Communicator("EP", par.ep, "the tokens' all_to_all",
                                  f"{MCORE} transformer/moe/token_dispatcher.py l. 666-670, 810"))
    if par.etp > 1:
        comms.append(Communicator("expert TP", par.etp, "the experts' gather / reduce_scatter over expert TP",
                                  f"{MCORE} transformer/moe/token_dispatcher.py l. 696-700, 779-781"))
    return comms


def _pipeline(par: Parallel) -> list[Communicator]:
    """PP's communicators. Without interleaving Megatron-LM runs batch_p2p_comm (not overlap_p2p_comm, which it turns
    off without a virtual pipeline; megatron/training/arguments.py core_transformer_config_from_args: batch_p2p_comm
    = not overlap_p2p_comm; Megatron-Core's own ModelParallelConfig defaults batch_p2p_comm True,
    model_parallel_config.py l. 297-302): batch_isend_irecv, coalesced on the PP group's communicator. Interleaved, overlap_p2p_comm is
    Megatron-LM's default: single isend/irecv (p2p_communication.py _p2p_ops), a 2-rank communicator per peer pair;
    the interleaved ring gives every stage both neighbours (the last stage's next is the first); at PP 2 the two
    directions go over the PP group and the world group (l. 66-74), one pair communicator each."""
    if par.pp == 1:
        return []
    if par.vpp == 1:
        return [Communicator("PP", par.pp, "batch_isend_irecv of the activations and their gradients (coalesced)",
                             f"{MCORE} pipeline_parallel/p2p_communication.py l. 48, 353; {TORCH_P2P}")]
    source = f"{MCORE} pipeline_parallel/p2p_communication.py _p2p_ops l. 54-125; {TORCH_P2P}"
    # the same two at every depth (the stage memo shares them across depths: memory._pipeline_key)
    return [Communicator("PP pair (the previous stage)", 2, "isend/irecv outside a batch", source),
            Communicator("PP pair (the next stage)", 2, "isend/irecv outside a batch (at PP 2 the previous stage "
                         "again, over the world group)", source)]
