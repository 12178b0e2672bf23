"""`plan --emit verl` and `slime`: an RL layout written as the framework's launch line reads back, through
the importer of its kind, to the same configuration and estimate; what the framework cannot express is
refused by name."""

import pytest

from estimator import ConfigError, estimate_config
from estimator.importers import estimate_imported, import_config
from estimator.importers.emit_rl import emit_slime, emit_verl

GRPO = {"algorithm": "grpo", "rollout_batch_size": 1024, "samples_per_prompt": 5, "max_prompt_len": 512,
        "max_response_len": 1024, "engine": "vllm", "engine_memory_fraction": 0.6, "reference_model": True,
        "critic_model": False, "offload_during_rollout": False, "rollout_tp": 2}
VERL = [
    {"model": "qwen3-8b", "training": {"framework": "fsdp2", "micro_batch_size": 32, "recompute": "full",
                                       "loss": "fused", "rl": GRPO, "seq_len": 1536}, "parallel": {"dp": 8}},
    {"model": "llama-3.1-8b", "training": {"framework": "fsdp2", "micro_batch_size": 4, "loss": "fused",
                                           "rl": {**GRPO, "algorithm": "ppo", "critic_model": True, "engine": "sglang",
                                                  "offload_during_rollout": True, "rollout_tp": 4},
                                           "seq_len": 1536,
                                           "adapter": {"method": "lora", "rank": 32, "alpha": 32,
                                                       "target_modules": "all-linear"}},
     "parallel": {"dp": 16}},
]
SLIME_RL = {**GRPO, "engine": "sglang", "reference_model": False, "offload_during_rollout": True,
            "engine_memory_fraction": 0.7}
SLIME = [
    {"model": "qwen3-8b", "training": {"recompute": "full", "rl": SLIME_RL, "seq_len": 1536, "global_batch_size": 256,
                                       "dropout": 0.0},
     "parallel": {"tp": 2, "dp": 4, "zero_stage": 1}},
    {"model": "qwen3-30b-a3b", "training": {"recompute": "selective", "moe_grouped_gemm": True,
                                            "moe_dispatcher": "alltoall",
                                            "rl": {**SLIME_RL, "algorithm": "ppo", "critic_model": True,
                                                   "rollout_tp": 8},
                                            "seq_len": 1536, "dropout": 0.0},
     "parallel": {"dp": 16, "ep": 8, "zero_stage": 1}},
]


def round_trip(kind, text, config):
    result = import_config(text)  # the kind guessed from what was written
    assert result.kind == kind and result.unknown == (), text
    assert estimate_imported(result).to_json() == estimate_config(config).to_json(), text
    return result


@pytest.mark.parametrize("config", VERL, ids=lambda c: c["model"])
def test_verl_round_trip(config):
    text = emit_verl(config)
    assert text.startswith("python3 -m verl.trainer.main_ppo")
    round_trip("verl", text, config)


@pytest.mark.parametrize("config", SLIME, ids=lambda c: c["model"])
def test_slime_round_trip(config):
    text = emit_slime(config)
    assert text.startswith("python3 train.py --actor-num-nodes")
    round_trip("slime", text, config)


@pytest.mark.parametrize("emit, config, field", [
    (emit_verl, {**VERL[0], "training": {**VERL[0]["training"], "global_batch_size": 512}},
     "training.global_batch_size"),  # verl's mini-batches are not the estimate's global batch
    (emit_verl, {**VERL[0], "parallel": {"tp": 2, "dp": 4}}, "parallel.tp"),  # the FSDP actor has no TP
    (emit_slime, VERL[0], "training.rl.engine"),  # slime rolls out on SGLang
    (emit_slime, {**SLIME[0], "training": {**SLIME[0]["training"], "rl": {**SLIME_RL, "reference_model": True}}},
     "training.rl.reference_model"),  # slime keeps the reference in host memory
    (emit_verl, {"model": "qwen3-8b", "training": {"framework": "fsdp2", "seq_len": 4096}}, "training.rl"),
])
def test_what_the_framework_cannot_express_is_refused(emit, config, field):
    with pytest.raises(ConfigError) as info:
        emit(config)
    assert info.value.field.startswith(field)
