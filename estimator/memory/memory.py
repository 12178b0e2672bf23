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
parameter gradient exists, or at its last ones, nearly every gradient made beside the first layer's
recomputation or a tied embedding's two gradients being summed (trainer_backward_end.py, FSDP2's in
backward_moments.py), whichever is larger (as measured, tests/data/measured).

Outside PyTorch's allocator the device also holds the CUDA context, NCCL's buffers and the
allocator's fragmentation; they make ``device_total_bytes``.
"""

from __future__ import annotations

from dataclasses import replace
from functools import partial
from typing import NamedTuple

from .activations.entries import KORTHIKANTI
from .pipeline import global_batch_size, in_flight_per_rank
from ..spec import memo as _memo
from ..spec.architecture import Architecture, parameter_counts
from .components import Component, Phase, StageDetail, StageEstimate, component, fragmentation, phase, total_bytes
from ..spec.hardware import Hardware
from ..spec.parallel import Parallel
from .resolved import Resolved, resolve, training_with
from .activations.recompute import recomputed_layer_count
from .sharding import StageParameters
from .adapters import trainable_count
from ..spec.training import Training
from .result import Estimate, fit_on
from .stage_shared import (_Shared, _activation_counts, _activation_parts, _activation_units, _activations_component,
                           _shared)
from .static_stage import StepPart, StepShared, _StaticStage, _static_stage, step_part
from .step_setup import sealed_fields, step_setup
from .mtp_built import mtp_note
from .pp_buffers import all_gather_pool
from .pp_receive import on_rank, receive_buffers, receive_bytes, receiving, step_receiving
from .megatron_vpp_grad import schedule_bytes, schedule_gradients
from .pp_first_backward import fewer_at_first_backward, interleaved_applies
from .replays import FLAT_FOR_SEARCH, replay_rule, replayed_cache
from ..models.loading import load_config


# --- the estimate -----------------------------------------------------------------------------------

def estimate(arch: Architecture, training: Training | None = None, par: Parallel | None = None,
             hardware: Hardware | None = None, *, replay: bool = True) -> Estimate:
    """`replay`: the allocator's cache replayed where the ledger gives the order of allocations
    (reserved.py), the reported estimate's; False: the flat share everywhere, the total a layout search
    judges by (`device_total`), monotone in the micro-batch and the recompute setting."""
    return estimate_resolved(resolve(arch, training, par, hardware), replay=replay)


def device_total(arch: Architecture, training: Training | None = None, par: Parallel | None = None,
                 hardware: Hardware | None = None) -> int:
    """`estimate(..., replay=False).device_total_bytes` by the same code, without building the estimate:
    its stages, notes and components (a layout search judges most layouts by this number alone). Where
    the reported estimate replays the caching allocator (reserved.py: the HF Trainer on one GPU's
    weights) this total keeps the flat share of cache in its place: monotone in the micro-batch and the
    recompute setting, as the planner's pruning rules need, where the replayed cache is not (nor is a
    real GPU's)."""
    cfg = resolve(arch, training, par, hardware)
    if cfg.training.rl or cfg.training.mode == "inference":
        return estimate_resolved(cfg, replay=False).device_total_bytes
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
    out, steps = [], _StepParts(cfg)
    for sp in cfg.stages:
        ends = static_key(sp, cfg.training)
        static = memo.get(ends)  # a static part built before holds its step part
        part = steps.part(shared, sp) if static is None else static.step
        step, outside = part.step_bytes, part.outside_allocator
        out.append(StepFloor(step + outside + int(round(step * shared.fragmentation)) + _cached_bytes(shared),
                             int(round(sp.local))))  # `_StaticStage.parameters_per_gpu`
    return tuple(out)


class _StepParts:
    """A configuration's step parts (`static_stage.StepPart`: a stage's model states and transients), kept in
    the memo of their setup (`memo`): a search's states floors (`step_floors`) read them alone, and most of
    their layouts never reach a full estimate; those that do build their static parts on them. The memo is
    found on the first part asked for (most estimates find their static parts built)."""

    __slots__ = ("cfg", "memo", "setup")

    def __init__(self, cfg: Resolved):
        self.cfg, self.memo, self.setup = cfg, None, None

    def part(self, shared: _Shared, sp) -> StepPart:
        """The step part of stage `sp`, built on first sight."""
        cfg = self.cfg
        if self.memo is None:
            self.memo, self.setup = _step_memo(cfg)
        # what the step part reads of the stage: its ends, kinds and (torch pipelining: transients' RoPE tables
        # per chunk) its chunks' count, not Megatron's block-recompute count or single chunk (`static_key` adds them)
        chunks = () if cfg.training.framework == "megatron" else (len(sp.chunks),)
        key = ("step", sp.first, sp.last, sp.kind_counts) + chunks
        part = self.memo.get(key)
        if part is None:
            inputs = StepShared(shared.communication, shared.moe_communication, shared.runtime, shared.hardware,
                                shared.edge_communication)
            part = self.memo[key] = step_part(cfg.architecture, self.setup, cfg.recipe, cfg.parallel, sp,
                                              cfg.zero_stage, inputs, self.memo)
        return part


def _step_memo(cfg: Resolved) -> tuple[_StageMemo, Training]:
    """The memo of the step parts of a setup, and that setup (step_setup.py: the training setup with the fields
    step parts do not read sealed: in most setups the micro-batch size, the loss and the recompute setting),
    so a search's micro-batch sizes, losses and recompute settings share one step part per stage. The rest of
    the key is `_stage_memo`'s, less the micro-batches per step where the micro-batch size is sealed (they
    reach a step part through it alone)."""
    par, sealed = cfg.parallel, sealed_fields(cfg.training, cfg.parallel, cfg.recipe)
    setup = step_setup(cfg.architecture, cfg.training, sealed)
    m = None if "micro_batch_size" in sealed else cfg.microbatches
    key = ("step parts", setup, cfg.hardware, par.tp, par.sequence_parallel, par.dp, par.cp, par.ep, par.etp,
           _pipeline_key(cfg), cfg.zero_stage, m)
    return _StageMemo(cfg.architecture, key), setup


def _shared_of(cfg: Resolved, memo) -> _Shared:
    shared = memo.get("shared")
    if shared is None:
        shared = memo["shared"] = _shared(cfg.architecture, cfg.training, cfg.parallel, cfg.hardware,
                                          cfg.zero_stage, cfg.padded_vocab)
    return shared


def estimate_resolved(cfg: Resolved, replay: bool = True) -> Estimate:
    """The estimate of a configuration resolved once (`resolved.resolve`); `replay` as `estimate`'s."""
    arch, training, par, hardware = cfg.architecture, cfg.training, cfg.parallel, cfg.hardware
    if training.rl:
        return _rl_estimate(cfg)
    zero, m, vocab = cfg.zero_stage, cfg.microbatches, cfg.padded_vocab
    counts = parameter_counts(arch)
    memo = _stage_memo(cfg)
    shared = _shared_of(cfg, memo)
    if training.mode == "inference":
        from .inference import inference_stage
        stages = [inference_stage(arch, training, par, hardware, sp, vocab, shared) for sp in cfg.stages]
    else:
        stages = _training_stages(cfg, shared, memo, replay=replay)
    peak = max(stages, key=lambda s: s.device_total_bytes)
    notes = _notes(arch, training, par, zero, m, vocab)
    if mtp_note(cfg.mtp):
        notes = (mtp_note(cfg.mtp),) + notes
    return Estimate(
        config=cfg, parameters_total=counts.total, parameters_active=counts.active,
        parameters_trainable=(0 if training.mode == "inference" else trainable_count(arch, training) if training.adapter
                              else counts.total), stages=tuple(stages),
        peak_stage=peak.stage, allocated_peak_bytes=peak.allocated_peak_bytes,
        device_total_bytes=peak.device_total_bytes, fit=fit_on(peak.device_total_bytes, hardware.device),
        notes=notes, _shared=shared)


def static_key(sp, training: Training) -> tuple:
    """All a stage's static part reads of the stage, its key in the stage memo: its ends, its layers' kinds and
    what it reads of its chunks and of recompute_layers. Megatron's reads whether the rank runs one chunk and,
    with the block method, how many of the stage's layers it recomputes (the later layers are freed before the
    first n are recomputed, recompute_moment.freed_before_recompute); torch pipelining's (fsdp2 and the other
    frameworks) the chunks' count (pp_buffers.py, transients' RoPE tables, an interleaved rank's gradients).
    Keying Megatron on the count would build one static part per virtual-stage count for the same stage."""
    if training.framework != "megatron":
        return (sp.first, sp.last, sp.kind_counts, len(sp.chunks))
    block = None if training.recompute_layers is None else recomputed_layer_count(training, sp.num_layers)
    return (sp.first, sp.last, sp.kind_counts, len(sp.chunks) == 1, block)


def _stage_memo(cfg: Resolved, loss: str | None = None) -> dict:
    """What estimates of one architecture reuse: the part every stage shares (`_Shared`) and each
    stage's static part (`_static_stage`). Both depend on the training setup, the hardware, TP, SP,
    DP, CP, EP and ETP, whether there is a pipeline, the ZeRO stage and the micro-batches per step
    (and a static part on the stage's layers and ends), not on how the pipeline splits and schedules
    the layers: a layout search varying those, and an app rerun, read them back. The architecture is
    immutable, so the memo never goes stale; whatever these parts come to read of the layout must
    join the key. How many layers full recompute checkpoints (`recompute_layers`) is not part of it:
    the shared part does not read it, and a static part reads it only under Megatron's block method, where
    `static_key` adds the stage's recomputed count; the groups kept here add it to their keys
    (`_training_stages`). `loss`:
    the memo of the same setup with that loss instead (a stage without the head reads nothing of
    the loss: `_static_stage` reads the loss's parts of `_Shared` and the head's transients on the
    last stage only)."""
    fields = {"recompute_layers": None} if loss is None else {"recompute_layers": None, "loss": loss}
    par, training = cfg.parallel, training_with(cfg.architecture, cfg.training, **fields)
    return _StageMemo(cfg.architecture, ("stage parts", training, cfg.hardware, par.tp, par.sequence_parallel, par.dp,
                                         par.cp, par.ep, par.etp, _pipeline_key(cfg), cfg.zero_stage,
                                         cfg.microbatches))


def _pipeline_key(cfg: Resolved) -> object:
    """What the stage parts read of the pipeline: whether there is one; a Megatron-Core step's also whether it
    interleaves, which its NCCL communicators read (stage_shared.megatron_world: PP's group's communicator, or one
    per neighbour). Their bytes read no more of it (each of several ranks is charged alike, whatever its size), so
    a search's pipeline depths share their parts."""
    par, training = cfg.parallel, cfg.training
    if training.framework == "megatron" and training.mode == "training":
        return par.pp > 1, par.vpp > 1
    return par.pp > 1


class _StageMemo:
    """One configuration's stage parts (`_stage_memo`): a dict that is one value in the architecture's
    memo, whose bytes grow by each part's as it is added (estimator/spec/memo.py), read and written as a
    dict (a part is read far more often than the memo's bookkeeping could afford per part). A part is
    counted as held by the memo (`memo.hold`, released with the entry) as a remembered dict's values are:
    a part that holds another (a static part its step part) counts it under the other's own bytes, once."""

    __slots__ = ("parts", "entry")

    def __init__(self, arch: Architecture, key: tuple):
        self.entry = _memo.SHARED.entry((arch.memo_token, key), dict, "stage parts")
        self.parts = self.entry[0]

    def get(self, part, default=None):
        return self.parts.get(part, default)

    def __setitem__(self, part, value) -> None:
        self.parts[part] = value
        kind = "shared" if part == "shared" else part[0] if part[0] in _PART_KINDS else "static"
        size = _memo.SHARED.size_of(value, _PART_KINDS[kind]) + _memo.PART_BYTES
        if self.entry[2]:  # still remembered: its release (`Memo._forget`) releases this part with it
            size += _memo.HELD_BYTES * _memo.hold(value)
        _memo.SHARED.grow(self.entry, size)


_PART_KINDS = {k: "stage parts/" + k for k in ("shared", "group", "static", "workspaces", "wgrad cache",
                                                             "moments", "step")}


def _rl_estimate(cfg: Resolved) -> Estimate:
    """RL: the trainer's step on prompt + response sequences, then every phase of the step on its
    busiest GPU (rl.py); the totals and the verdict are the largest phase's."""
    from .rl import rl_phases, rollout_host, trainer_training
    rl = cfg.training.rl
    train = estimate_resolved(resolve(cfg.architecture, trainer_training(cfg.training), cfg.parallel, cfg.hardware))
    phases = rl_phases(train, rl, estimate)
    host = rollout_host(phases)  # the trainer's states parked on the host while the engine runs
    train = replace(train, stages=tuple(s._replace(host=s.host + host) for s in train.stages))
    peak = max(phases, key=lambda p: p.device_total_bytes)
    shown = replace(cfg, training=replace(cfg.training, seq_len=rl.sequence_len))
    note = (f"RL ({rl.algorithm}): the {peak.name} phase decides the fit; the stages show the training phase's "
            f"step on {rl.sequence_len:,}-token sequences")
    return replace(train, config=shown, rl_phases=phases, allocated_peak_bytes=peak.allocated_bytes,
                   device_total_bytes=peak.device_total_bytes, fit=fit_on(peak.device_total_bytes, cfg.gpu),
                   notes=((mtp_note(cfg.mtp),) if cfg.mtp.reason else ()) + train.notes + (note,))


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
        notes.append(f"global batch {global_batch_size(training, par):,} (auto): {m} micro-batches per step, "
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
    if arch.is_hybrid and training.mode == "training" and training.framework != "hf":
        notes.append(f"hybrid layers under {training.framework}: the linear-attention and Mamba mixers keep what their "
                     "kernels (flash-linear-attention, causal-conv1d, mamba-ssm) keep, as measured with the HF Trainer; "
                     "the ops around them are modelled from " + ("Megatron-Core 0.16.1's mamba_mixer.py for the Mamba "
                     "blocks and from transformers for the rest" if training.framework == "megatron"
                                                                  and not arch.attention_layer_period else
                     "transformers") + ", not measured under this framework (memory/activations/hybrid.py)")
    from .activations.hybrid import ssm_kernels_note
    if (ssm_note := ssm_kernels_note(arch, training, par)) is not None:
        notes.append(ssm_note)
    if arch.attention_layer_period and training.framework == "megatron" and training.mode == "training":
        notes.append("Megatron-Core 0.16 has no Mamba-1 mixer (ssm/mamba_mixer.py is Mamba-2): the Mamba-1 layers are "
                     "modelled as transformers' JambaMambaMixer runs them with mamba-ssm's selective scan")
    if training.liger_kernel:
        from .liger import NOTE as LIGER_NOTE
        notes.append(LIGER_NOTE)
    return tuple(notes)


_NO_ACTIVATIONS = Component("activations", "Activations", 0, "none: freed by the end of backward", KORTHIKANTI)
_ACTIVATIONS_GONE = Component("activations", "Activations", 0,
                              "none left: backward's last moments, every layer's activations freed",
                              "measured, tests/data/measured/torchtitan (FSDP2 creates its gradients in backward) "
                              "and tests/data/measured (the HF Trainer's backward ends, trainer_backward_end.py)")


class _Group(NamedTuple):
    """What the stages of a group share: their static part, the bytes per micro-batch in flight of
    their layers (`_activation_units`) and the builder of their phases."""

    static: _StaticStage
    units: tuple[float, ...]
    detail: StageDetail


def _group(static: _StaticStage, sp: StageParameters, cfg: Resolved, shared: _Shared,
           memo: dict, key: tuple, no_replay: str | None) -> _Group:
    """A group's activation counts and units are kept in `memo` (`_stage_memo`) under its key, which
    names all they read of the stage (its ends, its kinds and, under full recompute, its chunks); its
    phase builder is the estimate's own (it remembers the phases it built by stage number)."""
    known = memo.get(("group", key))
    if known is None:
        counts = _activation_counts(cfg.training, sp, cfg.architecture)
        known = memo[("group", key)] = (counts, _activation_units(counts, shared))
    counts, units = known
    run = (cfg.recipe, cfg.microbatches, cfg.architecture)
    return _Group(static, units, StageDetail(partial(_training_detail, static, sp, counts, cfg.training, cfg.parallel,
                                                     run, shared, no_replay), {}))


def _stage_group(cfg: Resolved, shared: _Shared, memo: dict, headless: dict, groups: dict[tuple, _Group],
                 sp, no_replay, steps: _StepParts) -> _Group:
    """The group of stage `sp` (`groups` keeps those found so far), its static part built on first sight (on
    its step part, from `steps`)."""
    signature = (sp.stage if sp.first or sp.last else -1, sp.kind_counts)
    # under full recompute, the layers a stage stores: which of its chunks' layers the first n (or every N-th) leave
    if cfg.training.recompute == "full":
        key = (signature, sp.layers_key, cfg.training.recompute_layers)
    else:
        key = signature
    group = groups.get(key)
    if group is None:
        ends = static_key(sp, cfg.training)
        home = memo if sp.last else headless
        static = home.get(ends)
        if static is None:
            static = home[ends] = _static_stage(cfg.architecture, cfg.training, cfg.recipe, cfg.parallel, sp,
                                                cfg.zero_stage, cfg.microbatches, shared, memo,
                                                steps.part(shared, sp))
        group = groups[key] = _group(static, sp, cfg, shared, home, key, no_replay)
    return group


def _stage_activations(units, sp, inflight: float, shared: _Shared) -> int:
    """A stage's stored activations with `inflight` micro-batches in flight."""
    activations = 0  # the sum of `_activation_parts`, each part rounded as there
    for unit in units:
        activations += int(round(unit * inflight))
    if sp.first:  # the embedding's, and a vision tower's (`stage_shared._activation_parts`)
        activations += int(round(shared.embedding_bytes * max(1.0, inflight)))
        activations += int(round(shared.vision[0] * max(1.0, inflight)))
    return activations


def _peak_phase(forward: int, backward: int, step: int) -> tuple[str, int]:
    """The phase at the stage's peak and its allocated bytes (forward first on a tie, then backward)."""
    if forward >= backward and forward >= step:
        return "forward", forward
    if backward >= step:
        return "backward", backward
    return "optimizer", step


def _training_stages(cfg: Resolved, shared: _Shared, memo: dict, peak_only: bool = False,
                     replay: bool = True) -> list[StageEstimate]:
    """Every stage of a training step. Stages with the same layers and no embedding or head form a
    group: they share their static part (kept in `memo`, `_stage_memo`), their activation units and
    the builder of their phases; under full recompute only stages whose chunks store layers of the
    same kinds (`sharding.layers_key`) group. What differs between them is the micro-batches in
    flight, found for every rank in one pass."""
    training, par, m = cfg.training, cfg.parallel, cfg.microbatches
    groups: dict[tuple, _Group] = {}
    # the static parts and activation groups of stages without the head do not read the loss:
    # estimates that differ in the loss alone (a search's fused/chunked pair) share them, in the fused
    # loss's memo
    headless = memo if training.loss == "fused" or par.pp == 1 else _stage_memo(cfg, loss="fused")
    offloaded = training.offload_activations
    fragmentation_share, cached = shared.fragmentation, _cached_bytes(shared)
    # the allocator's cache: replayed for the reported estimate where reserved.py can, else the flat share
    no_replay = replay_rule(cfg) or (None if replay else FLAT_FOR_SEARCH)
    replayed = not peak_only and no_replay is None
    stages, steps = [], _StepParts(cfg)
    step_rx = step_receiving(cfg.architecture, training, par, m)  # torch pipelining's receive buffers
    for sp, inflight in zip(cfg.stages, in_flight_per_rank(par, m, [sp.chunks for sp in cfg.stages],
                                                                         training.microbatch_group_size)):
        group = _stage_group(cfg, shared, memo, headless, groups, sp, no_replay, steps)
        static = group.static
        activations = _stage_activations(group.units, sp, inflight, shared)
        host = static.host
        if offloaded:
            activations, host = _offloaded_activations(activations, sp, inflight, shared, host)
        forward, backward, step = static.totals
        rx = on_rank(step_rx, par, sp)
        ahead, behind, settled = _pipeline_held(cfg, rx, sp, inflight)
        forward += activations + ahead
        step += settled
        # a pipelined FSDP2 rank 0 running every forward first: its inputs and gradients never peak together
        # (interleaved: the replayed moment, with its receive buffers)
        fewer = _fewer_at_first_backward(training, cfg.recipe, par, m, sp, inflight, shared,
                                         lambda k: _stage_activations(group.units, sp, k, shared), static.loss_margin,
                                         rx)
        started = backward + activations + sum(c.bytes for c in fewer) + behind
        # backward's last moments (fsdp2 creating its gradients) when larger than its start
        backward = max(started, static.backward_end + settled)
        peak_phase, allocated = _peak_phase(forward, backward, step)
        pools = _idle_pools(static, sp, training, par, peak_phase, static.backward_end + settled > started)
        device = allocated + static.outside_allocator + int(round(allocated * fragmentation_share)) + cached \
            + sum(p.bytes for p in pools)
        if peak_only:  # `device_total`: the numbers alone (a stage of the peak's total stands for it)
            if not stages or device > stages[0]:
                stages[:] = [device]
            continue
        cache = replayed_cache(cfg, shared, sp, static) if replayed else None
        if cache is not None:
            device = allocated + static.outside_allocator + cache.bytes
        stages.append(StageEstimate(
            sp.stage, static.layers, static.parameters_per_gpu, inflight, peak_phase, allocated, device,
            (("forward", forward), ("backward", backward), ("optimizer", step)), group.detail, host, static.nvme,
            cache))
    return stages


def _pipeline_held(cfg: Resolved, rx, sp: StageParameters, inflight: float) -> tuple[int, int, int]:
    """What a rank's pipeline holds beyond its layers' activations, in bytes, at its forward's peak, at its
    backward's and once every backward ran: torch pipelining's receive buffers beyond the counted layer inputs
    (pp_receive.py: they depend on the rank's in-flight) and the activation gradients Megatron's schedules hold
    (megatron_pp_grad.py, megatron_vpp_grad.py)."""
    training, par = cfg.training, cfg.parallel
    ahead, behind, settled = receive_bytes(rx, par, sp, inflight, interleaved_applies(training, par, sp))
    grad_ahead, grad_behind = schedule_bytes(cfg.architecture, training, par, sp, cfg.microbatches)
    return ahead + grad_ahead, behind + grad_behind, settled


def _less(whole: Component, fewer: tuple[Component, ...]) -> Component:
    """`whole` with the parts of `fewer` under its key (pp_first_backward: what a pipelined FSDP2 rank's
    backward peak does not hold of it)."""
    mine = tuple(c for c in fewer if c.key == whole.key)
    if not mine:
        return whole
    return Component(whole.key, whole.label, whole.bytes + sum(c.bytes for c in mine),
                     f"{whole.formula} - what the schedule's largest moment does not hold of them",
                     whole.source, (whole.parts or (whole,)) + mine)


def _fewer_at_first_backward(training: Training, recipe, par: Parallel, m: int, sp: StageParameters, inflight: float,
                             shared: _Shared, held, loss_margin: int, rx=None) -> tuple[Component, ...]:
    """`pp_first_backward.fewer_at_first_backward` of a stage (`held(k)`: its stored activations, k in flight)."""
    outside_layers = shared.embedding_bytes + shared.vision[0] if sp.first else 0.0
    return fewer_at_first_backward(training, recipe, par, sp, m, inflight, held, outside_layers, loss_margin, rx)


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
                     run: tuple, shared: _Shared, no_replay: str | None,
                     stage: StageEstimate) -> tuple[tuple[Phase, ...], tuple[Component, ...]]:
    """A training stage's three phases, and what it holds outside the allocator at its peak. The
    backward phase shows its largest moment: its start, or its last moments when those are larger
    (`backward_ends`, as `_training_stages` found them)."""
    inflight, allocated = stage.in_flight_microbatches, stage.allocated_peak_bytes
    activations = stage.phase_totals[0][1] - static.totals[0]
    # the group's stages share `sp` but for their rank, which the schedule's replay reads
    mine = sp._replace(stage=stage.stage)
    rx = receiving(run[2], training, par, mine, run[1])
    fewer = _fewer_at_first_backward(training, run[0], par, run[1], mine, inflight, shared,
                                     lambda k: sum(p[1] for p in _activation_parts(sp, k, counts, shared)),
                                     static.loss_margin, rx)
    ahead, behind, settled = receive_buffers(rx, par, mine, inflight, interleaved_applies(training, par, mine))
    held = schedule_gradients(run[2], training, par, mine, run[1])  # Megatron's schedule's gradients
    ahead, behind = ahead + held.forward, behind + held.backward
    activations -= total_bytes(ahead)  # the forward total holds them (`_training_stages`)
    backward_ends = static.backward_end + total_bytes(settled) > \
        static.totals[1] + activations + sum(c.bytes for c in fewer) + total_bytes(behind)
    behind += tuple(c for c in fewer if c.key == "buffers")  # an interleaved rank's, at its replayed moment
    st = static.parts()
    parts = _activation_parts(sp, inflight, counts, shared)
    if training.offload_activations:  # the layers' parts are on the host (`_offloaded_activations`)
        parts = tuple(p if p[0].startswith("token ids") else
                      (p[0] + ", on the host", 0, f"0 on the GPU: {p[1] / 2**30:,.2f} GiB offloaded ({p[2]})")
                      for p in parts)
    layers = _activations_component(parts, training, par, shared.entries)
    saved = (layers,) + st.loss_saved
    backward = phase("backward", st.kept + settled + (st.grads_end or st.grads_full, _ACTIVATIONS_GONE),
                     st.folded["backward_end"]) \
        if backward_ends else phase("backward", st.kept + behind + (st.grads_backward, _less(layers, fewer))
                                    + st.loss_saved_backward, _less(st.folded["backward"], fewer))
    phases = (phase("forward", st.kept + ahead + (st.grads_forward,) + saved, st.folded["forward"]),
              backward,
              phase("optimizer", st.kept + settled + (st.grads_full, _NO_ACTIVATIONS), st.folded["optimizer"]))
    managed = (static.managed,) if static.managed else ()
    pools = _idle_pools(static, sp, training, par, stage.peak_phase, backward_ends)
    cached = ((shared.reserved_cached,) if shared.reserved_cached is not None else ()) + pools
    cache = stage.cache or fragmentation(allocated, shared.hardware, no_replay or "", cached)
    return phases, (static.communication, shared.runtime, *managed, cache)


def _idle_pools(static: _StaticStage, sp: StageParameters, training: Training, par: Parallel, peak_phase: str,
                backward_ends: bool) -> tuple[Component, ...]:
    """The side streams' pools reserved and unused at the peak (pp_buffers.py): at a forward or backward
    peak before the step's reduce-scatters; the backward's last moments and the optimizer step hold the
    sharded gradients in the reduce-scatter stream's pool (and count them as allocated)."""
    if peak_phase == "optimizer" or (peak_phase == "backward" and backward_ends):
        return ()
    gathered = all_gather_pool(training, par, sp, static.gathered[2], static.gathered[:2]) if static.gathered else None
    return tuple(p for p in (static.stream_pool, gathered) if p is not None)


def _cached_bytes(shared: _Shared) -> int:
    """A segment kept reserved beyond the fragmentation share (`_Shared.reserved_cached`), in bytes."""
    return shared.reserved_cached.bytes if shared.reserved_cached is not None else 0


def estimate_config(data: object):
    """Parse a contract config and estimate it: the CLI's and the app's one entry point."""
    cfg = load_config(data)
    return estimate(cfg.architecture, cfg.training, cfg.parallel, cfg.hardware)
