"""Exact parameter counts of the hybrid models (issue 28): each model built by transformers from its
published config.json (tests/data/hf_configs/) on the meta device, its parameters summed."""

import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch", reason="building the checkpoints' models needs torch")
pytest.importorskip("transformers", reason="building the checkpoints' models needs transformers")

HF_CONFIGS = Path(__file__).parent / "data" / "hf_configs"

# The sums this test writes out (transformers 5.23). Qwen3-Next: the checkpoint's safetensors also hold
# the multi-token-prediction layer (mtp.*), which transformers does not build (Qwen3NextPreTrainedModel.
# _keys_to_ignore_on_load_unexpected); 79,674,391,296 is the count public code quotes for the same
# architecture (Qwen3-Coder-Next). Nemotron-H-8B: 8,100,852,736, the count of its checkpoint.
CHECKPOINTS = {
    "qwen3-next-80b-a3b-instruct": 79_674_391_296,
    "nemotron-h-8b-base-8k": 8_100_852_736,
}


def meta_model_parameters(name: str) -> int:
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.for_model(**json.loads((HF_CONFIGS / f"{name}.json").read_text()))
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    return sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize("name", sorted(CHECKPOINTS))
def test_the_checkpoint_built_by_transformers(name):
    total = meta_model_parameters(name)
    print(f"{name}: {total:,} parameters")
    assert total == CHECKPOINTS[name]


@pytest.mark.parametrize("name", sorted(CHECKPOINTS))
def test_the_estimators_count_from_the_same_config(name):
    from estimator.models.hf_config import architecture_from_hf_config
    from estimator.spec.architecture import parameter_counts

    arch, ignored = architecture_from_hf_config(json.loads((HF_CONFIGS / f"{name}.json").read_text()))
    assert ignored == [] and parameter_counts(arch).total == CHECKPOINTS[name] == meta_model_parameters(name)
