"""Properties of every plan, over random small requests: each returned layout's numbers are the full
estimate's and the full roofline's for that layout, it fits under the margin, the list runs fastest
first, and no returned layout is beaten on both memory and throughput by one ranked below it (the
Pareto flags mark exactly the undominated ones)."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from estimator import Hardware, Training, estimate
from estimator.search.planner import plan
from estimator.models.presets import get_architecture
from estimator.speed.roofline import roofline

MODELS = ("llama-3.2-1b", "llama-3.2-3b", "qwen2.5-7b")


@st.composite
def requests(draw):
    model = draw(st.sampled_from(MODELS))
    gpus = draw(st.sampled_from((1, 2, 4, 8, 16)))
    seq = draw(st.sampled_from((1024, 2048, 4096)))
    batch = gpus * draw(st.sampled_from((1, 2, 4)))
    framework = draw(st.sampled_from(("megatron", "fsdp2", "deepspeed")))
    gpu = draw(st.sampled_from(("h100-80", "a100-40", "l4")))
    return model, Training(seq_len=seq, global_batch_size=batch, framework=framework), gpu, gpus


@settings(max_examples=12, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(requests())
def test_every_returned_layout_is_its_full_estimate_and_the_list_is_ranked(request):
    model, training, gpu, gpus = request
    arch = get_architecture(model)
    result = plan(arch, training, gpu, gpus, limit=8)
    layouts = result.layouts
    for x in layouts:
        e = estimate(arch, x.training, x.parallel, Hardware(gpu=gpu), replay=False)  # the plan's flat share
        r = roofline(arch, x.training, x.parallel, Hardware(gpu=gpu))
        assert x.parallel.gpus == gpus
        assert x.device_total_bytes == e.device_total_bytes and x.peak_stage == e.peak_stage
        assert x.utilization <= 0.8 + 1e-12
        assert (x.step_time_s, x.tokens_per_s_per_gpu, x.mfu) == (r.step.time_s, r.step.tokens_per_s_per_gpu,
                                                                   r.step.mfu)
    speeds = [x.tokens_per_s_per_gpu for x in layouts]
    assert speeds == sorted(speeds, reverse=True)
    for i, x in enumerate(layouts):
        below = layouts[i + 1:]
        assert not any(y.device_total_bytes < x.device_total_bytes
                       and y.tokens_per_s_per_gpu >= x.tokens_per_s_per_gpu for y in below)
        beaten = any(y is not x and y.device_total_bytes <= x.device_total_bytes
                     and y.tokens_per_s_per_gpu >= x.tokens_per_s_per_gpu
                     and (y.device_total_bytes, y.tokens_per_s_per_gpu) != (x.device_total_bytes,
                                                                             x.tokens_per_s_per_gpu)
                     for y in layouts)
        if x.pareto:
            assert not beaten


def test_the_training_fields_a_plan_does_not_choose_are_the_users():
    training = Training(seq_len=2048, global_batch_size=16, optimizer="sgd_momentum", dropout=0.1)
    for x in plan(get_architecture("llama-3.2-1b"), training, "h100-80", 8, limit=5).layouts:
        chosen = {"micro_batch_size", "recompute", "recompute_layers", "recompute_modules", "loss"}
        kept = {f.name for f in dataclasses.fields(Training)} - chosen
        assert {k: getattr(x.training, k) for k in kept} == {k: getattr(training, k) for k in kept}


@st.composite
def layouts(draw):
    """A random training configuration the estimator accepts: a model, a layout, a setup."""
    from estimator import Parallel
    model = draw(st.sampled_from(MODELS + ("mixtral-8x7b", "qwen3-30b-a3b", "deepseek-v3")))
    arch = get_architecture(model)
    tp = draw(st.sampled_from((1, 2, 4)))
    pp = draw(st.sampled_from((1, 2, 4)))
    training = Training(seq_len=draw(st.sampled_from((1024, 4096))), micro_batch_size=draw(st.sampled_from((1, 2))),
                        global_batch_size=draw(st.sampled_from((None, 64))),
                        framework=draw(st.sampled_from(("megatron", "fsdp2", "deepspeed"))),
                        recompute=draw(st.sampled_from(("none", "selective", "full"))),
                        loss=draw(st.sampled_from(("standard", "fused", "chunked"))))
    if training.recompute == "full":
        training = dataclasses.replace(training, recompute_layers=draw(st.sampled_from((None, 1, 2))))
    ep = draw(st.sampled_from((1, 2))) if arch.is_moe else 1
    return arch, training, Parallel(tp=tp, pp=pp, dp=2 * ep, ep=ep), draw(st.sampled_from(("h100-80", "a100-40")))


@settings(max_examples=60, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(layouts())
def test_the_planners_device_total_is_the_estimates(layout):
    """The planner judges layouts by `memory.device_total` (the estimate's number without its stages'
    records): equal to `estimate().device_total_bytes`, and refused alike, on any configuration;
    asked first or after the full estimate (they share the memo)."""
    from estimator import ConfigError
    from estimator.memory.memory import device_total
    arch, training, par, gpu = layout
    hw = Hardware(gpu=gpu)
    fresh = dataclasses.replace(arch)  # nothing remembered yet: the total computed first
    try:
        first = device_total(fresh, training, par, hw)
    except ConfigError as exc:
        with pytest.raises(ConfigError) as again:
            estimate(arch, training, par, hw)
        assert str(again.value) == str(exc)
        return
    # the search's total keeps the flat share (FLAT_FOR_SEARCH) where the reported estimate replays the allocator
    flat = estimate(fresh, training, par, hw, replay=False)
    assert first == flat.device_total_bytes == device_total(fresh, training, par, hw)
    assert first == estimate(arch, training, par, hw, replay=False).device_total_bytes
    reported = estimate(arch, training, par, hw)  # each stage's allocated peak alike (the peak stage may differ)
    assert [s.allocated_peak_bytes for s in reported.stages] == [s.allocated_peak_bytes for s in flat.stages]
