"""PyTorch FSDP1 (`torch.distributed.fsdp.FullyShardedDataParallel`): what the HF Trainer with Accelerate
and Lightning Fabric run (`training.framework` "fsdp1").

As the HF Trainer wraps it (accelerate 1.15 `FullyShardedDataParallelPlugin`): a unit per decoder layer
(TRANSFORMER_BASED_WRAP) and the root unit with the rest (embedding, final norm, LM head); FULL_SHARD;
`MixedPrecision(param_dtype=bf16, reduce_dtype=bf16, buffer_dtype=bf16)` over fp32 weights;
`use_orig_params=True`; `limit_all_gathers=True`; `backward_prefetch=BACKWARD_PRE`; no forward
prefetch. torch 2.13 `fsdp/_flat_param.py` and `fsdp/_runtime_utils.py`:

- each unit's parameters are one FlatParameter, flattened and padded to a multiple of the world size;
  each rank keeps its fp32 shard (the master copy), its fp32 sharded gradient after the reduce-scatter
  (`_accumulate_sharded_grad` casts the reduced gradient to the FlatParameter's dtype) and the
  optimizer's states of its shard (`states.model_states`, as FSDP2);
- a unit runs on its unsharded bf16 FlatParameter (`_full_param_padded`), all-gathered before its
  forward and backward and freed after them (FULL_SHARD), but the root's, which is not freed after
  the forward (`_post_forward_reshard`: "do not free the root's parameters in the post-forward") and
  so stays gathered from the first forward to the end of the backward;
- the backward prefetches the next unit (BACKWARD_PRE): the loss's backward starts with the last
  layer gathered beside the root;
- a unit's backward makes its unsharded gradient in the param dtype (bf16), reduce-scatters it
  (`_reduce_grad`), and frees it;
- under `no_sync()` (gradient accumulation: Accelerate's `accumulate` runs every micro-batch but
  the last in it) `_post_backward_hook` returns before the reduce-scatter: each unit keeps its
  unsharded bf16 gradient, and the next micro-batch's backward accumulates into it, so the last
  micro-batch runs with the whole model's unsharded gradients alive (P x parameters), and no
  sharded gradient exists before its backward;
- with `use_orig_params` a unit's FlatParameter may hold frozen and trainable weights together (a
  LoRA run's decoder layers): the FlatParameter requires grad, so the original weights, views of it,
  do too: autograd computes and keeps what every weight of the unit needs (the frozen linears'
  inputs), and the unit's gradients, unsharded and sharded, are full-size.

The other sharding strategies (Accelerate's `fsdp_sharding_strategy`, `parallel.fsdp_sharding_strategy`):
- SHARD_GRAD_OP: the same shards, but a unit is not resharded after its forward
  (NO_RESHARD_AFTER_FORWARD_HANDLE_STRATEGIES), so every unit stays gathered from its forward to the
  reshard after its backward (under no_sync, `_should_free_in_backward` keeps them through accumulation too);
- HYBRID_SHARD: FULL_SHARD within a shard group (a node's GPUs: `_init_intra_and_inter_node_groups`),
  its sharded gradients all-reduced across the groups in place: FULL_SHARD over the group, byte for byte;
- NO_SHARD: nothing sharded; a unit runs on a bf16 copy of its FlatParameter (`_mp_shard`) freed at each
  reshard (`post_reshard`), its gradient all-reduced and cast to fp32 (`_all_reduce_grad`,
  `_cast_grad_to_param_dtype`) as its backward ends, so the backward ends with every fp32 gradient
  (`no_shard_backward_end`). torch 2.13 raises for it with tied embeddings and no_sync accumulation.

Measured: tests/data/measured/fsdp1 (validation/fsdp1, torch 2.13, transformers 5.23).
"""

from __future__ import annotations

from .components import Component, component
from ..spec.dtypes import bytes_per_element

FRAMEWORK = "fsdp1"
SOURCE = ("torch 2.13 distributed/fsdp/_flat_param.py (FlatParameter, _full_param_padded), _runtime_utils.py "
          "(_post_forward_reshard: the root stays unsharded after forward; _post_backward_hook, _reduce_grad; "
          "BACKWARD_PRE prefetch); accelerate 1.15 FullyShardedDataParallelPlugin (MixedPrecision bf16); measured: "
          "tests/data/measured/fsdp1")
NO_SYNC_SOURCE = ("torch 2.13 distributed/fsdp/_runtime_utils.py _post_backward_hook: under no_sync() it returns "
                  "before the reduce-scatter, keeping the unsharded gradient (FullyShardedDataParallel.no_sync docs); "
                  "accelerate Accelerator.accumulate; measured: tests/data/measured/fsdp1/*-nosync")

SPLIT_SOURCE = ("torch 2.13 distributed/fsdp/_flat_param.py FlatParamHandle._use_unsharded_views (a unit's weights "
                "are views of its FlatParameter's split), torch/csrc/autograd/input_buffer.cpp (a node's inputs held "
                "until its last arrives); measured: tests/data/measured/fsdp1/*-eager")


def is_fsdp1(training) -> bool:
    return training.framework == FRAMEWORK


# Accelerate's fsdp_sharding_strategy as the ZeRO stage the states model charges (states.py): FULL_SHARD and
# HYBRID_SHARD shard parameters, gradients and states (3), SHARD_GRAD_OP the same shards with the units kept
# gathered between forward and backward (2, as FSDP2's reshard_after_forward=False), NO_SHARD nothing (0)
STRATEGY_ZERO = {"FULL_SHARD": 3, "HYBRID_SHARD": 3, "SHARD_GRAD_OP": 2, "NO_SHARD": 0}
NODE_GPUS = 8  # HYBRID_SHARD's default shard group: FSDP takes the node's device count (_init_intra_node_process_group)
STRATEGY_SOURCE = ("torch 2.13 distributed/fsdp/_init_utils.py (HYBRID_SHARD: intra-node shard group, inter-node "
                   "replicas), _flat_param.py (RESHARD_AFTER_FORWARD / NO_RESHARD_AFTER_FORWARD_HANDLE_STRATEGIES, "
                   "post_reshard frees NO_SHARD's _mp_shard), _runtime_utils.py (_post_forward_reshard, "
                   "_should_free_in_backward, _reduce_grad, _all_reduce_grad); accelerate 1.15 "
                   "FullyShardedDataParallelPlugin.sharding_strategy; measured: tests/data/measured/fsdp1")


def strategy(training, par) -> str:
    return par.fsdp_sharding_strategy if is_fsdp1(training) else "FULL_SHARD"


def shard_group(training, par) -> int:
    """The ranks a FlatParameter is sharded over: DP, or HYBRID_SHARD's shard group (the harness measures
    HYBRID_SHARD equal, byte for byte, to FULL_SHARD over its group: tests/test_harness_fsdp1_strategies.py)."""
    if strategy(training, par) == "HYBRID_SHARD":
        return par.fsdp_shard_group_size or NODE_GPUS
    return par.dp


def frozen_weights_train(training) -> bool:
    """An adapter run under FSDP1: a decoder layer's frozen weights share its FlatParameter with the
    adapters, so autograd treats them as trainable (module docstring)."""
    return is_fsdp1(training) and training.adapter is not None


def with_gradients(training, stage, inv) -> float:
    """Elements of the units whose FlatParameter requires grad: all, or under an adapter the decoder
    layers (their frozen weights and adapters), with the root when its embedding and head are trained."""
    if inv is None:
        return stage.local
    root = stage.root_local + inv.saved if training.adapter.trainable_embeddings else 0.0
    return stage.local - stage.root_local + inv.adapters + root


def transients(training, par, recipe, stage, microbatches: int, inv=None) -> tuple[list[Component], list[Component]]:
    """(forward, backward) components of the unsharded parameters (`_gathered`) and, under no_sync
    accumulation, the unsharded gradient of every unit that has one (`with_gradients`; `inv`: an adapter
    run's `adapters.inventory`)."""
    P = bytes_per_element(recipe.param_dtype)
    fwd, bwd = _gathered(strategy(training, par), P, stage)
    if microbatches > 1:
        n = with_gradients(training, stage, inv)
        grads = component("transient", "Unsharded gradients of every unit (no_sync accumulation)", P * n,
                          f"{P:g} B (param dtype) x {n:,.0f} parameters of the units with gradients, unsharded: "
                          f"kept from the first of "
                          f"{microbatches} micro-batches to the last one's reduce-scatter", NO_SYNC_SOURCE)
        fwd.append(grads)
        bwd.append(grads)
    return fwd, bwd


def softmax_moment_parts(arch, training, par, recipe, stage) -> list[Component]:
    """Beside the last layer's eager softmax backward without recompute (softmax_backward.py), what FSDP1 holds
    and the HF Trainer's plain loop does not: with `use_orig_params` a unit's weights are views of its unsharded
    FlatParameter split into pieces (torch 2.13 fsdp/_flat_param.py `_use_unsharded_views`), so each weight's
    gradient waits in the split's backward node (autograd's InputBuffer) until the unit's last one arrives, in
    the param dtype: the head's and final norm's (the root unit's embedding comes last) and the last layer's
    after its core attention. The moment is inside the last layer's backward, so its own unit is gathered beside
    the prefetched one (BACKWARD_PRE; SHARD_GRAD_OP's units are all counted already). Full fine-tuning without
    accumulation only, as measured (tests/data/measured/fsdp1/*-eager: head, MLP and o_proj gradients and two
    layer units at the backward peak); an adapter run's units and no_sync's kept gradients are not modelled here."""
    from .dsa_hf_moments import LAST_FORMULA, last_layer_gradient_elements
    from .sharding import padded_vocab_size
    if training.adapter is not None:
        return []
    P = bytes_per_element(recipe.param_dtype)
    n = last_layer_gradient_elements(arch, stage, padded_vocab_size(arch.vocab_size, par.tp, training.framework))
    out = [component("transient", "Unsharded gradients made before the last layer's attention backward, held by "
                     "their FlatParameter's split until the unit's last arrives", P * n,
                     LAST_FORMULA.replace("G x", f"{P:g} B (param dtype) x"), SPLIT_SOURCE)]
    if strategy(training, par) != "SHARD_GRAD_OP":
        out.append(component("transient", "The last layer's own unit, beside the prefetched one", P *
                             stage.largest_layer_local, f"{P:g} B x a layer unit (its backward runs)", SOURCE))
    return out


def no_shard_backward_end(training, par, recipe, stage, grads: float, inv=None):
    """NO_SHARD's last backward moment, as (gradients, None, transients) (`backward_moments.BackwardEnd`'s
    fields; built by static_stage, which imports both): every unit's fp32 gradient (the
    all-reduced, cast ones, and the last unit's cast being made), with the root's param-dtype copy and the
    last unit's copy and param-dtype gradient: the root itself when it trains (its embedding's backward
    comes last), else the first layer (measured: tests/data/measured/fsdp1/*-noshard, within 0.2%)."""
    if strategy(training, par) != "NO_SHARD":
        return None
    P = bytes_per_element(recipe.param_dtype)
    root, layer = stage.root_local, stage.largest_layer_local
    root_trains = inv is None or training.adapter.trainable_embeddings
    held = P * (2 * root if root_trains else root + 2 * layer)
    formula = (f"{P:g} B x 2 x the root unit (its copy and its gradient)" if root_trains else
               f"{P:g} B x (the root unit + 2 x a layer unit: the first layer's copy and gradient)")
    return (grads, None, [component(
        "transient", "The root's param-dtype copy, the last unit's and its param-dtype gradient (NO_SHARD)", held,
        formula, STRATEGY_SOURCE)])


def _gathered(name: str, P: float, stage) -> tuple[list[Component], list[Component]]:
    """The units' param-dtype copies alive at the forward's end and the backward's start. FULL_SHARD and
    HYBRID_SHARD: the root unit (not resharded after forward), and in backward the layer prefetched beside
    it (BACKWARD_PRE). SHARD_GRAD_OP: every unit, gathered for its forward and freed after its backward.
    NO_SHARD: the same moments hold the same copies (`_mp_shard`): the root's, kept through its forward (the
    whole model's), and in backward the last layer's beside it."""
    root, layer = stage.root_local, stage.largest_layer_local
    if name == "SHARD_GRAD_OP":
        every = component("transient", "Unsharded units, every one (not resharded after forward)", P * stage.local,
                          f"{P:g} B x the stage's parameters (SHARD_GRAD_OP)", STRATEGY_SOURCE)
        return [every], [every]
    if name == "NO_SHARD":
        return ([component("transient", "Param-dtype copy of the root unit (NO_SHARD _mp_shard)", P * root,
                           f"{P:g} B x the root unit's parameters", STRATEGY_SOURCE)],
                [component("transient", "Param-dtype copies of the root unit and the prefetched layer unit (NO_SHARD "
                           "_mp_shard, BACKWARD_PRE)", P * (root + layer), f"{P:g} B x (the root unit + a layer unit)",
                           STRATEGY_SOURCE)])
    return ([component("transient", "Unsharded root unit (embedding, final norm, head)", P * root,
                       f"{P:g} B x the root unit's parameters (not resharded after forward)", SOURCE)],
            [component("transient", "Unsharded root unit and the prefetched layer unit", P * (root + layer),
                       f"{P:g} B x (the root unit + a layer unit, BACKWARD_PRE)", SOURCE)])


def check(training, par) -> None:
    """What FSDP1 as the HF Trainer runs it is modelled with: data parallelism alone, the sharding strategy given
    by `fsdp_sharding_strategy` (a zero_stage that says otherwise is refused)."""
    from ..spec.errors import ConfigError
    for field, value in (("tp", par.tp), ("pp", par.pp), ("cp", par.cp), ("ep", par.ep)):
        if value != 1:
            raise ConfigError(f"parallel.{field}", value, "1 with framework 'fsdp1'",
                              "FSDP1 is modelled as the HF Trainer and Accelerate run it: data parallelism only",
                              related=("training.framework",))
    name = par.fsdp_sharding_strategy
    if par.zero_stage not in (None, STRATEGY_ZERO[name]):
        raise ConfigError("parallel.zero_stage", par.zero_stage,
                          f"{STRATEGY_ZERO[name]} (or empty) with fsdp_sharding_strategy {name!r}",
                          "FSDP1's sharding is set by parallel.fsdp_sharding_strategy",
                          related=("parallel.fsdp_sharding_strategy",))
    _check_hybrid(par)
    _check_quantized_base(training)
    if training.offload_optimizer != "none" or training.offload_parameters != "none":
        field = "training.offload_optimizer" if training.offload_optimizer != "none" else "training.offload_parameters"
        raise ConfigError(field, getattr(training, field.split(".")[1]), "'none' with framework 'fsdp1'",
                          "FSDP1's CPUOffload is not modelled", related=("training.framework",))
    if training.optimizer_in_backward or training.compile or training.fp8:
        field = next(f for f in ("optimizer_in_backward", "compile", "fp8") if getattr(training, f))
        raise ConfigError(f"training.{field}", True, "false with framework 'fsdp1'",
                          "not modelled under FSDP1", related=("training.framework",))


def _check_quantized_base(training) -> None:
    """FSDP1 flattens a unit's parameters into one FlatParameter of one dtype (torch 2.13 fsdp/_flat_param.py
    `_validate_tensors_to_flatten`: "Must flatten tensors with uniform dtype"), so bitsandbytes' uint8 codes cannot
    join a layer's bf16 weights; QLoRA over FSDP1 runs with bnb_4bit_quant_storage bf16 (the codes packed four to a
    bf16 element) and PEFT's fsdp_auto_wrap_policy (peft utils/other.py: a unit per LoRA module, the frozen layer
    without gradients; use_orig_params false, examples/sft/train.py), and Accelerate upcasts every FlatParameter
    that requires grad to fp32 (accelerator.py prepare_model). The units modelled here are the Trainer's
    TRANSFORMER_BASED_WRAP over use_orig_params, which that run does not use."""
    from ..spec.adapter import refuse_quantized_base
    refuse_quantized_base(training, "QLoRA over FSDP1 runs PEFT's own wrap policy (a unit per LoRA module) with "
                                    "bf16-packed 4-bit codes; the units modelled are the Trainer's per layer: not "
                                    "modelled")


def _check_hybrid(par) -> None:
    from ..spec.errors import ConfigError
    group = par.fsdp_shard_group_size
    if group is not None and par.fsdp_sharding_strategy != "HYBRID_SHARD":
        raise ConfigError("parallel.fsdp_shard_group_size", group, "empty unless fsdp_sharding_strategy is "
                          "'HYBRID_SHARD'", "the other strategies shard over DP or not at all",
                          related=("parallel.fsdp_sharding_strategy",))
    if par.fsdp_sharding_strategy == "HYBRID_SHARD" and par.dp % (group or NODE_GPUS):
        raise ConfigError("parallel.fsdp_shard_group_size" if group else "parallel.dp", group or par.dp,
                          f"a divisor of dp ({par.dp})" if group else f"a multiple of {NODE_GPUS} (a node's GPUs, "
                          "HYBRID_SHARD's default shard group) or set fsdp_shard_group_size",
                          "HYBRID_SHARD shards within a group and replicates across groups",
                          related=("parallel.fsdp_sharding_strategy",))


def check_tied_no_sync(arch, training, par, microbatches: int) -> None:
    """torch 2.13 raises for NO_SHARD with bf16 MixedPrecision, use_orig_params, tied embeddings and no_sync
    accumulation: the shared weight's bf16 gradient is assigned to its fp32 view (_flat_param.py
    `_use_sharded_grad_views`; checked on a real tiny run, tests/test_fsdp1_strategies.py)."""
    from ..spec.errors import ConfigError
    if strategy(training, par) == "NO_SHARD" and arch.tie_embeddings and microbatches > 1:
        raise ConfigError("parallel.fsdp_sharding_strategy", "NO_SHARD", "another strategy, or one micro-batch per "
                          "step, for a model with tied embeddings",
                          "torch 2.13 FSDP1 fails there: NO_SHARD accumulation assigns the tied weight's bf16 gradient "
                          "to its fp32 parameter", related=("training.global_batch_size",))
