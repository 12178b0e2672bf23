"""``plan --emit torchtitan``: a configuration written as a torchtitan job TOML (v0.2.2 keys), for
models that are one of its flavors."""

from __future__ import annotations

import json
from dataclasses import replace

from ..spec.errors import ConfigError
from .emit_check import refuse
from .torchtitan import FLAVORS


def torchtitan_toml(cfg) -> str:
    arch, tr, par = cfg.architecture, cfg.training, cfg.parallel
    if tr.framework != "fsdp2":
        raise ConfigError("--emit", "torchtitan", f"a configuration with framework 'fsdp2' (this one is "
                          f"{tr.framework!r})")
    flavor = next((key for key, fields in FLAVORS.items()
                   if replace(arch, name="custom") == replace(_architecture(fields), name="custom")), None)
    if flavor is None:
        raise refuse("torchtitan", "model", cfg.model if isinstance(cfg.model, str) else arch.name,
                      "a model that is one of torchtitan's flavors: " + ", ".join(f"{n} {f}" for n, f in FLAVORS))
    if cfg.hardware.expandable_segments:
        raise refuse("torchtitan", "hardware.expandable_segments", True, "false (an environment variable, not a "
                      "job-config key)")
    from ..spec.training import resolve_recipe
    recipe = resolve_recipe(tr)
    sections: dict[str, dict] = {"model": {"name": flavor[0], "flavor": flavor[1]}}
    training: dict = {"local_batch_size": tr.micro_batch_size, "seq_len": tr.seq_len}
    if recipe.master_weights:
        training.update(dtype="float32", mixed_precision_param=_TORCH[tr.param_dtype],
                        mixed_precision_reduce=_TORCH[recipe.grad_dtype])
        if recipe.grad_dtype != "fp32" or recipe.optimizer_dtype != "fp32":
            raise refuse("torchtitan", "training.grad_dtype", recipe.grad_dtype, "'fp32' with fp32 master weights")
    elif tr.param_dtype == "bf16" and recipe.grad_dtype == "bf16" and recipe.optimizer_dtype == "bf16":
        training["dtype"] = "bfloat16"
    else:
        raise refuse("torchtitan", "training.master_weights", recipe.master_weights, "fp32 shards with mixed "
                      "precision, or pure bf16")
    if tr.compute_dtype != ("fp32" if tr.param_dtype == "fp32" else tr.param_dtype):
        raise refuse("torchtitan", "training.compute_dtype", tr.compute_dtype, f"{tr.param_dtype!r}")
    if tr.offload_optimizer == "cpu" and tr.offload_parameters == "cpu":
        training["enable_cpu_offload"] = True
    elif tr.offload_optimizer != "none" or tr.offload_parameters != "none":
        raise refuse("torchtitan", "training.offload_optimizer", tr.offload_optimizer, "both cpu or both none")
    sections["training"] = training
    sections["parallelism"] = _titan_parallel(arch, par, tr)
    if par.pp > 1:  # the local batch is split into the pipeline's micro-batches
        from ..memory.memory import estimate
        training["local_batch_size"] = tr.micro_batch_size * estimate(arch, tr, par, cfg.hardware).microbatches
    elif tr.global_batch_size is not None and tr.global_batch_size != tr.micro_batch_size * par.dp:
        training["global_batch_size"] = tr.global_batch_size
    sections["activation_checkpoint"] = _titan_ac(tr)
    sections["compile"] = {"enable": tr.compile, "components": ["model"] if tr.compile else []}
    if tr.fp8:
        sections["model"]["converters"] = ["quantize.linear.float8"]
        sections["quantize.linear.float8"] = {"enable_fsdp_float8_all_gather": tr.fp8_all_gather,
                                              "recipe_name": tr.fp8_recipe, "filter_fqns": ["output"]}
    sections["optimizer"] = {"name": "AdamW", "early_step_in_backward": tr.optimizer_in_backward}
    if tr.optimizer != "adamw":
        raise refuse("torchtitan", "training.optimizer", tr.optimizer, "'adamw'")
    if tr.loss != "standard" or tr.attention != "flash" or tr.dropout or tr.adapter or tr.rl or tr.mode != "training":
        field = next(f for f, bad in (("loss", tr.loss != "standard"), ("attention", tr.attention != "flash"),
                                      ("dropout", bool(tr.dropout)), ("adapter", tr.adapter is not None),
                                      ("rl", tr.rl is not None), ("mode", tr.mode != "training")) if bad)
        raise refuse("torchtitan", f"training.{field}", getattr(tr, field), "torchtitan v0.2.2's defaults")
    return _toml(sections)


_TORCH = {"bf16": "bfloat16", "fp32": "float32", "fp16": "float16"}


def _architecture(fields: dict):
    from ..spec.architecture import Architecture
    return Architecture(**fields)


def _titan_parallel(arch, par, tr) -> dict:
    zero = par.zero_stage if par.zero_stage is not None else 3
    out = {"data_parallel_replicate_degree": 1 if zero else par.dp, "data_parallel_shard_degree": par.dp if zero else 1,
           "tensor_parallel_degree": par.tp, "pipeline_parallel_degree": par.pp, "context_parallel_degree": par.cp}
    if zero in (2, 3):
        out["fsdp_reshard_after_forward"] = "always" if zero == 3 else "never"
    if par.tp > 1 and not par.sequence_parallel:
        raise refuse("torchtitan", "parallel.sequence_parallel", False, "true with TP (torchtitan's TP plan)")
    if arch.is_moe:
        out["expert_parallel_degree"] = par.ep
        out["expert_tensor_parallel_degree"] = par.etp
    if par.pp > 1:
        from ..memory.sharding import virtual_stage_sizes
        sizes = virtual_stage_sizes(arch, par)
        parts, start = [], 0
        for i, n in enumerate(sizes):
            parts.append((["tok_embeddings"] if i == 0 else []) + [f"layers.{k}" for k in range(start, start + n)]
                         + (["norm", "output"] if i == len(sizes) - 1 else []))
            start += n
        out["module_fqns_per_model_part"] = parts
        out["pipeline_parallel_schedule"] = {"1f1b": "1F1B", "interleaved": "Interleaved1F1B",
                                             "dualpipev": "DualPipeV"}.get(par.schedule)
        if out["pipeline_parallel_schedule"] is None:
            raise refuse("torchtitan", "parallel.pp_schedule", par.pp_schedule, "1f1b, interleaved or dualpipev")
        out["pipeline_parallel_microbatch_size"] = tr.micro_batch_size
    return out


def _titan_ac(tr) -> dict:
    if tr.recompute == "none":
        return {"mode": "none"}
    if tr.recompute == "selective":
        return {"mode": "selective", "selective_ac_option": "op"}
    if tr.recompute_layers is not None:
        raise refuse("torchtitan", "training.recompute_layers", tr.recompute_layers, "unset (every layer, or "
                      "recompute_every)")
    if tr.recompute_every != 1:
        return {"mode": "selective", "selective_ac_option": str(tr.recompute_every)}
    return {"mode": "full"}


def _toml(sections: dict[str, dict]) -> str:
    lines = ["# written by llm-memory plan --emit torchtitan (torchtitan v0.2.2 job config)"]
    for name, values in sections.items():
        lines += ["", f"[{name}]"]
        for key, value in values.items():
            lines.append(f"{key} = {_toml_value(value)}")
    return "\n".join(lines) + "\n"


def _toml_value(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, list):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    return json.dumps(str(value))
