"""Multi-token prediction's activations on the stage that runs it (DeepSeek-V3's MTP, Megatron-Core's
``--mtp-num-layers``): each module is one more transformer layer of the last layer's kind, run after
the decoder on the last stage, with its own output layer and loss.

Megatron-Core 0.16.1 ``transformer/multi_token_prediction.py`` ``MultiTokenPredictionLayer``: the
embedding of the shifted tokens goes through ``enorm`` (kept: its input), the decoder's hidden states
through ``hnorm`` (its input is the decoder output the main head's final norm keeps already); the two
outputs are concatenated, [s/t, b, 2h] under sequence parallelism, and kept by ``eh_proj`` (a column-
parallel linear to h); the transformer layer keeps what a decoder layer of its kind keeps; under full
recompute (``_checkpointed_forward``) the module keeps its two inputs instead. ``models/gpt/gpt_model.py``
``_postprocess`` then runs the shared output layer and the loss on each module's output before the main
head: each module's loss keeps the same tensors as the main one (its final norm's input, the output
layer's input, the logits as the loss keeps them) until backward.

At a stage's peak one micro-batch is in the last chunk: its forward ends in the loss and its backward
starts at once (1F1B and Megatron's interleaved steady state both run a micro-batch's last-chunk
backward right after its forward), so the modules count once, like the loss.
"""

from __future__ import annotations

from ..spec.architecture import Architecture
from ..spec.dtypes import bytes_per_element
from ..spec.parallel import Parallel
from ..spec.training import Training
from .activations.entries import Entry, tokens_per_gpu
from .components import Component, component

SOURCE = ("Megatron-Core 0.16.1 transformer/multi_token_prediction.py MultiTokenPredictionLayer (_get_embeddings, "
          "_concat_embeddings, _proj_and_transformer_layer, _postprocess, _checkpointed_forward) and "
          "models/gpt/gpt_model.py _postprocess (each module's output layer and loss before the main head's)")


def mtp_kind(arch: Architecture) -> str:
    """An MTP module's transformer layer is of the last decoder layer's kind (architecture.mtp_tensors)."""
    return "moe" if arch.is_moe_layer(arch.num_layers - 1) else "dense"


def module_entries(arch: Architecture, training: Training, par: Parallel) -> list[Entry]:
    """What an MTP module keeps beside its transformer layer, per micro-batch."""
    B = bytes_per_element(training.compute_dtype)
    T, h = tokens_per_gpu(training, par), arch.hidden_size
    if training.recompute == "full":  # the checkpoint keeps its two inputs: hidden states and embedded tokens
        return [Entry("checkpointed module's inputs (decoder hidden states, embedded shifted tokens)", 2 * T * h, B,
                      "sp", "2*B*s*b*h")]
    return [Entry("enorm input (embedded shifted tokens)", T * h, B, "sp", "B*s*b*h"),
            Entry("eh_proj input (enorm and hnorm outputs concatenated)", 2 * T * h, B, "sp", "2*B*s*b*h")]


def mtp_activations(arch: Architecture, training: Training, par: Parallel, layer_bytes: float,
                    loss_bytes: float) -> Component | None:
    """The MTP modules' kept tensors for one micro-batch (module docstring): `layer_bytes` is what one layer of
    their kind keeps (0 under full recompute), `loss_bytes` what the main loss keeps; None without MTP."""
    if not arch.mtp_layers or training.mode != "training":
        return None
    entries = module_entries(arch, training, par)
    extras = sum(e.bytes(par) for e in entries)
    n = arch.mtp_layers
    total = n * (layer_bytes + extras + loss_bytes)
    shown = " + ".join(e.shown_formula(par) for e in entries)
    layer = "" if training.recompute == "full" else f"{layer_bytes / 2**20:,.1f} MiB {mtp_kind(arch)} layer + "
    return component("mtp", "Multi-token prediction modules (one micro-batch)", int(round(total)),
                     f"{n} x ({layer}{shown} + the loss's {loss_bytes / 2**20:,.1f} MiB)", SOURCE)
