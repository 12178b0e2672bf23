"""FSDP1's sharding strategies in the estimator (estimator/memory/fsdp1.py, `parallel.fsdp_sharding_strategy`):
each against the FULL_SHARD estimate by hand, the harness's records (tests/data/measured/fsdp1, held to 5% by
tests/test_accuracy.py), an Accelerate config's strategy imported, and the refusals."""

import pytest

from estimator import ConfigError, estimate_config
from estimator.importers import import_config

# Llama-3.1-8B: a decoder layer of 218,112,000 parameters (q 4096x4096, k and v 1024x4096, o 4096x4096, gate, up
# and down 14336x4096, two norms of 4096); the root unit: embedding and head 128,256 x 4096 each and the final norm
LAYER = 2 * 4096 * 4096 + 2 * 1024 * 4096 + 3 * 14336 * 4096 + 2 * 4096
ROOT = 2 * 128256 * 4096 + 4096
GiB = 2**30


def config(strategy: str = "FULL_SHARD", dp: int = 8, **parallel) -> dict:
    return {"model": "llama-3.1-8b",
            "training": {"framework": "fsdp1", "seq_len": 4096, "recompute": "full", "param_dtype": "bf16",
                         "grad_dtype": "fp32", "master_weights": True, "optimizer_dtype": "fp32"},
            "parallel": {"dp": dp, "fsdp_sharding_strategy": strategy, **parallel}}


def peak(cfg: dict) -> int:
    return estimate_config(cfg).allocated_peak_bytes


def test_shard_grad_op_keeps_every_layer_gathered_at_the_backward_start():
    """FULL_SHARD's backward starts with the root and one prefetched layer gathered (bf16); SHARD_GRAD_OP's with
    every unit: 31 more layers, 2 B each."""
    assert LAYER == 218_112_000
    assert peak(config("SHARD_GRAD_OP")) - peak(config()) == 2 * 31 * LAYER


def test_hybrid_shard_is_full_shard_over_its_group():
    """Sharded over the group of 8, replicated twice over 16 ranks: what FULL_SHARD over 8 ranks keeps."""
    assert peak(config("HYBRID_SHARD", 16, fsdp_shard_group_size=8)) == peak(config())
    assert peak(config("HYBRID_SHARD", 16)) == peak(config())  # the default group: a node of 8 GPUs


def test_no_shard_keeps_every_state_whole():
    """NO_SHARD: fp32 parameters, gradients and two AdamW states of all 8.03 B parameters on every rank (the
    states of FULL_SHARD over 8 ranks, times 8), and its backward ends with every fp32 gradient beside two
    bf16 copies of the root (its parameters and its gradient)."""
    states = {c.key: c.bytes for c in next(p for p in estimate_config(config("NO_SHARD")).stages[0].phases
                                           if p.name == "optimizer").components}
    n = 32 * LAYER + ROOT
    assert (states["parameters"], states["gradients"], states["optimizer_states"]) == (4 * n, 4 * n, 8 * n)
    stage = estimate_config(config("NO_SHARD")).stages[0]
    assert stage.peak_phase == "backward"
    assert stage.allocated_peak_bytes - sum(states[k] for k in ("parameters", "gradients", "optimizer_states")) \
        - states.get("workspace", 0) == 2 * 2 * ROOT


@pytest.mark.parametrize("parallel, field", [
    ({"fsdp_sharding_strategy": "SHARD_GRAD_OP", "zero_stage": 3}, "parallel.zero_stage"),
    ({"fsdp_sharding_strategy": "HYBRID_SHARD", "fsdp_shard_group_size": 3}, "parallel.fsdp_shard_group_size"),
    ({"fsdp_shard_group_size": 4}, "parallel.fsdp_shard_group_size"),
    ({"fsdp_sharding_strategy": "ZERO2"}, "parallel.fsdp_sharding_strategy"),
])
def test_bad_strategies_are_refused_naming_the_field(parallel, field):
    strategy = parallel.pop("fsdp_sharding_strategy", "FULL_SHARD")
    with pytest.raises(ConfigError) as err:
        estimate_config(config(strategy, **parallel))
    assert err.value.field == field


def test_a_strategy_outside_fsdp1_is_refused():
    cfg = config("SHARD_GRAD_OP")
    cfg["training"]["framework"] = "fsdp2"
    with pytest.raises(ConfigError) as err:
        estimate_config(cfg)
    assert err.value.field == "parallel.fsdp_sharding_strategy"


def test_no_shard_accumulation_with_tied_embeddings_is_refused():
    """torch 2.13 raises there (validation/fsdp1/cases.py; tests/test_harness_fsdp1_strategies.py runs it)."""
    cfg = {"model": "llama-3.2-1b", "training": {"framework": "fsdp1", "seq_len": 2048, "global_batch_size": 8},
           "parallel": {"dp": 4, "fsdp_sharding_strategy": "NO_SHARD"}}
    with pytest.raises(ConfigError) as err:
        estimate_config(cfg)
    assert err.value.field == "parallel.fsdp_sharding_strategy"
    cfg["training"]["global_batch_size"] = 4
    estimate_config(cfg)


ACCELERATE = """compute_environment: LOCAL_MACHINE
distributed_type: FSDP
mixed_precision: bf16
num_machines: {machines}
num_processes: 16
fsdp_config:
  fsdp_version: 1
  fsdp_sharding_strategy: {strategy}
"""


@pytest.mark.parametrize("strategy, machines, expected", [
    ("HYBRID_SHARD", 2, {"fsdp_sharding_strategy": "HYBRID_SHARD", "fsdp_shard_group_size": 8}),
    ("2", 2, {"fsdp_sharding_strategy": "SHARD_GRAD_OP"}),
    ("NO_SHARD", 1, {"fsdp_sharding_strategy": "NO_SHARD"}),
])
def test_an_accelerate_config_names_its_strategy(strategy, machines, expected):
    args = "--model_name_or_path meta-llama/Llama-3.1-8B --per_device_train_batch_size 1 --max_length 4096"
    result = import_config(ACCELERATE.format(strategy=strategy, machines=machines), training_args=args)
    parallel = result.config["parallel"]
    assert result.config["training"]["framework"] == "fsdp1" and "zero_stage" not in parallel
    assert {k: v for k, v in parallel.items() if k.startswith("fsdp_")} == expected
