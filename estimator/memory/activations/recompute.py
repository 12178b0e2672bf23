"""Which saved tensors recomputation drops: Megatron's selective modules, full recomputation's
layer counts, torchtitan's operator-level policy.
"""

from __future__ import annotations

from typing import NamedTuple

from ...spec.architecture import Architecture
from ...spec.dtypes import bytes_per_element
from ...spec.parallel import Parallel
from ...spec.training import Training
from .entries import Entry, compiled, tokens_per_gpu


# --- torchtitan's operator-level selective checkpointing (recompute "selective" under fsdp2) ----------

OP_LEVEL = ("op_level",)  # the tag of everything operator-level checkpointing recomputes
OP_LEVEL_SOURCE = ("torchtitan v0.3.0 distributed/activation_checkpoint.py SelectiveAC: a block's input is kept by "
                   "the checkpoint; the outputs of compute-intensive ops (torch._functorch.partitioners."
                   "get_default_op_list: mm, flash attention) and of reduce_scatter/all_to_all are saved, except "
                   "every second mm of the block; everything else is recomputed in backward")


def op_level(training: Training) -> bool:
    """recompute "selective" means torchtitan's operator-level policy under fsdp2 (the contract)."""
    return training.recompute == "selective" and training.framework == "fsdp2"


class BlockGemm(NamedTuple):
    name: str
    width: int  # output features before TP
    symbol: str  # the width in the ledger's notation
    row_parallel: bool  # its input is split over TP, its output whole until the reduce-scatter
    saved: bool  # the operator-level policy keeps its output


def _mlp_width(arch: Architecture) -> int:
    """The block's MLP width; an MoE-only decoder has no dense one, so its routed experts' active width per token
    stands for it in the FLOP share (the roofline asks for the share whatever the layout; what the policy saves of
    MoE layers is not modelled: resolved.py refuses selective recompute there)."""
    return arch.intermediate_size or (arch.moe_intermediate_size or 0) * (arch.num_experts_per_token or 0)


def op_level_gemms(arch: Architecture) -> list[BlockGemm]:
    """A dense block's matmuls in the order torchtitan runs them: the policy counts mm calls per
    block from 1 and recomputes the even ones. Attention: wq, wk, wv, wo; FeedForward
    w2(silu(w1(x)) * w3(x)) runs w1, w3, w2; a plain MLP fc1, fc2."""
    h = arch.hidden_size
    f = _mlp_width(arch)
    order = [("q projection", arch.q_width, "a*d_head", False), ("k projection", arch.kv_width, "g*d_head", False),
             ("v projection", arch.kv_width, "g*d_head", False), ("output projection", h, "h", True)]
    if arch.gated_mlp:
        order += [("w1 (gate)", f, "f", False), ("w3 (up)", f, "f", False), ("w2 (down)", h, "h", True)]
    else:
        order += [("fc1", f, "f", False), ("fc2", h, "h", True)]
    return [BlockGemm(name, width, symbol, row, count % 2 == 1)
            for count, (name, width, symbol, row) in enumerate(order, start=1)]


# torch.compile under the operator-level policy: torchtitan compiles each checkpointed block whole
# (0.3.0 models/llama3/parallelize.py apply_ac, then apply_compile), so the policy tags the nodes of one
# joint graph MUST_SAVE or PREFER_RECOMPUTE (torch/utils/checkpoint.py under compile) and Inductor's
# partitioner cuts it: a PREFER_RECOMPUTE node is never saved (partitioners.py must_recompute), a
# MUST_SAVE one never recomputed (should_ban_recomputation "marked MUST_SAVE"), and only what the backward
# reads, or recomputes from, crosses the cut. Eager SAC caches every MUST_SAVE output whether read or not.
# Measured: the compiled block keeps what the eager one does less the last matmul's output (w2, which only
# feeds the residual add), under torchtitan 0.3.0's, 0.1.0's and 2024-12's policies, bf16 and float8.
COMPILED_OP_LEVEL_SOURCE = (
    "torch 2.13 torch/_functorch/partitioners.py min_cut_rematerialization_partition (must_recompute, "
    "should_ban_recomputation); measured with validation/compile_sac.py, "
    "tests/data/measured/compile/torchtitan-llama3-block-sac-bf16-b2-s24.json")


def unread_by_backward(arch: Architecture, training: Training) -> str | None:
    """The matmul whose saved output the compiled block drops: the block's last, whose output (and,
    under TP, its reduce-scatter's) only feeds the residual add, which needs nothing for its backward,
    in a pre-norm block (a post-sublayer norm, norms_per_layer > 2, reads it). None when eager."""
    if not compiled(training) or arch.norms_per_layer != 2:
        return None
    return op_level_gemms(arch)[-1].name


def op_level_saved_entries(arch: Architecture, training: Training, par: Parallel) -> list[Entry]:
    """What the operator-level policy keeps per dense layer: the block input, the odd matmuls'
    outputs (column-parallel ones divided by TP; a row-parallel one is whole, partial sums before
    its reduce-scatter), under TP every reduce-scatter's output, and flash attention's output and
    log-sum-exp. Compiled, the block keeps none of the last matmul's (`unread_by_backward`)."""
    B, T = bytes_per_element(training.compute_dtype), tokens_per_gpu(training, par)
    out = [Entry("block input (kept by the checkpoint)", T * arch.hidden_size, B, "sp", "B*s*b*h", recompute=())]
    unread = unread_by_backward(arch, training)
    for g in op_level_gemms(arch):
        if g.name == unread:
            continue
        if g.saved:
            out.append(Entry(f"{g.name} output (saved matmul)", T * g.width, B, "none" if g.row_parallel else "tp",
                             "B*s*b*h" if g.row_parallel else f"B*s*b*{g.symbol}"))
        if g.row_parallel and par.tp > 1:  # the policy saves every reduce-scatter, whatever the mm count
            out.append(Entry(f"{g.name} reduce-scatter output (saved collective)", T * g.width, B, "sp", "B*s*b*h"))
    out.append(Entry("flash attention output (saved)", T * arch.attention_output_width, B, "tp", "B*s*b*a*d_head"))
    out.append(Entry("flash log-sum-exp (saved, fp32)", T * arch.num_attention_heads, 4, "tp", "4*s*b*a"))
    return out


def op_level_recomputed_matmul_share(arch: Architecture) -> float:
    """Share of a dense block's matmul FLOPs the operator-level policy runs again in backward (its
    even matmuls; the roofline's recompute time)."""
    gemms = op_level_gemms(arch)
    width_in = {g.name: (arch.attention_output_width if g.name == "output projection" else
                         _mlp_width(arch) if g.row_parallel else arch.hidden_size) for g in gemms}
    flops = {g.name: width_in[g.name] * g.width for g in gemms}
    return sum(flops[g.name] for g in gemms if not g.saved) / sum(flops.values())


def recomputed_layer_count(training: Training, layers: int) -> int:
    """Layers of a stage that full recompute checkpoints (keeping only their input): the first
    `recompute_layers` (Megatron's block method), or every `recompute_every`-th, floor(layers / N)
    (torchtitan's and torchtune's layer-level AC), or all of them."""
    if training.recompute != "full":
        return 0
    if training.recompute_every > 1:
        return layers // training.recompute_every
    return layers if training.recompute_layers is None else min(training.recompute_layers, layers)


def recomputed_modules(training: Training) -> frozenset[str]:
    """Modules whose outputs are recomputed instead of kept: selective recompute's list (Megatron),
    torchtitan's operator-level policy (fsdp2), or none."""
    if op_level(training):
        return frozenset(OP_LEVEL)
    return frozenset(training.recompute_modules) if training.recompute == "selective" else frozenset()


def dropped(entry: Entry, modules: frozenset[str]) -> bool:
    return any(tag in modules for tag in entry.recompute)
