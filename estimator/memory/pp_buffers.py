"""What torch.distributed.pipelining (torchtitan's pipeline parallelism, framework fsdp2 with PP > 1)
holds per micro-batch beyond the layers' saved tensors, on each of a rank's pipeline stages (one per
virtual chunk under interleaved schedules):

- gradient receive buffers: `_prepare_backward_infra` makes one buffer of the stage output's shape for
  every micro-batch of the step (`_create_grad_recv_info`, `_make_tensor_from_meta`) on every stage but
  the last; they live as long as the stage (`grad_recv_info`);
- the stage outputs: `forward_one_chunk` appends each micro-batch's output to `output_chunks`, which the
  schedule clears only when the next step starts (`clear_runtime_states`). Before pytorch#153383
  (merged 2025-05-13) every stage did; from it only the last, whose output is the head's logits (the
  loss runs in the schedule, outside the stage: bf16, vocabulary-sharded under loss_parallel).
The forward phase of the last stage counts the running micro-batch's logits twice (here and as the
loss's working copy); its peak, in backward, does not. The activation receive buffers and their ``.grad``
depend on the rank's micro-batches in flight: memory/pp_receive.py, added stage by stage.
"""

from __future__ import annotations

from .activations.entries import tokens_per_gpu
from ..spec.architecture import Architecture
from .components import Component, component
from ..spec.dtypes import bytes_per_element
from ..spec.parallel import Parallel
from .sharding import StageParameters
from .titan_releases import titan_rules
from ..spec.training import Training

PIPELINING_SOURCE = ("torch 2.6.0 (the release branch of the Dec 2024 benchmarks' torch 1963fc83) and torch 2.13 "
                     "distributed/pipelining/stage.py (_prepare_backward_infra -> _create_grad_recv_info, one "
                     "buffer per micro-batch; forward_one_chunk appends every stage's output to output_chunks, 2.6 "
                     "line 703) and schedules.py (clear_runtime_states at a step's start); pytorch#153383 (merged "
                     "2025-05-13) kept the last stage's only; torchtitan 9dec370 "
                     "parallelisms/pipeline_llama.py (a PipelineStage per model chunk) and parallelize_llama.py "
                     "apply_tp (stage outputs are local sequence-parallel shards; the head "
                     "ColwiseParallel(output_layouts=Shard(-1)) under loss_parallel)")


def pipelining_buffers(arch: Architecture, training: Training, par: Parallel, stage: StageParameters,
                       microbatches: int) -> list[Component]:
    """The per-micro-batch buffers of the rank's pipeline stages (see the module's note), fsdp2 with PP."""
    rules = titan_rules(training)
    if rules is None or par.pp == 1 or training.mode != "training" or not stage.chunks:
        return []
    B, m, t = bytes_per_element(training.compute_dtype), microbatches, par.tp
    T = tokens_per_gpu(training, par)
    hidden, hf = stage_input(arch, training, par)
    sending = len(stage.chunks) - (1 if stage.last else 0)  # the rank's stages with a successor
    out: list[Component] = []
    if sending:
        out.append(component("buffers", "Pipeline gradient receive buffers (one per micro-batch)",
                             sending * m * hidden, f"{m} micro-batches x {hf}" + (f" x {sending} stages"
                                                                                  if sending > 1 else ""),
                             PIPELINING_SOURCE))
    kept = rules.pp_kept_outputs
    if kept == "every stage" and sending:
        out.append(component("buffers", "Pipeline stage outputs kept for the step (output_chunks)",
                             sending * m * hidden, f"{m} micro-batches x {hf}" + (f" x {sending} stages"
                                                                                  if sending > 1 else ""),
                             PIPELINING_SOURCE))
    if kept in ("every stage", "last stage") and stage.last:
        vf = "/t" if t > 1 else ""
        out.append(component("buffers", "The last stage's logits kept for the step (output_chunks)",
                             m * B * T * arch.vocab_size / t, f"{m} micro-batches x B*s*b*V{vf}", PIPELINING_SOURCE))
    return out



def stage_input(arch: Architecture, training: Training, par: Parallel) -> tuple[float, str]:
    """A micro-batch's stage input (= the previous stage's output) in bytes, and its formula: the hidden
    states in the compute dtype, sequence-sharded under TP with sequence parallelism."""
    t = par.tp
    seq_shard = par.sequence_parallel and t > 1
    B, T = bytes_per_element(training.compute_dtype), tokens_per_gpu(training, par)
    return B * T * arch.hidden_size / (t if seq_shard else 1), "B*s*b*h" + ("/t" if seq_shard else "")


REDUCE_POOL_SOURCE = ("torch 2.6.0 (the release branch of the Dec 2024 benchmarks' torch 1963fc83) and torch 2.13: "
                      "distributed/pipelining/stage.py backward_maybe_with_nosync (every micro-batch's backward "
                      "with set_requires_gradient_sync(False); after the last one run_post_backward reduce-scatters "
                      "every FSDP group), fsdp/_fully_shard/_fsdp_collectives.py foreach_reduce (the reduce-scatter "
                      "output, which becomes the sharded gradient, is allocated on the reduce-scatter stream), "
                      "c10/cuda/CUDACachingAllocator.cpp (a free block, or an expandable segment, serves only "
                      "allocations on its own stream); torchtitan train.py (optimizers.zero_grad() at the start of "
                      "every step: set_to_none frees the gradients before the forward)")


def reduce_scatter_pool(training: Training, par: Parallel, sharded_gradients: int,
                        microbatches: int = 1) -> Component | None:
    """The reduce-scatter stream's segments that an FSDP2 training stage keeps reserved and unused
    through its forward and the start of its backward (None elsewhere): the sharded gradients are made
    on that stream (REDUCE_POOL_SOURCE), under PP only after the last micro-batch's backward, without
    PP group by group as the backward reduce-scatters them; zero_grad(set_to_none) frees them before
    the next step's forward, so their segments wait, cached for that stream alone, while the default
    stream peaks. 4 B (the reduce dtype) x the stage's sharded parameters, as the gradients. Without PP
    and with several micro-batches a step, the gradients exist (and are counted) from the first
    micro-batch's backward on: no pool is added there."""
    if training.framework != "fsdp2" or training.mode != "training" or sharded_gradients <= 0 \
            or training.optimizer_in_backward or (par.pp == 1 and microbatches > 1):
        return None
    return component("fragmentation", "The reduce-scatter stream's cached segments (the sharded gradients' memory, "
                     "unused until the step's reduce-scatters)", sharded_gradients,
                     "the sharded gradients' bytes (reduce dtype x the stage's parameters / the FSDP group)",
                     REDUCE_POOL_SOURCE)


ALL_GATHER_POOL_SOURCE = ("torch 2.6.0 and 2.13 distributed/fsdp/_fully_shard/_fsdp_collectives.py foreach_all_gather "
                          "(a group's flat all-gather output is allocated on the all-gather copy-in stream) and "
                          "_fsdp_param_group.py wait_for_unshard (in forward the previous group's all-gather result "
                          "is freed only at the next group's copy-out, after that group's output exists); "
                          "torchtitan 9dec370 parallelize_llama.py apply_fsdp (reshard_after_forward=False under PP: "
                          "no all-gather after the first micro-batch's forward); pipelining/stage.py "
                          "backward_maybe_with_nosync (set_reshard_after_backward(False) until the last backward); "
                          "c10/cuda/CUDACachingAllocator.cpp (a stream's blocks serve that stream only)")


def all_gather_pool(training: Training, par: Parallel, stage: StageParameters, param_bytes: float,
                    gathered_block: tuple[float, str]) -> Component | None:
    """The all-gather copy-in stream's segments that a pipelined FSDP2 stage keeps reserved and unused
    after its first micro-batch's forward (None elsewhere): each model chunk gathers its groups once
    per step, two consecutive groups' flat outputs at a time (ALL_GATHER_POOL_SOURCE), and its FSDP root
    has a copy-in stream of its own (one per chunk). Per chunk the larger pair: two blocks, or a block
    and the root unit (embedding, or final norm and head) on the chunk that holds it."""
    if training.framework != "fsdp2" or par.pp == 1 or training.mode != "training" or not stage.chunks:
        return None
    per_param, pf = gathered_block
    block = per_param * stage.largest_layer_local
    pairs = [min(len(r), 2) * block for r in stage.chunks]
    holder = 0 if stage.first else len(pairs) - 1
    root = param_bytes * stage.root_local
    if root and (stage.first or stage.last):
        pairs[holder] = max(pairs[holder], min(len(stage.chunks[holder]), 1) * block + root)
    formula = f"{len(pairs)} chunk(s) x the larger of 2 blocks x {pf} and a block + {param_bytes:g} B x the root unit"
    return component("fragmentation", "The all-gather copy-in stream's cached segments (two groups' flat all-gather "
                     "outputs, unused after the first micro-batch's forward)", sum(pairs), formula,
                     ALL_GATHER_POOL_SOURCE)
