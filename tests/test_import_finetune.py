"""axolotl and LLaMA-Factory importers on the projects' own example configs (tests/data/launch/
README.md), each mapped to a JSON config written out here by hand, with equal estimates."""

from pathlib import Path

import pytest

from estimator import estimate_config
from estimator.importers import estimate_imported, import_config

DATA = Path(__file__).parent / "data" / "launch"


def imported(path, gpus=8, overrides=()):
    return import_config((DATA / path).read_text(), gpus=gpus, overrides=overrides)  # kinds guessed


def same_estimate(result, expected):
    assert result.config == expected
    assert estimate_imported(result).to_json() == estimate_config(expected).to_json()


def test_axolotl_llama3_qlora():
    # base_model NousResearch/Meta-Llama-3-8B (Llama 3 8B: Llama 3.1 8B's shapes); adapter qlora, load_in_4bit,
    # r 32, alpha 16, dropout 0.05, every linear layer; sequence_len 4096; batch 2 x 4 steps x 8 GPUs;
    # bf16 auto; gradient checkpointing; paged_adamw_32bit is bitsandbytes' PagedAdamW (its states in managed memory)
    result = imported("axolotl/qlora.yml")
    assert result.kind == "axolotl"
    same_estimate(result, {"model": "llama-3.1-8b",
                           "training": {"framework": "hf", "attn_implementation": "flash_attention_2", "seq_len": 4096, "micro_batch_size": 2,
                                        "global_batch_size": 64, "recompute": "full", "optimizer": "paged_adamw",
                                        "adapter": {"method": "qlora", "rank": 32, "alpha": 16,
                                                    "target_modules": "all-linear", "dropout": 0.05}},
                           "parallel": {"dp": 8}})
    assert result.unknown == () and result.unsupported == ()


def test_axolotl_llama3_lora_8bit_and_full():
    lora = imported("axolotl/lora-8b.yml")
    same_estimate(lora, {"model": "llama-3.1-8b",
                         "training": {"framework": "hf", "attn_implementation": "flash_attention_2", "seq_len": 4096, "micro_batch_size": 2,
                                      "global_batch_size": 64, "recompute": "full", "optimizer": "adam8bit",
                                      "adapter": {"method": "lora", "rank": 32, "alpha": 16,
                                                  "target_modules": "all-linear", "dropout": 0.05,
                                                  "base_dtype": "int8", "trainable_embeddings": True}},
                         "parallel": {"dp": 8}})
    full = imported("axolotl/fft-8b.yaml")  # paged_adamw_8bit: bitsandbytes' PagedAdamW8bit
    same_estimate(full, {"model": "llama-3.1-8b",
                         "training": {"framework": "hf", "attn_implementation": "flash_attention_2", "seq_len": 8192, "micro_batch_size": 1,
                                      "global_batch_size": 64, "recompute": "full", "optimizer": "paged_adamw8bit"},
                         "parallel": {"dp": 8}})


QWEN3_8B = ("model_name_or_path=Qwen/Qwen3-8B",)  # the examples train Qwen3-4B-Instruct-2507, not bundled


def test_llama_factory_lora_qlora_and_full():
    lora = imported("llama-factory/qwen3_lora_sft.yaml", overrides=QWEN3_8B)
    assert lora.kind == "llama-factory"
    adapter = {"method": "lora", "rank": 8, "alpha": 16, "target_modules": "all-linear", "dropout": 0.0}
    base = {"framework": "hf", "seq_len": 2048, "micro_batch_size": 1, "global_batch_size": 64, "recompute": "full"}
    same_estimate(lora, {"model": "qwen3-8b", "training": {**base, "adapter": adapter}, "parallel": {"dp": 8}})
    qlora = imported("llama-factory/qwen3_lora_sft_otfq.yaml", overrides=QWEN3_8B)  # quantization_bit 4, bnb
    same_estimate(qlora, {"model": "qwen3-8b", "training": {**base, "adapter": {**adapter, "method": "qlora"}},
                          "parallel": {"dp": 8}})
    full = imported("llama-factory/qwen3_full_sft.yaml", overrides=QWEN3_8B)  # ds_z3_config.json: ZeRO-3
    same_estimate(full, {"model": "qwen3-8b",
                         "training": {**base, "framework": "deepspeed", "global_batch_size": 16},
                         "parallel": {"dp": 8, "zero_stage": 3}})


def test_llama_factory_dpo():
    result = imported("llama-factory/qwen3_lora_dpo.yaml", overrides=QWEN3_8B)
    rl = result.config["training"]["rl"]
    assert rl == {"algorithm": "dpo", "max_prompt_len": 1024, "max_response_len": 1024, "reference_model": True}
    assert [s.name for s in result.unsupported] == ["finetuning_type"]  # the LoRA run's own base is the reference
    assert estimate_imported(result).rl_phases


AXOLOTL_FSDP = """base_model: NousResearch/Meta-Llama-3.1-8B
sequence_len: 4096
micro_batch_size: 1
gradient_accumulation_steps: 1
bf16: auto
fsdp:
  - {option}
  - auto_wrap
fsdp_config:
  fsdp_auto_wrap_policy: TRANSFORMER_BASED_WRAP
  fsdp_transformer_layer_cls_to_wrap: LlamaDecoderLayer
{extra}"""


@pytest.mark.parametrize("option, extra, framework, parallel", [
    # axolotl's _resolve_fsdp_version: no fsdp_version is FSDP1 (Accelerate's FullyShardedDataParallel)
    ("full_shard", "", "fsdp1", {"dp": 8, "fsdp_sharding_strategy": "FULL_SHARD"}),
    ("shard_grad_op", "", "fsdp1", {"dp": 8, "fsdp_sharding_strategy": "SHARD_GRAD_OP"}),
    ("full_shard", "  fsdp_sharding_strategy: HYBRID_SHARD\n", "fsdp1", {"dp": 8, "fsdp_sharding_strategy": "HYBRID_SHARD"}),
    ("full_shard", "fsdp_version: 2\n", "hf_fsdp2", {"dp": 8}),
    ("full_shard", "  fsdp_version: 2\n  reshard_after_forward: false\n", "hf_fsdp2", {"dp": 8, "zero_stage": 2}),
])
def test_axolotl_fsdp_versions(option, extra, framework, parallel):
    """FSDP1 was read as FSDP2 ("FSDP1's flat parameters estimated as FSDP2") after the estimator gained fsdp1
    (memory/fsdp1.py): now the version decides, and FSDP1's sharding strategy comes from fsdp_config or the fsdp list."""
    result = import_config(AXOLOTL_FSDP.format(option=option, extra=extra), "axolotl", gpus=8)
    same_estimate(result, {"model": "llama-3.1-8b", "parallel": parallel,
                           "training": {"framework": framework, "seq_len": 4096, "micro_batch_size": 1}})


def test_axolotl_fsdp2_runs_the_trainer_with_liger():
    """axolotl trains through the HF Trainer and Accelerate: its FSDP2 is hf_fsdp2 (transformers' modelling code),
    where Liger's patches apply (they were refused when it was read as torchtitan's fsdp2; axolotl's
    examples/llama-3/fft-8b-liger-fsdp.yaml with fsdp_version 2)."""
    extra = ("fsdp_version: 2\nplugins:\n  - axolotl.integrations.liger.LigerPlugin\nliger_rope: true\n"
             "liger_rms_norm: true\nliger_glu_activation: true\nliger_fused_linear_cross_entropy: true\n")
    result = import_config(AXOLOTL_FSDP.format(option="full_shard", extra=extra), "axolotl", gpus=8)
    training = result.config["training"]
    assert (training["framework"], training["liger_kernel"], training["loss"]) == ("hf_fsdp2", True, "chunked")
    estimate_imported(result)


def test_axolotl_fsdp1_with_offload_is_fsdp2s_cpu_offload_with_a_note():
    """FSDP1's CPUOffload is not modelled (memory/fsdp1.py refuses it); axolotl's stock configs offload with FSDP1
    (examples/qwen3/qlora-fsdp.yaml): estimated as FSDP2's CPUOffloadPolicy, and the ledger says so."""
    text = AXOLOTL_FSDP.format(option="full_shard", extra="  fsdp_offload_params: true\n")
    result = import_config(text, "axolotl", gpus=8)
    training = result.config["training"]
    assert (training["framework"], training["offload_optimizer"], training["offload_parameters"]) == ("hf_fsdp2", "cpu", "cpu")
    assert [s.name for s in result.unsupported] == ["fsdp_config.fsdp_offload_params"]
    assert "FSDP1's CPUOffload" in result.unsupported[0].note


def test_qualified_attention_targets_are_their_projections():
    """PEFT matches a target module by the end of its name (tuners_utils check_target_module_exists): axolotl's
    Llama 4 examples write self_attn.q_proj, which is q_proj in a text decoder. A container that would narrow the
    match against fused experts (shared_expert.gate_proj) is still refused, and so is any name not a projection."""
    from estimator.importers.finetune import targets
    assert targets(["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj"]) == ["q", "k", "v", "o"]
    assert targets("q_proj, v_proj") == ["q", "v"]
    assert targets(["self_attn.q_proj", "shared_expert.gate_proj"]) is None
    assert targets(["vision_model.q_proj"]) is None and targets(["c_attn"]) is None and targets([3]) is None


def test_llama_factory_flash_attn_is_one_of_its_attention_functions():
    """LLaMA-Factory's AttentionFunction (extras/constants.py): auto, disabled, sdpa, fa2, fa3. A list there was an
    internal error (unhashable, found by fuzzing) and an unknown word was dropped silently: both refused by name;
    fa3 (flash_attention_3) is estimated as flash attention, with a note."""
    from estimator import ConfigError
    text = (DATA / "llama-factory" / "qwen3_lora_sft.yaml").read_text()
    for bad in ("[fa2]", "fa4"):
        with pytest.raises(ConfigError) as err:
            import_config(text + f"\nflash_attn: {bad}\n", "llama-factory", gpus=8, overrides=QWEN3_8B)
        assert err.value.field == "flash_attn"
    fa3 = import_config(text + "\nflash_attn: fa3\n", "llama-factory", gpus=8, overrides=QWEN3_8B)
    assert [s.name for s in fa3.unsupported] == ["flash_attn"]
