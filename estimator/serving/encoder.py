"""A vision-language model's encoder in vLLM (issue 28): its weights and its share of the profiling run.

Weights: vLLM builds the vision tower on every pipeline rank (model_executor/models/gemma3_mm.py and
qwen2_5_vl.py build it in __init__ without a pipeline check) and shards its linears over TP by default
(mm_encoder_tp_mode "weights": QKVParallelLinear / ColumnParallelLinear / RowParallelLinear in siglip.py and
qwen2_5_vl.py), in the model dtype.

Profiling (v1/worker/gpu_model_runner.py profile_run; the budget in 0.11 v1/worker/utils.py MultiModalBudget,
0.33 multimodal/encoder_budget.py, alike): each modality's largest item in tokens (the registry's
get_mm_max_contiguous_tokens: placeholder tokens included); encoder budget = max(max_num_batched_tokens, that)
(SchedulerConfig sets max_num_encoder_input_tokens and encoder_cache_size to max_num_batched_tokens); items =
max(1, min(budget // tokens, max_num_seqs x max(1, min(999, max_model_len // tokens)))) (999: the default
limit per prompt). The encoder runs over them at once, then its outputs stay in the encoder cache through the
decoder's dummy run and the sampler's, as do the batch's pixels (profile_run keeps batched_dummy_mm_inputs until
it returns; in the model dtype, to which vLLM casts the processor's float32 output: 0.11.0
multimodal/processing.py, 0.33.0 multimodal/processing/context.py _postprocess_output). vLLM 0.11 first copies
each output into a (budget, hidden) buffer when it has fewer rows than the budget ("expanded_outputs"); 0.15
keeps the outputs as they are.

Llama 4 (vLLM mllama4.py): its dummy image is 16 tiles tall and one wide (get_image_size_with_most_features: h:w =
16:1, max_patches 16), so 16 tiles and the global one, 144 tokens each (get_patch_per_chunk: (336 / 14)^2 / 4),
framed as transformers' Llama4Processor._prompt_split_image writes it: <|image_start|>, per tile row its 144 patch
tokens and a <|tile_y_separator|>, <|image|>, the global tile's 144 and <|image_end|>: 17 x 144 + 19 = 2,467
contiguous tokens, 2,448 of them encoder outputs. Its linears are split over TP (ColumnParallelLinear for the patch
embedding, the adapter's fc1 and the projector; QKVParallelLinear / RowParallelLinear in the blocks; RowParallelLinear
for the adapter's fc2); the position table and the class token are plain parameters.

Modelled for SigLIP (Gemma 3): one image is 256 image tokens inside "\\n\\n<start_of_image>...<end_of_image>\\n\\n"
(transformers Gemma3Processor.full_image_sequence; vLLM gemma3_mm.py get_image_repl without pan-and-scan),
260 contiguous tokens with Gemma's tokenizer ("\\n\\n" is one token). And for Qwen2.5-VL: its largest item is
a dummy video of up to 14 frames of 3,584 x 3,584 sized by max_model_len (serving/qwen_vl_profile.py); its
placeholder tokens are the item's tokens.

--limit-mm-per-prompt (serving.limit_mm_per_prompt, spec/mm_limits.py) enters three ways, alike in 0.11.0 and
0.33.0: a modality at 0 leaves the budget (its items are not profiled; the largest remaining one is), the per-prompt
limit caps max_items_per_prompt above, and 0 for every modality leaves the budget empty (compute_mm_encoder_budget
returns (0, 0): v1/core/encoder_cache_manager.py), so profile_run skips the encoder. The tower itself is then not
built for Qwen2.5-VL (0.11.0 qwen2_5_vl.py sets self.visual = None when neither image nor video is allowed; 0.33.0
_mark_tower_model in model_executor/models/interfaces.py), nor, from 0.33.0, for Gemma 3 (its tower and projector
sit in _mark_tower_model(vllm_config, "image") in gemma3_mm.py; 0.11.0 builds them regardless).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..spec import vision as _vision
from ..spec.architecture import Architecture
from ..spec.mm_limits import limits_for
from ..spec.serving import version_tuple
from . import qwen_vl_profile as _qwen

GEMMA3_FRAMING_TOKENS = 4  # "\n\n", <start_of_image>, <end_of_image>, "\n\n"


@dataclass(frozen=True)
class EncoderProfile:
    items: int
    tokens_per_item: int
    budget: int
    forward_bytes: int  # the encoder's forward over the items
    cache_bytes: int  # its outputs, kept through the decoder's dummy run
    formula: str


def outputs_expanded(engine_version: str | None) -> bool:
    """0.11's profile_run copies each encoder output into a (budget, hidden) buffer ("expanded_outputs"); 0.15.0's
    caches them as they are (v1/worker/gpu_model_runner.py). None: the newest release."""
    return engine_version is not None and version_tuple(engine_version)[:2] < (0, 15)


# SigLIP's tensors vLLM splits over TP (siglip.py: QKVParallelLinear, RowParallelLinear, ColumnParallelLinear, the
# position table a VocabParallelEmbedding); the Conv2d patch embedding, the norms, the biases (a few kB) and Gemma 3's
# projector (a plain Parameter) are counted whole
_TP_SPLIT = {"vision_qkvo", "vision_fc1", "vision_fc2", "vision_position_embedding",
             # Qwen2.5-VL (qwen2_5_vl.py): QKVParallelLinear qkv, MergedColumnParallelLinear gate_up and the merger's
             # ColumnParallelLinear fc1 split weights and biases; the RowParallelLinear proj, down and fc2 split their
             # weights only; the Conv3d patch embedding and the RMSNorms are whole
             "vision_qkv", "vision_qkv_bias", "vision_proj", "vision_mlp_gate_up", "vision_mlp_gate_up_bias",
             "vision_mlp_down", "vision_merger_fc1", "vision_merger_fc1_bias", "vision_merger_fc2"}
# Llama 4's (mllama4.py): the blocks' and the adapter's linears, the patch embedding and the projector; the biases,
# norms, class token and position table whole
_LLAMA4_TP_SPLIT = {"vision_qkvo", "vision_fc1", "vision_fc2", "vision_patch_embed", "vision_adapter_fc1",
                    "vision_adapter_fc2", "vision_projector"}
LLAMA4_TILES = 17  # the dummy image: 16 tiles and the global one
LLAMA4_FRAMING_TOKENS = 19  # <|image_start|>, 16 <|tile_y_separator|>, <|image|>, <|image_end|>


def modality_limits(arch: Architecture, limit_mm_per_prompt: str | None) -> dict[str, int]:
    """Each modality the model takes and its --limit-mm-per-prompt ({} for a text-only model, which refuses any
    limit): SigLIP (Gemma 3) and Llama 4 take images, Qwen2.5-VL images and videos (vLLM's supported_mm_limits)."""
    supported = {_vision.SIGLIP: ("image",), _vision.QWEN2_5_VL: ("image", "video"),
                 _vision.LLAMA4: ("image",)}.get(arch.vision_tower, ())  # mllama4.py get_supported_mm_limits
    return limits_for(limit_mm_per_prompt, supported, arch.name or "this model")


def tower_built(arch: Architecture, limits: dict[str, int], engine_version: str | None) -> bool:
    """Whether vLLM builds (and loads) the vision tower: not when every modality's limit is 0, for Qwen2.5-VL in
    0.11 and for every tower from 0.33 (the module docstring). Releases between follow 0.11. None: the newest."""
    if arch.vision_tower is None:
        return False
    if any(limits.values()):
        return True
    newest = engine_version is None or version_tuple(engine_version)[:2] >= (0, 33)
    return not (newest or arch.vision_tower == _vision.QWEN2_5_VL)


def encoder_weights(arch: Architecture, tp: int, dtype_bytes: int) -> int:
    """The tower and projector on one rank, in the model dtype."""
    split = _LLAMA4_TP_SPLIT if arch.vision_tower == _vision.LLAMA4 else _TP_SPLIT
    return int(round(sum(t.numel * dtype_bytes / (tp if t.name in split else 1) for t in arch.vision_tensors())))


def _item(arch: Architecture) -> tuple[int, int, int]:
    """(encoder output rows, contiguous tokens, patches the tower runs) of the profile's dummy image."""
    if arch.vision_tower == _vision.LLAMA4:
        side = arch.vision_image_size // arch.vision_patch_size
        embed = LLAMA4_TILES * side * side // arch.vision_spatial_merge_size ** 2
        return embed, embed + LLAMA4_FRAMING_TOKENS, LLAMA4_TILES * (side * side + 1)
    embed = arch.vision_tokens_per_image
    return embed, embed + GEMMA3_FRAMING_TOKENS, _vision.patches_per_image(arch, arch.vision_image_size)


def encoder_profile(arch: Architecture, max_num_batched_tokens: int, max_num_seqs: int, max_model_len: int,
                    tp: int, act_bytes: int, engine_version: str | None,
                    limits: dict[str, int] | None = None) -> EncoderProfile | None:
    """The encoder's part of the profiling run on a rank that runs it, by vLLM release (None: the newest), under
    the per-prompt limits of modality_limits (None: vLLM's defaults); None for a text-only model or when every
    limit is 0 (no encoder profile)."""
    if arch.vision_tower is None:
        return None
    limits = modality_limits(arch, None) if limits is None else limits
    enabled = frozenset(m for m, n in limits.items() if n > 0)
    if not enabled:
        return None
    expanded = outputs_expanded(engine_version)
    if arch.vision_tower == _vision.QWEN2_5_VL:
        return _qwen_profile(arch, max_num_batched_tokens, max_num_seqs, max_model_len, tp, act_bytes, engine_version,
                             limits, enabled)
    embed, tokens, per_item = _item(arch)
    items, budget = _items(tokens, max_num_batched_tokens, max_num_seqs, max_model_len, limits["image"])
    c, f, p = arch.vision_hidden_size, arch.vision_intermediate_size, arch.vision_patch_size
    patches = items * per_item
    pixels = _vision.CHANNELS * p * p
    # a block's moment: the residual and its norm (2c), then q, k, v and the attention output (4c / TP) or fc1's
    # output and the GELU's (2f / TP), beside the pixels in the model dtype; Llama 4's vision rotary multiplies
    # q and k as fp32 complex numbers (mllama4.py apply_rotary_emb: their fp32 copies and products, 16c / TP bytes)
    rotary = 16 * c if arch.vision_tower == _vision.LLAMA4 else 0
    forward = patches * ((pixels + 2 * c) * act_bytes + max(4 * c * act_bytes + rotary, 2 * f * act_bytes) // tp)
    rows = max(embed, budget) if expanded else embed
    cache = (items * rows * arch.hidden_size + items * _pixels_per_item(arch)) * act_bytes
    formula = (f"{items} images of {tokens} tokens (budget max(max_num_batched_tokens, {tokens}) = {budget:,}): "
               f"encoder forward {patches:,} patches x ((pixels {pixels} + 2c) x {act_bytes} B + max(4c x {act_bytes} B"
               f"{' + 16c B fp32 rotary' if rotary else ''}, 2f x {act_bytes} B)/TP); "
               f"cache ({items} x {rows:,} rows{' (0.11: expanded to the budget)' if expanded and rows > embed else ''}"
               f" x h + the pixels) x {act_bytes} B")
    return EncoderProfile(items, tokens, budget, int(forward), int(cache), formula)


def _pixels_per_item(arch: Architecture) -> int:
    """The dummy image's pixel values as the processor hands them over: Llama 4's tiles of image_size^2 (the class
    token is no pixel), SigLIP's patches."""
    if arch.vision_tower == _vision.LLAMA4:
        return LLAMA4_TILES * _vision.CHANNELS * arch.vision_image_size ** 2
    return _vision.patches_per_image(arch, arch.vision_image_size) * _vision.CHANNELS * arch.vision_patch_size ** 2


def _items(tokens: int, max_num_batched_tokens: int, max_num_seqs: int, max_model_len: int,
           limit: int) -> tuple[int, int]:
    """(items per batch, encoder budget) for items of `tokens` placeholder tokens, `limit` per prompt
    (MultiModalBudget get_max_items; chunked prefill on, the V1 default, so max_num_seqs is not cut by
    max_num_batched_tokens)."""
    budget = max(max_num_batched_tokens, tokens)
    per_prompt = max(1, min(limit, max_model_len // tokens))
    return max(1, min(budget // tokens, max_num_seqs * per_prompt)), budget


def _qwen_profile(arch: Architecture, max_num_batched_tokens: int, max_num_seqs: int, max_model_len: int, tp: int,
                  act_bytes: int, engine_version: str | None, limits: dict[str, int],
                  enabled: frozenset[str]) -> EncoderProfile:
    """Qwen2.5-VL: the dummy video (or image) through the tower; its outputs (one row per token, 0.11 expanded to
    the budget) and the batch's pixels held through the decoder's dummy run."""
    item = _qwen.dummy_item(arch, max_model_len, enabled)
    # a tie of image and video (max_model_len under 32,768) allows one item per prompt whichever limit applies
    # (max_model_len // 16,384 = 1), so the image's stands for both
    limit = limits["video" if item.modality == "video" else "image"]
    items, budget = _items(item.tokens, max_num_batched_tokens, max_num_seqs, max_model_len, limit)
    patches = items * item.patches
    fp32_rotary = _qwen.rotary_in_fp32(engine_version)
    forward = patches * _qwen.forward_bytes_per_patch(arch, tp, act_bytes, fp32_rotary)
    rows = max(item.tokens, budget) if outputs_expanded(engine_version) else item.tokens
    cache = items * rows * arch.hidden_size * act_bytes + _qwen.pixel_bytes(arch, patches, act_bytes)
    what = {"video": f"{item.frames}-frame video", "image": "image"}.get(item.modality, "image (or 2-frame video)")
    attention = f"10c + 4c x 4 B / {act_bytes} B" if fp32_rotary else "7c"
    formula = (f"{items} x {what} of {item.width} x {item.height}: {item.tokens:,} tokens (budget {budget:,}); "
               f"encoder forward {patches:,} patches x (pixels + 2c + max(attention "
               f"{attention}, MLP 3f)/TP) x {act_bytes} B; "
               f"cache ({items} x {rows:,} rows x h + the pixels) x {act_bytes} B")
    return EncoderProfile(items, item.tokens, budget, int(forward), int(cache), formula)
