"""Where parameters live: pipeline stages, and the share of each stage one GPU holds.

Parameters fall into buckets by how they are split (Megatron-Bridge ``theoretical_memory_utils``
does the same): TP-sharded (attention, MLP, shared experts, embedding and head, divided by t),
replicated (norms, routers, MLA down-projections, divided by 1) and routed experts (divided by
EP x expert-TP). Pipeline stages own consecutive layers; the first holds the embedding (and a
learned position table), the last the final norm and LM head, and with tied embeddings and
PP > 1 the last stage keeps its own copy of the embedding matrix as the head (Megatron keeps
both copies and all-reduces their gradients, Shoeybi et al. 2019).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from .architecture import (COLUMN, EXPERT_COLUMN, EXPERT_ROW, REPLICATED, ROW, VOCAB,
                           Architecture, ParameterTensor)
from .errors import ConfigError
from .parallel import Parallel


def padded_vocab_size(vocab_size: int, tp: int, framework: str) -> int:
    """Megatron pads the vocabulary to a multiple of 128 x TP (``--make-vocab-size-divisible-by``
    128, times TP, in ``megatron/training/tokenizer``); other stacks use the tokenizer's size."""
    if framework != "megatron":
        return vocab_size
    multiple = 128 * tp
    return math.ceil(vocab_size / multiple) * multiple


def layers_per_stage(arch: Architecture, par: Parallel) -> list[int]:
    """Transformer layers on each pipeline rank, first to last (all of its virtual chunks)."""
    p, v, total = par.pp, par.vpp, arch.num_layers
    first, last = par.pp_first_stage_layers, par.pp_last_stage_layers
    if first is None and last is None:
        if total % (p * v):
            raise ConfigError("parallel.pp", p, f"a pp x vpp that divides num_layers ({total})",
                              f"pp x vpp = {p * v}; set pp_first_stage_layers/pp_last_stage_layers for an uneven split")
        return [total // p] * p
    middle_stages = p - (first is not None) - (last is not None)
    rest = total - (first or 0) - (last or 0)
    if rest < 0 or (middle_stages == 0 and rest != 0) or (middle_stages and rest % middle_stages):
        raise ConfigError("parallel.pp_first_stage_layers", first,
                          f"first and last stage layers that leave a multiple of the {middle_stages} "
                          f"middle stages out of num_layers ({total})", f"pp_last_stage_layers = {last}")
    even = rest // middle_stages if middle_stages else 0
    counts = [even] * p
    if first is not None:
        counts[0] = first
    if last is not None:
        counts[-1] = last
    if v > 1 and any(c % v for c in counts):
        raise ConfigError("parallel.vpp", v, f"a divisor of every stage's layer count {counts}")
    if any(c == 0 for c in counts[1:-1]):
        raise ConfigError("parallel.pp", p, "at most one stage per layer", "a middle stage would hold no layer")
    return counts


def stage_layer_indices(arch: Architecture, par: Parallel) -> list[list[int]]:
    """Global layer indices on each rank. With VPP the layers are dealt out chunk by chunk:
    rank r holds chunks r, r + p, r + 2p, ... (Narayanan et al. 2021, interleaved schedule)."""
    counts = layers_per_stage(arch, par)
    p, v = par.pp, par.vpp
    chunk_sizes = [[c // v] * v for c in counts]
    indices: list[list[int]] = [[] for _ in range(p)]
    start = 0
    for chunk in range(v):
        for rank in range(p):
            size = chunk_sizes[rank][chunk]
            indices[rank].extend(range(start, start + size))
            start += size
    return indices


def local_numel(t: ParameterTensor, par: Parallel) -> float:
    """Elements of tensor `t` one GPU holds under TP (and EP x expert-TP for routed experts)."""
    if t.split in (COLUMN, ROW, VOCAB):
        return t.numel / par.tp
    if t.split in (EXPERT_COLUMN, EXPERT_ROW):
        return t.numel / (par.ep * par.etp)
    assert t.split == REPLICATED
    return t.numel


@dataclass(frozen=True)
class StageParameters:
    """Parameters of one pipeline stage, split into the groups that shard differently."""

    stage: int
    layer_indices: tuple[int, ...]
    tensors: tuple[ParameterTensor, ...]  # one entry per distinct tensor, `copies` folded in
    dense_local: float  # elements on one GPU, non-expert (sharded over DP x CP by ZeRO)
    expert_local: float  # elements on one GPU, routed experts (sharded over expert-DP by ZeRO)
    embedding_local: float  # the embedding/head part of dense_local
    largest_layer_local: float  # one layer's elements on a GPU (the FSDP/ZeRO-3 unit)
    root_local: float  # embedding + final norm + head on a GPU (the FSDP root unit)

    @property
    def local(self) -> float:
        return self.dense_local + self.expert_local


def stage_parameters(arch: Architecture, par: Parallel, framework: str) -> list[StageParameters]:
    vocab = padded_vocab_size(arch.vocab_size, par.tp, framework)
    kinds = arch.layer_kinds()
    per_kind = {k: arch.layer_tensors(k) for k in set(kinds)}
    per_kind_local = {k: sum(local_numel(t, par) for t in ts) for k, ts in per_kind.items()}
    stages = []
    for rank, layers in enumerate(stage_layer_indices(arch, par)):
        tensors: list[ParameterTensor] = []
        for kind in set(kinds[i] for i in layers):
            n = sum(1 for i in layers if kinds[i] == kind)
            tensors += [ParameterTensor(t.name, t.shape, t.split, t.role, t.copies * n) for t in per_kind[kind]]
        root: list[ParameterTensor] = []
        if rank == 0:
            root += arch.embedding_tensors(vocab)
        if rank == par.pp - 1:
            root += arch.head_tensors(vocab)
            if arch.tie_embeddings and par.pp > 1:
                root.append(ParameterTensor("lm_head (tied copy)", (vocab, arch.hidden_size), VOCAB, "head"))
            for _ in range(arch.mtp_layers):  # MTP modules sit after the last layer (Megatron)
                tensors += arch.mtp_tensors()
        tensors += root
        dense = sum(local_numel(t, par) for t in tensors if not t.is_expert)
        expert = sum(local_numel(t, par) for t in tensors if t.is_expert)
        embedding = sum(local_numel(t, par) for t in root if t.role in ("embedding", "head"))
        largest = max((per_kind_local[kinds[i]] for i in layers), default=0.0)
        stages.append(StageParameters(
            stage=rank, layer_indices=tuple(layers), tensors=tuple(tensors), dense_local=dense,
            expert_local=expert, embedding_local=embedding, largest_layer_local=largest,
            root_local=sum(local_numel(t, par) for t in root)))
    return stages
