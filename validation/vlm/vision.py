"""A vision-language training step's inputs, and the vision tower's CUDA path emulated for a CPU measurement.

What differs from a text step (validation/hf/step.py), and why:

- The batch: `images` images of `image_size` x `image_size` pixels per sample, as Qwen2.5-VL's processor
  gives them (transformers 5.23 Qwen2VLImageProcessor): each image one temporal patch of
  `temporal_patch_size` frames, a grid of (image_size / patch_size)^2 patches, the patches flattened to
  `pixel_values` (patches, channels x temporal x patch^2) in fp32, `image_grid_thw` (1, h, w) per image;
  the text's `input_ids` hold one image token per merged patch (patches / spatial_merge_size^2), in place.
  The decoder's positions are given as 3 x b x s (mrope's shape), as `get_rope_index` would build them.
- Data-dependent steps a fake tensor cannot take (`.tolist()` on the grid, the window index's loop) are
  computed by transformers' own `vision_utils` functions on real tensors before the step and handed to the
  vision tower as its precomputed kwargs (cu_seqlens, position_ids, window_index, cu_window_seqlens and the
  maxima); under fake tensors, tensors of the same shapes. `get_image_features` is replaced by the same
  three steps with the split sizes known (modeling_qwen2_5_vl.py Qwen2_5_VLModel.get_image_features).
- The vision tower's attention: `flash_attention_2`, FlashAttention-2's variable-length kernel over the
  packed windows and images (`FlashVarlen` below, the allocations of flash-attn v2.7's
  flash_attn_interface.py FlashAttnVarlenFunc and csrc/flash_attn/flash_api.cpp mha_varlen_fwd/bwd). Or, a run's
  `vision_attention` "sdpa", Qwen2.5-VL's tower as transformers runs it without flash-attn (what the lent GPUs
  ran): one SDPA call per window or image on the emulated FlashAttention-2 path, the outputs concatenated
  (`_known_split_lengths`).
- Gemma 3 (Gemma3Processor): every image at the tower's 896 px, mm_tokens_per_image tokens each; its SigLIP
  tower and its decoder both on flash_attention_2 (SDPA's sliding window needs a mask the harness does not
  emulate), the dense kernel's allocations those of PyTorch's FlashAttention-2 path; no token_type_ids.
- Under fake tensors the model is built without weight initialisation (`initialisation`), and its tied
  weights tied again; `freeze_encoder` freezes the encoder as LLaMA-Factory's freeze_vision_tower does.
"""

from __future__ import annotations

import os
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass

import torch
from torch._subclasses.fake_tensor import FakeTensor

from ..core.emulation import _ORIGINAL_SDPA, FlashAttention, _round_up


@dataclass(frozen=True)
class Grid:
    """One sample's images, as the processor lays them out."""
    images: int
    image_size: int
    patch: int
    temporal: int
    merge: int
    channels: int = 3

    @property
    def side(self) -> int:
        return self.image_size // self.patch

    @property
    def patches(self) -> int:  # per image
        return self.side * self.side

    @property
    def tokens(self) -> int:  # decoder tokens per image
        return self.patches // (self.merge * self.merge)


LLAMA4_MAX_SIDE_TILES = 4  # Llama4ImageProcessor max_patches 16: a square image on at most 4 x 4 tiles


def llama4_tiles(image_size: int, tile: int) -> int:
    """Llama 4's tiles for a square image (transformers 5.23 image_processing_llama4.py get_best_fit: the smallest
    n x n canvas of tiles that holds it, n <= 4; the global tile beside more than one)."""
    side = min(-(-image_size // tile), LLAMA4_MAX_SIDE_TILES)
    return side * side + (1 if side > 1 else 0)


def grid_of(config, images: int, image_size: int) -> Grid:
    vc = config.vision_config
    if config.model_type == "llama4":  # tiles of vc.image_size, each pixel-shuffled to 1 / ratio^2 fewer tokens
        return Grid(images, image_size, vc.patch_size, 1, round(1 / vc.pixel_shuffle_ratio), vc.num_channels)
    if config.model_type == "gemma3":  # every image at the tower's size, pooled to mm_tokens_per_image
        if image_size != vc.image_size:
            raise ValueError(f"Gemma 3 takes images of {vc.image_size} px")
        merge = vc.image_size // vc.patch_size // int(config.mm_tokens_per_image ** 0.5)
        return Grid(images, image_size, vc.patch_size, 1, merge, vc.num_channels)
    grid = Grid(images, image_size, vc.patch_size, vc.temporal_patch_size, vc.spatial_merge_size, vc.in_channels)
    if image_size % (grid.patch * grid.merge):
        raise ValueError(f"image_size {image_size} is not a multiple of patch x merge ({grid.patch * grid.merge})")
    return grid


def _precomputed(config, grid_thw: torch.Tensor) -> dict:
    """The vision tower's data-dependent inputs, by transformers' own functions, on real tensors."""
    from transformers import vision_utils as vu

    vc = config.vision_config
    cu = vu.get_vision_cu_seqlens(grid_thw)
    window_index, cu_window = vu.get_vision_window_index(grid_thw, vc.spatial_merge_size, vc.window_size, vc.patch_size)
    return dict(cu_seqlens=cu, position_ids=vu.get_vision_position_ids(grid_thw, vc.spatial_merge_size),
                window_index=window_index, cu_window_seqlens=cu_window,
                max_seqlen=int((cu[1:] - cu[:-1]).max()), max_window_seqlen=int((cu_window[1:] - cu_window[:-1]).max()))


def batch(config, grid: Grid, micro_batch: int, seq_len: int, fake: bool) -> tuple[dict, dict, list[int]]:
    """The model's inputs, the vision tower's precomputed kwargs and the split sizes (per image)."""
    n = micro_batch * grid.images
    if config.model_type == "gemma3":
        return _gemma3_batch(config, grid, micro_batch, seq_len, n)
    if config.model_type == "llama4":
        return _llama4_batch(config, grid, micro_batch, seq_len, n)
    with _real():
        grid_thw = torch.tensor([[1, grid.side, grid.side]] * n)
        vision = _precomputed(config, grid_thw)
        lengths = {key: (vision[key][1:] - vision[key][:-1]).tolist() for key in ("cu_seqlens", "cu_window_seqlens")}
    if grid.images * grid.tokens >= seq_len:
        raise ValueError(f"{grid.images} images of {grid.tokens} tokens do not fit in {seq_len} tokens")
    input_ids = torch.randint(0, 151643, (micro_batch, seq_len))  # text tokens below Qwen's special tokens
    input_ids[:, 1:1 + grid.images * grid.tokens] = config.image_token_id  # after the first text token
    pixel_values = torch.randn(n * grid.patches, grid.channels * grid.temporal * grid.patch * grid.patch)
    positions = torch.arange(seq_len).view(1, 1, -1).expand(3, micro_batch, -1)
    grid_in = torch.zeros((n, 3), dtype=torch.long) if fake else grid_thw
    if fake:  # tensors of the same shapes: the step never reads their values under fake tensors
        vision = {k: (torch.zeros(v.shape, dtype=v.dtype) if torch.is_tensor(v) else v) for k, v in vision.items()}
        for key, split in lengths.items():  # but SDPA's split reads the lengths (_known_split_lengths)
            setattr(vision[key], SPLIT_LENGTHS, split)
    inputs = dict(input_ids=input_ids, labels=input_ids, pixel_values=pixel_values, image_grid_thw=grid_in,
                  position_ids=positions)
    return inputs, vision, [grid.tokens] * n


def _gemma3_batch(config, grid: Grid, micro_batch: int, seq_len: int, n: int) -> tuple[dict, dict, list[int]]:
    """Gemma 3 (transformers 5.23 Gemma3Processor): pixel_values (images, 3, size, size) in fp32, mm_tokens_per_image
    image tokens per image in input_ids; no token_type_ids (their bidirectional image blocks need a 4-D mask)."""
    if grid.images * grid.tokens >= seq_len:
        raise ValueError(f"{grid.images} images of {grid.tokens} tokens do not fit in {seq_len} tokens")
    input_ids = torch.randint(0, 262144, (micro_batch, seq_len))  # below Gemma's image token
    input_ids[:, 1:1 + grid.images * grid.tokens] = config.image_token_id
    pixel_values = torch.randn(n, grid.channels, grid.image_size, grid.image_size)
    return dict(input_ids=input_ids, labels=input_ids, pixel_values=pixel_values), {}, []


def _llama4_batch(config, grid: Grid, micro_batch: int, seq_len: int, n: int) -> tuple[dict, dict, list[int]]:
    """Llama 4 (transformers 5.23 Llama4Processor): pixel_values (tiles, 3, tile, tile) in the vision model's dtype
    (as its examples pass them: the tower does not cast them), (tile / patch)^2 / merge^2 image tokens per tile in
    input_ids (the tile separators and image start and end markers are text tokens)."""
    vc = config.vision_config
    tiles = llama4_tiles(grid.image_size, vc.image_size)
    tokens = tiles * (vc.image_size // vc.patch_size) ** 2 // grid.merge ** 2
    if grid.images * tokens >= seq_len:
        raise ValueError(f"{grid.images} images of {tokens} tokens do not fit in {seq_len} tokens")
    input_ids = torch.randint(0, 200000, (micro_batch, seq_len))  # below Llama 4's special tokens
    input_ids[:, 1:1 + grid.images * tokens] = config.image_token_index
    dtype = torch.get_default_dtype() if config.vision_config.dtype is None else config.vision_config.dtype
    pixel_values = torch.randn(n * tiles, grid.channels, vc.image_size, vc.image_size, dtype=dtype)
    return dict(input_ids=input_ids, labels=input_ids, pixel_values=pixel_values), {}, []


def freeze_encoder(model) -> None:
    """The vision encoder frozen as LLaMA-Factory's freeze_vision_tower does (requires_grad False; the optimizer
    gets the trained parameters only): Qwen2.5-VL's patch embedding and blocks (its merger trained), Gemma 3's
    SigLIP tower (its multi_modal_projector trained)."""
    if model.config.model_type == "llama4":  # Llama4VisionModel (its adapter included); the projector trained
        parts = [model.vision_model]
    else:
        parts = ([model.model.vision_tower] if model.config.model_type == "gemma3"
                 else [model.model.visual.patch_embed, model.model.visual.blocks])
    for part in parts:
        part.requires_grad_(False)


def initialisation(config):
    """Under fake tensors, a vision-language model is built without its weights' initialisation: SigLIP's
    lecun_normal_ (torch's trunc_normal_) reads a value no fake tensor has, and no value is needed there."""
    from transformers.initialization import no_init_weights

    fake = isinstance(torch.empty(0), FakeTensor)
    return no_init_weights() if fake and hasattr(config, "vision_config") else nullcontext()


@contextmanager
def _real():
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    with unset_fake_temporarily():
        yield


class FlashVarlen(torch.autograd.Function):
    """FlashAttention-2's variable-length kernel as transformers' flash_attention_2 calls it on packed
    sequences (q, k, v of 1 x heads x total x d, one sequence per window or image)."""

    @staticmethod
    def forward(ctx, q4, k4, v4, cu, scale, hidden):
        h, d = q4.shape[1], q4.shape[3]
        # flash_attention_forward: (b, s, h, d) views; _flash_attention_forward: reshape(-1, h, d) for varlen
        q, k, v = (x.transpose(1, 2).reshape(-1, h, d) for x in (q4, k4, v4))
        q, k, v = (x if x.stride(-1) == 1 else x.contiguous() for x in (q, k, v))  # maybe_contiguous
        total = q.shape[0]
        out = torch.empty_like(q)  # mha_varlen_fwd
        lse = q.new_empty((h, total), dtype=torch.float32)  # softmax_lse, unpadded
        rng = q.new_empty((2,), dtype=torch.int64)  # rng_state
        if not isinstance(q, FakeTensor):
            with hidden(), torch.no_grad():
                out.copy_(_reference(q, k, v, cu, scale))
        ctx.save_for_backward(q, k, v, out, lse, rng, cu)
        ctx.scale, ctx.hidden, ctx.shape = scale, hidden, q4.shape
        return out.view(1, total, h, d)

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v, out, lse, rng, cu = ctx.saved_tensors
        total, h, d = q.shape
        dout = grad_out.reshape(total, h, d)
        dout = dout if dout.stride(-1) == 1 else dout.contiguous()
        dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)  # FlashAttnVarlenFunc.backward
        sequences = cu.shape[0] - 1
        # mha_varlen_bwd: softmax_d and the fp32 dq accumulator, 128 rows of padding per sequence
        softmax_d = q.new_empty((h, total + 128 * sequences), dtype=torch.float32)
        dq_accum = q.new_empty((h, total + 128 * sequences, _round_up(d, 32)), dtype=torch.float32)
        if not isinstance(q, FakeTensor):
            with ctx.hidden(), torch.enable_grad():
                leaves = [x.detach().requires_grad_() for x in (q, k, v)]
                grads = torch.autograd.grad(_reference(*leaves, cu, ctx.scale), leaves, dout)
                for buf, g in zip((dq, dk, dv), grads):
                    buf.copy_(g)
        del softmax_d, dq_accum, dout
        back = lambda x: x.view(1, total, h, d).transpose(1, 2)  # noqa: E731
        return back(dq), back(dk), back(dv), None, None, None


def _reference(q, k, v, cu, scale):
    """Attention within each packed sequence (no mask across them): the values of a real CPU run."""
    bounds = cu.tolist()
    outs = [_ORIGINAL_SDPA(*(x[a:b].transpose(0, 1) for x in (q, k, v)), scale=scale).transpose(0, 1)
            for a, b in zip(bounds[:-1], bounds[1:])]
    return torch.cat(outs, dim=0)


def _flash_attention_2(hidden):
    """transformers' flash_attention_2 interface (q, k, v of b x heads x s x d in, b x s x heads x d out): the
    varlen kernel over packed sequences (`FlashVarlen`), else flash_attn_func, whose allocations are PyTorch's
    FlashAttention-2 path's (validation/core/emulation.py FlashAttention: q, k, v, out and the fp32 lse kept;
    GQA's expanded dK/dV in backward). A sliding window or soft-cap changes no allocation; a real run's values
    come from full causal attention (the tests compare memory there, not numbers)."""
    def attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, cu_seq_lens_q=None,
                  is_causal=None, **kwargs):
        causal = is_causal if is_causal is not None else getattr(module, "is_causal", False)
        if attention_mask is not None or dropout:
            raise NotImplementedError("only unmasked flash attention without dropout is emulated")
        if cu_seq_lens_q is not None:
            if causal:
                raise NotImplementedError("only the vision tower's non-causal packed call is emulated")
            return FlashVarlen.apply(query, key, value, cu_seq_lens_q, scaling, hidden), None
        return FlashAttention.apply(query, key, value, scaling, causal, hidden).transpose(1, 2), None

    return attention


@contextmanager
def _check_disabled():
    saved = os.environ.get("TRANSFORMERS_DISABLE_TORCH_CHECK")
    os.environ["TRANSFORMERS_DISABLE_TORCH_CHECK"] = "1"
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop("TRANSFORMERS_DISABLE_TORCH_CHECK", None)
        else:
            os.environ["TRANSFORMERS_DISABLE_TORCH_CHECK"] = saved


# the attribute `batch` gives a fake cu_seqlens: the lengths of its sequences, from the real one
SPLIT_LENGTHS = "split_lengths"
# The attention a vision tower runs: flash-attn's kernel where the package is installed, else SDPA
VISION_ATTENTIONS = ("flash_attention_2", "sdpa")


@contextmanager
def _known_split_lengths():
    """Qwen2.5-VL's tower without flash_attention_2 (transformers 5.17 / 5.23 Qwen2_5_VLVisionAttention.forward,
    its "other implementations" branch) splits q, k and v at `(cu_seqlens[1:] - cu_seqlens[:-1]).tolist()`, one
    SDPA call per window or image, and concatenates the outputs. A fake tensor has no values to list: while a
    vision attention runs, the lengths of the cu_seqlens it was given (the precomputed windows' or images', known
    on real tensors before the step) stand in for them. Real tensors list themselves."""
    from transformers.models.qwen2_5_vl import modeling_qwen2_5_vl as qwen

    current: list = []
    # FakeTensor's own tolist (torch/_subclasses/fake_tensor.py) raises for want of values
    saved_forward, saved_tolist = qwen.Qwen2_5_VLVisionAttention.forward, FakeTensor.tolist

    def forward(self, hidden_states, cu_seqlens, *args, **kwargs):
        current.append(getattr(cu_seqlens, SPLIT_LENGTHS, None))  # set by `batch` on the fake cu_seqlens
        try:
            return saved_forward(self, hidden_states, cu_seqlens, *args, **kwargs)
        finally:
            current.pop()

    def tolist(self):
        if current and current[-1] is not None and self.dim() == 1 and self.shape[0] == len(current[-1]):
            return list(current[-1])
        return saved_tolist(self)

    qwen.Qwen2_5_VLVisionAttention.forward, FakeTensor.tolist = forward, tolist
    try:
        yield
    finally:
        qwen.Qwen2_5_VLVisionAttention.forward, FakeTensor.tolist = saved_forward, saved_tolist


@contextmanager
def vision_emulation(tracker, model, vision: dict, splits: list[int], attention: str = "flash_attention_2"):
    """For the duration of a measured VLM step: the vision tower (and Gemma 3's decoder) on flash_attention_2
    when the model runs SDPA, the emulated kernels under that name, Qwen's precomputed vision inputs, and
    transformers' placeholder count check (which reads a tensor's value) turned off by its own switch
    (TRANSFORMERS_DISABLE_TORCH_CHECK). `attention` "sdpa": what a GPU without flash-attn runs, the tower left
    on SDPA (Qwen2.5-VL's one unmasked call per window or image, the emulated FlashAttention-2 path of
    validation/core/emulation.py: `_known_split_lengths`); Gemma 3's decoder on SDPA needs the sliding window's
    4-D mask, whose masked path the harness does not emulate, so Gemma 3 has no such run."""
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
    from transformers.models.qwen2_5_vl import modeling_qwen2_5_vl as qwen

    if attention not in VISION_ATTENTIONS:
        raise ValueError(f"vision attention {attention!r}: one of {VISION_ATTENTIONS}")
    gemma = model.config.model_type == "gemma3"
    if model.config.model_type == "llama4":  # its tower runs SDPA unmasked (the emulated flash path) as it is
        with _check_disabled():
            yield
        return
    if attention == "sdpa" and gemma:
        raise NotImplementedError("Gemma 3 on SDPA: its sliding-window layers take a 4-D mask (SDPA's masked "
                                  "path), which the harness does not emulate")

    def get_image_features(self, pixel_values, image_grid_thw=None, **kwargs):
        pixel_values = pixel_values.type(self.visual.dtype)
        outputs = self.visual(pixel_values, grid_thw=image_grid_thw, **dict(vision), **kwargs)
        outputs.pooler_output = torch.split(outputs.pooler_output, splits)
        return outputs

    saved_fn = ALL_ATTENTION_FUNCTIONS._global_mapping.get("flash_attention_2")
    saved_features = qwen.Qwen2_5_VLModel.get_image_features
    saved_env = os.environ.get("TRANSFORMERS_DISABLE_TORCH_CHECK")
    # the configs the attention modules (and, for Gemma 3's decoder, the mask builder) read at each call: Qwen's
    # vision tower; Gemma 3's tower and decoder (SDPA's sliding window needs a mask the harness does not emulate)
    scope = model if gemma else model.model.visual
    configs = list({id(c): c for c in [getattr(m, "config", None) for m in scope.modules()] + [model.config]
                    if c is not None and hasattr(c, "_attn_implementation_internal")}.values())
    configs = configs if gemma else [c for c in configs if c is not model.config]
    configs = configs if attention == "flash_attention_2" else []
    saved_impl = [c._attn_implementation_internal for c in configs]
    for config in configs:
        if config._attn_implementation_internal == "sdpa":
            config._attn_implementation_internal = "flash_attention_2"
    ALL_ATTENTION_FUNCTIONS._global_mapping["flash_attention_2"] = _flash_attention_2(tracker.hidden)
    if not gemma:
        qwen.Qwen2_5_VLModel.get_image_features = get_image_features
    os.environ["TRANSFORMERS_DISABLE_TORCH_CHECK"] = "1"
    try:
        with _known_split_lengths() if attention == "sdpa" else nullcontext():
            yield
    finally:
        ALL_ATTENTION_FUNCTIONS._global_mapping["flash_attention_2"] = saved_fn
        for config, impl in zip(configs, saved_impl):
            config._attn_implementation_internal = impl
        qwen.Qwen2_5_VLModel.get_image_features = saved_features
        if saved_env is None:
            os.environ.pop("TRANSFORMERS_DISABLE_TORCH_CHECK", None)
        else:
            os.environ["TRANSFORMERS_DISABLE_TORCH_CHECK"] = saved_env
