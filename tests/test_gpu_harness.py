"""The real-GPU script (validation/gpu) without a GPU: its measuring code on the CPU with tiny models
(what `python -m validation.gpu selftest` runs), its case list, and its records' consistency."""

from __future__ import annotations

import json
from contextlib import nullcontext

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from validation.gpu.cases import CASES, H200_FITS_BYTES  # noqa: E402
from validation.gpu.measure import measure  # noqa: E402
from validation.gpu.records import GPU_RECORDS, config_of, ran_ssm_kernels  # noqa: E402
from validation.peft.build import LoraRun  # noqa: E402
from validation.hf.step import Run  # noqa: E402

# tiny-llama (validation/hf/models.py): h 64, 2 layers, 4 heads of 16, 2 KV heads, MLP 160, vocabulary 1000
H, LAYERS, KV, FFN, VOCAB = 64, 2, 2 * 16, 160, 1000
LAYER = H * H + 2 * H * KV + H * H + 3 * H * FFN + 2 * H  # q, k, v, o, gate/up/down, two norms
TINY_PARAMS = 2 * VOCAB * H + LAYERS * LAYER + H  # embedding, LM head (untied), final norm


def test_cpu_selftest_counts_the_model_states():
    measured = measure("hf", Run("tiny-llama", 64, 2), "cpu")
    assert measured["parameters"] == 2 * TINY_PARAMS == 428_672  # bf16
    assert measured["optimizer_states"] == 2 * 2 * TINY_PARAMS  # AdamW's two bf16 states; the step on the host
    assert measured["trainable_parameters"] == measured["parameters"]


def test_cpu_selftest_of_a_lora_step():
    measured = measure("peft", LoraRun("tiny-llama", 64, rank=4, alpha=8), "cpu")
    adapters = LAYERS * (4 * H + H * 4 + 4 * H + KV * 4)  # A and B on q (64 -> 64) and v (64 -> 32)
    assert measured["trainable_parameters"] == 4 * adapters == 7_168  # fp32 adapters
    assert measured["parameters"] == 2 * TINY_PARAMS + 4 * adapters
    assert measured["optimizer_states"] == 2 * 4 * adapters


def test_cpu_selftest_through_accelerate():
    """The model prepared by a real Accelerator(mixed_precision="bf16") as the Trainer does (the GPU
    script's wrapper): its forward is Accelerate's, the states are those of the plain step."""
    measured = measure("hf", Run("tiny-llama", 64, 2), "cpu", "accelerate")
    assert measured["parameters"] == 2 * TINY_PARAMS and measured["optimizer_states"] == 4 * TINY_PARAMS


def test_cpu_selftest_of_megatron_cross_entropy():
    """The kernel case on the CPU (gloo, no allocator statistics): Megatron-Core's two implementations run."""
    pytest.importorskip("megatron.core")
    from validation.gpu.kernels import KernelRun, measure_kernel

    measured = measure_kernel(KernelRun("megatron-cross-entropy", 16, 2, 512), "cpu")
    for impl in ("unfused", "fused"):
        assert measured[impl]["logits_bytes"] == measured[impl]["logits_grad_bytes"] == 16 * 2 * 512 * 2


def test_cpu_selftest_of_a_vision_language_step():
    """A vision-language case runs the fake harness's own batch (images through the tower, their tokens in the
    sequence), and its token ids come from the text config: transformers 5.17's Qwen2_5_VLConfig has no
    vocab_size of its own (the H200 run of 2026-11-26 failed there)."""
    from validation.gpu.measure import step_inputs, vocab_size
    from validation.hf.step import build_model

    run = Run("tiny-qwen2.5-vl", 256, 1, images=2, image_size=112)
    measured = measure("hf", run, "cpu")
    assert measured["optimizer_states"] == 2 * measured["parameters"] == 2 * measured["trainable_parameters"]
    model = build_model(run)
    ids, inputs = step_inputs("hf", run, model, "cpu")
    assert ids.shape == (1, 256) and inputs["pixel_values"].shape[0] > 0
    assert (ids == model.config.image_token_id).sum() > 0
    assert vocab_size(model.config) == model.config.get_text_config().vocab_size == 152064


def test_the_mamba_fallback_only_models_are_left_out():
    """Without mamba-ssm on the lent machine Nemotron-H-8B and Falcon-H1-7B would run transformers' torch
    fallback of the Mamba-2 scan (every such case ran out of memory on the H200); Falcon-H1-0.5B's stay."""
    models = {getattr(c.run, "model", "") for c in CASES.values()}
    assert not models & {"nemotron-h-8b", "falcon-h1-7b"} and "falcon-h1-0.5b" in models


def test_the_softmax_backward_holds_cudas_temporary():
    """Under the harness's CUDA emulation a softmax backward allocates `tmp = grad * output` beside the input's
    gradient (SoftMax.cu softmax_backward_cuda_out): two 4 KiB fp32 tensors at its peak, not one."""
    import torch

    from validation.core.emulation import cuda_emulation
    from validation.core.tracker import StorageTracker

    x, grad = torch.randn(4, 256, requires_grad=True), torch.randn(4, 256)
    peaks = []
    for emulate in (True, False):
        tracker = StorageTracker()
        with (cuda_emulation(tracker) if emulate else nullcontext()), tracker:
            y = torch.softmax(x, -1)
            start = len(tracker.events)
            y.backward(grad)
        live, peak = 0, 0
        for _, delta in tracker.events[start:]:
            live += delta
            peak = max(peak, live)
        peaks.append(peak)
        x.grad = None
    assert peaks == [2 * 4 * 256 * 4, 4 * 256 * 4]


def test_the_cases_fit_the_gpu_they_run_on():
    """Every case either has no fake-tensor record (the small ones) or one whose peak an H200 holds."""
    assert len(CASES) >= 40
    for case in CASES.values():
        if case.fake_record.exists():
            assert json.loads(case.fake_record.read_text())["measured"]["peak_bytes"] <= H200_FITS_BYTES
    assert any(c.harness == "bnb" for c in CASES.values()) and any(c.allocator == "expandable" for c in CASES.values())


def test_each_record_is_its_case_on_its_gpu():
    records = [json.loads(p.read_text()) for p in sorted(GPU_RECORDS.glob("*.json"))]
    runs = [r for r in records if "config" in r]
    assert len(runs) >= 40 and len(records) == len(runs) + 1  # and the workspace probe
    for record in runs:
        # as `records` writes it: the case's configuration, with the SSM kernels the run's software took
        expected = config_of(CASES[record.get("case", record["id"])], "h200", record["versions"].get("bitsandbytes"))
        assert record["config"] == ran_ssm_kernels(expected, record["versions"])
        assert record["versions"]["gpu"] == "NVIDIA H200"


def test_the_probe_saw_two_workspaces_per_thread_pair():
    """The probe (a fresh process): a bf16 product leaves 32 MiB (Hopper's cuBLAS workspace), the
    backward on autograd's thread another 32 MiB, and clearCublasWorkspaces frees both (and 1 MiB of
    cuBLASLt's for the biased linear)."""
    probe = json.loads((GPU_RECORDS / "cublas-workspace-probe-h200.json").read_text())["probe"]
    MiB = 1024**2
    assert probe["after_mm_bf16"] == 32 * MiB and probe["after_backward"] == 32 * MiB
    assert probe["cleared_bytes"] == 65 * MiB


def test_regenerating_the_probe_keeps_what_the_run_cannot_supply(tmp_path, monkeypatch):
    """`records --from` over an existing probe record: the new probe's numbers and the software the probe runs on
    replace the old; bitsandbytes, which the probe does not import (None where the run had no wheel carried in),
    keeps the recorded version, and a field only the record holds stays; a version the run does give wins."""
    import validation.gpu.records as records

    monkeypatch.setattr(records, "GPU_RECORDS", tmp_path)
    recorded = json.loads((GPU_RECORDS / "cublas-workspace-probe-h200.json").read_text())
    assert recorded["versions"]["bitsandbytes"] == "0.48.2"
    (tmp_path / "cublas-workspace-probe-h200.json").write_text(json.dumps({**recorded, "note": "kept"}))
    probe = dict(recorded["probe"], after_mm_bf16=1)
    versions = dict(recorded["versions"], bitsandbytes=None, torch="2.12.0+cu130", driver=None)
    runs = tmp_path / "runs.jsonl"
    runs.write_text(json.dumps({"probe": probe, "versions": versions}) + "\n")
    [path] = records.write_records(runs)
    written = json.loads(path.read_text())
    assert written["probe"]["after_mm_bf16"] == 1
    assert written["versions"] == dict(recorded["versions"], torch="2.12.0+cu130", driver=None)
    assert written["note"] == "kept" and written["method"] == recorded["method"]
    runs.write_text(json.dumps({"probe": probe, "versions": dict(versions, bitsandbytes="0.49.0")}) + "\n")
    [path] = records.write_records(runs)
    assert json.loads(path.read_text())["versions"]["bitsandbytes"] == "0.49.0"
    path.unlink()  # no record yet: the line as it is
    [path] = records.write_records(runs)
    assert json.loads(path.read_text())["versions"] == dict(versions, bitsandbytes="0.49.0")

