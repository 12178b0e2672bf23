"""The math attention's backward moment where peft's prepare_model_for_kbit_training leaves fp32
weights (SDPA falls back to its math kernel for fp32 with grouped KV heads).
"""

from __future__ import annotations

from .kbit import score_bytes


# score-sized fp32 tensors the math backend's backward holds beside the kept softmax at its largest
# moment: the probabilities' gradient, the scores' gradient, and one more seen on CUDA (module docstring)
MATH_BACKWARD_SCORE_BUFFERS = 3


def _attention_part(arch, training, par, kind: str) -> float:
    """A layer's saved tensors up to and with the attention's: its norm, q, k, v and o and their adapters."""
    from .activations.attention import attention_entries
    from .adapters import adapted, layer_modules
    from .adapter_activations import kept, module_entries
    entries = kept(attention_entries(arch, training, par), training, arch)
    if training.adapter is not None:  # a prepared k-bit run's (Falcon's may run without one)
        entries += [e for m in layer_modules(arch, kind) if m.name in ("q", "k", "v", "o")
                    and adapted(training.adapter, m.name) for e in module_entries(arch, training, par, m, False)]
    return sum(e.bytes(par) for e in entries)


def attention_moment(arch, training, par, kind: str, recomputed: bool, full_layer: float, loss_saved: float,
                     phase: str) -> tuple[float, str]:
    """The math backend's largest moment in the last layer, as bytes over what the phase total already
    holds (the activations of every layer, the loss's saved tensors), and its formula. Forward (and a
    recomputed layer's forward): the scores, `_safe_softmax`'s output and its bool mask of the -inf
    scores (torch 2.13 SoftMax.cpp _safe_softmax: isneginf, then where into the output; the GPU
    record's forward shows the mask); backward: the kept softmax with `MATH_BACKWARD_SCORE_BUFFERS`
    score-sized tensors and the layer output's gradient. Held beside them: the layer's attention half
    of its saved tensors when it is recomputed (without recompute they are among the activations, and
    its MLP half is not yet made, or freed). The loss's saved tensors do not exist yet in forward and
    are freed before any layer's backward. `training` is the ledger's (`ledger_training`)."""
    from .activations.entries import tokens_per_gpu
    from .activations.sdpa_math import falcon_math_forward_extra, falcon_math_sdpa
    from ..spec.dtypes import bytes_per_element
    S = arch.num_attention_heads * score_bytes(training, par)
    part = _attention_part(arch, training, par, kind)
    if phase == "forward":  # the softmax's output is among the attention part: scores and mask beside it
        buffers, text = 1.25 * S, "scores 4*b*a*s^2 and the -inf mask b*a*s^2"
        if falcon_math_sdpa(arch, training):  # Falcon's mask and 16-bit upcasts (sdpa_math.py)
            extra, extra_text = falcon_math_forward_extra(arch, training, par)
            buffers, text = buffers + extra, f"{text} + {extra_text}"
        gradient = 0.0
    else:
        buffers = MATH_BACKWARD_SCORE_BUFFERS * S
        text = f"{MATH_BACKWARD_SCORE_BUFFERS} x 4*b*a*s^2 beside the kept softmax"
        # the residual stream's dtype: fp32 in a prepared k-bit run's ledger, the compute dtype's in Falcon's
        B = bytes_per_element(training.compute_dtype)
        gradient = B * tokens_per_gpu(training, par) * arch.hidden_size
    held = part if recomputed else part - full_layer
    moment = max(0.0, held + buffers + gradient - loss_saved)
    formula = (f"{text} ({buffers / 2**30:,.2f} GiB)" + (f" + layer output gradient {B:g}*s*b*h" if gradient else "")
               + f" + {'the recomputed' if recomputed else 'the last'} layer's attention tensors"
               + ("" if recomputed else " less the whole layer, counted with the activations")
               + f" ({held / 2**30:,.2f} GiB) - the loss's saved tensors, not alive then "
               f"({loss_saved / 2**30:,.2f} GiB)")
    return moment, formula
