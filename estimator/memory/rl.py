"""RL with a colocated rollout engine: the trainer and the inference engine take turns on the
same GPUs (verl's hybrid engine, OpenRLHF and TRL with ``vllm_mode="colocate"``), so each GPU
passes through three phases per step and must fit the largest:

- rollout: the engine (vLLM or SGLang) generates ``rollout_batch_size x samples_per_prompt``
  responses. It holds its copy of the policy's weights (bf16, split over its own TP), its KV
  cache and one prefill chunk's activations. vLLM takes ``engine_memory_fraction`` of the GPU
  (``gpu_memory_utilization``: weights, activations and KV cache together) and sizes its KV cache
  from what is left; SGLang's ``mem_fraction_static`` likewise. Without a fraction the KV cache is
  sized by the batch: every sequence's prompt and response at once. The trainer's model states
  stay resident unless ``offload_during_rollout`` moves them to the host (verl's param and
  optimizer offload, OpenRLHF's ``--colocate_all_models`` with DeepSpeed offload).
- scoring: log-probabilities of the responses under the old policy and the frozen reference
  (and the critic's values for PPO), a forward pass per model over micro-batches of the
  trainer's size; the engine has released its KV cache and weights (verl ``free_cache_engine``,
  vLLM sleep mode), the trainer's states are back.
- training: the ordinary training step of `memory.py` on sequences of prompt + response tokens,
  beside the reference weights and, for PPO, the critic's states.

DPO (Rafailov et al. 2023) has no rollout: each sample is a chosen and a rejected sequence, run
together (TRL concatenates them), with the frozen reference's forward for their log-probs.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, NamedTuple

from ..spec.choices import DEEPSPEED_FIELDS
from ..spec.nccl import uses_cumem
from ..spec.rl import Rl
from ..spec.versions import torch_release

if TYPE_CHECKING:
    from .components import Component

# vLLM's scheduler budget per step with chunked prefill (verl rollout config max_num_batched_tokens)
PREFILL_CHUNK_TOKENS = 8192
SOURCE = ("verl hybrid engine (ActorRolloutRefWorker: rollout, compute_log_prob, compute_ref_log_prob, "
          "update_actor; free_cache_engine); vLLM gpu_memory_utilization / SGLang mem_fraction_static; "
          "Shao et al. 2024 (GRPO), Ouyang et al. 2022 (PPO with a value model), Rafailov et al. 2023 (DPO)")


def trainer_training(training):
    """The policy's training step: sequences of prompt + response; DPO runs chosen and rejected
    together, twice the micro-batch. Whether its NCCL allocates with cuMem is decided here, while the
    rollout engine is known (spec/nccl.py uses_cumem: off beside SGLang unless training.nccl_cumem says)."""
    rl = training.rl
    micro = training.micro_batch_size * (2 if rl.algorithm == "dpo" else 1)
    engine = None if rl.algorithm == "dpo" else rl.engine
    cumem = uses_cumem(torch_release(training.torch_version), training.nccl_cumem, engine)
    return replace(training, seq_len=rl.sequence_len, micro_batch_size=micro, rl=None, nccl_cumem=cumem)


class RlPhase(NamedTuple):
    name: str  # rollout, scoring, training
    allocated_bytes: int  # tensors in PyTorch's allocator (the trainer's) and the engine's pool
    device_total_bytes: int
    components: tuple[Component, ...]


def rl_phases(train, rl: Rl, estimate) -> tuple[RlPhase, ...]:
    """Each phase of a step on the busiest GPU, from the trainer's estimate `train`; `estimate` is the
    memory estimate (memory.py passes it: the rollout estimates the engine's inference step)."""
    stage = train.stages[train.peak_stage]
    step = {c.key: c for c in next(p for p in stage.phases if p.name == "optimizer").components}
    outside = tuple(c for c in stage.components if c.key in ("communication", "runtime"))
    states = _trainer_states(step)
    reference = _reference_weights(train) if rl.reference_model else ()
    critic = _critic_states(states) if rl.critic_model else ()
    phases = [] if rl.algorithm == "dpo" else [_rollout(train, rl, states + reference + critic, outside, estimate)]
    phases.append(_scoring(train, rl, states + reference + critic, outside))
    peak = [c for c in stage.components if c.key not in ("communication", "runtime", "fragmentation")]
    phases.append(_phase("training", tuple(peak) + reference + critic, outside, train.hardware))
    return tuple(phases)


def component(*args) -> "Component":
    from .components import component as make  # components import the activations, which import training
    return make(*args)


def _phase(name: str, held: tuple[Component, ...], outside: tuple[Component, ...], hardware,
           pool: tuple[Component, ...] = ()) -> RlPhase:
    from .components import fragmentation
    allocated = sum(c.bytes for c in held)
    # the engine's preallocated pool does not fragment
    frag = fragmentation(allocated, hardware, "an RL phase (the replay builds a plain training step)")
    pooled = sum(c.bytes for c in pool)
    total = allocated + pooled + sum(c.bytes for c in outside) + frag.bytes
    return RlPhase(name, allocated + pooled, total, held + pool + outside + (frag,))


def _trainer_states(step: dict) -> tuple[Component, ...]:
    keys = ("parameters", "master_weights", "optimizer_states", "fp8_weight_copies", "buckets", "buffers")
    return tuple(step[k] for k in keys if k in step and step[k].bytes)


def _reference_weights(train) -> tuple[Component, ...]:
    """The frozen reference: the policy's architecture in the weights dtype, sharded like the
    policy's parameters under FSDP/ZeRO-3 (verl builds it with the actor's FSDP config)."""
    from ..spec.dtypes import bytes_per_element
    cfg = train.config
    P = bytes_per_element(cfg.training.param_dtype)
    shard = cfg.parallel.dp if cfg.zero_stage >= 3 else 1
    n = train.stages[train.peak_stage].parameters_per_gpu
    return (component("reference", "Reference model weights (frozen)", P * n / shard,
                      f"{P:g} B x {n:,} params" + (f" / DP {shard}" if shard > 1 else ""), SOURCE),)


def _critic_states(states: tuple[Component, ...]) -> tuple[Component, ...]:
    """PPO's critic: the policy's architecture with a value head, trained like the policy, so its
    states equal the policy's (the head's V x h weights counted as the LM head's: an upper bound)."""
    total = sum(c.bytes for c in states)
    return (component("critic", "Critic model states (PPO)", total, "= the policy's parameters, master weights "
                      "and optimizer states (same architecture)", SOURCE),)


def _offloaded(held: tuple[Component, ...], rl: Rl) -> tuple[Component, ...]:
    """The trainer's states during the rollout: on the GPU, or (offload_during_rollout) a zero on the
    GPU whose parts are the states parked in host memory (read by `rollout_host`)."""
    from .components import Component as Part  # components import the activations, which import training
    if not rl.offload_during_rollout:
        return held
    moved = sum(c.bytes for c in held)
    return (Part("offloaded", "Trainer states (offloaded to the host during rollout)", 0,
                      f"0: {moved / 2**30:,.2f} GiB of trainer states in host memory while the engine runs",
                      SOURCE, held),)


def rollout_host(phases: tuple[RlPhase, ...]) -> tuple[Component, ...]:
    """Host memory the rollout needs per GPU process: the trainer's states it offloaded."""
    return tuple(component("offloaded", f"{c.label} (offloaded during the rollout)", c.bytes, c.formula, SOURCE)
                 for p in phases if p.name == "rollout" for o in p.components if o.key == "offloaded"
                 for c in o.parts)


def _rollout(train, rl: Rl, held: tuple[Component, ...], outside: tuple[Component, ...], estimate) -> RlPhase:
    """The engine on one GPU: its weights, KV cache and a prefill chunk's working set (`inference`
    at the engine's TP), in the memory fraction it is given or sized by the rollout batch."""
    from ..spec.parallel import Parallel
    cfg = train.config
    training = cfg.training
    tp = rl.rollout_tp or cfg.parallel.tp
    replicas = cfg.parallel.gpus // tp
    sequences = -(-rl.rollout_batch_size * rl.samples_per_prompt // replicas)  # per engine replica
    # the engine's KV cache holds every sequence of its share; a step's forward runs at most one
    # chunk of PREFILL_CHUNK_TOKENS tokens (chunked prefill), so its working set is that chunk's
    chunk = min(PREFILL_CHUNK_TOKENS, sequences * rl.max_prompt_len)
    # the engine recomputes nothing: the trainer's recompute settings go with it (recompute_layers,
    # recompute_every and recompute_modules are refused without their recompute mode)
    serve = replace(training, mode="inference", rl=None, adapter=None, micro_batch_size=sequences,
                    seq_len=chunk, kv_cache_tokens=rl.sequence_len,
                    kv_cache_dtype=None, recompute="none", recompute_layers=None, recompute_every=1,
                    recompute_modules=type(training).__dataclass_fields__["recompute_modules"].default,
                    global_batch_size=None, loss="standard",
                    param_dtype=training.param_dtype if training.param_dtype in ("bf16", "fp16") else "bf16",
                    optimizer_in_backward=False, offload_optimizer="none", offload_parameters="none",
                    **dict.fromkeys(DEEPSPEED_FIELDS))  # the engine shards nothing: no ZeRO bucket
    parts = {c.key: c for c in estimate(cfg.architecture, serve, Parallel(tp=tp), cfg.hardware).stages[0].components}
    step = {c.key: c for c in estimate(cfg.architecture, replace(serve, micro_batch_size=1), Parallel(tp=tp),
                                        cfg.hardware).stages[0].components}
    weights, kv, working = parts["parameters"], parts["kv_cache"], step["activations"]
    logits = parts.get("logits")  # the sampled positions of every sequence
    fixed = weights.bytes + working.bytes + (logits.bytes if logits else 0)
    src = f"{rl.engine}: " + SOURCE
    pool = [component("rollout_weights", f"Engine weights ({rl.engine}, TP {tp})", weights.bytes, weights.formula, src)]
    if rl.engine_memory_fraction is None:
        pool.append(component("kv_cache", f"KV cache: {sequences} sequences x {rl.sequence_len:,} tokens",
                              kv.bytes, kv.formula + f" ({sequences} of the {rl.rollout_batch_size} x "
                              f"{rl.samples_per_prompt} rollouts per replica of {replicas})", src))
    else:
        budget = rl.engine_memory_fraction * cfg.hardware.device.capacity_bytes
        free = max(0.0, budget - fixed)
        held_sequences = free / (kv.bytes / sequences) if kv.bytes else 0.0
        pool.append(component("kv_cache", "KV cache (the rest of the engine's memory fraction)", free,
                              f"{rl.engine_memory_fraction:g} x {cfg.hardware.device.capacity_bytes / 2**30:,.1f} GiB "
                              f"- weights - working set: room for {held_sequences:,.1f} sequences of {rl.sequence_len:,} "
                              f"tokens at once (the replica's share of the rollouts: {sequences})", src))
    pool.append(component("activations", f"Engine working set (a {chunk:,}-token prefill chunk, the sampled logits)",
                          working.bytes + (logits.bytes if logits else 0),
                          working.formula + " + 4 B x sequences x V (sampling)", src))
    return _phase("rollout", _offloaded(held, rl), outside, cfg.hardware, tuple(pool))


def _scoring(train, rl: Rl, held: tuple[Component, ...], outside: tuple[Component, ...]) -> RlPhase:
    """Log-probabilities of the responses: a forward pass over one micro-batch of prompt + response
    tokens, its logits in the compute dtype and their fp32 log-softmax, beside the models' states;
    nothing is kept for a backward pass."""
    from ..spec.dtypes import bytes_per_element
    from .inference import forward_working_set
    cfg = train.config
    training, arch, par = cfg.training, cfg.architecture, cfg.parallel
    tokens = training.micro_batch_size * rl.sequence_len  # the trainer's micro-batch (chosen + rejected for DPO)
    C = bytes_per_element(training.compute_dtype)
    V = cfg.padded_vocab / par.tp
    by_t = "/t" if par.tp > 1 else ""
    working, formula = forward_working_set(arch, training, par, set(arch.kinds), tokens)
    logits = tokens * V * (C + 4)
    forward = (component("activations", "One layer's forward temporaries (no backward)", working, formula, SOURCE),
               component("logits", "Logits and their fp32 log-softmax", logits, f"({C:g} + 4) B x tokens x V{by_t}",
                         SOURCE))
    return _phase("scoring", held + forward, outside, cfg.hardware)
