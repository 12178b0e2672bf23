"""MXFP4 experts repacked for Marlin, as vLLM 0.11 measures them: the caching allocator's blocks, replayed.

vLLM 0.11 loads gpt-oss's MXFP4 experts for Marlin on every CUDA GPU (serving/mxfp4_experts.py), and its
"Model loading took X GiB" is the growth of torch.cuda.memory_allocated across the load (weight_blocks.py): the
blocks the allocator hands out, not the tensors' bytes. The Marlin path allocates, in this order (read in vLLM
0.11.0):

- construction (models/gpt_oss.py under the target device): the embedding, then per layer OAIAttention (the first
  layer's rotary cache from get_rope, the sinks, qkv and its bias, o_proj and its bias, and Attention's seven fp32
  scalars: _k/_v/_q/_prob_scale and q/k/v_range, attention/layer.py), MLPBlock (the router and its bias, then
  FusedMoE's Mxfp4MoEMethod.create_weights, Marlin branch of quantization/mxfp4.py: w13_weight (E, 2I, H/2)
  uint8, w13_weight_scale (E, 2I, H/32) uint8, w13_bias (E, 2I) bf16, w2_weight (E, H, I/2), w2_weight_scale
  (E, H, I/32), w2_bias (E, H), I and H padded to 128 and 256), the two norms; then the final norm and LM head;
- after loading, per MoE layer, prepare_moe_fp4_layer_for_marlin (quantization/utils/marlin_utils_fp4.py): per
  weight matrix each expert's transposed int32 copy and its gptq_marlin_repack (the same bytes), every repacked
  one kept until torch.cat stacks them into a new tensor that replaces the original; per scale a bf16 copy of
  the whole, per expert marlin_permute_scales' gathered copy and mxfp4_marlin_process_scales' permuted and
  indexed bf16 copies and e8m0 result, the results stacked by torch.cat; per bias each expert's permuted copy
  (marlin_permute_bias), stacked. The originals, copies and pieces are freed.

Why it shows: a tensor of 10 MiB or more gets a segment rounded up to 2 MiB and is split only when more than
1 MiB would be left (memory/allocator.py). gpt-oss-120b's w13 scale, 128 x 5,888 x 96 B = 69 MiB, holds a 70 MiB
block, and its repacked copy lands in such a block again; its 1.44 MiB w13 bias takes a 1.5 MiB rest. The replay
of the whole load gives 70,829,492,224 B = 65.9651 GiB for gpt-oss-120b at TP 1 on an H100 (the tensors alone:
65.9285); vLLM 0.10.1 printed "Model loading took 65.9651 GiB" for it on the Marlin path ("Weight-only FP4
compression will be used leveraging the Marlin kernel" in the same log, vllm#23278). Left out, as the replay is
the same with and without them: the loader's checkpoint copies (gpt_oss.py _load_weights_mxfp4 moves each
checkpoint tensor to the GPU and frees it) and the rotary cache's fp32 temporaries. The Marlin workspace
(marlin_make_workspace_new: SMs x 4 int32 a MoE layer, a 2,560 B block on an H100's 132 SMs; the SM counts of
serving/activations.py COMPUTE_UNITS) is counted (the 120B would read 65.9650 without it).
"""

from __future__ import annotations

from ..memory.allocator import CachingAllocator
from .weight_blocks import layer_requests

ATTENTION_SCALARS = 7  # vLLM 0.11.0 attention/layer.py: four scales and three ranges, fp32 scalars on the GPU
MX_BLOCK = 32  # inputs per uint8 scale
WORKSPACE_PER_SM = 4 * 4  # marlin_make_workspace_new(device, max_blocks_per_sm=4): int32 per thread block


class _Replay:
    """Named allocations on the replayed allocator."""

    def __init__(self) -> None:
        self.allocator = CachingAllocator()
        self.live: dict[object, int] = {}

    def new(self, key: object, nbytes: int) -> None:
        if nbytes > 0:
            self.live[key] = self.allocator.malloc(nbytes)

    def free(self, key: object) -> None:
        if key is not None and key in self.live:
            self.allocator.free(self.live.pop(key))


def _matrices(gate_up: tuple[int, int], down: tuple[int, int]):
    """(name, per-expert packed bytes, per-expert scale bytes, per-expert bias bytes) of w13 and w2, from their
    padded (rows, inputs) shapes on this rank."""
    return [(name, rows * inputs // 2, rows * inputs // MX_BLOCK, rows * 2)
            for name, (rows, inputs) in (("w13", gate_up), ("w2", down))]


def _construct_experts(r: _Replay, layer: int, experts: int, matrices) -> None:
    for name, packed, scale, bias in matrices:
        r.new((layer, name), experts * packed)
        r.new((layer, name, "scale"), experts * scale)
        r.new((layer, name, "bias"), experts * bias)


class _Held:
    """What prepare_moe_fp4_layer_for_marlin's locals still hold between its loops: the previous loop's
    tensor_list (freed when the next loop rebinds it), and what loop variables hold until they are rebound or
    the function returns (the last transposed copy, the last piece of each loop)."""

    def __init__(self) -> None:
        self.pieces: list = []
        self.at_return: list = []

    def drop_pieces(self, r: _Replay) -> None:
        for key in self.pieces:
            r.free(key)
        self.pieces = []


def _repack_matrices(r: _Replay, layer: int, experts: int, matrices, held: _Held) -> None:
    """Per weight matrix, per expert a transposed int32 copy (qweight) and gptq_marlin_repack's output
    (marlin_qweight, kept in the list); torch.cat of the list; setattr frees the original."""
    last_copy = None
    for name, packed, _, _ in matrices:
        key = (layer, name)
        held.drop_pieces(r)
        for i in range(experts):
            r.new((key, i, "copy"), packed)
            r.free(last_copy)  # qweight rebound
            last_copy = (key, i, "copy")
            r.new((key, i), packed)
            if i == 0:  # marlin_qweight rebound: the previous matrix's last piece
                for kept in held.at_return:
                    r.free(kept)
                held.at_return = []
        r.new((key, "stacked"), experts * packed)
        r.free(key)
        held.pieces, held.at_return = [(key, i) for i in range(experts - 1)], [(key, experts - 1)]
    held.at_return.append(last_copy)


def _repack_scales(r: _Replay, layer: int, experts: int, matrices, held: _Held) -> None:
    """Per scale a bf16 copy of the whole (.to(param_dtype)), then the list rebound; per expert the bf16 copies
    of marlin_permute_scales (reshape of the transposed view, [:, scale_perm]) and mxfp4_marlin_process_scales
    (permute + reshape, [:, [0, 2, 1, 3]]) and the e8m0 result kept; torch.cat; the copy and original freed."""
    for name, _, scale, _ in matrices:
        key = (layer, name, "scale")
        r.new((key, "bf16"), experts * scale * 2)
        held.drop_pieces(r)
        for i in range(experts):
            r.new((key, i, 0), scale * 2)
            r.new((key, i, 1), scale * 2)
            r.free((key, i, 0))
            r.new((key, i, 2), scale * 2)
            r.new((key, i, 3), scale * 2)
            r.free((key, i, 2))
            r.new((key, i), scale)
            r.free((key, i, 3))
            r.free((key, i, 1))
        r.new((key, "stacked"), experts * scale)
        r.free((key, "bf16"))
        r.free(key)
        held.pieces = [(key, i) for i in range(experts - 1)]
        held.at_return.append((key, experts - 1))


def _repack_biases(r: _Replay, layer: int, experts: int, matrices, held: _Held) -> None:
    """Per bias (already bf16: .to() copies nothing) each expert's marlin_permute_bias copy; torch.cat."""
    for name, _, _, bias in matrices:
        key = (layer, name, "bias")
        held.drop_pieces(r)
        for i in range(experts):
            r.new((key, i), bias)
        r.new((key, "stacked"), experts * bias)
        r.free(key)
        held.pieces = [(key, i) for i in range(experts)]


def _repack(r: _Replay, layer: int, experts: int, matrices, sms: int) -> None:
    """prepare_moe_fp4_layer_for_marlin on one MoE layer, statement by statement (vLLM 0.11.0
    quantization/utils/marlin_utils_fp4.py)."""
    r.new((layer, "workspace"), sms * WORKSPACE_PER_SM)  # kept on the layer
    held = _Held()
    _repack_matrices(r, layer, experts, matrices, held)
    _repack_scales(r, layer, experts, matrices, held)
    _repack_biases(r, layer, experts, matrices, held)
    held.drop_pieces(r)
    for key in held.at_return:
        r.free(key)


def marlin_stage_allocated(layer_tensors, moe_layers: set[int], layers: range, nbytes, experts: int,
                           gate_up: tuple[int, int], down: tuple[int, int], embedding: list[int], head: list[int],
                           rope: int, sms: int) -> int:
    """What torch.cuda.memory_allocated counts after one stage's load: `layer_tensors(i)` are layer i's
    non-expert tensors, `moe_layers` the layers holding MXFP4 experts (`experts` of them on this rank, gate-up
    and down of padded (rows, inputs) `gate_up` and `down`), `embedding` and `head` the requests before and
    after the layers, `rope` the rotary cache's bytes (built with the first layer), `sms` the GPU's SM count
    (for Marlin's workspace)."""
    r = _Replay()
    matrices = _matrices(gate_up, down)
    for n, size in enumerate(embedding):
        r.new(("embedding", n), size)
    for i in layers:
        for n, size in enumerate(layer_requests(layer_tensors(i), nbytes, rope if i == layers.start else 0)):
            r.new((i, "tensor", n), size)
        for n in range(ATTENTION_SCALARS):
            r.new((i, "scalar", n), 4)
        if i in moe_layers:
            _construct_experts(r, i, experts, matrices)
    for n, size in enumerate(head):
        r.new(("head", n), size)
    for i in layers:
        if i in moe_layers:
            _repack(r, i, experts, matrices, sms)
    return r.allocator.allocated
