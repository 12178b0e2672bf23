"""The sort sampler's profiling peak in torch's caching allocator's blocks (serving/sort_sampler.py), computed by
hand from PyTorch's allocation list (SortStable.cu segmented_sort_pairs, cub.cuh CUB_WRAPPER, cub's
AliasTemporaries) and the allocator's rules (c10/cuda/CUDACachingAllocator.cpp)."""

from __future__ import annotations

from estimator.models.presets import get_architecture
from estimator.serving import sort_sampler
from estimator.serving.activations import sampler_peak

MiB = 2**20


def test_cub_temporary_storage_is_two_aligned_alternates_and_the_slack():
    """Alternate keys and values, each rounded up to 256 B, and 255 B for aligning the base pointer."""
    assert sort_sampler.cub_temporary_bytes(1000, 4, 8) == 4096 + 8192 + 255
    assert sort_sampler.cub_temporary_bytes(1024 * 201_088, 4, 8) == 12 * 1024 * 201_088 + 255 == 2_470_969_599


def test_gpt_oss_120b_sampler_blocks_by_hand():
    """gpt-oss-120b (h 2,880, V 201,088), 1,024 batched tokens and rows, bf16. N = 205,914,112 logits:
    - the three hidden-row tensors of 5.625 MiB come from 20 MiB segments, split: exact;
    - bf16 logits 392.75 MiB: a 394 MiB segment, its 1.25 MiB rest split off: exact;
    - fp32 logits and sorted values, 785.5 MiB each: 786 MiB segments, the 0.5 MiB rest kept: 786 MiB blocks;
    - sorted indices and the index input, 1,571 MiB each (int64): 1,572 MiB blocks (the 1 MiB rest kept);
    - cub's 2,470,969,599 B rounded to 512 B: 2,470,969,856 in a 2,358 MiB segment, its rest (1.5 MiB less 512 B)
      split off;
    - the metadata's five fp32 rows and top-k row, and the greedy sample: 4 x 5 + 8 + 8 KiB.
    3 MiB and 512 B above the tensors' own bytes (38 B a logit and the rows), besides the 36 KiB of small rows."""
    n, v, h = 1024, 201_088, 2880
    logits = n * v
    hand = 3 * n * h * 2 + logits * 2 + 2 * 786 * MiB + 2 * 1572 * MiB + 2_470_969_856 + (5 * 4 + 8 + 8) * n
    assert sort_sampler.peak(n, n, v, h, 2) == hand
    assert hand - (logits * 38 + 3 * n * h * 2) == 3 * MiB + 512 + 36 * 1024
    assert sampler_peak(get_architecture("gpt-oss-120b"), n, n, 2, "sort", "h100-80") == hand


def test_fp32_model_keeps_its_logits():
    """An fp32 model's logits.to(torch.float32) returns the same tensor: no fp32 copy (4 + 4 + 8 + 8 + 12 B a
    logit). 1,024 rows of a 32,000-token vocabulary: 125 MiB fp32 tensors fill their 126 MiB segments' rest of
    1 MiB (kept), the int64 ones take 250 MiB exactly, cub's 375 MiB + 255 B a 376 MiB block; h 4,096."""
    n, v, h = 1024, 32_000, 4096
    hand = 3 * n * h * 4 + 2 * 126 * MiB + 2 * 250 * MiB + 376 * MiB + (5 * 4 + 8 + 8) * n
    assert sort_sampler.peak(n, n, v, h, 4) == hand


def test_only_the_segmented_sort_is_replayed():
    """SortStable.cu: fewer than 128 rows sort by a full sort of (segment, index) pairs, rows of 10^6 logits or more
    one by one, more than INT_MAX logits in batches; ROCm sorts with hipCUB. The per-logit rule stands there."""
    assert sort_sampler.replayable(128, 201_088, "h100-80")
    assert not sort_sampler.replayable(127, 201_088, "h100-80")
    assert not sort_sampler.replayable(1024, 1_000_000, "h100-80")
    assert not sort_sampler.replayable(16_384, 262_144, "h100-80")  # 4.3 x 10^9 logits
    assert not sort_sampler.replayable(1024, 201_088, "mi300x")
    arch = get_architecture("gpt-oss-120b")
    assert sampler_peak(arch, 1024, 64, 2, "sort", "h100-80") == 64 * 201_088 * 38 + (1024 + 128) * 2880 * 2
