"""slime: its launch script (``ray job submit ... -- python3 train.py`` with Megatron-LM's flags, slime's
``--rollout-*`` / ``--actor-*`` flags and SGLang's under ``--sglang-``) read into our JSON config with
``training.rl``.

Flags and defaults follow slime at commit 624b824a898ab0ec1fcb4d373004c7f3852bf515 (after v0.3.1; the
flag table is `slime_flags`); the Megatron flags are read as the `megatron` importer reads them
(Megatron-LM core_v0.16.1's table: slime's image pins a later Megatron commit, whose new flags are
reported unknown). What slime decides on top of Megatron:

- the actor trains on ``--actor-num-nodes x --actor-num-gpus-per-node`` GPUs (1 x 8), always with
  the distributed optimizer and in bf16 unless ``--fp16``
  (``slime/backends/megatron_utils/arguments.py`` ``_set_default_megatron_args``);
- the SGLang engines share those GPUs with ``--colocate`` (``--rollout-num-gpus-per-engine`` GPUs
  each), and the actor's states then leave the GPU during the rollout (``--offload-train``, on by
  default with ``--colocate``; ``slime/utils/arguments.py`` ``slime_validate_args``);
- ``--use-dynamic-batch-size`` packs micro-batches of at most ``--max-tokens-per-gpu x cp`` tokens
  (``slime/utils/dp_schedule.py``), ``--micro-batch-size`` otherwise;
- the reference (``--use-kl-loss`` or ``--kl-coef`` != 0) is a copy of the actor's weights kept in
  pinned host memory and swapped into the actor's parameters for its log-probs
  (``slime/utils/tensor_backper.py``, ``backends/megatron_utils/actor.py``): no second copy on the GPU;
- ``--advantage-estimator ppo`` trains a critic on the actor's GPUs (``ray/placement_group.py``);
- ``--debug-train-only`` (SFT scripts with ``--loss-type sft_loss``) launches no engine;
- the training actors run NCCL without cuMem: slime gives them NCCL_CUMEM_ENABLE from the job's environment,
  else "0", then ``--train-env-vars`` (``slime/ray/actor_group.py`` ``_allocate_gpus_for_actor``).
"""

from __future__ import annotations

import json
import re

from ..spec.errors import ConfigError
from . import megatron, megatron_flags, slime_flags
from . import megatron_args as margs, megatron_model as mmodel, megatron_training as mtrain
from .build import ConfigBuilder, split_flags, to_float
from .models import named_model, preset_for
from .result import Imported, Ledger, Setting
from .nccl_env import read_cumem
from .shell import Launch, read_launch

KIND = "slime"
VERSION = "slime 624b824a"
_ENTRY = re.compile(r"(?:^|/)train(?:_async)?\.py$")
_UNSET_WORD = re.compile(r"\$\{?([A-Za-z_]\w*)(\[[@*]\])?\}?")  # ${MODEL_ARGS[@]} left as written: not set
_ESTIMATORS = ("grpo", "gspo", "cispo", "reinforce_plus_plus", "reinforce_plus_plus_baseline", "ppo")

# slime's own flags read below
_READ = {"--actor-num-nodes", "--actor-num-gpus-per-node", "--colocate", "--offload", "--offload-train",
         "--no-offload-train", "--offload-rollout", "--no-offload-rollout", "--release-train", "--rollout-num-gpus",
         "--rollout-num-gpus-per-engine", "--hf-checkpoint", "--rollout-batch-size", "--n-samples-per-prompt",
         "--rollout-max-prompt-len", "--rollout-max-response-len", "--rollout-max-context-len",
         "--advantage-estimator", "--use-kl-loss", "--kl-coef", "--use-dynamic-batch-size", "--max-tokens-per-gpu",
         "--debug-train-only", "--debug-rollout-only", "--loss-type", "--num-steps-per-rollout",
         "--sglang-mem-fraction-static"}
# slime's flags that leave memory and speed alone, by the first words of their names, with the reason
_IGNORED_PREFIXES = {
    "--eval-": "evaluation", "--wandb-": "logging", "--use-wandb": "logging", "--tb-": "logging",
    "--use-tensorboard": "logging", "--log-": "logging", "--ci-": "CI checks", "--rollout-health-": "fault tolerance",
    "--use-fault-tolerance": "fault tolerance", "--rm-": "the reward function (on the CPU)", "--reward-key": "rewards",
    "--custom-rm-path": "the reward function (on the CPU)", "--group-rm": "the reward function (on the CPU)",
    "--custom-reward-post-process-path": "rewards", "--save-debug-": "debug dumps", "--dump-details": "debug dumps",
    "--load-debug-": "debug data", "--router-": "the SGLang router (a CPU process)",
    "--sglang-router-": "the SGLang router (a CPU process)", "--n-samples-per-eval-prompt": "evaluation",
    "--skip-eval-before-train": "evaluation", "--disable-wandb-random-suffix": "logging",
    "--memory-snapshot-": "profiling", "--memory-recorder": "profiling", "--profile-target": "profiling",
}
_IGNORED = {
    **dict.fromkeys(("--prompt-data", "--input-key", "--label-key", "--metadata-key", "--tool-key", "--multimodal-keys",
                     "--apply-chat-template", "--apply-chat-template-kwargs", "--data-source-path",
                     "--disable-rollout-global-dataset", "--rollout-shuffle", "--rollout-seed", "--num-rollout",
                     "--num-epoch", "--start-rollout-id", "--balance-data", "--rollout-task-type"),
                    "data and its order"),
    **dict.fromkeys(("--rollout-temperature", "--rollout-top-p", "--rollout-top-k", "--rollout-stop",
                     "--rollout-stop-token-ids", "--rollout-skip-special-tokens", "--rollout-function-path",
                     "--custom-generate-function-path", "--rollout-sample-hook-path", "--rollout-sample-filter-path",
                     "--rollout-all-samples-process-path", "--dynamic-sampling-filter-path",
                     "--over-sampling-batch-size",
                     "--buffer-filter-path", "--rollout-data-postprocess-path", "--custom-rollout-log-function-path",
                     "--custom-eval-rollout-log-function-path", "--min-batch-collection-ratio",
                     "--fetch-trajectory-retry-times", "--rollout-buffer-url", "--rollout-data-transport",
                     "--http-proxy", "--use-distributed-post"), "sampling and the rollout's bookkeeping"),
    **dict.fromkeys(("--eps-clip", "--eps-clip-high", "--eps-clip-c", "--value-clip", "--kl-loss-coef",
                     "--kl-loss-type", "--entropy-coef", "--gamma", "--lambd", "--normalize-advantages",
                     "--disable-grpo-std-normalization", "--disable-rewards-normalization", "--use-unbiased-kl",
                     "--use-tis", "--tis-clip", "--tis-clip-low", "--custom-tis-function-path", "--use-opsm",
                     "--opsm-delta", "--get-mismatch-metrics", "--use-rollout-logprobs", "--use-rollout-entropy",
                     "--disable-compute-advantages-and-returns", "--custom-advantage-function-path",
                     "--custom-pg-loss-reducer-function-path", "--loss-mask-type", "--num-critic-only-steps",
                     "--ref-update-interval"),
                    "loss coefficients and advantages (a few scalars per token)"),
    **dict.fromkeys(("--ref-load", "--ref-ckpt-step", "--save-hf", "--model-name", "--custom-config-path",
                     "--update-weights-interval"), "checkpoints, names and intervals"),
    "--num-gpus-per-node": "the rollout's GPUs per node (placement only)",
    "--train-backend": "megatron, the only backend",
}
# the rollout's settings, read only where there is one
_ROLLOUT_FLAGS = ("--rollout-batch-size", "--n-samples-per-prompt", "--rollout-max-prompt-len",
                  "--rollout-max-response-len", "--rollout-max-context-len", "--advantage-estimator",
                  "--rollout-num-gpus-per-engine", "--rollout-num-gpus", "--colocate", "--sglang-mem-fraction-static",
                  "--use-kl-loss", "--kl-coef")
_SGLANG_IGNORED = {"--sglang-log-level", "--sglang-server-concurrency", "--sglang-enable-metrics",
                   "--sglang-log-requests", "--sglang-decode-log-interval", "--sglang-random-seed"}


def is_entry(word: str) -> bool:
    return bool(_ENTRY.search(word))


def looks_like(text: str, name: str = "") -> bool:
    return bool(re.search(r"(^|[\s/])train(_async)?\.py\b", text)) and bool(
        re.search(r"--(rollout-batch-size|actor-num-gpus-per-node|hf-checkpoint|rollout-num-gpus)\b", text))


def _arity(flag: str) -> int | None:
    if flag in megatron_flags.FLAGS:
        return megatron_flags.FLAGS[flag][0]
    return slime_flags.arity(flag)


def read(text: str, gpus: int | None = None, overrides: tuple[str, ...] = ()) -> Imported:
    """`overrides`: flags given beside the file; they come last, so they win as in argparse."""
    ledger = Ledger()
    launch = read_launch(text, is_entry)
    for note in launch.notes:
        ledger.note(note)
    words = _set_words(launch.args + tuple(overrides), ledger)
    values = split_flags(words, _arity, ledger, VERSION)
    if not values:
        raise ConfigError("launch config", "slime", "a slime train.py command line, its script or its arguments",
                          "no slime flags found")
    args = margs._Args({f: v for f, v in values.items() if f in megatron_flags.FLAGS})
    own = margs._Args({f: v for f, v in values.items() if f not in megatron_flags.FLAGS})
    build = ConfigBuilder(ledger)
    world = _world(own, gpus, ledger)
    implied = _slime_defaults(args)
    _model(args, own, build, ledger)
    mtrain._precision(args, build, ledger)
    mtrain._recompute(args, build, ledger)
    mtrain._kernels(args, build, ledger)
    mtrain._optimizer(args, build, ledger)
    mtrain._parallel(args, build, ledger, world)
    _dense_expert_sizes(build, ledger)
    rl = _rl(own, build, ledger)
    _batches(args, own, build, ledger, rl)
    _relabel(ledger, implied)
    mtrain._account_rest(args, ledger)
    train_env = _train_env(own, ledger)
    _account_own(own, ledger)
    _environment(launch, build, ledger, train_env)
    return ledger.result(KIND, {"model": build.named_model or build.model, **build.config})


def _set_words(words: tuple[str, ...], ledger: Ledger) -> tuple[str, ...]:
    """The words of the launch without variables the file does not set (``${MODEL_ARGS[@]}`` of a
    model script the launch script sources, which is not read), each reported."""
    kept = []
    for word in words:
        m = _UNSET_WORD.fullmatch(word)
        if m:
            hint = (" (slime's scripts set it in the scripts/models/*.sh they source: give that file first, "
                    "cat models/X.sh run.sh | llm-memory check -)" if m.group(1) == "MODEL_ARGS" else "")
            ledger.note(f"{word}: {m.group(1)} is not set in the file, not read{hint}")
        else:
            kept.append(word)
    return tuple(kept)


def _world(own: margs._Args, gpus: int | None, ledger: Ledger) -> int:
    nodes = own.int("--actor-num-nodes", default=1)
    per_node = own.int("--actor-num-gpus-per-node", default=8)
    world = nodes * per_node
    ledger.mapped("--actor-num-nodes x --actor-num-gpus-per-node", f"{nodes} x {per_node}", f"world size {world} "
                  "(the actor's GPUs)")
    if gpus is not None and gpus != world:
        raise ConfigError("--gpus", gpus, f"{world} = --actor-num-nodes x --actor-num-gpus-per-node")
    return world


def _slime_defaults(args: margs._Args) -> tuple[str, ...]:
    """Megatron settings slime always makes (_set_default_megatron_args): given to the Megatron
    readers as switches, their lines relabelled afterwards (`_relabel`)."""
    implied = []
    if not args.values.get("--fp16") and "--bf16" not in args.values:
        args.values["--bf16"] = True
        implied.append("--bf16")
    if "--use-distributed-optimizer" not in args.values:
        args.values["--use-distributed-optimizer"] = True
        implied.append("--use-distributed-optimizer")
    return tuple(implied)


def _relabel(ledger: Ledger, implied: tuple[str, ...]) -> None:
    for i, s in enumerate(ledger.read):
        if s.name in implied and s.value == "":
            ledger.read[i] = Setting(f"(slime sets {s.name})", "", s.note + "; slime's _set_default_megatron_args")


# --- the model ----------------------------------------------------------------------------------

def _model(args: margs._Args, own: margs._Args, build: ConfigBuilder, ledger: Ledger) -> None:
    """The architecture flags (MODEL_ARGS), else the model --hf-checkpoint names."""
    checkpoint = own.take("--hf-checkpoint")
    if any(f in args.values for f in ("--num-layers", "--hidden-size", "--num-attention-heads")):
        mmodel._model(args, build, ledger)
        if checkpoint is not None:
            ledger.mapped("--hf-checkpoint", checkpoint, "the engine's weights: the model the flags above describe")
        return
    name = str(checkpoint or "").rstrip("/")
    build.named_model = named_model(name, "--hf-checkpoint", "a Hugging Face id (org/name) or a folder named as a "
                                    "bundled model, or the model's Megatron flags (the MODEL_ARGS of slime's "
                                    "scripts/models/*.sh, given before the launch script)",
                                    "the launch does not say the model's shape", value=checkpoint)
    ledger.mapped("--hf-checkpoint", checkpoint, f"model = {build.named_model!r} (no architecture flags: the model "
                                                "the checkpoint names" + (", bundled" if preset_for(name) else "") + ")")


def _dense_expert_sizes(build: ConfigBuilder, ledger: Ledger) -> None:
    """slime's scripts give --expert-model/tensor-parallel-size 1 for dense models too: Megatron
    builds no expert layer, so they say nothing (our config refuses expert sizes without experts)."""
    if build.named_model is not None or build.get("model.num_experts"):
        return
    for path, flag in (("ep", "--expert-model-parallel-size"), ("etp", "--expert-tensor-parallel-size")):
        if build.config.get("parallel", {}).pop(path, None) is not None:
            ledger.read[:] = [Setting(s.name, s.value, "not used: the model has no experts") if s.name == flag else s
                              for s in ledger.read]


# --- the rollout --------------------------------------------------------------------------------

def _rl(own: margs._Args, build: ConfigBuilder, ledger: Ledger) -> dict | None:
    """training.rl, or None where slime launches no rollout engine (--debug-train-only, SFT)."""
    loss = own.take("--loss-type", "policy_loss")
    if own.on("--debug-train-only") or loss == "sft_loss":
        if own.on("--debug-train-only"):
            ledger.mapped("--debug-train-only", "", "no rollout engine: the actor's training alone")
            if "--loss-type" in own.values:
                ledger.mapped("--loss-type", loss, "the training's loss (a few scalars per token)")
        else:
            ledger.not_modelled("--loss-type", loss, "SGLang engines are launched beside SFT; estimated as the "
                                "training alone")
        for flag in _ROLLOUT_FLAGS:
            if flag in own.values and own.take(flag) is not None:
                ledger.ignore(flag, own.values[flag], "no rollout in this run")
        return None
    if own.on("--debug-rollout-only"):
        ledger.not_modelled("--debug-rollout-only", "", "the rollout alone; estimated with the training too")
    rollouts = own.int("--rollout-batch-size")
    if rollouts is None:
        raise ConfigError("--rollout-batch-size", None, "an integer (slime requires it)", "missing")
    estimator = own.take("--advantage-estimator", "grpo")
    if estimator not in _ESTIMATORS:
        raise ConfigError("--advantage-estimator", estimator, ", ".join(_ESTIMATORS))
    prompt, response = _lengths(own, ledger)
    tp = own.int("--rollout-num-gpus-per-engine", default=1)
    rl = {"algorithm": "ppo" if estimator == "ppo" else "grpo", "rollout_batch_size": rollouts,
          "samples_per_prompt": own.int("--n-samples-per-prompt", default=1), "max_prompt_len": prompt,
          "max_response_len": response, "engine": "sglang", "engine_memory_fraction": _fraction(own, ledger),
          "reference_model": False, "critic_model": estimator == "ppo",
          "offload_during_rollout": _offload_train(own, ledger, estimator), "rollout_tp": tp}
    if estimator not in ("grpo", "ppo"):
        ledger.note(f"--advantage-estimator {estimator}: no value model, estimated as GRPO's memory")
    _reference(own, ledger)
    build.set("training.rl", rl, "--advantage-estimator" if "--advantage-estimator" in own.values else
              "(no --advantage-estimator)", estimator, why=f"{rollouts} prompts x {rl['samples_per_prompt']} samples, "
              f"SGLang engines of {tp} GPU{'s' if tp > 1 else ''}")
    build.put("training.seq_len", prompt + response)
    return rl


def _lengths(own: margs._Args, ledger: Ledger) -> tuple[int, int]:
    """(prompt, response) bounds: the trained sequence and the engine's KV cache hold both."""
    response = own.int("--rollout-max-response-len")
    context = own.int("--rollout-max-context-len")
    prompt = own.int("--rollout-max-prompt-len")
    if response is None:
        if context is None or prompt is None:
            raise ConfigError("--rollout-max-response-len", None, "an integer (or --rollout-max-context-len with "
                              "--rollout-max-prompt-len)", "the responses' length bounds the trained sequence")
        response = context - prompt
    if prompt is None:
        if context is not None and context > response:
            prompt = context - response
            ledger.note(f"prompts of up to {prompt:,} tokens = --rollout-max-context-len - --rollout-max-response-len")
        else:
            prompt = 1024
            ledger.note("no --rollout-max-prompt-len: prompts of up to 1,024 tokens (the contract's default for "
                        "training.rl.max_prompt_len); add --rollout-max-prompt-len N after -- to set it")
    if prompt < 1 or response < 1:
        raise ConfigError("--rollout-max-context-len", context, "more than the prompt and the response lengths")
    return prompt, response


def _fraction(own: margs._Args, ledger: Ledger) -> float | None:
    value = own.take("--sglang-mem-fraction-static")
    if value is not None:
        return to_float("--sglang-mem-fraction-static", value)
    ledger.not_modelled("(no --sglang-mem-fraction-static)", "", "SGLang 0.5.15 picks the fraction from the GPU's "
                        "memory (ServerArgs._handle_gpu_memory_settings); the estimate sizes the engine's KV cache "
                        "by the rollout batch instead (engine_memory_fraction empty)")
    return None


def _offload_train(own: margs._Args, ledger: Ledger, estimator: str) -> bool:
    """Whether the actor's states leave the GPU while the engines generate (slime_validate_args)."""
    colocate = own.on("--colocate")
    gpus = own.take("--rollout-num-gpus")
    if not colocate:
        ledger.not_modelled("--rollout-num-gpus" if gpus is not None else "(no --colocate)", gpus or "",
                            "the engines run on GPUs of their own; the estimate counts them on the actor's GPUs as "
                            "if colocated (an upper bound of the rollout phase)")
    else:
        ledger.mapped("--colocate", "", "the engines share the actor's GPUs")
        if gpus is not None:
            ledger.mapped("--rollout-num-gpus", gpus, "with --colocate: the actor's GPUs")
    offload = own.on("--offload") or own.on("--offload-train")
    if own.on("--no-offload-train"):
        offload = False
    elif colocate and not offload:
        offload = not own.on("--release-train")
    if estimator == "ppo":
        offload = True  # slime_validate_args: args.use_critic forces offload_train
    if own.on("--release-train"):
        ledger.not_modelled("--release-train", "", "the actors are released during the rollout; estimated as "
                            "their states offloaded")
        offload = True
    for flag in ("--offload", "--offload-train", "--no-offload-train", "--offload-rollout", "--no-offload-rollout"):
        if flag in own.values:
            ledger.mapped(flag, "", f"training.rl.offload_during_rollout = {str(offload).lower()}"
                          if "rollout" not in flag else "the engine's memory is freed while the actor trains "
                                                        "(always so in the estimate)")
    return offload


def _reference(own: margs._Args, ledger: Ledger) -> None:
    kl = to_float("--kl-coef", own.take("--kl-coef", 0.0))
    if own.on("--use-kl-loss") or kl:
        name = "--use-kl-loss" if own.values.get("--use-kl-loss") else "--kl-coef"
        ledger.mapped(name, "" if name == "--use-kl-loss" else kl, "the reference: its weights stay in pinned host "
                      "memory and are swapped into the actor's for its log-probs (no GPU copy: reference_model false)")


# --- batches ------------------------------------------------------------------------------------

def _batches(args: margs._Args, own: margs._Args, build: ConfigBuilder, ledger: Ledger, rl: dict | None) -> None:
    seq = args.int("--seq-length")
    if rl is not None and seq is not None:
        ledger.ignore("--seq-length", seq, "a placeholder in slime: the trained sequences are prompt + response")
    cp = build.get("parallel.cp", 1)
    if own.on("--use-dynamic-batch-size"):
        cap = own.int("--max-tokens-per-gpu")
        if cap is None:
            raise ConfigError("--max-tokens-per-gpu", None, "an integer with --use-dynamic-batch-size", "missing")
        tokens = cap * cp
        if rl is None:  # one packed micro-batch of `tokens` tokens
            build.set("training.seq_len", tokens, "--max-tokens-per-gpu", cap, why="--use-dynamic-batch-size: "
                      f"micro-batches packed to at most {tokens:,} tokens" + (f" (x cp {cp})" if cp > 1 else ""))
        else:
            length = rl["max_prompt_len"] + rl["max_response_len"]
            mbs = -(-tokens // length)
            build.set("training.micro_batch_size", mbs, "--max-tokens-per-gpu", cap, why=f"--use-dynamic-batch-size:"
                      f" packed micro-batches of at most {tokens:,} tokens, counted as {mbs} sequence"
                      f"{'s' if mbs > 1 else ''} of {length:,} (an upper bound where {tokens:,} is not a multiple)")
        ledger.mapped("--use-dynamic-batch-size", "", "micro-batches by tokens (--micro-batch-size is not read)")
        args.take("--micro-batch-size")
        if "--micro-batch-size" in args.values:
            ledger.ignore("--micro-batch-size", args.values["--micro-batch-size"], "not read with dynamic batches")
    else:
        mbs = args.int("--micro-batch-size", default=1)
        build.set("training.micro_batch_size", mbs, "--micro-batch-size" if "--micro-batch-size" in args.values
                  else "(no --micro-batch-size)", mbs)
        if rl is None:
            build.set("training.seq_len", seq or 4096, "--seq-length" if seq else "(no --seq-length)", seq or 4096,
                      why="" if seq else "slime's placeholder 4096 (samples are not truncated)")
    _global_batch(args, own, build, rl)


def _global_batch(args: margs._Args, own: margs._Args, build: ConfigBuilder, rl: dict | None) -> None:
    """Samples per optimizer step: --global-batch-size, or rollouts x samples / --num-steps-per-rollout
    (slime_validate_args)."""
    gbs = args.int("--global-batch-size")
    steps = own.int("--num-steps-per-rollout")
    name, given = "--global-batch-size", gbs
    if steps is not None and rl is not None:
        gbs = rl["rollout_batch_size"] * rl["samples_per_prompt"] // steps
        name, given = "--num-steps-per-rollout", steps
    if gbs is None:
        return
    share = build.get("training.micro_batch_size", 1) * build.get("parallel.dp", 1)
    if gbs % share:
        build.ledger.not_modelled(name, given, f"{gbs} samples per step is not a multiple of micro-batch x dp = "
                                               f"{share}; the estimate keeps its default number of micro-batches")
    else:
        build.set("training.global_batch_size", gbs, name, given)


# --- what is left -------------------------------------------------------------------------------

def _account_own(own: margs._Args, ledger: Ledger) -> None:
    """slime's and SGLang's flags not read above: ignored, or not modelled."""
    for flag, value in own.values.items():
        if flag in own.used:
            continue
        value = "" if value is True else value
        reason = _IGNORED.get(flag) or next((r for p, r in _IGNORED_PREFIXES.items() if flag.startswith(p)), None)
        if reason is None and flag in _SGLANG_IGNORED:
            reason = "logging and request concurrency"
        if reason is not None:
            ledger.ignore(flag, value, reason)
        elif flag.startswith(("--sglang-", "--no-sglang-")):
            ledger.not_modelled(flag, value, "an SGLang server setting the rollout estimate does not model")
        else:
            ledger.not_modelled(flag, value, f"a {VERSION} setting the estimate does not model")


def _train_env(own: margs._Args, ledger: Ledger) -> dict[str, str]:
    """--train-env-vars: a JSON object of variables slime adds to the training actors' environment last
    (slime/ray/actor_group.py l. 70), so they win over the job's."""
    text = own.take("--train-env-vars")
    if text is None:
        return {}
    env = _env_vars(str(text))
    ledger.mapped("--train-env-vars", text, "the training actors' environment (its PYTORCH_CUDA_ALLOC_CONF and "
                                            "NCCL_CUMEM_ENABLE are read)")
    return env


def _environment(launch: Launch, build: ConfigBuilder, ledger: Ledger, train_env: dict[str, str]) -> None:
    """The Ray job's environment (--runtime-env-json's env_vars), else the script's variables, then
    --train-env-vars: PYTORCH_CUDA_ALLOC_CONF and NCCL_CUMEM_ENABLE, whose default in the training actors is
    slime's "0" (spec/nccl.py RL_STACKS_CUMEM_OFF); the other launcher words are Ray's (address, job options)."""
    env = dict(launch.env)
    where = "NCCL_CUMEM_ENABLE"
    for name, value in megatron._launcher_pairs(launch.launcher):
        if name == "--runtime-env-json":
            variables = _runtime_env(value)
            env.update(variables)
            if "NCCL_CUMEM_ENABLE" in variables:
                where = "--runtime-env-json NCCL_CUMEM_ENABLE"
            ledger.ignore(name, "...", "Ray's job environment (its PYTORCH_CUDA_ALLOC_CONF and NCCL_CUMEM_ENABLE are "
                                       "read)")
        elif name != "--":
            ledger.ignore(name, value, "Ray's job submission")
    env.update(train_env)
    if "NCCL_CUMEM_ENABLE" in train_env:
        where = "--train-env-vars NCCL_CUMEM_ENABLE"
    mtrain._allocator(env, build)
    read_cumem(env, build, where, stack="slime")


def _runtime_env(text: str) -> dict[str, str]:
    """--runtime-env-json's env_vars (`_env_vars`)."""
    data = _json(text)
    return _env_vars(data.get("env_vars") if isinstance(data, dict) else None)


def _env_vars(data: object) -> dict[str, str]:
    """A JSON object (or its text) of environment variables as strings; {} for anything else."""
    if isinstance(data, str):
        data = _json(data)
    return {str(k): str(v) for k, v in data.items()} if isinstance(data, dict) else {}


def _json(text: str) -> object:
    """The JSON value of a flag's text (its first 64 KiB), or None where it is not JSON."""
    try:
        return json.loads(text[:65536])
    except (json.JSONDecodeError, RecursionError):
        return None
