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
