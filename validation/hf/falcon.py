"""Falcon on `flash_attention_2` (transformers 5.23 models/falcon/modeling_falcon.py FalconFlashAttention2).

FalconFlashAttention2.forward (lines 429-512) calls the module's own `_flash_attention_forward`, imported only
where flash-attn is installed (lines 51-52), with q, k, v of b x s x heads x d: the transposes back of the
rotary outputs (lines 461-463), k and v at one head (Falcon-7B's multi_query) or, with the new decoder
architecture, at every query head (`num_kv_heads = self.num_heads`, line 442, the broadcast k and v of
`_split_heads` flattened into copies, lines 254-263). With no padding mask and no dropout that is flash-attn's
`flash_attn_func`, whose allocations the harness emulates as PyTorch's FlashAttention-2 path's
(validation/core/emulation.py FlashAttention; validation/vlm/vision.py `_flash_attention_2` for the dense
call): q, k, v, the output and the fp32 log-sum-exp kept, backward's dq, dk, dv, dq_accum, softmax_d and, for
fewer key/value heads, the expanded dK, dV. The output's reshape (line 506) is a view, `dense` reads it.

Falcon on SDPA (attn_implementation "sdpa", transformers' default) is measured (the H200's sdpa-mask experiment,
tests/test_gpu_sdpa_mask.py) and modelled (estimator/memory/activations/sdpa_math.py, `Architecture.
sdpa_mask_always`). FalconModel builds its mask with allow_is_causal_skip=False
(modeling_falcon.py lines 755-761: "Always materialize the mask so alibi can be added"), so FalconAttention calls
SDPA with a 4-D mask and is_causal False (lines 333-342), which rules out SDPA's flash backend (torch 2.13
aten/src/ATen/native/transformers/cuda/sdp_utils.cpp: check_for_attn_mask among flash's constraints). Falcon-7B hands
it q of 71 heads and k, v of one (line 442: num_kv_heads 1) without enable_gqa: sdp_utils_cpp.h
check_batch_size_and_num_heads_dense requires equal head counts unless enable_gqa, for every fused backend
(memory-efficient and cuDNN included), so SDPA runs its math backend, which upcasts bf16 q, k, v to fp32
(attention.cpp _scaled_dot_product_attention_math, allowFP16BF16ReductionMathSDP off by default) and keeps fp32 q, k,
v and the fp32 softmax: 1,229,455,360 B a layer at s 2048 on the H200 (torch 2.11), 32 times the flash set. The new
architecture hands it k, v at every query head (equal counts): cuDNN or the memory-efficient kernel by torch's order
(estimator/memory/activations/sdpa_mask.py sdpa_backend) with the mask as a per-call bias, as sdpa_mask.py describes
for sliding windows.
The harness emulates the math path as the H200 ran it (validation/core/emulation.py `_masked_math_sdpa`: the
records falcon-7b-8layers-bf16-adamw-norecompute-sdpa-*), not the masked fused one (it raises on any other mask).
"""

from __future__ import annotations

from contextlib import contextmanager

from ..core.emulation import FlashAttention

_MISSING = object()
FLASH = "flash_attention_2"


def to_flash(model) -> None:
    """Build on SDPA, then run as flash_attention_2: transformers refuses that name at build time without
    flash-attn (modeling_utils `_flash_attn_can_dispatch`), and Falcon picks the attention class at build time
    (FalconDecoderLayer.__init__, FALCON_ATTENTION_CLASSES). FalconFlashAttention2 keeps FalconAttention's
    weights and adds one flag, `_flash_attn_uses_top_left_mask` (False for flash-attn >= 2.1)."""
    from transformers.models.falcon import modeling_falcon as falcon

    for module in model.modules():
        if type(module) is falcon.FalconAttention:
            module.__class__ = falcon.FalconFlashAttention2
            module._flash_attn_uses_top_left_mask = False
    for config in {id(m.config): m.config for m in model.modules() if hasattr(m, "config")}.values():
        config._attn_implementation_internal = FLASH


def _flash_attention_forward(hidden):
    def forward(query, key, value, attention_mask, query_length, is_causal, dropout=0.0, position_ids=None,
                softmax_scale=None, **kwargs):
        # the harness's batch: no padding mask, arange position ids (no packed sequences), attention_dropout 0
        if attention_mask is not None or dropout:
            raise NotImplementedError("only unmasked flash attention without dropout is emulated")
        q, k, v = (x.transpose(1, 2) for x in (query, key, value))
        return FlashAttention.apply(q, k, v, softmax_scale, is_causal, hidden).transpose(1, 2)

    return forward


@contextmanager
def falcon_flash(tracker):
    """Falcon's `_flash_attention_forward` as the emulated kernel, while a flash_attention_2 run lasts."""
    from transformers.models.falcon import modeling_falcon as falcon

    saved = getattr(falcon, "_flash_attention_forward", _MISSING)
    falcon._flash_attention_forward = _flash_attention_forward(tracker.hidden)
    try:
        yield
    finally:
        if saved is _MISSING:
            del falcon._flash_attention_forward
        else:
            falcon._flash_attention_forward = saved
