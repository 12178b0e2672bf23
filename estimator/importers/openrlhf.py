"""OpenRLHF: a trainer's command line (``python3 -m openrlhf.cli.train_ppo_ray ...``, ``deepspeed --module
openrlhf.cli.train_sft ...``, ``train_dpo``) read into our JSON config; PPO and its critic-free
variants with ``training.rl``, DPO as ``rl.algorithm = "dpo"``.

Flags and defaults follow OpenRLHF v0.11.0 (commit 3c3be6234e0cb353e76bb8019947db9dfe99fca7; the flag
table is `openrlhf_flags`). Every model trains under DeepSpeed ZeRO (``--ds.zero_stage``, 2 by
default) as ``openrlhf/utils/deepspeed/deepspeed_utils.py`` ``get_train_ds_config`` writes it: the
optimizer offloaded with ``--ds.adam_offload``, the parameters never; its buckets written ``"auto"``,
which DeepSpeed drops for its own defaults (``deepspeed/runtime/config_utils.py``
``DeepSpeedConfigModel``: reduce 500,000,000 elements; ZeRO-3 prefetch 50,000,000, persistence
100,000). The PPO trainer (``cli/train_ppo_ray.py``):

- the actor trains on ``--actor.num_nodes x --actor.num_gpus_per_node`` GPUs (1 x 8);
- with ``--train.colocate_all`` the vLLM engines (``--vllm.tensor_parallel_size`` GPUs each, at
  ``--vllm.gpu_memory_utilization``, 0.95 by default), the reference, the critic and the reward model
  share those GPUs; ``--ds.enable_sleep`` moves the DeepSpeed states to the host during the rollout
  (``deepspeed_utils.py`` ``offload_deepspeed_states``: not the 16-bit weights);
- a reference is loaded when ``--algo.kl.init_coef`` > 0 (0.01 by default), sharded like the actor
  under ZeRO-3 only (``get_ds_eval_config``); a critic when ``--algo.advantage.estimator`` is ``gae``
  (the default);
- ``--data.max_len`` bounds prompt and response together (the vLLM context; samples are cut to
  it: ``trainer/ppo_utils/samples_generator.py``); ``--train.dynamic_batch_enable`` packs
  micro-batches of ``--train.max_tokens_per_gpu`` tokens (``utils/seqlen_balancing.py``);
- NCCL keeps cuMem as torch's NCCL has it unless the command's environment sets NCCL_CUMEM_ENABLE: the policy
  actor turns it off only under vLLM < 0.16 (``trainer/ray/ppo_actor.py`` l. 501-508), and v0.11.0's vllm extra
  pins 0.27.1 (spec/nccl.py).
"""

from __future__ import annotations

import re

from ..spec.errors import ConfigError
from . import megatron, openrlhf_flags
from .liger import liger_defaults
from .build import ConfigBuilder, FlatDoc, split_flags, to_float, to_int
from .finetune import targets, transformers_attention
from .models import named_model
from .result import Imported, Ledger
from .nccl_env import read_cumem
from .shell import read_launch

KIND = "openrlhf"
VERSION = "OpenRLHF v0.11.0"
_ENTRY = re.compile(r"(?:.*/)?openrlhf[./]cli[./](train_\w+?)(?:\.py)?")
# DeepSpeed's defaults for the buckets OpenRLHF writes "auto" (DeepSpeedZeroConfig)
_BUCKETS = {"training.reduce_bucket_size": 500_000_000}
_BUCKETS_ZERO3 = {"training.stage3_prefetch_bucket_size": 50_000_000,
                  "training.stage3_param_persistence_threshold": 100_000}
_ATTENTION = {"flash_attention_2": "flash", "flash_attention_3": "flash", "sdpa": "flash", "eager": "eager"}
_CRITIC_FREE = ("reinforce", "reinforce_baseline", "rloo", "group_norm", "dr_grpo")
# flags that leave memory and speed alone, by the first part of their names, with the reason
_IGNORED_PREFIXES = {
    "ckpt.": "checkpoints", "logger.": "logging", "eval.": "evaluation", "adam.": "optimizer hyper-parameters",
    "actor.adam.": "optimizer hyper-parameters", "critic.adam.": "optimizer hyper-parameters",
    "muon.": "optimizer hyper-parameters", "actor.muon.": "optimizer hyper-parameters",
    "critic.muon.": "optimizer hyper-parameters", "lr_": "the learning-rate schedule",
    "min_lr_ratio": "the learning-rate schedule", "max_norm": "gradient clipping", "data.": "data and its format",
    "algo.": "loss coefficients, advantages and sample filtering", "train.seed": "seeds",
    "train.max_epochs": "run length", "train.num_episodes": "run length", "train.full_determinism_enable":
    "determinism", "local_rank": "set by the launcher", "use_ms": "where models are downloaded from",
    "rollout.temperature": "sampling", "rollout.top_p": "sampling", "rollout.vllm_generate_batch_size":
    "requests in flight (the engine's KV cache is set by its memory share)", "actor.eps_clip": "loss coefficients",
    "actor.dual_clip": "loss coefficients", "actor.entropy_coef": "loss coefficients",
    "actor.policy_loss_type": "loss coefficients", "actor.aux_loss_coef": "loss coefficients",
    "model.aux_loss_coef": "loss coefficients", "model.beta": "loss coefficients",
    "model.ipo_enable": "loss coefficients", "model.label_smoothing": "loss coefficients",
    "model.nll_loss_coef": "loss coefficients", "model.pretrain_mode_enable": "which tokens carry the loss",
    "critic.value_clip": "loss coefficients", "critic.freezing_steps": "the schedule",
    "critic.save_value_network": "checkpoints", "reward.normalize_enable": "reward numerics",
    "reward.clip_range": "reward numerics", "reward.overlong_": "reward shaping",
    "reward.stop_properly_penalty_coef": "reward shaping", "reward.remote_url": "a reward function or server off "
    "these GPUs", "vllm.sync_backend": "how weights reach the engines", "vllm.sync_with_ray": "how weights reach "
    "the engines", "ds.use_universal_ckpt": "checkpoints", "ds.value_head_prefix": "a name",
    "train.agent_func_path": "the agent's function (on the CPU)",
}


def is_entry(word: str) -> bool:
    return bool(_ENTRY.fullmatch(word))


def looks_like(text: str, name: str = "") -> bool:
    return bool(re.search(r"openrlhf[./]cli[./]train_", text))


def read(text: str, gpus: int | None = None, overrides: tuple[str, ...] = ()) -> Imported:
    """`overrides`: flags given beside the file; they come last, so they win as in argparse."""
    ledger = Ledger()
    launch = read_launch(text, is_entry)
    for note in launch.notes:
        ledger.note(note)
    entry = _entry(launch.entry)
    values = split_flags(launch.args + tuple(overrides), lambda f: openrlhf_flags.arity(entry, f), ledger,
                         f"{VERSION}'s {entry}")
    flags = FlatDoc({}, "OpenRLHF flags")
    for flag, value in values.items():
        flags.set(flag[2:], value)
    build = ConfigBuilder(ledger)
    build.put("training.framework", "deepspeed")
    ledger.note("framework deepspeed (OpenRLHF trains every model under DeepSpeed ZeRO)")
    world = _world(entry, launch.launcher, flags, gpus, ledger)
    _model(entry, flags, build, ledger)
    _deepspeed(flags, build, ledger, world)
    _training(entry, flags, build, ledger)
    {"train_ppo_ray": _ppo, "train_sft": _sft, "train_dpo": _dpo}[entry](flags, build, ledger)
    _account_rest(entry, flags, ledger)
    read_cumem(dict(launch.env), build)
    return ledger.result(KIND, {"model": build.named_model or build.model, **build.config})


def _entry(word: str) -> str:
    m = _ENTRY.fullmatch(word) if word else None
    if m is None or m.group(1) not in openrlhf_flags.ENTRIES:
        raise ConfigError("launch config", m.group(1) if m else None, "a command line of openrlhf.cli.train_ppo_ray, "
                          "train_sft or train_dpo", "not an OpenRLHF trainer this importer reads")
    return m.group(1)


def _world(entry: str, launcher: tuple[str, ...], flags: FlatDoc, gpus: int | None, ledger: Ledger) -> int:
    """The actor's GPUs (Ray's placement) for PPO; the launcher's world for SFT and DPO."""
    if entry == "train_ppo_ray":
        nodes = to_int("--actor.num_nodes", flags.get("actor.num_nodes", 1), 1)
        per_node = to_int("--actor.num_gpus_per_node", flags.get("actor.num_gpus_per_node", 8), 1)
        world = nodes * per_node
        ledger.mapped("--actor.num_nodes x --actor.num_gpus_per_node", f"{nodes} x {per_node}",
                      f"world size {world} (the actor's GPUs)")
        if gpus is not None and gpus != world:
            raise ConfigError("--gpus", gpus, f"{world} = --actor.num_nodes x --actor.num_gpus_per_node")
        return world
    if launcher and launcher[0].split("/")[-1] == "deepspeed":
        world = _deepspeed_launcher(launcher, ledger)
        if world is not None and gpus not in (None, world):
            ledger.note(f"--gpus {gpus} replaces the launcher's world size {world}")
        if world is not None or gpus is not None:
            return gpus or world
    world = megatron._world_size(launcher, gpus, ledger)
    if world is None:
        raise ConfigError("--gpus", None, "the number of GPUs: the command line leaves it to its launcher "
                          "(deepspeed --num_gpus, torchrun --nproc_per_node)", "missing")
    return world


def _deepspeed_launcher(launcher: tuple[str, ...], ledger: Ledger) -> int | None:
    """deepspeed --num_gpus G --num_nodes N; without --num_gpus it takes every GPU it finds."""
    pairs = dict(megatron._launcher_pairs(launcher))
    for flag, value in pairs.items():
        if flag in ("--include", "--exclude", "--hostfile"):
            ledger.not_modelled(flag, value, "the GPUs the launcher picks; give --gpus")
        elif flag not in ("--num_gpus", "--num_nodes"):
            ledger.ignore(flag, value, "the DeepSpeed launcher's setting")
    if "--num_gpus" not in pairs:
        return None
    per_node = to_int("--num_gpus", pairs["--num_gpus"], 1)
    nodes = to_int("--num_nodes", pairs.get("--num_nodes", 1), 1)
    ledger.mapped("deepspeed --num_gpus x --num_nodes", f"{per_node} x {nodes}", f"world size {per_node * nodes}")
    return per_node * nodes


def _model(entry: str, flags: FlatDoc, build: ConfigBuilder, ledger: Ledger) -> None:
    key = "actor.model_name_or_path" if entry == "train_ppo_ray" else "model.model_name_or_path"
    name = flags.get(key)
    build.named_model = named_model(name, f"--{key}", "a Hugging Face id (org/name) or a folder named as a bundled "
                                    "model")
    ledger.mapped(f"--{key}", name, f"model = {build.named_model!r}")


# --- DeepSpeed ------------------------------------------------------------------------------------

def _deepspeed(flags: FlatDoc, build: ConfigBuilder, ledger: Ledger, world: int) -> None:
    stage = to_int("--ds.zero_stage", flags.get("ds.zero_stage", 2), 0)
    if stage > 3:
        raise ConfigError("--ds.zero_stage", stage, "0, 1, 2 or 3")
    build.set("parallel.zero_stage", stage, "--ds.zero_stage" if flags.given("ds.zero_stage") else
              "(no --ds.zero_stage)", stage, why="" if flags.given("ds.zero_stage") else "OpenRLHF's default")
    for path, value in {**_BUCKETS, **(_BUCKETS_ZERO3 if stage == 3 else {})}.items():
        build.put(path, value)
    ledger.note("DeepSpeed's own bucket sizes: OpenRLHF writes them \"auto\", which DeepSpeed drops "
                "(reduce_bucket_size 500,000,000" + (", stage3_prefetch_bucket_size 50,000,000, "
                                                     "stage3_param_persistence_threshold 100,000" if stage == 3
                                                     else "") + ")")
    ring = to_int("--ds.ring_attn_size", flags.get("ds.ring_attn_size", 1), 1)
    tp = to_int("--ds.tensor_parallel_size", flags.get("ds.tensor_parallel_size", 1), 1)
    if world % (ring * tp):
        raise ConfigError("--gpus", world, "a multiple of --ds.ring_attn_size x --ds.tensor_parallel_size = "
                          f"{ring * tp}")
    build.put("parallel.dp", world // (ring * tp))
    ledger.note(f"data parallel {world // (ring * tp)} = {world} GPUs / (ring attention {ring} x tensor parallel {tp})")
    for key, size, what in (("ds.ring_attn_size", ring, "ring attention splits each sequence over its group; "
                             "estimated with whole sequences on each GPU"),
                            ("ds.tensor_parallel_size", tp, "DeepSpeed AutoTP; estimated without it")):
        if size > 1:
            ledger.not_modelled(f"--{key}", size, what)
    dtype = flags.get("ds.param_dtype", "bf16")
    if dtype not in ("bf16", "fp16"):
        raise ConfigError("--ds.param_dtype", dtype, "'bf16' or 'fp16'")
    if dtype == "fp16":
        build.set("training.param_dtype", "fp16", "--ds.param_dtype", dtype)
        build.put("training.compute_dtype", "fp16")
    elif flags.given("ds.param_dtype"):
        ledger.mapped("--ds.param_dtype", dtype, "training.param_dtype = \"bf16\" (the default)")
    if flags.get("ds.adam_offload"):
        build.set("training.offload_optimizer", "cpu", "--ds.adam_offload", "")
    if flags.get("ds.overlap_comm"):
        build.set("training.overlap_comm", True, "--ds.overlap_comm", "")


def _training(entry: str, flags: FlatDoc, build: ConfigBuilder, ledger: Ledger) -> None:
    """Recompute, attention, kernels, optimizer and adapters: the same flags in every trainer."""
    owner = "actor" if entry == "train_ppo_ray" else "model"
    if flags.get(f"{owner}.gradient_checkpointing_enable"):
        build.set("training.recompute", "full", f"--{owner}.gradient_checkpointing_enable", "")
    attention = flags.get("ds.attn_implementation", "flash_attention_2")
    if attention not in _ATTENTION:
        ledger.not_modelled("--ds.attn_implementation", attention, "estimated as flash attention")
    elif not flags.given("ds.attn_implementation"):  # OpenRLHF's default (cli/train_*.py --ds.attn_implementation)
        build.put("training.attn_implementation", attention)
        ledger.note(f"transformers' attention: OpenRLHF's default --ds.attn_implementation {attention}")
    elif attention == "flash_attention_3":  # flash-attn 3: no attn_implementation the estimate names
        ledger.mapped("--ds.attn_implementation", attention, "training.attention = \"flash\" (no s x s scores kept)")
    else:
        transformers_attention(build, ledger, "--ds.attn_implementation", attention)
    if flags.get("ds.use_liger_kernel"):
        # the model is loaded through liger's AutoLigerKernelForCausalLM (its defaults), but OpenRLHF's Actor calls it
        # without labels and takes the log-probs from its logits (openrlhf/models/actor.py Actor.forward), and
        # liger-kernel 0.8.5 lce_forward skips the logits only when labels are given: no fused loss runs
        liger_defaults(build, "--ds.use_liger_kernel", "", flce=False)
    optim = flags.get("actor.optim" if entry == "train_ppo_ray" else "optim", "adam")
    if optim == "muon":
        build.set("training.optimizer", "muon", f"--{'actor.' if entry == 'train_ppo_ray' else ''}optim", optim)
    elif optim != "adam":
        raise ConfigError("--optim", optim, "'adam' or 'muon'")
    _lora(flags, build, ledger)


def _lora(flags: FlatDoc, build: ConfigBuilder, ledger: Ledger) -> None:
    rank = to_int("--ds.lora.rank", flags.get("ds.lora.rank", 0), 0)
    four_bit = bool(flags.get("ds.load_in_4bit"))
    if not rank:
        if four_bit:
            ledger.not_modelled("--ds.load_in_4bit", "", "a 4-bit base without adapters; estimated in 16 bits")
        return
    modules = flags.get("ds.lora.target_modules", "all-linear")
    chosen = "all-linear" if modules in ("all-linear", ["all-linear"]) else targets(modules)
    if chosen is None:
        raise ConfigError("--ds.lora.target_modules", modules, "all-linear, or q_proj, k_proj, v_proj, o_proj, "
                          "gate_proj, up_proj, down_proj")
    spec = {"method": "qlora" if four_bit else "lora", "rank": rank,
            "alpha": to_float("--ds.lora.alpha", flags.get("ds.lora.alpha", 16)), "target_modules": chosen,
            "dropout": to_float("--ds.lora.dropout", flags.get("ds.lora.dropout", 0))}
    build.set("training.adapter", spec, "--ds.lora.rank", rank, why=f"{spec['method']} rank {rank}")


# --- the trainers ---------------------------------------------------------------------------------

def _sft(flags: FlatDoc, build: ConfigBuilder, ledger: Ledger) -> None:
    seq = to_int("--data.max_len", flags.get("data.max_len", 2048), 1)
    build.set("training.seq_len", seq, "--data.max_len" if flags.given("data.max_len") else "(no --data.max_len)", seq)
    _batches(flags, build, ledger, seq, default_micro=8)


def _dpo(flags: FlatDoc, build: ConfigBuilder, ledger: Ledger) -> None:
    """Chosen and rejected sequences of --data.max_len each (512 by default) against a frozen reference
    (train_dpo.py: always loaded; --ref.offload keeps it on the host)."""
    seq = to_int("--data.max_len", flags.get("data.max_len", 512), 2)
    rl = {"algorithm": "dpo", "max_prompt_len": seq // 2, "max_response_len": seq - seq // 2, "reference_model": True}
    build.set("training.rl", rl, "--data.max_len" if flags.given("data.max_len") else "(no --data.max_len)", seq,
              why="chosen and rejected, each of prompt + response within max_len, beside the reference")
    build.put("training.seq_len", seq)
    if flags.get("ref.offload"):
        ledger.not_modelled("--ref.offload", "", "the reference's weights on the host between its forwards; "
                                                 "estimated resident")
    _batches(flags, build, ledger, seq, default_micro=8)


def _ppo(flags: FlatDoc, build: ConfigBuilder, ledger: Ledger) -> None:
    seq = to_int("--data.max_len", flags.get("data.max_len", 2048), 2)
    estimator = flags.get("algo.advantage.estimator", "gae")
    if estimator != "gae" and estimator not in _CRITIC_FREE:
        raise ConfigError("--algo.advantage.estimator", estimator, ", ".join(("gae",) + _CRITIC_FREE))
    if not flags.get("train.colocate_all"):
        _apart(flags, build, ledger, seq, estimator)
        return
    prompt, response = _lengths(flags, ledger, seq)
    rl = {"algorithm": "ppo" if estimator == "gae" else "grpo",
          "rollout_batch_size": to_int("--rollout.batch_size", flags.get("rollout.batch_size", 1024), 1),
          "samples_per_prompt": to_int("--rollout.n_samples_per_prompt", flags.get("rollout.n_samples_per_prompt", 1),
                                       1),
          "max_prompt_len": prompt, "max_response_len": response, "engine": "vllm",
          "engine_memory_fraction": to_float("--vllm.gpu_memory_utilization",
                                             flags.get("vllm.gpu_memory_utilization", 0.95)),
          "reference_model": to_float("--algo.kl.init_coef", flags.get("algo.kl.init_coef", 0.01)) > 0,
          "critic_model": estimator == "gae", "offload_during_rollout": bool(flags.get("ds.enable_sleep")),
          "rollout_tp": to_int("--vllm.tensor_parallel_size", flags.get("vllm.tensor_parallel_size", 1), 1)}
    ledger.mapped("--train.colocate_all", "", "the engines, the reference, the critic and the reward model share the "
                                              "actor's GPUs")
    build.set("training.rl", rl, "--algo.advantage.estimator" if flags.given("algo.advantage.estimator") else
              "(no --algo.advantage.estimator)", estimator, why=f"{rl['rollout_batch_size']} prompts x "
              f"{rl['samples_per_prompt']} samples, vLLM engines of {rl['rollout_tp']} GPU"
              f"{'s' if rl['rollout_tp'] > 1 else ''}")
    build.put("training.seq_len", seq)
    _colocated_extras(flags, ledger, rl)
    _batches(flags, build, ledger, seq, default_micro=1)


def _lengths(flags: FlatDoc, ledger: Ledger, seq: int) -> tuple[int, int]:
    """Prompt and response within --data.max_len: the response --rollout.max_new_tokens, the prompt
    the rest; without it responses run to max_len (the split then only sizes the engine's prefill)."""
    new = flags.get("rollout.max_new_tokens")
    if new is None:
        ledger.note(f"no --rollout.max_new_tokens: responses run to --data.max_len with their prompts; counted as "
                    f"{seq // 2:,} prompt + {seq - seq // 2:,} response tokens (the split sizes only the engine's "
                    "prefill chunk)")
        return seq // 2, seq - seq // 2
    response = min(to_int("--rollout.max_new_tokens", new, 1), seq - 1)
    return seq - response, response


def _colocated_extras(flags: FlatDoc, ledger: Ledger, rl: dict) -> None:
    if rl["offload_during_rollout"]:
        ledger.mapped("--ds.enable_sleep", "", "training.rl.offload_during_rollout = true")
        ledger.note("--ds.enable_sleep: offload_deepspeed_states keeps the 16-bit weights on the GPU during the "
                    "rollout; the estimate moves them to the host too")
    if flags.get("vllm.enable_sleep"):
        ledger.mapped("--vllm.enable_sleep", "", "the engines release their memory while the actor trains")
    else:
        ledger.not_modelled("(no --vllm.enable_sleep)", "", "the engines keep their memory while the actor trains; "
                            "the estimate frees it")
    reward = flags.get("reward.model_name_or_path")
    if reward:
        ledger.not_modelled("--reward.model_name_or_path", reward, "the reward model's weights on the same GPUs are "
                            "not counted")
    critic = flags.get("critic.model_name_or_path") or (str(reward).split(",")[0] if reward else None)
    if rl["critic_model"] and critic:
        ledger.note(f"the critic starts from {critic} (train_ppo_ray.py: --critic.model_name_or_path, else the "
                    "reward model); the estimate gives it the policy's architecture")
    micro = flags.get("rollout.micro_batch_size")
    if micro is not None:
        ledger.not_modelled("--rollout.micro_batch_size", micro, "the scoring pass's micro-batch; estimated with the "
                            "training's")
    for key in ("ref.offload", "reward.offload"):
        if flags.get(key):
            ledger.not_modelled(f"--{key}", "", "weights on the host between forwards; estimated resident")


def _apart(flags: FlatDoc, build: ConfigBuilder, ledger: Ledger, seq: int, estimator: str) -> None:
    """Without --train.colocate_all the engines, the critic and the reward model run on GPUs of their
    own: the estimate is of the actor's GPUs, training on sequences of --data.max_len."""
    build.set("training.seq_len", seq, "--data.max_len" if flags.given("data.max_len") else "(no --data.max_len)",
              seq, why="the actor's training on prompt + response")
    ledger.note("no --train.colocate_all: vLLM, the critic and the reward model on GPUs of their own; the estimate "
                "is of the actor's GPUs")
    if flags.get("train.colocate_actor_ref"):
        ledger.not_modelled("--train.colocate_actor_ref", "", "the reference's weights beside the actor are not "
                            "counted")
    for key in ("rollout.batch_size", "rollout.n_samples_per_prompt", "rollout.max_new_tokens", "vllm.num_engines",
                "vllm.tensor_parallel_size", "vllm.gpu_memory_utilization", "algo.advantage.estimator"):
        if flags.given(key):
            ledger.ignore(f"--{key}", flags.get(key), "the rollout runs on other GPUs")
    _batches(flags, build, ledger, seq, default_micro=1)


def _batches(flags: FlatDoc, build: ConfigBuilder, ledger: Ledger, seq: int, default_micro: int) -> None:
    if flags.get("train.dynamic_batch_enable"):
        cap = to_int("--train.max_tokens_per_gpu", flags.get("train.max_tokens_per_gpu", 16192), 1)
        micro = -(-cap // seq)
        build.set("training.micro_batch_size", micro, "--train.max_tokens_per_gpu", cap,
                  why=f"--train.dynamic_batch_enable: micro-batches of at most {cap:,} tokens, counted as {micro} "
                      f"sequence{'s' if micro > 1 else ''} of {seq:,} (an upper bound where {cap:,} is not a multiple)")
        ledger.mapped("--train.dynamic_batch_enable", "", "micro-batches by tokens")
        if flags.given("train.micro_batch_size"):
            ledger.ignore("--train.micro_batch_size", flags.get("train.micro_batch_size"), "not read with dynamic "
                                                                                          "batches")
    else:
        micro = to_int("--train.micro_batch_size", flags.get("train.micro_batch_size", default_micro), 1)
        build.set("training.micro_batch_size", micro, "--train.micro_batch_size" if flags.given(
            "train.micro_batch_size") else "(no --train.micro_batch_size)", micro)
    total = to_int("--train.batch_size", flags.get("train.batch_size", 128), 1)
    share = micro * build.get("parallel.dp", 1)
    if total % share:
        ledger.not_modelled("--train.batch_size", total, f"not a multiple of micro-batch x dp = {share}; the "
                            "estimate keeps its default number of micro-batches")
    else:
        build.set("training.global_batch_size", total, "--train.batch_size" if flags.given("train.batch_size") else
                  "(no --train.batch_size)", total)
    if flags.get("ds.packing_samples"):
        ledger.mapped("--ds.packing_samples", "", "samples packed into each micro-batch (no padding)")


def _account_rest(entry: str, flags: FlatDoc, ledger: Ledger) -> None:
    for key, value in flags.rest():
        shown = "" if value is True else value
        reason = next((r for p, r in _IGNORED_PREFIXES.items() if key.startswith(p)), None)
        if key.split(".")[0] in ("ref", "reward", "critic", "vllm") and key.endswith(("num_nodes", "num_gpus_per_node",
                                                                                         "num_engines")):
            reason = "placement of the other models (the estimate is of the actor's GPUs)"
        if reason is not None:
            ledger.ignore(f"--{key}", shown, reason)
        else:
            ledger.not_modelled(f"--{key}", shown, f"a setting of {VERSION} the estimate does not model")
