"""One weight of a model, and how tensor parallelism splits it (Megatron-Core, Shoeybi et al. 2019,
section 3): the unit `architecture` and `hybrid` list a layer's parameters in."""

from __future__ import annotations

import math
from dataclasses import dataclass

COLUMN = "column"  # output dimension split over TP (QKV, fc1, their biases)
ROW = "row"  # input dimension split over TP (output projection, fc2); their biases are replicated
VOCAB = "vocab"  # vocabulary rows split over TP (embedding, LM head)
REPLICATED = "replicated"  # every TP rank holds all of it (norms, routers, MLA down-projections)
EXPERT_COLUMN = "expert_column"  # routed experts: experts over EP, width over expert-TP
EXPERT_ROW = "expert_row"


@dataclass(frozen=True)
class ParameterTensor:
    """One weight (or bias, or norm scale) of the model."""

    name: str
    shape: tuple[int, ...]
    split: str  # one of COLUMN, ROW, VOCAB, REPLICATED, EXPERT_COLUMN, EXPERT_ROW
    role: str  # "hidden_matrix", "embedding", "head", "vector" (norms, biases, router bias)
    copies: int = 1  # e.g. the number of routed experts of identical shape

    @property
    def numel(self) -> int:
        return math.prod(self.shape) * self.copies

    @property
    def is_expert(self) -> bool:
        return self.split in (EXPERT_COLUMN, EXPERT_ROW)
