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
pipeline's steady state; otherwise (``zero_grad(set_to_none=True)``, PyTorch's default) they
appear during backward, first for the head.

Outside PyTorch's allocator the device also holds the CUDA context, NCCL's buffers and the
allocator's fragmentation; they make ``device_total_bytes``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from . import activations as act
from .architecture import Architecture, parameter_counts
from .dtypes import bytes_per_element
from .hardware import GPU, GPUS, Hardware
from .parallel import Parallel
from .sharding import StageParameters, local_numel, padded_vocab_size, stage_parameters
from .states import OPTIMIZER_SOURCES, ZERO_SOURCE, model_states
from .training import Recipe, Training, resolve_recipe

GiB = 1024**3
TIGHT_FRACTION = 0.8  # Fujii et al. 2024 (arXiv 2411.06465): no OOM below 80% in 454 runs

# Components that are not tensors in PyTorch's allocator
NON_ALLOCATOR = ("communication", "runtime", "fragmentation")


@dataclass(frozen=True)
class Component:
    """One slice of a stage's memory: its bytes, the formula that gave them and its source."""

    key: str
    label: str
    bytes: int
    formula: str
    source: str
    parts: tuple["Component", ...] = ()

    @property
    def allocator(self) -> bool:
        return self.key not in NON_ALLOCATOR


@dataclass(frozen=True)
class Phase:
    name: str  # "forward", "backward", "optimizer"
    allocated_bytes: int
    components: tuple[Component, ...]


@dataclass(frozen=True)
class StageEstimate:
    stage: int
    layers: int
    parameters_per_gpu: int  # this stage's parameters on one GPU before ZeRO sharding
    in_flight_microbatches: float
    phases: tuple[Phase, ...]
    peak_phase: str
    components: tuple[Component, ...]  # at the peak, non-allocator components included
    allocated_peak_bytes: int
    device_total_bytes: int

    def component(self, key: str) -> Component | None:
        return next((c for c in self.components if c.key == key), None)


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
    architecture: Architecture
    training: Training
    parallel: Parallel
    hardware: Hardware
    recipe: Recipe
    zero_stage: int
    microbatches: int
    parameters_total: int
    parameters_active: int
    stages: tuple[StageEstimate, ...]
    peak_stage: int
    allocated_peak_bytes: int
    device_total_bytes: int
    fit: Fit
    notes: tuple[str, ...] = field(default_factory=tuple)

    def fits(self) -> list[Fit]:
        """The verdict on every GPU of the catalog (the estimate does not depend on the GPU, but
        for its CUDA context, which is the same for all catalogued GPUs)."""
        return [fit_on(self.device_total_bytes, gpu) for gpu in GPUS.values()]

    def to_json(self) -> dict:
        return {
            "parameters": {"total": self.parameters_total, "active": self.parameters_active},
            "stages": [
                {
                    "stage": s.stage,
                    "layers": s.layers,
                    "components": {c.key: c.bytes for c in s.components},
                    "allocated_peak_bytes": s.allocated_peak_bytes,
                    "device_total_bytes": s.device_total_bytes,
                    "peak_phase": s.peak_phase,
                    "parameters_per_gpu": s.parameters_per_gpu,
                    "in_flight_microbatches": s.in_flight_microbatches,
                    "phases": {p.name: p.allocated_bytes for p in s.phases},
                    "formulas": {c.key: c.formula for c in s.components},
                    "sources": {c.key: c.source for c in s.components},
                }
                for s in self.stages
            ],
            "peak_stage": self.peak_stage,
            "allocated_peak_bytes": self.allocated_peak_bytes,
            "device_total_bytes": self.device_total_bytes,
            "fit": {"gpu": self.fit.gpu, "capacity_bytes": self.fit.capacity_bytes,
                    "utilization": round(self.fit.utilization, 6), "verdict": self.fit.verdict},
            "zero_stage": self.zero_stage,
            "microbatches": self.microbatches,
            "notes": list(self.notes),
        }


# --- pieces of a stage ----------------------------------------------------------------------------

def _component(key: str, label: str, value: float, formula: str, source: str,
               parts: tuple[Component, ...] = ()) -> Component:
    return Component(key, label, int(round(value)), formula, source, parts)


def _entries_component(key: str, label: str, entries: list[act.Entry], par: Parallel, times: float,
                       source: str) -> Component:
    parts = tuple(_component(key, e.name, e.bytes(par) * times, e.formula, source) for e in entries)
    formula = " + ".join(e.formula for e in entries) if entries else "0"
    if times != 1:
        formula = f"({formula}) x {times:g}"
    return Component(key, label, sum(p.bytes for p in parts), formula, source, parts)


def _stage_activations(arch: Architecture, training: Training, par: Parallel, stage: StageParameters,
                       inflight: float) -> tuple[Component, float]:
    """Saved activations of the stage's layers for every micro-batch in flight, and the working
    set of one recomputed layer (full recompute re-runs one layer's forward at a time in
    backward, Korthikanti section 5)."""
    kinds = arch.layer_kinds()
    layers = [kinds[i] for i in stage.layer_indices]
    full = {k: act.layer_bytes(arch, training, par, k) for k in set(layers)}
    kept_input = act.layer_input_bytes(arch, training, par)
    mode = training.recompute
    if mode == "full":
        n = len(layers) if training.recompute_layers is None else min(training.recompute_layers, len(layers))
        per_stack = sum(kept_input if i < n else full[k] for i, k in enumerate(layers))
        formula = f"{n} recomputed layers x 2*s*b*h(/t with SP) + {len(layers) - n} layers x full ledger"
        working = max(full.values(), default=0.0) if n else 0.0
    elif mode == "selective":
        per_stack = sum(act.layer_bytes(arch, training, par, k, selective=True) for k in layers)
        formula = "layers x ledger without the core-attention tensors (selective recompute)"
        working = 0.0
    else:
        per_stack = sum(full[k] for k in layers)
        formula = "layers x per-layer ledger"
        working = 0.0
    n_kept_input = (len(layers) if training.recompute_layers is None else min(training.recompute_layers, len(layers))) \
        if mode == "full" else 0
    parts = []
    if n_kept_input:
        parts.append(_component("activations", f"layer inputs kept by full recompute ({n_kept_input} layers)",
                                kept_input * n_kept_input * inflight, "B*s*b*h(/t with SP) x layers x in flight",
                                act.KORTHIKANTI))
    for kind in sorted(set(layers)):
        count = sum(1 for i, k in enumerate(layers) if k == kind and i >= n_kept_input)
        if not count:
            continue
        entries = [e for e in act.layer_entries(arch, training, par, kind)
                   if not (mode == "selective" and e.core_attention)]
        parts.append(_entries_component("activations", f"{count} {kind} layers x {inflight:g} micro-batches",
                                        entries, par, count * inflight, act.KORTHIKANTI))
    total = per_stack * inflight
    formula = f"({formula}) x {inflight:g} micro-batches in flight"
    if stage.stage == 0:
        emb = act.embedding_entries(arch, training, par)
        emb_bytes = sum(e.bytes(par) for e in emb) * max(1.0, inflight)
        total += emb_bytes
        parts.append(_entries_component("activations", "embedding inputs", emb, par, max(1.0, inflight),
                                        act.KORTHIKANTI))
        formula += " + token ids (8*s*b per micro-batch)"
    total = sum(p.bytes for p in parts)
    return Component("activations", "Activations", int(round(total)), formula, act.KORTHIKANTI, tuple(parts)), working


@dataclass(frozen=True)
class _Transients:
    forward: list[Component]
    backward: list[Component]
    optimizer: list[Component]
    persistent: list[Component]  # allocated once and kept (DDP buckets)


def _transients(arch: Architecture, training: Training, recipe: Recipe, par: Parallel, stage: StageParameters,
                zero: int, working_layer: float) -> _Transients:
    fw, P = training.framework, bytes_per_element(recipe.param_dtype)
    G = bytes_per_element(recipe.grad_dtype)
    fwd: list[Component] = []
    bwd: list[Component] = []
    opt: list[Component] = []
    persistent: list[Component] = []
    layer = stage.largest_layer_local
    d_dense = par.dp * par.cp
    if fw in ("fsdp2", "megatron") and zero >= 2 and d_dense > 1:
        src = "PyTorch FSDP2 fully_shard docs (all-gather prefetch, reduce-scatter); torchtitan; Megatron-FSDP"
        if zero == 3:
            gathered = P * (2 * layer + stage.root_local)
            formula = f"{P:g} B x (2 layers in flight + embedding/head root unit) unsharded"
        else:  # reshard_after_forward=False: every unit stays gathered from forward to backward
            gathered = P * stage.dense_local
            formula = f"{P:g} B x all of the stage's parameters, gathered after forward"
        fwd.append(_component("transient", "Unsharded parameters in flight", gathered, formula, src))
        bwd.append(_component("transient", "Unsharded parameters in flight", gathered, formula, src))
        bwd.append(_component("transient", "Unsharded gradients of one unit (and the reduce-scatter input)",
                              layer * (P + G), f"({P:g} + {G:g}) B x one layer's parameters", src))
    if fw == "deepspeed":
        src = "DeepSpeed ZeRO config docs: reduce_bucket_size 5e8, stage3_prefetch_bucket_size 5e7, sub_group_size 1e9"
        bucket = min(5e8, stage.local) * G
        for phase in (bwd,):
            phase.append(_component("transient", "Gradient reduction bucket", bucket,
                                    f"min(5e8, params) x {G:g} B", src))
        if zero == 3:
            live = P * (layer + min(5e7, stage.local))
            fwd.append(_component("transient", "Gathered parameters (current layer + prefetch bucket)", live,
                                  f"{P:g} B x (one layer + 5e7 prefetch)", src))
            bwd.append(_component("transient", "Gathered parameters (current layer + prefetch bucket)", live,
                                  f"{P:g} B x (one layer + 5e7 prefetch)", src))
        if zero >= 1 and recipe.master_weights:
            shard = stage.local / (d_dense if zero >= 1 else 1)
            sub_group = min(1e9, shard) if zero == 3 else shard
            opt.append(_component("transient", "fp32 copy of the gradient partition for the step", 4 * sub_group,
                                  "4 B x gradient partition (sub-group under ZeRO-3)", src))
    if fw == "hf" and d_dense > 1:
        persistent.append(_component(
            "buckets", "DDP gradient buckets", stage.local * G, f"{G:g} B x params (gradient_as_bucket_view=False)",
            "PyTorch DistributedDataParallel docs: gradient_as_bucket_view saves memory equal to the gradients"))
    if recipe.autocast_weight_copies:
        matrices = sum(local_numel(t, par) for t in stage.tensors if t.role in ("hidden_matrix", "embedding", "head")
                       and t.name != "embedding")
        cb = bytes_per_element(recipe.compute_dtype)
        src = "PyTorch autocast: casts of leaf weights are cached until the autocast region exits and kept for backward"
        fwd.append(_component("transient", "Autocast copies of the weights", matrices * cb,
                              f"{cb:g} B x matrix parameters", src))
        in_bwd = matrices * cb if training.recompute != "full" else layer * cb
        bwd.append(_component("transient", "Autocast copies of the weights", in_bwd,
                              f"{cb:g} B x matrix parameters" if training.recompute != "full" else
                              f"{cb:g} B x one recomputed layer", src))
    if working_layer:
        bwd.append(_component("transient", "One recomputed layer's activations", working_layer,
                              "per-layer ledger of one layer", act.KORTHIKANTI))
    # Optimizer-step temporaries. torch's foreach AdamW (the default on CUDA) materialises
    # sqrt(v) for a whole parameter group at once (torch/optim/adam.py _multi_tensor_adam);
    # fused kernels (Megatron/TE FusedAdam, DeepSpeed FusedAdam, bitsandbytes) work in place.
    states_dtype = bytes_per_element(recipe.optimizer_dtype)
    shard = stage.local / (d_dense if zero >= 1 and d_dense > 1 else 1)
    if fw in ("hf", "fsdp2") and training.optimizer == "adamw":
        opt.append(_component("transient", "foreach AdamW temporary (sqrt of the second moment)", shard * states_dtype,
                              f"{states_dtype:g} B x parameters on this GPU",
                              "torch.optim.AdamW foreach implementation (_multi_tensor_adam)"))
    elif training.optimizer in ("adafactor", "lion", "muon"):
        largest = max((local_numel(t, par) / t.copies for t in stage.tensors), default=0.0)
        opt.append(_component("transient", "per-tensor update temporaries (two of the largest tensor, fp32)",
                              2 * 4 * largest, "2 x 4 B x largest tensor", OPTIMIZER_SOURCES[training.optimizer]))
    return _Transients(fwd, bwd, opt, persistent)


def _communication(training: Training, par: Parallel, zero: int) -> Component:
    """NCCL keeps buffers per communicator it uses, outside PyTorch's allocator: 0.5 GiB for each
    process group of size > 1 (Fujii et al.'s estimator; NCCL issues #864/#986: memory grows
    with communicators and channels)."""
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
    return _component("communication", "NCCL communicator buffers", per_group * len(groups), formula,
                      "Fujii et al. 2024 estimator (0.5 GB per communicator); NCCL issues #864, #986")


def _fragmentation(allocated: int, hardware: Hardware) -> Component:
    fraction = 0.05 if hardware.expandable_segments else 0.10
    return _component(
        "fragmentation", "Allocator fragmentation and cache", allocated * fraction,
        f"{fraction:.0%} of the allocated peak ({'expandable_segments' if hardware.expandable_segments else 'default segments'})",
        "reserved minus allocated at peak: 2-10% observed (compressed-tensors PR #587, torchtune #1185, AWS "
        "auto-configurator bands x1.10-1.25); expandable_segments halves it")


# --- the estimate -----------------------------------------------------------------------------------

def estimate(arch: Architecture, training: Training | None = None, par: Parallel | None = None,
             hardware: Hardware | None = None) -> Estimate:
    from .validation import validate

    training = training or Training()
    par = par or Parallel()
    hardware = hardware or Hardware()
    zero = validate(arch, training, par)
    recipe = resolve_recipe(training)
    counts = parameter_counts(arch)
    gpu = hardware.device
    m = act.microbatches(training, par)
    vocab = padded_vocab_size(arch.vocab_size, par.tp, training.framework)
    stages_params = stage_parameters(arch, par, training.framework)
    stages = []
    for sp in stages_params:
        if training.mode == "inference":
            from .inference import inference_stage
            stages.append(inference_stage(arch, training, par, hardware, sp, vocab))
        else:
            stages.append(_training_stage(arch, training, recipe, par, hardware, sp, zero, m, vocab))
    peak = max(stages, key=lambda s: s.device_total_bytes)
    return Estimate(
        architecture=arch, training=training, parallel=par, hardware=hardware, recipe=recipe, zero_stage=zero,
        microbatches=m, parameters_total=counts.total, parameters_active=counts.active, stages=tuple(stages),
        peak_stage=peak.stage, allocated_peak_bytes=peak.allocated_peak_bytes,
        device_total_bytes=peak.device_total_bytes, fit=fit_on(peak.device_total_bytes, gpu))


def _training_stage(arch: Architecture, training: Training, recipe: Recipe, par: Parallel, hardware: Hardware,
                    sp: StageParameters, zero: int, m: int, vocab: int) -> StageEstimate:
    ms = model_states(sp, training, recipe, par)
    inflight = act.in_flight_chunks(sp.stage, par, m)
    activations, working = _stage_activations(arch, training, par, sp, inflight)
    last = sp.stage == par.pp - 1
    loss_saved: Component | None = None
    loss_transient: list[Component] = []
    if last:
        loss = act.loss_memory(arch, training, par, vocab)
        loss_saved = _entries_component("logits", "Final norm, LM head input and loss", loss.saved, par, 1, loss.source)
        if loss.transient:
            t = _entries_component("transient", "Loss working copies", loss.transient, par, 1, loss.source)
            loss_transient = [t]
    tr = _transients(arch, training, recipe, par, sp, zero, working)
    zero_src = ZERO_SOURCE
    params = _component("parameters", "Parameters", ms.parameters, ms.formulas["parameters"], zero_src)
    master = _component("master_weights", "Master weights (fp32)", ms.master_weights, ms.formulas["master_weights"],
                        zero_src)
    optim = _component("optimizer_states", "Optimizer states", ms.optimizer_states, ms.formulas["optimizer_states"],
                       OPTIMIZER_SOURCES[training.optimizer])
    grads_full = _component("gradients", "Gradients", ms.gradients, ms.formulas["gradients"], zero_src)
    persistent_grads = training.framework == "megatron" or m > 1 or par.pp > 1
    if persistent_grads:
        grads_fwd = grads_bwd = grads_full
    else:
        grads_fwd = _component("gradients", "Gradients", 0, "none yet: set to None after the last step",
                               "torch.optim.Optimizer.zero_grad(set_to_none=True)")
        first_unit = sp.root_local if last and not arch.tie_embeddings else sp.largest_layer_local
        share = min(1.0, first_unit / sp.local) if sp.local else 0.0
        grads_bwd = _component("gradients", "Gradients", ms.gradients * share,
                               "gradients of the first unit reached in backward (head or last layer)",
                               "autograd produces gradients as backward reaches each parameter")
    base = [params, master, optim]
    saved = [activations] + ([loss_saved] if loss_saved else [])
    phases = (
        _phase("forward", base + [grads_fwd] + saved + tr.persistent, loss_transient + tr.forward),
        _phase("backward", base + [grads_bwd] + saved + tr.persistent, loss_transient + tr.backward),
        _phase("optimizer", base + [grads_full, _component("activations", "Activations", 0,
                                                            "none: freed by the end of backward", act.KORTHIKANTI)]
               + tr.persistent, tr.optimizer),
    )
    peak = max(phases, key=lambda p: p.allocated_bytes)
    comm = _communication(training, par, zero)
    runtime = _component("runtime", "CUDA context and library workspaces", hardware.device.cuda_context_bytes,
                         "per-process constant of the GPU catalog", hardware.device.source)
    frag = _fragmentation(peak.allocated_bytes, hardware)
    components = peak.components + (comm, runtime, frag)
    return StageEstimate(
        stage=sp.stage, layers=len(sp.layer_indices), parameters_per_gpu=int(round(sp.local)),
        in_flight_microbatches=inflight, phases=phases, peak_phase=peak.name, components=components,
        allocated_peak_bytes=peak.allocated_bytes,
        device_total_bytes=peak.allocated_bytes + comm.bytes + runtime.bytes + frag.bytes)


def _phase(name: str, kept: list[Component], transients: list[Component]) -> Phase:
    """Components of one phase; transients of the phase fold into one ``transient`` component."""
    out = [c for c in kept if c.bytes or c.key in ("parameters", "gradients", "optimizer_states", "activations")]
    if transients:
        parts = tuple(p for t in transients for p in (t.parts or (t,)))
        total = sum(p.bytes for p in parts)
        formula = " + ".join(t.label for t in transients)
        out.append(Component("transient", "Transient buffers", total, formula, "see each part", parts))
    else:
        out.append(Component("transient", "Transient buffers", 0, "none in this phase", ""))
    return Phase(name, sum(c.bytes for c in out), tuple(out))
