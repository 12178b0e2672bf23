"""Megatron-LM / Megatron-Core: a ``pretrain_gpt.py`` command line, the script that builds it, or a
file of its arguments, read into our JSON config.

Flags, their defaults and their meaning follow Megatron-LM core_v0.16.1
(``megatron/training/arguments.py``; commit 55ac7082517c3878ae653c07c09c534b8aed49f6) and
megatron-core 0.16.1's ``TransformerConfig``; each mapping below cites the rule of ``validate_args``
it copies. The flag table itself is `megatron_flags.FLAGS`. A ``torchrun --nproc_per_node P
--nnodes N`` prefix gives the world size; ``--gpus`` overrides it.
"""

from __future__ import annotations

import re

from ..spec.errors import ConfigError
from .build import ConfigBuilder, split_flags, to_int
from .result import Imported, Ledger
from .shell import Launch, read_launch
from .megatron_args import _Args, _arity, VERSION
from .megatron_model import _model
from .megatron_training import _account_rest, _allocator, _parallel, _training
from .nccl_env import read_cumem

KIND = "megatron"
_ENTRY = re.compile(r"(?:^|/)pretrain_gpt\.py$")
_LAUNCHERS = ("torchrun", "torch.distributed.run", "torch.distributed.launch")


def is_entry(word: str) -> bool:
    return bool(_ENTRY.search(word))


def looks_like(text: str, name: str = "") -> bool:
    return bool(_ENTRY.search(text) or re.search(r"--(tensor|pipeline)-model-parallel-size\b|--num-layers\b", text))


def read(text: str, gpus: int | None = None, overrides: tuple[str, ...] = ()) -> Imported:
    """`overrides`: flags given beside the file (after ``--`` on our command line); they come last,
    so they win as a repeated flag does in argparse."""
    ledger = Ledger()
    launch = read_launch(text, is_entry)
    if overrides:
        launch = Launch(launch.launcher, launch.entry, launch.args + tuple(overrides), launch.notes, launch.env)
    for note in launch.notes:
        ledger.note(note)
    if not launch.entry and not any(w.startswith("--") for w in launch.args):
        raise ConfigError("launch config", "megatron", "a pretrain_gpt.py command line, its script or its arguments",
                          "no Megatron flags found")
    args = _Args(split_flags(launch.args, _arity, ledger, VERSION))
    build = ConfigBuilder(ledger)
    world = _world_size(launch.launcher, gpus, ledger)
    _model(args, build, ledger)
    _training(args, build, ledger)
    _parallel(args, build, ledger, world)
    _account_rest(args, ledger)
    _allocator(dict(launch.env), build)
    read_cumem(dict(launch.env), build)
    return ledger.result(KIND, {"model": build.named_model or build.model, **build.config})


def _world_size(launcher: tuple[str, ...], gpus: int | None, ledger: Ledger) -> int | None:
    """torchrun's --nproc_per_node x --nnodes; --gpus wins where both are given."""
    per_node = nodes = None
    if launcher and any(w.split("/")[-1] in _LAUNCHERS or w in _LAUNCHERS for w in launcher):
        values = dict(_launcher_pairs(launcher))
        per_node = values.get("--nproc_per_node", values.get("--nproc-per-node"))
        nodes = values.get("--nnodes")
        for flag, value in values.items():
            if flag not in ("--nproc_per_node", "--nproc-per-node", "--nnodes"):
                ledger.ignore(flag, value, "launcher setting (rendezvous, ranks)")
    launched = None
    if per_node is not None or nodes is not None:
        p = to_int("--nproc_per_node", per_node if per_node is not None else "1", 1)
        n = to_int("--nnodes", nodes if nodes is not None else "1", 1)
        launched = p * n
        ledger.mapped("torchrun --nproc_per_node x --nnodes", f"{p} x {n}", f"world size {launched}")
    if gpus is not None:
        if launched is not None and launched != gpus:
            ledger.note(f"--gpus {gpus} replaces the launcher's world size {launched}")
        return gpus
    return launched


def _launcher_pairs(words: tuple[str, ...]):
    i = 0
    while i < len(words):
        w = words[i]
        i += 1
        if w.startswith("--"):
            name, eq, value = w.partition("=")
            if not eq and i < len(words) and not words[i].startswith("-"):
                value = words[i]
                i += 1
            yield name, value
