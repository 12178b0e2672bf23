"""TRL's SFTTrainer by release (training.trl_version): what each release keeps around its loss.

Read at huggingface/trl's tags; the commit that made each change is named. Measured: 1.9.0, the default
(validation/accelerate/trl_sft.py, tests/data/measured/accelerate/*-trl-sft-*).

- before 0.15.0 SFTTrainer has no compute_loss of its own: the Trainer's (no metrics).
- 0.15.0 (84d73fd0, #2597): token accuracy from the kept logits; 0.15.x gathers every rank's shifted logits
  (`accelerator.gather_for_metrics(shift_logits)`) before the accuracy: refused, not modelled. 0.16.0 counts
  the correct tokens per rank and gathers the counts: `logits[..., :-1, :].contiguous()` (a copy above one
  sample) and its int64 argmax, beside the kept logits.
- 0.22.0 (da167d88, #3940): the logits' entropy before the accuracy, `entropy_from_logits(outputs.logits)` with
  chunk_size 1 over dim 0: one sample's log-softmax, exp and product at once (3 x s x V); from 0.23.0 128
  rows of the flattened logits at a time (a view of them).
- 1.3.0 (c693ca12, #5620): the entropy of the shifted logits, whose flattening copies them above one sample
  (the 1.9.0 moment measured: activations/trl_loss.py nll_metrics).
- 1.4.0: loss_type chunked_nll (the head in checkpointed 256-target chunks; the targets gathered by a boolean
  mask through 1.7, by an argsort from 1.8.0: the same bytes, an int64 index and label per target).
- 1.7.0: chunked_nll the default without Liger (sft_config.py __post_init__); before, nll.
"""

from __future__ import annotations

import re

from .choices import BNB_VERSION_PATTERN
from .errors import ConfigError
from .trl_fields import TRL_VERSION

METRICS_FROM = (0, 15, 0)
GATHERED_LOGITS_UNTIL = (0, 16, 0)
ENTROPY_FROM = (0, 22, 0)
ROW_CHUNKS_FROM = (0, 23, 0)
SHIFT_BEFORE_ENTROPY = (1, 3, 0)
CHUNKED_NLL_FROM = (1, 4, 0)
CHUNKED_DEFAULT_FROM = (1, 7, 0)

_VERSION = re.compile(BNB_VERSION_PATTERN)



def trl_release(training) -> tuple[int, int, int]:
    """training.trl_version as numbers; empty: the measured release."""
    match = _VERSION.fullmatch(training.trl_version or TRL_VERSION)
    return tuple(int(g or 0) for g in match.groups())  # type: ignore[union-attr, return-value]


def check(training) -> None:
    """A TRL release names what it runs: empty outside trl_sft, and the loss its release has."""
    if training.trl_version is None:
        return
    if training.training_loop != "trl_sft":
        raise ConfigError("training.trl_version", training.trl_version, "empty unless training_loop is 'trl_sft'",
                          "it names the SFTTrainer's release", related=("training.training_loop",))
    version = trl_release(training)
    metrics = training.loss == "standard" and not training.liger_kernel
    if metrics and METRICS_FROM <= version < GATHERED_LOGITS_UNTIL:
        raise ConfigError("training.trl_version", training.trl_version, "before 0.15.0 or from 0.16.0 with loss "
                          "'standard'", "TRL 0.15's token accuracy all-gathers every rank's shifted fp32 logits "
                          "(sft_trainer.py compute_loss, gather_for_metrics): not modelled",
                          related=("training.loss",))
    if training.loss == "chunked" and not training.liger_kernel and version < CHUNKED_NLL_FROM:
        raise ConfigError("training.loss", "chunked", "'standard' (or liger_kernel) with trl_version before 1.4.0",
                          "TRL's chunked_nll arrived in 1.4.0", related=("training.trl_version",))


def default_loss(version: tuple[int, int, int]) -> str:
    """The SFTConfig's loss_type when unset and Liger is off, by release."""
    return "chunked_nll" if version >= CHUNKED_DEFAULT_FROM else "nll"
