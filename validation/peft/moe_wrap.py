"""Which parts of a mixture-of-experts decoder peft wraps with LoRA, on the real transformers classes.

Each MoE preset's config.json (estimator/models/presets) is built on the meta device with AutoModelForCausalLM,
peft's `get_peft_model` wraps it there (no weights are allocated), and the wrapped modules are counted by leaf
name with peft's trainable-parameter count. transformers 5 fuses the routed experts into 3-D parameters; peft
0.21.2 adapts them (ParamWrapper) only for the model types it converts from transformers v4
(utils/transformers_weight_conversion.py _convert_peft_config_moe: mixtral and the types transformers maps to
"qwen2_moe"). Targets: q_proj + v_proj, the seven projections, and "all-linear".

    PYTHONPATH=. python3 -m validation.peft.moe_wrap > tests/data/measured/peft_wrap/moe-lora-wrap.json
"""

from __future__ import annotations

import collections
import json
import sys

PRESETS = ("mixtral-8x7b", "qwen3-30b-a3b", "qwen3-next-80b-a3b", "gpt-oss-20b", "llama-4-scout", "jamba-mini-1.5")
TARGETS = {"qv": ["q_proj", "v_proj"],
           "seven": ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
           "all-linear": "all-linear"}
RANK = 16


def _config(raw: dict):
    from transformers import AutoConfig
    raw = json.loads(json.dumps(raw))
    text = raw.get("text_config", raw)
    if isinstance(text.get("attn_temperature_tuning"), int):  # Llama 4's config.json writes 4; 5.23 wants a bool
        text["attn_temperature_tuning"] = bool(text["attn_temperature_tuning"])
    config = AutoConfig.for_model(**raw)
    return getattr(config, "text_config", None) or config if raw.get("model_type") == "llama4" else config


def wrap(config, targets) -> dict:
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    try:
        peft_model = get_peft_model(model, LoraConfig(r=RANK, lora_alpha=2 * RANK, target_modules=targets,
                                                      task_type="CAUSAL_LM"))
    except Exception as error:  # noqa: BLE001 - recorded
        return {"error": f"{type(error).__name__}: {error}"[:300]}
    wrapped, parameters = collections.Counter(), collections.Counter()
    for name, module in peft_model.named_modules():
        lora_a = getattr(module, "lora_A", None)
        if isinstance(lora_a, torch.nn.ModuleDict) and "default" in lora_a:
            leaf = name.rsplit(".", 1)[-1]
            key = getattr(module, "parameter_name", None) or leaf
            key = f"{name.rsplit('.', 2)[-2]}.{leaf}" if key == leaf else f"param:{key}"
            wrapped[key] += 1
            parameters[key] += sum(p.numel() for p in lora_a.parameters()) + \
                sum(p.numel() for p in module.lora_B.parameters())
    trainable = sum(p.numel() for p in peft_model.parameters() if p.requires_grad)
    return {"model_class": type(model).__name__, "wrapped": dict(sorted(wrapped.items())),
            "lora_parameters": dict(sorted(parameters.items())), "trainable": trainable,
            "target_modules": sorted(peft_model.peft_config["default"].target_modules or []),
            "target_parameters": sorted(peft_model.peft_config["default"].target_parameters or [])}


def main() -> None:
    import peft
    import torch
    import transformers
    from estimator.models.presets import get_hf_config
    presets = sys.argv[1:] or PRESETS
    out = {"versions": {"peft": peft.__version__, "transformers": transformers.__version__,
                        "torch": torch.__version__},
           "rank": RANK, "targets": TARGETS, "configs": {p: f"estimator/models/presets/models/{p}.json" for p in presets},
           "models": {}}
    for preset in presets:
        config = _config(get_hf_config(preset))
        out["models"][preset] = {label: wrap(config, targets) for label, targets in TARGETS.items()}
        print(preset, file=sys.stderr, flush=True)
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
