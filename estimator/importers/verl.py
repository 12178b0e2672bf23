"""verl: a ``python3 -m verl.trainer.main_ppo key=value ...`` launch (Hydra overrides of its
``ppo_trainer`` config), or a YAML of that config, read into our JSON config with ``training.rl``.

Keys and defaults follow verl v0.7.0 (commit f9c855f7cf04d603c9546bc01776c74806a879c1,
``verl/trainer/config/_generated_ppo_trainer.yaml``): the actor trains under FSDP (``strategy: fsdp``,
fp32 master parameters, bf16 compute) on ``trainer.n_gpus_per_node x trainer.nnodes`` GPUs; the
rollout engine (``rollout.name``) shares them, taking ``gpu_memory_utilization`` of each; GRPO and the
other critic-free estimators (adv_estimator other than gae) train no critic; a reference model is
loaded when the KL loss or the KL reward is on. The workers run NCCL without cuMem: verl's Ray runtime
environment sets NCCL_CUMEM_ENABLE=0 unless the command's environment or ``ray_kwargs.ray_init.runtime_env``
sets it (``verl/trainer/constants_ppo.py``, from v0.6.0).
"""

from __future__ import annotations

from ..spec.errors import ConfigError
from .build import ConfigBuilder, FlatDoc, key_value_overrides, to_int
from .models import named_model
from .result import Imported, Ledger
from .nccl_env import read_cumem
from .shell import read_launch
from .source import parse_yaml
from .verl_keys import PPO_TRAINER

KIND = "verl"
VERSION = "verl v0.7.0"
A, R = "actor_rollout_ref.actor.", "actor_rollout_ref.rollout."
_RUNTIME_ENV = "ray_kwargs.ray_init.runtime_env.env_vars."
# v0.7.0 defaults of the keys read below
_DEFAULTS = {
    "algorithm.adv_estimator": "gae", "algorithm.use_kl_in_reward": False, "data.train_batch_size": 1024,
    "data.max_prompt_length": 512, "data.max_response_length": 512, "trainer.n_gpus_per_node": 8,
    "trainer.nnodes": 1, A + "strategy": "fsdp", A + "ppo_micro_batch_size_per_gpu": None, A + "use_kl_loss": False,
    A + "fsdp_config.param_offload": False, A + "fsdp_config.optimizer_offload": False,
    A + "ulysses_sequence_parallel_size": 1, "actor_rollout_ref.model.enable_gradient_checkpointing": True,
    "actor_rollout_ref.model.lora_rank": 0, "actor_rollout_ref.model.lora_alpha": 16,
    "actor_rollout_ref.model.target_modules": "all-linear", R + "n": 1, R + "name": None,
    R + "gpu_memory_utilization": 0.5, R + "tensor_model_parallel_size": 2,
}
_NO_EFFECT_PREFIXES = ("trainer.logger", "trainer.project_name", "trainer.experiment_name", "trainer.save_freq",
                       "trainer.test_freq", "trainer.total_epochs", "trainer.critic_warmup", "data.train_files",
                       "data.val_files", "data.filter_overlong_prompts", "data.truncation", A + "optim.",
                       A + "kl_loss_coef", A + "kl_loss_type", A + "entropy_coeff", A + "clip_ratio",
                       "actor_rollout_ref.model.use_remove_padding", "reward_model.", "custom_reward_function.",
                       "trainer.val_before_train", "trainer.default_local_dir", "trainer.resume_mode",
                       A + "ppo_mini_batch_size")


def looks_like(text: str, name: str = "") -> bool:
    return "verl.trainer.main_ppo" in text or "actor_rollout_ref:" in text


def read(text: str, gpus: int | None = None, overrides: tuple[str, ...] = ()) -> Imported:
    ledger = Ledger()
    env: dict[str, str] = {}
    if "verl.trainer.main_ppo" in text:
        launch = read_launch(text, lambda w: w.endswith("verl.trainer.main_ppo"))
        env = dict(launch.env)
        for note in launch.notes:
            ledger.note(note)
        doc = FlatDoc({}, "verl config")
        words = tuple(w for w in launch.args if w not in ("$@", "$*")) + tuple(overrides)
        if len(words) != len(launch.args) + len(overrides):
            ledger.ignore("$@", "", "the script's own arguments: none when the file is read")
    else:
        doc = FlatDoc(parse_yaml(text, "verl config"), "verl config")
        words = tuple(overrides)
    key_value_overrides(words, doc, ledger, VERSION)
    build = ConfigBuilder(ledger)
    world = _world(doc, build, ledger, gpus)
    _model(doc, build, ledger)
    _actor(doc, build, ledger, world)
    _rl(doc, build, ledger)
    _nccl(doc, env, build)
    for key, value in doc.rest():
        if key.startswith(_NO_EFFECT_PREFIXES):
            ledger.ignore(key, value, "data, logging, schedule or loss coefficients: no effect on memory")
        elif key in PPO_TRAINER:
            ledger.not_modelled(key, value, f"a {VERSION} setting the estimate does not model")
        else:
            ledger.strange(key, value, f"not a key of {VERSION}'s ppo_trainer config")
    return ledger.result(KIND, {"model": build.named_model or build.model, **build.config})


def _get(doc: FlatDoc, key: str) -> object:
    return doc.get(key, _DEFAULTS.get(key))


def _set(doc: FlatDoc, build: ConfigBuilder, path: str, value: object, key: str, why: str = "") -> None:
    if doc.given(key):
        build.set(path, value, key, doc.flat[key], why=why)
    else:
        build.set(path, value, f"(no {key})", _DEFAULTS.get(key), why=f"{VERSION}'s default" + (f"; {why}" if why
                                                                                                else ""))


def _world(doc: FlatDoc, build: ConfigBuilder, ledger: Ledger, gpus: int | None) -> int:
    per_node = to_int("trainer.n_gpus_per_node", _get(doc, "trainer.n_gpus_per_node"), 1)
    nodes = to_int("trainer.nnodes", _get(doc, "trainer.nnodes"), 1)
    world = per_node * nodes
    if gpus is not None and gpus != world:
        raise ConfigError("--gpus", gpus, f"{world} = trainer.n_gpus_per_node x trainer.nnodes")
    return world


def _model(doc: FlatDoc, build: ConfigBuilder, ledger: Ledger) -> None:
    name = doc.get("actor_rollout_ref.model.path")
    build.named_model = named_model(name, "actor_rollout_ref.model.path", "a Hugging Face id (org/name)")
    ledger.mapped("actor_rollout_ref.model.path", name, f"model = \"{build.named_model}\"")


def _actor(doc: FlatDoc, build: ConfigBuilder, ledger: Ledger, world: int) -> None:
    strategy = _get(doc, A + "strategy")
    if strategy not in ("fsdp", "fsdp2"):
        ledger.not_modelled(A + "strategy", strategy, "estimated as FSDP")
    build.set("training.framework", "fsdp2", A + "strategy" if doc.given(A + "strategy") else
              f"(no {A}strategy)", strategy, why="FSDP1's flat parameters estimated as FSDP2" if strategy == "fsdp"
              else "")
    build.put("parallel.dp", world)
    ledger.note(f"the actor shards over all {world} GPUs (fsdp_size -1)")
    mbs = _get(doc, A + "ppo_micro_batch_size_per_gpu")
    if mbs is None:
        raise ConfigError(A + "ppo_micro_batch_size_per_gpu", None, "an integer (or use_dynamic_bsz, not modelled)",
                          "missing")
    build.set("training.micro_batch_size", to_int(A + "ppo_micro_batch_size_per_gpu", mbs, 1),
              A + "ppo_micro_batch_size_per_gpu")
    if _get(doc, "actor_rollout_ref.model.enable_gradient_checkpointing"):
        _set(doc, build, "training.recompute", "full", "actor_rollout_ref.model.enable_gradient_checkpointing")
    rank = to_int("actor_rollout_ref.model.lora_rank", _get(doc, "actor_rollout_ref.model.lora_rank"), 0)
    if rank:
        targets = _get(doc, "actor_rollout_ref.model.target_modules")
        build.set("training.adapter", {"method": "lora", "rank": rank, "alpha": float(_get(
            doc, "actor_rollout_ref.model.lora_alpha")), "target_modules": "all-linear" if targets == "all-linear"
            else targets}, "actor_rollout_ref.model.lora_rank", rank)
    # verl/utils/torch_functional.py logprobs_from_logits: flash-attn's fused cross-entropy (backward in
    # place) when flash-attn is installed, as in verl's images
    build.put("training.loss", "fused")
    ledger.note("log-probabilities through flash-attn's fused cross-entropy (verl's logprobs_from_logits when "
                "flash-attn is installed): loss 'fused'")
    sp = to_int(A + "ulysses_sequence_parallel_size", _get(doc, A + "ulysses_sequence_parallel_size"), 1)
    if sp > 1:
        ledger.not_modelled(A + "ulysses_sequence_parallel_size", sp, "Ulysses sequence parallelism; estimated "
                            "without it")


def _nccl(doc: FlatDoc, env: dict[str, str], build: ConfigBuilder) -> None:
    """NCCL_CUMEM_ENABLE in the workers: ray_kwargs.ray_init.runtime_env's, merged over verl's PPO_RAY_RUNTIME_ENV
    (main_ppo.py run_ppo), else the driver's environment (the command's, which get_ppo_ray_runtime_env leaves in
    place of its own), else verl's "0" (spec/nccl.py RL_STACKS_CUMEM_OFF)."""
    key = _RUNTIME_ENV + "NCCL_CUMEM_ENABLE"
    if doc.given(key):
        read_cumem({"NCCL_CUMEM_ENABLE": str(doc.get(key))}, build, key)
    else:
        read_cumem(env, build, stack="verl")


def _rl(doc: FlatDoc, build: ConfigBuilder, ledger: Ledger) -> None:
    estimator = _get(doc, "algorithm.adv_estimator")
    engine = _get(doc, R + "name")
    if engine not in ("vllm", "sglang"):
        raise ConfigError(R + "name", engine, "'vllm' or 'sglang'", "the rollout engine")
    offload = bool(_get(doc, A + "fsdp_config.param_offload") or _get(doc, A + "fsdp_config.optimizer_offload"))
    rl = {"algorithm": "ppo" if estimator == "gae" else "grpo",
          "rollout_batch_size": to_int("data.train_batch_size", _get(doc, "data.train_batch_size"), 1),
          "samples_per_prompt": to_int(R + "n", _get(doc, R + "n"), 1),
          "max_prompt_len": to_int("data.max_prompt_length", _get(doc, "data.max_prompt_length"), 1),
          "max_response_len": to_int("data.max_response_length", _get(doc, "data.max_response_length"), 1),
          "engine": engine, "engine_memory_fraction": float(_get(doc, R + "gpu_memory_utilization")),
          "reference_model": any([_get(doc, A + "use_kl_loss"), _get(doc, "algorithm.use_kl_in_reward")]),
          "critic_model": estimator == "gae", "offload_during_rollout": offload,
          "rollout_tp": to_int(R + "tensor_model_parallel_size", _get(doc, R + "tensor_model_parallel_size"), 1)}
    build.set("training.rl", rl, "algorithm.adv_estimator", estimator,
              why=f"{rl['rollout_batch_size']} prompts x {rl['samples_per_prompt']} samples, {engine}")
    build.put("training.seq_len", rl["max_prompt_len"] + rl["max_response_len"])
    if doc.get("actor_rollout_ref.ref.fsdp_config.param_offload"):
        ledger.not_modelled("actor_rollout_ref.ref.fsdp_config.param_offload", True, "the reference's weights on the "
                            "host between its forwards; estimated resident")
