"""The Megatron-LM importer on Megatron-LM's own example scripts (tests/data/launch/README.md
names each file's source and commit): each mapped to a JSON config written out here by hand, from
reading the script against Megatron-LM core_v0.16.1 arguments.py, and the estimate of the import
equal to the estimate of that JSON."""

from pathlib import Path

import pytest

from estimator import ConfigError, estimate_config
from estimator.spec.fields import BY_PATH
from estimator.importers import estimate_imported, import_config
from estimator.importers.megatron_model import moe_layer_pattern

DATA = Path(__file__).parent / "data" / "launch" / "megatron"


def imported(name, gpus=None, overrides=()):
    return import_config((DATA / name).read_text(), "megatron", gpus=gpus, overrides=overrides)


def same_estimate(result, expected):
    assert result.config == expected
    assert estimate_imported(result).to_json() == estimate_config(expected).to_json()


def names(settings):
    return [s.name for s in settings]


def test_llama3_8b_fp8_script():
    result = imported("train_llama3_8b_h100_fp8.sh")  # the world size from its torchrun prefix: 8 x 1
    expected = {
        # --swiglu, --group-query-attention --num-query-groups 8, --kv-channels 128 (= 4096 / 32), RoPE,
        # --untie-embeddings..., --disable-bias-linear; no --normalization: Megatron's LayerNorm;
        # --tokenizer-type NullTokenizer --vocab-size 128256: 128,257 tokens (its end-of-document id)
        "model": {"num_layers": 32, "hidden_size": 4096, "num_attention_heads": 32, "gated_mlp": True,
                  "intermediate_size": 14336, "num_kv_heads": 8, "position_embedding": "rope", "vocab_size": 128257,
                  "norm": "layernorm"},
        # DTYPE=fp8 adds --fp8-format hybrid ... --fp8-param-gather; --grad-reduce-in-bf16;
        # --cross-entropy-loss-fusion (native); dropouts 0.0
        "training": {"seq_len": 8192, "global_batch_size": 128, "grad_dtype": "bf16", "fp8": True,
                     "param_dtype": "fp8", "loss": "fused"},
        # TP 1, CP 1, PP 1 (commented out); --use-distributed-optimizer; both overlaps on
        "parallel": {"tp": 1, "cp": 1, "dp": 8, "zero_stage": 1},
    }
    same_estimate(result, expected)
    assert names(result.unsupported) == ["--empty-unused-memory-level"]
    assert result.unknown == ()
    ignored = names(result.ignored)
    for flag in ("--lr", "--save", "--tensorboard-dir", "--mock-data", "--log-interval", "--weight-decay"):
        assert flag in ignored
    assert any("cannot decide" in n for n in result.notes)  # the `[ ! -f pretrain_gpt.py ]` check


def test_mixtral_8x7b_script_on_four_nodes():
    result = imported("train_mixtral_8x7b_distributed.sh", gpus=32)  # NNODES comes from SLURM: 4 nodes
    expected = {
        "model": {"num_layers": 32, "hidden_size": 4096, "num_attention_heads": 32, "gated_mlp": True,
                  "intermediate_size": 14336, "num_kv_heads": 8, "position_embedding": "rope", "vocab_size": 32000,
                  "norm": "rmsnorm", "num_experts": 8, "num_experts_per_token": 2, "moe_intermediate_size": 14336},
        "training": {"seq_len": 4096, "global_batch_size": 256, "attention_softmax_fusion": False,
                     "moe_dispatcher": "alltoall", "moe_grouped_gemm": True},
        "parallel": {"tp": 1, "pp": 4, "dp": 8, "ep": 8, "zero_stage": 1},
    }
    same_estimate(result, expected)
    assert any("--gpus 32 replaces" in n for n in result.notes)
    assert any("WANDB_API_KEY" in n for n in result.notes)  # the wandb branch: not set in the file
    assert "--wandb-project" not in names(result.ignored)


def test_gpt3_175b_script_megatron_defaults():
    result = imported("train_gpt3_175b_distributed.sh", gpus=1024)
    expected = {
        # no --swiglu: 4h GeLU MLP; tied embeddings, LayerNorm, biases, learned positions: Megatron's defaults;
        # --vocab-file/--merge-file: GPT-2's BPE, 50257 tokens
        "model": {"num_layers": 96, "hidden_size": 12288, "num_attention_heads": 96, "gated_mlp": False,
                  "intermediate_size": 49152, "tie_embeddings": True, "position_embedding": "learned",
                  "max_position_embeddings": 2048, "vocab_size": 50257, "norm": "layernorm", "linear_bias": True},
        # --fp16 without --accumulate-allreduce-grads-in-fp32: fp16 gradients; dropout 0.1 by default
        "training": {"seq_len": 2048, "global_batch_size": 1536, "param_dtype": "fp16", "compute_dtype": "fp16",
                     "grad_dtype": "fp16", "dropout": 0.1},
        # no --sequence-parallel (off in Megatron, on by default here), no overlap flags
        "parallel": {"tp": 8, "pp": 16, "dp": 8, "sequence_parallel": False, "comm_overlap": 0.0},
    }
    same_estimate(result, expected)
    assert result.unsupported == () and result.unknown == ()
    assert "--rampup-batch-size" in names(result.ignored)


def test_deepseek_r1_arguments_file_with_a_layout():
    # the layout the file leaves to the launch script, with the uneven split its comment suggests
    layout = ("--vocab-size", "129280", "--tensor-model-parallel-size", "8", "--pipeline-model-parallel-size", "8",
              "--decoder-first-pipeline-num-layers", "6", "--decoder-last-pipeline-num-layers", "7",
              "--expert-model-parallel-size", "8", "--use-distributed-optimizer")
    result = imported("DeepSeek-R1.sh", gpus=1024, overrides=layout)
    expected = {
        # MLA with the defaults it sets; --moe-layer-freq [0]*3+[1]*58: three dense layers first; one shared
        # expert of 2048; --make-vocab-size-divisible-by 1280 x TP 8 pads 129280 to 133120
        "model": {"num_layers": 61, "hidden_size": 7168, "num_attention_heads": 128, "gated_mlp": True,
                  "intermediate_size": 18432, "q_lora_rank": 1536, "kv_lora_rank": 512, "qk_nope_head_dim": 128,
                  "qk_rope_head_dim": 64, "v_head_dim": 128, "position_embedding": "rope", "vocab_size": 133120,
                  "norm": "rmsnorm", "num_experts": 256, "num_experts_per_token": 8, "moe_intermediate_size": 2048,
                  "num_shared_experts": 1, "shared_expert_intermediate_size": 2048, "router_bias": True,
                  "first_dense_layers": 3},
        # --recompute-activations + --moe-layer-recompute: selective core_attn and moe
        "training": {"seq_len": 4096, "recompute": "selective", "recompute_modules": ["core_attn", "moe"],
                     "dropout": 0.1, "attention_softmax_fusion": False, "moe_dispatcher": "alltoall",
                     "moe_router_dtype": "fp32"},
        "parallel": {"tp": 8, "pp": 8, "dp": 16, "ep": 8, "sequence_parallel": True, "pp_first_stage_layers": 6,
                     "pp_last_stage_layers": 7, "zero_stage": 1, "comm_overlap": 0.0},
    }
    same_estimate(result, expected)
    assert names(result.unsupported) == ["--no-rope-fusion", "--moe-shared-expert-overlap"]


def test_qwen3_30b_a3b_vocabulary_from_the_bundled_tokenizer():
    result = imported("Qwen3-30B-A3B.sh", gpus=8, overrides=("--tokenizer-model", "Qwen/Qwen3-30B-A3B",
                                                            "--expert-model-parallel-size", "8"))
    assert result.config["model"]["vocab_size"] == 151936  # the qwen3-30b-a3b preset's
    assert result.config["model"]["head_dim"] == 128  # --kv-channels 128 != 2048 / 32
    # 151936 = 1187 x 128: Megatron's padding to 1187 and ours to 128 agree, so nothing is lost
    assert "--make-vocab-size-divisible-by" not in names(result.unsupported)
    assert estimate_imported(result).parameters_total > 30e9


def test_world_size_is_required_without_a_launcher():
    with pytest.raises(ConfigError, match="--gpus"):
        import_config("pretrain_gpt.py --num-layers 2 --hidden-size 64 --num-attention-heads 4 --seq-length 128 "
                      "--vocab-size 1000 --position-embedding-type rope", "megatron")


def test_bare_command_line_typos_and_switch_values():
    line = ("torchrun --nproc-per-node 4 pretrain_gpt.py --num-layers 4 --hidden-size 256 --num-attention-heads 8 "
            "--seq-length 1024 --max-position-embeddings 1024 --vocab-size 32000 --bf16 --swiglu "
            "--tensor-model-paralel-size 2 --recompute-granularity full --recompute-method block "
            "--recompute-num-layers 1 --tensor-model-parallel-size 2 --sequence-parallel")
    result = import_config(line, "megatron")
    assert [(s.name, s.value) for s in result.unknown] == [("--tensor-model-paralel-size", "2")]
    assert result.config["parallel"] == {"tp": 2, "dp": 2, "sequence_parallel": True, "comm_overlap": 0.0}
    assert result.config["training"]["recompute"] == "full" and result.config["training"]["recompute_layers"] == 1
    assert result.config["model"]["intermediate_size"] == 640  # int(4 x 256 x 2/3 / 64) x 64: the swiglu default


def test_expert_tensor_parallel_size_on_a_dense_model_is_ignored_not_refused():
    """Megatron takes --expert-tensor-parallel-size for a dense model (parallel_state.py builds the expert
    groups, no layer uses them); the import used to write parallel.etp 1 beside tp 4, which the estimate
    refuses ("the model has no experts")."""
    line = ("torchrun --nproc-per-node 8 pretrain_gpt.py --num-layers 4 --hidden-size 256 --num-attention-heads 8 "
            "--seq-length 1024 --max-position-embeddings 1024 --vocab-size 32000 --bf16 "
            "--tensor-model-parallel-size 4 --expert-tensor-parallel-size 1")
    result = import_config(line, "megatron")
    assert "etp" not in result.config["parallel"]
    assert [(s.name, s.value) for s in result.ignored if s.name.startswith("--expert")] == [
        ("--expert-tensor-parallel-size", "1")]
    assert estimate_imported(result).stages[0].allocated_peak_bytes > 0
    moe = import_config(line + " --num-experts 8", "megatron")
    assert moe.config["parallel"]["etp"] == 1


def test_a_field_this_build_lacks_is_not_modelled_rather_than_dropped():
    line = ("pretrain_gpt.py --num-layers 8 --hidden-size 256 --num-attention-heads 8 --seq-length 1024 "
            "--vocab-size 32000 --bf16 --position-embedding-type rope --pipeline-model-parallel-size 2 "
            "--num-layers-per-virtual-pipeline-stage 2 --microbatch-group-size-per-virtual-pipeline-stage 4")
    result = import_config(line, "megatron", gpus=2)
    assert result.config["parallel"]["vpp"] == 2  # 8 layers / pp 2 / 2 per virtual stage
    flag = "--microbatch-group-size-per-virtual-pipeline-stage"
    if "training.microbatch_group_size" in BY_PATH:
        assert result.config["training"]["microbatch_group_size"] == 4 and flag in names(result.read)
    else:
        assert flag in names(result.unsupported) and "microbatch_group_size" not in result.config["training"]


@pytest.mark.parametrize("text, expected", [("1", (0, 1)), ("2", (0, 2)), ("[0]*3+[1]*58", (3, 1)),
                                            ("([0]*3+[1]*58)", (3, 1)), ("[1,0]*4", (0, 2)), ("[0,1]*24", (1, 2))])
def test_moe_layer_pattern(text, expected):
    assert moe_layer_pattern(text) == expected


@pytest.mark.parametrize("text", ["[1,1,0,1]", "__import__('os')", "[2]*4", "[0]*10**9", "0"])
def test_moe_layer_pattern_refuses(text):
    with pytest.raises(ConfigError, match="--moe-layer-freq"):
        moe_layer_pattern(text)


CP_LINE = ("torchrun --nproc-per-node 8 pretrain_gpt.py --num-layers 4 --hidden-size 256 --num-attention-heads 8 "
           "--seq-length 8192 --max-position-embeddings 8192 --vocab-size 32000 --bf16 --swiglu "
           "--position-embedding-type rope --transformer-impl transformer_engine --context-parallel-size 4")


@pytest.mark.parametrize("flags, expected", [("", None), (" --cp-comm-type a2a", "a2a"),
                                             (" --cp-comm-type allgather", "allgather"),
                                             (" --cp-comm-type a2a a2a a2a a2a", "a2a")])
def test_cp_comm_type(flags, expected):
    """--cp-comm-type (one type, or one per layer) becomes parallel.cp_comm_type; left out, Megatron's default p2p
    stands (the field's default)."""
    result = import_config(CP_LINE + flags, "megatron")
    assert result.config["parallel"].get("cp_comm_type") == expected
    if expected:
        assert "--cp-comm-type" in names(result.read)


def test_cp_comm_type_per_layer_or_without_cp():
    mixed = import_config(CP_LINE + " --cp-comm-type a2a p2p a2a p2p", "megatron")
    assert "cp_comm_type" not in mixed.config["parallel"] and "--cp-comm-type" in names(mixed.unsupported)
    alone = import_config(CP_LINE.replace("--context-parallel-size 4", "") + " --cp-comm-type a2a", "megatron")
    assert "cp_comm_type" not in alone.config["parallel"] and "--cp-comm-type" in names(alone.ignored)
    with pytest.raises(ConfigError, match="cp_comm_type"):
        estimate_imported(import_config(CP_LINE + " --cp-comm-type ring", "megatron"))


@pytest.mark.parametrize("value, expected, where", [("0", False, "read"), ("1", True, "read"),
                                                    ("-1", False, "read"), ("-2", None, "read"),
                                                    ("yes", None, "unsupported")])
def test_nccl_cumem_enable_in_the_environment(value, expected, where):
    """NCCL_CUMEM_ENABLE as NCCL reads it (cudawrap.cc ncclCuMemEnable: a value >= 0 as it is, -2 the default, other
    negatives off): training.nccl_cumem; not an integer, reported and left to the default."""
    line = ("torchrun --nproc-per-node 2 pretrain_gpt.py --num-layers 2 --hidden-size 256 --num-attention-heads 8 "
            "--seq-length 1024 --max-position-embeddings 1024 --vocab-size 32000 --tensor-model-parallel-size 2")
    for text in (f"NCCL_CUMEM_ENABLE={value} {line}", f"export NCCL_CUMEM_ENABLE={value}\n{line}"):
        result = import_config(text, "megatron")
        assert result.config["training"].get("nccl_cumem") == expected
        assert "NCCL_CUMEM_ENABLE" in names(getattr(result, where))
