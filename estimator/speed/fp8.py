"""FP8 training's casts: the memory-bound kernels that quantize each linear layer's GEMM operands.

An FP8 GEMM reads FP8 operands, so every linear layer casts its input (forward), its output
gradient (backward) and its weight. Hopper's FP8 GEMMs take only the TN layout (cuBLASLt), so a
tensor used by two GEMMs in different layouts (the input by the forward and the weight gradient, the
output gradient by both backward GEMMs) is written twice, once transposed. Dynamic (current) scaling
first reduces the tensor's absolute maximum: one more read. Bytes per element of the bf16 tensor,
summed over its kernels, as torchao counts them (torchao/testing/training/roofline_utils.py
get_tensor_memory_traffic_ovhd_s, pytorch/ao 36027d82):

- tensorwise, input or output gradient: amax (read 2) + one cast writing both layouts (read 2,
  write 1 + 1) = 6; under torch.compile the amax fuses into the kernel that produced the tensor
  (fuse_with_prev, benchmarks/float8/float8_roofline.py: 'torch.compile will fuse to the preceding
  op') = 4. Weight: amax (2) + a forward cast (2 + 1) + a backward cast (2 + 1) = 8.
- rowwise, input or output gradient: a cast that also writes a bf16 transposed copy (2 + 1 + 2;
  fused 1 + 2) and a cast of the copy (2 + 1) = 8 (6); weight: cast (2 + 1), transpose (2 + 2),
  cast (2 + 1) = 10.
- mxfp8 (torchao's MX GEMMs through cuBLAS): a cast per layout, each 2 + 1 (the first 1 when fused)
  = 6 (4); weight 6. The E8M0 scales (one byte per 32) are left out.

TransformerEngine (Megatron-Core) quantizes in one kernel that writes both layouts (cast-transpose,
transformer_engine/common/transpose/cast_transpose.cu; MXFP8 quantize with rowwise and columnwise
outputs, common/util/cast_kernels.cuh): tensorwise current scaling = amax (2) + cast (2 + 1 + 1) = 6;
mxfp8 and blockwise = 2 + 1 + 1 = 4, the scale computed per block in the same pass. TE casts the
weights once per step and keeps them over the micro-batches (`is_first_microbatch`, which
Megatron-Core passes on the first micro-batch of a step): that pass is counted with the optimizer's
(roofline.optimizer_time); torchao casts them in every forward and backward, of the local shard only
when FSDP2 gathers float8 weights (enable_fsdp_float8_all_gather).
"""

from __future__ import annotations

TORCHAO_SOURCE = ("torchao torchao/testing/training/roofline_utils.py get_tensor_memory_traffic_ovhd_s "
                  "(pytorch/ao 36027d82): the bytes each float8 cast kernel reads and writes, per recipe")
TE_SOURCE = ("TransformerEngine cast-transpose (common/transpose/cast_transpose.cu) and MXFP8 quantize with rowwise "
             "and columnwise outputs (common/util/cast_kernels.cuh); the weights cast once per step "
             "(is_first_microbatch)")
SOURCES = (TORCHAO_SOURCE, TE_SOURCE)

# torchao: recipe -> role -> (bytes per element unfused, fused with its producer, kernels)
_TORCHAO = {
    "tensorwise": {"activation": (6, 4, 2), "weight": (8, 8, 3)},
    "rowwise": {"activation": (8, 6, 2), "weight": (10, 10, 3)},
    "mxfp8": {"activation": (6, 4, 2), "weight": (6, 6, 2)},
}
# TransformerEngine: recipe -> (bytes per element, kernels), every role
_TE = {"tensorwise": (6, 2), "mxfp8": (4, 1), "blockwise": (4, 1)}


def activation_cast(framework: str, recipe: str, compiled: bool) -> tuple[float, int]:
    """(bytes per element, kernels) of casting a linear layer's input, or its output gradient."""
    if framework == "megatron":
        return _TE[recipe]
    unfused, fused, kernels = _TORCHAO[recipe]["activation"]
    return (fused if compiled else unfused), kernels


def weight_cast(framework: str, recipe: str) -> tuple[float, int]:
    """(bytes per element, kernels) of casting a weight: for one forward and backward under torchao,
    once per step under TE. A weight has no producing kernel to fuse with."""
    if framework == "megatron":
        return _TE[recipe]
    unfused, _, kernels = _TORCHAO[recipe]["weight"]
    return unfused, kernels
