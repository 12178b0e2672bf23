"""torchtune's model builders read as config.json dicts (estimator/importers/torchtune_models.py,
written by validation/torchtune_builders.py from pytorch/torchtune at commit bd2a0fc7c314): the shapes
quoted from the builders' source, the parameter counts of the checkpoints they load, stock recipe
configs of builders without a bundled preset, and the generator rerun on the fixture
tests/data/torchtune_builders (the builder files cut down by the generator's --skeleton)."""

import os
from pathlib import Path

import pytest

from estimator import ConfigError, estimate_config
from estimator.importers import estimate_imported, import_config
from estimator.importers.emit_torchtune import emit_torchtune
from estimator.importers.torchtune import BUILDERS as PRESETS
from estimator.importers.torchtune_models import BUILDERS, COMMIT, builder_config
from validation import torchtune_builders as generator

ROOT = Path(__file__).parents[1]
FIXTURE = Path(__file__).parent / "data" / "torchtune_builders"
LAUNCH = Path(__file__).parent / "data" / "launch" / "torchtune"
MODULE = ROOT / "estimator" / "importers" / "torchtune_models.py"
# a torchtune checkout's torchtune/models at the commit (not in CI: the fixture stands in for it there)
SNAPSHOT = Path(os.environ.get("TORCHTUNE_MODELS", ROOT / ".snap" / "torchtune_models"))


def hand_count(vocab, hidden, layers, heads, kv, head_dim, ffn, tied, qkv_bias=False, norms=2, qk_norm=False):
    """Embedding (+ an untied output), per layer q/k/v/o, a gated MLP's three matrices and the RMSNorm
    weights, then the final norm."""
    attention = hidden * heads * head_dim * 2 + hidden * kv * head_dim * 2
    if qkv_bias:
        attention += heads * head_dim + 2 * kv * head_dim
    if qk_norm:
        attention += 2 * head_dim
    layer = attention + 3 * hidden * ffn + norms * hidden
    return vocab * hidden * (1 if tied else 2) + layers * layer + hidden


# builder: (config.json fields quoted from its return call in torchtune/models/*/_model_builders.py,
#           hand count, the checkpoint's published total: Hugging Face Hub safetensors metadata)
CASES = {
    # qwen2_5_0_5b(): qwen2(vocab_size=151936, num_layers=24, num_heads=14, num_kv_heads=2, embed_dim=896,
    # intermediate_dim=4864, max_seq_len=32768, tie_word_embeddings=True); qwen2's q/k/v biases default True
    "qwen2_5_0_5b": ({"model_type": "qwen2", "vocab_size": 151936, "num_hidden_layers": 24, "num_attention_heads": 14,
                      "num_key_value_heads": 2, "hidden_size": 896, "intermediate_size": 4864,
                      "max_position_embeddings": 32768, "tie_word_embeddings": True},
                     hand_count(151936, 896, 24, 14, 2, 64, 4864, True, qkv_bias=True),
                     494_032_768),  # Qwen/Qwen2.5-0.5B
    # gemma2_2b(): gemma2(vocab_size=256_000, num_layers=26, num_heads=8, head_dim=256, num_kv_heads=4,
    # embed_dim=2304, intermediate_dim=9216, max_seq_len=8192, hidden_capping_value=30.0,
    # final_capping_value=50.0, sliding_window_size=4096); TiedLinear output; four norms a layer
    "gemma2_2b": ({"model_type": "gemma2", "vocab_size": 256000, "num_hidden_layers": 26, "num_attention_heads": 8,
                   "head_dim": 256, "num_key_value_heads": 4, "hidden_size": 2304, "intermediate_size": 9216,
                   "max_position_embeddings": 8192, "tie_word_embeddings": True, "sliding_window": 4096,
                   "attn_logit_softcapping": 30.0, "final_logit_softcapping": 50.0},
                  hand_count(256000, 2304, 26, 8, 4, 256, 9216, True, norms=4),
                  2_614_341_888),  # google/gemma-2-2b
    # phi3_mini(): phi3(vocab_size=32_064, num_layers=32, num_heads=32, num_kv_heads=32, embed_dim=3072,
    # intermediate_dim=8192, max_seq_len=4096); its own output projection
    "phi3_mini": ({"model_type": "phi3", "vocab_size": 32064, "num_hidden_layers": 32, "num_attention_heads": 32,
                   "num_key_value_heads": 32, "hidden_size": 3072, "intermediate_size": 8192,
                   "max_position_embeddings": 4096, "tie_word_embeddings": False},
                  hand_count(32064, 3072, 32, 32, 32, 96, 8192, False),
                  3_821_079_552),  # microsoft/Phi-3-mini-4k-instruct
    # llama2_7b(): llama2(vocab_size=32_000, num_layers=32, num_heads=32, num_kv_heads=32, embed_dim=4096,
    # max_seq_len=4096); no intermediate_dim: scale_hidden_dim_for_mlp(4096) = 256 * ceil(4 * int(8192 / 3)
    # / 256) = 256 * ceil(10920 / 256) = 11008
    "llama2_7b": ({"model_type": "llama", "vocab_size": 32000, "num_hidden_layers": 32, "num_attention_heads": 32,
                   "num_key_value_heads": 32, "hidden_size": 4096, "intermediate_size": 11008,
                   "max_position_embeddings": 4096, "tie_word_embeddings": False},
                  hand_count(32000, 4096, 32, 32, 32, 128, 11008, False),
                  6_738_415_616),  # meta-llama/Llama-2-7b-hf
    # qwen3_0_6b_base(): qwen3(vocab_size=151936, num_layers=28, num_heads=16, num_kv_heads=8, embed_dim=1024,
    # intermediate_dim=3072, max_seq_len=32768, head_dim=128, q_proj_bias=False, k_proj_bias=False,
    # v_proj_bias=False, q_norm=True, k_norm=True, tie_word_embeddings=True)
    "qwen3_0_6b_base": ({"model_type": "qwen3", "vocab_size": 151936, "num_hidden_layers": 28,
                         "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 128, "hidden_size": 1024,
                         "intermediate_size": 3072, "max_position_embeddings": 32768, "tie_word_embeddings": True,
                         "attention_bias": False},
                        hand_count(151936, 1024, 28, 16, 8, 128, 3072, True, qk_norm=True),
                        751_632_384 - 151936 * 1024),  # Qwen/Qwen3-0.6B: its safetensors store the tied head too
}


@pytest.mark.parametrize("builder", sorted(CASES))
def test_builder_shapes_and_parameter_count(builder):
    fields, by_hand, published = CASES[builder]
    family, config = builder_config(builder)
    assert config == fields
    config["_name_or_path"] = builder
    total = estimate_config({"model": config, "training": {"seq_len": 2048}}).to_json()["parameters"]["total"]
    assert total == by_hand == published


def test_lora_and_qlora_builders_resolve_to_the_same_shapes():
    # qlora_gemma2_2b = partial(lora_gemma2_2b, quantize_base=True); llama3_3_70b = llama3_1_70b
    text = (LAUNCH / "gemma2_2B_qlora_single_device.yaml").read_text()
    for component in ("qlora_gemma2_2b", "lora_gemma2_2b", "gemma2_2b"):
        result = import_config(text.replace("qlora_gemma2_2b", component), overrides=("tokenizer.max_seq_len=2048",))
        assert result.config["model"] == {**builder_config("gemma2_2b")[1], "_name_or_path": "gemma2_2b"}
    assert BUILDERS["llama3_3_70b"][1] == BUILDERS["llama3_1_70b"][1]


def test_stock_qwen2_5_lora_recipe():
    # recipes/configs/qwen2_5/1.5B_lora.yaml: lora_qwen2_5_1_5b_instruct, q_proj v_proj output_proj + MLP,
    # rank 32, alpha 64; batch 2, 8 accumulation steps; LinearCrossEntropyLoss
    result = import_config((LAUNCH / "qwen2_5_1.5B_lora.yaml").read_text(), gpus=8,
                           overrides=("tokenizer.max_seq_len=2048",))
    model = {"model_type": "qwen2", "vocab_size": 151936, "hidden_size": 1536, "intermediate_size": 8960,
             "num_hidden_layers": 28, "num_attention_heads": 12, "num_key_value_heads": 2,
             "max_position_embeddings": 32768, "tie_word_embeddings": True, "_name_or_path": "qwen2_5_1_5b_instruct"}
    expected = {"model": model,
                "training": {"framework": "torchtune", "seq_len": 2048, "micro_batch_size": 2,
                             "global_batch_size": 128, "loss": "chunked",
                             "adapter": {"method": "lora", "rank": 32, "alpha": 64, "dropout": 0.0,
                                         "target_modules": ["q", "v", "o", "gate", "up", "down"]}},
                "parallel": {"dp": 8}}
    assert result.kind == "torchtune" and result.config == expected
    assert estimate_imported(result).to_json() == estimate_config(expected).to_json()
    read = [line for line in result.to_json()["read"] if line["name"] == "model._component_"]
    assert "qwen2_5/_model_builders.py at commit bd2a0fc7c314" in read[0]["note"]


def test_an_imported_builder_is_written_back_by_its_name():
    result = import_config((LAUNCH / "qwen2_5_1.5B_lora.yaml").read_text(), gpus=8,
                           overrides=("tokenizer.max_seq_len=2048",))
    text = emit_torchtune(result.config)  # read back through the importer to the same configuration
    assert "  _component_: torchtune.models.qwen2_5.lora_qwen2_5_1_5b_instruct\n" in text


def test_stock_gemma2_qlora_recipe_estimates():
    result = import_config((LAUNCH / "gemma2_2B_qlora_single_device.yaml").read_text(),
                           overrides=("tokenizer.max_seq_len=2048",))
    assert result.config["training"]["adapter"]["method"] == "qlora"
    assert estimate_imported(result).to_json()["parameters"]["total"] == 2_614_341_888


@pytest.mark.parametrize("builder", sorted(PRESETS))
def test_each_bundled_preset_has_its_builders_parameter_count(builder):
    _, config = builder_config(builder)
    counts = [estimate_config({"model": model, "training": {"seq_len": 2048}}).to_json()["parameters"]["total"]
              for model in ({**config, "_name_or_path": builder}, PRESETS[builder])]
    assert counts[0] == counts[1]


def test_a_bundled_preset_still_wins():
    assert "qwen3_8b_base" in BUILDERS and PRESETS["qwen3_8b_base"] == "qwen3-8b"
    text = (LAUNCH / "qwen3_8B_lora.yaml").read_text()
    assert import_config(text, overrides=("tokenizer.max_seq_len=2048",)).config["model"] == "qwen3-8b"


@pytest.mark.parametrize("component", ["torchtune.models.llama3_2_vision.lora_llama3_2_vision_11b",
                                       "torchtune.models.llama4.llama4_scout_17b_16e",
                                       "torchtune.models.llama2.llama2_reward_7b"])
def test_vision_llama4_and_reward_builders_are_refused(component):
    text = (LAUNCH / "qwen2_5_1.5B_lora.yaml").read_text().replace(
        "torchtune.models.qwen2_5.lora_qwen2_5_1_5b_instruct", component)
    with pytest.raises(ConfigError, match="model._component_.*not a model this estimator knows"):
        import_config(text, overrides=("tokenizer.max_seq_len=2048",))


def test_the_generator_on_the_fixture_writes_the_committed_module():
    assert generator.module_text(FIXTURE, COMMIT) == MODULE.read_text()


@pytest.mark.skipif(not (SNAPSHOT / "qwen2_5" / "_model_builders.py").exists(),
                    reason="no torchtune checkout (set TORCHTUNE_MODELS to its torchtune/models at bd2a0fc7c314)")
def test_the_generator_on_torchtune_itself_writes_the_module_and_the_fixture():
    assert generator.module_text(SNAPSHOT, COMMIT) == MODULE.read_text()
    for path in sorted(FIXTURE.rglob("*.py")):
        assert generator.skeleton(SNAPSHOT / path.relative_to(FIXTURE)) == path.read_text(), path
