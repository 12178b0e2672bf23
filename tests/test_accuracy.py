"""The estimator against every measured training step in tests/data/measured (issue: ground truth).

Each record holds the configuration in the contract's format and the bytes a measuring harness saw on
the measured rank: per category at each phase's peak, and the overall peak. The HF transformers
records (`validation/`) sit at the top of tests/data/measured; those of the frameworks' own code in a
folder each: torchtitan, Megatron-Core, PEFT and torchtune (`validation/<framework>/`). The bounds are
the project's promise: the allocated peak within 5%; parameters, gradients and optimizer states within
1%. A failing case is fixed in the model, never by loosening a bound. A case the model does not meet
yet is listed in KNOWN_GAPS with the reason, as a strict expected failure: a gap that closes fails the
test until it leaves the list, and a new miss fails at once.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path

import pytest

from estimator import estimate_config
from validation.core.harness import harnesses
from validation.core.report import tensors_peak

MEASURED = Path(__file__).parent / "data" / "measured"
# every harness's folder of records (validation/core/harness.py finds them), but HF's (the top) and FSDP1's
FRAMEWORKS = tuple(name for name in harnesses() if name not in ("hf", "fsdp1"))
HF_RECORDS = sorted(MEASURED.glob("*.json"))
FRAMEWORK_RECORDS = sorted(p for framework in FRAMEWORKS for p in (MEASURED / framework).glob("*.json"))
# PyTorch FSDP1 as the HF Trainer with Accelerate runs it (validation/fsdp1, issue 23)
FSDP1_RECORDS = sorted((MEASURED / "fsdp1").glob("*.json"))
RECORDS = HF_RECORDS + FRAMEWORK_RECORDS + FSDP1_RECORDS

# case id -> why the estimate misses it (the next modelling steps)
_MATH_BACKWARD = ("peft prepare_model_for_kbit_training runs SDPA's math backend in fp32: on an H200 (torch 2.11) its "
                  "backward holds three score-sized fp32 tensors beside the kept softmax, this CPU harness (torch "
                  "2.13) two; the estimate follows the GPU record of the same run (estimator/memory/kbit.py, 2 GiB more "
                  "here: %s)")
KNOWN_GAPS: dict[str, str] = {
    "llama-3.1-8b-qlora-r16-all7-recompute-drop00-s4096-b1-prepared": _MATH_BACKWARD % "+13%",
}
# case id -> why its model states miss the 1% bound
_FSDP1_SLICE = ("FSDP1 flattens a decoder layer's weights in registration order (each base weight, then its LoRA A and "
                "B) and gives each rank a contiguous 1/d of them: rank 0, the measured one, holds the adapters of q, k "
                "and v and so %s of AdamW state where the estimate charges the average rank's 1/d (tests/test_fsdp1.py "
                "checks rank 0's by hand)")
KNOWN_STATE_GAPS: dict[str, str] = {
    "fsdp1-llama-3.1-8b-lora-r16-all7-w8-recompute-s4096-b1": _FSDP1_SLICE % "75.6 MB",
    "fsdp1-qwen2.5-7b-lora-r16-all7-w8-recompute-s4096-b1-ga2-nosync": _FSDP1_SLICE % "55.1 MB",
    "fsdp1-llama-3.1-8b-lora-r16-all7-w8-recompute-s4096-b1-shardgradop": _FSDP1_SLICE % "75.6 MB",
    # rank 0 of the first shard group of 8: the same slice
    "fsdp1-llama-3.1-8b-lora-r16-all7-w32-recompute-s4096-b1-hybridshard-g8": _FSDP1_SLICE % "75.6 MB",
}


def load(path: Path) -> dict:
    return json.loads(path.read_text())


def estimated(config: dict):
    """`estimate_config` of a record's configuration, once per run: the states, peak and GPU tests read the
    same records' estimates (a pure function of the configuration, here keyed by its JSON text)."""
    return _estimated(json.dumps(config))


@functools.lru_cache(maxsize=None)  # one per record: a few hundred
def _estimated(config: str):
    return estimate_config(json.loads(config))


def measured_stage(result, record: dict):
    """The stage the harness measured: the record names it (Megatron builds one rank's stage), else
    the estimate's peak stage."""
    return result.stages[record.get("stage", result.peak_stage)]


def step_states(result, record: dict) -> dict[str, int]:
    stage = measured_stage(result, record)
    return {c.key: c.bytes for c in next(p for p in stage.phases if p.name == "optimizer").components}


def measured_states(record: dict) -> dict[str, int]:
    """Model states at the optimizer step, or, where the step was not measured (Megatron: the
    persistent states of the whole step), as the record states them."""
    measured = record["measured"]
    return measured["phases"].get("optimizer", measured)


def test_the_recorded_cases_are_there():
    assert len(HF_RECORDS) >= 30 and len(FRAMEWORK_RECORDS) >= 30
    for framework in FRAMEWORKS:  # each framework's issue asks for cases of its own
        assert len(list((MEASURED / framework).glob("*.json"))) >= 15
    # FSDP1: full fine-tuning with and without no_sync accumulation, LoRA with frozen and trainable weights
    # in one FlatParameter
    stems = [p.stem for p in FSDP1_RECORDS]
    assert len(stems) >= 6 and any("-nosync" in s for s in stems) and any("-lora-" in s for s in stems)
    assert set(KNOWN_GAPS) | set(KNOWN_STATE_GAPS) <= {p.stem for p in RECORDS}


def expected_failures(known: dict[str, str]) -> list:
    return [pytest.param(p, marks=pytest.mark.xfail(reason=known[p.stem], strict=True)) if p.stem in known else p
            for p in RECORDS]


@pytest.mark.parametrize("path", expected_failures(KNOWN_STATE_GAPS), ids=lambda p: p.stem)
def test_model_states_within_one_percent(path):
    record = load(path)
    step, measured = step_states(estimated(record["config"]), record), measured_states(record)
    assert step["parameters"] == pytest.approx(measured["parameters"], rel=0.01)
    # the harnesses count master weights (if any) with the optimizer's state
    assert step["optimizer_states"] + step.get("master_weights", 0) == \
        pytest.approx(measured["optimizer_states"], rel=0.01)
    # every gradient exists at the optimizer step
    assert step["gradients"] == pytest.approx(measured["gradients"], rel=0.01)


@pytest.mark.parametrize("path", expected_failures(KNOWN_GAPS), ids=lambda p: p.stem)
def test_peak_within_five_percent(path):
    record = load(path)
    # the harnesses see every tensor but the libraries' workspaces (validation/core/report.py tensors_peak)
    peak = tensors_peak(measured_stage(estimated(record["config"]), record))
    assert peak == pytest.approx(record["measured"]["peak_bytes"], rel=0.05), \
        f"peak {peak} vs {record['measured']['peak_bytes']}"


SWEEP = [MEASURED / f"llama-3.1-8b-bf16-adamw-norecompute-sdpa-s{s}-b1.json" for s in (256, 1024, 4096, 8192)]


def phase_bytes(result, record: dict, phase: str) -> int:
    return next(p.allocated_bytes for p in measured_stage(result, record).phases if p.name == phase)


@pytest.mark.parametrize("path", SWEEP, ids=lambda p: p.stem)
def test_a_16_bit_model_without_autocast_keeps_the_losss_fp32_copies_at_every_length(path):
    """A bf16 model the HF Trainer runs without autocast: its logits leave the LM head in bf16, and
    transformers' ForCausalLMLoss upcasts them (``logits = logits.float()``, unconditionally:
    transformers 5.23 loss/loss_utils.py), so an fp32 copy exists beside them in forward and
    cross_entropy keeps its fp32 log-softmax for backward. The estimate's forward and backward moments
    follow the harness from 256 to 8192 tokens: forward ends with all of them alive. (The backward's
    own peak at short lengths is its end, every gradient and no activation, which the optimizer step
    exceeds; test_peak_within_five_percent holds the step's peak.)"""
    record = load(path)
    assert phase_bytes(estimated(record["config"]), record, "forward") == \
        pytest.approx(record["measured"]["phases"]["forward"]["total"], rel=0.01)


FALCON_FLASH = sorted(MEASURED.glob("falcon-*-norecompute-flash_attention_2-*.json"))


@pytest.mark.parametrize("path", FALCON_FLASH, ids=lambda p: p.stem)
def test_falcons_flash_attention_keeps_what_its_split_hands_it(path):
    """transformers 5.23 FalconFlashAttention2 hands flash-attn k and v as _split_heads leaves them: one head wide
    for Falcon-7B's multi-query split, every query head wide for the new decoder architecture's copies
    (memory/activations/attention.py FALCON_FLASH_SOURCE). The model states make the step's peak, so the forward
    phase's activations (the harness's category; the estimate's without its cuBLAS workspace, which the harness
    does not see) hold it: charged at the key/value groups' width, Falcon-40B's shape fell 9% short (480 MiB)."""
    record = load(path)
    assert len(FALCON_FLASH) == 4
    phase = next(p for p in measured_stage(estimated(record["config"]), record).phases if p.name == "forward")
    held = sum(c.bytes for c in phase.components
               if c.key not in ("parameters", "gradients", "optimizer_states", "master_weights", "workspace"))
    assert held == pytest.approx(record["measured"]["phases"]["forward"]["activations"], rel=0.01)


def test_the_loss_grows_with_the_sequence_as_measured():
    short, long = load(SWEEP[0]), load(SWEEP[-1])
    measured = long["measured"]["phases"]["forward"]["total"] - short["measured"]["phases"]["forward"]["total"]
    est = phase_bytes(estimated(long["config"]), long, "forward") - \
        phase_bytes(estimated(short["config"]), short, "forward")
    assert est == pytest.approx(measured, rel=0.01)
    # the loss's share at the end of forward: bf16 logits, their fp32 copy and the fp32 log-softmax (10 B x s x V),
    # beside the final norm's fp32 upcast, its rstd and bf16 output and the head's input (8 B x s x h + 4 B x s)
    s, h, V = 8192, 4096, 128_256
    stage = estimated(long["config"]).stages[0]
    forward = next(p for p in stage.phases if p.name == "forward")
    loss = sum(c.bytes for c in forward.components if c.key in ("logits", "transient"))
    assert loss == 10 * s * V + 8 * s * h + 4 * s


# --- real GPU runs (validation/gpu): the three numbers people compare -----------------------------
# The same cases run for real on a lent GPU (tests/data/measured/gpu): max_memory_allocated per phase,
# max_memory_reserved, nvidia-smi, the cuBLAS workspaces and the memory outside the allocator. They
# hold the allocated peak to the same 5%, the workspaces and the CUDA context to what the device
# reported, and the fake-tensor harness itself to the hardware.
GPU_MEASURED = MEASURED / "gpu"
GPU_RECORDS = sorted(p for p in GPU_MEASURED.glob("*.json") if "probe" not in json.loads(p.read_text()))
MiB = 1024**2
# case id -> why the allocated peak misses it. (Falcon-H1-0.5B's two runs were here, -74% and -81%, until their configs
# said what ran: the H200 has no mamba-ssm, so transformers 5.17 ran its torch fallback of the Mamba-2 kernels,
# ssm_kernels 'torch_5.17' (validation/gpu/records.py ran_ssm_kernels; memory/activations/mamba_torch.py and
# memory/mamba_torch_moment.py): +0.1% and +0.8%.)
KNOWN_GPU_GAPS: dict[str, str] = {}
# The fake-tensor peak of transformers' torch fallback of the Mamba-2 kernels, what a GPU without mamba-ssm runs
# less the two cuBLAS workspaces: the HF harness without validation/hybrid/kernels.py's emulation
# (`python -m validation.gpu.fallback ID`, transformers 5.17.0, 2026-11-26; again on 2026-11-27, to the byte; under
# 5.23 the same step is tests/data/measured/ssm_torch/, 65.99 GB and 10.92 GB)
MAMBA_FALLBACK_FAKE_PEAKS = {"falcon-h1-0.5b-bf16-adamw-norecompute-sdpa-s4096-b2": 79_372_208_640,
                             "falcon-h1-0.5b-bf16-adamw-recompute-sdpa-s16384-b1": 58_204_954_112}
# The reserved peak (and so nvidia-smi) is the allocated peak plus the allocator's cache: replayed for the
# HF Trainer's dense runs, full fine-tuning and adapters, with default or expandable segments
# (estimator/memory/reserved.py; Mamba-2 hybrids on transformers' torch fallback too, reserved_mamba.py), a flat 10%
# elsewhere (5% with expandable segments). (Llama-3.2-1B with full recompute and expandable segments was 11.6% under
# with the flat 5%, which it keeps 3.9 GB over; replayed it is 0.01% under.)
KNOWN_RESERVED_GAPS = {
    # (Falcon-H1-0.5B on transformers' Mamba-2 torch fallback was here twice, on the flat 10% share: 5.17's broadcast
    # products with recompute at 16k -20.1% (the GPU reserved 1.39x its allocated peak: each layer's forward and
    # backward make and free products of 25.8, 13.1 and 12.9 GB, whose segments the cache keeps), and 5.23's einsums
    # at 16k -12.4% (1.25x), until the replay took Mamba-2 hybrids on the fallback, the 5.17 scan's products and
    # their backward's operand gradients in the source's order (memory/reserved_mamba.py): +0.1% and -0.4%; at s4096
    # b2 -5.7% -> -0.4% and +6.2% -> -1.8%. The fake-tensor harness's recorded sequences of the four replay to the
    # GPU's reserved peak within 0.5%: tests/test_allocator.py.)
    # The third H200 run of 2026-11-27 (the HF and PEFT cases that had fake records only), allocated peaks all
    # within 0.31%, four replayed runs more than 10% under, not yet explained (the allocator's history of HF runs
    # is not recorded: validation/README.md, the next GPU session's item 5): StarCoder2-3B bf16 at s4096 b2
    # -12.7% (its dropout twin -8.8%; the fake harness's own sequence replays -12.6%, so the GPU's step differs
    # from the CPU run's: tests/test_allocator.py REPLAY_MISSES), GPT-2 medium AMP -10.4% (its eager twin -6.9%; the
    # fake harness's sequence with autograd's cuBLAS workspace at the head's backward replays both to the GPU's bytes,
    # and the ledger's differs there and in the build's transient of the head's size: tests/test_allocator.py
    # REPLAY_MISSES, validation/README.md item 5), LoRA on Llama-3.2-1B with recompute and eager attention (no
    # attention dropout) -12.5% (with attention dropout -0.7%)
    "starcoder2-3b-8layers-bf16-adamw-norecompute-sdpa-s4096-b2",
    "gpt2-medium-8layers-amp-adamw-norecompute-sdpa-s1024-b4",
    "llama-3.2-1b-lora-r16-qv-recompute-drop00-s4096-b1-eager",
    # (Pythia-1.4B bf16 was here, -10.7%, until the replay took its fused query_key_value as one parameter, as
    # transformers holds it: memory/reserved_tensors.py, -0.5%; at s4096 b2, -11.2%, until the replay made its
    # partial rotary embedding's temporaries, rotary_pct 0.25: memory/reserved_layers.py `rotation`, -0.2%.)
    # (LoRA on Llama-3.2-1B with full recompute, eager attention and its dropout was here, -12.8%, the replay's own
    # allocated peak 20.9% under the ledger's, until the replay ran eager attention's backward through the recomputed
    # softmax and dropout as autograd does, with the ledger's sizes: memory/reserved_layers.py, -0.7%, the replay's
    # peak 0.14% under the ledger's; Phi-3 with recompute and eager attention -4.1% -> -0.1%.)
    # LoRA on Llama-3.2-1B with recompute and eager attention without its dropout (-12.5%, above): not the dropout.
    # With p = 0 at::dropout returns its input (aten/src/ATen/native/Dropout.cpp: is_fused_kernel_acceptable needs
    # p > 0, _dropout_impl returns `input` when p == 0), and the replay makes no request for it. It is the
    # segments' addresses: the fake harness's recorded sequence (tests/data/measured/allocator_order; allocated
    # peak 11,621,618,688 B, the GPU's 11,621,619,712) replays to the GPU's 17,723,031,552 B to the byte, its
    # segments size for size (5 x 2 GiB, 2,004 MiB, 2 x 1 GiB in the GPU's order of addresses), with each new
    # segment below the last and the cuBLAS workspaces at each thread's first matrix product, and 12.1% under
    # with ascending addresses (memory/allocator.py `descending`, tests/test_segment_order.py); its dropout twin
    # to the byte too (15,621,685,248 B; -0.3% ascending). The estimate replays its own sequence ascending (the
    # ledger's is not the recorded one: memory/reserved.py's note); the twin's -0.7% is ascending's near miss,
    # a 2,004 MiB segment where the GPU maps a fifth of 2 GiB.
}
# Over by more than 10% (10.03%): peft's trainable copies of the embedding and head (modules_to_save, 1,002 MiB
# each): in the replay step 1's optimizer states of the copies are cut from the loss's cached 2,004 MiB
# blocks, so step 2's loss maps them anew (3 GB); the GPU kept 3 GB less, by an order of requests no recorded
# allocator trace of an adapter run shows (tests/data/measured/allocator holds full fine-tuning only)
# (Falcon-7B on SDPA's math backend at s2048 was here, +13.9%, until the replay made Falcon's layer request by request
# as transformers and torch make it: memory/reserved_falcon.py, +3.9%; at s1024 b2 +5.5% -> -0.7%.)
KNOWN_RESERVED_OVER: set[str] = {"llama-3.1-8b-lora-r16-qv-recompute-drop00-s4096-b1-save-embed-head"}


def gpu_estimate(record: dict):
    result = estimated(record["config"])
    return next(s for s in result.stages if s.stage == result.peak_stage)


def test_the_gpu_records_are_there():
    """A real-GPU run of every harness kind: HF full fine-tuning (small and 8B models), PEFT LoRA and
    DoRA, QLoRA with bitsandbytes, and the expandable-segments allocator."""
    ids = {p.stem for p in GPU_RECORDS}
    assert len(ids) >= 40
    assert any("-qlora-bnb-" in i for i in ids) and any("-lora-" in i for i in ids)
    assert any(i.endswith("-expandable") for i in ids) and any(i.startswith("llama-3.2-1b") for i in ids)
    assert set(KNOWN_GPU_GAPS) | set(KNOWN_FAKE_GPU_GAPS) <= ids and KNOWN_RESERVED_GAPS | KNOWN_RESERVED_OVER <= ids
    for path in GPU_RECORDS:
        versions = load(path)["versions"]
        assert versions["gpu"] and versions["torch"] and versions["driver"] and versions["cuda"]


@pytest.mark.parametrize("path", [pytest.param(p, marks=pytest.mark.xfail(reason=KNOWN_GPU_GAPS[p.stem], strict=True))
                                  if p.stem in KNOWN_GPU_GAPS else p for p in GPU_RECORDS], ids=lambda p: p.stem)
def test_gpu_allocated_peak_within_five_percent(path):
    record = load(path)
    peak = gpu_estimate(record).allocated_peak_bytes
    assert peak == pytest.approx(record["measured"]["peak_bytes"], rel=0.05)


@pytest.mark.parametrize("path", GPU_RECORDS, ids=lambda p: p.stem)
def test_gpu_library_workspaces(path):
    """PyTorch's two cuBLAS workspaces (the forward's thread, autograd's backward thread), as
    clearCublasWorkspaces freed them; where a linear layer has a bias (Qwen2's q, k, v; every linear of a
    vision tower: transformers 5.17 modeling_siglip.py SiglipAttention and SiglipMLP use nn.Linear's default
    bias=True, modeling_qwen2_5_vl.py the tower's qkv, proj and MLP bias=True) cuBLASLt kept 1 to 2.3 MiB more
    on torch 2.11 (its own 1 MiB workspace per thread), which the estimate leaves out. Gemma 3's decoder has no
    bias: its two runs kept 1 and 2 MiB more, all from the SigLIP tower (the H200 run of 2026-11-27)."""
    record = load(path)
    estimated, measured = gpu_estimate(record).component("workspace").bytes, record["measured"]["cublas_workspace_bytes"]
    assert estimated == 2 * 32 * MiB
    model = record["config"]["model"]
    biased = model.get("qkv_bias") or model.get("linear_bias") or model.get("vision_tower")
    assert measured - estimated == 0 if not biased else 0 <= measured - estimated <= 2.5 * MiB


# kernels a run loaded lazily beyond the per-architecture constant, measured, not modelled: Qwen3-30B-A3B's
# MoE block under transformers 5.17 (the H200 run of 2026-11-26) loaded 2 MiB more than any other run
MORE_KERNELS_LOADED = {"qwen3-30b-a3b-lora-r16-alllinear-recompute-drop00-s4096-b1": 2 * MiB}


def vision_kernels_loaded(record: dict) -> int:
    """A vision-language step's kernels beyond a text model's, measured, not modelled (the H200 run of
    2026-11-27, transformers 5.17): its six runs (Qwen2.5-VL-7B and Gemma-3-4B, the towers on SDPA) held 2 MiB
    more outside the allocator than a text model's step with FlashAttention, 4 MiB with recompute (both models,
    whatever the image count or size; the frozen tower's run too). The tower brings kernels no text model
    launches (its patch embedding's convolution through cuDNN, LayerNorm and GELU for SigLIP, the window
    gather for Qwen); which of them make the 2 MiB, and the recomputed tower's 2 more, these records do not
    separate, so the estimate leaves both out."""
    if not record["config"]["model"].get("vision_tower"):
        return 0
    return (4 if record["config"]["training"]["recompute"] != "none" else 2) * MiB


@pytest.mark.parametrize("path", GPU_RECORDS, ids=lambda p: p.stem)
def test_gpu_memory_outside_the_allocator(path):
    """The CUDA context and the kernels loaded lazily (mem_get_info used minus reserved), part by part
    (estimator/spec/cuda_modules.py): 766.8 MiB with FlashAttention's kernels loaded, 16 MiB less where none
    ran (eager attention; SDPA's math backend on the fp32 inputs of a prepared k-bit run or Falcon-7B's
    multi-query call), to the byte; a
    vision-language run's measured extra kernels aside (vision_kernels_loaded)."""
    record = load(path)
    if record["config"]["training"]["optimizer"].startswith("paged"):
        pytest.skip("a paged optimizer's managed memory is outside the allocator too: test_gpu_paged_optimizer")
    estimated = gpu_estimate(record).component("runtime").bytes
    measured = record["measured"]["outside_allocator_bytes"] - MORE_KERNELS_LOADED.get(path.stem, 0) \
        - vision_kernels_loaded(record)
    assert estimated == measured
    # no FlashAttention kernel where SDPA runs its math backend: a prepared k-bit run's fp32 q, k, v, and
    # multi-query Falcon-7B (71 query heads on 1, a 4-D mask, no enable_gqa: activations/sdpa_math.py), whose two
    # H200 runs on SDPA (2026-11-27, third run) loaded 16 MiB less, as the eager runs
    flash = record["config"]["training"]["attention"] == "flash" and not path.stem.endswith("-prepared") \
        and not path.stem.startswith("falcon-7b-")
    assert measured == (804_061_184 if flash else 804_061_184 - 16 * MiB)
    # the context and the first kernel's modules, before the model (validation/gpu/measure.py): the
    # cuda-context record's first two LAZY stages, 552,402,944 + 96,468,992
    assert record["measured"]["cuda_context_bytes"] == 552_402_944 + 96_468_992
    # nvidia-smi shows this process's memory: the device's used memory less 8.8 MiB it does not attribute
    assert 0 < record["measured"]["device_used_bytes"] - record["measured"]["nvidia_smi_bytes"] < 16 * MiB


# bitsandbytes 0.48.2's CUDA kernels, loaded into the context when its optimizer first runs (mem_get_info
# used minus reserved minus the paged states minus the context without it): 44 MiB with PagedAdamW, 75 MiB
# with PagedAdamW8bit, measured on the H200; not modelled (one library version, one GPU).
BNB_KERNELS_LOADED = {"paged_adamw": 44 * MiB, "paged_adamw8bit": 75 * MiB}


@pytest.mark.parametrize("path", [p for p in GPU_RECORDS if "paged" in p.stem], ids=lambda p: p.stem)
def test_gpu_paged_optimizer(path):
    """bitsandbytes' paged optimizer states are managed memory (cudaMallocManaged): the device holds them
    (mem_get_info), the caching allocator does not (allocated and reserved peaks), and nvidia-smi's
    per-process used memory does not count them either."""
    record = load(path)
    estimate, measured = gpu_estimate(record), record["measured"]
    outside = measured["outside_allocator_bytes"] - estimate.component("runtime").bytes
    managed = estimate.component("managed").bytes
    assert outside - managed == BNB_KERNELS_LOADED[record["config"]["training"]["optimizer"]]
    assert measured["nvidia_smi_bytes"] < measured["device_used_bytes"] - managed


def test_gpu_reserved_peak():
    """max_memory_reserved on all 119 runs, the median |error| over all of them (over 91 until the two Falcon-H1 runs
    of transformers 5.17's Mamba fallback were modelled, ssm_kernels 'torch_5.17': -5.7% and -20.1%,
    KNOWN_RESERVED_GAPS; 1.24% with them). On the first 60 (the last ten,
    LoRA/DoRA on four models and Llama-3.1-8B at 256 and 1,024 tokens, measured after the replay was built)
    the median |error| is within 1.3% since the replay covers the HF adapter runs (2.6% before; 4.5% with the
    flat share alone on the first 50); the four DeepSeek-V3.2 eager runs (-7.0% to +3.7%) raise it to 1.33%;
    the seven of 2026-11-27 (DeepSeek-V3.2 with recompute -3.6%, Qwen2.5-VL-7B -0.8% to +1.6%, Gemma-3-4B
    -0.2% and +0.1%) lower it to 1.24%; the three expandable-segment runs, replayed since the allocator's expandable
    rules were checked against PyTorch's source (-0.10%, -0.14%, -0.01%; the flat 5%: +3.5%, +1.0%, -11.6%), to
    1.13%. The fourteen of 2026-11-27's second H200 run (HF and PEFT cases that had fake records only: Phi-3,
    Pythia, GPT-2, StarCoder2, Falcon-7B with config dropouts, Liger-Kernel, LoRA on Llama-3.2-1B, GPT-2 and
    Falcon-7B) raise it to 1.33%: -10.7% (Pythia-1.4B bf16, KNOWN_RESERVED_GAPS) to +7.9% (Falcon-7B eager with
    dropout); GPT-2 AMP -7.0%, StarCoder2-3B -8.8%, Pythia AMP -6.7%, Liger +6.9% and +5.6%, the other seven within
    4%. The replay's parameters with a fused q, k, v linear as one tensor (Phi-3, GPT-2, GPT-NeoX, Falcon,
    reserved_tensors.py) take Pythia's two to -0.5% and +0.6% and Falcon-7B's to +8.0%. The six of the third
    (Qwen2.5-0.5B with Liger -0.7%, Phi-3 with recompute and eager attention -4.1%, GPT-2 medium eager +1.2%,
    Falcon-7B AMP +0.8%, LoRA on GPT-2 medium -1.2% and on Llama-3.2-1B with eager attention's dropout -12.8%):
    1.23% on the 91. The replay's backward through eager attention's softmax as autograd runs it
    (memory/reserved_layers.py) takes that LoRA run to -0.7% and Phi-3's to -0.1%, and moves the other eager runs
    by -2.2 to +2.5 points (Phi-3 without recompute -2.5% -> -0.4%, Gemma-2-9B +0.4% -> +2.9%): 1.23% still. The
    runs under, and over, by more than 10% are exactly the known ones (with the flat share alone: five under, none
    over, on the first 73). The 26 of the third H200 run (2026-11-27: the HF and PEFT cases that had fake records
    only, and Falcon-H1-0.5B's two on transformers 5.23's fallback) raise it to 1.35% on 119: allocated within 0.31%
    on all 26, reserved -12.7% to +13.9%, six beyond 10% (KNOWN_RESERVED_GAPS, KNOWN_RESERVED_OVER). The five Liger
    runs replayed (memory/reserved_liger.py; the flat share's +6.9%, +7.85%, +5.6%, -0.7%, +6.6% -> -0.4%, -1.3%,
    +0.02%, -7.6%, +0.5%) take it to 1.31%, the runs over by 5% from 13 to 9 and under by 5% from 14 to 15.
    Falcon-7B's layer made request by request in the replay (memory/reserved_falcon.py: its five bf16 runs +7.3%,
    +8.0%, +13.9%, +5.5% and +7.9% -> -0.6%, -0.2%, +3.9%, -0.7% and +9.3%) lowers it to 1.23%, five beyond 10%.
    The replay of Mamba-2 hybrids on transformers' torch fallback (memory/reserved_mamba.py) takes Falcon-H1-0.5B's four
    fallback runs from the flat share's -5.7%, -20.1% (5.17) and +6.2%, -12.4% (5.23) to -0.4%, +0.1%, -1.8% and
    -0.4%, and the partial rotary embedding's temporaries (memory/reserved_layers.py `rotation`: Pythia-1.4B bf16 at
    s4096 b2 -11.2% -> -0.2%, its other three runs within 2.5%): 1.01% on the 119, two beyond 10% under. The fourth
    H200 session's Llama-3.1-8B with Liger at s8192 b2 (allocated -0.16%, reserved -2.3%) makes it 1.012% on 120."""
    errors = {}
    for path in GPU_RECORDS:
        record = load(path)
        reserved = gpu_estimate(record).reserved_peak_bytes
        errors[path.stem] = reserved / record["measured"]["reserved_peak_bytes"] - 1
    assert len(errors) == 120
    modelled = sorted(abs(e) for case, e in errors.items() if case not in KNOWN_GPU_GAPS)
    assert len(modelled) == 120 and modelled[len(modelled) // 2] <= 0.0102  # 0.0136 before the replays of Liger's loss, Falcon-7B's layer, the Mamba-2 fallback and `rotation`
    assert {case for case, e in errors.items() if e > 0.10} == KNOWN_RESERVED_OVER
    assert {case for case, e in errors.items() if e < -0.10} == KNOWN_RESERVED_GAPS


EAGER_GPU_RECORDS = [p for p in GPU_RECORDS if load(p)["config"]["training"]["attention"] == "eager"]


@pytest.mark.parametrize("path", EAGER_GPU_RECORDS, ids=lambda p: p.stem)
def test_fake_tensor_harness_backward_of_eager_attention(path):
    """The backward phase of every eager-attention run: the fake peak plus the workspaces is the GPU's to 0.6%,
    to 512 bytes for Llama and Gemma 2, since the harness counts CUDA's softmax-backward temporary (tmp = grad *
    output, validation/core/emulation.py). Before it did, the fake backward was 4 b a s^2 under: 537 MB on
    Llama-3.1-8B with recompute (0.8%), 1.07 GB on Gemma-2-9B (1.4%), 2.1 to 8.6 GB on DeepSeek-V3.2 (5 to 16%)."""
    record = load(path)
    fake = load(MEASURED / record["fake_tensor_record"])["measured"]["phases"]["backward"]["total"]
    measured = record["measured"]
    gpu = measured["phases"]["backward"]["peak_bytes"] - measured["cublas_workspace_bytes"]
    assert fake == pytest.approx(gpu, rel=0.006)
    if path.stem.startswith(("llama-3.1-8b", "gemma-2-9b")):
        assert abs(gpu - fake) <= 512


# case id -> why its fake-tensor record is not what the GPU ran (the record's vision_attention says what did)
KNOWN_FAKE_GPU_GAPS = {
    "gemma-3-4b-bf16-adamw-norecompute-sdpa-s2048-b2-i4x896": (
        "the H200 had no flash-attn, so Gemma 3's decoder ran SDPA (vision_attention 'sdpa'), whose sliding-window "
        "layers take a 4-D mask once the sequence reaches the 1,024-token window (transformers masking_utils "
        "_ignore_causal_mask_sdpa): SDPA's masked path, on that H200 (torch 2.11.0+cu130, cuDNN 9.19) cuDNN's attention "
        "(tests/data/measured/gpu/experiments/sdpa-mask-h200.json), which the harness does not emulate "
        "(validation/vlm/vision.py refuses a mask); the fake record runs flash_attention_2 without a mask. GPU 101.16 GB "
        "less the workspaces, fake 100.08 GB: 1,025 MiB more (+1.07%) at the forward's end and the backward's peak "
        "alike. The sources account for 936 MiB of it: each of the 29 sliding layers keeps its own bf16 additive "
        "mask (torch attention.cpp convert_boolean_attn_mask, saved by cuDNN's backward, b x s^2 x 2 B = 16 MiB) and "
        "K and V repeated to the 8 query heads (transformers sdpa_attention.py: use_gqa_in_sdpa needs no mask, so "
        "repeat_kv; 2 x 8 MiB more than the 4 grouped heads the flash path keeps), plus the shared bool "
        "mask (8 MiB); the rest (89 MiB, 0.09%) is of the size every vision-language record of this run shows in "
        "all its phases (0.09-0.3%). "
        "With recompute (its twin at s4096) none of it is kept and the record holds to 0.1%. The estimate models the "
        "masked path (estimator/memory/activations/sdpa_mask.py; held to this record to 0.15% in "
        "tests/test_sdpa_mask.py, and to the layer's saved bytes exactly in tests/test_gpu_sdpa_mask.py); the "
        "harness does not"),
}


@pytest.mark.parametrize("path", [pytest.param(p, marks=pytest.mark.xfail(reason=KNOWN_FAKE_GPU_GAPS[p.stem], strict=True))
                                  if p.stem in KNOWN_FAKE_GPU_GAPS else p
                                  for p in GPU_RECORDS if load(p)["fake_tensor_record"]], ids=lambda p: p.stem)
def test_fake_tensor_harness_against_the_gpu(path):
    """The fake-tensor harness's peak plus the workspaces it cannot see is what the GPU allocated, to
    0.6%: the harnesses' records are what a real step allocates. A vision-language run is held to the fake
    record of the tower's attention the GPU ran (Qwen2.5-VL's on SDPA: the -sdpavision records, 671 MB above
    the flash_attention_2 ones at 8,192 trained patches; validation/gpu/records.py record_of)."""
    record = load(path)
    fake = load(MEASURED / record["fake_tensor_record"])["measured"]["peak_bytes"]
    fake = MAMBA_FALLBACK_FAKE_PEAKS.get(path.stem, fake)  # the path the GPU ran (ssm_kernels 'torch_5.17')
    measured = record["measured"]
    if "-qlora-bnb-" in path.stem and "-prepared" in path.stem:
        pytest.skip("SDPA's math backward holds one score-sized tensor more on the GPU than in the harness "
                    "(estimator/memory/kbit.py; KNOWN_GAPS)")
    assert fake + measured["cublas_workspace_bytes"] == pytest.approx(measured["peak_bytes"], rel=0.006)
