"""MXFP4 experts as vLLM's 'TRITON' MoE backend holds them on Hopper (gpt-oss from vLLM 0.15).

On compute capability 9.0 vLLM loads MXFP4 experts for OpenAI's triton_kernels matmul_ogs (0.15.0
quantization/mxfp4.py get_mxfp4_backend; from 0.19.0 fused_moe/oracle/mxfp4.py select_mxfp4_moe_backend,
whose first backend Hopper supports is TRITON; the 0.19.0 start-up log prints "Using 'TRITON' Mxfp4 MoE
backend"). The wheels bundle the kernels (vllm/third_party/triton_kernels, used when no triton_kernels
package is installed: utils/import_utils.py import_triton_kernels). Per MoE layer and rank, after loading:

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

from .kv_cache import cdiv

MX_BLOCK = 32  # inputs per uint8 scale (create_weights' mxfp4_block)
INTERMEDIATE_ALIGN = 64  # create_weights / mxfp4_round_up_hidden_size_and_intermediate_size


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
        scales = round_up(rows, 256) * round_up(groups, self.scale_k_align)
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


def triton_hopper_layout(release: tuple[int, int], architecture: str) -> TritonHopperLayout | None:
    """The layout of the newest record at or below `release` on a Hopper GPU; None elsewhere (Marlin below 0.15
    and below sm90, FlashInfer / Blackwell layouts not modelled)."""
    if not architecture.startswith("Hopper"):
        return None
    eligible = [layout for layout in LAYOUTS if layout.release <= release]
    return eligible[-1] if eligible else None


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
