"""What the stages of one configuration share: the activation ledger per layer kind and its units,
the loss, the runtime and the communication buffers.
"""

from __future__ import annotations

from typing import NamedTuple

from .activations.entries import COMPILE_SOURCE, Entry, KORTHIKANTI, compiled
from .activations.attention import CP_FLEX_SOURCE, cp_flex_all_gather
from .activations.chunked_head import SOURCE as HEAD_SOURCE
from .activations.loss import LossMemory, deferred_wgrad_entries, loss_memory
from .activations.recompute import dropped, recomputed_layer_count, recomputed_modules
from .activations.layer import embedding_entries, layer_entries, layer_input_entry
from .activations.alibi import ALIBI_MASK, SOURCE as ALIBI_SOURCE
from .activations.sdpa_mask import FALCON_BIAS, MASKED_BIAS, SOURCE as MASKED_SDPA_SOURCE
from .activations.sdpa_math import MATH_SOURCE as MATH_SDPA_SOURCE, SOFTMAX as MATH_SOFTMAX
from .activations.vision import SOURCE as VISION_SOURCE, vision_activation
from .pipeline import in_flight_rule
from ..spec.architecture import Architecture
from .components import Component, component, entries_component, fragmentation_fraction
from ..spec.dtypes import bytes_per_element
from ..spec.hardware import Hardware
from ..spec.parallel import Parallel
from .resolved import training_with
from .sharding import StageParameters, chunk_kind_counts, stored_kind_counts
from .adapter_activations import bnb_held_entries, first_layer_input_frozen
from .tp_copies import plain_tp_reserved
from .kbit import ledger_training, math_attention
from ..spec.training import Training
from ..spec.nccl import (MECHANISM_RECORD, NCCL_KERNELS, RECORD as NCCL_RECORD, RUNTIME_CONNECT_RECORD, SMALL_PAGE,
                         SOURCE as NCCL_SOURCE, OneRankCommunicator, measured_without_cumem, nccl_release,
                         one_rank_communicator, one_rank_rule, uses_cumem)
from ..spec.versions import torch_release
from .nccl_groups import Communicator, megatron_communicators

MiB = 1024**2
GiB = 1024**3


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
    embedding: list[Entry]
    loss: LossMemory | None
    loss_components: tuple  # (saved, forward working copies, backward gradients) on the last stage
    communication: Component  # NCCL buffers: every stage
    moe_communication: Component  # ... and DeepEP's buffers, on stages with MoE layers, when chosen
    runtime: Component
    entries: dict[str, list[Entry]]
    recomputed: frozenset[str]
    parallel: Parallel  # a layout with this TP, SP and CP (the ledger's divisions; see `_stage_memo`)
    hardware: Hardware
    embedding_bytes: float  # first-stage inputs per micro-batch
    deferred_wgrad: list  # the last stage's pair per deferred micro-batch (--defer-embedding-wgrad-compute)
    vision: tuple[float, str]  # the vision tower's saved tensors per micro-batch on the first stage, and formula
    fragmentation: float  # share of the allocated peak
    # a segment kept reserved beyond that share: plain TP's reduce-scatter cat (tp_copies.py); None elsewhere
    reserved_cached: Component | None = None
    # (communication, moe_communication) of the first and last stages where they hold more: Megatron-Core's tied
    # embeddings' group under PP (megatron_world); None elsewhere
    edge_communication: tuple[Component, Component] | None = None

    def ledger(self) -> tuple[LedgerLine, ...]:
        par = self.parallel
        return tuple(LedgerLine(k, e.name, int(round(e.bytes(par))), e.shown_formula(par),
                                dropped(e, self.recomputed))
                     for k in sorted(self.entries) for e in self.entries[k])


def _shared(arch: Architecture, training: Training, par: Parallel, hardware: Hardware, zero: int,
            vocab: int) -> _Shared:
    communication, moe_communication = _communications(training, par, zero, arch, hardware, edge_stage=False)
    edge = None
    if training.framework == "megatron" and training.mode == "training" and arch.tie_embeddings and par.pp > 1:
        edge = _communications(training, par, zero, arch, hardware, edge_stage=True)
    # the ledger depends on the training setup and on TP, SP, CP and ETP only: every layout of a
    # search (and every rerun of the app) that shares them reads it from the architecture's memo; one
    # layer's saved tensors do not depend on how many layers full recompute checkpoints (the stages
    # count those, `activations.recompute.recomputed_layer_count`), so a search over them shares one ledger
    as_read = training_with(arch, training, recompute_layers=None, recompute_every=1)
    as_read = ledger_training(as_read)  # peft's prepare_model_for_kbit_training: activations in fp32 (kbit.py)
    key = ("ledger", as_read, par.tp, par.sequence_parallel, par.cp, par.etp, vocab)
    ledger = arch.cached(key, lambda: _ledger(arch, as_read, par, vocab))
    return _Shared(**ledger, communication=communication, moe_communication=moe_communication,
                   runtime=_runtime(arch, training, hardware), parallel=par, hardware=hardware,
                   fragmentation=fragmentation_fraction(hardware),
                   reserved_cached=plain_tp_reserved(arch, training, par), edge_communication=edge)


def _communications(training: Training, par: Parallel, zero: int, arch: Architecture, hardware: Hardware,
                    edge_stage: bool) -> tuple[Component, Component]:
    """(communication, moe_communication): a stage's without MoE layers and with them (_communication)."""
    communication = _communication(training, par, zero, arch, hardware, edge_stage=edge_stage)
    if not arch.num_moe_layers:
        return communication, communication
    return communication, _communication(training, par, zero, arch, hardware, moe_stage=True, edge_stage=edge_stage)


def stage_communication(shared, first: bool, last: bool, moe_stage: bool) -> Component:
    """A stage's communication component from `shared` (_Shared or static_stage.StepShared): the first and last
    stages' where they hold more (edge_communication), a stage with MoE layers the MoE one."""
    pair = shared.edge_communication if (first or last) and shared.edge_communication else \
        (shared.communication, shared.moe_communication)
    return pair[1] if moe_stage else pair[0]


def _ledger(arch: Architecture, training: Training, par: Parallel, vocab: int) -> dict:
    """The per-layer ledger and the loss, with their bytes on one GPU of this TP/SP/CP split."""
    entries = {k: layer_entries(arch, training, par, k) for k in arch.kinds}
    if first_layer_input_frozen(training):  # an adapter run's first layer keeps less (adapters.py)
        entries[_first_kind(arch)] = layer_entries(arch, training, par, arch.layer_kinds()[0], first=True)
    modules = recomputed_modules(training)
    full, per_layer = {}, {}
    for kind, es in entries.items():
        sizes = [(e.bytes(par), dropped(e, modules)) for e in es]
        full[kind] = sum(b for b, _ in sizes)
        per_layer[kind] = sum(b for b, dropped in sizes if not dropped)
    embedding = embedding_entries(arch, training, par)
    kept_input = layer_input_entry(arch, training, par)
    held = {kind: sum(e.bytes(par) for e in bnb_held_entries(es, training, arch, kind)) for kind, es in entries.items()}
    loss = loss_memory(arch, training, par, vocab) if training.mode == "training" else None
    return dict(per_layer=per_layer, full_layer=full, kept_input=kept_input.bytes(par),
                held_by_4bit={k: b for k, b in held.items() if b},
                kept_input_formula=kept_input.shown_formula(par), embedding=embedding, loss=loss,
                loss_components=_loss_components(loss, par), entries=entries, recomputed=modules,
                embedding_bytes=sum(e.bytes(par) for e in embedding),
                deferred_wgrad=deferred_wgrad_entries(arch, training, par, vocab),
                vision=vision_activation(arch, training))


def _loss_components(loss: LossMemory | None, par: Parallel) -> tuple[tuple[Component, ...], list, list]:
    """The last stage's loss: what it keeps for backward, its forward working copies and its
    gradients at backward's start."""
    if loss is None:
        return (), [], []
    saved = (entries_component("logits", "Final norm, LM head input and loss", loss.saved, par, 1, loss.source),)
    forward = [entries_component("transient", "Loss working copies", loss.forward, par, 1, loss.source)] \
        if loss.forward else []
    backward = [entries_component("transient", "Loss gradients", loss.backward, par, 1, loss.source)] \
        if loss.backward else []
    if loss.head_backward:  # torchtune's chunked head after the loss's backward: the larger of the two moments
        made, freed = loss.head_backward
        head = [entries_component("transient", "LM head's backward, chunk by chunk", made, par, 1, HEAD_SOURCE),
                entries_component("transient", "The loss's saved tensors, freed by its backward", freed, par, -1,
                                  HEAD_SOURCE)]
        if sum(c.bytes for c in head) > sum(c.bytes for c in backward):
            backward = head
    return saved, forward, backward


def _runtime(arch: Architecture, training: Training, hardware: Hardware) -> Component:
    """The CUDA context and the kernel modules loaded into it: the measured parts of the module loading mode
    (spec/cuda_modules.py) where the architecture has them, FlashAttention's only where it runs (not under the
    math backend a prepared k-bit run falls to: kbit.py); else the architecture's constant."""
    runtime = hardware.device.runtime
    label = "CUDA context and loaded kernels (outside the allocator)"
    if runtime.modules is None:
        return component("runtime", label, runtime.context_bytes, f"per-process constant for {runtime.architecture}",
                         runtime.context_source)
    mode = hardware.cuda_module_loading or runtime.modules.default
    loaded = runtime.modules.loaded(mode)
    parts = loaded.parts(flash=training.attention == "flash" and not math_attention(arch, training))
    formula = " + ".join(f"{b / MiB:.1f} MiB {what}" for what, b in parts) + f" (CUDA_MODULE_LOADING={mode.upper()})"
    return component("runtime", label, sum(b for _, b in parts), formula, loaded.source)


def _first_kind(arch: Architecture) -> str:
    return f"first {arch.layer_kinds()[0]}"


def _activation_counts(training: Training, stage: StageParameters, arch: Architecture) -> tuple[int, tuple, tuple]:
    """(layers recomputed, (kind, layers stored) pairs, (kind, layers recomputed) pairs) of a stage.
    Full recompute of n layers recomputes the first n of the stage (Megatron's "block" method) or
    every N-th (`recompute_every`) and keeps their inputs (`activations.recompute.recomputed_layer_count`). An
    adapter run's first layer, whose input needs no gradient, is a kind of its own."""
    recomputed = recomputed_layer_count(training, stage.num_layers)
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
    if stage.first and shared.vision[0]:  # the images' patches through the vision tower (activations/vision.py)
        parts.append(("vision tower", int(round(shared.vision[0] * max(1.0, inflight))),
                      f"{shared.vision[1]} per micro-batch in flight"))
    if stage.first and shared.embedding:
        names = {e.name for e in shared.embedding}
        parts.append(("token ids" + (" and embedding dropout mask" if "embedding dropout mask" in names else "")
                      + (" and ALiBi mask" if ALIBI_MASK in names else ""),
                      int(round(shared.embedding_bytes * max(1.0, inflight))),
                      " + ".join(e.shown_formula(shared.parallel) for e in shared.embedding)
                      + " per micro-batch in flight"))
    return tuple(parts)


def _activations_component(parts: tuple[tuple[str, int, str], ...], training: Training,
                           par: Parallel | None = None, entries: dict | None = None) -> Component:
    """The activations component of a stage; `entries`: the per-layer ledger by kind, whose kernels' sources
    the component names where they are not every model's (transformers' masked SDPA path)."""
    formula = " + ".join(f for _, _, f in parts)
    if training.recompute == "selective":
        formula += f" (recomputed: {', '.join(training.recompute_modules)})"
    rule, rule_source = in_flight_rule(par, training.microbatch_group_size) if par else ("", "")
    source = KORTHIKANTI + (f"; {rule_source}" if rule_source else "")
    if any(label == "vision tower" for label, _, _ in parts):
        source += f"; vision tower: {VISION_SOURCE}"
    if any(e.name in (MASKED_BIAS, FALCON_BIAS) for es in (entries or {}).values() for e in es):
        source += f"; masked SDPA: {MASKED_SDPA_SOURCE}"
    if any(e.name == MATH_SOFTMAX for es in (entries or {}).values() for e in es):
        source += f"; SDPA's math backend: {MATH_SDPA_SOURCE}"
    if any(label.endswith("ALiBi mask") for label, _, _ in parts):
        source += f"; ALiBi mask: {ALIBI_SOURCE}"
    if compiled(training):  # the layers' saved set is Inductor's partitioner's (activations.COMPILE_SOURCE)
        formula += " (torch.compile: each layer keeps what Inductor's min-cut partitioner saves)"
        source += f"; {COMPILE_SOURCE}"
    if cp_flex_all_gather(training, par):  # the attention's keys and values span the whole sequence
        source += f"; {CP_FLEX_SOURCE}"
    pieces = tuple(Component("activations", label, b, f, source) for label, b, f in parts)
    return Component("activations", "Activations", sum(p.bytes for p in pieces), formula + rule, source, pieces)


# The process groups that get an NCCL communicator in a world of one rank: torch's ProcessGroupNCCL makes one for a
# group at its first collective, or at its creation where the group is bound to a device (torch distributed_c10d
# init_process_group(device_id=...); new_group then splits from the bound default group: _new_group_with_tag,
# eager_connect_single_device). Each: (group, what makes its communicator, source). Megatron-Core's are its step's
# communicators at world size 1 with the distributed optimizer (nccl_groups.megatron_communicators, which lists them
# for every layout).
ONE_RANK_GROUPS = {
    "deepspeed": (
        ("world", "deepspeed.init_distributed passes device_id: made at initialisation",
         "DeepSpeed 0.19.5 comm/torch.py init_process_group l. 172-177"),
        ("data parallel (the world's clone)", "dist.new_group of every rank, made at creation (bound default group)",
         "DeepSpeed 0.19.5 utils/groups.py _clone_world_group l. 668, runtime/engine.py l. 1796"),
    ),
    "megatron": tuple((c.group, c.why, c.source) for c in megatron_communicators(Parallel(), True)),
}


def one_rank_communicators(training: Training, groups: tuple[tuple[str, str], ...]) \
        -> tuple[tuple[Component, ...], OneRankCommunicator, str]:
    """The communicators of one rank of `groups` ((what, source) each), one component apiece (spec/nccl.py), and,
    where the run's NCCL allocates without cuMem, the driver's page of the process's small cudaMallocs: one a
    process, however many communicators share it (the nccl-mechanism record, NCCL_CUMEM_ENABLE=0: init_distributed
    adds 85 + 256 + 1 granules, the first communicator's 194 small allocations opening the page; the world's split
    adds its buffer's 256 and no page, its 194 small allocations beside the first's). Returns the components, the
    communicator and the page's words for a formula ("" with cuMem)."""
    release = torch_release(training.torch_version)
    comm = one_rank_communicator(release, training.nccl_cumem)
    measured = ""  # NCCL 2.28.9 with NCCL_CUMEM_ENABLE=0: the shared buffer as the nccl-mechanism record logs it
    if measured_without_cumem(release) and not uses_cumem(release, training.nccl_cumem):
        measured = f"; measured: {MECHANISM_RECORD} (NCCL_CUMEM_ENABLE=0: 536,870,912 B a communicator)"
    elif uses_cumem(release, training.nccl_cumem) and not one_rank_rule(nccl_release(release)).runtime_connect:
        measured = (f"; the mechanism measured: {RUNTIME_CONNECT_RECORD} (NCCL 2.28.9, NCCL_RUNTIME_CONNECT=0: its "
                    f"512 MiB buffer through cuMem beside the 194 granules)")
    parts = tuple(component("communication", f"NCCL communicator of one rank: {what}", comm.bytes, comm.formula,
                            f"{source}; {NCCL_SOURCE}{measured}") for what, source in groups)
    page = ""
    if not uses_cumem(release, training.nccl_cumem):
        parts += (component("communication", "the driver's page of the communicators' small cudaMallocs", SMALL_PAGE,
                            "one 2 MiB page (the driver packs small cudaMallocs)",
                            f"measured: {MECHANISM_RECORD} (NCCL_CUMEM_ENABLE=0: 2 communicators' 390 in one page)"),)
        page = f" + their small allocations' page {SMALL_PAGE // 2**20} MiB"
    return parts, comm, page


def _kernels() -> Component:
    """NCCL's kernels, loaded once a process with its first communicator (spec/nccl.py NCCL_KERNELS)."""
    return component("communication", "NCCL's kernels (loaded with the first communicator)", NCCL_KERNELS,
                     f"{NCCL_KERNELS // 2**20} MiB measured", f"measured: {NCCL_RECORD} (NCCL 2.28.9, H200)")


def one_rank_world(training: Training, communicators: tuple[Communicator, ...] | None = None) -> Component:
    """A framework that initialises torch.distributed over NCCL on one GPU (DeepSpeed, Megatron-Core) holds, outside
    the caching allocator, NCCL's kernels (once) and a communicator of one rank for every process group that gets one
    (ONE_RANK_GROUPS; Megatron-Core's step: `communicators`, nccl_groups.megatron_communicators), each the
    device allocations of its channels, 2 MiB apiece where the run's NCCL allocates with cuMem, by the NCCL release
    the torch release ships (spec/nccl.py one_rank_rule: 2 + 3 x 64 with NCCL 2.28.9). On the H200 (torch
    2.11, NCCL 2.28.9): DeepSpeed 85 + 2 x 194 = 473 granules (946 MiB), Megatron-Core 85 + 4 x 194 = 861 (1,722
    MiB). Without cuMem (torch before 2.2, or training.nccl_cumem false: NCCL_CUMEM_ENABLE=0, as slime's and verl's
    training processes set it) each communicator is the net proxy's shared buffer and its small allocations share
    the process's one page (one_rank_communicators)."""
    groups = (ONE_RANK_GROUPS[training.framework] if communicators is None
              else tuple((c.group, c.why, c.source) for c in communicators))
    comms, comm, page = one_rank_communicators(training, tuple((f"{group} group ({why})", source)
                                                                for group, why, source in groups))
    parts = (_kernels(),) + comms
    total = sum(p.bytes for p in parts)
    formula = (f"NCCL kernels {NCCL_KERNELS // 2**20} MiB + {len(groups)} communicators x "
               f"{comm.bytes / 2**20:,.1f} MiB ({comm.formula}){page} = {total / 2**20:,.1f} MiB")
    return Component("communication", f"NCCL world of one rank ({training.framework})", total, formula,
                     NCCL_SOURCE, parts)


FUJII = "Fujii et al. 2024 estimator (0.5 GB per communicator); NCCL issues #864, #986"
MULTI_RANK = 0.5 * GiB  # a communicator of several ranks, its topology unknown (FUJII)


def megatron_world(training: Training, par: Parallel, zero: int, arch: Architecture | None,
                   moe_stage: bool = False, edge_stage: bool = True) -> Component:
    """Megatron-Core's communicators on one rank of this layout (nccl_groups.megatron_communicators; the MoE ones on
    stages with MoE layers, the tied embeddings' group on `edge_stage`, the first or last): each of several ranks
    0.5 GiB (FUJII: a figure per communicator that names no kernels, so NCCL's are charged beside it), each of one
    rank the measured one-rank communicator (a communicator of one rank sees its own GPU only, NCCL topo.cc
    ncclTopoGetSystem, so it sets up the channels of world size 1: spec/nccl.py), and NCCL's kernels once. World
    size 1: one_rank_world."""
    tied = bool(arch and arch.tie_embeddings) and edge_stage
    comms = megatron_communicators(par, zero >= 1, moe_stage, tied, training.moe_dispatcher)
    if par.gpus == 1:
        return one_rank_world(training, comms)
    multi = [c for c in comms if c.ranks > 1]
    single = [c for c in comms if c.ranks == 1]
    parts = [_kernels()]
    # the labels name no rank counts: the memo of stage parts shares this component across pipeline depths
    # (memory._pipeline_key), which change the world's size but not the bytes
    parts += [component("communication", f"NCCL communicator of several ranks: {c.group} group ({c.why})",
                        MULTI_RANK, "0.5 GiB a communicator of several ranks", f"{c.source}; {FUJII}")
              for c in multi]
    formula = (f"NCCL kernels {NCCL_KERNELS // 2**20} MiB + 0.5 GiB x {len(multi)} communicators "
               f"({', '.join(c.group for c in multi)})")
    if single:
        ones, comm, page = one_rank_communicators(training, tuple((f"{c.group} group of size 1 ({c.why})", c.source)
                                                                  for c in single))
        parts += ones
        formula += (f" + {len(single)} of one rank x {comm.bytes / 2**20:,.1f} MiB "
                    f"({', '.join(c.group for c in single)}){page}")
    total = sum(p.bytes for p in parts)
    return Component("communication", "NCCL communicator buffers", total,
                     formula + f" = {total / 2**20:,.1f} MiB", f"{FUJII}; {NCCL_SOURCE}", tuple(parts))


def _communication(training: Training, par: Parallel, zero: int, arch: Architecture | None = None,
                   hardware: Hardware | None = None, moe_stage: bool = False, edge_stage: bool = True) -> Component:
    """NCCL keeps buffers per communicator it uses, outside PyTorch's allocator. A Megatron-Core training step: its
    communicators by layout (megatron_world). Else 0.5 GiB for each process group of size > 1 (Fujii et al.'s
    estimator; NCCL issues #864/#986: memory grows with communicators and channels), and at world size 1 DeepSpeed's
    world of one rank (one_rank_world). On `moe_stage` with ``moe_dispatcher = "deepep"`` the MoE stages also hold
    DeepEP's fixed NVLink/RDMA buffers and workspace (cudaMalloc/NVSHMEM, sized in deepep.py)."""
    if training.framework == "megatron" and training.mode == "training":
        nccl = megatron_world(training, par, zero, arch, moe_stage, edge_stage)
    else:
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
        # a training step's world of one rank (one_rank_world); the groups' collectives are the step's
        if training.framework in ONE_RANK_GROUPS and training.mode == "training" and not groups:
            return one_rank_world(training)
        nccl = component("communication", "NCCL communicator buffers", MULTI_RANK * len(groups),
                         f"0.5 GiB x {len(groups)} communicators ({', '.join(groups) or 'none'})", FUJII)
    if not moe_stage:
        return nccl
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
    formula = (f"{nccl.formula} + DeepEP NVL buffer {buf.nvl_allocation / GiB:.3f} GiB + RDMA buffer "
               f"{buf.num_rdma_bytes / GiB:.3f} GiB + workspace {buf.workspace / GiB:.3f} GiB")
    return Component("communication", "NCCL communicator buffers and DeepEP buffers", sum(p.bytes for p in parts),
                     formula, nccl.source + "; " + src, tuple(parts))
