"""Where cudaMalloc puts the caching allocator's segments (estimator/memory/allocator.py, `descending`): each new
segment below the last on the H200, shown by the fake harness's recorded sequences replayed against the GPU's
own reserved peaks and segments (tests/data/measured/allocator_order, validation/allocator_trace.py); a GPU run's
own addresses in the order made: validation/gpu/hf_history.py `--summary`."""

import gzip
import json
import statistics
from pathlib import Path

import pytest

from estimator.memory.allocator import replay

MEASURED = Path(__file__).parent / "data" / "measured"
MiB = 1 << 20


def _load(path: Path) -> dict:
    with gzip.open(path, "rt") as f:
        return json.load(f)


def _segments(allocator) -> list[int]:
    """The replay's segments' sizes, by address (as torch.cuda.memory_snapshot() lists them)."""
    sizes = []
    for _, block in sorted(allocator._blocks.items()):
        if block.prev is None:
            size = 0
            while block is not None:
                size, block = size + block.size, block.next
            sizes.append(size)
    return sizes


@pytest.mark.parametrize("case, ascending", [
    # LoRA r16 on q and v of Llama-3.2-1B, full recompute, eager attention, s 4096 (the H200 run of 2026-11-27):
    # without attention dropout the GPU reserved 17,723,031,552 bytes, with it 15,621,685,248
    ("llama-3.2-1b-lora-r16-qv-recompute-drop00-s4096-b1-eager", 15_575_547_904),
    ("llama-3.2-1b-lora-r16-qv-recompute-drop00-s4096-b1-eager-attndrop10", 15_575_547_904),
])
def test_descending_segments_replay_the_gpus_reserved_peak_to_the_byte(case, ascending):
    """The recorded sequence (the cuBLAS workspaces at each thread's first matrix product) replayed with each new
    segment below the last reaches the GPU's max_memory_reserved to the byte and maps the GPU's segments, size
    for size, its segments of 1 GiB and more in the GPU's order of addresses (without dropout: 2 GiB, 2 GiB,
    2,004 MiB (the loss's fp32 logits), 2 GiB three times, 1 GiB twice). Ascending, the same sequence maps a
    2 GiB segment less (the autograd thread's workspace and a 2 GiB request find other blocks): -12.1%, -0.3%."""
    record = _load(MEASURED / "allocator_order" / f"{case}.json.gz")
    gpu = json.loads((MEASURED / record["gpu_record"]).read_text())["measured"]
    events = [tuple(e) for e in record["events"]]
    down, up = replay(events, descending=True), replay(events)
    assert down.reserved_peak == gpu["reserved_peak_bytes"] == record["simulated_descending_reserved_bytes"]
    assert up.reserved_peak == ascending == record["simulated_reserved_bytes"]
    sizes, measured = _segments(down), [s[0] for s in gpu["segments"]]
    assert sorted(sizes) == sorted(measured)
    assert [s // MiB for s in sizes if s >= 1 << 30] == [s // MiB for s in measured if s >= 1 << 30]
    assert down.allocated_peak == up.allocated_peak == 11_621_618_688  # the GPU's: 11,621,619,712


def test_descending_segments_replay_the_recorded_hf_sequences_closer():
    """The 39 recorded HF sequences with default segments (tests/data/measured/allocator; autograd's cuBLAS
    workspace at its thread's first matrix product, the forward's after the build: validation/allocator_trace.py):
    against each GPU run's max_memory_reserved, the median |error| 0.08% ascending, 0.01% descending, the largest
    12.7% (StarCoder2-3B bf16 at s4096 b2, whose CPU step the GPU's differs from: tests/test_allocator.py
    KNOWN_REPLAY_GAPS) and 4.2% (the same run), beyond 1% ten runs and four. (On the 26 recorded with both workspaces
    after the build, before the five Liger runs' sequences, Falcon-H1-0.5B's four on transformers' Mamba-2 fallback,
    GPT-2 medium's two under autocast and Pythia-1.4B's and StarCoder2-3B's of the third H200 run: 0.28% and 0.04%,
    the largest 7.7% and 1.7%, nine and two.)"""
    ascending, descending = [], []
    for path in sorted((MEASURED / "allocator").glob("*.json.gz")):
        record = _load(path)
        if record["expandable_segments"]:  # one segment per pool: no order to choose
            continue
        events, gpu = [tuple(e) for e in record["events"]], record["gpu_reserved_bytes"]
        ascending.append(replay(events).reserved_peak / gpu - 1)
        descending.append(replay(events, descending=True).reserved_peak / gpu - 1)
    assert len(ascending) == 39
    assert round(statistics.median(map(abs, ascending)), 4) == 0.0008
    assert round(statistics.median(map(abs, descending)), 4) == 0.0001
    assert round(max(map(abs, ascending)), 4) == 0.1271 and round(max(map(abs, descending)), 4) == 0.0424
    assert sum(abs(e) > 0.01 for e in ascending) == 10 and sum(abs(e) > 0.01 for e in descending) == 4


# The H200's own allocator histories (2026-11-27, torch 2.11.0+cu130, driver 580.159.04, transformers 5.17.0;
# validation/gpu/hf_history.py, tests/data/measured/gpu_history): every request and free of the build and two steps,
# with the address each segment got. Case -> the same requests replayed with ascending segments.
HISTORIES = {
    "deepseek-v3.2-3layers-bf16-adamw-norecompute-eager-s2048-b1": 49_685_725_184,
    "falcon-7b-8layers-bf16-adamw-recompute-eager-s4096-b1-drop10": 27_258_781_696,
    "gpt2-medium-8layers-amp-adamw-norecompute-eager-s1024-b4": 11_668_553_728,
    "gpt2-medium-8layers-amp-adamw-norecompute-sdpa-s1024-b4": 8_495_562_752,
    "llama-3.1-8b-amp-sgd-recompute-sdpa-s4096-b2": 109_098_041_344,
    "llama-3.1-8b-bf16-adamw-norecompute-sdpa-s4096-b1": 85_765_128_192,
    "llama-3.1-8b-bf16-adamw-recompute-sdpa-s8192-b1": 89_300_926_464,
    "llama-3.1-8b-lora-r16-qv-recompute-drop00-s4096-b1-save-embed-head": 33_929_822_208,
    "llama-3.1-8b-lora-r64-alllinear-recompute-drop05-s8192-b1": 36_467_376_128,
    "llama-3.2-1b-amp-adamw-norecompute-sdpa-s2048-b1": 29_026_680_832,
    "llama-3.2-1b-bf16-adamw-recompute-sdpa-s4096-b2-expandable": 24_668_798_976,
    "llama-3.2-1b-bf16-paged_adamw-norecompute-sdpa-s2048-b1": 10_898_898_944,
    "llama-3.2-1b-bf16-paged_adamw8bit-norecompute-sdpa-s2048-b1": 10_928_259_072,
    "llama-3.2-1b-lora-r16-qv-recompute-drop00-s4096-b1-eager": 15_575_547_904,
    "phi-3-mini-8layers-bf16-adamw-recompute-sdpa-s8192-b2-drop10": 16_437_477_376,
    "pythia-1.4b-8layers-bf16-adamw-norecompute-sdpa-s4096-b2": 15_355_346_944,
    "qwen2.5-0.5b-amp-adamw-norecompute-sdpa-s8192-b2-liger": 29_567_746_048,
    "qwen2.5-0.5b-amp-adamw-recompute-sdpa-s4096-b1": 17_507_024_896,
    "qwen2.5-7b-qlora-bnb-r64-all7-recompute-drop00-s4096-b2": 30_949_769_216,
    "starcoder2-3b-8layers-bf16-adamw-norecompute-sdpa-s4096-b2-drop10": 18_656_264_192,
    "starcoder2-3b-8layers-bf16-adamw-norecompute-sdpa-s4096-b2": 18_203_279_360,
}
# Falcon-7B with recompute (its history without stacks: torch 2.11's stack capture failed inside the checkpoint's
# dropout) replays 2 MiB under descending, exactly ascending: one small-pool segment placed differently. QLoRA on
# Qwen2.5-7B (bitsandbytes 0.48.2, the fourth session's second call) 2 MiB under either way; its build empties the
# cache once, bitsandbytes quantizing the weights (96 segments, 11 GB, given back: allocator.replay's EMPTY_CACHE),
# without which its replay is +28.8%.
DESCENDING_SHORT = {"falcon-7b-8layers-bf16-adamw-recompute-eager-s4096-b1-drop10": 2 * MiB,
                    "qwen2.5-7b-qlora-bnb-r64-all7-recompute-drop00-s4096-b2": 2 * MiB}


@pytest.mark.parametrize("case", HISTORIES)
def test_the_gpus_own_requests_replay_its_reserved_peak_with_descending_segments(case):
    """The GPU's own sequence of requests and frees, replayed through estimator/memory/allocator.py with each new
    segment below the last, reaches the run's max_memory_reserved to the byte on 19 of the 21 runs (Falcon-7B with
    recompute and QLoRA on Qwen2.5-7B 2 MiB under). Ascending, ten of them miss (eight by more than 1%), from -12.1% (LoRA on Llama-3.2-1B with recompute and eager
    attention) to +6.6% (LoRA on Llama-3.1-8B saving the embedding and head): the allocator's rules are the
    GPU's, and the order of addresses is descending. The history is the GPU record's run (both peaks equal to the
    byte: the step is deterministic). Every segment of 1 GiB and more lies below the one made before it; smaller ones
    may fill holes above (a 20 MiB segment after a 1 GiB one), which the replay's rule ignores without a byte's
    difference here."""
    from validation.gpu.hf_history import requests

    history = _load(MEASURED / "gpu_history" / f"{case}.history.json.gz")
    gpu = json.loads((MEASURED / "gpu" / f"{case}.json").read_text())["measured"]
    assert history["reserved_peak_bytes"] == gpu["reserved_peak_bytes"]
    assert history["allocated_peak_bytes"] == gpu["peak_bytes"]
    assert not history["trace_full"]
    events, expandable = requests(history), case.endswith("-expandable")
    down, up = replay(events, expandable, descending=True), replay(events, expandable)
    assert down.reserved_peak == gpu["reserved_peak_bytes"] - DESCENDING_SHORT.get(case, 0)
    assert up.reserved_peak == HISTORIES[case]
    large = [addr for action, addr, size, _stream, _where in history["events"]
             if action == "segment_alloc" and size >= 1 << 30]
    assert large == sorted(large, reverse=True)


def test_the_gpu_histories_ascending_misses():
    """How far ascending addresses take the GPU's own sequences from its reserved peaks: the median |error| and the
    runs beyond 1% (the case table above)."""
    errors = []
    for case, ascending in HISTORIES.items():
        gpu = json.loads((MEASURED / "gpu" / f"{case}.json").read_text())["measured"]
        errors.append(ascending / gpu["reserved_peak_bytes"] - 1)
    assert len(errors) == 21 and sum(abs(e) > 0.01 for e in errors) == 8
    assert round(min(errors), 4) == -0.1212 and round(max(errors), 4) == 0.0660
