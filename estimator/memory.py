"""The peak of a training step, per pipeline stage: the module that puts the others together.

A step has three phases, and each stage's peak is the largest of them (the contract's
``allocated_peak_bytes``, comparable to ``torch.cuda.max_memory_allocated``):

- forward: model states, the activations of every micro-batch in flight, the loss's working
  copies on the last stage, and whatever is gathered to run (FSDP units, autocast weights);
- backward: the same activations at the moment backward starts, plus the gradient of the
  logits, the layer being recomputed (full recompute) and FSDP's unsharded gradients;
- optimizer step: model states with all gradients, plus the optimizer's temporaries.

Gradients exist during forward when the framework keeps a persistent gradient buffer
(Megatron's main_grad buffer), when gradients accumulate over several micro-batches, or in a
pipeline's steady state; otherwise (``zero_grad(set_to_none=True)``, PyTorch's default) backward's
peak comes at its first moment, the loss's gradients beside every activation, before any
parameter gradient exists (as measured, tests/data/measured).

Outside PyTorch's allocator the device also holds the CUDA context, NCCL's buffers and the
allocator's fragmentation; they make ``device_total_bytes``.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from functools import cached_property, partial
from typing import Callable, NamedTuple

from . import activations as act
from . import memo as _memo
from .architecture import Architecture, parameter_counts
from .components import (NON_ALLOCATOR, OUTSIDE_ALLOCATOR, Component, Phase, StageDetail, StageEstimate, component,  # noqa: F401
                         entries_component, fold, fragmentation, fragmentation_fraction, once, phase, total_bytes)
from .dtypes import bytes_per_element
from .hardware import GPU, GPUS, Hardware
from .parallel import Parallel
from .resolved import Resolved, resolve, training_with
from .sharding import StageParameters, chunk_kind_counts, stored_kind_counts
from .offload import OFFLOAD_SOURCES, Placement, placement
from .optimizers import OPTIMIZERS
from .adapters import adapter_states, bnb_held_entries, first_layer_input_frozen, inventory, trainable_count
from .kbit import ledger_training, math_attention
from .fsdp1 import frozen_weights_train, is_fsdp1
from .states import FP8_SOURCE, ZERO_SOURCE, model_states
from .training import FSDP_FRAMEWORKS, Recipe, Training
from .backward_moments import FSDP2_RS_SOURCE, BackwardEnd, block_backward_extras, fsdp2_backward_end
from .moe_moments import moe_moments
from .transients import OPTIMIZER_IN_BACKWARD_SOURCE, Transients, transients
from .workspaces import library_workspaces

GiB = 1024**3
TIGHT_FRACTION = 0.8  # Fujii et al. 2024 (arXiv 2411.06465): no OOM below 80% in 454 runs



@dataclass(frozen=True)
class Fit:
    gpu: str
    capacity_bytes: int
    utilization: float
    verdict: str  # "fits", "tight", "oom"


def fit_on(device_total_bytes: int, gpu: GPU) -> Fit:
    utilization = device_total_bytes / gpu.capacity_bytes
    verdict = "oom" if utilization > 1 else "tight" if utilization > TIGHT_FRACTION else "fits"
    return Fit(gpu=gpu.id, capacity_bytes=gpu.capacity_bytes, utilization=utilization, verdict=verdict)


@dataclass(frozen=True)
class Estimate:
    config: Resolved  # what was estimated, every default decided
    parameters_total: int
    parameters_active: int
    parameters_trainable: int  # what gets gradients: all in training, an adapter run's adapters, none in inference
    stages: tuple[StageEstimate, ...]
    peak_stage: int
    allocated_peak_bytes: int
    device_total_bytes: int
    fit: Fit
    notes: tuple[str, ...] = field(default_factory=tuple)
    _shared: "_Shared | None" = field(default=None, repr=False, compare=False)
    rl_phases: tuple = ()  # RL with a colocated engine (rl.py): rollout, scoring, training; the totals are the largest

    # the resolved configuration's values, read where an estimate is shown
    architecture = property(lambda self: self.config.architecture)
    training = property(lambda self: self.config.training)
    parallel = property(lambda self: self.config.parallel)
    hardware = property(lambda self: self.config.hardware)
    recipe = property(lambda self: self.config.recipe)
    zero_stage = property(lambda self: self.config.zero_stage)
    microbatches = property(lambda self: self.config.microbatches)

    @cached_property
    def activation_ledger(self) -> tuple[LedgerLine, ...]:
        """What one layer keeps for one micro-batch on one GPU, tensor by tensor, by layer kind."""
        return self._shared.ledger() if self._shared else ()

    @property
    def host_stage(self) -> StageEstimate:
        """The stage whose process needs the most host memory (offload)."""
        return max(self.stages, key=lambda s: (s.host_bytes + s.nvme_bytes, -s.stage))

    def host_memory_json(self) -> dict:
        s = self.host_stage
        return {"stage": s.stage, "cpu_bytes_per_gpu": s.host_bytes, "nvme_bytes_per_gpu": s.nvme_bytes,
                "cpu": {c.label: c.bytes for c in s.host}, "nvme": {c.label: c.bytes for c in s.nvme}}

    @property
    def reserved_peak_bytes(self) -> int:
        """`torch.cuda.max_memory_reserved()` of the peak stage (or RL phase): the device total less what
        lies outside the allocator."""
        if self.rl_phases:
            peak = max(self.rl_phases, key=lambda p: p.device_total_bytes)
            return peak.device_total_bytes - sum(c.bytes for c in peak.components if c.key in OUTSIDE_ALLOCATOR)
        return next(s for s in self.stages if s.stage == self.peak_stage).reserved_peak_bytes

    def fits(self) -> list[Fit]:
        """The verdict on every GPU of the catalog (the estimate does not depend on the GPU, but
        for its CUDA context, which is the same for all catalogued GPUs)."""
        return [fit_on(self.device_total_bytes, gpu) for gpu in GPUS.values()]

    def framework_release_json(self) -> dict:
        """The release whose rules the estimate applied (estimator/versions.py): its version, and
        the release and commit in words; null for a framework without versioned rules."""
        from .versions import release
        r = release(self.training.framework, self.training.framework_version)
        return {"framework_version": r.version if r else None, "framework_release": r.cited if r else None}

    def to_json(self) -> dict:
        return {
            "parameters": {"total": self.parameters_total, "active": self.parameters_active,
                           "trainable": self.parameters_trainable},
            "stages": [
                {
                    "stage": s.stage,
                    "layers": s.layers,
                    "components": {c.key: c.bytes for c in s.components},
                    "allocated_peak_bytes": s.allocated_peak_bytes,
                    "reserved_peak_bytes": s.reserved_peak_bytes,
                    "device_total_bytes": s.device_total_bytes,
                    "outside_allocator": {c.key: c.bytes for c in s.outside_allocator},
                    "peak_phase": s.peak_phase,
                    "parameters_per_gpu": s.parameters_per_gpu,
                    "in_flight_microbatches": s.in_flight_microbatches,
                    "phases": dict(s.phase_totals),
                    "formulas": {c.key: c.formula for c in s.components},
                    "sources": {c.key: c.source for c in s.components},
                }
                for s in self.stages
            ],
            "peak_stage": self.peak_stage,
            "allocated_peak_bytes": self.allocated_peak_bytes,
            "reserved_peak_bytes": self.reserved_peak_bytes,
            "device_total_bytes": self.device_total_bytes,
            "fit": {"gpu": self.fit.gpu, "capacity_bytes": self.fit.capacity_bytes,
                    "utilization": round(self.fit.utilization, 6), "verdict": self.fit.verdict},
            "zero_stage": self.zero_stage,
            "microbatches": self.microbatches,
            **self.framework_release_json(),
            "host_memory": self.host_memory_json(),
            "notes": list(self.notes),
            **({"rl_phases": [_rl_phase_json(p) for p in self.rl_phases]} if self.rl_phases else {}),
        }


def _rl_phase_json(phase) -> dict:
    components: dict[str, int] = {}
    for c in phase.components:
        components[c.key] = components.get(c.key, 0) + c.bytes
    return {"phase": phase.name, "allocated_bytes": phase.allocated_bytes,
            "device_total_bytes": phase.device_total_bytes, "components": components,
            "formulas": {c.key: c.formula for c in phase.components}}


# --- pieces of a stage ----------------------------------------------------------------------------

class LedgerLine(NamedTuple):
    """One saved tensor of one layer for one micro-batch on one GPU (the activation ledger)."""

    kind: str
    name: str
    bytes: int
    formula: str
    dropped_by_recompute: bool


class _Shared(NamedTuple):
    """What every stage of one estimate reuses: the per-layer ledger, the loss, the overheads."""

    per_layer: dict[str, float]  # bytes one layer keeps per micro-batch, by layer kind, as recomputed
    full_layer: dict[str, float]  # ... without any recompute (the working set re-materialised)
    kept_input: float  # what full recompute keeps of a layer: its input
    kept_input_formula: str
    # what a checkpointed layer keeps beside its input, per kind: bitsandbytes <= 0.43.1's 4-bit linears'
    # inputs (adapters.bnb_held_entries); empty otherwise
    held_by_4bit: dict
    embedding: list[act.Entry]
    loss: act.LossMemory | None
    loss_components: tuple  # (saved, forward working copies, backward gradients) on the last stage
    communication: Component  # NCCL buffers: every stage
    moe_communication: Component  # ... and DeepEP's buffers, on stages with MoE layers, when chosen
    runtime: Component
    entries: dict[str, list[act.Entry]]
    recomputed: frozenset[str]
    parallel: Parallel  # a layout with this TP, SP and CP (the ledger's divisions; see `_stage_memo`)
    hardware: Hardware
    embedding_bytes: float  # first-stage inputs per micro-batch
    deferred_wgrad: list  # the last stage's pair per deferred micro-batch (--defer-embedding-wgrad-compute)
    fragmentation: float  # share of the allocated peak

    def ledger(self) -> tuple[LedgerLine, ...]:
        par = self.parallel
        return tuple(LedgerLine(k, e.name, int(round(e.bytes(par))), e.shown_formula(par),
                                act.dropped(e, self.recomputed))
                     for k in sorted(self.entries) for e in self.entries[k])


def _shared(arch: Architecture, training: Training, par: Parallel, hardware: Hardware, zero: int,
            vocab: int) -> _Shared:
    communication = _communication(training, par, zero)
    moe_communication = (_communication(training, par, zero, arch, hardware) if training.moe_dispatcher == "deepep"
                         else communication)
    # the ledger depends on the training setup and on TP, SP, CP and ETP only: every layout of a
    # search (and every rerun of the app) that shares them reads it from the architecture's memo; one
    # layer's saved tensors do not depend on how many layers full recompute checkpoints (the stages
    # count those, `activations.recomputed_layer_count`), so a search over them shares one ledger
    as_read = training_with(arch, training, recompute_layers=None, recompute_every=1)
    as_read = ledger_training(as_read)  # peft's prepare_model_for_kbit_training: activations in fp32 (kbit.py)
    key = ("ledger", as_read, par.tp, par.sequence_parallel, par.cp, par.etp, vocab)
    ledger = arch.cached(key, lambda: _ledger(arch, as_read, par, vocab))
    return _Shared(**ledger, communication=communication, moe_communication=moe_communication,
                   runtime=_runtime(hardware), parallel=par, hardware=hardware,
                   fragmentation=fragmentation_fraction(hardware))


def _ledger(arch: Architecture, training: Training, par: Parallel, vocab: int) -> dict:
    """The per-layer ledger and the loss, with their bytes on one GPU of this TP/SP/CP split."""
    entries = {k: act.layer_entries(arch, training, par, k) for k in arch.kinds}
    if first_layer_input_frozen(training):  # an adapter run's first layer keeps less (adapters.py)
        entries[_first_kind(arch)] = act.layer_entries(arch, training, par, arch.layer_kinds()[0], first=True)
    modules = act.recomputed_modules(training)
    full, per_layer = {}, {}
    for kind, es in entries.items():
        sizes = [(e.bytes(par), act.dropped(e, modules)) for e in es]
        full[kind] = sum(b for b, _ in sizes)
        per_layer[kind] = sum(b for b, dropped in sizes if not dropped)
    embedding = act.embedding_entries(arch, training, par)
    kept_input = act.layer_input_entry(arch, training, par)
    held = {kind: sum(e.bytes(par) for e in bnb_held_entries(es, training, arch, kind)) for kind, es in entries.items()}
    loss = act.loss_memory(arch, training, par, vocab) if training.mode == "training" else None
    return dict(per_layer=per_layer, full_layer=full, kept_input=kept_input.bytes(par),
                held_by_4bit={k: b for k, b in held.items() if b},
                kept_input_formula=kept_input.shown_formula(par), embedding=embedding, loss=loss,
                loss_components=_loss_components(loss, par), entries=entries, recomputed=modules,
                embedding_bytes=sum(e.bytes(par) for e in embedding),
                deferred_wgrad=act.deferred_wgrad_entries(arch, training, par, vocab))


def _loss_components(loss: act.LossMemory | None, par: Parallel) -> tuple[tuple[Component, ...], list, list]:
    """The last stage's loss: what it keeps for backward, its forward working copies and its
    gradients at backward's start."""
    if loss is None:
        return (), [], []
    saved = (entries_component("logits", "Final norm, LM head input and loss", loss.saved, par, 1, loss.source),)
    forward = [entries_component("transient", "Loss working copies", loss.forward, par, 1, loss.source)] \
        if loss.forward else []
    backward = [entries_component("transient", "Loss gradients", loss.backward, par, 1, loss.source)] \
        if loss.backward else []
    return saved, forward, backward


def _runtime(hardware: Hardware) -> Component:
    runtime = hardware.device.runtime
    return component("runtime", "CUDA context and loaded kernels (outside the allocator)", runtime.context_bytes,
                     f"per-process constant for {runtime.architecture}", runtime.context_source)


def _first_kind(arch: Architecture) -> str:
    return f"first {arch.layer_kinds()[0]}"


def _activation_counts(training: Training, stage: StageParameters, arch: Architecture) -> tuple[int, tuple, tuple]:
    """(layers recomputed, (kind, layers stored) pairs, (kind, layers recomputed) pairs) of a stage.
    Full recompute of n layers recomputes the first n of the stage (Megatron's "block" method) or
    every N-th (`recompute_every`) and keeps their inputs (`activations.recomputed_layer_count`). An
    adapter run's first layer, whose input needs no gradient, is a kind of its own."""
    recomputed = act.recomputed_layer_count(training, stage.num_layers)
    if not recomputed and first_layer_input_frozen(training) and stage.stage == 0:
        kind = arch.layer_kinds()[0]
        rest = tuple((k, n - 1 if k == kind else n) for k, n in stage.kind_counts)
        return 0, ((_first_kind(arch), 1),) + rest, ()
    if not recomputed:
        return 0, stage.kind_counts, ()
    if training.recompute_every > 1:
        stored = stored_kind_counts(arch, stage.chunks, training.recompute_every)
    else:
        stored = chunk_kind_counts(arch, stage.chunks, skip=recomputed)
    left = dict(stored)
    return recomputed, stored, tuple((k, n - left.get(k, 0)) for k, n in stage.kind_counts if n - left.get(k, 0))


def _held_by_4bit(counts: tuple[int, tuple, tuple], shared: _Shared) -> float:
    """Bytes the recomputed layers' 4-bit linears keep beside their inputs, per micro-batch."""
    return sum(shared.held_by_4bit.get(kind, 0.0) * n for kind, n in counts[2])


def _activation_units(counts: tuple[int, tuple, tuple], shared: _Shared) -> tuple[float, ...]:
    """Bytes per micro-batch in flight of each layer part `_activation_parts` lists, in its order."""
    recomputed, stored_counts, _ = counts
    units = [shared.kept_input * recomputed] if recomputed else []
    held = _held_by_4bit(counts, shared)
    units += [held] if held else []
    return tuple(units + [shared.per_layer[kind] * n for kind, n in stored_counts if n])


def _activation_parts(stage: StageParameters, inflight: float, counts: tuple[int, tuple, tuple],
                      shared: _Shared) -> tuple[tuple[str, int, str], ...]:
    """Saved activations of the stage's layers for every micro-batch in flight, as (label, bytes,
    formula)."""
    recomputed, stored_counts, recomputed_counts = counts
    parts = []
    if recomputed:
        parts.append((f"{recomputed} recomputed layers keep their input",
                      int(round(shared.kept_input * recomputed * inflight)),
                      f"{shared.kept_input / 2**20:,.1f} MiB layer input ({shared.kept_input_formula}) x "
                      f"{recomputed} layers x {inflight:g} in flight"))
    held = _held_by_4bit(counts, shared)
    if held:
        per = " + ".join(f"{shared.held_by_4bit[k] / 2**20:,.1f} MiB x {n} {k} layers" for k, n in recomputed_counts
                         if k in shared.held_by_4bit)
        parts.append(("the recomputed layers' 4-bit linears keep their inputs (bitsandbytes <= 0.43.1)",
                      int(round(held * inflight)),
                      f"({per}) x {inflight:g} in flight: MatMul4Bit's ctx.tensors, outside the checkpoint"))
    for kind, n in stored_counts:
        if n:
            parts.append((f"{n} {kind} layers x {inflight:g} micro-batches",
                          int(round(shared.per_layer[kind] * n * inflight)),
                          f"{shared.per_layer[kind] / 2**20:,.1f} MiB per {kind} layer x {n} layers "
                          f"x {inflight:g} in flight"))
    if stage.first and shared.embedding:
        parts.append(("token ids" + (" and embedding dropout mask" if len(shared.embedding) > 1 else ""),
                      int(round(shared.embedding_bytes * max(1.0, inflight))),
                      " + ".join(e.shown_formula(shared.parallel) for e in shared.embedding)
                      + " per micro-batch in flight"))
    return tuple(parts)


def _activations_component(parts: tuple[tuple[str, int, str], ...], training: Training,
                           par: Parallel | None = None) -> Component:
    formula = " + ".join(f for _, _, f in parts)
    if training.recompute == "selective":
        formula += f" (recomputed: {', '.join(training.recompute_modules)})"
    rule, rule_source = act.in_flight_rule(par, training.microbatch_group_size) if par else ("", "")
    source = act.KORTHIKANTI + (f"; {rule_source}" if rule_source else "")
    if act.compiled(training):  # the layers' saved set is Inductor's partitioner's (activations.COMPILE_SOURCE)
        formula += " (torch.compile: each layer keeps what Inductor's min-cut partitioner saves)"
        source += f"; {act.COMPILE_SOURCE}"
    if act.cp_flex_all_gather(training, par):  # the attention's keys and values span the whole sequence
        source += f"; {act.CP_FLEX_SOURCE}"
    pieces = tuple(Component("activations", label, b, f, source) for label, b, f in parts)
    return Component("activations", "Activations", sum(p.bytes for p in pieces), formula + rule, source, pieces)


def _communication(training: Training, par: Parallel, zero: int, arch: Architecture | None = None,
                   hardware: Hardware | None = None) -> Component:
    """NCCL keeps buffers per communicator it uses, outside PyTorch's allocator: 0.5 GiB for each
    process group of size > 1 (Fujii et al.'s estimator; NCCL issues #864/#986: memory grows
    with communicators and channels). With ``moe_dispatcher = "deepep"`` the MoE stages also hold
    DeepEP's fixed NVLink/RDMA buffers and workspace (cudaMalloc/NVSHMEM, sized in deepep.py)."""
    groups = []
    if par.tp > 1:
        groups.append("TP")
    if par.pp > 1:
        groups.append("PP")
    if par.dp * par.cp > 1:
        groups.append("DP x CP")
    if par.cp > 1:
        groups.append("CP")
    if par.ep > 1:
        groups.append("EP")
    if par.ep > 1 and par.expert_data_parallel > 1:
        groups.append("expert DP")
    per_group = 0.5 * GiB
    formula = f"0.5 GiB x {len(groups)} communicators ({', '.join(groups) or 'none'})"
    nccl = component("communication", "NCCL communicator buffers", per_group * len(groups), formula,
                      "Fujii et al. 2024 estimator (0.5 GB per communicator); NCCL issues #864, #986")
    if training.moe_dispatcher != "deepep" or arch is None or par.ep == 1 or not arch.num_moe_layers:
        return nccl
    # One process-wide deep_ep.Buffer, created by the first MoE layer's dispatch (Megatron-Core
    # fused_a2a.get_buffer): only stages with MoE layers hold it (see _static_stage).
    from .deepep import SOURCE, deepep_buffers
    gpu = (hardware or Hardware()).device
    buf = deepep_buffers(arch.hidden_size, bytes_per_element(training.compute_dtype), par.ep * par.etp,
                         gpu.gpus_per_node)
    src = SOURCE
    parts = [nccl, component("communication", "DeepEP NVLink buffer (cudaMalloc, IPC-shared)", buf.nvl_allocation,
                              f"max(dispatch, combine) get_nvl_buffer_size_hint(hidden_bytes {buf.hidden_bytes:,}, "
                              f"{buf.group_size} ranks; {buf.nvl_ranks} NVLink peers) + peer pointers", src)]
    if buf.num_rdma_bytes:
        parts.append(component("communication", "DeepEP RDMA buffer (NVSHMEM symmetric heap)", buf.num_rdma_bytes,
                                f"max(dispatch, combine) get_rdma_buffer_size_hint(hidden_bytes {buf.hidden_bytes:,}, "
                                f"{buf.rdma_ranks} nodes)", src))
    parts.append(component("communication", "DeepEP workspace (cudaMalloc)", buf.workspace, "NUM_WORKSPACE_BYTES",
                            src))
    formula += (f" + DeepEP NVL buffer {buf.nvl_allocation / GiB:.3f} GiB + RDMA buffer {buf.num_rdma_bytes / GiB:.3f}"
                f" GiB + workspace {buf.workspace / GiB:.3f} GiB")
    return Component("communication", "NCCL communicator buffers and DeepEP buffers", sum(p.bytes for p in parts),
                     formula, nccl.source + "; " + src, tuple(parts))


# --- the estimate -----------------------------------------------------------------------------------

def estimate(arch: Architecture, training: Training | None = None, par: Parallel | None = None,
             hardware: Hardware | None = None) -> Estimate:
    return estimate_resolved(resolve(arch, training, par, hardware))


def device_total(arch: Architecture, training: Training | None = None, par: Parallel | None = None,
                 hardware: Hardware | None = None) -> int:
    """`estimate(...).device_total_bytes` by the same code, without building the estimate: its stages,
    notes and components (a layout search judges most layouts by this number alone)."""
    cfg = resolve(arch, training, par, hardware)
    if cfg.training.rl or cfg.training.mode == "inference":
        return estimate_resolved(cfg).device_total_bytes
    memo = _stage_memo(cfg)
    return _training_stages(cfg, _shared_of(cfg, memo), memo, peak_only=True)[0]


class StepFloor(NamedTuple):
    """A stage's device total were its peak the optimizer step (the step's allocated bytes, what is
    outside the allocator and the fragmentation on the step's bytes), and its parameters per GPU."""

    device_bytes: int
    parameters_per_gpu: int


def step_floors(arch: Architecture, training: Training, par: Parallel, hardware: Hardware) -> tuple[StepFloor, ...]:
    """Each stage's `StepFloor`, from its static part alone (no activations): no recompute setting,
    micro-batch or loss of a layout with these model states takes a stage below its optimizer step
    (the planner's states floor, planner.py rule 1). Training without RL only."""
    cfg = resolve(arch, training, par, hardware)
    memo = _stage_memo(cfg)
    shared = _shared_of(cfg, memo)
    out = []
    for sp in cfg.stages:
        ends = (sp.first, sp.last, sp.kind_counts)
        static = memo.get(ends)
        if static is None:
            static = memo[ends] = _static_stage(arch, cfg.training, cfg.recipe, par, sp, cfg.zero_stage,
                                                cfg.microbatches, shared)
        step = static.totals[2]
        out.append(StepFloor(step + static.outside_allocator + int(round(step * shared.fragmentation)),
                             static.parameters_per_gpu))
    return tuple(out)


def _shared_of(cfg: Resolved, memo) -> _Shared:
    shared = memo.get("shared")
    if shared is None:
        shared = memo["shared"] = _shared(cfg.architecture, cfg.training, cfg.parallel, cfg.hardware,
                                          cfg.zero_stage, cfg.padded_vocab)
    return shared


def estimate_resolved(cfg: Resolved) -> Estimate:
    """The estimate of a configuration resolved once (`resolved.resolve`)."""
    arch, training, par, hardware = cfg.architecture, cfg.training, cfg.parallel, cfg.hardware
    if training.rl:
        return _rl_estimate(cfg)
    zero, recipe, m, vocab = cfg.zero_stage, cfg.recipe, cfg.microbatches, cfg.padded_vocab
    counts = parameter_counts(arch)
    memo = _stage_memo(cfg)
    shared = _shared_of(cfg, memo)
    if training.mode == "inference":
        from .inference import inference_stage
        stages = [inference_stage(arch, training, par, hardware, sp, vocab, shared) for sp in cfg.stages]
    else:
        stages = _training_stages(cfg, shared, memo)
    peak = max(stages, key=lambda s: s.device_total_bytes)
    notes = _notes(arch, training, par, zero, m, vocab)
    return Estimate(
        config=cfg, parameters_total=counts.total, parameters_active=counts.active,
        parameters_trainable=(0 if training.mode == "inference" else trainable_count(arch, training) if training.adapter
                              else counts.total), stages=tuple(stages),
        peak_stage=peak.stage, allocated_peak_bytes=peak.allocated_peak_bytes,
        device_total_bytes=peak.device_total_bytes, fit=fit_on(peak.device_total_bytes, hardware.device),
        notes=notes, _shared=shared)


def _stage_memo(cfg: Resolved, loss: str | None = None) -> dict:
    """What estimates of one architecture reuse: the part every stage shares (`_Shared`) and each
    stage's static part (`_static_stage`). Both depend on the training setup, the hardware, TP, SP,
    DP, CP, EP and ETP, whether there is a pipeline, the ZeRO stage and the micro-batches per step
    (and a static part on the stage's layers and ends), not on how the pipeline splits and schedules
    the layers: a layout search varying those, and an app rerun, read them back. The architecture is
    immutable, so the memo never goes stale; whatever these parts come to read of the layout must
    join the key. How many layers full recompute checkpoints (`recompute_layers`) is not part of it:
    the shared part does not read it and a static part only whether a stage recomputes any layer
    (`activations.recomputed_layer_count` > 0: min(n, layers) is, for every n >= 1, exactly when
    the stage has layers); the groups kept here add it to their keys (`_training_stages`). `loss`:
    the memo of the same setup with that loss instead (a stage without the head reads nothing of
    the loss: `_static_stage` reads the loss's parts of `_Shared` and the head's transients on the
    last stage only)."""
    fields = {"recompute_layers": None} if loss is None else {"recompute_layers": None, "loss": loss}
    par, training = cfg.parallel, training_with(cfg.architecture, cfg.training, **fields)
    return _StageMemo(cfg.architecture, ("stage parts", training, cfg.hardware, par.tp, par.sequence_parallel, par.dp,
                                         par.cp, par.ep, par.etp, par.pp > 1, cfg.zero_stage, cfg.microbatches))


class _StageMemo:
    """One configuration's stage parts (`_stage_memo`): a dict that is one value in the architecture's
    memo, whose bytes grow by each part's as it is added (estimator/memo.py), read and written as a
    dict (a part is read far more often than the memo's bookkeeping could afford per part)."""

    __slots__ = ("parts", "entry")

    def __init__(self, arch: Architecture, key: tuple):
        self.entry = _memo.SHARED.entry((arch.memo_token, key), dict, "stage parts")
        self.parts = self.entry[0]

    def get(self, part, default=None):
        return self.parts.get(part, default)

    def __setitem__(self, part, value) -> None:
        self.parts[part] = value
        kind = "shared" if part == "shared" else "group" if part[0] == "group" else "static"
        _memo.SHARED.grow(self.entry, _memo.SHARED.size_of(value, _PART_KINDS[kind]) + _memo.PART_BYTES)


_PART_KINDS = {k: "stage parts/" + k for k in ("shared", "group", "static")}


def _rl_estimate(cfg: Resolved) -> Estimate:
    """RL: the trainer's step on prompt + response sequences, then every phase of the step on its
    busiest GPU (rl.py); the totals and the verdict are the largest phase's."""
    from .rl import rl_phases, rollout_host, trainer_training
    rl = cfg.training.rl
    train = estimate_resolved(resolve(cfg.architecture, trainer_training(cfg.training), cfg.parallel, cfg.hardware))
    phases = rl_phases(train, rl)
    host = rollout_host(phases)  # the trainer's states parked on the host while the engine runs
    train = replace(train, stages=tuple(s._replace(host=s.host + host) for s in train.stages))
    peak = max(phases, key=lambda p: p.device_total_bytes)
    shown = replace(cfg, training=replace(cfg.training, seq_len=rl.sequence_len))
    note = (f"RL ({rl.algorithm}): the {peak.name} phase decides the fit; the stages show the training phase's "
            f"step on {rl.sequence_len:,}-token sequences")
    return replace(train, config=shown, rl_phases=phases, allocated_peak_bytes=peak.allocated_bytes,
                   device_total_bytes=peak.device_total_bytes, fit=fit_on(peak.device_total_bytes, cfg.gpu),
                   notes=train.notes + (note,))


def _notes(arch: Architecture, training: Training, par: Parallel, zero: int, m: int, vocab: int) -> tuple[str, ...]:
    """What a user should know about how this configuration was read."""
    notes = []
    if par.zero_stage is None and zero:
        notes.append(f"zero_stage {zero}: the default of framework {training.framework!r} (fully_shard shards "
                     "parameters, gradients and optimizer states)")
    if vocab != arch.vocab_size:
        notes.append(f"vocabulary padded from {arch.vocab_size:,} to {vocab:,} rows (Megatron: a multiple of "
                     f"128 x TP = {128 * par.tp})")
    if training.mode == "training" and par.pp > 1 and training.global_batch_size is None:
        notes.append(f"global batch {act.global_batch_size(training, par):,} (auto): {m} micro-batches per step, "
                     "the fewest that fill the pipeline; any larger global batch holds the same activations")
    if training.mode == "training" and par.pp > 1 and m < par.pp:
        notes.append(f"{m} micro-batch(es) per step on {par.pp} pipeline stages: most of the step is pipeline "
                     f"bubble; set global_batch_size to at least {par.pp * training.micro_batch_size * par.dp} "
                     "(micro_batch_size x dp x pp)")
    if training.mode == "training" and par.pp > 1 and arch.tie_embeddings:
        notes.append("tied embeddings under PP: the last stage keeps its own copy of the embedding as the head")
    if arch.is_moe and par.ep > 1 and training.mode == "training":
        notes.append("routed activations are not divided by EP: expert parallelism exchanges tokens, it does not "
                     "remove them")
    return tuple(notes)


class _StaticParts(NamedTuple):
    """A stage's components that do not depend on its micro-batches in flight."""

    kept: tuple[Component, ...]  # parameters, master weights, optimizer states, persistent buffers
    grads_forward: Component
    grads_backward: Component
    grads_full: Component
    loss_saved: tuple[Component, ...]
    folded: dict  # phase name -> the folded transient component
    grads_end: Component | None = None  # the gradients at backward's last moments, where not all of them


class _StaticStage(NamedTuple):
    """The part of a stage that does not depend on its micro-batches in flight: every middle
    stage of a pipeline shares one. The totals are computed at once; the components (formulas,
    sources) are built by `parts` on first read, from the same pieces."""

    totals: tuple[int, int, int]  # forward, backward, step bytes without the activations
    communication: Component  # outside the allocator: NCCL (and DeepEP on MoE stages)
    outside_allocator: int  # communication + CUDA context
    layers: int
    parameters_per_gpu: int  # before ZeRO sharding
    parts: Callable[[], _StaticParts]  # builds them on the first call, then returns them again
    host: tuple[Component, ...]  # offloaded to host memory (offload.py)
    nvme: tuple[Component, ...]  # offloaded to NVMe
    backward_end: int  # backward's last moments when gradients are created in it (fsdp2), else 0
    managed: Component | None = None  # paged optimizer states in managed memory, outside the allocator (paged.py)


def _static_stage(arch: Architecture, training: Training, recipe: Recipe, par: Parallel, sp: StageParameters,
                  zero: int, m: int, shared: _Shared) -> _StaticStage:
    inv = inventory(arch, training, recipe, sp) if training.adapter else None  # what an adapter run trains
    # FSDP1 units holding frozen and trainable weights give the frozen ones gradients too (fsdp1.py)
    frozen_grads = sp.local - sp.root_local if frozen_weights_train(training) else 0.0
    ms = adapter_states(inv, training, recipe, par, zero, frozen_grads) if inv else \
        model_states(sp, training, recipe, par, zero)
    ms, managed, paged_host = _paged_states(ms, arch, training, recipe, par, sp, inv, zero)
    last = sp.last
    loss_saved, loss_forward, loss_backward = shared.loss_components if last else ((), [], [])
    deferred = act.deferred_wgrad_microbatches(training, m) if last else 0
    if deferred:  # held through the last micro-batch's forward and backward, drained before the step
        loss_saved = loss_saved + (entries_component(
            "logits", "Deferred output-layer weight-gradient inputs", shared.deferred_wgrad, shared.parallel,
            deferred, act.DEFER_WGRAD_SOURCE),)
    working = _recompute_working_set(training, sp, shared)
    moe_stage = any(kind == "moe" for kind, n in sp.kind_counts if n)
    tr = transients(arch, training, recipe, par, sp, zero, inv)
    # the libraries' workspaces are held by the allocator from the first matrix product on (workspaces.py)
    tr = tr._replace(persistent=tr.persistent + [library_workspaces(training, shared.hardware, moe_stage)])
    exchange, exchange_backward, in_moe_layer = moe_moments(arch, training, par, sp)
    # gradients live through forward with a persistent buffer (Megatron), accumulation or a pipeline;
    # else zero_grad(set_to_none=True) freed them after the last step (see `_static_parts`)
    # FSDP1 accumulates under no_sync: no sharded gradient before the last micro-batch's backward (fsdp1.py)
    grads_live = training.framework == "megatron" or (m > 1 and not is_fsdp1(training)) or par.pp > 1
    # Moments inside a phase that never coexist: the loss's working set, a layer being recomputed
    # (after the loss's backward, one at a time), an MoE layer's all-to-all exchange (inside a
    # layer) and a parameter's step when the optimizer runs in backward. Each phase takes the
    # largest of its moments.
    extras = block_backward_extras(arch, training, recipe, par, sp)  # beside the recomputed layer (torchtitan)
    if working and act.recomputed_layer_count(training, sp.num_layers):  # a recomputed MoE layer's own moments
        extras = list(extras) + in_moe_layer
    if math_attention(arch, training) and last:  # SDPA's math backend in fp32: its moments (kbit.py)
        attention = _math_attention_moment(arch, training, sp, shared, total_bytes(loss_saved), "backward")
        if total_bytes(attention) > int(round(working)) + total_bytes(extras):
            working, extras = 0.0, attention
        attention = _math_attention_moment(arch, training, sp, shared, total_bytes(loss_saved), "forward")
        if total_bytes(attention) > max(total_bytes(loss_forward), total_bytes(exchange)):
            loss_forward = attention
    recomputed_bytes = int(round(working)) + total_bytes(extras)
    forward_moment = max(total_bytes(loss_forward), total_bytes(exchange), total_bytes(tr.forward_end))
    backward_moment = max(total_bytes(loss_backward), recomputed_bytes, total_bytes(exchange_backward),
                          total_bytes(tr.step_in_backward))
    place = placement(training, recipe, {"parameters": ms.parameters, "master_weights": ms.master_weights,
                                         "optimizer_states": ms.optimizer_states, "gradients": ms.gradients},
                      _optimizer_partition(sp, par, zero, inv.trainable if inv else None), zero)
    on_gpu = place.gpu
    if place.step_on_host:
        tr = tr._replace(optimizer=[])  # the step and its temporaries run on the CPU
    states = (int(round(on_gpu["parameters"])) + int(round(on_gpu["master_weights"]))
              + int(round(on_gpu["optimizer_states"])) + int(round(ms.fp8_weight_copies)) + total_bytes(tr.persistent))
    grads = 0 if training.optimizer_in_backward else int(round(on_gpu["gradients"]))
    grads_early = grads if grads_live else 0
    saved = total_bytes(loss_saved)
    totals = (states + grads_early + saved + forward_moment + total_bytes(tr.forward),
              states + grads_early + saved + backward_moment + total_bytes(tr.backward),
              states + grads + total_bytes(tr.optimizer))
    # FSDP2 without accumulation creates its gradients in backward: its last moments hold nearly every
    # sharded gradient beside a unit's unsharded parameters and gradients and the first layer being
    # recomputed (measured, tests/data/measured/torchtitan); the activations are gone by then
    late = training.framework in FSDP_FRAMEWORKS and not grads_live and not training.optimizer_in_backward
    end = fsdp2_backward_end(arch, training, recipe, par, sp, zero, grads, working, extras, shared) if late else None
    if end:
        backward_end = states + int(round(end.gradients)) + total_bytes(end.transients)
    else:
        backward_end = states + grads + recomputed_bytes + total_bytes(tr.backward) if late else 0
    communication = shared.moe_communication if moe_stage else shared.communication
    parts = once(partial(_static_parts, ms, place, tr, (exchange, exchange_backward), loss_saved, loss_forward,
                         loss_backward, working, grads_live, training, extras, end))
    outside = communication.bytes + shared.runtime.bytes + (managed.bytes if managed else 0)
    return _StaticStage(totals, communication, outside, sp.num_layers, int(round(sp.local)), parts,
                        place.host + paged_host, place.nvme, backward_end, managed)


def _paged_states(ms, arch: Architecture, training: Training, recipe: Recipe, par: Parallel, sp: StageParameters,
                  inv, zero: int) -> tuple:
    """A paged optimizer's large states leave the allocator for managed memory (paged.py): the model
    states less them, their component on the GPU and the host memory they need when paged out."""
    from .paged import components as paged_components, is_paged, paged_bytes
    if not is_paged(training):
        return ms, None, ()
    shards = par.dp * par.cp if zero >= 1 else 1
    on_gpu, elements = paged_bytes(arch, training, sp, inv, shards)
    managed, host = paged_components(on_gpu, elements, training)
    written = ms.formulas

    def formulas() -> dict[str, str]:
        text = written()
        return {**text, "optimizer_states": text["optimizer_states"] + f", less {on_gpu / 2**30:,.2f} GiB paged to "
                                                                      "managed memory (outside the allocator)"}
    return ms._replace(optimizer_states=ms.optimizer_states - on_gpu, formulas=once(formulas)), managed, (host,)


def _math_attention_moment(arch: Architecture, training: Training, sp: StageParameters, shared: _Shared,
                           loss_saved: float, phase: str) -> list[Component]:
    """The last layer's attention on SDPA's math backend (kbit.py) in `phase`, over the phase's
    activations and the loss's saved tensors."""
    from .kbit import MATH_SOURCE, attention_moment
    kind = sp.kind_counts[-1][0]
    recomputed = bool(act.recomputed_layer_count(training, sp.num_layers))
    moment, formula = attention_moment(arch, ledger_training(training), shared.parallel, kind, recomputed,
                                       shared.full_layer[kind], loss_saved, phase)
    return [component("transient", f"Attention {phase} on SDPA's math backend (fp32 scores)", moment, formula,
                      MATH_SOURCE)]


def _recompute_working_set(training: Training, sp: StageParameters, shared: _Shared) -> float:
    """What one layer rematerialises in backward, one layer at a time: all it keeps without
    recompute under full recompute, the tensors the policy recomputes under torchtitan's
    operator-level checkpointing; nothing else."""
    if act.recomputed_layer_count(training, sp.num_layers):
        # with offloaded activations the layer's input comes back from the host beside it
        reload = shared.kept_input if training.offload_activations else 0.0
        return max((shared.full_layer[k] for k, _ in sp.kind_counts), default=0.0) + reload
    if training.offload_activations:  # one layer's saved tensors copied back for its backward
        return max((shared.full_layer[k] for k, _ in sp.kind_counts), default=0.0)
    if act.op_level(training):
        return max((shared.full_layer[k] - shared.per_layer[k] for k, _ in sp.kind_counts), default=0.0)
    return 0.0


def _optimizer_partition(sp: StageParameters, par: Parallel, zero: int, trainable: float | None = None) -> float:
    """The parameters whose optimizer state one GPU keeps: its stage's (an adapter run's `trainable`
    ones, expert parallelism excluded), divided by the shard group from ZeRO 1 (states.py)."""
    if trainable is not None:
        return trainable / (par.dp if zero >= 1 else 1)
    if zero < 1:
        return sp.local
    return sp.dense_local / (par.dp * par.cp) + sp.expert_local / max(1, par.expert_data_parallel)


def _static_parts(ms, place: Placement, tr: Transients, exchange: tuple[list, list], loss_saved: tuple,
                  loss_forward: list, loss_backward: list, working: float, grads_live: bool,
                  training: Training, extras: list[Component] = (), end: BackwardEnd | None = None) -> _StaticParts:
    """The components behind `_static_stage`'s totals (the same pieces, with formulas and sources)."""

    def state(key: str, label: str, source: str) -> Component:
        if key in place.moved:
            field = "offload_parameters" if key == "parameters" else "offload_optimizer"
            return component(key, label, 0, f"0: on the {'host' if place.moved[key] == 'cpu' else 'NVMe'} "
                             f"({field} {place.moved[key]})", OFFLOAD_SOURCES[training.framework])
        return component(key, label, getattr(ms, key), ms.formula(key), source)

    base = (state("parameters", "Parameters", ZERO_SOURCE),
            state("master_weights", "Master weights (fp32)", ZERO_SOURCE),
            state("optimizer_states", "Optimizer states", OPTIMIZERS[training.optimizer].source))
    if ms.fp8_weight_copies:
        base += (component("fp8_weight_copies", "FP8 weight copies", ms.fp8_weight_copies,
                           ms.formula("fp8_weight_copies"), FP8_SOURCE),)
    grads_full = component("gradients", "Gradients", 0, "none kept: each is stepped and freed in backward",
                           OPTIMIZER_IN_BACKWARD_SOURCE) if training.optimizer_in_backward else \
        state("gradients", "Gradients", ZERO_SOURCE)
    # zero_grad(set_to_none=True) frees them after each step; backward's peak is its first moment
    # (the loss's gradients beside every activation), before any gradient exists, and its end (every
    # gradient, activations gone) is the optimizer phase without its temporaries.
    grads_early = grads_full if grads_live else component(
        "gradients", "Gradients", 0, "none yet: set to None after the last step",
        "torch.optim.Optimizer.zero_grad(set_to_none=True)")
    label = ("One layer's activations copied back from the host" if training.offload_activations
             and training.recompute == "none" else "One recomputed layer's activations")
    recomputed = ([component("transient", label, working, "per-layer ledger of one layer", act.KORTHIKANTI)]
                  if working else []) + list(extras)  # a block's backward beyond its saved tensors (torchtitan)

    def largest(*moments: list[Component]) -> list[Component]:  # the first of the largest, as the totals
        return max(moments, key=total_bytes)

    folded = {"forward": fold(largest(loss_forward, exchange[0], tr.forward_end) + tr.forward),
              "backward": fold(largest(loss_backward, recomputed, exchange[1], tr.step_in_backward) + tr.backward),
              "backward_end": fold(end.transients if end else recomputed + tr.backward),
              "optimizer": fold(tr.optimizer)}
    grads_end = None
    if end and end.gradients_formula:
        grads_end = component("gradients", "Gradients (their units' reduce-scatters not all run yet)", end.gradients,
                              end.gradients_formula, FSDP2_RS_SOURCE)
    return _StaticParts(base + tuple(tr.persistent), grads_early, grads_early, grads_full, loss_saved, folded,
                        grads_end)


_NO_ACTIVATIONS = Component("activations", "Activations", 0, "none: freed by the end of backward", act.KORTHIKANTI)
_ACTIVATIONS_GONE = Component("activations", "Activations", 0,
                              "none left: backward's last moments, every layer's activations freed",
                              "measured, tests/data/measured/torchtitan (FSDP2 creates its gradients in backward)")


class _Group(NamedTuple):
    """What the stages of a group share: their static part, the bytes per micro-batch in flight of
    their layers (`_activation_units`) and the builder of their phases."""

    static: _StaticStage
    units: tuple[float, ...]
    detail: StageDetail


def _group(static: _StaticStage, sp: StageParameters, cfg: Resolved, shared: _Shared,
           memo: dict, key: tuple) -> _Group:
    """A group's activation counts and units are kept in `memo` (`_stage_memo`) under its key, which
    names all they read of the stage (its ends, its kinds and, under full recompute, its chunks); its
    phase builder is the estimate's own (it remembers the phases it built by stage number)."""
    known = memo.get(("group", key))
    if known is None:
        counts = _activation_counts(cfg.training, sp, cfg.architecture)
        known = memo[("group", key)] = (counts, _activation_units(counts, shared))
    counts, units = known
    return _Group(static, units,
                  StageDetail(partial(_training_detail, static, sp, counts, cfg.training, cfg.parallel, shared), {}))


def _training_stages(cfg: Resolved, shared: _Shared, memo: dict, peak_only: bool = False) -> list[StageEstimate]:
    """Every stage of a training step. Stages with the same layers and no embedding or head form a
    group: they share their static part (kept in `memo`, `_stage_memo`), their activation units and
    the builder of their phases; under full recompute only stages whose chunks store layers of the
    same kinds (`sharding.layers_key`) group. What differs between them is the micro-batches in
    flight, found for every rank in one pass."""
    arch, training, par, m = cfg.architecture, cfg.training, cfg.parallel, cfg.microbatches
    groups: dict[tuple, _Group] = {}
    # the static parts and activation groups of stages without the head do not read the loss:
    # estimates that differ in the loss alone (a search's fused/chunked pair) share them, in the fused
    # loss's memo
    headless = memo if training.loss == "fused" or par.pp == 1 else _stage_memo(cfg, loss="fused")
    full, offloaded = training.recompute == "full", training.offload_activations
    fragmentation_share = shared.fragmentation
    stages = []
    for sp, inflight in zip(cfg.stages, act.in_flight_per_rank(par, m, [sp.chunks for sp in cfg.stages],
                                                                         training.microbatch_group_size)):
        signature = (sp.stage if sp.first or sp.last else -1, sp.kind_counts)
        if full:  # the layers a stage stores: which of its chunks' layers the first n (or every N-th) leave
            key = (signature, sp.layers_key, training.recompute_layers)
        else:
            key = signature
        group = groups.get(key)
        if group is None:
            ends = (sp.first, sp.last, sp.kind_counts)  # all a static part reads of the stage
            home = memo if sp.last else headless
            static = home.get(ends)
            if static is None:
                static = home[ends] = _static_stage(arch, training, cfg.recipe, par, sp, cfg.zero_stage, m, shared)
            group = groups[key] = _group(static, sp, cfg, shared, home, key)
        static = group.static
        activations = 0  # the sum of `_activation_parts`, each part rounded as there
        for unit in group.units:
            activations += int(round(unit * inflight))
        if sp.first:
            activations += int(round(shared.embedding_bytes * max(1.0, inflight)))
        host = static.host
        if offloaded:
            activations, host = _offloaded_activations(activations, sp, inflight, shared, host)
        forward, backward, step = static.totals
        forward += activations
        # backward's last moments (fsdp2 creating its gradients) when larger than its start
        backward = max(backward + activations, static.backward_end)
        if forward >= backward and forward >= step:
            peak_phase, allocated = "forward", forward
        elif backward >= step:
            peak_phase, allocated = "backward", backward
        else:
            peak_phase, allocated = "optimizer", step
        device = allocated + static.outside_allocator + int(round(allocated * fragmentation_share))
        if peak_only:  # `device_total`: the numbers alone (a stage of the peak's total stands for it)
            if not stages or device > stages[0]:
                stages[:] = [device]
            continue
        stages.append(StageEstimate(
            sp.stage, static.layers, static.parameters_per_gpu, inflight, peak_phase, allocated, device,
            (("forward", forward), ("backward", backward), ("optimizer", step)), group.detail, host, static.nvme))
    return stages


OFFLOAD_ACTIVATIONS_SOURCE = ("torchtune training/_activation_offloading.py OffloadActivations (saved tensors over 1 KiB "
                              "copied to pinned host memory in forward and back in backward; the loss outside it); "
                              "measured, tests/data/measured/torchtune")


def _offloaded_activations(activations: int, sp: StageParameters, inflight: float, shared: _Shared,
                           host: tuple) -> tuple[int, tuple]:
    """torchtune's OffloadActivations: the layers' saved tensors live on the host between forward
    and backward; only the first stage's token ids stay (and the loss, counted apart). Returns the
    activations left on the GPU and the host components with the offloaded ones."""
    stay = int(round(shared.embedding_bytes * max(1.0, inflight))) if sp.first and shared.embedding else 0
    moved = component("activations", "Offloaded activations (pinned host memory)", activations - stay,
                      "every layer's saved tensors (the activation ledger) x micro-batches in flight",
                      OFFLOAD_ACTIVATIONS_SOURCE)
    return stay, host + (moved,)


def _training_detail(static: _StaticStage, sp: StageParameters, counts: tuple, training: Training, par: Parallel,
                     shared: _Shared, stage: StageEstimate) -> tuple[tuple[Phase, ...], tuple[Component, ...]]:
    """A training stage's three phases, and what it holds outside the allocator at its peak. The
    backward phase shows its largest moment: its start, or its last moments when those are larger
    (`backward_ends`, as `_training_stages` found them)."""
    inflight, allocated = stage.in_flight_microbatches, stage.allocated_peak_bytes
    activations = stage.phase_totals[0][1] - static.totals[0]
    backward_ends = static.backward_end > static.totals[1] + activations
    st = static.parts()
    parts = _activation_parts(sp, inflight, counts, shared)
    if training.offload_activations:  # the layers' parts are on the host (`_offloaded_activations`)
        parts = tuple(p if p[0].startswith("token ids") else
                      (p[0] + ", on the host", 0, f"0 on the GPU: {p[1] / 2**30:,.2f} GiB offloaded ({p[2]})")
                      for p in parts)
    saved = (_activations_component(parts, training, par),) + st.loss_saved
    backward = phase("backward", st.kept + (st.grads_end or st.grads_full, _ACTIVATIONS_GONE),
                     st.folded["backward_end"]) \
        if backward_ends else phase("backward", st.kept + (st.grads_backward,) + saved, st.folded["backward"])
    phases = (phase("forward", st.kept + (st.grads_forward,) + saved, st.folded["forward"]),
              backward,
              phase("optimizer", st.kept + (st.grads_full, _NO_ACTIVATIONS), st.folded["optimizer"]))
    managed = (static.managed,) if static.managed else ()
    return phases, (static.communication, shared.runtime, *managed, fragmentation(allocated, shared.hardware))
