"""The framework releases whose rules the estimator knows (training.framework_version).

A rule that belongs to a release is keyed on the version named here, and every release names the
tag and commit its source was read at. The first release of each framework is the default: the
one the harness records (tests/data/measured) were measured on, so an estimate that names no
version is the measured one. How each release's source is obtained: validation/install_frameworks.sh.

What differs between the releases offered, as far as the estimator models it:

- megatron 0.16 and 0.19: the TransformerEngine each installs (training.te_version's default, TE_VERSIONS
  below): 0.16's pip extra takes TE 2.11, whose FusedAdam builds Megatron-FSDP's Adam moments (ZeRO 3) at
  the DTensor's global shape, whole on every GPU; 0.19's TE 2.17.1 shards them (memory/megatron_fsdp.py,
  keyed on the TE release). Otherwise nothing yet: both run Megatron-Core's tunable interleaved schedule
  (pipeline_parallel/schedules.py get_pp_rank_microbatches, identical at both tags; the rule
  before it, every forward first when micro-batches = PP, ended with core_v0.10.0, commit
  4295be1a "tunable schedule with overlapping", 2024-11-01), the same native fused cross-entropy
  (fusions/fused_cross_entropy.py unchanged) and TransformerEngine's in-place cross-entropy: each
  release pins a TE before TE v2.18 (0.16.1: rev 5671fd36, TE 2.12; 0.19.0: rev 4329ff84,
  TE 2.17.1), whose cross_entropy_forward writes the gradient into the 16-bit logits; TE v2.18
  (commit 01bbe3ee) saves an fp32 gradient instead, a rule for a later Megatron release.
- fsdp2 0.3.0 and main: nothing. torchtitan compiles the loss with the model whenever compile is
  on in both (components default ["model", "loss"], config/configs.py; since v0.1.0, commit
  f7084fc7, components/loss.py), and components/loss.py's cross-entropy, the activation
  checkpointing policy (distributed/activation_checkpoint.py) and the compile defaults are the
  same at both (compared file by file).
- deepspeed 0.19.5 and 0.12.3 (Qwen-1's fine-tuning table ran DeepSpeed of late 2023): where ZeRO-3's
  coordinator restarts its count of gathered parameters, which decides whether a run of one micro-batch a step
  gathers an embedding's worth more (memory/zero3_trace.py), whether each backward's end releases the
  embedding (from 0.19.3: release_backward_leftovers; before, a run of several micro-batches a step starts each
  later one with it gathered: memory/zero3_trace.py, memory/deepspeed_gathers.py), and ZeRO-3's initialisation
  on one GPU, whose order of allocations the reserved-memory replay follows (memory/deepspeed_replay.py: 0.12.3
  makes each fp32 partition from a 16-bit clone and steps the optimizer once at initialisation, making Adam's
  moments there); the other DeepSpeed rules cite 0.19.5 (ZeRO-3's sub-group flattening, its step and the
  coordinator's prefetch and release rules read the same at 0.12.3).
- fsdp2 2024-12, 0.1.0 and 0.2.0: the releases of torchtitan's published benchmarks (issue 22).
  What differs (the loss's compilation, the root FSDP unit, TP's loss-parallel cross-entropy) is
  keyed in memory/titan_releases.py, each rule with the commit that made it.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Release:
    framework: str  # training.framework
    version: str  # training.framework_version
    name: str  # the release in words
    tag: str  # the git tag (or branch) read, or the PyPI release installed
    commit: str = ""  # the commit read (a PyPI release is its wheel's source)

    @property
    def cited(self) -> str:
        """How a source comment names it: ``Megatron-Core 0.16.1 (core_v0.16.1, 55ac7082)``."""
        return f"{self.name} ({self.tag}{', ' + self.commit[:8] if self.commit else ''})"

    @property
    def number(self) -> tuple[int, ...]:
        """A numbered release as numbers, (0, 15, 4), for rules that hold from a release on."""
        return tuple(int(part) for part in self.version.split("."))


RELEASES: dict[str, tuple[Release, ...]] = {
    "megatron": (
        Release("megatron", "0.16", "Megatron-Core 0.16.1", "core_v0.16.1", "55ac7082517c3878ae653c07c09c534b8aed49f6"),
        Release("megatron", "0.19", "Megatron-Core 0.19.0", "core_v0.19.0", "5be9626709af2722333bf54797c954c09edeada3"),
    ),
    "fsdp2": (
        Release("fsdp2", "0.3.0", "torchtitan 0.3.0", "PyPI torchtitan==0.3.0"),
        Release("fsdp2", "main", "torchtitan main", "main", "b5bcd76c66d0acb1a08b176d9639425bc55e0b2a"),
        Release("fsdp2", "0.2.0", "torchtitan 0.2.0", "v0.2.0", "29624e37fa6dd319fd671b009338651b5c665da2"),
        Release("fsdp2", "0.1.0", "torchtitan 0.1.0", "v0.1.0", "f7084fc78567f865d0c411f2c7b9bbbef6b155ac"),
        # main of December 2024, the Llama 3.1 benchmarks' commit (assets/version.txt read 0.0.2 from April 2024)
        Release("fsdp2", "2024-12", "torchtitan main of December 2024", "main",
                "9dec370ad26b5f8e9a7333a0e36165018262644b"),
    ),
    "torchtune": (
        Release("torchtune", "0.6.1", "torchtune 0.6.1", "PyPI torchtune==0.6.1"),
    ),
    "deepspeed": (
        Release("deepspeed", "0.19.5", "DeepSpeed 0.19.5", "PyPI deepspeed==0.19.5"),
        Release("deepspeed", "0.12.3", "DeepSpeed 0.12.3", "PyPI deepspeed==0.12.3"),
    ),
}

# DeepSpeed moved ZeRO-3's reset_step (the coordinator's count back to 0) from the end of the backward
# (stage3.py backward, through 0.15.3) to the start of the forward (parameter_offload.py
# _start_of_forward_hook) in 0.15.4 (memory/zero3_trace.py gathered_elements)
DEEPSPEED_RESET_AT_FORWARD = (0, 15, 4)

# DeepSpeed's ZeRO-3 releases, at each backward's end, the parameters of the modules whose backward hook gathered them
# and whose post-backward hook never ran (stage3.py backward_epilogue -> parameter_offload.py
# release_backward_leftovers -> partitioned_param_coordinator.py release_backward_leftovers, v0.19.5 l. 2772 and
# l. 554): the embedding, whose token ids need no gradient. Commit a31eb316 ("Z3: Support for activation ckpt with
# frozen params", #8148, 2026-07-22), first in v0.19.3; before, the embedding stayed gathered to the optimizer step
# (memory/zero3_trace.py gathered_elements, memory/deepspeed_gathers.py Gathers.end_backward)
DEEPSPEED_RELEASE_LEFTOVERS = (0, 19, 3)

# DeepSpeed stepped the optimizer once while building ZeRO's optimizer (stage3.py initialize_optimizer_states
# `self._optimizer_step(i)` per sub-group, v0.12.3 l. 1006-1008; stage_1_and_2.py initialize_optimizer_states
# `self.optimizer.step()`, v0.12.3 l. 645), so Adam's moments were made at initialisation; commit 18179807
# ("Remove optimizer step on initialization", #5104, 2024-02-10), first in v0.13.2, leaves them to the first step
# (memory/deepspeed_replay.py _init_zero3)
DEEPSPEED_NO_INIT_STEP = (0, 13, 2)

# PyTorch (training.torch_version): the minor releases whose rules differ from the measured stack's (torch 2.11-2.13,
# what None means). torch 2.0.1 (e9ebda29) torch/optim/adamw.py _multi_tensor_adamw l. 564-568:
# `exp_avg_sq_sqrt = torch._foreach_sqrt(...)`, `_foreach_div_` in place, then `denom = torch._foreach_add(
# exp_avg_sq_sqrt, eps)` out of place, both alive at `_foreach_addcdiv_`; torch 2.1.0 (7bcf7da3) l. 599-603 adds eps in
# place (`torch._foreach_add_(exp_avg_sq_sqrt, eps)`): one temporary from 2.1 (memory/transients.py _step_temporaries)
TORCH_VERSIONS: tuple[str, ...] = ("2.0", "2.1", "2.2", "2.3", "2.4", "2.5", "2.6", "2.7", "2.8", "2.9", "2.10", "2.11",
                                   "2.12", "2.13")
TORCH_FOREACH_ADD_IN_PLACE = (2, 1)


def torch_release(version: str | None) -> tuple[int, int]:
    """training.torch_version as (major, minor); None: the measured stack's (2.13)."""
    major, minor = (version or TORCH_VERSIONS[-1]).split(".")
    return int(major), int(minor)


# every version any framework offers, in one list (the field's options)
VERSIONS: tuple[str, ...] = tuple(dict.fromkeys(r.version for rs in RELEASES.values() for r in rs))


def offered(framework: str) -> tuple[str, ...]:
    """The versions a framework offers (none for hf, whose rules are not versioned)."""
    return tuple(r.version for r in RELEASES.get(framework, ()))


def release(framework: str, version: str | None) -> Release | None:
    """The release a training setup names, its framework's default when `version` is None; None
    for a framework without versioned rules."""
    releases = RELEASES.get(framework, ())
    if not releases:
        return None
    if version is None:
        return releases[0]
    return next(r for r in releases if r.version == version)


# TransformerEngine (training.te_version, framework megatron): the minor releases offered, and the one
# each Megatron-Core release installs. core_v0.16.1's pip extra ``dev`` pins
# ``transformer-engine[pytorch,core_cu13]>=2.9.0a0,<2.12.0`` (pyproject.toml line 71): pip takes 2.11.
# core_v0.19.0's extra ``te`` names no version (pyproject.toml line 126) and its uv source is rev 4329ff84,
# TE v2.17.1 (line 234): 2.17.
TE_VERSIONS: tuple[str, ...] = ("2.8", "2.9", "2.10", "2.11", "2.12", "2.13", "2.14", "2.15", "2.16", "2.17", "2.18")
# "not_installed": Megatron-Core installed alone (pip install megatron-core), neither TransformerEngine nor Apex:
# the local layer spec, and megatron/core/optimizer/__init__.py (core_v0.16.1 lines 12-34) falls back to
# torch.optim.AdamW
TE_NONE = "not_installed"  # not "none": an optional field reads "none" as auto (values.py _AUTO_TEXT)
MEGATRON_TE: dict[str, str] = {"0.16": "2.11", "0.19": "2.17"}


# torchao, whose AdamW8bit is torchtune's 8-bit AdamW (spec/optimizers.py step_scratch): torchtune pins no
# torchao; its 0.6.1 (v0.6.1, a6290a5b, 2025-04-07) was measured with torchao 0.10.0 (v0.10.0, 8b264ce1,
# 2025-04-02), the stable release of its week (validation/torchtune/plugin.py).
TORCHTUNE_TORCHAO: dict[str, tuple[int, ...]] = {"0.6.1": (0, 10, 0)}


def te_version(framework: str, framework_version: str | None, te: str | None) -> str | None:
    """The TransformerEngine release a Megatron run uses: `te` when given, else the one its Megatron-Core
    release installs (MEGATRON_TE); None for the other frameworks, which do not run TE."""
    if framework != "megatron":
        return None
    return te or MEGATRON_TE[release(framework, framework_version).version]


def default_versions_text() -> str:
    return ", ".join(f"{fw} {rs[0].version} ({rs[0].name})" for fw, rs in RELEASES.items())
