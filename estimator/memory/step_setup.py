"""The training setup a stage's step part (static_stage.step_part: its model states and transients) is built
from: the user's, with the fields the step part does not read sealed.

A layout search varies the micro-batch size, the loss and the recompute setting over the same model states,
and the step parts are kept by their setup (memory._step_memo): a field the step part does not read must not
key it, or the search builds the same part once per value. A sealed field holds a stand-in whose every use (a
comparison, arithmetic, a format, a truth test) raises `UnreadField`: a later rule that reads it fails loudly,
and the field must then join what the step part reads here (`_reads_micro_batch`, `_reads_loss`,
`_reads_recompute`, `_reads_recomputed_layers`), which keeps it in the key.
"""

from __future__ import annotations

import copy

from ..spec.architecture import Architecture
from ..spec.memo import not_owned
from ..spec.parallel import Parallel
from ..spec.training import Recipe, Training


class UnreadField(AssertionError):
    """A part read a field of the training setup that its memo's key leaves out."""


@not_owned  # one stand-in per field, this module's: no remembered value counts it (memo.deep_bytes)
class _Sealed:
    """A sealed field's value. Carried and compared by identity only (a setup holding it hashes, and equals a
    setup holding the same stand-in): any other use raises."""

    __slots__ = ("field",)

    def __init__(self, field: str):
        self.field = field

    def _read(self, *args, **kwargs):
        raise UnreadField(f"a stage's step part read training.{self.field}, which its memo's key leaves out: "
                          "name the setups where it reads it in memory/step_setup.py")

    __hash__ = object.__hash__
    __eq__ = __ne__ = __lt__ = __le__ = __gt__ = __ge__ = __bool__ = __int__ = __float__ = __index__ = _read
    __add__ = __radd__ = __sub__ = __rsub__ = __mul__ = __rmul__ = __truediv__ = __rtruediv__ = _read
    __floordiv__ = __rfloordiv__ = __mod__ = __rmod__ = __pow__ = __rpow__ = __neg__ = __abs__ = __round__ = _read
    __str__ = __repr__ = __format__ = __len__ = __iter__ = __contains__ = __getitem__ = _read

    def __getattr__(self, name: str):  # a string's or a number's methods (`.startswith`, `.bit_length`)
        if name.startswith("__"):  # a protocol's lookup (copy, pickle): absent, as on any object
            raise AttributeError(name)
        self._read()


# one stand-in per field: two sealed setups that differ in nothing else are equal (the memos' keys)
_SEALED = {name: _Sealed(name) for name in ("micro_batch_size", "loss", "recompute", "recompute_modules",
                                            "recompute_layers")}


def _reads_micro_batch(training: Training, par: Parallel) -> bool:
    """The micro-batch size reaches the step part through FSDP1's and the HF Trainer's FSDP2's no_sync accumulation
    over the micro-batches (fsdp1.transients, hf_fsdp2.no_sync_gradients), a pipelined FSDP2 stage's per-micro-batch buffers (pp_buffers.pipelining_buffers: their
    count and tokens) and Megatron's global memory buffer (activations/moe.global_memory_buffer: s*b*h gathered
    over TP with sequence parallelism, or over EP x expert-TP by the all-gather dispatcher, or the local spec's
    unfused attention's b*a/t*s^2 scores); DeepSpeed's ZeRO-3
    coordinator holds the embedding past its count when a step has more than one micro-batch
    (transients._zero3_gathered, zero3_trace.gathered_elements)."""
    fw = training.framework
    if fw in ("fsdp1", "deepspeed", "hf_fsdp2") or (fw == "fsdp2" and par.pp > 1):
        return True
    return fw == "megatron" and ((par.sequence_parallel and par.tp > 1) or training.transformer_impl == "local"
                                 or (training.moe_dispatcher == "allgather" and par.ep * par.etp > 1))


def _reads_loss(training: Training) -> bool:
    """The loss reaches it through FSDP2's head unit gathered alone under torchtitan's chunked loss
    (transients._titan_gathered)."""
    return training.framework == "fsdp2"


def _reads_recompute(training: Training, recipe: Recipe) -> bool:
    """The recompute setting reaches it through autocast's weight copies kept for backward (all of them, or one
    recomputed layer's: transients._autocast_copies), FSDP2's unit gradients under torchtitan's full
    activation checkpointing (backward_moments.titan_full_ac) and DeepSpeed ZeRO-3's hook order, which a
    recomputed forward repeats (zero3_trace.py). Its modules and layers never do: Megatron's block recompute
    count is read by the rest of the static part only (memory.static_key)."""
    return recipe.autocast_weight_copies or training.framework in ("fsdp2", "deepspeed")


def _reads_recomputed_layers(training: Training) -> bool:
    """Which modules and layers are recomputed reaches it through DeepSpeed ZeRO-3's hook order alone: a
    recomputed layer's forward hooks run again in backward (zero3_trace.py)."""
    return training.framework == "deepspeed"


def sealed_fields(training: Training, par: Parallel, recipe: Recipe) -> tuple[str, ...]:
    """The fields of `training` that the step part of a stage on layout `par` does not read."""
    return ((() if _reads_recomputed_layers(training) else ("recompute_modules", "recompute_layers"))
            + (() if _reads_recompute(training, recipe) else ("recompute",))
            + (() if _reads_micro_batch(training, par) else ("micro_batch_size",))
            + (() if _reads_loss(training) else ("loss",)))


def step_setup(arch: Architecture, training: Training, fields: tuple[str, ...]) -> Training:
    """`training` with `fields` (its `sealed_fields`) sealed, remembered on the architecture (a search asks for
    the same one for every layout of a shape)."""
    return arch.cached(("step setup", training, fields), lambda: _sealed(training, fields))


def _sealed(training: Training, fields: tuple[str, ...]) -> Training:
    setup = copy.copy(training)  # not through the constructor: its checks read every field
    setup.__dict__.update({name: _SEALED[name] for name in fields})
    return setup
