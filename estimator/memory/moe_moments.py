"""An MoE layer's moments: the transients of its token exchange beside the kept activations.

Megatron's all-to-all dispatcher (its combine, the experts' backward, the router-dtype gradient)
and all-gather dispatcher (its combine and the combine's backward beside the global buffer),
DeepEP (whose buffers are communication, deepep.py), and the all-to-all send buffer of other
frameworks; with the MoE block recomputed, its recomputed tensors beside the larger of its
forward's and backward's moments. The tensors are activations.py's entries, from Megatron-Core
0.16.1's dispatchers (MEGATRON_ALLTOALL, MEGATRON_ALLGATHER, MEGATRON_GROUPED_MLP);
measured, tests/data/measured/megatron.
"""

from __future__ import annotations

from .activations.entries import Entry, fp8_activation_bytes, tokens_per_gpu
from .activations.moe import (LEGACY_GROUPED_MLP, MEGATRON_ALLGATHER, MEGATRON_ALLTOALL, MEGATRON_GROUPED_MLP,
                              TE_GROUPED_LINEAR, legacy_grouped_mlp,
                              moe_allgather_combine_backward_moment, moe_allgather_combine_moment, moe_combine_moment,
                              moe_expert_backward_moment, moe_router_dtype_backward_moment,
                              te_grouped_wgrad_in_main_grad)
from .activations.layer import moe_recomputed_entries
from ..spec.architecture import Architecture
from .components import Component, component, total_bytes
from ..spec.dtypes import bytes_per_element
from ..spec.parallel import Parallel
from .sharding import StageParameters
from ..spec.training import Training


MOE_RECOMPUTE_SOURCE = ("Megatron-Core 0.16.1 transformer/moe/moe_layer.py MoELayer.forward under "
                        "tensor_parallel.checkpoint when 'moe' is in recompute_modules; tensor_parallel/random.py "
                        "CheckpointFunction.backward runs the block's forward again before its backward; measured, "
                        "tests/data/measured/megatron")


def moe_moments(arch: Architecture, training: Training, par: Parallel,
                sp: StageParameters) -> tuple[list[Component], list[Component], list[Component]]:
    """The transients of an MoE layer beside the kept activations, (forward, backward), each phase's largest
    moment, and (third) the larger of its forward's and backward's moments under Megatron, which a layer fully
    recomputed in backward adds to its recomputed tensors. Megatron's all-to-all dispatcher (MEGATRON_ALLTOALL): the end of the layer's forward (its
    combine), the experts' backward, the router-dtype gradient around the expert-TP all-gather, and with the MoE
    block recomputed (selective "moe") its recomputed tensors beside the larger of its forward's and its backward's
    moments. DeepEP sends from its own fixed buffers (communication, deepep.py): no combine moment is modelled
    with it; its experts' backward is the same. The all-gather dispatcher (MEGATRON_ALLGATHER): its combine
    (the experts' outputs unpermuted over every gathered token), the combine's backward (the gradient
    all-gathered), the experts' backward as above, each beside Megatron's global buffer holding the gathered
    hidden states (allocated once and kept: counted with these moments, so not in the optimizer phase).
    Other frameworks: the all-to-all send buffer."""
    if not any(k == "moe" for k, _ in sp.kind_counts):
        return [], [], []
    send = fp8_activation_bytes(training) if training.fp8 else bytes_per_element(training.compute_dtype)
    if training.framework != "megatron":
        if par.ep == 1:
            return [], [], []
        tokens = tokens_per_gpu(training, par) * arch.num_experts_per_token * training.moe_capacity_factor
        entry = Entry("All-to-all send buffer (permuted tokens)", tokens * arch.hidden_size * par.etp, send, "sp",
                          "B*phi*k*s*b*h*etp")
        buffer = [component("transient", entry.name, entry.bytes(par), entry.shown_formula(par),
                            "all-to-all token dispatch (permute, then all_to_all)")]
        return buffer, list(buffer), []

    def parts(entries: list, source: str) -> list[Component]:
        return [component("transient", e.name, e.bytes(par), e.shown_formula(par), source) for e in entries]

    allgather = training.moe_dispatcher == "allgather"
    if allgather:  # MEGATRON_ALLGATHER: its combine and the combine's backward
        combine = parts(moe_allgather_combine_moment(arch, training, par), MEGATRON_ALLGATHER)
        first = [parts(moe_allgather_combine_backward_moment(arch, training, par), MEGATRON_ALLGATHER)]
    else:
        combine = [] if training.moe_dispatcher == "deepep" else \
            parts(moe_combine_moment(arch, training, par, send), MEGATRON_ALLTOALL)
        first = [parts(moe_router_dtype_backward_moment(arch, training, par),
                       "Megatron-Core MoEAlltoAllTokenDispatcher.combine_preprocess (--moe-router-dtype)")]
    experts = parts(moe_expert_backward_moment(arch, training, par),
                    TE_GROUPED_LINEAR if te_grouped_wgrad_in_main_grad(training) else
                    f"{MEGATRON_GROUPED_MLP}; {LEGACY_GROUPED_MLP}" if legacy_grouped_mlp(training) else
                    MEGATRON_GROUPED_MLP if training.moe_grouped_gemm else MEGATRON_ALLTOALL)
    backward = [experts] + first
    inner = max([combine, experts] + (first if allgather else []), key=total_bytes)
    recomputed = moe_recomputed_entries(arch, training, par)
    if recomputed:
        backward.append(parts(recomputed, MOE_RECOMPUTE_SOURCE) + inner)
    # the all-gather dispatcher gathers into Megatron's global buffer, a persistent one (`transients.transients`)
    return combine, max(backward, key=total_bytes), inner


COMBINE_BEFORE_THE_LOSS = (
    "Megatron-Core 0.16.1 models/gpt/gpt_model.py GPTModel.forward: the decoder's layers run (transformer/moe/"
    "moe_layer.py MoELayer.forward ends with the combine: token_dispatcher.py MoEAlltoAllTokenDispatcher "
    "token_combine) before _postprocess makes the logits (output_layer) and the loss "
    "(compute_language_model_loss); pipeline_parallel/schedules.py forward_backward_no_pipelining and "
    "forward_backward_pipelining_without_interleaving (no warm-up micro-batch on the last rank) run each "
    "micro-batch's backward right after its forward on the last stage")


LOSS_BEFORE_THE_LAYERS = (
    "Megatron-Core 0.16.1 pipeline_parallel/schedules.py backward_step: torch.autograd.backward from the loss, whose "
    "engine runs the loss's, the output layer's and the final norm's nodes before the decoder's last layer and frees "
    "each node's saved tensors after it runs (torch/csrc/autograd/engine.cpp, release_variables without "
    "retain_graph); no earlier micro-batch's loss is alive under 1F1B or without a pipeline; measured, the Megatron "
    "harness's mixtral-8x7b-tp2-pp4-last record (the logits freed before the experts' backward)")


def combine_before_the_loss(training: Training, par: Parallel, moments: tuple, loss_own: tuple) -> "ChargedMoments":
    """The MoE `moments` (moe_moments': forward's, backward's, inside a recomputed layer) on the last stage, each
    net of the loss's own saved tensors (`loss_own`: the final norm's and the LM head's inputs, the logits) where
    Megatron holds them apart: forward's, which Megatron makes before them (COMBINE_BEFORE_THE_LOSS), and
    backward's, which it makes after the loss's backward freed them (LOSS_BEFORE_THE_LAYERS): under 1F1B or without
    a pipeline no earlier micro-batch's loss is alive either. What else the loss holds (an MTP module's, earlier
    micro-batches' deferred inputs) stays beside them. As they are elsewhere (an interleaved schedule runs other
    chunks' forwards and backwards while a loss waits for its backward)."""
    own = total_bytes(loss_own)
    one_at_a_time = par.pp == 1 or (par.pp_schedule == "1f1b" and par.vpp == 1)
    if training.framework != "megatron" or not own or not one_at_a_time:
        return ChargedMoments(moments, (), ())
    made = (Component("transient", "The loss's saved tensors, not made yet", -own, "-(the loss's saved tensors)",
                      COMBINE_BEFORE_THE_LOSS),) if moments[0] else ()
    freed = (Component("transient", "The loss's saved tensors, freed by its backward", -own,
                       "-(the loss's saved tensors)", LOSS_BEFORE_THE_LAYERS),) if moments[1] else ()
    return ChargedMoments(moments, made, freed)


class ChargedMoments:
    """The MoE moments as a stage charges them: the stage memo's own tuple (`held`, which the memo counts once: a
    static part keeps it whole rather than copies of its lists) and what the stage adds to the forward's (`extra`)
    and to the backward's (`after`). Indexed and unpacked as the (forward, backward, inside a recomputed layer)
    tuple."""

    __slots__ = ("held", "extra", "after")

    def __init__(self, held: tuple, extra: tuple, after: tuple = ()):
        self.held, self.extra, self.after = held, extra, after

    def __getitem__(self, i: int) -> list:
        if i == 0 and self.extra:
            return list(self.held[0]) + list(self.extra)
        if i == 1 and self.after:
            return list(self.held[1]) + list(self.after)
        return self.held[i]

    def __iter__(self):
        return iter((self[0], self[1], self[2]))
