"""The real-GPU script's framework-step cases (validation/gpu/megatron_step.py, deepspeed_step.py) without a
GPU: the same build and two steps on the CPU with tiny models (Megatron over gloo inside the harness's CPU
shims, DeepSpeed on its CPU accelerator over gloo), the state counts checked by hand; the GPU cases' models
counted by hand against the estimator's configuration; the allocator-history replay on events written here."""

from __future__ import annotations

import json
import os

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from validation.gpu.cases import CASES  # noqa: E402
from validation.gpu.framework_records import CONFIGS, framework_record_of  # noqa: E402
from validation.gpu.framework_step import peak_blocks  # noqa: E402

# tiny-llama's dimensions and parameters, counted by hand in the HF cases' self-test
from tests.test_gpu_harness import H, KV, LAYERS, TINY_PARAMS  # noqa: E402
from tests.deepspeed_env import deepspeed_json, needs_deepspeed, run_deepspeed  # noqa: E402


def test_cpu_selftest_of_a_megatron_step():
    """Megatron's DDP and distributed optimizer over one rank: the bf16 parameters as views of one bf16 buffer
    (param_and_grad_buffer.py `param_data`, with the distributed optimizer) and an fp32 gradient buffer, both padded
    to a multiple of 128 elements (param_and_grad_buffer.py _pad_end_of_bucket_if_needed: lcm(dp 1, 128); every
    tiny parameter's size is a multiple of 64, so no parameter start is padded), fp32 main parameters and two
    fp32 moments."""
    pytest.importorskip("megatron.core")
    from validation.gpu.megatron_step import TINY, measure_megatron

    measured = measure_megatron(TINY, "cpu")
    assert measured["parameter_count"] == TINY_PARAMS == 214_336
    assert measured["parameters"] == 2 * 214_400  # 214,336 rounded up to 1,675 x 128
    assert measured["gradient_buffer"] == 4 * 214_400
    assert measured["main_parameters"] == 4 * TINY_PARAMS and measured["optimizer_states"] == 8 * TINY_PARAMS
    assert 6.0 < measured["step1_loss"] < 7.8  # ln(1000) = 6.9 at random initialisation


def test_an_environment_comes_back_on_exit(monkeypatch):
    """framework_step.environment (one_rank_environment's rendezvous, megatron_step.nccl_log's NCCL log): a name
    that was set gets its value back and one that was not is removed, also when the body raises."""
    from validation.gpu.framework_step import environment

    monkeypatch.setenv("ESTIMATOR_TEST_SET", "before")
    monkeypatch.delenv("ESTIMATOR_TEST_UNSET", raising=False)
    with pytest.raises(RuntimeError, match="inside"):
        with environment({"ESTIMATOR_TEST_SET": "inside", "ESTIMATOR_TEST_UNSET": "inside"}):
            assert os.environ["ESTIMATOR_TEST_SET"] == os.environ["ESTIMATOR_TEST_UNSET"] == "inside"
            raise RuntimeError("inside")
    assert os.environ["ESTIMATOR_TEST_SET"] == "before" and "ESTIMATOR_TEST_UNSET" not in os.environ


@needs_deepspeed
def test_cpu_selftest_of_a_deepspeed_zero3_step():
    """ZeRO-3 over one rank wraps torch's AdamW (validation/gpu/deepspeed_step.py): one fp32 flat partition per
    parameter group, the Trainer's two (decay: every weight; no decay: the q/k/v biases, 2 x (64 + 32 + 32) a
    layer, and the 2 x 2 + 1 norms of 64), and AdamW's two moments on them. DeepSpeed runs in its own
    environment (installed beside Accelerate it changes Accelerate's autocast wrapper)."""
    code = ("import json; from validation.gpu.deepspeed_step import TINY, measure_deepspeed; "
            "print(json.dumps(measure_deepspeed(TINY, 'cpu'), default=str))")
    measured = deepspeed_json(code, timeout=900)
    params = TINY_PARAMS + LAYERS * (H + 2 * KV)
    no_decay = LAYERS * (H + 2 * KV) + (2 * LAYERS + 1) * H
    assert measured["parameter_count"] == params == 214_592
    assert measured["fp32_partition_numels"] == [params - no_decay, no_decay] == [214_016, 576]
    assert measured["parameters"] == 2 * params and measured["fp32_partitions"] == 4 * params
    assert measured["optimizer_states"] == 8 * params
    assert (measured["zero_optimizer"], measured["torch_optimizer"]) == ("DeepSpeedZeroOptimizer_Stage3", "AdamW")
    assert measured["ds_config"]["zero_optimization"]["reduce_bucket_size"] == H * H


@needs_deepspeed
def test_cpu_selftest_of_the_nccl_world_experiment(tmp_path):
    """`run --device cpu --case nccl-world` (validation/gpu/nccl_world.py): one process over gloo against the CPU
    stand-in, its six stages in order (the tiny ZeRO-3 engine's two steps included), one line, one record."""
    from validation.gpu import experiments
    from validation.gpu.nccl_world import STAGES

    run_deepspeed("-m", "validation.gpu", "run", "--device", "cpu", "--out", str(tmp_path / "out"), "--budget", "300",
                  "--case", "nccl-world", timeout=600)
    lines = [json.loads(t) for t in (tmp_path / "out" / "runs.jsonl").read_text().splitlines()]
    assert [line["experiment"] for line in lines] == ["nccl-world"]
    assert [row["stage"] for row in lines[0]["measured"]["stages"]] == list(STAGES)
    assert lines[0]["versions"]["deepspeed"] == "0.19.5"
    paths = experiments.write_experiment_records(lines, tmp_path / "records")
    assert [p.name for p in paths] == ["nccl-world-cpu.json"]


# Llama-3.1-8B's layers in Megatron's terms: q/k/v (4096 + 2 x 1024) x 4096, proj 4096^2, fc1 2 x 14336 x 4096,
# fc2 14336 x 4096, two norms; embedding and output layer 128,256 x 4096 each, the final norm
LLAMA8B_LAYER = (4096 + 2 * 1024) * 4096 + 4096**2 + 3 * 14336 * 4096 + 2 * 4096
# Qwen-1-1.8B: q/k/v 3 x 2048^2 with biases, o 2048^2, SwiGLU 3 x 2048 x 5504, two norms; untied 151,936 x 2048
QWEN18_LAYER = 3 * 2048**2 + 3 * 2048 + 2048**2 + 3 * 2048 * 5504 + 2 * 2048


def test_the_gpu_cases_are_the_models_counted_by_hand():
    from estimator import estimate_config

    megatron = [c for c in CASES.values() if c.harness == "megatron"]
    deepspeed = [c for c in CASES.values() if c.harness == "deepspeed"]
    assert len(megatron) == 3 and len(deepspeed) == 4
    for case in megatron:
        estimate = estimate_config(CONFIGS["megatron"](case.run, "h100-80"))
        assert estimate.parameters_total == 4 * LLAMA8B_LAYER + 2 * 128256 * 4096 + 4096 == 1_923_125_248
    for case in deepspeed:
        estimate = estimate_config(CONFIGS["deepspeed"](case.run, "h100-80"))
        assert estimate.parameters_total == 24 * QWEN18_LAYER + 2 * 151936 * 2048 + 2048 == 1_836_828_672


def _event(action, addr, size, t, name="f"):
    return {"action": action, "addr": addr, "size": size, "time_us": t,
            "frames": [{"filename": "/x/torch/cuda/memory.py", "line": 1, "name": "alloc"},
                       {"filename": "/y/site-packages/deepspeed/runtime/zero/stage3.py", "line": 7, "name": name}]}


def test_peak_blocks_replays_the_allocators_events():
    """Before step 2's marker (a block of MARKER_BYTES made and freed) a higher peak (300) is ignored; after it,
    100 + 50 + 80 = 230 is the highest, with the block of 100 (allocated before) and those of 50 and 80 live;
    torch's own frames are left out of `where`."""
    from validation.gpu.framework_step import MARKER_BYTES

    events = [_event("alloc", 1, 100, 0, "a"), _event("alloc", 2, 200, 1, "b"), _event("free_completed", 2, 200, 2),
              _event("alloc", 9, MARKER_BYTES, 3), _event("free_completed", 9, MARKER_BYTES, 4),
              _event("alloc", 3, 50, 10, "c"), _event("alloc", 4, 80, 11, "c"), _event("free_requested", 4, 80, 12),
              _event("free_completed", 4, 80, 13), _event("alloc", 5, 20, 14, "d")]
    out = peak_blocks(events)
    assert (out["replayed_peak_bytes"], out["peak_event"], out["live_blocks"]) == (230, 6, 3)
    assert (out["step2_event"], out["marker_found"], out["truncated"]) == (3, True, False)
    assert [(g["bytes"], g["blocks"], g["sizes"]) for g in out["groups"]] == [(130, 2, [80, 50]), (100, 1, [100])]
    assert out["groups"][0]["where"] == ["deepspeed/runtime/zero/stage3.py:7 c"]


def test_a_framework_record_is_its_case_on_its_gpu():
    case = CASES["deepspeed-qwen-1.8b-zero2-foreach-adamw-recompute-s256-b1"]
    line = {"id": case.id, "measured": {"peak_bytes": 1}, "versions": {"gpu": "NVIDIA H200", "torch": "2.11.0"}}
    record = framework_record_of(line)
    assert record["config"]["hardware"] == {"gpu": "h200"} and record["config"]["parallel"]["zero_stage"] == 2
    assert record["config"]["training"]["reduce_bucket_size"] == 2 * 10**8  # Qwen's ds_config_zero2.json
    assert record["run"] == {"model": "qwen-1.8b", "zero_stage": 2, "seq_len": 256, "micro_batch_size": 1,
                             "optimizer": "foreach"}
    assert record["fake_tensor_measured"] is None


def test_a_megatron_record_holds_the_fake_tensor_run_of_its_setup():
    """The records step measures the same Setup under fake tensors (about 10 s): its parameters are the bf16
    buffer of the 1,923,125,248 counted above (a multiple of 128: no padding), its fp32 gradient buffer twice
    that, and the fp32 main parameters with two moments 12 B each; it peaks in backward."""
    pytest.importorskip("megatron.core")
    line = {"id": "megatron-llama-3.1-8b-tp1-pp1-only-s4096-b1-unfused-4layers", "measured": {"peak_bytes": 1},
            "versions": {"gpu": "NVIDIA H100 80GB HBM3", "torch": "2.11.0"}}
    record = framework_record_of(line)
    assert record["config"]["training"]["transformer_impl"] == "local"
    assert record["config"]["model"]["num_layers"] == 4 and record["config"]["parallel"]["zero_stage"] == 1
    assert record["config"]["hardware"] == {"gpu": "h100-80"}
    fake, count = record["fake_tensor_measured"], 1_923_125_248
    assert (fake["parameters"], fake["gradients"], fake["optimizer_states"]) == (2 * count, 4 * count, 12 * count)
    # the last layer's softmax backward, with CUDA's temporary the harness counts (memory/softmax_backward.py)
    assert fake["peak_phase"] == "backward"


def test_a_case_process_and_the_records_step_run_a_framework_step(monkeypatch, capsys, tmp_path):
    """The GPU script's path with the tiny Megatron run as a case: `python -m validation.gpu.measure CASE cpu`
    (measure.main) prints its line, and `records` writes it to gpu/megatron/<id>.json with the fake-tensor run
    of the same Setup beside it."""
    pytest.importorskip("megatron.core")
    import json

    from validation.gpu import cases, measure, records
    from validation.gpu.megatron_step import TINY

    case = cases.GpuCase("megatron", TINY)
    monkeypatch.setitem(cases.CASES, case.id, case)
    monkeypatch.setattr(records, "GPU_RECORDS", tmp_path)
    assert measure.main([case.id, "cpu"]) == 0
    line = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert line["id"] == case.id == "megatron-tiny-llama-s16-b2"
    assert line["measured"]["parameter_count"] == TINY_PARAMS and line["measured"]["megatron_core"] == "0.16.1"
    line["versions"]["gpu"] = "NVIDIA H200"
    (tmp_path / "runs.jsonl").write_text(json.dumps(line) + "\n")
    [path] = records.write_records(tmp_path / "runs.jsonl")
    assert path == tmp_path / "megatron" / f"{case.id}.json"
    record = json.loads(path.read_text())
    assert record["config"]["model"]["hidden_size"] == H and record["config"]["hardware"] == {"gpu": "h200"}
    # the padded bf16 buffer measured for real (2 x 214,400 B), in the tracker's 512-byte blocks: 838 x 512
    assert record["fake_tensor_measured"]["parameters"] == 838 * 512 == 429_056


def test_nccl_log_summary():
    """NCCL 2.28.9's log lines as its sources write them (src/init.cc "... - Init COMPLETE", src/include/alloc.h
    "FILE:LINE Cuda Alloc Size N pointer P"; host allocations "Cuda Host Alloc"): two communicators, the device
    bytes of the two device allocations (512 MiB + 2 MiB), the host one left out."""
    from validation.gpu.framework_step import nccl_log_summary

    log = "\n".join([
        "h:1:2 [0] NCCL INFO transport/net.cc:650 Cuda Alloc Size 536870912 pointer 0x7f0000000000",
        "h:1:2 [0] NCCL INFO init.cc:500 Cuda Host Alloc Size 4096 pointer 0x1000",
        "h:1:2 [0] NCCL INFO channel.cc:40 Cuda Alloc Size 2097152 pointer 0x7f0020000000",
        "h:1:2 [0] NCCL INFO ncclCommInitRankConfig comm 0x5 rank 0 nranks 1 cudaDev 0 nvmlDev 0 busId 1000 "
        "commId 0x9 - Init COMPLETE",
        "h:1:3 [0] NCCL INFO ncclCommSplit comm 0x6 rank 0 nranks 1 cudaDev 0 nvmlDev 0 busId 1000 parent 0x5 "
        "splitCount 1 color 0 key 0 - Init COMPLETE",
        "h:1:3 [0] NCCL INFO Channel 00/32 : 0",
    ])
    out = nccl_log_summary(log)
    assert out["communicators"] == 2
    assert (out["device_alloc_bytes"], out["device_allocs"]) == (536_870_912 + 2_097_152, 2)
    assert len(out["lines"]) == 5 and out["lines"][0].startswith("transport/net.cc:650 Cuda Alloc Size")
    assert out["lines_left_out"] == 0
