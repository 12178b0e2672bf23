"""`plan --emit KIND`: a configuration written as a framework's launch configuration reads back,
through that framework's importer, to the same estimate (and settings it cannot express are refused)."""

import json
import subprocess
import sys

import pytest

from estimator import ConfigError, estimate_config
from estimator.importers import estimate_imported, import_config
from estimator.importers.emit import emit

MEGATRON = [
    {"model": "llama-3.1-8b", "training": {"seq_len": 8192, "global_batch_size": 64, "recompute": "selective",
                                           "loss": "fused"},
     "parallel": {"tp": 2, "pp": 2, "vpp": 2, "dp": 2, "zero_stage": 1}},
    {"model": "llama-3.1-70b", "training": {"seq_len": 4096, "micro_batch_size": 2, "global_batch_size": 256,
                                            "recompute": "full", "recompute_layers": 3, "fp8": True,
                                            "param_dtype": "fp8", "grad_dtype": "bf16"},
     "parallel": {"tp": 8, "pp": 4, "dp": 4, "cp": 2, "zero_stage": 1, "pp_first_stage_layers": 18,
                  "pp_last_stage_layers": 18, "comm_overlap": 0.5}, "hardware": {"expandable_segments": True}},
    {"model": "mixtral-8x7b", "training": {"seq_len": 4096, "global_batch_size": 128, "moe_grouped_gemm": True,
                                           "moe_dispatcher": "alltoall", "dropout": 0.1},
     "parallel": {"tp": 2, "pp": 2, "dp": 8, "ep": 8, "etp": 1, "zero_stage": 1}},
    {"model": "deepseek-v3", "training": {"seq_len": 4096, "global_batch_size": 960, "recompute": "selective",
                                          "recompute_modules": ["layernorm", "mla_up_proj"],
                                          "moe_dispatcher": "deepep", "moe_router_dtype": "fp32"},
     "parallel": {"pp": 16, "dp": 64, "ep": 64, "zero_stage": 1, "pp_layout": "Et*4|(t*4|)*14tmL"}},
]
TORCHTITAN = [
    {"model": "llama-3.1-8b", "training": {"framework": "fsdp2", "seq_len": 8192, "recompute": "full", "fp8": True,
                                           "fp8_recipe": "tensorwise", "fp8_all_gather": True, "compile": True},
     "parallel": {"tp": 2, "dp": 32}},
    {"model": "llama-3.1-70b", "training": {"framework": "fsdp2", "seq_len": 4096, "recompute": "selective",
                                            "global_batch_size": 64},
     "parallel": {"tp": 8, "pp": 2, "vpp": 2, "dp": 4, "zero_stage": 2}},
    {"model": "qwen3-8b", "training": {"framework": "fsdp2", "seq_len": 4096, "micro_batch_size": 2,
                                       "global_batch_size": 64, "recompute": "full", "recompute_every": 2},
     "parallel": {"dp": 8}},
]


def round_trip(kind, config):
    text = emit(kind, config)
    gpu = config.get("hardware", {}).get("gpu")
    result = import_config(text, gpu=gpu)  # the kind is guessed from what was written
    assert result.kind == kind and result.unknown == ()
    assert estimate_imported(result).to_json() == estimate_config(config).to_json(), text
    return text, result


@pytest.mark.parametrize("config", MEGATRON, ids=lambda c: c["model"])
def test_megatron_round_trip(config):
    text, result = round_trip("megatron", config)
    assert text.startswith(("torchrun", "export PYTORCH_CUDA_ALLOC_CONF"))
    assert result.unsupported == ()


@pytest.mark.parametrize("config", TORCHTITAN, ids=lambda c: c["model"])
def test_torchtitan_round_trip(config):
    text, result = round_trip("torchtitan", config)
    assert "[parallelism]" in text and result.unsupported == ()


def test_what_cannot_be_written_is_refused():
    with pytest.raises(ConfigError, match="training.loss"):
        emit("megatron", {"model": "llama-3.1-8b", "training": {"loss": "chunked"}})
    with pytest.raises(ConfigError, match="flavors"):
        emit("torchtitan", {"model": "mistral-7b", "training": {"framework": "fsdp2"}})
    with pytest.raises(ConfigError, match="framework 'megatron'"):
        emit("megatron", {"model": "llama-3.1-8b", "training": {"framework": "fsdp2"}})


def test_plan_emit_command(tmp_path):
    config = tmp_path / "c.json"
    config.write_text(json.dumps({"model": "llama-3.1-8b", "training": {"seq_len": 8192, "global_batch_size": 64}}))
    run = subprocess.run([sys.executable, "-m", "estimator", "plan", "--config", str(config), "--gpus", "16",
                          "--emit", "megatron"], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    plan = subprocess.run([sys.executable, "-m", "estimator", "plan", "--config", str(config), "--gpus", "16",
                           "--json"], capture_output=True, text=True, timeout=300)
    fitting = json.loads(plan.stdout)["layouts"]
    imported = import_config(run.stdout)
    totals = [layout["device_total_bytes"] for layout in fitting]
    assert estimate_imported(imported).device_total_bytes in totals  # the emitted layout is one the plan chose
    assert imported.config["parallel"]["dp"] * imported.config["parallel"].get("tp", 1) * \
        imported.config["parallel"].get("pp", 1) * imported.config["parallel"].get("cp", 1) == 16


def test_megatron_writes_nccl_cumem_where_the_configuration_sets_it():
    """training.nccl_cumem set: an exported NCCL_CUMEM_ENABLE (0 or 1), which the importer reads back; unset,
    nothing (torch's default)."""
    base = {"model": "llama-3.1-8b", "training": {"seq_len": 4096, "global_batch_size": 8},
            "parallel": {"tp": 2, "dp": 1, "zero_stage": 1}}
    for setting, line in ((False, "export NCCL_CUMEM_ENABLE=0\n"), (True, "export NCCL_CUMEM_ENABLE=1\n"),
                          (None, None)):
        config = json.loads(json.dumps(base))
        if setting is not None:
            config["training"]["nccl_cumem"] = setting
        text, result = round_trip("megatron", config)
        assert (line in text) if line else "NCCL_CUMEM_ENABLE" not in text
        assert result.config["training"].get("nccl_cumem") == setting
