"""The registry's entry for TRL's release (training.trl_version; its rules: spec/trl.py)."""

from __future__ import annotations

from .choices import BNB_VERSION_PATTERN
from .field import Field

TRL_VERSION = "1.9.0"  # the release measured (validation/accelerate/trl_sft.py), what an empty trl_version means

TRL_FIELDS: tuple[Field, ...] = (
    Field("trl_version", "training", "text", "TRL version", "training_loop trl_sft: the TRL release. Its "
          "SFTTrainer computes metrics from the kept logits from 0.15.0 (token accuracy; 0.15.x gathers every rank's "
          "logits: not modelled), their entropy from 0.22.0 (a whole sample's log-softmax at once in 0.22.x, 128 "
          "rows from 0.23.0); loss chunked (chunked_nll) exists from 1.4.0 and is the default without Liger from "
          "1.7.0.", "Run", pattern=BNB_VERSION_PATTERN, pattern_text="a TRL release as major.minor[.patch]",
          optional=True, auto=f"{TRL_VERSION} (measured)"),
)
