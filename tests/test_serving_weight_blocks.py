"""vLLM's weights as the caching allocator's blocks (estimator/serving/weight_blocks.py): by hand, against the
published 0.19.0 logs of Qwen2.5-7B/72B-Instruct at TP 1, 2 and 4, and the allocation requests against the
tensors vLLM 0.11.0's parallel layers build per TP rank (validation/vllm/qwen2_params.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from estimator.models.presets import get_architecture, get_hf_config
from estimator.serving.vllm_engine import estimate_vllm
from estimator.serving.weight_blocks import allocated_bytes, stage_requests
from estimator.serving.weights import WeightFormat, rope_cache_bytes, stage_weights, tensor_bytes
from estimator.spec.hardware import Hardware
from estimator.spec.parallel import Parallel
from estimator.spec.serving import Serving
from tests.test_serving_published import RECORDS, estimate

MiB, GiB = 2**20, 2**30
BF16 = WeightFormat("bf16")


def test_a_block_is_kept_whole_when_at_most_1_mib_is_left():
    """A request of 10 MiB or more gets a segment rounded up to 2 MiB; the rest is split off only when it is
    more than 1 MiB (CUDACachingAllocator.cpp should_split), so 31.5 MiB holds 32 and 24.5 MiB holds 24.5."""
    assert allocated_bytes((int(31.5 * MiB),)) == 32 * MiB
    assert allocated_bytes((259 * MiB,)) == 260 * MiB  # 1 MiB left: not more than 1 MiB, kept
    assert allocated_bytes((int(24.5 * MiB),)) == int(24.5 * MiB)  # 1.5 MiB left: split off
    assert allocated_bytes((9216, 2304)) == 9216 + 2560  # the small pool rounds to 512 B


@pytest.mark.parametrize("tp, excess", [
    # TP 1: qkv 4,608 x 3,584 x 2 B = 31.5 MiB (+0.5), o_proj 24.5 (split), gate_up 37,888 x 3,584 x 2 = 259 (+1),
    # down 3,584 x 18,944 x 2 = 129.5 (+0.5): 2 MiB a layer; embedding and LM head 1,039.5 MiB each (+0.5 each)
    (1, 28 * 2 * MiB + 1 * MiB),
    # TP 2: qkv 2,304 rows = 15.75 MiB (+0.25), o 12.25 (split), gate_up 129.5 (+0.5), down 64.75 (split);
    # embedding and head 76,032 rows = 519.75 MiB (+0.25 each)
    (2, 28 * 0.75 * MiB + 0.5 * MiB),
    # TP 4: qkv 7.875 and o 6.125 MiB share 20 MiB segments, gate_up 64.75 and down 32.375 are split; the
    # embedding and head 38,016 rows = 259.875 MiB (+0.125 each); the qkv bias 2,304 B takes 2,560 (+256 B a layer)
    (4, 0.25 * MiB + 28 * 256),
])
def test_qwen2_5_7b_blocks_by_hand(tp, excess):
    weights = stage_weights(get_architecture("qwen2.5-7b"), BF16, tp, 1, 1, 0, range(28), 32768, as_allocated=True)
    assert weights.block_excess == excess
    assert weights.bytes - weights.block_excess == stage_weights(get_architecture("qwen2.5-7b"), BF16, tp, 1, 1, 0,
                                                                 range(28), 32768).bytes


def test_qwen2_5_72b_tp2_blocks_by_hand():
    """qkv 5,120 x 8,192 x 2 B = 80 MiB, o_proj 64, gate_up 29,568 x 8,192 x 2 = 462, embedding 76,032 rows = 1,188:
    even sizes; down 8,192 x 14,784 x 2 = 231 MiB takes a 232 MiB segment and keeps the 1 MiB rest: 80 x 1 MiB."""
    weights = stage_weights(get_architecture("qwen2.5-72b"), BF16, 2, 1, 1, 0, range(80), 32768, as_allocated=True)
    assert weights.block_excess == 80 * MiB


def test_llama_shapes_lose_nothing_but_the_split_vocabulary():
    """Llama-3.1-8B's matrices are multiples of 2 MiB (48, 32, 224, 112 MiB; embedding 1,002 MiB): nothing at
    TP 1; at TP 2 the embedding and head are 64,128 x 4,096 x 2 B = 501 MiB each, +1 MiB each."""
    llama = get_architecture("llama-3.1-8b")
    assert stage_weights(llama, BF16, 1, 1, 1, 0, range(32), 131072, as_allocated=True).block_excess == 0
    assert stage_weights(llama, BF16, 2, 1, 1, 0, range(32), 131072, as_allocated=True).block_excess == 2 * MiB


def test_quantized_weights_are_not_replayed():
    """The quantized methods repack on the GPU after loading (not followed): their tensors' bytes as before."""
    fp8 = WeightFormat("fp8", per_channel=True)
    arch = get_architecture("qwen2.5-7b")
    assert stage_weights(arch, fp8, 1, 1, 1, 0, range(28), 32768, as_allocated=True).block_excess == 0


QWEN_LOGS = ["qwen2.5-7b-tp1-pp1-len8192", "qwen2.5-7b-tp2-pp1-len8192", "qwen2.5-7b-tp4-pp1-len8192",
             "qwen2.5-72b-tp2-pp1-len8192"]


@pytest.mark.parametrize("record_id", QWEN_LOGS)
def test_qwen_weights_to_the_printed_digit(record_id):
    """'Model loading took X GiB' to its two printed decimals (14.25, 7.12, 3.55, 67.80), where the tensors alone
    were 57, 21, 0.3 and 80 MiB under; with the base models' 131,072 positions (the preset's config) the 8 MiB
    cos/sin cache would be 32 MiB and every one of them over by more than the printed digit."""
    record = RECORDS[record_id]
    printed = record["printed"]["weights_gib"]
    ours = estimate(record_id).stages[0].weights / GiB
    assert abs(ours - printed) <= 0.005, (ours, printed)
    base = estimate_vllm(get_architecture(record["model"]), Serving(**record["serving"]),
                         Parallel(tp=record["tp"], pp=1), Hardware(record["gpu"]), get_hf_config(record["model"]))
    assert base.stages[0].weights / GiB - printed > 0.005 + 0.015


def test_the_weights_component_shows_the_blocks():
    e = estimate("qwen2.5-7b-tp1-pp1-len8192")
    weights = next(c for c in e.stages[0].components if c.key == "weights")
    tensors, blocks = weights.parts
    assert blocks.bytes == 57 * MiB and tensors.bytes + blocks.bytes == weights.bytes
    assert "CUDACachingAllocator" in blocks.source and "32,768 positions" in tensors.formula


PARAMS = json.loads((Path(__file__).parent / "data" / "serving" / "vllm-0.11.0-qwen2-weights.json").read_text())


@pytest.mark.parametrize("record", PARAMS["records"], ids=lambda r: f"{r['model']}-tp{r['tp']}")
def test_requests_are_the_tensors_vllm_builds(record):
    """Our requests for the embedding, one layer (with the rotary cache) and the head against the tensors vLLM
    0.11.0's parallel layers build at that TP (validation/vllm/qwen2_params.py): the same bytes, and the large
    ones (the allocator's large pool) in the same order. The record builds one RMSNorm; a layer has two and the
    head one more."""
    arch = get_architecture(record["model"])
    tp = record["tp"]

    def nbytes(t):
        return tensor_bytes(t, arch, BF16, tp, 1)

    rope = rope_cache_bytes(arch, record["positions"], BF16)
    ours = stage_requests(arch, range(1), nbytes, arch.head_tensors(arch.vocab_size),
                          arch.embedding_tensors(arch.vocab_size), rope)
    built = [t["bytes"] for t in record["tensors"]]
    norm = next(t["bytes"] for t in record["tensors"] if t["module"] == "input_layernorm")
    assert all(t["dtype"] == "bfloat16" for t in record["tensors"])
    assert sorted(ours) == sorted(built + [norm, norm])
    assert [b for b in ours if b > MiB] == [b for b in built if b > MiB]
