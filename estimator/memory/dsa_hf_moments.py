"""The gradients beside DeepSeek-V3.2's backward moment under transformers (activations/sparse_hf.py).

The HF Trainer sets the gradients to None after each step, so a backward moment inside a layer holds the
gradients autograd made before it: the head's and final norm's, every later layer's and this layer's own after
its core attention (the MLP or MoE, the post-attention norm, o_proj), all in the gradient dtype and none for the
indexer, which runs under no_grad (sparse_hf.py). The DSA backward moment is the same in every layer, so:
- without recompute, a layer's moment holds the kept tensors of the layers up to it and the gradients of those
  after it: linear in the layer, largest at the last layer (the kept tensors dominate: one layer keeps
  b a s^2 (4 + B) bytes of softmax) or at the first (the gradients dominate, short sequences);
- with every layer recomputed, the layers keep only their inputs and the moment is largest at the first layer,
  where every later layer's gradients exist: trainer_backward_end.py holds that one (the recomputed layer with
  its DSA moment beside every gradient but the embedding's).
With gradients alive from the start (accumulation, a pipeline) they are all counted in the phase already.
Measured: tests/data/measured/deepseek-v3.2-* (the HF harness under fake tensors).
"""

from __future__ import annotations

from .components import Component, component, total_bytes
from .sharding import StageParameters
from ..spec.architecture import Architecture
from ..spec.dtypes import bytes_per_element
from ..spec.training import Recipe
from .activations.sparse_hf import HF_SOURCE

# the weights a layer runs before its core attention (their gradients come after it): DeepseekV32DecoderLayer's,
# and a standard attention layer's q, k, v projections, their bias and q/k norms (softmax_backward.py)
_BEFORE_CORE = ("q_down_proj", "q_down_norm", "q_up_proj", "kv_down_proj", "kv_down_norm", "kv_up_proj",
                "q_proj", "k_proj", "v_proj", "qkv_bias", "q_norm", "k_norm")


def _trained(arch: Architecture, kind: str, after_core: bool = False) -> int:
    """Elements of a layer's weights that get a gradient (the indexer's do not), or only those its backward
    reaches before the core attention's: the layer's norm scales are one tensor of one copy per norm, of which
    every one but the input norm's comes before (the post-attention norm's; Gemma-2's feed-forward norms too)."""
    total = 0
    for t in arch.layer_tensors(kind):
        if t.name.startswith("indexer_") or (after_core and t.name in _BEFORE_CORE):
            continue
        total += t.numel - t.numel // t.copies if after_core and t.name == "norm" else t.numel
    return total


def _head(arch: Architecture, vocab: int) -> int:
    """The head's and final norm's elements (the tied embedding's gradient is made at the head)."""
    tensors = arch.head_tensors(vocab) + (arch.embedding_tensors(vocab) if arch.tie_embeddings else [])
    return sum(t.numel for t in tensors)


def end_kinds(arch: Architecture, sp: StageParameters) -> tuple[str, str]:
    """The kinds of the stage's first and last layers."""
    kinds = arch.layer_kinds()
    return kinds[sp.chunks[0].start], kinds[sp.chunks[-1].stop - 1]


def last_layer_gradients(arch: Architecture, recipe: Recipe, sp: StageParameters, vocab: int) -> float:
    """The gradients (bytes) made before the stage's last layer's core attention backward: the head's and final
    norm's and the last layer's own after its core (module docstring)."""
    return bytes_per_element(recipe.grad_dtype) * last_layer_gradient_elements(arch, sp, vocab)


def last_layer_gradient_elements(arch: Architecture, sp: StageParameters, vocab: int) -> int:
    """The elements of `last_layer_gradients`."""
    return _head(arch, vocab) + _trained(arch, end_kinds(arch, sp)[1], True)


def gradients_at_moment(arch: Architecture, recipe: Recipe, sp: StageParameters, per_layer: dict[str, float],
                        vocab: int) -> tuple[float, float]:
    """(gradients at the last layer's moment, at the first layer's less the kept tensors of the layers after
    it, freed by then): the two ends of the linear run over the layers (module docstring), without recompute."""
    G = bytes_per_element(recipe.grad_dtype)
    first, _ = end_kinds(arch, sp)
    head = _head(arch, vocab)
    later = sum(_trained(arch, kind) * n for kind, n in sp.kind_counts) - _trained(arch, first)
    at_first = G * (head + later + _trained(arch, first, after_core=True))
    at_last = last_layer_gradients(arch, recipe, sp, vocab)
    kept_later = sum(per_layer[kind] * n for kind, n in sp.kind_counts) - per_layer[first]
    return at_last, at_first - kept_later


LAST_FORMULA = "G x (head and final norm + the last layer's weights after its core: MLP or MoE, o_proj, its norm)"
FIRST_FORMULA = ("G x (head and final norm + every later layer + the first layer's weights after its core) - the "
                 "later layers' kept tensors (their backward has freed them)")


def with_gradients(moment: list[Component], gradients: float, formula: str) -> list[Component]:
    """The DSA backward moment with the gradients made before it."""
    if not moment:
        return moment
    grads = component("transient", "Gradients made before the layer's attention backward (HF: none before backward)",
                      gradients, formula, HF_SOURCE + "; torch.optim.Optimizer.zero_grad(set_to_none=True)")
    return [component("transient", moment[0].label, total_bytes(moment) + grads.bytes,
                      f"{moment[0].formula} + the gradients made before it", moment[0].source, (moment[0], grads))]
