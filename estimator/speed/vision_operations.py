"""The vision tower's operations on the first stage (issue 28, estimator/spec/vision.py): the images'
patches of one micro-batch through the patch embedding, the ViT blocks and the merger, before the
embedding's lookup. Qwen2.5-VL (transformers 5.23 modeling_qwen2_5_vl.py): each block's qkv, output
projection and gated MLP GEMMs over all patches; its attention over windows of (window / patch)^2
patches, or the whole image in the full-attention blocks, non-causal (FlashAttention-2 varlen: every
query attends to every key of its window); the merger's two GEMMs over the merged patches."""

from __future__ import annotations

import dataclasses

from ..memory.activations.vision import image_size
from ..spec import vision as _vision
from ..spec.architecture import Architecture
from ..spec.training import Training
from . import kernels
from .operations import Operation, _Context, _elementwise, _gemm

SCOPE = "vision tower"
NORM_FLOPS = 5  # square, mean, rsqrt, scale and weight per element (an RMSNorm), as the layers count it


def vision_operations(ctx: _Context, arch: Architecture, training: Training) -> list[Operation]:
    """Forward and backward of the tower for one micro-batch; none without images (or a tower whose
    activations are not modelled: validation refuses images there)."""
    if arch.vision_tower is None or not training.images_per_sample:
        return []
    if arch.vision_tower == _vision.SIGLIP:
        return _once(_trained(_siglip(ctx, arch, training), training))
    if arch.vision_tower == _vision.LLAMA4:
        return _once(_trained(_llama4(ctx, arch, training), training))
    size = image_size(arch, training)
    per_image = _vision.patches_per_image(arch, size)
    images = training.images_per_sample * training.micro_batch_size
    M = float(per_image * images)
    c, f, n, L = arch.vision_hidden_size, arch.vision_intermediate_size, arch.vision_num_heads, arch.vision_num_layers
    p = arch.vision_patch_size
    pixels = _vision.CHANNELS * arch.vision_temporal_patch_size * p * p
    merged = arch.vision_spatial_merge_size ** 2 * c
    window = min(per_image, (arch.vision_window_size // p) ** 2) if arch.vision_window_size else per_image
    full = arch.vision_full_attention_layers if arch.vision_window_size else L
    ops = _gemm(ctx, SCOPE, "vision patch embedding", M, pixels, c, 1)
    ops += _elementwise(ctx, SCOPE, "vision RMSNorms", 2 * M * c, 2 * M * c, NORM_FLOPS, L, "2 norms of M*c", (), "norm")
    ops += _gemm(ctx, SCOPE, "vision qkv", M, c, 3 * c, L) + _gemm(ctx, SCOPE, "vision output projection", M, c, c, L)
    for blocks, keys, label in ((L - full, window, "window"), (full, per_image, "full")):
        if blocks:
            ops += _attention(ctx, M * keys * 4 * c, M * 4 * c * ctx.B, blocks, keys, c // n, label)
    ops += _gemm(ctx, SCOPE, "vision MLP gate and up", M, c, 2 * f, L) + _gemm(ctx, SCOPE, "vision MLP down", M, f, c, L)
    ops += _elementwise(ctx, SCOPE, "vision SwiGLU", 2 * M * f, M * f, 4, L, "read 2*M*f, write M*f", (), "activation")
    tokens = M / arch.vision_spatial_merge_size ** 2
    ops += (_gemm(ctx, SCOPE, "vision merger fc1", tokens, merged, merged, 1)
            + _gemm(ctx, SCOPE, "vision merger fc2", tokens, merged, arch.hidden_size, 1))
    return _once(_trained(ops, training))


def _trained(ops: list[Operation], training: Training) -> list[Operation]:
    """A frozen encoder (training.freeze_vision) runs forward only: no backward but the merger's or projector's."""
    if not training.freeze_vision:
        return ops
    return [op for op in ops if op.phase == "forward" or "merger" in op.name or "projector" in op.name]


def _once(ops: list[Operation]) -> list[Operation]:
    """The first stage's operations are timed once each (operation_table._time): the blocks' counts go into the work."""
    return [dataclasses.replace(op, flops=op.flops * op.count, bytes=op.bytes * op.count, count=1) for op in ops]


def _siglip(ctx: _Context, arch: Architecture, training: Training) -> list[Operation]:
    """SigLIP (transformers 5.23 modeling_siglip.py) and Gemma 3's projector: the Conv2d patch embedding, per
    block LayerNorms, q, k, v and o GEMMs, attention over the image's patches (non-causal), fc1, tanh GELU and
    fc2; the post-LayerNorm, the average pool and the projection of the pooled tokens to the text width."""
    per_image = _vision.patches_per_image(arch, image_size(arch, training))
    images = training.images_per_sample * training.micro_batch_size
    M = float(per_image * images)
    c, f, n, L = arch.vision_hidden_size, arch.vision_intermediate_size, arch.vision_num_heads, arch.vision_num_layers
    p = arch.vision_patch_size
    tokens = float(arch.vision_tokens_per_image * images)
    ops = _gemm(ctx, SCOPE, "vision patch embedding", M, _vision.CHANNELS * p * p, c, 1)
    ops += _elementwise(ctx, SCOPE, "vision LayerNorms", 2 * M * c, 2 * M * c, NORM_FLOPS, L, "2 norms of M*c", (), "layernorm")
    ops += _gemm(ctx, SCOPE, "vision q, k, v", M, c, 3 * c, L) + _gemm(ctx, SCOPE, "vision output projection", M, c, c, L)
    ops += _attention(ctx, M * per_image * 4 * c, M * 4 * c * ctx.B, L, per_image, c // n, "full")
    ops += _gemm(ctx, SCOPE, "vision fc1", M, c, f, L) + _gemm(ctx, SCOPE, "vision fc2", M, f, c, L)
    ops += _elementwise(ctx, SCOPE, "vision GELU", M * f, M * f, 8, L, "read M*f, write M*f", (), "gelu")
    return ops + _gemm(ctx, SCOPE, "vision projector", tokens, c, arch.hidden_size, 1)


def _llama4(ctx: _Context, arch: Architecture, training: Training) -> list[Operation]:
    """Llama 4 (transformers 5.23 modeling_llama4.py) per tile of N = (tile / patch)^2 + 1 positions: the patch
    linear, per block LayerNorms, q, k, v and o GEMMs, attention over the tile's positions (non-causal), fc1, GELU
    and fc2; the adapter's two GEMMs over the pixel-shuffled tokens (merge^2 c -> q -> q) and the projector
    (q -> h). Its encoder is Llama4VisionModel with the adapter; the projector alone stays trained when frozen."""
    tiles = _vision.tiles_per_image(arch, image_size(arch, training)) * training.images_per_sample \
        * training.micro_batch_size
    side = arch.vision_image_size // arch.vision_patch_size
    per_tile = side * side + 1
    M, tokens = float(per_tile * tiles), float(side * side // arch.vision_spatial_merge_size ** 2 * tiles)
    c, f, n, L, q = (arch.vision_hidden_size, arch.vision_intermediate_size, arch.vision_num_heads,
                     arch.vision_num_layers, arch.vision_projector_size)
    ops = _gemm(ctx, SCOPE, "vision patch embedding", M, _vision.CHANNELS * arch.vision_patch_size ** 2, c, 1)
    ops += _elementwise(ctx, SCOPE, "vision LayerNorms", 2 * M * c, 2 * M * c, NORM_FLOPS, L, "2 norms of M*c", (), "layernorm")
    ops += _gemm(ctx, SCOPE, "vision q, k, v", M, c, 3 * c, L) + _gemm(ctx, SCOPE, "vision output projection", M, c, c, L)
    ops += _attention(ctx, M * per_tile * 4 * c, M * 4 * c * ctx.B, L, per_tile, c // n, "full")
    ops += _gemm(ctx, SCOPE, "vision fc1", M, c, f, L) + _gemm(ctx, SCOPE, "vision fc2", M, f, c, L)
    ops += _elementwise(ctx, SCOPE, "vision GELU", M * f, M * f, 8, L, "read M*f, write M*f", (), "gelu")
    merged = arch.vision_spatial_merge_size ** 2 * c
    ops += _gemm(ctx, SCOPE, "vision adapter fc1", tokens, merged, q, 1) + _gemm(ctx, SCOPE, "vision adapter fc2",
                                                                                 tokens, q, q, 1)
    return ops + _gemm(ctx, SCOPE, "vision projector", tokens, q, arch.hidden_size, 1)


def _attention(ctx: _Context, flops: float, io: float, count: int, keys: int, d: int, label: str) -> list[Operation]:
    """Non-causal attention of M queries against `keys` keys each: 2*M*keys*d for QK^T and as much for PV,
    over all heads (4*M*keys*c); backward 2.5 x, as the text layers' flash attention."""
    def efficiency(direction):
        return kernels.attention_efficiency(ctx.gpu, ctx.framework, direction, keys, d)

    fwd = Operation(f"vision attention core ({label})", "forward", SCOPE, "attention", flops, io, ctx.peak,
                    ctx.bandwidth, count, f"4*M*keys*c, keys = {keys} per query", (), efficiency("forward"),
                    kernels.BANDWIDTH_EFFICIENCY)
    if not ctx.training:
        return [fwd]
    return [fwd, Operation(f"vision attention core ({label}) (backward)", "backward", SCOPE, "attention", 2.5 * flops,
                           2 * io, ctx.peak, ctx.bandwidth, count, "2.5 x forward (FlashAttention-2)", (),
                           efficiency("backward"), kernels.BANDWIDTH_EFFICIENCY)]


def vision_flops_per_token(ops: list[Operation], training: Training) -> float:
    """The tower's model FLOPs spread over the decoder's tokens, for MFU beside `model_flops_per_token`: its
    matmuls and attention, forward and backward as the operations count them (the attention's backward at the
    2 x forward that model FLOPs count, not the kernel's 2.5 x)."""
    if not ops:
        return 0.0
    flops = sum(op.flops * (0.8 if op.kind == "attention" and op.phase == "backward" else 1.0)
                for op in ops if op.kind in ("matmul", "attention"))
    return flops / (training.micro_batch_size * training.seq_len)
