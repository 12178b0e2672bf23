"""The torchtune importer on torchtune's own recipe configs (tests/data/launch/README.md), each
mapped to a JSON config written out here by hand, with equal estimates."""

from pathlib import Path

import pytest

from estimator import ConfigError, estimate_config
from estimator.importers import estimate_imported, import_config

DATA = Path(__file__).parent / "data" / "launch" / "torchtune"
SEQ = ("tokenizer.max_seq_len=4096",)  # the configs leave it null: the dataset's longest sample decides


def imported(name, gpus=None, overrides=SEQ):
    return import_config((DATA / name).read_text(), gpus=gpus, overrides=overrides)  # kind guessed


def same_estimate(result, expected):
    assert result.kind == "torchtune" and result.config == expected
    assert estimate_imported(result).to_json() == estimate_config(expected).to_json()


def test_llama31_8b_qlora_single_device():
    # qlora_llama3_1_8b, lora_attn_modules q_proj v_proj output_proj + MLP, rank 8, alpha 16; batch 2,
    # 8 accumulation steps; activation checkpointing; CEWithChunkedOutputLoss
    result = imported("8B_qlora_single_device.yaml")
    expected = {"model": "llama-3.1-8b",
                "training": {"framework": "torchtune", "seq_len": 4096, "micro_batch_size": 2, "global_batch_size": 16,
                             "recompute": "full", "loss": "chunked",
                             "adapter": {"method": "qlora", "rank": 8, "alpha": 16, "dropout": 0.0,
                                         "target_modules": ["q", "v", "o", "gate", "up", "down"]}},
                "parallel": {"dp": 1}}
    same_estimate(result, expected)
    assert result.unsupported == () and result.unknown == ()


def test_qwen3_8b_lora_on_8_gpus():
    result = imported("qwen3_8B_lora.yaml", gpus=8)
    expected = {"model": "qwen3-8b",
                "training": {"framework": "torchtune", "seq_len": 4096, "micro_batch_size": 2,
                             "global_batch_size": 128, "loss": "chunked",  # LinearCrossEntropyLoss
                             "adapter": {"method": "lora", "rank": 8, "alpha": 16, "dropout": 0.0,
                                         "target_modules": ["q", "v", "o", "gate", "up", "down"]}},
                "parallel": {"dp": 8}}
    same_estimate(result, expected)


def test_llama31_8b_full_with_overrides():
    result = imported("8B_full.yaml", gpus=8, overrides=SEQ + ("optimizer_in_bwd=True", "batch_size=4",
                                                               "enable_activation_offloading=true"))
    expected = {"model": "llama-3.1-8b",
                "training": {"framework": "torchtune", "seq_len": 4096, "micro_batch_size": 4, "recompute": "full",
                             "offload_activations": True, "optimizer_in_backward": True, "loss": "chunked"},
                "parallel": {"dp": 8}}
    same_estimate(result, expected)
    assert [s.name for s in result.unsupported] == ["custom_sharded_layers"]


def test_llama32_3b_full_single_device_keeps_its_paged_8bit_states_in_managed_memory():
    # the stock single-device full recipe: bitsandbytes.optim.PagedAdamW8bit (states of tensors >= 1e5
    # elements in cudaMallocManaged pages, not torchao's AdamW8bit in the allocator), optimizer in backward,
    # batch 4, activation checkpointing, CEWithChunkedOutputLoss
    result = imported("3B_full_single_device.yaml")
    expected = {"model": "llama-3.2-3b",
                "training": {"framework": "torchtune", "seq_len": 4096, "micro_batch_size": 4, "recompute": "full",
                             "optimizer_in_backward": True, "optimizer": "paged_adamw8bit", "loss": "chunked"},
                "parallel": {"dp": 1}}
    same_estimate(result, expected)
    assert result.unsupported == () and result.unknown == ()


@pytest.mark.parametrize("component, ours", [("torchao.optim.AdamW8bit", "adam8bit"),
                                             ("bitsandbytes.optim.PagedAdamW", "paged_adamw"),
                                             ("bitsandbytes.optim.AdamW8bit", "adam8bit")])
def test_the_optimizer_is_read_with_its_library(component, ours):
    result = imported("3B_full_single_device.yaml", overrides=SEQ + (f"optimizer._component_={component}",))
    assert result.config["training"]["optimizer"] == ours


def test_grpo_maps_to_rl():
    result = imported("3B_full_grpo.yaml", gpus=8)
    rl = result.config["training"]["rl"]
    # batch_size 1 prompt per GPU x 8 GPUs, grpo_samples 16, max_generated_tokens 512
    assert (rl["algorithm"], rl["rollout_batch_size"], rl["samples_per_prompt"], rl["max_response_len"]) == \
        ("grpo", 8, 16, 512)
    assert result.config["training"]["seq_len"] == 4096 + 512
    assert "generation" in [s.name for s in result.unsupported]
    assert estimate_imported(result).rl_phases


def test_null_sequence_length_is_asked_for():
    with pytest.raises(ConfigError, match="tokenizer.max_seq_len"):
        imported("8B_qlora_single_device.yaml", overrides=())


GENERATION = """model:
  _component_: torchtune.models.llama3_2.llama3_2_1b
tokenizer:
  _component_: torchtune.models.llama3.llama3_tokenizer
  max_seq_len: 2048
prompt:
  user: Tell me a joke.
max_new_tokens: 300
temperature: 0.6
"""


def test_a_config_without_an_optimizer_is_not_read_as_training():
    """torchtune's generation, evaluation and quantization configs name no optimizer; they were estimated as AdamW
    training steps with a note (16 of the stock configs at bd2a0fc7c314). Refused, naming why."""
    with pytest.raises(ConfigError) as err:
        import_config(GENERATION, "torchtune", gpus=1)
    assert err.value.field == "optimizer" and "generation, evaluation or quantization" in str(err.value)


def test_a_lora_number_that_is_not_one_is_refused_by_name():
    """A LoRA alpha or dropout that is not a number went through float() bare (an internal error; found by fuzzing
    the stock recipes): refused naming the key, as in the axolotl, LLaMA-Factory and Trainer importers."""
    text = (DATA / "8B_qlora_single_device.yaml").read_text().replace("lora_dropout: 0.0", "lora_dropout: 0.=0")
    with pytest.raises(ConfigError) as err:
        import_config(text, "torchtune", gpus=1)
    assert err.value.field == "model.lora_dropout" and "not a number" in str(err.value)


def test_a_component_that_is_not_a_path_is_refused_by_name():
    """An optimizer component written as a list was an internal error (unhashable; found by fuzzing)."""
    text = (DATA / "8B_qlora_single_device.yaml").read_text()
    text = text.replace("_component_: torch.optim.AdamW", "_component_: [1, 2]", 1)
    assert "[1, 2]" in text
    with pytest.raises(ConfigError) as err:
        import_config(text, "torchtune", gpus=1, overrides=("tokenizer.max_seq_len=2048",))
    assert err.value.field == "optimizer._component_"
