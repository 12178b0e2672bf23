"""What the axolotl and LLaMA-Factory importers share: their DeepSpeed config files named by path
(a second file, not read: the stage and offload their published names state), the precision and
the adapter written the way both spell them."""

from __future__ import annotations

import re

from ..spec.choices import ATTN_IMPLEMENTATIONS, TRANSFORMERS_FRAMEWORKS
from .build import ConfigBuilder
from .result import Ledger

_TARGETS = {"q_proj": "q", "k_proj": "k", "v_proj": "v", "o_proj": "o", "gate_proj": "gate", "up_proj": "up",
            "down_proj": "down"}


def deepspeed_by_name(path: str, key: str, build: ConfigBuilder, ledger: Ledger) -> bool:
    """A DeepSpeed JSON named like the projects' bundled ones (axolotl ``deepspeed_configs/zero3_bf16.json``,
    LLaMA-Factory ``examples/deepspeed/ds_z3_offload_config.json``): ZeRO stage and CPU offload from the
    name. Returns False when the name says neither."""
    name = str(path).rsplit("/", 1)[-1].lower()
    m = re.search(r"(?:zero|_z)(\d)", name)
    if not m or int(m.group(1)) > 3:
        ledger.not_modelled(key, path, "a DeepSpeed file this importer does not read; import it with --from "
                                       "deepspeed --training-args this file")
        return False
    stage = int(m.group(1))
    build.put("training.framework", "deepspeed")
    build.set("parallel.zero_stage", stage, key, path, why="the stage its name states (the file is not read)")
    if "offload" in name:
        build.put("training.offload_optimizer", "cpu")
        if stage == 3:
            build.put("training.offload_parameters", "cpu")
        ledger.note(f"{name}: optimizer states{' and parameters' if stage == 3 else ''} offloaded to the CPU")
    return True


# the container a qualified target may name ("self_attn.q_proj", as axolotl's Llama 4 examples write them): PEFT
# matches a target by the end of the module's name (tuners_utils check_target_module_exists), so self_attn narrows
# nothing among a text decoder's attention projections; an MLP's container ("shared_expert.up_proj") would, against
# the fused experts peft maps gate_proj / up_proj / down_proj to (memory/adapters.py): not read
_CONTAINERS = {"self_attn"}


def targets(names: object) -> list[str] | str | None:
    """Hugging Face module names as our adapter targets; None when one is not a linear layer we know."""
    if names in ("all", "all-linear", ["all"], ["all-linear"]):
        return "all-linear"
    items = [n.strip() for n in names.split(",")] if isinstance(names, str) else list(names or [])
    if not items or not all(isinstance(n, str) for n in items):
        return None
    leaves = [n.rsplit(".", 1)[-1] for n in items]
    if any(leaf not in _TARGETS or not set(n.split(".")[:-1]) <= _CONTAINERS for n, leaf in zip(items, leaves)):
        return None
    return list(dict.fromkeys(_TARGETS[leaf] for leaf in leaves))


def transformers_attention(build: ConfigBuilder, ledger: Ledger, name: str, value: object) -> None:
    """A launch config's attn_implementation (or the trainer's switch that sets it) into the config: eager keeps
    the s x s scores (training.attention "eager"); sdpa and flash_attention_2 are training.attention "flash", named
    by training.attn_implementation where transformers' modelling code runs (spec/choices.py TRANSFORMERS_FRAMEWORKS)
    and estimated as flash attention elsewhere."""
    if value == "eager":
        build.set("training.attention", "eager", name, value)
    elif value in ATTN_IMPLEMENTATIONS and build.get("training.framework", "hf") in TRANSFORMERS_FRAMEWORKS:
        build.set("training.attn_implementation", value, name, value)
    elif value is not None:
        ledger.not_modelled(name, value, "estimated as flash attention (transformers' attn_implementation sdpa or "
                                         "flash_attention_2 are modelled)")


# bitsandbytes' paged AdamW (transformers OptimizerNames paged_adamw_32bit / paged_adamw_8bit): its states in managed
# memory (memory/paged.py), where the stack builds the Trainer's optimizer itself (paged.FRAMEWORKS); under DeepSpeed,
# which steps its own flat partitions, the same states are estimated in the allocator
PAGED_FALLBACK = {"paged_adamw": "adamw", "paged_adamw8bit": "adam8bit"}


def trainer_optimizer(build: ConfigBuilder, ledger: Ledger, key: str, optim: object, table: dict,
                      given: bool = True) -> None:
    """The Trainer's `optim` (or axolotl's `optimizer`) as training.optimizer by `table`; a paged optimizer where
    the framework runs it paged, else its unpaged twin with a note; a name not in `table` is estimated as AdamW."""
    from ..memory.paged import FRAMEWORKS as PAGED_FRAMEWORKS
    ours = table.get(optim) if isinstance(optim, str) else None
    if ours is None:
        ledger.not_modelled(key, optim, "estimated as AdamW")
        return
    framework = build.get("training.framework", "hf")
    if ours in PAGED_FALLBACK and framework not in PAGED_FRAMEWORKS:
        ledger.not_modelled(key, optim, f"bitsandbytes' paged states under {framework}: estimated as "
                            f"{PAGED_FALLBACK[ours]} in the caching allocator")
        ours = PAGED_FALLBACK[ours]
    if ours != "adamw":
        build.set("training.optimizer", ours, key, optim)
    elif given:
        ledger.mapped(key, optim, "training.optimizer = \"adamw\"")

