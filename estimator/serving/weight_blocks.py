"""The weights as vLLM measures them: torch's caching allocator's blocks, not the tensors' bytes.

vLLM's "Model loading took X GiB" (and the profile's "weights memory") is ``model_memory_usage``: the
growth of ``torch.cuda.max_memory_allocated`` across ``load_model``, read after ``empty_cache`` and a
peak reset (utils/mem_utils.py DeviceMemoryProfiler, platforms/cuda.py get_current_memory_usage; the same
in vLLM 0.11.0, 0.15.0, 0.19.0, 0.20.0, 0.21.0, 0.25.0 and 0.33.0). The allocator counts the block it
hands out, and a parameter of 10 MiB or more gets a new segment of its size rounded up to 2 MiB, split
only when more than 1 MiB would be left (c10/cuda/CUDACachingAllocator.cpp, replayed in
memory/allocator.py): a tensor of 31.5 MiB holds a 32 MiB block, one of 24.5 MiB a 24.5 MiB block and a
free 1.5 MiB rest. Qwen2.5's shapes are not multiples of 2 MiB (hidden 3584 or 8192 with intermediate
18944 or 29568), so the blocks exceed the tensors by about 2.5 MiB a layer at TP 1 for the 7B, and the
excess shrinks with TP; Llama's shapes are multiples of 2 MiB and lose nothing.

The parameters are created on the GPU one by one as the model is built (model_loader/base_loader.py
builds the model under the target device), in construction order: the embedding, then each layer's
attention (Qwen2Attention/LlamaAttention: the fused qkv_proj weight, its bias, o_proj, then on the first
layer the rotary cos/sin cache, get_rope sharing it with the others) and MLP (gate_up_proj, down_proj)
and norms, then the final norm and the LM head (models/qwen2.py, llama.py, 0.19.0). Replayed only for
unquantized weights: UnquantizedLinearMethod.process_weights_after_loading does nothing on CUDA
(layers/linear.py, 0.19.0), while the quantized methods repack their tensors on the GPU after loading,
which this replay does not follow. Left out: the rotary cache's fp32 temporaries (freed blocks that later
requests may reuse; for Qwen2.5-7B and 72B at TP 1-8 the replay gives the same with and without them) and
the attention layers' seven fp32 scalars (set_default_quant_scales: 3.5 KiB a layer).
"""

from __future__ import annotations

import functools

from ..memory.allocator import CachingAllocator
from ..spec.architecture import Architecture, ParameterTensor

FUSED_QKV = ("q_proj", "k_proj", "v_proj")  # QKVParallelLinear: one weight for the three


def layer_requests(tensors: list[ParameterTensor], nbytes, rope: int) -> list[int]:
    """One layer's allocations in vLLM's order: q/k/v fused into one, an expert tensor stacked into one
    (FusedMoE's w13/w2), any other tensor once per copy (the two norms); `rope` (bytes, 0 for none) after
    the attention's output projection."""
    requests: list[int] = []
    names = {t.name for t in tensors}
    qkv = sum(nbytes(t) for t in tensors if t.name in FUSED_QKV) if set(FUSED_QKV) <= names else 0
    for t in tensors:
        if qkv and t.name in FUSED_QKV:
            if t.name == "q_proj":
                requests.append(qkv)
            continue
        total = nbytes(t)
        if t.is_expert or t.copies <= 1:
            requests.append(int(round(total)))
        else:
            requests.extend([int(round(total / t.copies))] * t.copies)
        if rope and t.name == "o_proj":
            requests.append(rope)
            rope = 0
    if rope:  # a layer without an o_proj (the replay needs the cache somewhere in the first layer)
        requests.append(rope)
    return requests


@functools.lru_cache(maxsize=256)
def allocated_bytes(requests: tuple[int, ...]) -> int:
    """What torch.cuda.memory_allocated counts after these allocations, none freed (memory/allocator.py)."""
    allocator = CachingAllocator()
    for size in requests:
        if size > 0:
            allocator.malloc(size)
    return allocator.allocated


def stage_requests(arch: Architecture, layers: range, nbytes, head: list[ParameterTensor],
                   embedding: list[ParameterTensor], rope: int) -> tuple[int, ...]:
    """A stage's allocations: its embedding (if any), its layers (the rotary cache in the first), its head."""
    per_kind: dict[tuple[str, int], list[int]] = {}  # a layer kind's requests are the same in every layer

    def of_layer(i: int) -> list[int]:
        key = (arch.layer_kind(i), rope if i == layers.start else 0)
        if key not in per_kind:
            per_kind[key] = layer_requests(arch.layer_tensors(key[0]), nbytes, key[1])
        return per_kind[key]

    requests = [int(round(nbytes(t))) for t in embedding]
    for i in layers:
        requests += of_layer(i)
    if not len(layers) and rope:
        requests.append(rope)
    return tuple(requests + [int(round(nbytes(t))) for t in head])
