"""DeepSeek Sparse Attention's moments inside a layer (Megatron-Core 0.16.1's DSAttention; the bytes over
what a layer keeps: memory/activations/sparse.py dsa_moments), as the stage's in-layer moments.

Like an MoE layer's exchange (moe_moments.py), such a moment happens inside one layer: in forward before
the head exists, in backward after the loss's backward freed its tensors; and inside the layer before its
attention output and its MLP or MoE tensors exist (forward) or after they are freed (backward: autograd
runs the layer's MLP/MoE and output projection backward first). So the stage at that moment holds every
kept tensor less the loss's and less this layer's tensors after its core attention; the moment is given net
of those, and a phase takes the larger of it and its other in-layer moments (static_stage.py). Checked
against the fake-tensor measurement of Megatron-Core's own DSA layers (tests/data/measured/megatron/
deepseek-v2-lite-dsa-*).
"""

from __future__ import annotations

from .activations.attention import attention_entries
from .activations.entries import ATTENTION_OUTPUT
from .activations.layer import layer_entries
from .activations.recompute import dropped
from .activations.sparse import SOURCE, checkpointed_forward, dsa_moments
from .activations.sparse_hf import HF_SOURCE, hf_checkpointed_forward, hf_dsa_moments
from .components import Component, component
from ..spec.architecture import Architecture
from ..spec.parallel import Parallel
from ..spec.training import Training


def after_core_bytes(arch: Architecture, training: Training, par: Parallel, kinds: list[str]) -> float:
    """The least, over the stage's layer kinds, of what a layer keeps after its core attention (the attention
    output and the MLP's or MoE's tensors), as the ledger counts it (recompute drops applied)."""
    modules = frozenset(training.recompute_modules) if training.recompute == "selective" else frozenset()
    before = {e.name for e in attention_entries(arch, training, par)} - {ATTENTION_OUTPUT}
    return min(sum(e.bytes(par) for e in layer_entries(arch, training, par, kind)
                   if e.name not in before and not dropped(e, modules)) for kind in kinds)


def dsa_stage_moments(arch: Architecture, training: Training, par: Parallel, kinds: list[str],
                      loss_saved: float, checkpointed: bool = False) -> tuple[list[Component], list[Component]]:
    """(forward, backward) moment of a DSA layer, net of the loss's saved tensors (`loss_saved`, the last
    stage's) and of the layer's tensors after its core; none without sparse attention under Megatron or HF.
    `checkpointed`: every layer of the stage is recomputed, so the forward moment is a layer's whole working set
    (it saves nothing then)."""
    if not (arch.uses_sparse_attention and training.framework in ("megatron", "hf") and training.mode == "training"
            and kinds):
        return [], []
    if training.framework == "hf":  # transformers 5.23's eager DeepSeek-V3.2 (activations/sparse_hf.py)
        forward, backward, f_formula, b_formula = hf_dsa_moments(arch, training, par)
        source = HF_SOURCE + "; measured: tests/data/measured/deepseek-v3.2-*"
    else:
        forward, backward, f_formula, b_formula = dsa_moments(arch, training, par)
        source = SOURCE + "; measured: tests/data/measured/megatron/deepseek-v2-lite-dsa-*"
    gone = after_core_bytes(arch, training, par, kinds) + loss_saved
    less = " - the layer's tensors after its core attention" + (" - the loss's tensors" if loss_saved else "")
    fwd = component("transient", "DeepSeek Sparse Attention's quadratic temporaries (a layer's forward)",
                    max(forward - gone, 0), f_formula + less, source)
    if checkpointed:  # the layer saves nothing in its first forward (sparse.py, sparse_hf.py)
        forward, f_formula = (hf_checkpointed_forward if training.framework == "hf" else checkpointed_forward)(
            arch, training, par)
        fwd = component("transient", "DeepSeek Sparse Attention's quadratic temporaries (a checkpointed layer's "
                        "forward)", max(forward - loss_saved, 0), f_formula + (" - the loss's tensors" if loss_saved
                                                                              else ""), source)
    bwd = component("transient", "DeepSeek Sparse Attention's quadratic temporaries (a layer's backward)",
                    max(backward - gone, 0), b_formula + less, source)
    return [fwd], [bwd]
