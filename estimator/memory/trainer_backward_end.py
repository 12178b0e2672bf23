"""The last backward moments of the HF Trainer and torchtune's single-device recipes, when backward creates
the gradients it keeps.

With `zero_grad(set_to_none=True)` backward starts without gradients, and its largest moment is
usually its first (the loss's gradients beside every activation). But by its end nearly every
gradient exists, and two moments there can be larger:

- the first layer's recomputation (full recompute): every later layer's gradients beside the
  recomputed layer's working set, of the first layer's own kind (and, under AMP, its autocast weight
  copies); where the stage mixes kinds (DeepSeek's first dense layers, then MoE; a hybrid's recurrent and
  attention layers), each other kind's earliest layer too, beside the gradients of the layers after it
  (with accumulation every gradient exists throughout: each kind beside all of them);
- the embedding's backward. Untied, its dense gradient becomes `.grad` as made: every gradient and
  nothing else. Tied to the LM head (Gemma, Llama-3.2, small Qwen: transformers' `tie_weights` makes
  `lm_head.weight` the embedding's Parameter), the weight is used twice, so its AccumulateGrad node
  has two incoming gradients: the autograd engine holds the head's (made first in backward) in the
  node's input buffer until the embedding's lookup sends the second, and sums them there, out of
  place: the head's arrives as a transposed view (mm_mat2_backward's `grad.t().mm(mat1).t()` for the
  column-major `weight.t()`, then TBackward's `.t()`), whose base still holds its storage, so the
  buffer does not own it alone and `can_accumulate_inplace` is false. At the sum three
  embedding-sized gradients coexist (the head's, the lookup's, the sum that becomes `.grad`): every
  gradient plus two more; with gradient accumulation the sum is then added into the existing `.grad`,
  so three more. Checked on the pinned torch with real tensors (tests/test_backward_end.py) and in the
  fake-tensor records (Gemma 3 27B with recompute: every gradient and 5.6 GB, two embeddings).
"""

from __future__ import annotations

from typing import Callable

from .backward_moments import BackwardEnd
from .components import Component, component
from ..spec.architecture import Architecture
from ..spec.dtypes import bytes_per_element
from ..spec.parallel import Parallel
from .sharding import StageParameters, bucket
from ..spec.training import Recipe, Training

ACCUMULATE_SOURCE = (
    "torch 2.13 torch/csrc/autograd/input_buffer.cpp InputBuffer::add/accumulate (a node input that arrives twice "
    "is held from its first gradient and summed when the second arrives, in place only when the buffer owns the "
    "first's storage alone, can_accumulate_inplace: not for the head's transposed view, FunctionsManual.cpp "
    "mm_mat2_backward) and functions/accumulate_grad.h accumulateGrad (the sum is stolen as .grad, or added in "
    "place into an existing .grad); transformers 5.23 modeling_utils.py PreTrainedModel.tie_weights "
    "(tie_word_embeddings: lm_head.weight is embed_tokens.weight); measured, tests/data/measured (Gemma-2-9B "
    "and Gemma 3 27B with recompute)")
FIRST_LAYER_SOURCE = ("torch autograd: a layer's gradients are made in its backward, the first layer's last; "
                      "torch.utils.checkpoint (non-reentrant) recomputes the layer just before; measured, "
                      "tests/data/measured (llama-3.1-8b, gemma-2-9b, jamba, mixtral with recompute)")


def applies(training: Training, par: Parallel, zero: int) -> bool:
    """The HF Trainer's loop without ZeRO/FSDP sharding, and torchtune's single-device recipes (one GPU: no
    FSDP); no adapters, no step in backward: every parameter's gradient is an ordinary `.grad` made by
    AccumulateGrad in backward. (torchtune 0.6.1 ties through modules/tied_linear.py TiedLinear, F.linear(x, the
    embedding's weight): the same two uses.)"""
    plain = (training.framework == "hf" and zero == 0) or (training.framework == "torchtune" and par.dp * par.cp == 1
                                                           and par.tp == 1 and par.pp == 1)
    return plain and not training.adapter and not training.optimizer_in_backward


def trainer_backward_end(arch: Architecture, training: Training, recipe: Recipe, par: Parallel,
                         sp: StageParameters, zero: int, grads: int, grads_live: bool,
                         recomputed: Callable[[str], list[Component]] | None,
                         backward: list[Component]) -> BackwardEnd | None:
    """The largest of backward's last moments under the HF Trainer (see the module's docstring): `grads`
    every gradient on this GPU, `grads_live` whether they exist from the start of backward (accumulation),
    `recomputed` a recomputed layer's working set and extras by its kind (None: no recompute), `backward`
    backward's transients (under full recompute: one layer's autocast copies). None where the framework
    makes its gradients otherwise."""
    if not applies(training, par, zero) or not grads:
        return None
    G = bytes_per_element(recipe.grad_dtype)
    tied = arch.tie_embeddings and sp.first and sp.last
    emb = arch.vocab_size * arch.hidden_size / par.tp if sp.first else 0.0
    moments: list[tuple[float, str | None, list[Component]]] = [(grads, None, [])]
    if tied:
        copies = 3 if grads_live else 2  # the head's and the lookup's beside their sum (and the .grad it joins)
        moments.append((grads, None, [component(
            "transient", "The tied embedding's head and lookup gradients, summed out of place" +
            (" (then added into its .grad)" if grads_live else " (the sum becomes its .grad)"),
            copies * G * emb, f"{copies} x {G:g} B x V*h" + ("/t" if par.tp > 1 else ""), ACCUMULATE_SOURCE)]))
    if recomputed is not None:
        # a kind's earliest layer recomputed: the gradients of the layers after it exist (all, when they
        # accumulate); the untied embedding's not yet, the tied head's stands for it; the layer's own are counted
        # (the share made before its largest moment varies with the layer); beside an accumulated .grad the
        # head's is held apart
        missing = G * emb if not (tied or grads_live) else 0.0
        t = "/t" if par.tp > 1 else ""
        held = [component("transient", "The tied embedding's gradient from the head (held for the lookup's)",
                          G * emb, f"{G:g} B x V*h{t}", ACCUMULATE_SOURCE)] if tied and grads_live else []
        for kind, before in earliest_of_each_kind(arch, sp):
            unmade = 0.0 if grads_live else sum(_layer_gradient(arch, training, par, sp, G, k) for k in before)
            formula = (f"{G:g} B x (the stage's parameters" + (f" - the embedding's V*h{t}" if missing else "")
                       + (" - the layers before its first " + kind + " layer" if unmade else "") + ")")
            moments.append((grads - missing - unmade, formula if missing or unmade else None,
                            held + list(recomputed(kind)) + [c for c in backward if c.bytes]))
    g, formula, transients = max(moments, key=lambda m: int(round(m[0])) + sum(c.bytes for c in m[2]))
    return BackwardEnd(g, formula, transients, "Gradients (all but the embedding's, made last)", FIRST_LAYER_SOURCE)


def earliest_of_each_kind(arch: Architecture, sp: StageParameters) -> list[tuple[str, list[str]]]:
    """Each kind of layer on the stage with the kinds of the stage's layers before its earliest one (backward
    reaches that one last of its kind, when the most gradients exist), the stage's first layer first."""
    kinds = arch.layer_kinds()
    order = [kinds[i] for i in sp.layer_indices]
    return [(kind, order[:order.index(kind)]) for kind in dict.fromkeys(order)]


def _layer_gradient(arch: Architecture, training: Training, par: Parallel, sp: StageParameters, G: float,
                    kind: str) -> float:
    """One layer's gradients on this GPU: its parameters' local elements (as sharding.stage_parameters counts
    them), less its indexer where transformers leaves the indexers untrained (states.py), in the gradients' dtype."""
    own = arch.cached((kind, par.tp, par.ep, par.etp), lambda: bucket(arch.layer_tensors(kind), par))
    untrained = (sp.indexers.dense + sp.indexers.expert) / max(1, sp.num_layers) if training.framework == "hf" else 0.0
    return G * max(0.0, own.dense + own.expert - untrained)
