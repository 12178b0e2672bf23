"""The torchtitan importer on torchtitan's own job TOMLs (v0.2.2, tests/data/launch/README.md):
each mapped to a JSON config written out here by hand from the file and v0.2.2's job_config.py
defaults, on the GPU count and kind each file's header names, with equal estimates."""

from pathlib import Path

import pytest

from estimator import ConfigError, estimate_config
from estimator.spec.architecture import Architecture
from estimator.importers import estimate_imported, import_config
from estimator.importers.torchtitan import FLAVORS
from estimator.importers.torchtitan_layout import torchtitan_layout
from estimator.models.presets import get_architecture

DATA = Path(__file__).parent / "data" / "launch" / "torchtitan"
FSDP2 = {"framework": "fsdp2", "param_dtype": "bf16", "grad_dtype": "fp32", "loss": "standard"}


def imported(name, gpus, gpu=None, overrides=()):
    return import_config((DATA / name).read_text(), "torchtitan", gpus=gpus, gpu=gpu, overrides=overrides)


def same_estimate(result, expected):
    assert result.config == expected
    assert estimate_imported(result).to_json() == estimate_config(expected).to_json()


def names(settings):
    return [s.name for s in settings]


def test_llama3_8b_on_64_a100():
    # "# NOTE: this toml config is a preset for 64 A100 GPUs."; shard degree -1 takes all 64;
    # activation_checkpoint selective "op"; float8 settings present but no converter
    result = imported("llama3_8b.toml", 64, gpu="a100-80")
    expected = {"model": "llama-3.1-8b",
                "training": {**FSDP2, "seq_len": 8192, "micro_batch_size": 1, "recompute": "selective"},
                "parallel": {"tp": 1, "pp": 1, "cp": 1, "dp": 64}, "hardware": {"gpu": "a100-80"}}
    same_estimate(result, expected)
    assert result.unsupported == () and result.unknown == ()
    assert "quantize.linear.float8.filter_fqns" in names(result.ignored)
    assert "optimizer.lr" in names(result.ignored)


def test_llama3_70b_on_64_a100():
    result = imported("llama3_70b.toml", 64, gpu="a100-80")
    expected = {"model": "llama-3.1-70b",
                "training": {**FSDP2, "seq_len": 8192, "micro_batch_size": 8, "recompute": "full"},
                "parallel": {"tp": 8, "pp": 1, "cp": 1, "dp": 8, "sequence_parallel": True},
                "hardware": {"gpu": "a100-80"}}
    same_estimate(result, expected)


def test_llama3_405b_on_128_h100_float8_compiled():
    # converters ["float8"] with its settings in [quantize.linear.float8]: FSDP float8 all-gather
    result = imported("llama3_405b.toml", 128, gpu="h100-80")
    expected = {"model": "llama-3.1-405b",
                "training": {**FSDP2, "seq_len": 8192, "micro_batch_size": 2, "recompute": "full", "compile": True,
                             "fp8": True, "fp8_all_gather": True},
                "parallel": {"tp": 8, "pp": 1, "cp": 1, "dp": 16, "sequence_parallel": True},
                "hardware": {"gpu": "h100-80"}}
    same_estimate(result, expected)
    assert names(result.unsupported) == ["parallelism.enable_async_tensor_parallel"]  # the compiled loss is modelled


def test_qwen3_32b_on_8_gpus():
    result = imported("qwen3_32b.toml", 8)
    expected = {"model": "qwen3-32b",
                "training": {**FSDP2, "seq_len": 4096, "micro_batch_size": 2, "recompute": "full"},
                "parallel": {"tp": 1, "cp": 1, "dp": 8}}
    same_estimate(result, expected)


def test_deepseek_v3_671b_reads_and_the_estimate_names_its_limit():
    result = imported("deepseek_v3_671b.toml", 512)
    assert result.config["model"]["num_experts"] == 256 and result.config["model"]["first_dense_layers"] == 3
    assert result.config["training"]["recompute"] == "selective"  # mode selective, option op
    with pytest.raises(ConfigError, match="selective"):  # op-level AC of MoE/MLA under fsdp2 is not modelled
        estimate_imported(result)


def test_pipeline_overrides_write_torchtitans_split():
    result = imported("llama3_70b.toml", 64, overrides=("--parallelism.pipeline_parallel_degree", "4",
                                                        "--parallelism.pipeline_parallel_schedule=Interleaved1F1B"))
    par, tr = result.config["parallel"], result.config["training"]
    # 8 stages over 80 layers + 1 + 1: 82 = 8 x 10 + 2, the first two stages one more, the embedding's
    # and the output's stages one fewer
    assert par["pp_layout"] == "Et*10|t*11|t*10|t*10|t*10|t*10|t*10|t*9L"
    assert (par["pp"], par["vpp"], par["dp"], par["zero_stage"]) == (4, 2, 2, 2)  # no reshard with PP
    assert (tr["micro_batch_size"], tr["global_batch_size"]) == (1, 16)  # local batch 8 x dp 2, micro-batches of 1
    assert estimate_imported(result).device_total_bytes > 0


def test_layout_of_torchtitans_split():
    # by hand: 34 effective over 4 stages: 9, 9, 8, 8; minus 1 on the first and last
    assert torchtitan_layout(4, 32, 1, 1) == "Et*8|t*9|t*8|t*7L"
    assert torchtitan_layout(2, 6, 0, 0) == "Et*3|t*3L"


def test_missing_world_size_and_unknown_keys():
    text = (DATA / "llama3_8b.toml").read_text()
    with pytest.raises(ConfigError, match="--gpus"):
        import_config(text, "torchtitan")
    result = import_config(text + "\n[extra]\nfoo = 1\n", "torchtitan", gpus=8,
                           overrides=("--training.seq_lenn", "4", "--activation_checkpoint.mode", "full"))
    assert sorted(names(result.unknown)) == ["--training.seq_lenn", "extra"]
    assert result.config["training"]["recompute"] == "full"


def test_flavors_match_the_presets_they_name():
    # torchtitan's llama3 and qwen3 flavors have the published models' shapes (v0.2.2 models/*/__init__.py)
    for (name, flavor), preset in ((("llama3", "8B"), "llama-3.1-8b"), (("llama3", "70B"), "llama-3.1-70b"),
                                   (("llama3", "405B"), "llama-3.1-405b"), (("qwen3", "8B"), "qwen3-8b"),
                                   (("qwen3", "32B"), "qwen3-32b"), (("qwen3", "30B-A3B"), "qwen3-30b-a3b"),
                                   (("qwen3", "235B-A22B"), "qwen3-235b-a22b")):
        want = get_architecture(preset)
        # what peft would wrap is the Hugging Face checkpoint's (the reader sets it); a flavor runs no peft
        peft = {"peft_moe_conversion": want.peft_moe_conversion, "router_is_linear": want.router_is_linear}
        assert Architecture(**{**FLAVORS[(name, flavor)], "name": preset, **peft}) == want, (name, flavor)


def test_compile_components_without_the_loss_leave_it_eager():
    """compile.components = ["model"] (torchtitan 0.2.0 on, as its MXFP8 and NVFP4 configs set it): the
    blocks compile, the loss stays eager (training.compile_loss false)."""
    text = (DATA / "llama3_8b.toml").read_text().replace('enable=false\ncomponents = ["model", "loss"]',
                                                        'enable=true\ncomponents = ["model"]')
    result = import_config(text, "torchtitan", gpus=64, gpu="a100-80")
    assert result.config["training"]["compile"] is True
    assert result.config["training"]["compile_loss"] is False
    both = import_config(text.replace('components = ["model"]', 'components = ["model", "loss"]'), "torchtitan",
                         gpus=64, gpu="a100-80")
    assert "compile_loss" not in both.config["training"]  # the default: compiled with the model
