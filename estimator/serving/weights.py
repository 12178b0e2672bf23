"""The weights one GPU holds once vLLM has loaded them, per weight format, TP rank and PP stage.

vLLM builds every linear layer with its quantization method's ``create_weights`` and converts the
tensors after loading (``process_weights_after_loading``); ``model_memory_usage`` is what the load left
allocated. Per format, the bytes of one linear weight of (out, in) on a rank, after conversion:

- bf16 / fp16: 2 x out x in (UnquantizedLinearMethod).
- fp8: 1 byte per weight and one fp32 scale per matrix (Fp8LinearMethod, per-tensor); a checkpoint
  with ``weight_block_size`` [128, 128] (DeepSeek-V3) keeps an fp32 ``weight_scale_inv`` per block, a
  compressed-tensors one with strategy "channel" an fp32 scale per output row.
- int8 (w8a8, compressed-tensors channel-wise): 1 byte per weight and an fp32 scale per output row.
- gptq_int4 (gptq_marlin, 4 bits, group 128, no act-order): packed int32 qweight = 0.5 byte per
  weight, fp16 scales per group of 128 inputs; marlin drops g_idx and the symmetric zero points.
- awq_int4 (awq_marlin, group 128): qweight 0.5 byte, fp16 scales and int32-packed zero points
  (8 per int32) per group.
- nvfp4 (modelopt): uint8 weight with two values per byte, an fp8 scale per 16 inputs, fp32 global
  scales.
- mxfp4 (gpt-oss): the routed experts only, uint8 with two values per byte and a uint8 scale per 32
  inputs; everything else stays 16-bit (its quantization_config's modules_to_not_convert). The MoE
  backend pads them (Marlin, FlashInfer TRTLLM: padded sizes, biases too, fp32 for TRTLLM) or swizzles
  them ('TRITON' on Hopper): serving/mxfp4_experts.py, by vLLM release and GPU.

In every format the embedding, the LM head, norms, biases and MoE routers stay 16-bit (vLLM builds
them unquantized). Shapes per rank follow vLLM's parallel layers: column-parallel outputs / TP with
K and V holding max(1, kv_heads // TP) heads (QKVParallelLinear replicates KV heads), row-parallel
inputs / TP, replicated layers whole (MLA's down-projections), the vocabulary padded to a multiple of
64 and split over TP (vocab_parallel_embedding.py DEFAULT_VOCAB_PADDING_SIZE), routed experts split
in width over TP (FusedMoE) or, with expert parallelism, in number over EP.

vLLM measures them as torch.cuda.memory_allocated counts them, in the caching allocator's blocks: for
unquantized weights `stage_weights(as_allocated=True)` replays the allocations (weight_blocks.py), for MXFP4
experts on vLLM 0.11's Marlin path the allocations and the repack after loading (marlin_blocks.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..spec.architecture import COLUMN, EXPERT_COLUMN, EXPERT_ROW, ROW, VOCAB, Architecture, ParameterTensor
from .kv_cache import cdiv, kv_heads_per_rank
from .mxfp4_experts import TritonHopperLayout, expert_tensor_bytes
from .marlin_blocks import marlin_stage_allocated
from .weight_blocks import allocated_bytes, stage_requests

VOCAB_PADDING = 64  # vllm/model_executor/layers/vocab_parallel_embedding.py DEFAULT_VOCAB_PADDING_SIZE
GROUP = 128  # GPTQ/AWQ group size of the common int4 checkpoints
# built with quant_config=None in vLLM's MoE models; DeepSeek-V3.2's indexer weights_proj too (deepseek_v2.py Indexer)
IN_BLOCKS = ", in the caching allocator's blocks"  # the formula's note when the blocks are replayed
UNQUANTIZED_MATRICES = ("router", "shared_expert_gate", "indexer_weights_proj")


@dataclass(frozen=True)
class WeightFormat:
    name: str  # one of settings.WEIGHT_FORMATS except "auto"
    block: tuple[int, int] | None = None  # fp8 block scales (weight_block_size)
    dtype_bytes: int = 2  # the unquantized tensors' dtype (bf16/fp16)
    per_channel: bool = False  # fp8 with one fp32 scale per output row (compressed-tensors strategy "channel")
    dtype_name: str = "bf16"  # the unquantized tensors' dtype, by name
    # MXFP4 experts padded for Marlin or FlashInfer TRTLLM: (intermediate multiple, hidden multiple); None: unpadded
    mxfp4_padding: tuple[int, int] | None = None
    mxfp4_fp32_bias: bool = False  # padded MXFP4 experts' biases held in fp32 (FlashInfer TRTLLM)
    # MXFP4 experts swizzled for triton_kernels on Hopper (serving/mxfp4_experts.py); None: not swizzled
    mxfp4_triton: TritonHopperLayout | None = None
    # MXFP4 experts repacked by vLLM 0.11's Marlin path, whose blocks are replayed (serving/marlin_blocks.py)
    mxfp4_marlin_repack: bool = False
    mxfp4_marlin_sms: int = 0  # the GPU's SM count (activations.COMPUTE_UNITS), for Marlin's workspace


def matrix_bytes(fmt: WeightFormat, out: int, inp: int, expert: bool) -> float:
    """Bytes of one linear weight of (out, in) on a rank, scales included (see the module docstring)."""
    n = out * inp
    name = fmt.name
    if name == "mxfp4" and not expert or name in ("bf16", "fp16"):
        return fmt.dtype_bytes * n
    if name == "fp8":
        if fmt.block:
            return n + 4 * cdiv(out, fmt.block[0]) * cdiv(inp, fmt.block[1])
        return n + 4 * (out if fmt.per_channel else 1)
    if name == "int8":
        return n + 4 * out
    if name == "gptq_int4":
        return n / 2 + 2 * out * cdiv(inp, GROUP)
    if name == "awq_int4":
        return n / 2 + 2 * out * cdiv(inp, GROUP) + out * cdiv(inp, GROUP) / 2
    if name == "nvfp4":
        return n / 2 + n / 16 + 8
    if name == "mxfp4":
        return n / 2 + n / 32
    raise ValueError(name)


def padded_vocab(vocab: int) -> int:
    return cdiv(vocab, VOCAB_PADDING) * VOCAB_PADDING


def _local_shape(t: ParameterTensor, arch: Architecture, tp: int, ep: int) -> tuple[tuple[int, ...], int]:
    """The tensor's shape on one rank and how many copies of it the rank holds."""
    shape, copies = list(t.shape), t.copies
    if t.name in ("k_proj", "v_proj"):
        shape[0] = kv_heads_per_rank(arch, tp) * arch.head_dim
    elif t.name == "qkv_bias":
        shape[0] = arch.q_width // tp + 2 * kv_heads_per_rank(arch, tp) * arch.head_dim
    elif t.split == COLUMN:
        shape[0] //= tp
    elif t.split == ROW:
        shape[-1] //= tp
    elif t.split == VOCAB:
        shape[0] = padded_vocab(shape[0]) // tp
    elif t.is_expert:
        if ep > 1:
            copies = cdiv(copies, ep)
        elif t.split == EXPERT_COLUMN:
            shape[0] //= tp
        elif t.split == EXPERT_ROW and len(shape) > 1:
            shape[-1] //= tp
    return tuple(shape), copies


def _padded_expert(shape: tuple[int, ...], split: str, pad: tuple[int, int]) -> tuple[int, ...]:
    """A gated expert's gate-up ([2I, h], its bias [2I]) or down ([h, I], its bias [h]) with I rounded up to
    pad[0] (per half of gate-up) and h to pad[1]."""
    inter, hidden = pad
    if split == EXPERT_COLUMN:
        rows = 2 * cdiv(shape[0] // 2, inter) * inter
        return (rows,) + tuple(cdiv(d, hidden) * hidden for d in shape[1:])
    padded = (cdiv(shape[0], hidden) * hidden,)
    return padded + tuple(cdiv(d, inter) * inter for d in shape[1:])


def tensor_bytes(t: ParameterTensor, arch: Architecture, fmt: WeightFormat, tp: int, ep: int) -> float:
    shape, copies = _local_shape(t, arch, tp, ep)
    if fmt.name == "mxfp4" and fmt.mxfp4_triton and t.is_expert:
        return copies * expert_tensor_bytes(fmt.mxfp4_triton, t.name, shape)
    if fmt.name == "mxfp4" and fmt.mxfp4_padding and t.is_expert:
        shape = _padded_expert(shape, t.split, fmt.mxfp4_padding)
        if fmt.mxfp4_fp32_bias and t.role == "vector":
            return copies * math.prod(shape) * 4
    if t.role == "hidden_matrix" and t.name not in UNQUANTIZED_MATRICES:
        return copies * matrix_bytes(fmt, shape[0], shape[1], t.is_expert)
    return copies * math.prod(shape) * fmt.dtype_bytes


@dataclass(frozen=True)
class StageWeights:
    layers: range
    bytes: int
    formula: str
    block_excess: int = 0  # of `bytes`, what the caching allocator's blocks hold beyond the tensors (weight_blocks.py)


def stage_layers(num_layers: int, pp: int) -> tuple[range, ...]:
    """vLLM's get_pp_indices (distributed/utils.py): an even split, the remainder one layer each to the
    stages before the last, from the second-to-last backwards."""
    sizes = [num_layers // pp] * pp
    for i in range(2, num_layers % pp + 2):
        sizes[-i] += 1
    starts = [sum(sizes[:s]) for s in range(pp)]
    return tuple(range(a, a + n) for a, n in zip(starts, sizes))


def rope_cache_bytes(arch: Architecture, context: int | None, fmt: WeightFormat, dtype_bytes: int | None = None) -> int:
    """The rotary embedding's cos/sin cache, one per model (get_rope keeps one instance per shape):
    [max_position_embeddings, rotary_dim] in the model dtype unless the model asks for another (rotary_embedding.py
    _compute_cos_sin_cache); rotary_dim = head_dim, or the RoPE part of MLA's head."""
    if arch.position_embedding != "rope" or not context:
        return 0
    rotary = arch.qk_rope_head_dim if arch.uses_mla else arch.head_dim
    return context * rotary * (dtype_bytes or fmt.dtype_bytes)


def vllm_rope_dtype_bytes(arch: Architecture) -> int | None:
    """gpt-oss (the one architecture with attention sinks) builds its YaRN rotary embedding in fp32 (vLLM 0.11.0,
    0.15.0, 0.19.0, 0.33.0 models/gpt_oss.py OAIAttention: get_rope(..., dtype=torch.float32)), original 4,096
    positions x factor 32 = its 131,072; the first forward replaces it with a bf16 copy
    (rotary_embedding/base.py _match_cos_sin_cache_dtype), after the load was measured."""
    return 4 if arch.attention_sinks else None


def stage_weights(arch: Architecture, fmt: WeightFormat, tp: int, ep: int, pp: int, stage: int,
                  layers: range, context: int | None = None, rope_dtype_bytes: int | None = None,
                  as_allocated: bool = False) -> StageWeights:
    """One rank's weights on one stage: its layers, the embedding on the first stage (and on the last
    when tied under PP, for the LM head), the final norm and LM head on the last, and the RoPE cache.
    `as_allocated`: as vLLM measures them, in the caching allocator's blocks (weight_blocks.py; unquantized
    formats only)."""
    def nbytes(t: ParameterTensor) -> float:
        return tensor_bytes(t, arch, fmt, tp, ep)

    per_kind = {kind: sum(nbytes(t) for t in arch.layer_tensors(kind)) for kind in arch.kinds}
    total = sum(per_kind[kind] * n for kind, n in arch.kind_counts(layers.start, layers.stop))
    parts = [f"{len(layers)} layers"]
    first, last = stage == 0, stage == pp - 1
    embedding = arch.embedding_tensors(arch.vocab_size) if first or (last and arch.tie_embeddings) else []
    if embedding:
        total += sum(nbytes(t) for t in embedding)
        parts.append(f"embedding ({padded_vocab(arch.vocab_size):,} padded rows / TP)")
    head = arch.head_tensors(arch.vocab_size) if last else []
    if head:
        total += sum(nbytes(t) for t in head)
        parts.append("final norm" + ("" if arch.tie_embeddings else " and LM head"))
    rope = rope_cache_bytes(arch, context, fmt, rope_dtype_bytes)
    if rope:
        total += rope
        parts.append(f"RoPE cos/sin cache ({context:,} positions{', fp32' if rope_dtype_bytes == 4 else ''})")
    total = int(round(total))
    formula = f"{' + '.join(parts)} in {_format_label(fmt)}"
    if as_allocated and fmt.mxfp4_marlin_repack:
        blocks = _marlin_blocks(arch, fmt, tp, ep, layers, nbytes, head, embedding, rope)
        return StageWeights(layers, blocks, f"{formula}{IN_BLOCKS}, Marlin's repack replayed (+{blocks - total:,} B)",
                            blocks - total)
    if not (as_allocated and fmt.name in ("bf16", "fp16")):
        return StageWeights(layers, total, formula)
    blocks = allocated_bytes(stage_requests(arch, layers, nbytes, head, embedding, rope))
    return StageWeights(layers, blocks, f"{formula}{IN_BLOCKS} (+{blocks - total:,} B)", blocks - total)


def _marlin_blocks(arch: Architecture, fmt: WeightFormat, tp: int, ep: int, layers: range, nbytes,
                   head: list[ParameterTensor], embedding: list[ParameterTensor], rope: int) -> int:
    """The stage's load replayed with vLLM 0.11's Marlin repack of the MXFP4 experts (serving/marlin_blocks.py):
    each MoE layer's gate-up and down as padded on this rank."""
    experts = {}
    for kind in arch.kinds:
        by_name = {t.name: t for t in arch.layer_tensors(kind) if t.is_expert}
        if "expert_fc1" in by_name and "expert_fc2" in by_name:
            (fc1, copies), (fc2, _) = (_local_shape(by_name[n], arch, tp, ep) for n in ("expert_fc1", "expert_fc2"))
            experts[kind] = (copies, _padded_expert(fc1, by_name["expert_fc1"].split, fmt.mxfp4_padding),
                             _padded_expert(fc2, by_name["expert_fc2"].split, fmt.mxfp4_padding))
    if len(set(experts.values())) != 1:
        raise ValueError(f"Marlin's MXFP4 replay needs one expert shape, got {sorted(set(experts.values()))}")
    copies, gate_up, down = next(iter(experts.values()))
    moe_layers = {i for i in layers if arch.layer_kind(i) in experts}
    return marlin_stage_allocated(lambda i: [t for t in arch.layer_tensors(arch.layer_kind(i)) if not t.is_expert],
                                  moe_layers, layers, nbytes, copies, gate_up, down,
                                  [int(round(nbytes(t))) for t in embedding], [int(round(nbytes(t))) for t in head],
                                  rope, fmt.mxfp4_marlin_sms)


def _format_label(fmt: WeightFormat) -> str:
    if fmt.mxfp4_triton:
        return f"{fmt.name} (experts swizzled for triton_kernels on Hopper, {fmt.mxfp4_triton.source})"
    if fmt.mxfp4_padding:
        bias = ", fp32 biases" if fmt.mxfp4_fp32_bias else ""
        inter, hidden = fmt.mxfp4_padding
        return f"{fmt.name} (experts' intermediate padded to {inter}, hidden to {hidden}{bias})"
    return fmt.name
