"""The other direction: a configuration written as a framework's own launch configuration, so that a
layout the planner chose can be launched as it is (``plan --emit KIND``). What is written reads
back, through the importer of the same kind, to the same estimate; a setting the framework cannot
express is refused by name, never dropped.

One writer module per kind: `emit_megatron` (a ``torchrun ... pretrain_gpt.py`` command),
`emit_torchtitan` (a job TOML), `emit_bridge` (Megatron-Bridge's ``run_recipe.py``), `emit_torchtune`,
`emit_hf` (TrainingArguments), `emit_finetune` (axolotl, LLaMA-Factory), `emit_rl` (verl, slime) and
`emit_serve` (vLLM, SGLang); the writers other than Megatron's and torchtitan's read their text back
before returning it (`emit_check.verified`).
"""

from __future__ import annotations

from ..spec.errors import ConfigError

# the kinds a training layout is written as (`plan --emit`), and a serving configuration (`serve --emit`)
EMIT_KINDS = ("megatron", "torchtitan", "megatron-bridge", "torchtune", "hf", "axolotl", "llama-factory", "verl",
              "slime")
SERVE_EMIT_KINDS = ("vllm", "sglang")


def emit(kind: str, config: dict, gpus_per_node: int = 8) -> str:
    """`config` (the contract's JSON) as a `kind` launch configuration; the writers of the other kinds
    are their own modules (emit_*.py), each checked by reading its text back (emit_check)."""
    from ..models.loading import load_config
    if kind in ("megatron", "torchtitan"):
        from .emit_megatron import megatron_command
        from .emit_torchtitan import torchtitan_toml
        cfg = load_config(config)
        return megatron_command(cfg, gpus_per_node) if kind == "megatron" else torchtitan_toml(cfg)
    from . import emit_bridge, emit_finetune, emit_hf, emit_rl, emit_serve, emit_torchtune
    writers = {"megatron-bridge": lambda c: emit_bridge.emit_bridge(c, gpus_per_node),
               "torchtune": emit_torchtune.emit_torchtune, "hf": emit_hf.emit_hf,
               "axolotl": emit_finetune.emit_axolotl, "llama-factory": emit_finetune.emit_llama_factory,
               "verl": emit_rl.emit_verl, "slime": emit_rl.emit_slime,
               "vllm": lambda c: emit_serve.emit_serve("vllm", c),
               "sglang": lambda c: emit_serve.emit_serve("sglang", c)}
    if kind not in writers:
        raise ConfigError("--emit", kind, ", ".join(EMIT_KINDS + SERVE_EMIT_KINDS))
    return writers[kind](config)
