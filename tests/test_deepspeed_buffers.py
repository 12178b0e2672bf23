"""DeepSpeed's ZeRO buffers (estimator/memory/transients.py deepspeed_buffers), by hand from DeepSpeed v0.19.5's
source: ZeRO-1/2 allocate reduce_bucket_size in full (twice with overlap_comm) whatever the trainable count
(runtime/zero/stage_1_and_2.py setup_buckets); ZeRO-3 keeps one bucket from its start (stage3.py), prefetches up
to stage3_max_live_parameters (partitioned_param_coordinator.py), and keeps the parameters under the persistence
threshold gathered
(parameter_offload.py mark_persistent_parameters). "auto" is what the HF Trainer fills in (transformers
integrations/deepspeed.py trainer_config_finalize): h x h, int(0.9 h x h), 10 h."""

from __future__ import annotations

import pytest

from estimator import estimate_config
from estimator.spec.errors import ConfigError

H = 4096  # Llama-3.1-8B's hidden size
ALL_SEVEN = ["q", "k", "v", "o", "gate", "up", "down"]
TRAINABLE = 41_943_040  # rank-16 adapters on the seven projections (tests/test_adapters.py)
LAYER = 4096 * (4096 + 1024 + 1024 + 4096) + 3 * 4096 * 14336 + 2 * 4096  # one Llama-3.1-8B layer


def lora(zero: int, **training) -> dict:
    return {"model": "llama-3.1-8b", "training": {"framework": "deepspeed", "seq_len": 4096, **training,
                                                  "adapter": {"target_modules": ALL_SEVEN}},
            "parallel": {"dp": 8, "zero_stage": zero}}


def parts(cfg: dict, phase: str) -> dict[str, int]:
    stage = estimate_config(cfg).stages[0]
    return {c.label: c.bytes for p in stage.phases if p.name == phase for c in p.components
            for c in (c.parts or (c,))}


def test_auto_is_what_the_hf_trainer_fills_in():
    from estimator.models.loading import load_config
    from estimator.memory.deepspeed_step import deepspeed_settings
    cfg = load_config(lora(3))
    ds = deepspeed_settings(cfg.architecture, cfg.training, 3)
    assert (ds.reduce_bucket_size, ds.prefetch_bucket_size, ds.persistence_threshold) == \
        (16_777_216, 15_099_494, 40_960)
    assert ds.overlap_comm and not deepspeed_settings(cfg.architecture, cfg.training, 2).overlap_comm
    assert ds.max_live_parameters == 1_000_000_000  # the HF Trainer leaves it to DeepSpeed


@pytest.mark.parametrize("training, expected", [
    ({}, 2 * H * H),  # auto: one bucket of h^2 bf16 elements (overlap_comm off below ZeRO-3)
    ({"overlap_comm": True}, 2 * 2 * H * H),  # a second bucket
    # DeepSpeed's own default: 5e8 elements, not capped at the 41,943,040 trainable ones
    ({"reduce_bucket_size": 500_000_000}, 2 * 500_000_000),
    ({"reduce_bucket_size": 500_000_000, "overlap_comm": True}, 2 * 2 * 500_000_000),
])
@pytest.mark.parametrize("zero", [1, 2])
def test_zero_1_and_2_allocate_the_whole_bucket_in_backward(zero, training, expected):
    backward = parts(lora(zero, **training), "backward")
    bucket = [v for k, v in backward.items() if k.startswith("Gradient reduction bucket")]
    assert bucket == [expected]
    assert not any(k.startswith("Gradient reduction bucket") for k in parts(lora(zero, **training), "forward"))


GATHERED = "Gathered parameters (ZeRO-3 prefetch up to stage3_max_live_parameters)"
HEAD = 128_256 * H  # Llama-3.1-8B's output head, its largest tensor


def test_zero_3_keeps_its_bucket_the_persistent_parameters_and_prefetches_up_to_max_live():
    """ZeRO-3's coordinator (partitioned_param_coordinator.py fetch_sub_module) prefetches at every module hook,
    containers, norms and LoRA's dropout included, whole tensors up to min(max_live - its count, bucket): with more
    hooks than gathered tensors its count climbs to stage3_max_live_parameters (1e9), and the head (525,336,576
    elements) is taken whole once the count is under the bound (tests/test_zero3_replay.py checks the rules by hand)."""
    forward = parts(lora(3), "forward")
    assert forward["Gradient reduction bucket (ZeRO-3)"] == 2 * H * H  # kept through the step
    # norms of 4096 elements (2 per layer and the final one) are under 10 h = 40,960: kept whole
    assert forward["ZeRO-3 persistent parameters (kept gathered)"] == 2 * (32 * 2 + 1) * 4096
    assert 2 * 1_000_000_000 < forward[GATHERED] <= 2 * (1_000_000_000 + HEAD)
    assert forward[GATHERED] > 2 * (LAYER + int(0.9 * H * H))  # what one layer and the bucket would be
    capped = lora(3, stage3_max_live_parameters=100_000_000, stage3_param_persistence_threshold=0)
    forward, backward = parts(capped, "forward"), parts(capped, "backward")
    # a bound under the head: the backward's first gather, the head's own, is all it holds (its own is not capped)
    assert backward[GATHERED] == 2 * HEAD
    assert 2 * HEAD < forward[GATHERED] <= 2 * (100_000_000 + HEAD)
    assert "ZeRO-3 persistent parameters (kept gathered)" not in forward


def test_without_zero_the_engine_reduces_through_its_fixed_buffer():
    cfg = lora(0)
    del cfg["parallel"]["zero_stage"]
    backward = parts(cfg, "backward")
    assert backward["Gradient all-reduce buffer"] == 2 * TRAINABLE  # min(5e8, trainable) bf16


@pytest.mark.parametrize("zero, training, field", [
    (0, {"reduce_bucket_size": 500_000_000}, "training.reduce_bucket_size"),
    (0, {"overlap_comm": True}, "training.overlap_comm"),
    (2, {"stage3_prefetch_bucket_size": 10}, "training.stage3_prefetch_bucket_size"),
    (2, {"stage3_param_persistence_threshold": 10}, "training.stage3_param_persistence_threshold"),
])
def test_a_setting_the_stage_does_not_read_is_refused(zero, training, field):
    with pytest.raises(ConfigError) as err:
        estimate_config(lora(zero, **training))
    assert err.value.field == field and "zero_stage" in str(err.value)


def test_deepspeed_settings_are_refused_under_other_frameworks():
    with pytest.raises(ConfigError) as err:
        estimate_config({"model": "llama-3.1-8b", "training": {"framework": "fsdp2", "overlap_comm": True}})
    assert err.value.field == "training.overlap_comm"
