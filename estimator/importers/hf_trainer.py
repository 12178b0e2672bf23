"""The Hugging Face Trainer side of a launch: TrainingArguments, or TRL's SFTConfig / GRPOConfig /
DPOConfig that extend them (with TRL's ModelConfig and ScriptArguments), and a PEFT LoraConfig.
Shared by the DeepSpeed and Accelerate importers, which add the distributed side.

Defaults: transformers 5.23.0 TrainingArguments (per_device_train_batch_size 8, no gradient
checkpointing, optim adamw_torch_fused); TRL v1.9.0's _BaseConfig overrides (gradient_checkpointing
True, bf16 unless fp16), SFTConfig (max_length 1024), GRPOConfig (num_generations 8,
max_completion_length 256, beta 0.0, use_vllm False, vllm_mode colocate, vllm_gpu_memory_utilization
0.3), DPOConfig (max_length 1024, beta 0.1); PEFT 0.21.2 LoraConfig (r 8, lora_alpha 8, dropout 0).
Transformers v5 loads a checkpoint in its own dtype (bf16 for the bundled models), so bf16 training
under the plain Trainer keeps bf16 weights, gradients and optimizer states.
"""

from __future__ import annotations

import re

from ..spec.errors import ConfigError
from .build import ConfigBuilder, FlatDoc, to_float, to_int
from .finetune import trainer_optimizer, transformers_attention
from .hf_keys import LEGACY, TRAINING_ARGUMENTS, TRL
from .liger import trainer_liger
from .models import named_model, preset_for
from .result import Ledger
from .shell import read_launch
from .source import parse_json, parse_yaml

TRL_VERSION = "TRL v1.9.0"
KNOWN = TRAINING_ARGUMENTS | TRL | LEGACY
_OPTIM = {"adamw_torch": "adamw", "adamw_torch_fused": "adamw", "adamw_hf": "adamw", "adamw_apex_fused": "adamw",
          "adamw_bnb_8bit": "adam8bit", "adamw_8bit": "adam8bit", "paged_adamw_8bit": "paged_adamw8bit",
          "paged_adamw_32bit": "paged_adamw", "adafactor": "adafactor", "sgd": "sgd", "lion_32bit": "lion",
          "paged_lion_32bit": "lion"}
_PEFT_TARGETS = {"q_proj": "q", "k_proj": "k", "v_proj": "v", "o_proj": "o", "gate_proj": "gate", "up_proj": "up",
                 "down_proj": "down"}
# keys that change memory or speed and are read below; every other known key is listed as ignored
_NO_EFFECT_HINT = "a Trainer setting with no effect on the step's memory (paths, logging, schedule, data)"


def parse_args_text(text: str, what: str) -> dict:
    """TrainingArguments as JSON, YAML, or command-line flags (``--per_device_train_batch_size 4
    --bf16``, alone or in a ``trl sft ...`` / ``python train.py ...`` line)."""
    stripped = text.lstrip()
    if stripped.startswith("{"):
        data = parse_json(text, what)
    elif re.search(r"(^|\s)--[a-z_]+", text) and not _starts_as_yaml_mapping(text):
        launch = read_launch(text, lambda w: w.endswith(".py") or w in ("sft", "grpo", "dpo"))
        data, args, i = {}, list(launch.args), 0
        while i < len(args):
            word = args[i]
            i += 1
            if not word.startswith("--"):
                continue
            key, eq, value = word[2:].partition("=")
            if not eq:
                if i < len(args) and not args[i].startswith("--"):
                    value = args[i]
                    i += 1
                else:
                    value = "true"
            data[key.replace("-", "_")] = _scalar(value)
    else:
        data = parse_yaml(text, what)
    if not isinstance(data, dict):
        raise ConfigError("launch config", what, "a mapping of TrainingArguments keys to values")
    return data


def _starts_as_yaml_mapping(text: str) -> bool:
    """Whether the first line that is not blank or a comment is a YAML ``key: value`` line: a YAML file whose
    values or comments mention a flag (``# launched with --deepspeed``) is still YAML, not a command line."""
    for line in text.splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            return re.match(r"\s*[A-Za-z_][\w.-]*\s*:(\s|$)", line) is not None
    return False


def _scalar(text: str) -> object:
    lowered = text.lower()
    if lowered in ("true", "false"):
        return lowered == "true"
    for cast in (int, float):
        try:
            return cast(text)
        except ValueError:
            pass
    return text


def trainer_kind(doc: FlatDoc) -> str:
    """Which TRL trainer the arguments are for, from the keys only one of them has."""
    keys = set(doc.flat)
    if keys & {"num_generations", "max_completion_length", "use_vllm", "vllm_mode", "steps_per_generation",
               "generation_batch_size"}:
        return "grpo"
    if keys & {"precompute_ref_log_probs", "rpo_alpha", "ref_model_sync_steps"} or \
            ("beta" in keys and "max_prompt_length" in keys):
        return "dpo"
    if keys & {"packing", "max_length", "max_seq_length", "dataset_text_field", "completion_only_loss",
               "assistant_only_loss", "padding_free"}:
        return "sft"
    return "trainer"


def apply(doc: FlatDoc, build: ConfigBuilder, ledger: Ledger, framework: str, world: int,
          peft: FlatDoc | None, batch_from_ds: int | None = None) -> None:
    """The Trainer's settings into the config (model, batch, precision, savers, adapter, RL)."""
    kind = trainer_kind(doc)
    trl = kind != "trainer"
    ledger.note(f"Hugging Face {'Trainer' if not trl else TRL_VERSION + ' ' + kind.upper() + 'Config'} arguments")
    _model(doc, build, ledger, peft)
    mbs = batch_from_ds or to_int("per_device_train_batch_size", doc.get("per_device_train_batch_size", 8), 1)
    build.set("training.micro_batch_size", mbs, "per_device_train_batch_size", mbs)
    accumulate = to_int("gradient_accumulation_steps", doc.get("gradient_accumulation_steps", 1), 1)
    if accumulate > 1:
        build.set("training.global_batch_size", mbs * accumulate * build.get("parallel.dp", 1),
                  "gradient_accumulation_steps", accumulate)
    _precision(doc, build, ledger, framework, trl)
    checkpointing = doc.get("gradient_checkpointing", True if trl else None)
    if checkpointing:
        build.set("training.recompute", "full", "gradient_checkpointing", True,
                  why="" if doc.given("gradient_checkpointing") else f"{TRL_VERSION}'s default")
    trainer_optimizer(build, ledger, "optim", str(doc.get("optim", "adamw_torch_fused")), _OPTIM, doc.given("optim"))
    if doc.get("torch_compile"):
        if framework == "hf":
            build.set("training.compile", True, "torch_compile", True)
        else:
            ledger.not_modelled("torch_compile", True, f"torch.compile under {framework} is not modelled")
    if doc.get("use_liger_kernel"):
        trainer_liger(doc, build, ledger)
    attn = doc.get("attn_implementation") or doc.get("model_init_kwargs.attn_implementation")
    transformers_attention(build, ledger, "attn_implementation", attn)
    _sequence(doc, build, ledger, kind)
    if peft is not None or doc.get("use_peft"):
        _adapter(doc, build, ledger, peft)
    if kind == "sft":
        _sft_loss(doc, build, ledger, framework)
    if kind == "grpo":
        _grpo(doc, build, ledger, world)
    elif kind == "dpo":
        _dpo(doc, build, ledger)
    for key, value in doc.rest():
        if key in KNOWN or key.split(".")[0] in KNOWN:
            ledger.ignore(key, value, _NO_EFFECT_HINT)
        else:
            ledger.strange(key, value, f"not an argument of TrainingArguments or {TRL_VERSION}'s configs")


_SFT_LOSSES = ("nll", "chunked_nll", "dft")  # trl 1.9.0 sft_trainer.py: "Supported values are ..."


def _sft_loss(doc: FlatDoc, build: ConfigBuilder, ledger: Ledger, framework: str) -> None:
    """TRL's SFTTrainer: training_loop trl_sft, and its loss_type (trl v1.7.0 on: chunked_nll unless
    use_liger_kernel, sft_config.py __post_init__) as the loss (memory/activations/trl_loss.py): chunked_nll is
    loss "chunked" where the head runs 16-bit (hf, fsdp1 under the Trainer's bf16/fp16 autocast; hf_fsdp2 and
    deepspeed over a 16-bit model, the latter below ZeRO-3: settle_sft_loss, once the DeepSpeed side is read), nll
    "standard" with its metrics' moment. With Liger, Liger's loss (trainer_liger)."""
    build.set("training.training_loop", "trl_sft", "(SFTConfig)", "", why="TRL's SFTTrainer")
    if doc.get("use_liger_kernel"):
        return  # TRL refuses chunked_nll beside Liger
    given = doc.get("loss_type")
    nested = doc.section("loss_type")  # a mapping, flattened into keys of its own
    given = nested if nested else given
    if given is not None and (not isinstance(given, str) or given not in _SFT_LOSSES):
        raise ConfigError("loss_type", given, ", ".join(_SFT_LOSSES) + f" ({TRL_VERSION}'s SFTConfig)")
    loss_type = given or "chunked_nll"
    why = _chunked_unmodelled(build, framework)  # DeepSpeed's ZeRO stage is read later: settle_sft_loss
    if loss_type == "chunked_nll" and not why:
        build.trl_chunked_nll = True
        build.set("training.loss", "chunked", "loss_type", given or "(unset)",
                  why="" if given else f"{TRL_VERSION}'s default without Liger (from v1.7.0; nll before it: set "
                  "training.trl_version to the release run)")
    elif loss_type == "chunked_nll":
        ledger.not_modelled("loss_type", given or "(unset: chunked_nll)", f"{TRL_VERSION}'s chunked_nll {why}, not "
                            "modelled: estimated as transformers' loss over the whole logits")
    elif loss_type == "nll":
        ledger.mapped("loss_type", loss_type, "loss \"standard\", with the SFTTrainer's entropy and token accuracy "
                      "from the kept logits")
    else:
        ledger.not_modelled("loss_type", loss_type, "estimated as nll (the model's loss and the SFTTrainer's metrics)")


def settle_sft_loss(build: ConfigBuilder, ledger: Ledger) -> None:
    """Once a DeepSpeed config is read: TRL's chunked_nll under ZeRO-3 (TRL gathers the head's partitioned weight
    inside each chunk, utils.py maybe_gather_lm_head_ctx) or over fp32 weights is not modelled (memory/validation.py
    _check_trl_loss): the standard loss, said so."""
    why = _chunked_unmodelled(build, build.get("training.framework")) if build.trl_chunked_nll else None
    if why:
        build.trl_chunked_nll = False
        build.config["training"].pop("loss")  # the standard loss, the field's default
        ledger.not_modelled("loss_type", "chunked_nll", f"{TRL_VERSION}'s chunked_nll {why}, not modelled: "
                            "estimated as transformers' loss over the whole logits")


def _chunked_unmodelled(build: ConfigBuilder, framework: str) -> str | None:
    """memory/activations/trl_loss.py chunked_unmodelled on what the build holds so far (the fields' defaults else)."""
    from ..memory.activations.trl_loss import chunked_unmodelled
    return chunked_unmodelled(framework, build.get("training.compute_dtype", "bf16"),
                              build.get("training.param_dtype", "bf16"), build.get("parallel.zero_stage"))


def _model(doc: FlatDoc, build: ConfigBuilder, ledger: Ledger, peft: FlatDoc | None) -> None:
    name = doc.get("model_name_or_path")
    source = "model_name_or_path"
    if name is None and peft is not None:
        name, source = peft.get("base_model_name_or_path"), "base_model_name_or_path"
    if not isinstance(name, str) or not name:
        raise ConfigError("model_name_or_path", None, "a Hugging Face id or a folder named after the model",
                          "the arguments do not name the model")
    build.named_model = named_model(name, source, "a Hugging Face id (org/name) or the folder of a bundled model",
                                    "not a model this estimator can find offline")
    ledger.mapped(source, name, f"model = \"{build.named_model}\"" + (" (bundled)" if preset_for(name) else ""))


def _precision(doc: FlatDoc, build: ConfigBuilder, ledger: Ledger, framework: str, trl: bool) -> None:
    fp16 = bool(doc.get("fp16", False))
    bf16 = doc.get("bf16", (not fp16) if trl else False)
    if bf16 and fp16:
        raise ConfigError("bf16", True, "one of bf16 and fp16")
    dtype = "bf16" if bf16 else "fp16" if fp16 else "fp32"
    if framework == "hf_fsdp2":  # fp32 shards (Accelerate upcasts under mixed precision), gathered in bf16/fp16
        if dtype == "fp32":
            build.put("training.param_dtype", "fp32")
            build.put("training.compute_dtype", "fp32")
        elif dtype == "fp16":
            build.put("training.param_dtype", "fp16")
        ledger.mapped("bf16/fp16", dtype, "mixed precision over fp32 FSDP shards")
        return
    key = "bf16" if bf16 else "fp16" if fp16 else "(neither bf16 nor fp16)"
    why = "" if doc.given("bf16") or doc.given("fp16") else f"{TRL_VERSION}'s default" if trl else "fp32 training"
    if dtype == "bf16":
        ledger.mapped(key, "", "training.param_dtype = \"bf16\"" + (f"; {why}" if why else ""))
    else:
        build.set("training.param_dtype", dtype, key, "", why=why)
        if dtype == "fp32":
            build.put("training.compute_dtype", "fp32")


def _sequence(doc: FlatDoc, build: ConfigBuilder, ledger: Ledger, kind: str) -> None:
    for key in ("max_length", "max_seq_length"):
        if doc.given(key) and doc.flat[key] is not None:
            build.set("training.seq_len", to_int(key, doc.get(key), 1), key)
            break
    else:
        if kind in ("sft", "dpo"):
            build.set("training.seq_len", 1024, "(no max_length)", 1024, why=f"{TRL_VERSION}'s default")
        elif kind == "trainer":
            raise ConfigError("max_length", None, "an integer: the Trainer's arguments do not bound the sequence "
                              "length (add max_length to them)", "missing")
    if doc.get("packing"):
        ledger.mapped("packing", True, "every sequence packed to max_length")


def _adapter(doc: FlatDoc, build: ConfigBuilder, ledger: Ledger, peft: FlatDoc | None) -> None:
    """A PEFT LoraConfig (its JSON, adapter_config.json), or TRL's ModelConfig lora_* arguments."""
    def get(peft_key: str, trl_key: str, default: object) -> object:
        if peft is not None and peft.given(peft_key):
            return peft.get(peft_key)
        return doc.get(trl_key, default)

    peft_type = peft.get("peft_type", "LORA") if peft is not None else "LORA"
    if str(peft_type).upper() != "LORA":
        raise ConfigError("peft_type", peft_type, "'LORA'", "only LoRA adapters are modelled")
    targets = get("target_modules", "lora_target_modules", None)
    if targets is None:
        targets = ["q_proj", "v_proj"]  # PEFT's default for Llama/Qwen/Mistral (TRANSFORMERS_MODELS_TO_LORA_...)
        ledger.note("no target_modules: PEFT's default for this model type, q_proj and v_proj")
    if targets in ("all-linear", ["all-linear"]):
        ours: object = "all-linear"
    else:
        names = [targets] if isinstance(targets, str) else list(targets)
        unknown = [t for t in names if t not in _PEFT_TARGETS]
        if unknown:
            raise ConfigError("target_modules", unknown, "q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, "
                              "down_proj or all-linear")
        ours = [_PEFT_TARGETS[t] for t in names]
    four = doc.get("load_in_4bit") or doc.get("model_init_kwargs.quantization_config.load_in_4bit")
    eight = doc.get("load_in_8bit")
    method = "qlora" if four else "dora" if get("use_dora", "use_dora", False) else "lora"
    adapter = {"method": method, "rank": to_int("r", get("r", "lora_r", 8), 1),
               "alpha": float(get("lora_alpha", "lora_alpha", 8)), "target_modules": ours,
               "dropout": float(get("lora_dropout", "lora_dropout", 0.0))}
    if eight:
        adapter["base_dtype"] = "int8"
    save = get("modules_to_save", "lora_modules_to_save", None)
    if save:
        adapter["trainable_embeddings"] = True
    build.set("training.adapter", adapter, "LoraConfig" if peft is not None else "use_peft",
              f"{method} rank {adapter['rank']}")
    if peft is not None:
        for key, value in peft.rest():
            ledger.ignore(key, value, "a LoraConfig setting with no effect on memory")


def _grpo(doc: FlatDoc, build: ConfigBuilder, ledger: Ledger, world: int) -> None:
    """GRPOConfig: generation_batch_size = per_device_train_batch_size x processes x
    steps_per_generation (= gradient_accumulation_steps) completions, num_generations per prompt."""
    generations = to_int("num_generations", doc.get("num_generations", 8), 1)
    mbs = build.get("training.micro_batch_size")
    steps = doc.get("steps_per_generation") or doc.get("gradient_accumulation_steps", 1)
    batch = doc.get("generation_batch_size") or mbs * world * to_int("steps_per_generation", steps, 1)
    batch = to_int("generation_batch_size", batch, 1)
    if batch % generations:
        raise ConfigError("generation_batch_size", batch, f"a multiple of num_generations ({generations})")
    prompt = doc.get("max_prompt_length")
    if prompt is None:
        raise ConfigError("max_prompt_length", None, "an integer: the longest prompt (TRL 1.x leaves it to the "
                          "dataset; give it)", "missing")
    vllm = bool(doc.get("use_vllm", False))
    mode = doc.get("vllm_mode", "colocate")
    beta = to_float("beta", doc.get("beta", 0.0))
    fraction = to_float("vllm_gpu_memory_utilization", doc.get("vllm_gpu_memory_utilization", 0.3)) if vllm else None
    rl = {"algorithm": "grpo", "rollout_batch_size": batch // generations, "samples_per_prompt": generations,
          "max_prompt_len": to_int("max_prompt_length", prompt, 1),
          "max_response_len": to_int("max_completion_length", doc.get("max_completion_length", 256), 1),
          "engine": "vllm", "reference_model": beta > 0, "offload_during_rollout": False,
          "engine_memory_fraction": fraction}
    if not vllm:
        ledger.not_modelled("use_vllm", False, "generation with the policy's own generate(); estimated as a colocated "
                                               "engine holding its own weights and every sequence's KV cache")
    elif mode != "colocate":
        ledger.not_modelled("vllm_mode", mode, "vLLM on other GPUs; estimated as colocated")
    build.set("training.rl", rl, "num_generations", generations,
              why=f"{batch} completions per generation, {batch // generations} prompts")
    build.put("training.seq_len", rl["max_prompt_len"] + rl["max_response_len"])


def _dpo(doc: FlatDoc, build: ConfigBuilder, ledger: Ledger) -> None:
    length = build.get("training.seq_len")
    prompt = to_int("max_prompt_length", doc.get("max_prompt_length", min(512, length // 2)), 1)
    if prompt >= length:
        raise ConfigError("max_prompt_length", prompt, f"less than max_length ({length})")
    rl = {"algorithm": "dpo", "max_prompt_len": prompt, "max_response_len": length - prompt,
          "reference_model": not doc.get("precompute_ref_log_probs", False)}
    build.set("training.rl", rl, "beta", doc.get("beta", 0.1), why="chosen and rejected sequences against a "
              + ("reference" if rl["reference_model"] else "precomputed reference"))


def load_peft(text: str | None) -> FlatDoc | None:
    if text is None:
        return None
    data = parse_json(text, "LoraConfig") if text.lstrip().startswith("{") else parse_yaml(text, "LoraConfig")
    return FlatDoc(data, "LoraConfig")


def load_args(text: str | None) -> FlatDoc | None:
    if text is None:
        return None
    return FlatDoc(parse_args_text(text, "TrainingArguments"), "TrainingArguments")


def merge_flags(doc: FlatDoc, words: tuple[str, ...]) -> None:
    """Trainer flags given beside the files (``--per_device_train_batch_size 4``): they win."""
    if words:
        import shlex
        for key, value in parse_args_text(shlex.join(words), "overrides").items():
            doc.set(key, value)
