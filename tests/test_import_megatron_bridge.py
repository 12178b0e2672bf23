"""The Megatron-Bridge importer on Megatron-Bridge's own launch lines and override files
(tests/data/launch/README.md) and the command its runner documents, each mapped to a JSON config written
out here by hand from the recipe's source (src/megatron/bridge/recipes/..., commit 067f987d), with an
equal estimate. Nothing of the recipe is imported or run."""

from pathlib import Path

import pytest

from estimator import ConfigError, estimate_config
from estimator.importers import estimate_imported, import_config
from import_refusals import SUBSTITUTION, TOO_LARGE

DATA = Path(__file__).parent / "data" / "launch" / "megatron-bridge"
KIND = "megatron-bridge"


def test_qwen3_30b_a3b_recipe_from_the_runners_docstring():
    # scripts/training/run_recipe.py's own example, under a 2 x 8 torchrun
    line = ("torchrun --nproc_per_node 8 --nnodes 2 scripts/training/run_recipe.py "
            "--recipe qwen3_30b_a3b_pretrain_16gpu_h100_bf16_config --mode pretrain")
    result = import_config(line)  # kind guessed from run_recipe.py
    assert result.kind == KIND
    # qwen/h100/qwen3_moe.py: the 16-GPU recipe starts from the 8-GPU one and sets TP 1, PP 1, EP 16, ETP 1,
    # no recompute, sequence 4096, batch 1024 of 1, bf16_mixed with grad_reduce_in_fp32 False (bf16
    # gradients), the flex dispatcher on HybridEP (estimated as DeepEP's buffers); it keeps the 8-GPU
    # recipe's grouped GEMM, TE cross-entropy fusion and both DDP overlaps; the distributed optimizer
    expected = {"model": "qwen3-30b-a3b",
                "training": {"seq_len": 4096, "global_batch_size": 1024, "grad_dtype": "bf16", "loss": "fused",
                             "cross_entropy_impl": "te", "moe_dispatcher": "deepep", "moe_grouped_gemm": True},
                "parallel": {"tp": 1, "pp": 1, "cp": 1, "dp": 16, "ep": 16, "etp": 1, "zero_stage": 1}}
    assert result.config == expected
    assert estimate_imported(result).to_json() == estimate_config(expected).to_json()
    unsupported = {s.name for s in result.unsupported}
    assert {"model.moe_flex_dispatcher_backend (recipe)", "comm_overlap.tp_comm_overlap (recipe)",
            "model.cuda_graph_impl (recipe)", "recipe qwen3_30b_a3b_pretrain_16gpu_h100_bf16_config"} <= unsupported
    assert "--mode" in {s.name for s in result.ignored}
    assert not result.unknown


def test_override_file_beside_a_recipe():
    # examples/quantization/conf/...override_example.yaml over llama3_8b_pretrain_config (the alias of
    # llama/h100/llama3.py llama3_8b_pretrain_2gpu_h100_bf16_config): the file sets TP 1, CP 1 and a batch
    # of 8; the recipe keeps sequence 8192, micro-batch 1, TE cross-entropy fusion, the distributed
    # optimizer with both overlaps; bf16_mixed from _pretrain_common
    text = (DATA / "quantized_llama3_8b_pretrain_override_example.yaml").read_text()
    result = import_config(text, KIND, gpus=8, overrides=("--recipe", "llama3_8b_pretrain_config"))
    expected = {"model": "llama-3.1-8b",
                "training": {"seq_len": 8192, "global_batch_size": 8, "loss": "fused", "cross_entropy_impl": "te"},
                "parallel": {"tp": 1, "pp": 1, "cp": 1, "dp": 8, "zero_stage": 1}}
    assert result.config == expected
    assert estimate_imported(result).to_json() == estimate_config(expected).to_json()
    assert {"checkpoint.save_interval (yaml)", "train.train_iters (yaml)"} <= {s.name for s in result.ignored}
    assert "model.gradient_accumulation_fusion (yaml)" in {s.name for s in result.unsupported}
    with pytest.raises(ConfigError, match="--recipe"):
        import_config(text, KIND, gpus=8)  # the file alone does not name the model


def test_long_context_sft_script():
    result = import_config((DATA / "qwen3_600m_sft_128k.sh").read_text())
    # qwen3_600m_sft_128k_config -> qwen3_600m_sft_8gpu_h100_bf16_128k_config: CP 8 on the 8 GPUs of
    # torch.distributed.run, sequence 131072; the script's batch of 2 of 1; the SFT base has no
    # distributed optimizer and no DDP overlap
    assert result.config == {"model": "Qwen/Qwen3-0.6B",
                             "training": {"seq_len": 131072, "global_batch_size": 2},
                             "parallel": {"tp": 1, "pp": 1, "cp": 8, "dp": 1, "cp_comm_type": "a2a",
                                          "comm_overlap": 0.0}}
    assert "model.cp_comm_type (recipe)" in {s.name for s in result.read}  # the recipe's all-to-all
    assert {"logger.wandb_project", "checkpoint.save"} <= {s.name for s in result.ignored}


def test_precision_recipes_and_typos():
    line = "torchrun --nproc_per_node 8 run_recipe.py --recipe llama31_8b_pretrain_config "
    fp8 = import_config(line + "mixed_precision=bf16_with_fp8_current_scaling_mixed -tp 2 "
                               "model.sequence_parallel=true", KIND)
    # training/mixed_precision.py: hybrid FP8 with per-tensor current scaling (tensorwise), no FP8 weights
    assert (fp8.config["training"]["fp8"], fp8.config["training"]["fp8_recipe"]) == (True, "tensorwise")
    assert fp8.config["parallel"]["tp"] == 2 and fp8.config["parallel"]["sequence_parallel"] is True
    typo = import_config(line + "model.tensor_parallel_size=2 trian.micro_batch_size=2", KIND)
    assert {s.name for s in typo.unknown} == {"model.tensor_parallel_size", "trian.micro_batch_size"}
    with pytest.raises(ConfigError, match="mixed_precision"):
        import_config(line + "mixed_precision=bf16_with_nvfp4_mixed", KIND)
    with pytest.raises(ConfigError, match="--recipe"):
        import_config("torchrun --nproc_per_node 8 run_recipe.py --model llama3_8b --mode pretrain", KIND)
    with pytest.raises(ConfigError, match="--recipe"):
        import_config("torchrun --nproc_per_node 8 run_recipe.py --recipe gpt_oss_20b_pretrain_config", KIND)
    with pytest.raises(ConfigError, match="--gpus"):
        import_config("python run_recipe.py --recipe llama31_8b_pretrain_config", KIND)


def test_peft_recipe_maps_its_lora_and_the_estimate_says_it_is_not_modelled():
    result = import_config("torchrun --nproc_per_node 8 run_recipe.py --recipe llama3_8b_peft_config peft.dim=16",
                           KIND)
    # recipes/common.py _peft_common: LoRA on linear_qkv, linear_proj, linear_fc1, linear_fc2 (every linear
    # layer), alpha 32, dropout 0; the command sets the rank to 16
    assert result.config["training"]["adapter"] == {"method": "lora", "rank": 16, "alpha": 32.0,
                                                    "target_modules": "all-linear", "dropout": 0.0}
    with pytest.raises(ConfigError, match="Megatron-Bridge's PEFT is not modelled"):
        estimate_imported(result)


NOT_DATA = "could not determine a constructor for the tag 'tag:yaml.org,2002:python/object/apply:os.system'"
BOMB = "an alias expansion bomb is refused"


@pytest.fixture
def built(monkeypatch) -> list[int]:
    """The YAML texts the loader went on to build (yaml.load), by length, as it builds them."""
    import yaml
    lengths, real = [], yaml.load
    monkeypatch.setattr(yaml, "load", lambda text, *a, **k: lengths.append(len(text)) or real(text, *a, **k))
    return lengths


@pytest.mark.parametrize("text, refusal", [
    ("torchrun --nproc_per_node $(nproc) run_recipe.py --recipe llama3_8b_pretrain_config", SUBSTITUTION),
    ("a: &a [x, x, x, x, x, x, x, x, x]\nb: &b [*a, *a, *a, *a, *a, *a, *a, *a, *a]\nc: &c [*b, *b, *b, *b, *b, *b, "
     "*b, *b, *b]\nd: &d [*c, *c, *c, *c, *c, *c, *c, *c, *c]\ne: &e [*d, *d, *d, *d, *d, *d, *d, *d, *d]\n"
     "f: [*e, *e, *e, *e, *e, *e, *e, *e, *e]\n", BOMB),
    ("model: !!python/object/apply:os.system ['touch /tmp/bridge-pwned']\n", NOT_DATA),
    ("model:\n  tensor_model_parallel_size: 2\n" * 30_000, TOO_LARGE),
])
def test_hostile_inputs_are_refused_by_their_guard(text, refusal, importer_reads, built):
    """Each is refused by the guard that bounds its cost, not by a clock (their times:
    bench/bench_refusals.py): a command substitution by the shell reader, which never runs it; an alias
    bomb (9^6 values) counted from YAML's event stream and never built (yaml.load not called); a
    !!python tag by the safe loader; text over MAX_BYTES by the size check, before any reader runs."""
    with pytest.raises(ConfigError) as info:
        import_config(text, KIND, gpus=8, overrides=("--recipe", "llama3_8b_pretrain_config"))
    assert refusal in str(info.value)
    assert importer_reads == ([] if refusal == TOO_LARGE else [KIND])
    if refusal in (BOMB, TOO_LARGE):
        assert built == []
    assert not Path("/tmp/bridge-pwned").exists()


# --- plan --emit megatron-bridge ----------------------------------------------------------------------

EMIT = [
    {"model": "llama-3.1-8b", "training": {"seq_len": 8192, "global_batch_size": 64, "recompute": "selective",
                                           "loss": "fused", "dropout": 0.0},
     "parallel": {"tp": 2, "pp": 2, "vpp": 2, "dp": 2, "zero_stage": 1}},
    {"model": "llama-3.1-70b", "training": {"seq_len": 4096, "micro_batch_size": 2, "global_batch_size": 256,
                                            "recompute": "full", "recompute_layers": 3, "fp8": True,
                                            "param_dtype": "fp8", "grad_dtype": "bf16", "dropout": 0.0},
     "parallel": {"tp": 8, "pp": 4, "dp": 4, "cp": 2, "zero_stage": 1, "pp_first_stage_layers": 18,
                  "pp_last_stage_layers": 18, "comm_overlap": 0.5}},
    {"model": "qwen3-30b-a3b", "training": {"seq_len": 4096, "global_batch_size": 128, "moe_grouped_gemm": True,
                                            "moe_dispatcher": "alltoall", "dropout": 0.0},
     "parallel": {"tp": 2, "dp": 8, "ep": 8, "etp": 1, "zero_stage": 1}},
    {"model": "llama-3.1-8b", "training": {"seq_len": 4096, "dropout": 0.1}, "parallel": {"dp": 8}},
    {"model": "qwen3-8b", "training": {"seq_len": 4096, "offload_optimizer": "cpu"},
     "parallel": {"dp": 8, "zero_stage": 1}},
]


@pytest.mark.parametrize("config", EMIT, ids=lambda c: c["model"])
def test_emit_round_trip(config):
    from estimator.importers.emit_bridge import emit_bridge
    text = emit_bridge(config)
    assert text.startswith("torchrun --nproc_per_node") and " --recipe " in text
    result = import_config(text)  # the kind guessed from run_recipe.py
    assert result.kind == KIND and result.unknown == ()
    assert estimate_imported(result).to_json() == estimate_config(config).to_json(), text


def test_emit_refuses_what_bridge_cannot_write():
    from estimator.importers.emit_bridge import emit_bridge
    with pytest.raises(ConfigError, match="megatron-bridge has no recipe"):
        emit_bridge({"model": "mixtral-8x7b", "training": {"seq_len": 4096}, "parallel": {"dp": 8}})
    with pytest.raises(ConfigError, match="--emit"):
        emit_bridge({"model": "llama-3.1-8b", "training": {"framework": "fsdp2", "seq_len": 4096}})
