"""The verl importer on verl's own GRPO example script (tests/data/launch/README.md), mapped to a
JSON config written out here by hand, with an equal estimate."""

from pathlib import Path

import pytest

from estimator import ConfigError, estimate_config
from estimator.importers import estimate_imported, import_config

SCRIPT = (Path(__file__).parent / "data" / "launch" / "verl" / "run_qwen3-8b.sh").read_text()


def test_qwen3_8b_grpo_script():
    result = import_config(SCRIPT)  # kind guessed from `python3 -m verl.trainer.main_ppo`
    assert result.kind == "verl"
    # 1024 prompts x n 5, prompts 512 + responses 1024 tokens; vLLM at 0.6 of each GPU with TP 2;
    # KL loss on: a reference model; actor on FSDP over 8 x 1 GPUs, micro-batch 32, gradient checkpointing; the
    # workers' NCCL without cuMem (verl's PPO_RAY_RUNTIME_ENV: NCCL_CUMEM_ENABLE "0")
    rl = {"algorithm": "grpo", "rollout_batch_size": 1024, "samples_per_prompt": 5, "max_prompt_len": 512,
          "max_response_len": 1024, "engine": "vllm", "engine_memory_fraction": 0.6, "reference_model": True,
          "critic_model": False, "offload_during_rollout": False, "rollout_tp": 2}
    expected = {"model": "qwen3-8b",
                "training": {"framework": "fsdp2", "micro_batch_size": 32, "recompute": "full", "loss": "fused",
                             "rl": rl, "seq_len": 1536, "nccl_cumem": False},
                "parallel": {"dp": 8}}
    assert result.config == expected
    assert estimate_imported(result).to_json() == estimate_config(expected).to_json()
    assert {"trainer.project_name", "data.train_files", "actor_rollout_ref.actor.optim.lr"} <= \
        {s.name for s in result.ignored}
    assert "actor_rollout_ref.ref.fsdp_config.param_offload" in {s.name for s in result.unsupported}


def test_overrides_and_typos():
    result = import_config(SCRIPT, overrides=("algorithm.adv_estimator=gae", "actor_rollout_ref.rollout.n=1",
                                              "actor_rollout_ref.actor.use_kl_los=True"))
    assert result.config["training"]["rl"]["critic_model"] is True and result.config["training"]["rl"][
        "algorithm"] == "ppo"
    assert [s.name for s in result.unknown] == ["actor_rollout_ref.actor.use_kl_los"]
    with pytest.raises(ConfigError, match="n_gpus_per_node"):
        import_config(SCRIPT, gpus=16)


def test_the_key_table_is_verls():
    from estimator.importers.verl_keys import PPO_TRAINER
    # every key of v0.7.0's _generated_ppo_trainer.yaml flattened: 537, the actor's, the reference's and the
    # critic's profiler and fsdp_config sections among them
    assert len(PPO_TRAINER) == 537
    assert {"critic.model.fsdp_config.param_offload", "actor_rollout_ref.ref.profiler.tool_config.npu.level",
            "actor_rollout_ref.rollout.gpu_memory_utilization"} <= PPO_TRAINER


def test_nccl_cumem_from_the_environment_or_ray_kwargs():
    """verl's workers get NCCL_CUMEM_ENABLE "0" (constants_ppo.py PPO_RAY_RUNTIME_ENV) unless the command's
    environment sets it (get_ppo_ray_runtime_env drops its own) or ray_kwargs.ray_init.runtime_env does (merged over
    it, main_ppo.py run_ppo)."""
    assert import_config(SCRIPT).config["training"]["nccl_cumem"] is False
    assert import_config("export NCCL_CUMEM_ENABLE=1\n" + SCRIPT).config["training"]["nccl_cumem"] is True
    key = "ray_kwargs.ray_init.runtime_env.env_vars.NCCL_CUMEM_ENABLE"
    result = import_config("export NCCL_CUMEM_ENABLE=1\n" + SCRIPT, overrides=(f"+{key}=0",))
    assert result.config["training"]["nccl_cumem"] is False and key in {s.name for s in result.read}
    assert not result.unknown
