"""Properties of every plan, over random small requests: each returned layout's numbers are the full
estimate's and the full roofline's for that layout, it fits under the margin, the list runs fastest
first, and no returned layout is beaten on both memory and throughput by one ranked below it (the
Pareto flags mark exactly the undominated ones)."""

from __future__ import annotations

import dataclasses

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from estimator import Hardware, Training, estimate
from estimator.planner import plan
from estimator.presets import get_architecture
from estimator.roofline import roofline

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
        e = estimate(arch, x.training, x.parallel, Hardware(gpu=gpu))
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
