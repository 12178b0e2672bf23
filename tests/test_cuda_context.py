"""What sits outside PyTorch's allocator, by CUDA module loading (estimator/spec/cuda_modules.py), held to the
H200 record of the cuda-context experiment (tests/data/measured/gpu/experiments/cuda-context-h200.json: each
stage's mem_get_info used and reserved bytes, LAZY, EAGER and unset, two runs each) and to the sources that say
what an unset CUDA_MODULE_LOADING means."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from estimator import estimate_config
from estimator.spec.cuda_modules import H200_STACK, default_loading
from estimator.spec.errors import ConfigError
from estimator.spec.gpus import GPUS
from estimator.spec.hardware import Hardware

RECORD = Path(__file__).parent / "data" / "measured" / "gpu" / "experiments" / "cuda-context-h200.json"
MiB = 1024**2


def runs(mode: str | None) -> list[dict]:
    return [r["measured"] for r in json.loads(RECORD.read_text())["runs"] if r["run"]["module_loading"] == mode]


def outside(measured: dict) -> dict[str, int]:
    return {d["stage"]: d["outside_allocator_bytes"] for d in measured["deltas"]}


def test_the_stack_is_the_records():
    versions = json.loads(RECORD.read_text())["versions"]
    assert (versions["torch"], versions["cuda"], versions["driver"], versions["gpu"]) == \
        ("2.11.0+cu130", "13.0", "580.159.04", "NVIDIA H200")
    assert versions["cuda_driver_api"] == 13000  # cuDriverGetVersion: a CUDA 13.0 driver
    assert (H200_STACK.torch, H200_STACK.cuda, H200_STACK.driver) == ((2, 11), (13, 0), (13, 0))
    assert all(s in H200_STACK.stack for s in ("2.11.0+cu130", "13.0", "580.159.04", "H200"))


@pytest.mark.parametrize("mode", ["LAZY", "EAGER"])
def test_each_part_is_a_stage_of_the_record(mode):
    """Both runs of a mode read the same to the byte; the parts are their stages' growth outside the allocator:
    the context, the first elementwise kernels (LAZY only: EAGER loaded them with the context), the first bf16
    GEMM (cuBLAS: 66 MiB of kernels LAZY, all 494 MiB of its modules EAGER), and nothing for FlashAttention
    SDPA or a foreach AdamW step in either mode."""
    first, second = (outside(m) for m in runs(mode))
    assert first == second
    parts = H200_STACK.loaded(mode.lower())
    assert (first["context"], first["elementwise"], first["gemm_bf16"]) == \
        (parts.context, parts.first_kernels, parts.cublas)
    assert first["allocations"] == first["sdpa_flash_forward"] == first["sdpa_flash_backward"] == \
        first["adamw_foreach"] == 0
    if mode == "LAZY":
        assert (parts.context, parts.first_kernels, parts.cublas) == (552_402_944, 96_468_992, 69_206_016)
    else:
        assert (parts.context, parts.first_kernels, parts.cublas) == (1_319_960_576, 0, 517_996_544)
        assert parts.step_kernels == parts.flash_kernels == 0


def test_unset_is_lazy_on_torch_2_11_and_cuda_13():
    """torch 2.11 leaves CUDA_MODULE_LOADING unset on a CUDA 13.0 driver (pytorch/pytorch#152695: only drivers
    before CUDA 12.2 get it set), and CUDA's own default gives the LAZY runs' stages to the byte."""
    unset, lazy = runs(None), runs("LAZY")
    assert all(m["module_loading_env"] is None and m["module_loading_after_init"] is None for m in unset)
    assert all(m["module_loading_after_init"] == "LAZY" for m in lazy)
    keys = ("stage", "used_bytes", "reserved_bytes", "allocated_bytes", "nvidia_smi_bytes")
    strip = [[{k: s[k] for k in keys} for s in m["stages"]] for m in unset + lazy]
    assert all(s == strip[0] for s in strip)
    assert H200_STACK.default == default_loading((2, 11), (13, 0), (13, 0)) == "lazy"


@pytest.mark.parametrize("torch, cuda, driver, mode", [
    ((2, 11), (13, 0), (13, 0), "lazy"),  # CUDA's default from 12.2 (the record)
    ((2, 0), (11, 8), (11, 8), "lazy"),  # PyTorch 1.13-2.7 set LAZY where unset (CUDAHooks.cpp initCUDA)
    ((1, 13), (11, 7), (11, 7), "lazy"),  # the release that began to (pytorch/pytorch#86509)
    ((1, 12), (11, 7), (11, 8), "eager"),  # before: CUDA 11.7-12.1's default, eager
    ((1, 12), (11, 7), (12, 2), "lazy"),  # a 12.2 driver's default (Linux)
    ((2, 0), (11, 6), (12, 4), "eager"),  # a runtime before 11.7 has no lazy loading
])
def test_what_unset_means(torch, cuda, driver, mode):
    assert default_loading(torch, cuda, driver) == mode


def runtime(gpu: str, attention: str = "flash", loading: str | None = None):
    cfg = {"model": "llama-3.1-8b", "training": {"attention": attention},
           "hardware": {"gpu": gpu, "cuda_module_loading": loading}}
    result = estimate_config(cfg)
    return result, result.stages[0].component("runtime")


@pytest.mark.parametrize("attention, lazy", [("flash", 804_061_184), ("eager", 787_283_968)])
def test_the_training_total_is_the_sum_of_its_parts(attention, lazy):
    """LAZY: 552,402,944 + 96,468,992 + 69,206,016 (the record's stages) + 69,206,016 (a training step's other
    kernels, the training records' eager-attention total less those stages) + 16,777,216 with FlashAttention;
    unset is LAZY. EAGER: 1,319,960,576 + 517,996,544, whatever the attention, 1,033,895,936 more than
    LAZY with FlashAttention; the tensors and the allocator's cache do not move."""
    base, unset = runtime("h200", attention)
    _, lazy_c = runtime("h200", attention, "lazy")
    eager, eager_c = runtime("h200", attention, "eager")
    assert unset.bytes == lazy_c.bytes == lazy == 552_402_944 + 96_468_992 + 2 * 69_206_016 + \
        (16_777_216 if attention == "flash" else 0)
    assert eager_c.bytes == 1_319_960_576 + 517_996_544 == 1_837_957_120
    assert eager.device_total_bytes - base.device_total_bytes == eager_c.bytes - lazy
    assert (eager.allocated_peak_bytes, eager.reserved_peak_bytes) == (base.allocated_peak_bytes,
                                                                       base.reserved_peak_bytes)
    assert "CUDA_MODULE_LOADING=EAGER" in eager_c.formula and "cuda-context-h200.json" in eager_c.source
    assert "526.8 MiB context" in unset.formula and "CUDA_MODULE_LOADING=LAZY" in unset.formula


def test_serving_keeps_the_lazy_training_total():
    """vLLM and SGLang charge the architecture's constant: the LAZY sum with FlashAttention."""
    assert GPUS["h200"].cuda_context_bytes == H200_STACK.loaded("lazy").total(flash=True) == 804_061_184


@pytest.mark.parametrize("gpu", ["a100-80", "b200", "mi300x"])
def test_eager_is_refused_where_it_was_not_measured(gpu):
    with pytest.raises(ConfigError) as error:
        Hardware(gpu=gpu, cuda_module_loading="eager")
    assert error.value.field == "hardware.cuda_module_loading" and "h200" in error.value.allowed
    assert "measured on Hopper only" in str(error.value)
    assert runtime(gpu, loading="lazy")[1].bytes == runtime(gpu)[1].bytes  # lazy is what every GPU assumes


def test_the_cli_refuses_eager_in_one_line(tmp_path):
    path = tmp_path / "c.json"
    path.write_text(json.dumps({"model": "llama-3.1-8b"}))
    run = subprocess.run([sys.executable, "-m", "estimator", "estimate", "--config", str(path), "--gpu", "a100-80",
                          "--cuda-module-loading", "eager"], capture_output=True, text=True)
    assert run.returncode == 2 and run.stdout == "" and len(run.stderr.strip().splitlines()) == 1
    assert "[hardware.cuda_module_loading] = 'eager'" in run.stderr
