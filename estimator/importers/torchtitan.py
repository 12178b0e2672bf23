"""torchtitan: a job TOML (``--job.config_file``) read into our JSON config.

The TOML job config is torchtitan's format up to v0.2.2 (commit 73a0e6979dd10b6b1904098eb3c8f62c18ab87ce,
``torchtitan/config/job_config.py``; v0.1.0's ``config_manager.py`` names are read too: ``[float8]``,
``training.compile``). torchtitan 0.3.0 replaced it with Python config registries; the memory rules
the estimate applies are the ones measured on torchtitan 0.3.0, whose model definitions and FSDP2
wrapping are the same for these settings. What the file leaves out takes v0.2.2's defaults, which
`_DEFAULTS` quotes. Overrides in torchtitan's own CLI form (``--training.seq_len 8192``) can be given
beside the file.
"""

from __future__ import annotations

import re
from dataclasses import replace

from ..spec.errors import ConfigError
from .build import ConfigBuilder, to_int
from .result import Imported, Ledger
from .source import parse_toml
from .torchtitan_layout import _parallel
from .torchtitan_job import _Job, VERSION, _DEFAULTS

KIND = "torchtitan"

# Every section and key of v0.2.2's JobConfig (and v0.1.0's JobConfig), read from their dataclasses
KNOWN_KEYS: dict[str, frozenset[str]] = {
    "activation_checkpoint": frozenset(["debug", "determinism_check", "early_stop", "memory_budget", "mode",
                                        "per_op_sac_force_recompute_mm_shapes_by_fqns", "preserve_rng_state",
                                        "selective_ac_option", "visualize_memory_budget_pareto"]),
    "checkpoint": frozenset(["async_mode", "create_seed_checkpoint", "enable", "enable_checkpoint",
                             "enable_first_step_checkpoint", "enable_ft_dataloader_checkpoints", "exclude_from_loading",
                             "export_dtype", "folder", "initial_load_in_hf", "initial_load_in_hf_quantized",
                             "initial_load_model_only", "initial_load_model_weights_only", "initial_load_path",
                             "interval", "keep_latest_k", "last_save_in_hf", "last_save_model_only",
                             "last_save_model_weights_only", "load_only", "load_step"]),
    "comm": frozenset(["init_timeout_seconds", "mode", "save_traces_file_prefix", "save_traces_folder",
                       "trace_buf_size", "train_timeout_seconds"]),
    "compile": frozenset(["backend", "components", "enable"]),
    "debug": frozenset(["deterministic", "deterministic_warn_only", "moe_force_load_balance", "seed"]),
    "experimental": frozenset(["custom_args_module", "custom_import"]),
    "fault_tolerance": frozenset(["enable", "fragment_sync_delay", "fragment_update_alpha", "group_size",
                                  "min_replica_size", "process_group", "process_group_timeout_ms", "replica_id",
                                  "semi_sync_method", "should_quantize", "sync_steps"]),
    "float8": frozenset(["emulate", "enable_fsdp_float8_all_gather", "filter_fqns", "force_recompute_fp8_weight_in_bwd",
                         "precompute_float8_dynamic_scale_for_fsdp", "recipe_name"]),
    "job": frozenset(["config_file", "custom_config_module", "description", "dump_folder", "print_args",
                      "print_config", "save_config_file", "use_for_integration_test"]),
    "lr_scheduler": frozenset(["decay_ratio", "decay_type", "lr_min", "min_lr_factor", "total_steps",
                               "warmup_steps"]),
    "memory_estimation": frozenset(["disable_fake_mode", "enable", "enabled"]),
    "metrics": frozenset(["disable_color_printing", "enable_tensorboard", "enable_wandb", "log_freq",
                          "save_for_all_ranks", "save_tb_folder"]),
    "model": frozenset(["converters", "flavor", "hf_assets_path", "name", "print_after_conversion",
                        "tokenizer_path"]),
    "mx": frozenset(["filter_fqns", "recipe_name", "use_fp8_dim1_cast_triton_kernel"]),
    "optimizer": frozenset(["beta1", "beta2", "early_step_in_backward", "eps", "implementation", "lr", "name",
                            "weight_decay"]),
    "parallelism": frozenset(["context_parallel_degree", "context_parallel_load_balancer",
                              "context_parallel_rotate_method", "data_parallel_replicate_degree",
                              "data_parallel_shard_degree", "disable_loss_parallel", "enable_async_tensor_parallel",
                              "enable_compiled_autograd", "expert_parallel_comm_backend", "expert_parallel_degree",
                              "expert_tensor_parallel_degree", "fsdp_reshard_after_forward",
                              "module_fqns_per_model_part", "pipeline_parallel_degree",
                              "pipeline_parallel_expert_parallel_overlap", "pipeline_parallel_first_stage_less_layers",
                              "pipeline_parallel_last_stage_less_layers", "pipeline_parallel_layers_per_stage",
                              "pipeline_parallel_microbatch_size", "pipeline_parallel_schedule",
                              "pipeline_parallel_schedule_csv", "pipeline_parallel_split_points",
                              "tensor_parallel_degree"]),
    "profiling": frozenset(["enable_memory_snapshot", "enable_profiling", "profile_freq", "profiler_active",
                            "profiler_warmup", "save_memory_snapshot_folder", "save_traces_folder"]),
    "quantize.grouped_mm.float8": frozenset(["fqns"]),
    "quantize.grouped_mm.mx": frozenset(["fqns", "recipe_name"]),
    "quantize.linear.float8": frozenset(["emulate", "enable_fsdp_float8_all_gather", "filter_fqns",
                                         "precompute_float8_dynamic_scale_for_fsdp", "recipe_name"]),
    "quantize.linear.mx": frozenset(["filter_fqns", "mxfp8_dim1_cast_kernel_choice", "recipe_name"]),
    "training": frozenset(["compile", "dataset", "dataset_path", "deterministic", "dtype", "enable_cpu_offload",
                           "gc_debug", "gc_freq", "global_batch_size", "local_batch_size", "max_norm",
                           "mixed_precision_param", "mixed_precision_reduce", "seed", "seq_len", "steps"]),
    "training.dataloader": frozenset(["num_workers", "persistent_workers", "pin_memory", "prefetch_factor"]),
    "validation": frozenset(["dataset", "dataset_path", "enable", "freq", "local_batch_size", "seq_len", "steps"]),
    "validation.dataloader": frozenset(["num_workers", "persistent_workers", "pin_memory", "prefetch_factor"]),
}
# Sections that never change memory or speed of the training step
_IGNORED_SECTIONS = {"job": "job bookkeeping", "profiling": "profiling", "metrics": "logging",
                     "lr_scheduler": "the learning-rate schedule", "checkpoint": "checkpointing", "comm": "timeouts "
                     "and traces", "experimental": "extension hooks", "validation": "evaluation between steps",
                     "fault_tolerance": "fault tolerance", "debug": "determinism and seeds",
                     "memory_estimation": "torchtitan's own estimator", "training.dataloader": "data loading"}
_DTYPES = {"bfloat16": "bf16", "float32": "fp32", "float16": "fp16"}


def _llama3(dim: int, layers: int, heads: int, kv: int | None, multiple_of: int, multiplier: float | None,
            vocab: int) -> dict:
    """models/llama3/model/args.py + model.py FeedForward: hidden = int(2 x 4 dim / 3), times
    ffn_dim_multiplier, rounded up to multiple_of; RMSNorm, no biases, untied head."""
    hidden = int(2 * 4 * dim / 3)
    if multiplier is not None:
        hidden = int(multiplier * hidden)
    hidden = multiple_of * ((hidden + multiple_of - 1) // multiple_of)
    arch = {"hidden_size": dim, "num_layers": layers, "num_attention_heads": heads, "intermediate_size": hidden,
            "vocab_size": vocab}
    if kv:
        arch["num_kv_heads"] = kv
    return arch


def _qwen3(dim, layers, heads, kv, hidden, tied=False, experts=0, moe_width=None, top_k=None) -> dict:
    """models/qwen3: head_dim 128, per-head q/k RMSNorm, vocabulary 151936; MoE flavors have every
    layer MoE with no shared expert."""
    arch = {"hidden_size": dim, "num_layers": layers, "num_attention_heads": heads, "num_kv_heads": kv,
            "head_dim": 128, "intermediate_size": hidden, "vocab_size": 151936, "qk_norm": True}
    if tied:
        arch["tie_embeddings"] = True
    if experts:  # every layer is MoE: the dense width (hidden_dim) is never built
        del arch["intermediate_size"]
        arch.update(num_experts=experts, num_experts_per_token=top_k, moe_intermediate_size=moe_width)
    return arch


def _deepseek(vocab, dim, inter, moe_inter, layers, dense, heads, experts, shared, top_k, q_rank) -> dict:
    """models/deepseek_v3: MLA (kv rank 512, nope 128, rope 64, v 128), n_dense_layers dense first;
    the router's expert bias is a buffer, not a parameter; no MTP module."""
    arch = {"hidden_size": dim, "num_layers": layers, "num_attention_heads": heads, "intermediate_size": inter,
            "vocab_size": vocab, "num_experts": experts, "num_experts_per_token": top_k,
            "moe_intermediate_size": moe_inter, "num_shared_experts": shared, "first_dense_layers": dense,
            "kv_lora_rank": 512, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128}
    if q_rank:
        arch["q_lora_rank"] = q_rank
    return arch


# (model.name, model.flavor) -> canonical architecture, from v0.2.2 models/<name>/__init__.py
FLAVORS: dict[tuple[str, str], dict] = {
    ("llama3", "debugmodel"): _llama3(256, 6, 16, None, 256, None, 2048),
    ("llama3", "8B"): _llama3(4096, 32, 32, 8, 1024, 1.3, 128256),
    ("llama3", "70B"): _llama3(8192, 80, 64, 8, 4096, 1.3, 128256),
    ("llama3", "405B"): _llama3(16384, 126, 128, 8, 4096, 1.2, 128256),
    ("qwen3", "0.6B"): _qwen3(1024, 28, 16, 8, 3072, tied=True),
    ("qwen3", "1.7B"): _qwen3(2048, 28, 16, 8, 6144, tied=True),
    ("qwen3", "4B"): _qwen3(2560, 36, 32, 8, 9728, tied=True),
    ("qwen3", "8B"): _qwen3(4096, 36, 32, 8, 12288),
    ("qwen3", "14B"): _qwen3(5120, 40, 40, 8, 17408),
    ("qwen3", "32B"): _qwen3(5120, 64, 64, 8, 25600),
    ("qwen3", "30B-A3B"): _qwen3(2048, 48, 32, 4, 6144, experts=128, moe_width=768, top_k=8),
    ("qwen3", "235B-A22B"): _qwen3(4096, 94, 64, 4, 12288, experts=128, moe_width=1536, top_k=8),
    ("deepseek_v3", "16B"): _deepseek(102400, 2048, 10944, 1408, 27, 1, 16, 64, 2, 6, 0),
    ("deepseek_v3", "236B"): _deepseek(102400, 5120, 12288, 1536, 60, 1, 128, 160, 2, 6, 1536),
    ("deepseek_v3", "671B"): _deepseek(129280, 7168, 18432, 2048, 61, 3, 128, 256, 1, 8, 1536),
}


def looks_like(text: str, name: str = "") -> bool:
    """A TOML with torchtitan's [model] and one of its training sections."""
    return bool(re.search(r"^\s*\[model\]", text, re.M)) and \
        bool(re.search(r"^\s*\[(parallelism|activation_checkpoint|training)\]", text, re.M))


def read(text: str, gpus: int | None = None, overrides: tuple[str, ...] = ()) -> Imported:
    ledger = Ledger()
    flat = _flatten(parse_toml(text, "job TOML"), ledger)
    flat.update(_overrides(overrides, ledger))
    job = _Job(flat)
    build = ConfigBuilder(ledger)
    build.put("training.framework", "fsdp2")
    ledger.note(f"framework fsdp2 ({VERSION} job config: FSDP2 fully_shard, bf16 compute, fp32 reduce)")
    arch = _model(job, build, ledger)
    _training(job, build, ledger)
    _parallel(job, build, ledger, gpus, arch)
    _memory_savers(job, build, ledger, arch)
    _account_rest(job, ledger)
    return ledger.result(KIND, {"model": build.named_model or build.model, **build.config})


def _flatten(data: dict, ledger: Ledger, prefix: str = "") -> dict[str, object]:
    out: dict[str, object] = {}
    for key, value in data.items():
        path = f"{prefix}{key}"
        if isinstance(value, dict) and (path in KNOWN_KEYS or any(s.startswith(path + ".") for s in KNOWN_KEYS)):
            out.update(_flatten(value, ledger, path + "."))
            continue
        section = prefix[:-1]
        if section in KNOWN_KEYS and key in KNOWN_KEYS[section]:
            out[path] = value
        else:
            ledger.strange(path, value if not isinstance(value, dict) else "{...}", f"not a key of {VERSION}'s job "
                           "config")
    return out


def _overrides(words: tuple[str, ...], ledger: Ledger) -> dict[str, object]:
    """torchtitan's CLI overrides: ``--section.key value``, ``--section.key=value``, a bare boolean."""
    out: dict[str, object] = {}
    i = 0
    while i < len(words):
        word = words[i]
        i += 1
        if not word.startswith("--"):
            ledger.strange(word, "", "a word without a --section.key before it")
            continue
        key, eq, value = word[2:].partition("=")
        if not eq:
            if i < len(words) and not words[i].startswith("--"):
                value = words[i]
                i += 1
            else:
                value = "true"
        section, _, name = key.rpartition(".")
        if section not in KNOWN_KEYS or name not in KNOWN_KEYS[section]:
            ledger.strange(word.partition("=")[0], value, f"not a key of {VERSION}'s job config")
            continue
        out[key] = _cli_value(value)
    return out


def _cli_value(text: str) -> object:
    if text.lower() in ("true", "false"):
        return text.lower() == "true"
    if re.fullmatch(r"-?\d{1,18}", text):
        return int(text)
    if "," in text:
        return [t.strip() for t in text.split(",") if t.strip()]
    return text


# --- the model ----------------------------------------------------------------------------------

def _model(job: _Job, build: ConfigBuilder, ledger: Ledger):
    from ..spec.architecture import Architecture
    name, flavor = job.get("model.name"), job.get("model.flavor")
    arch_fields = FLAVORS.get((name, flavor))
    if arch_fields is None:
        known = ", ".join(f"{n} {f}" for n, f in FLAVORS)
        raise ConfigError("model.flavor", f"{name} {flavor}", f"one of {known}", f"not a {VERSION} flavor this "
                          "estimator knows")
    arch = Architecture(**arch_fields)
    preset = _same_preset(arch)
    label = f"{name} {flavor}"
    if preset:
        build.named_model = preset
        ledger.mapped("model.name, model.flavor", label, f"model = \"{preset}\" (the bundled preset with "
                                                         f"{VERSION}'s {label} shapes)")
    else:
        build.model.update(arch_fields)
        ledger.mapped("model.name, model.flavor", label, f"model = {VERSION}'s {label} shapes")
    for key in ("model.hf_assets_path", "model.tokenizer_path"):
        if job.given(key):
            ledger.ignore(key, job.get(key), "the tokenizer's files; the flavor fixes the vocabulary")
    return arch


def _same_preset(arch) -> str | None:
    from ..models.presets import get_architecture, preset_ids
    for pid in preset_ids():
        preset = get_architecture(pid)
        if replace(preset, name=arch.name) == arch:
            return pid
    return None


# --- the training setup -------------------------------------------------------------------------

def _training(job: _Job, build: ConfigBuilder, ledger: Ledger) -> None:
    seq = to_int("training.seq_len", job.get("training.seq_len"), 1)
    _set(build, job, "training.seq_len", "training.seq_len", seq)
    local = to_int("training.local_batch_size", job.get("training.local_batch_size"), 1)
    _set(build, job, "training.micro_batch_size", "training.local_batch_size", local)
    gbs = to_int("training.global_batch_size", job.get("training.global_batch_size"), -1)
    if gbs != -1:  # -1: local_batch_size x the data-parallel degree, no gradient accumulation
        build.set("training.global_batch_size", gbs, "training.global_batch_size")
    dtype = _dtype(job, "training.dtype")
    param = _dtype(job, "training.mixed_precision_param")
    reduce = _dtype(job, "training.mixed_precision_reduce")
    if dtype == "bf16":  # training.dtype bfloat16: the sharded parameters themselves are bf16, no fp32 copy
        build.set("training.param_dtype", "bf16", "training.dtype", "bfloat16", why="no fp32 master copy")
        build.put("training.master_weights", False)
        build.put("training.grad_dtype", "bf16")
        build.put("training.optimizer_dtype", "bf16")
    else:  # fp32 sharded parameters (the master copy), gathered in mixed_precision_param
        _set(build, job, "training.param_dtype", "training.mixed_precision_param", param,
             why="the gathered compute copy; the fp32 shards are the master weights")
        _set(build, job, "training.grad_dtype", "training.mixed_precision_reduce", reduce)
        if param == "fp32":
            build.put("training.compute_dtype", "fp32")
    if job.get("training.enable_cpu_offload"):
        build.set("training.offload_optimizer", "cpu", "training.enable_cpu_offload", True,
                  why="FSDP2 CPUOffloadPolicy: parameters, gradients and optimizer states on the host")
        build.put("training.offload_parameters", "cpu")
    name = str(job.get("optimizer.name"))
    if name.lower() in ("adamw", "adam"):
        if job.given("optimizer.name"):
            ledger.mapped("optimizer.name", name, "training.optimizer = \"adamw\"")
    else:
        ledger.not_modelled("optimizer.name", name, "estimated as AdamW (two moments per parameter)")
    if job.get("optimizer.early_step_in_backward"):
        build.set("training.optimizer_in_backward", True, "optimizer.early_step_in_backward", True)
    # v0.2.2 components/loss.py: cross_entropy over the full fp32 logits (compiled or not)
    build.put("training.loss", "standard")


def _dtype(job: _Job, key: str) -> str:
    value = job.get(key)
    if value not in _DTYPES:
        raise ConfigError(key, value, "'bfloat16' or 'float32'")
    return _DTYPES[value]


def _set(build: ConfigBuilder, job: _Job, path: str, key: str, value: object, why: str = "") -> None:
    """A field from a key, noted as torchtitan's default where the file leaves the key out."""
    if job.given(key):
        build.set(path, value, key, job.flat[key], why=why)
    else:
        build.set(path, value, f"(no {key})", _DEFAULTS.get(key), why=f"{VERSION}'s default" + (f"; {why}" if why
                                                                                                else ""))


# --- memory savers ------------------------------------------------------------------------------

def _memory_savers(job: _Job, build: ConfigBuilder, ledger: Ledger, arch) -> None:
    mode = job.get("activation_checkpoint.mode")
    option = str(job.get("activation_checkpoint.selective_ac_option"))
    key = "activation_checkpoint.mode" if job.given("activation_checkpoint.mode") else "(no activation_checkpoint.mode)"
    if mode == "none":
        if job.given("activation_checkpoint.mode"):
            ledger.mapped(key, mode, "training.recompute = \"none\"")
    elif mode == "full":
        build.set("training.recompute", "full", key, mode)
    elif mode == "selective" and option == "op":
        build.set("training.recompute", "selective", key, f"{mode} (op)", why="operator-level selective AC")
    elif mode == "selective" and re.fullmatch(r"\d{1,4}", option) and int(option) >= 1:
        every = int(option)  # layer-level: every `every`-th block is checkpointed in full
        build.set("training.recompute", "full", key, f"{mode} ({option})", why="layer-level selective AC")
        if every != 1:
            build.put("training.recompute_every", every)
    elif mode == "memory_budget":
        ledger.not_modelled("activation_checkpoint.mode", mode, "the partitioner's memory budget; estimated "
                            "without recomputation")
    else:
        raise ConfigError("activation_checkpoint.mode", f"{mode} {option}", "'none', 'full', 'selective' with "
                          "selective_ac_option 'op' or a positive integer, or 'memory_budget'")
    if job.given("activation_checkpoint.selective_ac_option") and mode != "selective":
        ledger.ignore("activation_checkpoint.selective_ac_option", option, "read only with mode 'selective'")
    compiled = job.get("compile.enable") or job.flat.get("training.compile") is True
    components = job.get("compile.components") or []
    if compiled and "model" in components:
        build.set("training.compile", True, "compile.enable", True, why="torch.compile per transformer block")
    if compiled and "model" in components and "loss" not in components:
        # the loss stays eager (compile.components, torchtitan 0.2.0 on: memory/titan_releases.py)
        build.set("training.compile_loss", False, "compile.components", components, why="the loss runs eagerly")
    if job.given("training.compile"):
        job.used.add("training.compile")
    _float8(job, build, ledger, arch)


def _float8(job: _Job, build: ConfigBuilder, ledger: Ledger, arch) -> None:
    converters = job.get("model.converters") or []
    converters = [converters] if isinstance(converters, str) else list(converters)
    for name in converters:
        if name not in ("quantize.linear.float8", "float8"):
            ledger.not_modelled("model.converters", name, "a converter the estimate does not model")
    named = [c for c in converters if c in ("quantize.linear.float8", "float8")]
    if not named:
        return
    # v0.2.2 reads its settings from [quantize.linear.float8]; v0.1.0 (converter "float8") from [float8]
    section = "float8" if any(k.startswith("float8.") for k in job.flat) else "quantize.linear.float8"
    build.set("training.fp8", True, "model.converters", named[0], why="torchao Float8Linear on every linear but "
              "the output")
    recipe = job.get(f"{section}.recipe_name")
    if recipe in (None, "tensorwise"):
        pass
    elif recipe == "rowwise":
        build.set("training.fp8_recipe", "rowwise", f"{section}.recipe_name", recipe)
    else:
        ledger.not_modelled(f"{section}.recipe_name", recipe, "estimated as rowwise scaling")
        build.put("training.fp8_recipe", "rowwise")
    if job.get(f"{section}.enable_fsdp_float8_all_gather"):
        build.set("training.fp8_all_gather", True, f"{section}.enable_fsdp_float8_all_gather", True)
    for key in ("precompute_float8_dynamic_scale_for_fsdp", "filter_fqns", "emulate",
                "force_recompute_fp8_weight_in_bwd"):
        if job.given(f"{section}.{key}"):
            job.used.add(f"{section}.{key}")
            note = "which linears stay in bf16 (the estimate converts every linear but the output)" \
                if key == "filter_fqns" else "scale bookkeeping"
            ledger.ignore(f"{section}.{key}", job.flat[f"{section}.{key}"], note)


def _account_rest(job: _Job, ledger: Ledger) -> None:
    pipelined = job.flat.get("parallelism.pipeline_parallel_degree", 1) not in (1, None)
    for key, value in job.flat.items():
        if key in job.used:
            continue
        section = key.rpartition(".")[0]
        reason = _IGNORED_SECTIONS.get(section) or _IGNORED_SECTIONS.get(section.split(".")[0])
        if reason is None and key in _NO_EFFECT:
            reason = _NO_EFFECT[key]
        if reason is None and _OFF.get(key, _MISSING) == value:
            reason = "off (the default)"
        if reason is None and key.startswith("parallelism.pipeline_parallel") and not pipelined:
            reason = "read only with pipeline_parallel_degree > 1"
        if reason is not None:
            ledger.ignore(key, value, reason)
        elif section.startswith(("quantize", "float8", "mx")):
            ledger.ignore(key, value, "a converter's setting; its converter is not in model.converters")
        else:
            ledger.not_modelled(key, value, f"a {VERSION} setting the estimate does not model")


_MISSING = object()
# settings that change memory or speed when on, and are off here
_OFF = {"parallelism.enable_async_tensor_parallel": False, "parallelism.disable_loss_parallel": False,
        "parallelism.enable_compiled_autograd": False, "parallelism.expert_parallel_comm_backend": "standard",
        "activation_checkpoint.early_stop": False, "training.enable_cpu_offload": False}
_NO_EFFECT = {
    "training.dataset": "data", "training.dataset_path": "data", "training.max_norm": "gradient clipping",
    "training.steps": "run length", "training.gc_freq": "Python garbage collection timing",
    "training.gc_debug": "debugging", "training.seed": "seeds", "training.deterministic": "determinism",
    "optimizer.lr": "learning rate", "optimizer.beta1": "optimizer hyper-parameter",
    "optimizer.beta2": "optimizer hyper-parameter", "optimizer.eps": "optimizer hyper-parameter",
    "optimizer.weight_decay": "optimizer hyper-parameter", "optimizer.implementation": "the kernel, not the states",
    "model.print_after_conversion": "logging", "compile.backend": "the compiler backend",
    "activation_checkpoint.preserve_rng_state": "RNG bookkeeping", "activation_checkpoint.debug": "debugging",
    "activation_checkpoint.determinism_check": "debugging", "activation_checkpoint.visualize_memory_budget_pareto":
    "debugging", "parallelism.context_parallel_load_balancer": "token order, not sizes",
    "parallelism.pipeline_parallel_schedule_csv": "a custom schedule file (not read)",
}
