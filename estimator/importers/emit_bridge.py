"""``plan --emit megatron-bridge``: a Megatron layout written as a ``run_recipe.py --recipe NAME`` line with
``KEY=VALUE`` ConfigContainer overrides. The recipe is a bundled pretraining recipe of the same model
(`bridge_recipes`); the overrides are the `emit` module's Megatron-LM flags spelled as the Bridge keys
they come from (Megatron-LM derives those flags from the same TransformerConfig, DDP and optimizer
fields), and every recipe setting the layout does not want is turned off by name. Read back by the
`megatron_bridge` importer (`emit_check.verified`)."""

from __future__ import annotations

import json
import shlex
from dataclasses import replace

from ..spec.errors import ConfigError
from .bridge_keys import SECTIONS
from .bridge_recipes import ALIASES, RECIPES
from .emit_check import verified
from .models import preset_for

# Megatron-LM flags whose Bridge key is not the flag's own name in the model, DDP or optimizer section
_KEY_OF = {"--num-virtual-stages-per-pipeline-rank": "model.virtual_pipeline_model_parallel_size",
           "--decoder-first-pipeline-num-layers": "model.num_layers_in_first_pipeline_stage",
           "--decoder-last-pipeline-num-layers": "model.num_layers_in_last_pipeline_stage",
           "--seq-length": "dataset.seq_length", "--micro-batch-size": "train.micro_batch_size",
           "--global-batch-size": "train.global_batch_size",
           "--no-masked-softmax-fusion": "model.masked_softmax_fusion"}
# precision flags: the mixed_precision recipe of training/mixed_precision.py they spell
_PRECISION_FLAGS = ("--bf16", "--fp16", "--fp8-format", "--fp8-recipe", "--fp8-param-gather", "--grad-reduce-in-bf16",
                    "--accumulate-allreduce-grads-in-fp32")
_FP8_RECIPES = {("hybrid", "tensorwise"): "bf16_with_fp8_current_scaling_mixed",
                ("hybrid", "delayed"): "bf16_with_fp8_delayed_scaling_mixed",
                ("e4m3", "mxfp8"): "bf16_with_mxfp8_mixed",
                ("hybrid", "blockwise"): "bf16_with_fp8_subchannel_scaling_mixed"}


def emit_bridge(config: dict, gpus_per_node: int = 8) -> str:
    from ..models.loading import load_config
    from .emit_megatron import megatron_parallel, megatron_training
    cfg = load_config(config)
    tr, par = cfg.training, cfg.parallel
    if tr.framework != "megatron":
        raise ConfigError("--emit", "megatron-bridge", f"a configuration with framework 'megatron' (this one is "
                          f"{tr.framework!r})")
    recipe = _recipe(cfg)
    words = megatron_training(replace(tr, rl=None, adapter=None), cfg.architecture) + megatron_parallel(par, tr)
    overrides = _keys(_pairs(words))
    if tr.global_batch_size is None:  # the recipe states its own: write the batch the estimate assumes
        from ..memory.pipeline import global_batch_size
        overrides["train.global_batch_size"] = global_batch_size(tr, par)
    overrides.update(_off(ALIASES.get(recipe, recipe), overrides))
    nodes = par.gpus // gpus_per_node if par.gpus % gpus_per_node == 0 and par.gpus >= gpus_per_node else 1
    line = ["torchrun", "--nproc_per_node", str(par.gpus // nodes), "--nnodes", str(nodes),
            "scripts/training/run_recipe.py", "--recipe", recipe]
    line += [f"{key}={_value(value)}" for key, value in overrides.items()]
    return verified("megatron-bridge", shlex.join(line) + "\n", config)


def _recipe(cfg) -> str:
    """A pretraining recipe of the model: its legacy short name where there is one."""
    model = cfg.model if isinstance(cfg.model, str) else None
    names = [a for a, t in sorted(ALIASES.items()) if a.endswith("_pretrain_config") and _model_of(t) == model]
    names += [n for n, r in RECIPES.items() if r[0] == "pretrain" and preset_for(r[1] or "") == model]
    if not names:
        raise ConfigError("model", model or "{...}", "a model with a bundled Megatron-Bridge recipe (Llama 3, Qwen3)",
                          "megatron-bridge has no recipe for it")
    return names[0]


def _model_of(name: str) -> str | None:
    while RECIPES[name][1] is None:
        name = RECIPES[name][0]
    return preset_for(RECIPES[name][1])


def _pairs(words: list[str]) -> dict[str, list[str] | bool]:
    out: dict[str, list[str] | bool] = {}
    for w in words:
        if w.startswith("--"):
            out[w] = True
            last = w
        else:
            out[last] = [w] if out[last] is True else out[last] + [w]
    return out


def _keys(flags: dict) -> dict[str, object]:
    """The flags as Bridge keys; the precision flags as a mixed_precision recipe."""
    keys: dict[str, object] = {}
    for flag, value in flags.items():
        if flag in _PRECISION_FLAGS:
            continue
        key = _KEY_OF.get(flag) or next((f"{s}.{flag[2:].replace('-', '_')}" for s in ("model", "ddp", "optimizer")
                                         if flag[2:].replace("-", "_") in SECTIONS[s]), None)
        if key is None:
            raise ConfigError("--emit", "megatron-bridge", f"settings with a ConfigContainer key ({flag} has none)")
        if flag == "--no-masked-softmax-fusion":
            value = False
        elif isinstance(value, list):
            value = _scalar(value[0]) if len(value) == 1 and flag != "--recompute-modules" else value
        keys[key] = value
        if key == "ddp.use_distributed_optimizer":
            keys["optimizer.use_distributed_optimizer"] = value
    keys.update(_precision(flags))
    return keys


def _scalar(text: str) -> object:
    for cast in (int, float):
        try:
            return cast(text)
        except ValueError:
            pass
    return text


def _precision(flags: dict) -> dict[str, object]:
    fp16 = "--fp16" in flags
    if "--fp8-format" in flags:
        pair = (flags["--fp8-format"][0], flags["--fp8-recipe"][0])
        if pair not in _FP8_RECIPES or fp16:
            raise ConfigError("training.fp8_recipe", pair[1], ", ".join(r for _, r in _FP8_RECIPES),
                              "megatron-bridge has no mixed_precision recipe for it")
        out: dict[str, object] = {"mixed_precision": _FP8_RECIPES[pair],
                                  "mixed_precision.fp8_param_gather": "--fp8-param-gather" in flags}
    else:
        out = {"mixed_precision": "fp16_mixed" if fp16 else "bf16_mixed"}
    grads_fp32 = "--accumulate-allreduce-grads-in-fp32" in flags if fp16 else "--grad-reduce-in-bf16" not in flags
    out["mixed_precision.grad_reduce_in_fp32"] = grads_fp32
    return out


# what turns a recipe's setting off, where it is not a switch (Megatron-Core's defaults)
_OFF = {"model.cuda_graph_impl": "none", "model.moe_flex_dispatcher_backend": None,
        "model.recompute_granularity": None, "model.recompute_method": None, "model.recompute_num_layers": None,
        "model.recompute_modules": None, "model.virtual_pipeline_model_parallel_size": None,
        "model.cross_entropy_fusion_impl": "native", "model.moe_token_dispatcher_type": "allgather",
        "model.pipeline_model_parallel_layout": None}


def _off(recipe: str, given: dict) -> dict[str, object]:
    """The recipe's settings the layout leaves out, turned off by name (a switch false, a value its
    Megatron-Core default); its other values stay (the importer lists them as not modelled)."""
    from .megatron_bridge import _COMMON, _chain
    chain = _chain(recipe)
    out: dict[str, object] = {}
    for settings in [_COMMON[RECIPES[chain[0]][0]]] + [RECIPES[name][2] for name in chain]:
        for key, value in settings.items():
            if key in given or key in out:
                continue
            if value is True and key.startswith(("model.", "ddp.", "optimizer.")):
                out[key] = False
            elif key in _OFF and value != _OFF[key]:
                out[key] = _OFF[key]
    return out


def _value(value: object) -> str:
    if isinstance(value, bool) or value is None:
        return json.dumps(value)
    if isinstance(value, list):
        return "[" + ",".join(str(v) for v in value) + "]"
    return str(value)
