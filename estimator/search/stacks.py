"""What each framework runs: the layouts the planner walks for it.

A layout the planner lists is one its user can launch: every split, recompute setting and loss of a
framework's record below is one that framework's own launch configuration names (and `plan --emit`
writes, but for torchtitan 0.3.0's ChunkedLossWrapper, which the v0.2.2 job config it writes cannot state).
The estimator estimates more (a hand-made configuration may ask for Megatron's first-n-layers recompute
under the HF Trainer); the planner never proposes it.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from ..spec.training import Training
from ..spec.versions import release

SPLITS = ("tp", "pp", "cp", "ep")  # the model splits beyond data parallelism


@dataclass(frozen=True)
class Stack:
    """The layouts one framework runs."""

    splits: tuple[str, ...]  # the parallel sizes it may set above 1 (of SPLITS)
    interleaved: bool  # virtual pipeline stages (vpp > 1)
    zero_stages: tuple[int, ...]  # with a group to shard over; a world of one runs stage 0
    recompute: tuple[str, ...]  # its recompute modes, of "none", "selective", "full"
    partial: bool  # full recompute of the first n layers of a stage, not only all of them
    losses: tuple[str, ...]  # its losses, of "standard", "fused", "chunked"
    source: str
    # losses another of its losses beats on memory and speed alike (rule 5 of planner.py): never estimated
    set_aside: tuple[str, ...] = ("standard",)
    loss_text: str = ""  # its losses in its own words, where "fused" or "chunked" names a kernel of its own

    @property
    def searched(self) -> tuple[str, ...]:
        """The losses the search estimates, one or a pair: its own less those set aside."""
        return tuple(x for x in self.losses if x not in self.set_aside)

    def settings(self, mode: str, most: int) -> int:
        """How many settings of a recompute mode a shape has: full on 1 ... `most` layers where the stack
        recomputes part of a stage, else one (every layer); none if the stack has no such mode."""
        if mode not in self.recompute:
            return 0
        return most if mode == "full" and self.partial else 1


_TRAINER = ("the HF Trainer's arguments (transformers 5.23 training_args.py): data parallelism alone, "
            "gradient_checkpointing on every layer or none, transformers' loss or Liger's cross-entropy "
            "(fused) and fused linear cross-entropy (chunked) through use_liger_kernel")

_TRAINER_LOSSES = ("standard, fused (Liger's cross-entropy), chunked (Liger's fused linear cross-entropy; TRL's "
                   "chunked_nll under training_loop trl_sft)")

STACKS: dict[str, Stack] = {
    "megatron": Stack(SPLITS, True, (0, 1, 2, 3), ("none", "selective", "full"), True, ("standard", "fused"),
                      "Megatron-LM arguments: --tensor/--pipeline/--context/--expert-model-parallel-size, "
                      "--num-layers-per-virtual-pipeline-stage, --recompute-granularity selective|full with "
                      "--recompute-method block --recompute-num-layers n, --cross-entropy-loss-fusion "
                      "(no chunked loss)", set_aside=(),
                      loss_text="standard, fused (--cross-entropy-loss-fusion)"),
    "fsdp2": Stack(SPLITS, True, (0, 2, 3), ("none", "selective", "full"), False, ("standard",),
                   "torchtitan's job config: parallelism.*_degree, Interleaved1F1B, module_fqns_per_model_part; "
                   "activation_checkpoint.mode none|selective|full (no first-n-layers mode); its cross-entropy",
                   set_aside=()),
    "torchtune": Stack((), False, (2, 3), ("none", "full"), False, ("standard", "chunked"),
                       "torchtune's distributed recipes: FSDP2 over every rank (fsdp_reshard_after_forward), "
                       "enable_activation_checkpointing, CEWithChunkedOutputLoss",
                       loss_text="standard, chunked (CEWithChunkedOutputLoss)"),
    "deepspeed": Stack((), False, (0, 1, 2, 3), ("none", "full"), False, ("standard", "fused", "chunked"),
                       _TRAINER + "; zero_optimization.stage 0-3", loss_text=_TRAINER_LOSSES),
    "hf": Stack((), False, (0,), ("none", "full"), False, ("standard", "fused", "chunked"), _TRAINER,
                loss_text=_TRAINER_LOSSES),
    "fsdp1": Stack((), False, (3,), ("none", "full"), False, ("standard", "fused", "chunked"),
                   _TRAINER + "; fsdp full_shard (its other strategies are estimated, not searched)",
                   loss_text=_TRAINER_LOSSES),
    "hf_fsdp2": Stack((), False, (2, 3), ("none", "full"), False, ("standard", "fused", "chunked"),
                      _TRAINER + "; Accelerate's FSDP2 with reshard_after_forward true (3) or false (2)",
                      loss_text=_TRAINER_LOSSES),
}


# torchtitan's ChunkedLossWrapper (components/loss.py), the default loss of every recipe in the releases measured
# (0.3.0; main reads the same, spec/versions.py): loss "chunked" under fsdp2 (activations/loss.py
# _torchtitan_chunked_loss; validation/torchtitan/cases.py). The earlier releases' loss is the standard one
# (importers/torchtitan.py, v0.2.2 components/loss.py), which `plan --emit torchtitan` writes.
TITAN_CHUNKED_RELEASES = ("0.3.0", "main")


def stack(training: Training) -> Stack:
    st = STACKS[training.framework]
    if training.framework == "fsdp2":
        if release("fsdp2", training.framework_version).version in TITAN_CHUNKED_RELEASES:
            return replace(st, losses=("standard", "chunked"),
                           loss_text="standard, chunked (ChunkedLossWrapper, the recipes' default from 0.3.0)")
    return st


def searched_losses(training: Training) -> tuple[str, ...]:
    """The losses the search estimates (`Stack.searched`). Under Megatron the standard loss stays beside the fused
    one: the native fused cross-entropy holds 4 B per logit more at backward's start (its compiled backward's fp32
    copy of the softmax), so the standard one may fit where the fused one does not, at a speed of its own."""
    return stack(training).searched


def in_words(training: Training) -> str:
    """The stack's layouts in a line, as the Planner page and the CLI say what they searched."""
    st = stack(training)
    splits = ", ".join(s.upper() + (" (with VPP)" if s == "pp" and st.interleaved else "") for s in st.splits)
    modes = [m if m != "full" else ("full (on n layers of a stage)" if st.partial else "full (every layer)")
             for m in st.recompute]
    return (f"{'DP with ' + splits if splits else 'data parallelism only'}; ZeRO {'/'.join(map(str, st.zero_stages))}; "
            f"recompute {', '.join(modes)}; loss {st.loss_text or ', '.join(st.losses)}")
