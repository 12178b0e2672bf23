"""The HF Trainer over DDP (framework hf) splits no layer (memory/validation.py _check_trainer_splits): transformers'
tp_plan is a DTensor plan without sequence parallelism and Accelerate's ParallelismConfig is not modelled, so a
TP, PP, CP or EP size above 1 under it is refused by name, where it once took Megatron's sequence-parallel rules."""

from __future__ import annotations

import pytest

from estimator import estimate_config
from estimator.spec.errors import ConfigError


@pytest.mark.parametrize("field", ["tp", "pp", "cp"])
def test_a_split_under_the_trainers_ddp_is_refused(field):
    cfg = {"model": "llama-3.1-8b", "training": {"framework": "hf", "seq_len": 4096},
           "parallel": {"dp": 4, field: 2}}
    with pytest.raises(ConfigError) as error:
        estimate_config(cfg)
    assert error.value.field == f"parallel.{field}" and "1 with framework 'hf'" in str(error.value)


def test_data_parallelism_and_inference_are_estimated():
    assert estimate_config({"model": "llama-3.2-1b", "training": {"framework": "hf"}, "parallel": {"dp": 8}})
    inference = {"model": "llama-3.1-8b", "training": {"framework": "hf", "mode": "inference"}, "parallel": {"tp": 2}}
    assert estimate_config(inference).device_total_bytes > 0
