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


def is_fsdp1(training) -> bool:
    return training.framework == FRAMEWORK


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


def transients(training, recipe, stage, microbatches: int, inv=None) -> tuple[list[Component], list[Component]]:
    """(forward, backward) components: the root unit gathered throughout, the last layer prefetched for
    backward beside it, and under no_sync accumulation the unsharded gradient of every unit that has
    one (`with_gradients`; `inv`: an adapter run's `adapters.inventory`)."""
    P = bytes_per_element(recipe.param_dtype)
    root, layer = stage.root_local, stage.largest_layer_local
    fwd = [component("transient", "Unsharded root unit (embedding, final norm, head)", P * root,
                     f"{P:g} B x the root unit's parameters (not resharded after forward)", SOURCE)]
    bwd = [component("transient", "Unsharded root unit and the prefetched layer unit", P * (root + layer),
                     f"{P:g} B x (the root unit + a layer unit, BACKWARD_PRE)", SOURCE)]
    if microbatches > 1:
        n = with_gradients(training, stage, inv)
        grads = component("transient", "Unsharded gradients of every unit (no_sync accumulation)", P * n,
                          f"{P:g} B (param dtype) x {n:,.0f} parameters of the units with gradients, unsharded: "
                          f"kept from the first of "
                          f"{microbatches} micro-batches to the last one's reduce-scatter", NO_SYNC_SOURCE)
        fwd.append(grads)
        bwd.append(grads)
    return fwd, bwd


def check(training, par) -> None:
    """What FSDP1 as the HF Trainer runs it is modelled with: data parallelism alone, FULL_SHARD."""
    from ..spec.errors import ConfigError
    for field, value in (("tp", par.tp), ("pp", par.pp), ("cp", par.cp), ("ep", par.ep)):
        if value != 1:
            raise ConfigError(f"parallel.{field}", value, "1 with framework 'fsdp1'",
                              "FSDP1 is modelled as the HF Trainer and Accelerate run it: data parallelism only",
                              related=("training.framework",))
    if par.zero_stage not in (None, 3):
        raise ConfigError("parallel.zero_stage", par.zero_stage, "3 (FULL_SHARD, or empty) with framework 'fsdp1'",
                          "FSDP1's SHARD_GRAD_OP, HYBRID_SHARD and NO_SHARD are not modelled",
                          related=("training.framework",))
    if training.offload_optimizer != "none" or training.offload_parameters != "none":
        field = "training.offload_optimizer" if training.offload_optimizer != "none" else "training.offload_parameters"
        raise ConfigError(field, getattr(training, field.split(".")[1]), "'none' with framework 'fsdp1'",
                          "FSDP1's CPUOffload is not modelled", related=("training.framework",))
    if training.optimizer_in_backward or training.compile or training.fp8:
        field = next(f for f in ("optimizer_in_backward", "compile", "fp8") if getattr(training, f))
        raise ConfigError(f"training.{field}", True, "false with framework 'fsdp1'",
                          "not modelled under FSDP1", related=("training.framework",))
