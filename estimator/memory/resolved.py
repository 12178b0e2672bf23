"""A configuration resolved once: every default decided, every derived size computed.

The memory model, the roofline, the advice and the planner read a `Resolved` rather than
re-deriving its values, so each rule has one owner: the ZeRO stage a framework runs
(`states.resolve_zero_stage`, through `validation.validate`), the precision recipe
(`training.resolve_recipe`), Megatron's padded vocabulary (`sharding.padded_vocab_size`), the
global batch and micro-batches (`pipeline.global_batch_size`), each pipeline stage's layers
and parameter buckets (`sharding.stage_parameters`), and the model the framework builds: without the
checkpoint's multi-token-prediction modules where it does not build them (`mtp_built.mtp_build`), so no
part of the estimate counts them. The layout's own derived defaults (sequence
parallelism with TP, ETP = TP) are resolved by `Parallel` itself.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import cache
from typing import NamedTuple

from .pipeline import global_batch_size
from .adapters import check_adapter, fused_targets
from ..spec.rl import check_rl
from ..spec.architecture import Architecture
from ..spec.errors import ConfigError
from ..spec.gpus import GPU
from ..spec.hardware import Hardware
from ..spec.parallel import Parallel
from .mtp_built import MtpBuild, as_built, mtp_build
from .sharding import StageParameters, padded_vocab_size, split_key, stage_parameters
from ..spec.training import Recipe, Training, resolve_recipe
from .validation import validate


@dataclass(frozen=True)
class Resolved:
    architecture: Architecture
    training: Training
    parallel: Parallel
    hardware: Hardware
    recipe: Recipe
    zero_stage: int
    padded_vocab: int
    global_batch_size: int
    microbatches: int
    stages: tuple[StageParameters, ...]
    mtp: MtpBuild  # the checkpoint's MTP modules and how many the framework builds (architecture: as built)

    @property
    def gpu(self) -> GPU:
        return self.hardware.device

    @property
    def is_training(self) -> bool:
        return self.training.mode == "training"


@cache
def _default(section: type):
    """A section left out: its defaults, checked once (the dataclasses are frozen, so one is shared)."""
    return section()


def resolve(arch: Architecture, training: Training | None = None, par: Parallel | None = None,
            hardware: Hardware | None = None) -> Resolved:
    """Check the configuration (`ConfigError` naming the field) and decide everything it leaves open."""
    training = training or _default(Training)
    par = par or _default(Parallel)
    hardware = hardware or _default(Hardware)
    mtp = mtp_build(arch, training)
    arch = as_built(arch, training)
    if training.adapter is not None and fused_targets(training.adapter, arch) is not training.adapter:
        training = training_with(arch, training, adapter=fused_targets(training.adapter, arch))
    # all but the hardware follows from the architecture, the training setup and the layout: a layout
    # search and an app rerun ask for the same ones again, so they are checked and derived once (the
    # architecture is immutable; a configuration that fails a check is remembered as refused, and raises every time)
    derived = arch.cached(("resolved", training, par), lambda: _derived_or_refused(arch, training, par),
                          per_layout=True)
    if type(derived) is _Refused:
        raise ConfigError(*derived)
    zero, recipe, vocab, gbs, stages = derived
    return Resolved(architecture=arch, training=training, parallel=par, hardware=hardware,
                    recipe=recipe, zero_stage=zero, padded_vocab=vocab, global_batch_size=gbs,
                    microbatches=gbs // (training.micro_batch_size * par.dp), stages=stages, mtp=mtp)


def training_with(arch: Architecture, training: Training, **fields) -> Training:
    """`training` with `fields` set, remembered on the architecture: the parts of an estimate that do
    not read some fields key their memos on the training setup without them, and a search asks for
    the same one for many layouts (a Training checks every field when it is made)."""
    if all(getattr(training, name) == value for name, value in fields.items()):
        return training
    return arch.cached(("training with", training, tuple(fields.items())), lambda: replace(training, **fields))


class _Refused(NamedTuple):
    """A configuration the checks refused, remembered as its error's fields (`ConfigError`'s arguments): every
    search of a model meets the same refused layouts (about 6,100 of DeepSeek-V3's on 2,048 GPUs), and an app
    rerun the same refused configuration. A new error is raised from them each time: raising one error object
    again would lengthen its traceback, and keep its frames, with every raise."""

    field: str
    value: object
    allowed: str
    reason: str
    related: tuple[str, ...]


def _derived_or_refused(arch: Architecture, training: Training, par: Parallel) -> tuple:
    """`_derived`, or the `_Refused` record of the check that failed."""
    try:
        return _derived(arch, training, par)
    except ConfigError as err:
        if type(err) is not ConfigError:  # a subclass (a Hub error) carries more than these fields
            raise
        return _Refused(err.field, err.value, err.allowed, err.reason, err.related)


def _derived(arch: Architecture, training: Training, par: Parallel) -> tuple:
    """(ZeRO stage, recipe, padded vocabulary, global batch, stages) of a configuration that passes the checks."""
    zero = validate(arch, training, par)
    if training.adapter:
        check_adapter(training.adapter, arch, training, par)
    if training.rl:
        check_rl(training.rl, training, par)
    vocab = padded_vocab_size(arch.vocab_size, par.tp, training.framework)
    # the stages depend on the architecture and the layout's split only: layouts that share it share them
    key = ("stages", par.tp, par.ep, par.etp, vocab) + split_key(par)
    stages = arch.cached(key, lambda: tuple(stage_parameters(arch, par, training.framework)))
    return zero, resolve_recipe(training), vocab, global_batch_size(training, par), stages
