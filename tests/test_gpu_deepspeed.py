"""The estimator against the four real DeepSpeed 0.19.5 steps of Qwen-1.8B on one H200 (tests/data/measured/gpu/deepspeed,
validation/gpu/deepspeed_step.py: transformers' Qwen2ForCausalLM at Qwen-1-1.8B's sizes, Qwen's ds_config with the HF
integration's 'auto' values, gradient checkpointing, bf16, torch's AdamW as the client optimizer, foreach or fused).

What DeepSpeed holds beside the model states, each by hand from its source (estimator/memory/deepspeed_step.py):
ZeRO-3's flat gradient partitions from initialisation, the step's fp32 copy of one sub-group (its first closes at
1,008,205,824 elements) with the flat 16-bit copy it is cast from or foreach AdamW's sqrt(v), ZeRO-2's whole partition
in fp32 and the gradient partitions it allocates a few layers into backward beside the head's whole gradient.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from estimator import estimate_config

RECORDS = sorted((Path(__file__).parent / "data" / "measured" / "gpu" / "deepspeed").glob("*.json"))
N = 1_836_828_672  # Qwen-1.8B's parameters (tests/test_gpu_framework_steps.py counts them by hand)
HEAD = 151_936 * 2048  # the LM head, untied, the largest tensor
LAYER_MATRICES = 4 * 2048**2 + 3 * 2048 * 5504
FIRST_SUB_GROUP = HEAD + 13 * LAYER_MATRICES + 4 * 2048**2 + 2 * 2048 * 5504  # the embedding's size is the head's
WORKSPACES = 2 * 32 * 2**20  # the two cuBLAS workspaces (tests/test_accuracy.py test_gpu_library_workspaces)
BUCKET_ZERO3 = 2 * 2048**2  # one reduce bucket of 'auto' h x h bf16 elements, kept (stage3.py __init__)


def load(path: Path) -> dict:
    return json.loads(path.read_text())


def stage(record: dict):
    result = estimate_config(record["config"])
    return next(s for s in result.stages if s.stage == result.peak_stage)


def test_the_four_runs_are_there():
    ids = {p.stem for p in RECORDS}
    assert ids == {f"deepspeed-qwen-1.8b-zero{z}-{o}-adamw-recompute-s{s}-b1"
                   for z, o, s in ((3, "foreach", 256), (3, "fused", 256), (3, "foreach", 4096), (2, "foreach", 256))}
    for path in RECORDS:
        record = load(path)
        assert record["config"]["training"]["adamw_implementation"] == record["run"]["optimizer"]
        assert record["measured"]["parameter_count"] == N


@pytest.mark.parametrize("path", RECORDS, ids=lambda p: p.stem)
def test_each_phase_within_one_percent(path):
    """max_memory_allocated of each phase of step 2 and its peak: the peaks within 0.01%, forward and the optimizer
    within 0.05%; ZeRO-3's backward 0.3% under at 256 tokens (its moment is the head's whole bf16 gradient, 0.58 GiB,
    kept until the next gradient's hook, beside the logits' bf16 gradient, 74 MiB, which the estimate leaves to the
    loss's moment; 0.8% under before the head's gradient was modelled), 0.01% at 4096 tokens, where the loss's
    moment is the larger."""
    record = load(path)
    measured = record["measured"]
    estimate = stage(record)
    totals = {p.name: sum(c.bytes for c in p.components) for p in estimate.phases}
    assert estimate.allocated_peak_bytes == pytest.approx(measured["peak_bytes"], rel=1e-4)
    for phase in ("forward", "backward", "optimizer"):
        assert totals[phase] == pytest.approx(measured["phases"][phase]["peak_bytes"], rel=0.003 if phase == "backward"
                                              else 5e-4), phase


@pytest.mark.parametrize("path", [p for p in RECORDS if "zero3" in p.stem], ids=lambda p: p.stem)
def test_zero3_holds_its_gradient_partitions_between_steps(path):
    """What step 2 starts from, by hand: the bf16 parameters, the fp32 partitions and the two fp32 moments
    (DeepSpeed's own counts, as the run read them), the flat bf16 gradient buffer of every partition (stage3.py
    grad_partitions_flat_buffer), the reduce bucket and the workspaces: to 0.6 MB of 29.5 GB."""
    measured = load(path)["measured"]
    states = measured["parameters"] + measured["fp32_partitions"] + measured["optimizer_states"]
    assert (measured["parameters"], measured["fp32_partitions"]) == (2 * N, 4 * N)
    by_hand = states + 2 * N + BUCKET_ZERO3 + WORKSPACES
    assert 0 <= measured["allocated_before_step2_bytes"] - by_hand < 600_000
    estimate = stage(load(path))
    forward = next(p for p in estimate.phases if p.name == "forward")
    assert next(c.bytes for c in forward.components if c.key == "gradients") == 2 * N
    if path.stem.endswith("-s256-b1"):  # backward's moment: the head's whole gradient (stage3.py, over the bucket)
        backward = {c.label: c.bytes for p in estimate.phases if p.name == "backward" for c in p.components
                    for c in (c.parts or (c,))}
        assert backward["The largest tensor's gradient, whole until the next gradient's hook"] == 2 * HEAD


@pytest.mark.parametrize("optimizer, step", [("foreach", 8 * FIRST_SUB_GROUP), ("fused", 6 * FIRST_SUB_GROUP)])
def test_zero3_steps_one_sub_group_at_a_time(optimizer, step):
    """The step's peak over its start, by hand: the first sub-group (1,008,205,824 elements: the run's first fp32
    partition) cast to fp32 from its flat bf16 copy (2 + 4 B each), or, with foreach AdamW, the fp32 gradient and
    sqrt(v) (4 + 4 B each); the measured difference is that to 2.1 MB."""
    path = next(p for p in RECORDS if f"zero3-{optimizer}-adamw-recompute-s256" in p.stem)
    measured = load(path)["measured"]
    assert measured["fp32_partition_numels"][0] == FIRST_SUB_GROUP == 1_008_205_824
    phase = measured["phases"]["optimizer"]
    assert 0 <= phase["peak_bytes"] - phase["start_bytes"] - step < 2_200_000
    parts = {c.label: c.bytes for p in stage(load(path)).phases if p.name == "optimizer" for c in p.components
             for c in (c.parts or (c,))}
    assert parts["fp32 copy of the gradient partition for the step"] == 4 * FIRST_SUB_GROUP
    other = ("foreach AdamW temporary (sqrt of the second moment)" if optimizer == "foreach" else
             "flat copy of the sub-group's gradients, cast to fp32")
    assert parts[other] == (4 if optimizer == "foreach" else 2) * FIRST_SUB_GROUP


def test_zero2_steps_its_whole_partition_and_makes_its_gradients_in_backward():
    """ZeRO-2 on one GPU: its step casts the whole 1,836,580,864-element weight-decay partition to fp32 and foreach
    AdamW makes sqrt(v) of it (8 B an element over the step's start, to 1 MB; the allocator's history at the peak
    names stage_1_and_2.py's step and adam.py's _multi_tensor_adam, 7,346,323,456 B each); its gradient partitions,
    2 B each, are allocated in backward (copy_grads_in_partition) beside the head's whole bf16 gradient (311 M
    elements over the 2e8 bucket) and both reduce buckets."""
    path = next(p for p in RECORDS if "zero2" in p.stem)
    record = load(path)
    measured = record["measured"]
    decay = measured["fp32_partition_numels"][0]
    assert decay == 2 * HEAD + 24 * LAYER_MATRICES == 1_836_580_864
    phase = measured["phases"]["optimizer"]
    assert 0 <= phase["peak_bytes"] - phase["start_bytes"] - 8 * decay < 1_100_000
    step_blocks = {g["where"][0].split("/")[-1]: g["bytes"] for g in measured["peak_blocks"]["groups"] if g["where"]}
    assert step_blocks["stage_1_and_2.py:2335 step"] == step_blocks["adam.py:791 _multi_tensor_adam"] == 4 * decay
    assert step_blocks["stage_1_and_2.py:1651 copy_grads_in_partition"] == 2 * N
    backward = {c.label: c.bytes for p in stage(record).phases if p.name == "backward" for c in p.components
                for c in (c.parts or (c,))}
    assert backward["Gradients"] == 2 * N
    assert backward["The largest tensor's gradient, whole until the first reduction"] == 2 * HEAD
    assert backward["Gradient reduction buckets (overlap_comm: two)"] == 2 * 2 * 200_000_000


def _replayed_segments(record: dict) -> list[int]:
    """The large segments (over 16 MiB) the DeepSpeed replay makes for `record`'s configuration (the memo emptied
    first: an estimate remembers its replay)."""
    from estimator.memory import allocator
    from estimator.spec import memo

    made: list[int] = []
    original = allocator.CachingAllocator._new_segment

    def recording(self, size, small):
        made.append(size)
        return original(self, size, small)

    memo.PER_LAYOUT.clear()
    allocator.CachingAllocator._new_segment = recording
    try:
        estimate_config(record["config"])
    finally:
        allocator.CachingAllocator._new_segment = original
    return sorted((s for s in made if s > 16 * 2**20), reverse=True)


@pytest.mark.parametrize("path", RECORDS, ids=lambda p: p.stem)
def test_the_replay_makes_the_segments_the_gpu_made(path):
    """The caching allocator replayed over DeepSpeed's initialisation and two steps (deepspeed_replay.py) makes the
    large segments the run ended with, size for size (ZeRO-3: 4 B x the first sub-group, 3.756 GiB, seven to nine
    times; 2 B x N for the parameters; 4 B x the second sub-group twice; at 4096 tokens two of the fp32 logits',
    2.318 GiB; ZeRO-2: six of 4 B x the partition, two of 2 B x N, one of them its gradients' on the reduction
    stream), and so max_memory_reserved to 0.03%."""
    record = load(path)
    measured = record["measured"]
    gpu = sorted((s[0] for s in measured["segments"] if s[0] > 16 * 2**20), reverse=True)
    assert _replayed_segments(record) == gpu
    assert stage(record).reserved_peak_bytes == pytest.approx(measured["reserved_peak_bytes"], rel=3e-4)


@pytest.mark.parametrize("path", RECORDS, ids=lambda p: p.stem)
def test_outside_the_allocator_and_nvidia_smi(path):
    """What the device holds beyond the reserved segments is the same 1,800,208,384 B in all four runs: the HF runs'
    context and kernels (804,061,184 B with FlashAttention's, tests/test_accuracy.py), NCCL's kernels and DeepSpeed's
    two communicators of one rank (stage_shared.one_rank_world: 85 + 2 x 194 granules of 2 MiB, 946 MiB;
    tests/test_nccl_one_rank.py) and 4 MiB that the estimate leaves out (2 granules of kernels DeepSpeed's step
    loads beyond the HF step's); the estimate's device total is then nvidia-smi's reading (8.8 MiB under the
    device's used bytes, as on every H200 run) to 0.05%."""
    record = load(path)
    measured = record["measured"]
    outside = measured["device_used_end_bytes"] - measured["reserved_end_bytes"]
    assert outside == 1_800_208_384 == 804_061_184 + (85 + 2 * 194 + 2) * 2 * 2**20
    estimate = stage(record)
    assert estimate.component("communication").bytes == (85 + 2 * 194) * 2 * 2**20
    assert outside - estimate.component("runtime").bytes - estimate.component("communication").bytes == 4 * 2**20
    assert estimate.device_total_bytes == pytest.approx(measured["nvidia_smi_used_end_bytes"], rel=5e-4)


def test_the_readme_row():
    """`python -m validation summary` prints the README's real-GPU row of these runs from the same records; the
    table's text says what makes its nvidia-smi column agree (NCCL's world of one rank, modelled)."""
    from pathlib import Path

    from validation.core.summary import gpu_summary

    row = gpu_summary("deepspeed")
    assert (row.runs, row.within) == (4, 4)
    assert round(100 * row.allocated, 1) == 0.0 and round(100 * row.reserved, 1) == 0.0
    assert round(100 * row.nvidia_smi, 1) == 0.0 and abs(row.worst) < 5e-4
    readme = (Path(__file__).parents[1] / "README.md").read_text()
    assert "| DeepSpeed 0.19.5 ZeRO-2/3 steps on an H200 (`validation/gpu/deepspeed_step.py`) | 4 | 4 | 0.0% | 0.0% | " \
        "0.0% | −0.0% (" in readme and "DeepSpeed's two communicators of one rank, 946 MiB" in readme
