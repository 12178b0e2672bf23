"""A stage's operations per variant of a layer, timed once and shared by the layouts that have the
same shapes; what recomputation adds to a stage's work.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from ..memory.activations.recompute import (op_level, op_level_recomputed_matmul_share, recomputed_layer_count,
                                            recomputed_modules)
from ..spec.architecture import Architecture
from ..spec.parallel import Parallel
from ..memory.resolved import Resolved
from ..memory.sharding import split_key
from ..spec.training import Training
from .operations import Operation, _Context, _context
from .vision_operations import vision_flops_per_token, vision_operations
from .layer_operations import (matmul_parameters, model_flops_per_token, embedding_operations, head_operations,
                               layer_operations)


# --- the work of each pipeline stage -----------------------------------------------------------------

Variant = tuple[str, bool]  # (layer kind, local: sliding window or chunk), as Architecture.variant_counts names them


def _time(ops, roof: bool) -> float:
    """Seconds of these operations (once each): at the roof, or as expected."""
    return sum(op.time_s if roof else op.expected_time_s for op in ops)


def variant_operations(ctx: _Context, cfg: Resolved) -> dict[Variant, tuple[list[Operation], list[Operation]]]:
    """(forward, backward) operations of one layer of each variant the model has, count 1."""
    arch = cfg.architecture
    return {v: layer_operations(ctx, arch, cfg.training, cfg.parallel, v[0], arch.local_attention if v[1] else None, 1)
            for v in arch.variant_counts()}


@dataclass(frozen=True)
class OperationTable:
    """What one micro-batch runs, whatever the pipeline split, DP, ZeRO stage or recompute: the
    shared context, one layer of each variant, the embedding and the head (count 1), the seconds
    of each list at the roof and as expected, and the model FLOPs per token (for MFU). Built once
    per `_table_key` and remembered on the architecture, so a layout search and an app rerun
    read it back."""

    ctx: _Context
    notes: tuple[str, ...]
    variants: dict[Variant, tuple[list[Operation], list[Operation]]]
    ends: tuple[list[Operation], list[Operation], list[Operation]]  # embedding, head forward, head backward
    seconds: dict[tuple, float]  # (variant, "embedding" or "head"; "forward", "backward" or "attention"; roof)
    timed: dict[tuple, tuple[tuple[Operation, float], ...]]  # (variant, roof): its forward operations and seconds
    flops_per_token: float


# Fields that only the step reads (recompute, the batch, the pipeline split, DP, ZeRO, overlap): the
# operations of a micro-batch are the same whatever their values. Every other field is in the key.
_STEP_TRAINING_FIELDS = {"recompute", "recompute_layers", "recompute_every", "recompute_modules", "global_batch_size"}
_STEP_PARALLEL_FIELDS = {"pp", "vpp", "pp_first_stage_layers", "pp_last_stage_layers", "dp", "zero_stage",
                         "world_size", "comm_overlap", "pp_schedule", "pp_account_for_embedding", "pp_account_for_loss",
                         "pp_layout"}
_TABLE_FIELDS = tuple((section, tuple(f.name for f in dataclasses.fields(section) if f.name not in step))
                      for section, step in ((Training, _STEP_TRAINING_FIELDS), (Parallel, _STEP_PARALLEL_FIELDS)))


def _table_key(cfg: Resolved) -> tuple:
    (_, training), (_, parallel) = _TABLE_FIELDS
    return ("roofline operations", cfg.hardware, tuple(map(vars(cfg.training).get, training)),
            tuple(map(vars(cfg.parallel).get, parallel)))


def operation_table(cfg: Resolved) -> OperationTable:
    """The configuration's `OperationTable` (remembered on its architecture)."""
    return cfg.architecture.cached(_table_key(cfg), lambda: _operation_table(cfg))


def _operation_table(cfg: Resolved) -> OperationTable:
    arch, training, par = cfg.architecture, cfg.training, cfg.parallel
    ctx, notes = _context(cfg)
    variants = variant_operations(ctx, cfg)
    # the first stage's inputs: a vision tower's images (vision_operations), then the token embedding
    tower = vision_operations(ctx, arch, training)
    embed = tower + embedding_operations(ctx, arch, 1)
    head_forward, head_backward = head_operations(ctx, arch, training, par, cfg.padded_vocab, 1)
    seconds: dict[tuple, float] = {}
    timed = {(v, roof): tuple((op, op.time_s if roof else op.expected_time_s) for op in variants[v][0])
             for v in variants for roof in (False, True)}
    for roof in (False, True):
        for v, (forward, backward) in variants.items():
            seconds[v, "forward", roof] = _time(forward, roof)
            seconds[v, "backward", roof] = _time(backward, roof)
            seconds[v, "attention", roof] = _time([op for op in forward + backward if op.kind == "attention"], roof)
            # the GEMMs TP communication can overlap (communication.tp_exposed)
            for phase, ops in (("forward", forward), ("backward", backward)):
                seconds[v, f"matmul {phase}", roof] = _time([op for op in ops if op.kind == "matmul"], roof)
            seconds[v, "weight gradient", roof] = _time(
                [op for op in backward if op.kind == "matmul" and op.name.endswith("(weight gradient)")], roof)
        for phase in ("forward", "backward"):
            seconds["embedding", phase, roof] = _time([op for op in embed if op.phase == phase], roof)
        seconds["head", "forward", roof] = _time(head_forward, roof)
        seconds["head", "backward", roof] = _time(head_backward, roof)
    return OperationTable(ctx, tuple(notes), variants, (embed, head_forward, head_backward), seconds, timed,
                          _flops_per_token(cfg) + vision_flops_per_token(tower, training))


def _flops_per_token(cfg: Resolved) -> float:
    """`model_flops_per_token`; an adapter run skips dW of the frozen weights: the matmuls' 6N becomes
    4N (+ the adapters' own 6 r (in + out)), so MFU counts the work the step does (adapters.py)."""
    arch, training = cfg.architecture, cfg.training
    flops_per_token = model_flops_per_token(arch, training.seq_len, cfg.is_training)
    if training.adapter and cfg.is_training:
        from ..memory.adapters import adapter_count
        head = arch.vocab_size * arch.hidden_size if training.adapter.trainable_embeddings else 0
        adapters = adapter_count(training.adapter, arch)
        flops_per_token -= 2 * (matmul_parameters(arch) - head) - 6 * adapters
    return flops_per_token


def stage_variants(cfg: Resolved, rank: int) -> dict[Variant, int]:
    """Layers of each variant on a pipeline rank (over its virtual chunks)."""
    counts: dict[Variant, int] = {}
    for chunk in cfg.stages[rank].chunks:
        for v, n in cfg.architecture.variant_counts(chunk.start, chunk.stop).items():
            counts[v] = counts.get(v, 0) + n
    return counts


def rank_variants(cfg: Resolved) -> tuple[dict[Variant, int], ...]:
    """`stage_variants` of every rank. They depend on the pipeline split alone, so they are
    remembered on the architecture by `sharding.split_key`, as the split itself is."""
    return cfg.architecture.cached(("rank variants",) + split_key(cfg.parallel),
                                   lambda: tuple(stage_variants(cfg, r) for r in range(cfg.parallel.pp)))


@dataclass(frozen=True)
class StageWork:
    """One micro-batch on one pipeline rank: its operations' seconds, at the roof or as expected."""

    rank: int
    counts: dict[Variant, int]
    forward_s: float  # layer forwards, plus the embedding (first rank) and the head's forward (last rank)
    backward_s: float
    recompute_s: float
    recompute_fraction: float  # share of the rank's layers full recompute re-runs (their TP collectives too)

    @property
    def layers(self) -> int:
        return sum(self.counts.values())

    @property
    def per_microbatch_s(self) -> float:
        return self.forward_s + self.backward_s + self.recompute_s


def recompute_time(cfg: Resolved, counts: dict[Variant, int], table: OperationTable,
                   roof: bool) -> tuple[float, float]:
    """(seconds per micro-batch, share of layers fully recomputed). Full recompute re-runs the
    forward of each recomputed layer (Korthikanti et al. 2022, section 5); selective re-runs the
    forward operations of the modules the memory model drops (activations.recomputed_modules:
    the core attention by default, Korthikanti section 6)."""
    tr = cfg.training
    if not cfg.is_training or tr.recompute == "none" or not counts:
        return 0.0, 0.0
    if tr.recompute == "full":
        layers = sum(counts.values())
        fraction = recomputed_layer_count(tr, layers) / layers  # the memory model's rule (activations.py)
        return fraction * sum(n * table.seconds[v, "forward", roof] for v, n in counts.items()), fraction
    return sum(n * selective_recompute_s(tr, cfg.architecture, table.timed[v, roof]) for v, n in counts.items()), 0.0


def selective_recompute_s(tr: Training, arch: Architecture, timed) -> float:
    """Seconds selective recompute adds to these forward operations, given as (operation, its
    seconds) pairs: those of the modules the memory model drops (activations.recomputed_modules),
    or, under torchtitan's operator-level policy, every elementwise operation and its even
    matmuls' share of the matmuls (activations.op_level_gemms), never the attention kernel."""
    if op_level(tr):
        share = op_level_recomputed_matmul_share(arch)
        return sum(seconds * (1.0 if op.kind == "elementwise" else share)
                   for op, seconds in timed if op.kind in ("elementwise", "matmul"))
    modules = recomputed_modules(tr)
    return sum(seconds for op, seconds in timed if modules.intersection(op.modules))


def stage_work(cfg: Resolved, rank: int, table: OperationTable, roof: bool) -> StageWork:
    counts, sp, seconds = rank_variants(cfg)[rank], cfg.stages[rank], table.seconds
    forward = sum(n * seconds[v, "forward", roof] for v, n in counts.items())
    backward = sum(n * seconds[v, "backward", roof] for v, n in counts.items())
    if sp.first:  # rank 0; under DualPipe also rank p - 1 (sharding.rank_virtual_stages)
        forward += seconds["embedding", "forward", roof]
        backward += seconds["embedding", "backward", roof]
    if sp.last:  # rank p - 1; DualPipe also rank 0, DualPipeV rank 0 only
        forward += seconds["head", "forward", roof]
        backward += seconds["head", "backward", roof]
    recompute, fraction = recompute_time(cfg, counts, table, roof)
    return StageWork(rank, counts, forward, backward, recompute, fraction)


def rank_twins(cfg: Resolved) -> tuple[int, ...]:
    """For each rank, the first rank with the same layers of each variant and the same ends (the
    middle ranks of a pipeline are alike): its work is the same. By split, on the architecture."""
    def twins() -> tuple[int, ...]:
        first: dict[tuple, int] = {}
        return tuple(first.setdefault((tuple(counts.items()), sp.first, sp.last), rank)
                     for rank, (counts, sp) in enumerate(zip(rank_variants(cfg), cfg.stages)))
    return cfg.architecture.cached(("rank twins",) + split_key(cfg.parallel), twins)


def stage_works(cfg: Resolved, table: OperationTable, roof: bool) -> list[StageWork]:
    """The work of every rank, computed once for each set of twins (`rank_twins`): a rank's entry is
    its first twin's, so the first rank of the slowest is where `max` finds it."""
    twins = rank_twins(cfg)
    done = {rank: stage_work(cfg, rank, table, roof) for rank in dict.fromkeys(twins)}
    return [done[twin] for twin in twins]


def layer_forward(cfg: Resolved, work: StageWork, table: OperationTable) -> tuple[tuple[Operation, int], ...]:
    """The rank's layer forward operations in running order, each with its count per step."""
    m = cfg.microbatches
    return tuple((op, work.counts[v] * m) for v in sorted(work.counts) for op in table.variants[v][0])


def stage_operations(cfg: Resolved, work: StageWork, table: OperationTable) -> list[Operation]:
    """The operations of a rank with their counts per step, in running order."""
    m = cfg.microbatches
    embed, head_fwd, head_bwd = table.ends
    order = sorted(work.counts)
    ops: list[Operation] = []
    first, last = cfg.stages[work.rank].first, cfg.stages[work.rank].last
    if first:
        ops += [dataclasses.replace(op, count=m) for op in embed if op.phase == "forward"]
    ops += [dataclasses.replace(op, count=n) for op, n in layer_forward(cfg, work, table)]
    if last:
        ops += [dataclasses.replace(op, count=m) for op in head_fwd + head_bwd]
    for v in reversed(order):
        ops += [dataclasses.replace(op, count=work.counts[v] * m) for op in table.variants[v][1]]
    if first:
        ops += [dataclasses.replace(op, count=m) for op in embed if op.phase == "backward"]
    return ops
