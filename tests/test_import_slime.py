"""The slime importer on slime's own launch scripts (tests/data/launch/README.md), each mapped to a JSON
config written out here by hand from the scripts' flags, with an equal estimate."""

from pathlib import Path

import pytest

from estimator import ConfigError, estimate_config
from estimator.importers import estimate_imported, import_config
from import_refusals import SUBSTITUTION, TOO_LARGE

DATA = Path(__file__).parent / "data" / "launch" / "slime"


def script(*names: str) -> str:
    """The model script first (the launch scripts `source` it; the reader does not follow a source)."""
    return "\n".join((DATA / n).read_text() for n in names)


# scripts/models/qwen3-4B.sh: 36 layers, h 2560, SwiGLU 9728, 32 heads in 8 query groups of 128, QK norm,
# RMSNorm, RoPE, no biases, vocabulary 151936, embeddings tied (no --untie-embeddings-and-output-weights)
QWEN3_4B = {"num_layers": 36, "hidden_size": 2560, "num_attention_heads": 32, "gated_mlp": True,
            "intermediate_size": 9728, "num_kv_heads": 8, "head_dim": 128, "tie_embeddings": True,
            "position_embedding": "rope", "vocab_size": 151936, "norm": "rmsnorm", "qk_norm": True}


def test_qwen3_4b_grpo_colocated():
    result = import_config(script("models_qwen3-4B.sh", "run-qwen3-4B.sh"))  # kind guessed: train.py + slime flags
    assert result.kind == "slime"
    # --actor-num-nodes 1 x --actor-num-gpus-per-node ${NUM_GPUS} (8: nvidia-smi is never run, the script's
    # fallback); TP 2 with sequence parallel: DP 4. --colocate: SGLang engines of 2 GPUs on the same GPUs at
    # mem fraction 0.7, the actor offloaded while they generate. 32 prompts x 8 samples, responses of 8192
    # tokens and prompts of 1024 (no --rollout-max-prompt-len: the contract's default); dynamic batches of
    # 9216 tokens = one sequence of 1024 + 8192. --use-kl-loss: the reference stays in host memory (slime
    # swaps it into the actor's weights), so no GPU copy. bf16 and the distributed optimizer: slime's own, and
    # NCCL without cuMem in the actors (actor_group.py: NCCL_CUMEM_ENABLE "0" where the job does not set it).
    rl = {"algorithm": "grpo", "rollout_batch_size": 32, "samples_per_prompt": 8, "max_prompt_len": 1024,
          "max_response_len": 8192, "engine": "sglang", "engine_memory_fraction": 0.7, "reference_model": False,
          "critic_model": False, "offload_during_rollout": True, "rollout_tp": 2}
    expected = {"model": QWEN3_4B,
                "training": {"recompute": "full", "rl": rl, "seq_len": 9216, "micro_batch_size": 1,
                             "global_batch_size": 256, "nccl_cumem": False},
                "parallel": {"tp": 2, "pp": 1, "cp": 1, "dp": 4, "sequence_parallel": True, "zero_stage": 1,
                             "comm_overlap": 0.0}}
    assert result.config == expected
    assert estimate_imported(result).to_json() == estimate_config(expected).to_json()
    read = {s.name for s in result.read}
    assert {"(slime sets --bf16)", "(slime sets --use-distributed-optimizer)", "--use-kl-loss", "--colocate"} <= read
    assert {"--prompt-data", "--rm-type", "--eps-clip", "--lr", "--address"} <= {s.name for s in result.ignored}
    assert "--attention-softmax-in-fp32" in {s.name for s in result.unsupported}
    assert not result.unknown


def test_the_model_from_the_checkpoint_or_refused():
    # without its model script the launch names only a local folder, /root/Qwen3-4B: no bundled model
    with pytest.raises(ConfigError, match="--hf-checkpoint"):
        import_config(script("run-qwen3-4B.sh"), "slime")
    # a Hub id the estimator bundles, given after -- (the last occurrence wins, as in argparse)
    result = import_config(script("run-qwen3-4B.sh"), "slime", overrides=("--hf-checkpoint", "Qwen/Qwen3-8B",
                                                                          "--rollout-max-prompt-len", "2048"))
    assert result.config["model"] == "qwen3-8b"
    assert result.config["training"]["rl"]["max_prompt_len"] == 2048
    assert result.config["training"]["seq_len"] == 2048 + 8192
    # 9216 tokens per micro-batch hold one sequence of 10240 at most: one sequence, as slime packs it alone
    assert result.config["training"]["micro_batch_size"] == 1
    assert any("MODEL_ARGS is not set" in n for n in result.notes)


def test_sft_without_an_engine():
    result = import_config(script("models_qwen3-4B.sh", "run-qwen3-4B-base-sft.sh"), "slime")
    # --debug-train-only: no rollout; packed micro-batches of --max-tokens-per-gpu 9216 tokens (cp 1);
    # --global-batch-size 128 over DP 8; expandable segments from the Ray job's runtime-env JSON; slime's actors
    # run NCCL without cuMem here too (actor_group.py)
    expected = {"model": QWEN3_4B,
                "training": {"recompute": "full", "seq_len": 9216, "global_batch_size": 128, "nccl_cumem": False},
                "parallel": {"tp": 1, "pp": 1, "cp": 1, "dp": 8, "zero_stage": 1, "comm_overlap": 0.0},
                "hardware": {"expandable_segments": True}}
    assert result.config == expected
    assert estimate_imported(result).to_json() == estimate_config(expected).to_json()
    assert {"--rollout-batch-size"} <= {s.name for s in result.ignored}


def test_glm4_9b_on_separate_rollout_gpus():
    result = import_config(script("models_glm4-9B.sh", "run-glm4-9B.sh"), "slime")
    config = result.config
    # 4 actor GPUs, TP 2 x CP 2: DP 1; --max-tokens-per-gpu 4608 x CP 2 = 9216 tokens per micro-batch: one
    # sequence of 1024 + 8192
    assert config["parallel"] == {"tp": 2, "pp": 1, "cp": 2, "dp": 1, "sequence_parallel": True, "zero_stage": 1,
                                  "comm_overlap": 0.0}
    assert config["training"]["micro_batch_size"] == 1
    # 9300 x CP 2 = 18600 tokens a micro-batch: counted as ceil(18600 / 9216) = 3 sequences (an upper bound)
    halved = import_config(script("models_glm4-9B.sh", "run-glm4-9B.sh"), "slime",
                           overrides=("--max-tokens-per-gpu", "9300"))
    assert halved.config["training"]["micro_batch_size"] == 3  # 18600 tokens: ceil(18600 / 9216) sequences
    rl = config["training"]["rl"]
    assert (rl["engine_memory_fraction"], rl["offload_during_rollout"], rl["rollout_tp"]) == (None, False, 2)
    unsupported = {s.name for s in result.unsupported}
    assert {"--rollout-num-gpus", "(no --sglang-mem-fraction-static)"} <= unsupported
    # flags of slime's patched Megatron (extra norms) are not in Megatron-LM core_v0.16.1: unknown, named
    assert {"--post-self-attn-layernorm", "--post-mlp-layernorm"} <= {s.name for s in result.unknown}


def test_ppo_trains_a_critic_and_offloads():
    text = script("models_qwen3-4B.sh", "run-qwen3-4B.sh")
    rl = import_config(text, "slime", overrides=("--advantage-estimator", "ppo", "--no-offload-train"))
    assert rl.config["training"]["rl"]["critic_model"] is True
    assert rl.config["training"]["rl"]["offload_during_rollout"] is True  # PPO forces --offload-train


@pytest.mark.parametrize("bad, field", [
    ("--rollout-batch-size", "--rollout-batch-size"),  # a flag without its value
    ("--advantage-estimator dpo", "--advantage-estimator"),
])
def test_bad_values_name_the_flag(bad, field):
    text = script("models_qwen3-4B.sh", "run-qwen3-4B.sh")
    with pytest.raises(ConfigError, match=field):
        import_config(text, "slime", overrides=tuple(bad.split()))


def test_world_size_must_agree():
    with pytest.raises(ConfigError, match="actor-num-nodes"):
        import_config(script("models_qwen3-4B.sh", "run-qwen3-4B.sh"), "slime", gpus=16)




@pytest.mark.parametrize("text, refusal", [
    ("python3 train.py --rollout-batch-size $(rm -rf /tmp/x) --hf-checkpoint Qwen/Qwen3-8B", SUBSTITUTION),
    ("python3 train.py --hf-checkpoint `touch /tmp/slime-pwned` --rollout-batch-size 8", SUBSTITUTION),
    ("python3 train.py --rollout-batch-size 8 " + "--hf-checkpoint a/b " * 60_000, TOO_LARGE),
])
def test_hostile_launches_are_refused_by_their_guard_and_nothing_runs(text, refusal, importer_reads):
    """Each is refused by the guard that bounds its cost, not by a clock (their times:
    bench/bench_refusals.py): a command substitution by the shell reader, which never runs it; text
    over MAX_BYTES by the size check, before any reader runs."""
    with pytest.raises(ConfigError) as info:
        import_config(text, "slime")
    assert refusal in str(info.value)
    assert importer_reads == ([] if refusal == TOO_LARGE else ["slime"])
    assert not Path("/tmp/slime-pwned").exists()


def test_credentials_hidden_and_token_counts_shown():
    result = import_config(script("models_qwen3-4B.sh", "run-qwen3-4B.sh"), "slime",
                           overrides=("--wandb-key", "wk-0123456789", "--sglang-api-key", "sk-abc"))
    text = "\n".join(s.line("read") for s in result.read) + "\n".join(result.warning_lines())
    assert "wk-0123456789" not in text and "sk-abc" not in text and "--wandb-key <hidden>" in text
    assert "--max-tokens-per-gpu '9216'" in text and "--input-key 'prompt'" in text  # counts and columns shown


def test_nccl_cumem_from_the_job_and_train_env_vars():
    """slime gives its actors NCCL_CUMEM_ENABLE from the job's environment, else "0", then --train-env-vars
    (actor_group.py l. 64-70): the runtime-env JSON's value, then --train-env-vars', win over slime's "0"."""
    text = script("models_qwen3-4B.sh", "run-qwen3-4B.sh")
    assert import_config(text, "slime").config["training"]["nccl_cumem"] is False
    job = text.replace('\\"NCCL_NVLS_ENABLE\\"', '\\"NCCL_CUMEM_ENABLE\\": \\"1\\",\n    \\"NCCL_NVLS_ENABLE\\"')
    assert job != text
    result = import_config(job, "slime")
    assert result.config["training"]["nccl_cumem"] is True
    assert "--runtime-env-json NCCL_CUMEM_ENABLE" in {s.name for s in result.read}
    result = import_config(job, "slime", overrides=("--train-env-vars", '{"NCCL_CUMEM_ENABLE": "0"}'))
    assert result.config["training"]["nccl_cumem"] is False
    assert {"--train-env-vars", "--train-env-vars NCCL_CUMEM_ENABLE"} <= {s.name for s in result.read}
