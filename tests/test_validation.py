"""Every validation rule: a clear message naming the field, the value and what is allowed; the CLI
prints it as one line on stderr and exits 2."""

import json
import subprocess
import sys

import pytest

from estimator import ConfigError, estimate_config
from estimator.spec.fields import label


def named(path: str) -> str:
    """How a message names a field: its label, then its place in the JSON config."""
    return path if label(path) == path else f"{label(path)} [{path}]"

LLAMA = {"hidden_size": 4096, "num_layers": 32, "num_attention_heads": 32, "num_kv_heads": 8,
         "intermediate_size": 14336, "vocab_size": 128256}
MOE = {"hidden_size": 1024, "num_layers": 4, "num_attention_heads": 16, "num_kv_heads": 4, "vocab_size": 32000,
       "num_experts": 8, "num_experts_per_token": 2, "moe_intermediate_size": 512}

CASES = [
    # (config, field named, words the message must contain)
    ({"model": LLAMA, "parallel": {"tp": 3}}, "parallel.tp", "num_attention_heads (32) must be divisible by tp"),
    ({"model": LLAMA, "parallel": {"tp": 16}}, "parallel.tp", "num_kv_heads (8) must be divisible by tp"),
    ({"model": LLAMA, "parallel": {"pp": 3}}, "parallel.pp", "divides num_layers (32)"),
    ({"model": LLAMA, "parallel": {"pp": 4, "vpp": 3}}, "parallel.vpp", "pp x vpp = 12 does not divide"),
    ({"model": LLAMA, "parallel": {"pp": 5, "vpp": 2}}, "parallel.pp", "pp x vpp = 10"),
    ({"model": LLAMA, "parallel": {"pp": 4, "pp_first_stage_layers": 7, "pp_last_stage_layers": 6}},
     "parallel.pp_first_stage_layers", "middle stages"),
    ({"model": LLAMA, "parallel": {"tp": 2, "pp": 2, "dp": 2, "world_size": 16}}, "parallel.world_size",
     "tp x pp x cp x dp = 2 x 2 x 1 x 2 = 8"),
    ({"model": LLAMA, "parallel": {"cp": 4}, "training": {"seq_len": 4100}}, "training.seq_len", "2 x cp = 8"),
    ({"model": LLAMA, "parallel": {"cp": 2}, "training": {"attention": "eager"}}, "training.attention", "'flash'"),
    ({"model": LLAMA, "parallel": {"dp": 4}, "training": {"micro_batch_size": 2, "global_batch_size": 12}},
     "training.global_batch_size", "micro_batch_size x dp = 8"),
    ({"model": LLAMA, "training": {"seq_len": 0}}, "training.seq_len", "an integer from 1 to 16,777,216"),
    ({"model": LLAMA, "training": {"micro_batch_size": -1}}, "training.micro_batch_size", "an integer from 1 to 65,536"),
    ({"model": LLAMA, "parallel": {"dp": 0}}, "parallel.dp", "an integer from 1 to 1,048,576"),
    ({"model": {**LLAMA, "hidden_size": -4096}}, "model.hidden_size", "an integer from 1 to 1,048,576"),
    ({"model": LLAMA, "training": {"param_dtype": "fp12"}}, "training.param_dtype", "'bf16'"),
    ({"model": LLAMA, "training": {"optimizer": "adamax"}}, "training.optimizer", "'adamw'"),
    ({"model": LLAMA, "training": {"recompute": "some"}}, "training.recompute", "'selective'"),
    ({"model": LLAMA, "training": {"framework": "jax"}}, "training.framework", "'megatron'"),
    ({"model": LLAMA, "hardware": {"gpu": "h100"}}, "hardware.gpu", "h100-80"),
    ({"model": LLAMA, "training": {"sq_len": 8192}}, "training.sq_len", "unknown field"),
    ({"model": {**LLAMA, "hidden": 1}}, "model.hidden", "unknown field"),
    ({"model": LLAMA, "paralel": {}}, "paralel", "unknown section"),
    ({"model": LLAMA, "parallel": {"ep": 2}}, "parallel.ep", "the model has no experts"),
    ({"model": MOE, "parallel": {"ep": 3, "dp": 3}}, "parallel.ep", "num_experts (8) must be divisible by ep"),
    ({"model": MOE, "parallel": {"ep": 4, "dp": 2}}, "parallel.ep", "does not fit in the 2 GPUs"),
    ({"model": {**MOE, "num_experts_per_token": 9}}, "model.num_experts_per_token", "at most num_experts (8)"),
    ({"model": MOE, "parallel": {"tp": 2, "sequence_parallel": False}}, "parallel.sequence_parallel", "MoE"),
    ({"model": LLAMA, "training": {"recompute": "none", "recompute_layers": 4}}, "training.recompute_layers",
     "only with recompute 'full'"),
    ({"model": LLAMA, "training": {"recompute": "full", "recompute_layers": 40}}, "training.recompute_layers",
     "at most the layers of a stage (32)"),
    ({"model": LLAMA, "training": {"framework": "hf"}, "parallel": {"zero_stage": 3, "dp": 2}},
     "parallel.zero_stage", "0 with framework 'hf'"),
    ({"model": LLAMA, "training": {"framework": "fsdp2"}, "parallel": {"zero_stage": 1, "dp": 2}},
     "parallel.zero_stage", "FSDP2 has no optimizer-only sharding"),
    ({"model": LLAMA, "training": {"dropout": 1.5}}, "training.dropout", "a number >= 0 and below 1"),
    ({"model": LLAMA, "parallel": {"tp": "4"}}, "parallel.tp", "an integer from 1 to 65,536"),
    ({"model": {**LLAMA, "tie_embeddings": "yes"}}, "model.tie_embeddings", "true or false"),
    ({"model": {**LLAMA, "num_kv_heads": 5}}, "model.num_kv_heads", "a divisor of num_attention_heads (32)"),
    ({"model": {**LLAMA, "q_lora_rank": 0, "kv_lora_rank": 512, "qk_nope_head_dim": 128,
                "qk_rope_head_dim": 64, "v_head_dim": 128}}, "model.q_lora_rank", "an integer from 1 to 1,048,576"),
    ({"model": LLAMA, "training": {"fp8": True, "framework": "hf"}}, "training.fp8",
     "modelled for Megatron-Core with TransformerEngine"),
    ({"model": LLAMA, "training": {"param_dtype": "fp8"}}, "training.param_dtype", "belong to the FP8 recipe"),
    ({"model": LLAMA, "training": {"param_dtype": "fp4"}}, "training.param_dtype", "fp4 weights are for inference"),
    ({"model": LLAMA, "training": {"fp8": True, "fp8_recipe": "e4m3"}}, "training.fp8_recipe", "'mxfp8'"),
    ({"model": LLAMA, "training": {"moe_capacity_factor": 0.5}}, "training.moe_capacity_factor", "a number from 1 to 256"),
    ({"training": {}}, "model", "required"),
    ({"model": "not a/valid id!"}, "model", "not a valid repository id"),
]


@pytest.mark.parametrize("config, field, words", CASES, ids=[c[1] + ":" + c[2][:20] for c in CASES])
def test_rule_message(config, field, words):
    with pytest.raises(Exception) as info:
        estimate_config(config)
    message = str(info.value)
    assert message.startswith(named(field) + " = "), message
    assert words in message
    assert "allowed:" in message


@pytest.mark.parametrize("config, field, words", CASES[::3], ids=[c[1] for c in CASES[::3]])
def test_cli_exits_2_with_one_line(tmp_path, config, field, words):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    run = subprocess.run([sys.executable, "-m", "estimator", "estimate", "--config", str(path), "--json"],
                         capture_output=True, text=True)
    assert run.returncode == 2
    assert run.stdout == ""
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and field in lines[0] and words in lines[0]
    assert "Traceback" not in run.stderr


def test_a_broken_rule_names_the_other_fields_it_ties():
    # 32 layers on PP 4: the stages divide (8 layers each) but VPP 3 chunks do not; the UI blames
    # the field the user changed among the field and its related ones
    with pytest.raises(ConfigError) as info:
        estimate_config({"model": LLAMA, "parallel": {"pp": 4, "vpp": 3}})
    assert info.value.field == "parallel.vpp" and "parallel.pp" in info.value.related
    assert "a divisor of the 8 layers of each stage" in str(info.value)
