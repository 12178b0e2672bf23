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
# architecture (Qwen3-Coder-Next). Nemotron-H-8B: 8,100,852,736, the count of its checkpoint. AI21-Jamba-1.5-Mini:
# 51,570,323,328 (the model card's "52B total"; the Hub's safetensors metadata shows 51.6B params): embeddings and
# head 2 x 65,536 x 4,096, 28 Mamba-1 layers of 105,308,448 (in_proj 16,384 x 4,096, conv 8,192 x 4 + bias, x_proj
# 288 x 8,192, dt_proj 8,192 x 256 + bias, A_log 8,192 x 16, D, out_proj, dt/B/C norms 288), 4 attention layers of
# 41,943,040, 16 MLPs of 3 x 4,096 x 14,336 and 16 MoEs of 16 such experts and a 16 x 4,096 router, 2 x 4,096
# norms per layer and the final norm.
CHECKPOINTS = {
    "qwen3-next-80b-a3b-instruct": 79_674_391_296,
    "nemotron-h-8b-base-8k": 8_100_852_736,
    "ai21-jamba-1.5-mini": 51_570_323_328,
    "falcon-h1-7b-instruct": 7_585_654_880,
    "falcon-h1-34b-instruct": 33_642_516_224,
    "falcon-h1-0.5b-instruct": 521_411_104,
}


def test_jambas_sum_written_out():
    h, d, vocab, ffn = 4096, 8192, 65_536, 14_336
    mamba = 2 * d * h + d * 4 + d + 288 * d + d * 256 + d + d * 16 + d + h * d + 288
    attention = h * h + 2 * 1024 * h + h * h
    mlp = 3 * h * ffn
    moe = 16 * mlp + 16 * h
    total = 2 * vocab * h + h + 28 * mamba + 4 * attention + 16 * mlp + 16 * moe + 32 * 2 * h
    assert (mamba, attention) == (105_308_448, 41_943_040)
    assert total == CHECKPOINTS["ai21-jamba-1.5-mini"]


def test_falcon_h1_7bs_sum_written_out():
    """Falcon-H1-7B-Instruct: 44 layers, each attention (12 query heads and 2 KV heads of 128, narrower than the
    3,072 hidden) beside a Mamba-2 mixer (24 heads of 128, 1 group, state 256, conv 4 with a bias, the gated norm),
    then a 12,288-wide gated MLP; untied 130,049-token embedding and head."""
    h, vocab, ffn, d, g, n, heads = 3072, 130_049, 12_288, 3072, 1, 256, 24
    attention = 12 * 128 * h + 2 * 2 * 128 * h + h * 12 * 128
    conv = d + 2 * g * n
    mamba = (2 * d + 2 * g * n + heads) * h + conv * 4 + conv + 3 * heads + d + h * d
    layer = attention + mamba + 3 * h * ffn + 2 * h
    assert (attention, mamba, layer) == (11_010_048, 29_979_208, 154_241_608)
    assert 2 * vocab * h + 44 * layer + h == CHECKPOINTS["falcon-h1-7b-instruct"]


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
