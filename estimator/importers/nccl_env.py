"""NCCL_CUMEM_ENABLE in a launch's environment (training.nccl_cumem), and the value an RL stack gives its training
processes when the launch leaves it alone (spec/nccl.py RL_STACKS_CUMEM_OFF).

NCCL reads the variable as an integer once a process (src/misc/cudawrap.cc ncclCuMemEnable, v2.28.9-1:
``param >= 0 ? param : (param == -2 && ncclCuMemSupported)``): 0 turns cuMem off, a positive value on, -2 is the
default (on where the driver supports it: left to the torch release's default here).
"""

from __future__ import annotations

import re

from ..spec.nccl import RL_STACKS_CUMEM_OFF
from .build import ConfigBuilder

NAME = "NCCL_CUMEM_ENABLE"


def cumem_value(text: object) -> bool | None:
    """NCCL's reading of NCCL_CUMEM_ENABLE: True for a positive value, False for 0 or a negative one other than -2,
    None for -2 (the default) or what is not an integer (None too: the caller notes it)."""
    value = str(text).strip()
    if not re.fullmatch(r"[+-]?\d+", value):
        return None
    number = int(value)
    return None if number == -2 else number > 0


def read_cumem(env: dict[str, str], build: ConfigBuilder, name: str = NAME, stack: str | None = None) -> None:
    """training.nccl_cumem from `env`'s NCCL_CUMEM_ENABLE (its setting named `name` in the ledger), else, for an RL
    `stack` that sets it in its training processes, that stack's "0"."""
    if NAME in env:
        text = env[NAME]
        value = cumem_value(text)
        if value is not None:
            build.set("training.nccl_cumem", value, name, text, why="NCCL " + ("allocates with cuMem" if value else
                                                                          "allocates without cuMem (cudaMalloc)"))
        elif str(text).strip() == "-2":
            build.ledger.mapped(name, text, "NCCL's default: cuMem as the torch release's NCCL has it")
        else:
            build.ledger.not_modelled(name, text, "not an integer: NCCL keeps its default")
        return
    if stack is not None:
        build.set("training.nccl_cumem", False, f"({stack} sets {NAME}=0)", "",
                  why=f"its training processes allocate without cuMem: {RL_STACKS_CUMEM_OFF[stack]}")
