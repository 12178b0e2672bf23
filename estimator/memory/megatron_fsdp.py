"""Megatron-FSDP's Adam moments at the parameters' global shape (TransformerEngine 2.10 and 2.11).

Megatron-FSDP (``--use-megatron-fsdp``) hands the optimizer one DTensor per parameter, a shard of its
fp32 main-weight buffer whose global shape is the whole parameter, unsplit by DP and by TP
(Megatron-Core core_v0.16.1 megatron/core/distributed/fsdp/src/megatron_fsdp/param_and_grad_buffer.py
``_init_distributed_params`` and ``make_fsdp_dtensor``, lines 2488-2557 and 4008-4161: ``shape=param.shape``
of the TP DTensor, whose TP-split dimension is multiplied by TP; expert parameters by expert-TP, each
rank keeping its own experts). The optimizer is TransformerEngine's FusedAdam
(megatron/core/optimizer/__init__.py lines 12-16), and TransformerEngine v2.10 and v2.11 build each
moment with ``torch.empty(param.shape, ...)`` (transformer_engine/pytorch/optimizers/fused_adam.py
``_initialize_state``, line 378 at release_v2.11 c188b533; since commit c52576053 of 2025-11-14, replaced by
``torch.empty_like`` in fe8fad59c of 2026-01-13, first released in v2.12): for a DTensor that is a
plain tensor of the global shape, so both moments are held whole on every GPU while the main weights,
gradients and model weights stay sharded. Megatron-Core 0.16.1's ``dev`` extra pins
``transformer-engine>=2.9.0a0,<2.12.0`` (pyproject.toml line 71), and Megatron-LM's golden values for its
Megatron-FSDP cases were measured at main ad2ab2ca (2026-01-15) on TE release_v2.11 (pyproject.toml
line 181 there): after each step ``mem-allocated-bytes`` is the sharded buffers plus 8 B x the global
parameters, to within 6 MB (tests/data/measured/published/megatron_golden, the two ``tp2_zp_z3`` cases).
Megatron-Core 0.19.0 pins TE 2.17.1 (rev 4329ff84), whose FusedAdam builds the moments on the local
shard: sharded as ZeRO says. The rule is keyed on ``training.te_version`` (the TE release; by default
the one the Megatron-Core release installs, spec/versions.py MEGATRON_TE: 2.11 for 0.16, 2.17 for 0.19).
TE v2.9 (``torch.empty_like(param)``, fused_adam.py line 377) and v2.12 on (``torch.empty_like``,
line 381 at v2.12) build them like the parameter: the two releases holding commit c52576053 without
its fix fe8fad59c are v2.10 and v2.11 (``git tag --contains`` in the TransformerEngine repository).

Only the optimizer's moments are affected, and only ZeRO stage 3 of framework megatron, Megatron-FSDP's
``optim_grads_params`` (the importer's mapping), is held to it: the strategy the golden values measured.
``optim_grads`` (stage 2) hands FusedAdam the same DTensors but is left as ZeRO says until a measurement
shows it (the planner's Megatron layouts lean on it); ``optim`` and ``no_shard`` are stages 1 and 0, which a
configuration cannot tell from the distributed optimizer and DDP.
"""

from __future__ import annotations

from typing import NamedTuple

from ..spec.architecture import Architecture
from ..spec.parallel import Parallel
from ..spec.training import Recipe, Training
from ..spec.versions import te_version
from .components import once
from .sharding import Bucket, StageParameters, _first_root, _last_root, bucket, padded_vocab_size
from .states import ModelStates, optimizer_state_bytes

SOURCE = ("TransformerEngine v2.10-v2.11 transformer_engine/pytorch/optimizers/fused_adam.py _initialize_state "
          "(torch.empty(param.shape): a DTensor's global shape; commit c52576053, fixed in fe8fad59c, v2.12), "
          "the TE that Megatron-Core 0.16.1's pip extra installs (pyproject.toml dev extra, TE <2.12); "
          "Megatron-FSDP's optimizer "
          "parameters are DTensors of the whole parameter (core_v0.16.1 megatron_fsdp/param_and_grad_buffer.py "
          "make_fsdp_dtensor)")
TE_RELEASES = ("2.10", "2.11")  # the TransformerEngine releases whose FusedAdam builds the moments whole


class _Unsplit(NamedTuple):
    """The parallel sizes `sharding.bucket` reads, for a tensor at its DTensor global shape: no TP
    or expert-TP split; EP still decides which experts are the rank's own."""

    tp: int
    ep: int
    etp: int


def moments_at_global_shape(training: Training, zero: int) -> bool:
    """Whether Adam's moments are held whole: Megatron-FSDP's optim_grads_params (ZeRO 3 with framework
    megatron) with TransformerEngine v2.10-v2.11's FusedAdam."""
    if training.framework != "megatron" or zero != 3 or training.optimizer != "adamw":
        return False
    return te_version(training.framework, training.framework_version, training.te_version) in TE_RELEASES


def global_shape_bucket(arch: Architecture, par: Parallel, sp: StageParameters, framework: str) -> Bucket:
    """The stage's parameters at their DTensor global shape on one GPU: TP- and expert-TP-split tensors
    whole (the vocabulary padded for the real TP), the rank's own experts only."""
    unsplit = _Unsplit(1, par.ep, 1)
    vocab = padded_vocab_size(arch.vocab_size, par.tp, framework)
    total = Bucket()
    for kind, count in sp.kind_counts:
        layer = arch.cached(("global shape", kind, par.ep), lambda k=kind: bucket(arch.layer_tensors(k), unsplit))
        total = total.plus(layer.times(count))
    if sp.first:
        total = total.plus(_first_root(arch, unsplit, vocab))
    if sp.last:
        copy = arch.tie_embeddings and par.pp > 1 and not sp.first  # as sharding.stage_parameters
        total = total.plus(_last_root(arch, unsplit, vocab, copy))
    return total


def with_global_moments(ms: ModelStates, arch: Architecture, training: Training, recipe: Recipe, par: Parallel,
                        sp: StageParameters, zero: int) -> ModelStates:
    """`ms` with its optimizer states over the global shapes, unsharded, where the rule applies."""
    if not moments_at_global_shape(training, zero):
        return ms
    whole = global_shape_bucket(arch, par, sp, training.framework)
    dense = optimizer_state_bytes(whole, training.optimizer, recipe.optimizer_dtype, experts=False)
    expert = optimizer_state_bytes(whole, training.optimizer, recipe.optimizer_dtype, experts=True)
    count = f"{whole.dense:,.0f} params" if not whole.expert else \
        f"({whole.dense:,.0f} dense + {whole.expert:,.0f} expert params)"
    per_param = (dense + expert) / (whole.dense + whole.expert)
    text = (f"{per_param:.4g} B ({training.optimizer} states in {recipe.optimizer_dtype}) x {count} at their "
            "global shape, unsharded (TransformerEngine 2.10-2.11 FusedAdam over Megatron-FSDP's DTensors)")

    def formulas() -> dict[str, str]:
        return {**ms.formulas(), "optimizer_states": text}

    return ms._replace(optimizer_states=dense + expert, formulas=once(formulas), optimizer_source=SOURCE)


# Megatron-FSDP's all-gather prefetch: suggested_communication_unit_size is max(1e9, twice a unit's
# elements) ("Cap to 1B elements" takes the larger), and the prefetch half of it (core_v0.16.1
# megatron_fsdp/megatron_fsdp.py lines 374-399; the same at core_v0.19.0)
PREFETCH_ELEMENTS = 500_000_000
PREFETCH_SOURCE = ("Megatron-Core core_v0.16.1 megatron_fsdp/megatron_fsdp.py _pre_backward_param_unshard (line 808: "
                   "all_gather_and_wait_parameters_ready, prefetch=True) and suggested_AG_prefetch_size "
                   "(lines 374-399, 500M elements); param_and_grad_buffer.py AllGatherPipeline.all_gather_params "
                   "(lines 3493-3558: further units until the prefetched elements reach it); only FSDP units "
                   "are released after forward (_post_forward), so the root unit stays gathered")


def backward_gathered_elements(sp: StageParameters) -> tuple[float, int]:
    """(elements gathered when a TransformerLayer's backward starts, the layers among them): the unit
    and the next ones, in backward order, until the prefetched elements reach PREFETCH_ELEMENTS (or
    the stage runs out), beside the root unit (embedding, final norm, head) kept from forward."""
    layer = sp.largest_layer_local
    blocks = sp.local - sp.root_local
    if layer <= 0:
        return sp.root_local, 0
    units = min(sp.num_layers, 1 + -(-PREFETCH_ELEMENTS // int(layer)))
    return min(blocks, units * layer) + sp.root_local, units
