"""torchtitan's backward moments under FSDP2 (framework fsdp2): what a block's backward holds beyond
its saved tensors, and backward's last moments when FSDP2 creates the gradients in it.

Under FullAC every block runs its whole forward again before its backward, and torchao's float8
linears, run eagerly, cast op by op through fp32 copies: both add to the recomputed layer's ledger
(`block_backward_extras`). Without gradient accumulation FSDP2 creates the sharded gradients in
backward, so its last moments on the stage with the embedding hold nearly all of them beside a
unit's unsharded parameters and gradients (`fsdp2_backward_end`). The numbers come from torch
2.13's FSDP2, torchtitan v0.3.0 and torchao 0.18, each cited where used, checked against the
per-tensor breakdowns of tests/data/measured/torchtitan.
"""

from __future__ import annotations

from typing import NamedTuple, Protocol

from .activations.entries import KORTHIKANTI, compiled, tokens_per_gpu, torchao_float8
from ..spec.architecture import Architecture
from .components import Component, component, total_bytes
from ..spec.dtypes import bytes_per_element
from ..spec.parallel import Parallel
from .sharding import StageParameters
from .states import fsdp2_gathered_block_bytes
from ..spec.training import Recipe, Training

FSDP2_RS_SOURCE = ("torch 2.13 distributed/fsdp/_fully_shard/_fsdp_param_group.py post_backward: a unit's reduce-scatter "
                   "input (its unsharded gradients in the reduce dtype, foreach_reduce) stays in "
                   "comm_ctx.reduce_scatter_states until the next unit's post-backward drops it "
                   "(reduce_scatter_max_input_buffers 1); the unit's own unsharded gradients are copied into it and "
                   "freed there")
FULL_AC_SOURCE = ("torchtitan v0.3.0 distributed/activation_checkpoint.py FullAC: ptd_checkpoint_wrapper(early_stop="
                  "False), so a block's recomputation runs its whole forward, to the output it then drops; torch 2.13 "
                  "distributed/_functional_collectives.py reduce_scatter_tensor (a scatter dim other than 0 cats the "
                  "chunks into one buffer first); measured, per-tensor breakdown of "
                  "tests/data/measured/torchtitan (Llama-3.1-70B TP 8, Qwen3-32B TP 4, Qwen3-8B)")
TORCHAO_CAST_SOURCE = ("torchao 0.18 float8/float8_linear.py matmul_with_hp_or_float8_args.backward (grad_output cast "
                       "to float8 for grad_input, then again along the other axis for grad_weight, then the saved "
                       "input); float8/float8_training_tensor.py _ToFloat8ConstrFunc (tensor.to(float32) * scale) and "
                       "float8/float8_utils.py to_fp8_saturated (clamp in fp32, then .to(float8)): eager, each cast "
                       "holds two fp32 copies of its operand; measured, per-tensor breakdown of Llama-3.1-70B TP 8 "
                       "(rowwise) and Llama-3.1-8B (tensorwise) runs of validation/torchtitan")
EMBEDDING_UNIT_SOURCE = ("torchtitan v0.3.0 distributed/fsdp.py apply_fsdp_to_decoder (tok_embeddings its own unit); "
                         "torch 2.13 FSDP2 backward prefetch (_fsdp_state.py: the next unit in reverse post-forward "
                         "order, the embedding after the first block) and post_backward; measured, "
                         "tests/data/measured/torchtitan (per-tensor breakdown)")


def titan_full_ac(training: Training) -> bool:
    """torchtitan's FullAC on every block (recompute "full", every 1, under fsdp2; eager layers)."""
    return (training.framework == "fsdp2" and training.recompute == "full" and training.recompute_every == 1
            and not compiled(training))


def eager_float8(training: Training) -> bool:
    """torchao float8 linears run eagerly (training.compile off): their casts are op-by-op."""
    return torchao_float8(training) and not compiled(training)


# a moment of a block's backward: its name and its parts, each (label, bytes, formula)
Moment = tuple[str, list[tuple[str, float, str]]]


def _output_gradient(B: int, n_g: float, t: int, seq_par: bool) -> list[tuple[str, float, str]]:
    """The gradient of the block's output from the block above: held at every moment of its backward."""
    return ([("the block's output gradient (sequence-parallel shard)", B * n_g / t, "B*s*b*h/t"),
             ("its all-gather over TP", B * n_g, "B*s*b*h")] if seq_par else
            [("the block's output gradient", B * n_g, "B*s*b*h")])


def _recomputation_end(B: int, n_g: float, t: int, seq_par: bool, grads: list) -> Moment:
    """FullAC's recomputation has just run the whole block: its tail is still referenced."""
    tail = [("output projection's output (full sequence)", B * n_g, "B*s*b*h")]
    tail += ([("reduce-scatter's cat of it", B * n_g, "B*s*b*h"), ("reduce-scatter output", B * n_g / t, "B*s*b*h/t"),
              ("MLP norm output (sequence-parallel shard)", B * n_g / t, "B*s*b*h/t")] if seq_par else
             [("residual sum (the block's output)", B * n_g, "B*s*b*h")])
    return ("end of the recomputation (FullAC runs the whole block)", grads + tail)


def _moe_combine(arch: Architecture, training: Training, par: Parallel, P: int, T: int, h: int, t: int,
                 seq_par: bool, grads: list) -> Moment:
    # torchtitan's combine (models/common/token_dispatcher.py) scales the expert outputs in fp32; its
    # backward holds the upcast gradient and the product's two fp32 gradients (for the outputs and the
    # scores), after the shared experts' backward made their weight gradients
    n_r = T * arch.num_experts_per_token * training.moe_capacity_factor * h * par.etp / (t if seq_par else 1)
    rf = "/t" if seq_par else ""
    shared = [("shared experts' weight gradients (unsharded)",
               P * (3 if arch.gated_mlp else 2) * h * arch.shared_expert_intermediate_size * arch.num_shared_experts
               / t, f"P*{3 if arch.gated_mlp else 2}*h*f_shared{'/t' if t > 1 else ''}")] \
        if arch.num_shared_experts else []
    return ("MoE combine's backward", grads + shared + [
        ("three fp32 gradients of the routed tokens (the upcast's and the scaling product's)", 12 * n_r,
         f"3*4*phi*k*s*b*h*etp{rf}")])


def _gated_mlp_moments(arch: Architecture, B: int, P: int, T: int, h: int, t: int, n_g: float, full: bool,
                       cast: bool, grads: list) -> list[Moment]:
    """A dense gated MLP's backward moments: the bf16 one under FullAC, torchao's eager float8 casts."""
    moments: list[Moment] = []
    f = arch.intermediate_size / t
    n_x, w = T * f, h * f  # the down projection's input and weight on this GPU
    tf = "/t" if t > 1 else ""
    if full and not cast:
        moments.append(("gated MLP's backward", grads[:1] + [
            ("down projection's weight gradient (unsharded)", P * w, f"P*h*f{tf}"),
            ("gradients of the gated product and of both products, the product freed", 2 * B * n_x,
             f"2*B*s*b*f{tf}")]))
    if cast:
        f8 = [("float8 weight", w, f"h*f{tf}"), ("grad_input", B * n_x, f"B*s*b*f{tf}")]
        moments.append(("float8 cast of grad_output for grad_weight", grads + f8 + [
            ("float8 grad_output for grad_input, and the one being made", 2 * n_g, "2*s*b*h"),
            ("two fp32 copies of grad_output (to(float32) * scale, clamp)", 8 * n_g, "2*4*s*b*h")]))
        moments.append(("float8 cast of the saved input for grad_weight", grads + f8 + [
            ("both float8 grad_outputs and the input's float8 copy", 2 * n_g + n_x, f"2*s*b*h + s*b*f{tf}"),
            ("two fp32 copies of the input", 8 * n_x, f"2*4*s*b*f{tf}")]))
    return moments


def _largest_moment(moments: list[Moment], full: bool, cast: bool) -> list[Component]:
    """The largest moment as one component, its parts as pieces, the others named in its formula."""
    name, parts = max(moments, key=lambda m: sum(b for _, b, _ in m[1]))
    source = "; ".join(([FULL_AC_SOURCE] if full else []) + ([TORCHAO_CAST_SOURCE] if cast else []))
    pieces = tuple(component("transient", label, b, formula, source) for label, b, formula in parts)
    others = ", ".join(n for n, _ in moments if n != name)
    return [Component("transient", f"A block's backward beyond its saved tensors ({name})",
                      sum(p.bytes for p in pieces),
                      " + ".join(p.formula for p in pieces) + (f" (the largest of this and: {others})" if others else ""),
                      source, pieces)]


def block_backward_extras(arch: Architecture, training: Training, recipe: Recipe, par: Parallel,
                          sp: StageParameters) -> list[Component]:
    """What a block's backward holds beyond its saved tensors (the recomputed layer's ledger), at its
    largest moment, under torchtitan: the gradient of its output from the block above (under sequence
    parallelism that shard and its all-gather over TP), and then the largest of
      - the end of the recomputation (FullAC, early_stop=False): the output projection's output (full
        sequence, Partial over TP), with SP the reduce-scatter's cat of it, its output and the MLP
        norm's output the block still references; without TP the residual sum beside it;
      - a gated MLP's backward (bf16): the down projection's unsharded weight gradient, the gated
        product's gradient and the two products' gradients, the product itself freed (with SP the
        gathered output gradient is freed by then);
      - torchao's eager float8 casts in the down projection's backward: grad_output cast for grad_input
        (two fp32 copies and the float8 copy) beside the float8 weight and grad_input, then cast again
        for grad_weight; then the saved input's cast beside both float8 gradients.
    Not modelled: MoE blocks' MLP and cast moments (their tail is the generic one), compiled blocks."""
    full, cast = titan_full_ac(training), eager_float8(training)
    if not (full or cast):
        return []
    B, P = bytes_per_element(training.compute_dtype), bytes_per_element(recipe.param_dtype)
    T, h, t = tokens_per_gpu(training, par), arch.hidden_size, par.tp
    seq_par = par.sequence_parallel and t > 1
    n_g = T * h  # the block's output gradient, gathered over TP under SP
    grads = _output_gradient(B, n_g, t, seq_par)
    moments: list[Moment] = []
    if full:
        moments.append(_recomputation_end(B, n_g, t, seq_par, grads))
    if full and any(k == "moe" and n for k, n in sp.kind_counts):
        moments.append(_moe_combine(arch, training, par, P, T, h, t, seq_par, grads))
    dense = any(k == "dense" and n for k, n in sp.kind_counts)
    if dense and arch.gated_mlp:
        moments += _gated_mlp_moments(arch, B, P, T, h, t, n_g, full, cast, grads)
    if not moments:
        return []
    return _largest_moment(moments, full, cast)


class KeptInput(Protocol):
    """What `fsdp2_backward_end` reads of the estimate's shared part (memory.py's `_Shared`): one
    layer's input, kept by its checkpoint, and its formula."""

    @property
    def kept_input(self) -> float: ...

    @property
    def kept_input_formula(self) -> str: ...


class BackwardEnd(NamedTuple):
    gradients: float  # the sharded gradients alive then
    gradients_formula: str | None  # None: every gradient (the step's formula)
    transients: list[Component]
    gradients_label: str = "Gradients (their units' reduce-scatters not all run yet)"  # where the formula is given
    gradients_source: str = FSDP2_RS_SOURCE


def fsdp2_backward_end(arch: Architecture, training: Training, recipe: Recipe, par: Parallel, sp: StageParameters,
                       zero: int, grads: float, working: float, extras: list[Component],
                       shared: KeptInput) -> BackwardEnd | None:
    """torchtitan's last backward moments with FullAC and FSDP2 resharding after forward, on a stage with
    the embedding (no pipeline): the largest of
      - the first block's recomputation: its parameters and the embedding unit (prefetched for its
        backward) gathered, the second block's reduce-scatter input, the recomputed block (its
        input, saved tensors and backward extras); every unit's sharded gradient but the first
        block's and the embedding's;
      - the second block's: two blocks gathered, the third block's reduce-scatter input, the two
        blocks' inputs; those two blocks' and the embedding's gradients not yet there;
      - the embedding's post-backward: every sharded gradient, its unsharded gradient (the
        parameter dtype) and its reduce-scatter input (the reduce dtype)."""
    d = par.dp * par.cp
    if not (titan_full_ac(training) and zero == 3 and sp.first and d > 1 and not training.adapter):
        return None
    P, G = bytes_per_element(recipe.param_dtype), bytes_per_element(recipe.grad_dtype)
    Pb, pb = fsdp2_gathered_block_bytes(training, P, sp)
    layer, emb = sp.largest_layer_local, arch.vocab_size * arch.hidden_size / par.tp
    kept = shared.kept_input
    recomputed = [component("transient", "One recomputed layer's activations", working,
                            "per-layer ledger of one layer", KORTHIKANTI)] + extras

    def block(k: int) -> tuple[float, str, list[Component]]:  # block k (0: the first) being recomputed
        missing = (k + 1) * layer + emb
        gathered = (component("transient", "The first block and the embedding unit gathered", Pb * layer + P * emb,
                              f"{pb} x a block + {P:g} B x V*h/t", EMBEDDING_UNIT_SOURCE) if k == 0 else
                    component("transient", "Two blocks gathered (one prefetched)", 2 * Pb * layer,
                              f"{pb} x 2 blocks", EMBEDDING_UNIT_SOURCE))
        return (grads - G * missing / d,
                f"{G:g} B x (the stage's parameters - {k + 1} block(s) - the embedding) / d (d = DP*CP = {d})",
                [gathered,
                 component("transient", "Reduce-scatter input of the block differentiated before", G * layer,
                           f"{G:g} B x one layer's parameters", FSDP2_RS_SOURCE),
                 component("transient", f"Input{'s' if k else ''} of the block{'s' if k else ''} not yet "
                           "differentiated (kept by the checkpoints)", (k + 1) * kept,
                           f"{k + 1} x {shared.kept_input_formula}", FULL_AC_SOURCE)] + recomputed)

    embedding = (grads, None, [component(
        "transient", "The embedding's unsharded gradient and its reduce-scatter input", (P + G) * emb,
        f"({P:g} + {G:g}) B x V*h/t", EMBEDDING_UNIT_SOURCE + "; " + FSDP2_RS_SOURCE)])
    moments = [block(0), block(1), embedding]
    g, formula, transients = max(moments, key=lambda m: int(round(m[0])) + total_bytes(m[2]))
    return BackwardEnd(g, formula, transients)
