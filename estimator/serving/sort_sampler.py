"""The sort sampler's profiling peak in the caching allocator's blocks (vLLM 0.11 to 0.16 on CUDA).

vLLM's profile counts ``torch.cuda.max_memory_allocated``, which adds up the blocks the caching allocator
hands out, not the tensors' bytes (memory/allocator.py). The sort sampler's tensors are hundreds of MiB each,
so each takes a segment of its own rounded up to 2 MiB, kept whole when the rest would be 1 MiB or less: an
fp32 tensor of 785.5 MiB holds a 786 MiB block, an int64 one of 1,571 MiB a 1,572 MiB block.

What is allocated, in order, up to the peak (read in vLLM 0.11.0 and 0.10.1, whose profile path is the same:
v1/worker/gpu_model_runner.py profile_run, _dummy_run, _dummy_sampler_run; v1/sample/sampler.py;
v1/sample/ops/topk_topp_sampler.py apply_top_k_top_p; 0.15.0's are the same. PyTorch's side read in two
versions of aten/src/ATen/native/cuda/SortStable.cu, the int64-index one of the 2.x releases and the current one
templated on the index type, which take the same paths with the same allocations; vLLM 0.10.1 pins torch 2.7.1,
0.11.0 torch 2.8.0):
- the forward's hidden states (T x h), the logit rows taken from them (``hidden_states[logit_indices]``, n x h)
  and their random copy (``torch.rand_like``, n x h);
- the LM head's logits (n x V in the model's dtype), then the dummy SamplingMetadata's ``torch.full`` rows:
  temperature, top-p and the three penalties in fp32, top-k in int64 (an integer fill);
- in the sampler, the logits' fp32 copy (``logits.to(torch.float32)``; none for
  an fp32 model, whose ``to`` returns the same tensor) and the greedy sample (argmax, n int64);
- ``logits.sort(dim=-1)``: the sorted values (fp32) and indices (int64) (aten/src/ATen/native/cuda/Sort.cpp
  sort_cuda_kernel: the input is contiguous, so no copies); launch_stable_sort_kernel (SortStable.cu) takes,
  for 128 rows or more of fewer than 10^6 logits, segmented_sort_pairs, which allocates the index input
  (``reverse_indices``, int64 per logit) and calls at::cuda::cub::segmented_sort_pairs (ATen/cuda/cub.cuh),
  whose CUB_WRAPPER allocates cub's temporary storage: DeviceSegmentedRadixSort without a DoubleBuffer keeps
  alternate keys and values, each aligned to 256 B, plus 255 B of slack for the base alignment (cub
  dispatch_radix_sort.cuh DispatchSegmentedRadixSort, util_temporary_storage.cuh AliasTemporaries).
The peak is at that temporary storage: 38 B a logit (2 + 4 + 4 + 8 + 8 + 4 + 8) and the hidden rows, each
tensor in its block. apply_temperature's row temporaries are freed before the sort and left out.

Not replayed (the per-logit formula of serving/activations.py stands): fewer than 128 rows or a single one
(SortStable.cu sorts them by a full sort of int2 pairs, or row by row), more than INT_MAX logits (sorted in
batches), and ROCm (hipCUB's temporary storage is rocPRIM's). The forward's freed blocks are not replayed
either: a tensor served from one of them counts the same as from a new segment wherever the rest is split off
in both; in the logged sort-rule runs the tensors that keep their rests (the fp32 and int64 ones) are larger
than any block of the forward (gpt-oss-120b's widest, the Marlin MoE cache at 8,192 tokens, is 360 MiB;
Qwen3-14B's gate-up output 544 MiB).
"""

from __future__ import annotations

from ..memory.allocator import replay

INT_MAX = 2**31 - 1  # SortStable.cu sorts at most INT_MAX elements per batch
FULL_SORT_BELOW = 128  # SortStable.cu: fewer rows take segmented_sort_pairs_by_full_sort
ROW_BY_ROW_FROM = 1_000_000  # SortStable.cu: rows this long take segmented_sort_large_segments
CUB_ALIGN = 256  # cub AliasTemporaries' ALIGN_BYTES
METADATA_FP32_ROWS = 5  # temperature, top_p, frequency, presence and repetition penalties


def replayable(requests: int, vocab: int, gpu_id: str) -> bool:
    """Whether PyTorch takes the segmented radix sort replayed here (module docstring)."""
    return (FULL_SORT_BELOW <= requests and vocab < ROW_BY_ROW_FROM and requests * vocab <= INT_MAX
            and not gpu_id.startswith("mi"))


def _aligned(nbytes: int) -> int:
    return -(-nbytes // CUB_ALIGN) * CUB_ALIGN


def cub_temporary_bytes(items: int, key_bytes: int, value_bytes: int) -> int:
    """DeviceSegmentedRadixSort's temporary storage without a DoubleBuffer: the alternate keys and values."""
    return _aligned(items * key_bytes) + _aligned(items * value_bytes) + CUB_ALIGN - 1


def events(tokens: int, requests: int, vocab: int, hidden: int, act_bytes: int) -> list[tuple[str, int]]:
    """The allocations up to the peak, in order (module docstring); nothing is freed before it."""
    logits = requests * vocab
    rows = [("hidden states", tokens * hidden * act_bytes), ("logit rows", requests * hidden * act_bytes),
            ("random rows", requests * hidden * act_bytes)]
    metadata = [(f"metadata {i}", requests * 4) for i in range(METADATA_FP32_ROWS)] + [("top_k", requests * 8)]
    upcast = [] if act_bytes == 4 else [("fp32 logits", logits * 4)]
    return (rows + [("logits", logits * act_bytes)] + metadata + upcast
            + [("greedy", requests * 8), ("sorted values", logits * 4), ("sorted indices", logits * 8),
               ("index input", logits * 8), ("cub temporary", cub_temporary_bytes(logits, 4, 8))])


def peak(tokens: int, requests: int, vocab: int, hidden: int, act_bytes: int) -> int:
    """torch.cuda.max_memory_allocated over the sampler's tensors, the allocator replayed."""
    return replay(events(tokens, requests, vocab, hidden, act_bytes)).allocated_peak
