"""Which linears of a vision-language model peft wraps with LoRA, on the real transformers classes.

Each model is built on the meta device from its bundled config.json (tests/data/hf_configs), peft's
`get_peft_model` wraps it there (no weights are allocated), and the wrapped modules are counted per part:
the decoder ("text"), the vision encoder ("vision") and the projector or merger ("projector"), with peft's
trainable-parameter count. Targets: q_proj + v_proj, the seven projections, and "all-linear".

    PYTHONPATH=. python3 -m validation.peft.vlm_wrap > tests/data/measured/peft_wrap/vlm-lora-wrap.json
"""

from __future__ import annotations

import collections
import json
import re
from pathlib import Path

CONFIGS = Path(__file__).parents[2] / "tests" / "data" / "hf_configs"
MODELS = {"gemma-3-27b": "gemma-3-27b-pt", "qwen2.5-vl-7b": "qwen2.5-vl-7b-instruct",
          "llama-4-scout": "llama-4-scout-17b-16e"}
TARGETS = {"qv": ["q_proj", "v_proj"],
           "seven": ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
           "all-linear": "all-linear"}
RANK = 16


def _config(path: Path):
    from transformers import AutoConfig
    raw = json.loads(path.read_text())
    text = raw.get("text_config", {})
    if isinstance(text.get("attn_temperature_tuning"), int):  # Llama 4's config.json writes 4; 5.23 wants a bool
        text["attn_temperature_tuning"] = bool(text["attn_temperature_tuning"])
    return AutoConfig.for_model(**raw)


def _part(name: str) -> str:
    if "projector" in name or "merger" in name:
        return "projector"
    return "vision" if re.search(r"vision|visual", name) else "text"


def wrap(config, targets) -> dict:
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForImageTextToText
    with torch.device("meta"):
        model = AutoModelForImageTextToText.from_config(config)
    peft_model = get_peft_model(model, LoraConfig(r=RANK, lora_alpha=2 * RANK, target_modules=targets,
                                                  task_type="CAUSAL_LM"))
    wrapped, parameters = collections.Counter(), collections.Counter()
    for name, module in peft_model.named_modules():
        lora_a = getattr(module, "lora_A", None)
        if isinstance(lora_a, torch.nn.ModuleDict) and "default" in lora_a:
            part = _part(name)
            wrapped[f"{part}:{name.rsplit('.', 1)[-1]}"] += 1
            parameters[part] += sum(p.numel() for p in lora_a.parameters()) + \
                sum(p.numel() for p in module.lora_B.parameters())
    trainable = sum(p.numel() for p in peft_model.parameters() if p.requires_grad)
    return {"wrapped": dict(sorted(wrapped.items())), "lora_parameters": dict(sorted(parameters.items())),
            "trainable": trainable}


def main() -> None:
    import peft
    import torch
    import transformers
    out = {"versions": {"peft": peft.__version__, "transformers": transformers.__version__,
                        "torch": torch.__version__},
           "rank": RANK, "targets": TARGETS, "configs": {k: f"tests/data/hf_configs/{v}.json" for k, v in MODELS.items()},
           "models": {}}
    for preset, name in MODELS.items():
        config = _config(CONFIGS / f"{name}.json")
        out["models"][preset] = {label: wrap(config, targets) for label, targets in TARGETS.items()}
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
