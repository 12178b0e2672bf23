"""``plan --emit verl`` / ``slime``: an RL layout written as the framework's launch line, read back by
its importer (`emit_check.verified`).

- verl (v0.7.0): ``python3 -m verl.trainer.main_ppo`` with the Hydra overrides of its ``ppo_trainer``
  config that the `verl` importer reads: the actor on FSDP over every GPU, its micro-batch, checkpointing
  and LoRA, the rollout engine's share and TP, the batch, the lengths, the estimator and the KL settings.
- slime (commit 624b824a): ``python3 train.py`` with Megatron-LM's flags for the model and the layout
  (the `emit` module's Megatron writer) and slime's ``--actor-*``, ``--rollout-*`` and
  ``--sglang-mem-fraction-static``, the engines colocated.

Both stacks run their training processes without cuMem unless the command's environment says otherwise: a
configuration with nccl_cumem true is written with NCCL_CUMEM_ENABLE=1 before the command; one that leaves it
unset, as the stack's own launch (cuMem off).
"""

from __future__ import annotations

import shlex
from dataclasses import replace

from ..spec.errors import ConfigError
from .emit_check import hub_id, verified


def _nodes(gpus: int) -> tuple[int, int]:
    """(GPUs per node, nodes): whole nodes of 8 where the count allows, else one node."""
    return (8, gpus // 8) if gpus > 8 and gpus % 8 == 0 else (gpus, 1)


def _rl(cfg, kind: str):
    rl = cfg.training.rl
    if rl is None or rl.algorithm == "dpo":
        raise ConfigError("training.rl", rl.algorithm if rl else None, "a GRPO or PPO run (training.rl)",
                          f"a {kind} launch trains with rollouts")
    return rl


def _cumem_env(tr) -> list[str]:
    """NCCL_CUMEM_ENABLE=1 before the command where the configuration turns cuMem on: verl and slime give their
    workers "0" unless the driver's environment sets it (spec/nccl.py RL_STACKS_CUMEM_OFF). Unset, the launch keeps
    the stack's "0" (emit_check._LAUNCH_DEFAULTS)."""
    return ["NCCL_CUMEM_ENABLE=1"] if tr.nccl_cumem else []


def emit_verl(config: dict) -> str:
    from ..models.loading import load_config
    cfg = load_config(config)
    tr, par = cfg.training, cfg.parallel
    rl = _rl(cfg, "verl")
    per_node, nodes = _nodes(par.gpus)
    a, r = "actor_rollout_ref.actor.", "actor_rollout_ref.rollout."
    words = _cumem_env(tr) + ["python3", "-m", "verl.trainer.main_ppo",
             f"algorithm.adv_estimator={'gae' if rl.algorithm == 'ppo' else 'grpo'}",
             f"data.train_batch_size={rl.rollout_batch_size}", f"data.max_prompt_length={rl.max_prompt_len}",
             f"data.max_response_length={rl.max_response_len}",
             f"actor_rollout_ref.model.path={hub_id(cfg, 'verl')}",
             f"actor_rollout_ref.model.enable_gradient_checkpointing={tr.recompute == 'full'}",
             f"{a}ppo_micro_batch_size_per_gpu={tr.micro_batch_size}", f"{a}use_kl_loss={rl.reference_model}",
             f"{a}fsdp_config.param_offload={rl.offload_during_rollout}",
             f"{a}fsdp_config.optimizer_offload={rl.offload_during_rollout}", f"{r}name={rl.engine}",
             f"{r}n={rl.samples_per_prompt}", f"{r}tensor_model_parallel_size={rl.rollout_tp or par.tp}"]
    if rl.engine_memory_fraction is not None:
        words.append(f"{r}gpu_memory_utilization={rl.engine_memory_fraction}")
    if tr.adapter is not None:
        targets = "all-linear" if tr.adapter.all_linear else "[" + ",".join(tr.adapter.target_modules) + "]"
        words += [f"actor_rollout_ref.model.lora_rank={tr.adapter.rank}",
                  f"actor_rollout_ref.model.lora_alpha={tr.adapter.alpha:g}",
                  f"actor_rollout_ref.model.target_modules={targets}"]
    words += [f"trainer.n_gpus_per_node={per_node}", f"trainer.nnodes={nodes}"]
    return verified("verl", shlex.join(words) + "\n", config)


def emit_slime(config: dict) -> str:
    from ..models.loading import load_config
    from .emit_megatron import megatron_model, megatron_parallel, megatron_training
    cfg = load_config(config)
    tr, par = cfg.training, cfg.parallel
    rl = _rl(cfg, "slime")
    if rl.engine != "sglang":
        raise ConfigError("training.rl.engine", rl.engine, "'sglang'", "slime's rollout runs on SGLang")
    per_node, nodes = _nodes(par.gpus)
    words = _cumem_env(tr) + ["python3", "train.py", "--actor-num-nodes", str(nodes), "--actor-num-gpus-per-node",
                              str(per_node), "--colocate", "--hf-checkpoint", hub_id(cfg, "slime")]
    words += megatron_model(cfg.architecture)
    words += [w for w in megatron_training(replace(tr, rl=None), cfg.architecture)]
    words += megatron_parallel(par, tr)
    words += ["--advantage-estimator", "ppo" if rl.algorithm == "ppo" else "grpo",
              "--rollout-batch-size", str(rl.rollout_batch_size), "--n-samples-per-prompt", str(rl.samples_per_prompt),
              "--rollout-max-prompt-len", str(rl.max_prompt_len), "--rollout-max-response-len",
              str(rl.max_response_len), "--rollout-num-gpus-per-engine", str(rl.rollout_tp or par.tp)]
    if rl.engine_memory_fraction is not None:
        words += ["--sglang-mem-fraction-static", repr(rl.engine_memory_fraction)]
    if not rl.offload_during_rollout:
        words.append("--no-offload-train")
    return verified("slime", shlex.join(words) + "\n", config)
