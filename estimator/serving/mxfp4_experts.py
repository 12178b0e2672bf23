"""MXFP4 experts (gpt-oss) as vLLM's MoE backend holds them after loading, by release and GPU.

Which backend loads them (quantization/mxfp4.py get_mxfp4_backend in 0.11.0 and 0.15.0-0.18.0; from 0.19.0
fused_moe/oracle/mxfp4.py select_mxfp4_moe_backend, the first of its priority list that supports the GPU):

- 0.11: Marlin on every CUDA GPU (FlashInfer and triton_kernels only when installed, and the PyPI wheel has
  neither: FlashInfer is an extra); on ROCm both sizes padded to 256.
- From 0.15 (the wheel bundles triton_kernels and requires flashinfer-python): below compute capability 9.0
  and on sm120 (triton_kernels needs 9.0 <= capability < 11.0; 0.19's FlashInfer CUTLASS BF16 path is sm90
  only; 0.33 puts TRITON after Marlin on sm120) Marlin; on Hopper 'TRITON' (0.19's start-up log: "Using
  'TRITON' Mxfp4 MoE backend"); on sm100/sm103 FlashInfer's TRTLLM kernel (0.15.0 SM100_FI_MXFP4_BF16,
  0.19.0 FLASHINFER_TRTLLM_MXFP4_BF16, first in the list). ROCm from 0.15 is not modelled (unpadded).

Marlin (0.11.0 mxfp4.py create_weights; 0.19.0-0.33.0 oracle/mxfp4.py
mxfp4_round_up_hidden_size_and_intermediate_size) pads the intermediate size per rank to 128 and the hidden
size to 256, biases too, and keeps them bf16. TRTLLM pads both to 256 (0.33.0: the intermediate to 128),
shuffles values and scales without changing their size and turns the biases to fp32 (0.15.0 mxfp4.py
process_weights_after_loading; 0.19.0 convert_to_mxfp4_moe_kernel_format), every original replaced.

The 'TRITON' layout on Hopper, per MoE layer and rank, after loading (the wheels' own triton_kernels copy,
vllm/third_party/triton_kernels, used when no triton_kernels package is installed:
utils/import_utils.py import_triton_kernels):
- create_weights pads the intermediate size per rank to a multiple of 64 (0.15.0 mxfp4.py; 0.19.0-0.33.0
  oracle/mxfp4.py mxfp4_round_up_hidden_size_and_intermediate_size, the last branch); the hidden size is kept.
- The packed values (uint8, two per byte) of a matrix with N output rows and K inputs are transposed and
  swizzled (utils/mxfp4_utils.py _swizzle_mxfp4 -> triton_kernels tensor.py convert_layout ->
  tensor_details/layout_details/hopper_value.py HopperMXValueLayout.swizzle_data): N is padded to a
  multiple of 16 and K/2 to 32 (the mma tile packs, mma_version 3), and from 0.17.0 to 0.21.0 the bundled
  copy first pads both to multiples of 64 ("Pre-pad both matrix dims to multiples of 64"; absent from the
  copies in 0.15.0, 0.25.0 and 0.33.0). The original is freed (``del layer.w13_weight``).
- The uint8 scales (one per 32 inputs) are swizzled (hopper_scale.py HopperMXScaleLayout with num_warps 8):
  N padded to 2 x 8 x 2 x 8 = 256 rows, K/32 to a multiple of 2; 0.33.0's _swizzle_mxfp4 first pads K/32
  to 4 ("Patches #47303"). The swizzled copy goes into a PrecisionConfig; the loaded scales stay registered
  on the layer until 0.25.0 deletes them ("drop the now-dead weight/scale Parameters"), so 0.15.0-0.21.0
  hold both.
- The biases become fp32 (``w13_bias.to(torch.float32)`` replaces the bf16 parameter).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..spec.gpus import GPU
from .kv_cache import cdiv

MX_BLOCK = 32  # inputs per uint8 scale (create_weights' mxfp4_block)
INTERMEDIATE_ALIGN = 64  # create_weights / mxfp4_round_up_hidden_size_and_intermediate_size
SCALE_ROWS = 2 * 8 * 2 * 8  # hopper_scale.py SWIZZLE_ALIGN_M = 2 x num_warps x 2 x 8, num_warps 8 (_swizzle_mxfp4)


def round_up(x: int, multiple: int) -> int:
    return cdiv(x, multiple) * multiple


@dataclass(frozen=True)
class TritonHopperLayout:
    """How one release's bundled triton_kernels and mxfp4 method store a swizzled MXFP4 expert matrix."""

    release: tuple[int, int]
    value_align: tuple[int, int]  # (output rows, packed input bytes) of the swizzled values
    scale_k_align: int  # scale columns (K/32) rounded to this
    scales_kept: bool  # the loaded scales stay registered beside the swizzled copy
    source: str

    def matrix_bytes(self, rows: int, inputs: int) -> int:
        """One expert's (rows, inputs) MXFP4 matrix: swizzled values + swizzled scales (+ the loaded scales)."""
        values = round_up(rows, self.value_align[0]) * round_up(inputs // 2, self.value_align[1])
        groups = inputs // MX_BLOCK
        scales = round_up(rows, SCALE_ROWS) * round_up(groups, self.scale_k_align)
        return values + scales + (rows * groups if self.scales_kept else 0)


_MMA_PACK = (16, 32)  # hopper_value.py: k_tile x warp_tile x threads x scott_trick x contig per dimension
_PREPAD = (64, 64)
LAYOUTS = (
    TritonHopperLayout((0, 15), _MMA_PACK, 2, True, "vLLM 0.15.0 quantization/mxfp4.py (TRITON branch of "
                       "process_weights_after_loading) and third_party/triton_kernels hopper_value.py, "
                       "hopper_scale.py"),
    TritonHopperLayout((0, 17), _PREPAD, 2, True, "vLLM 0.17.0-0.21.0 third_party/triton_kernels hopper_value.py "
                       "pre-pads both dims to 64; 0.19.0 fused_moe/oracle/mxfp4.py convert_to_mxfp4_moe_kernel_format "
                       "keeps the loaded scales"),
    TritonHopperLayout((0, 25), _MMA_PACK, 2, False, "vLLM 0.25.0 oracle/mxfp4.py deletes the loaded scales; its "
                       "third_party/triton_kernels hopper_value.py has no 64 pre-pad"),
    TritonHopperLayout((0, 33), _MMA_PACK, 4, False, "vLLM 0.33.0 utils/mxfp4_utils.py _swizzle_mxfp4 pads the scale "
                       "groups to 4 on Hopper"),
)


def triton_hopper_layout(release: tuple[int, int]) -> TritonHopperLayout:
    """The layout of the newest record at or below `release` (from 0.15)."""
    return [layout for layout in LAYOUTS if layout.release <= release][-1]


@dataclass(frozen=True)
class Mxfp4Experts:
    """How one vLLM release's MoE backend for MXFP4 holds the experts on one GPU."""

    backend: str
    padding: tuple[int, int] | None = None  # (intermediate per rank, hidden) multiples; None: unpadded
    fp32_bias: bool = False
    triton: TritonHopperLayout | None = None  # the swizzled layout ('TRITON' on Hopper)


MARLIN = Mxfp4Experts("marlin", (128, 256))
SM100 = ("b200", "gb200", "b300")  # compute capability 10.x (B300: 10.3, the same family)


def mxfp4_experts(release: tuple[int, int], gpu: GPU) -> Mxfp4Experts:
    """The backend that loads MXFP4 experts (see the module docstring)."""
    if gpu.id.startswith("mi"):
        return Mxfp4Experts("rocm", (256, 256)) if release < (0, 15) else Mxfp4Experts("rocm (not modelled)")
    if release < (0, 15):
        return MARLIN
    if gpu.runtime.architecture.startswith("Hopper"):
        return Mxfp4Experts("triton", triton=triton_hopper_layout(release))
    if gpu.id in SM100:
        return Mxfp4Experts("flashinfer_trtllm", (128 if release >= (0, 33) else 256, 256), fp32_bias=True)
    return MARLIN


def expert_tensor_bytes(layout: TritonHopperLayout, name: str, shape: tuple[int, ...]) -> int:
    """One expert's tensor on a rank, `shape` its TP-local (unpadded) shape: gate-up (2I, h) and its bias
    (2I,), down (h, I) and its bias (h,); vLLM's MXFP4 experts are always gated (w13 holds 2I rows)."""
    if name == "expert_fc1":
        return layout.matrix_bytes(2 * round_up(shape[0] // 2, INTERMEDIATE_ALIGN), shape[1])
    if name == "expert_fc2":
        return layout.matrix_bytes(shape[0], round_up(shape[1], INTERMEDIATE_ALIGN))
    if name == "expert_fc1_bias":
        return 4 * 2 * round_up(shape[0] // 2, INTERMEDIATE_ALIGN)
    if name == "expert_fc2_bias":
        return 4 * shape[0]
    raise ValueError(f"no MXFP4 Triton layout for {name}")
