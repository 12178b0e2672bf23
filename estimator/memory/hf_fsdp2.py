"""PyTorch FSDP2 as the HF Trainer runs it through Accelerate (`training.framework` "hf_fsdp2": accelerate 1.15.0's
`fsdp_version: 2`, transformers 5.23.0, torch 2.13).

What differs from torchtitan's FSDP2 (`fsdp2`), read in the sources and measured by validation/hf_fsdp2:

- the model is transformers' (its modelling code's activations, `spec.choices.TRANSFORMERS_FRAMEWORKS`), loaded in
  the checkpoint's dtype (transformers 5 `from_pretrained` dtype="auto"); `fsdp2_prepare_model`
  (accelerate/utils/fsdp_utils.py) upcasts the trainable parameters to fp32 under mixed precision, so full
  fine-tuning keeps fp32 shards (the master copy) and a LoRA run its frozen base in the loaded dtype beside fp32
  adapters;
- `MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=bf16, output_dtype=bf16)` (utils/dataclasses.py
  `set_mixed_precision`, fsdp_version 2): the parameters are gathered and the gradients reduced in bf16;
- no autocast: `Accelerator._prepare_fsdp2` shards the model without `prepare_model`, whose `native_amp` branch
  wraps the forward of every other stack in autocast and `convert_outputs_to_fp32` (accelerator.py). The forward
  is that of a 16-bit model: the logits stay bf16 until transformers' loss upcasts them;
- units: each decoder layer (`_no_split_modules`), the input embedding (untied), and the tail
  `[final norm, LM head]` (tied: with the embedding) with reshard_after_forward=False, then the root;
- gradient accumulation: the Trainer runs every micro-batch but the last under `accelerator.no_sync`, which for
  FSDP2 is `model.set_requires_gradient_sync(False)` (accelerator.py `no_sync`): each unit keeps its unsharded
  gradients until the last micro-batch's backward reduce-scatters them.

Data parallelism alone is modelled (Accelerate's ParallelismConfig TP and CP are not), with the Trainer's own
optimizers (bitsandbytes' paged ones and QLoRA's Params4bit, which Accelerate leaves unsharded, are refused).
"""

from __future__ import annotations

from ..spec.errors import ConfigError

FRAMEWORK = "hf_fsdp2"
SOURCE = ("accelerate 1.15.0 accelerator.py _prepare_fsdp2 / no_sync and utils/fsdp_utils.py fsdp2_prepare_model; "
          "transformers 5.23.0 trainer.py; measured: tests/data/measured/hf_fsdp2")


def check(training, par) -> None:
    """Refuse what the HF Trainer over FSDP2 is not modelled with (module docstring)."""
    from ..spec.adapter import refuse_quantized_base
    for field, value in (("tp", par.tp), ("pp", par.pp), ("cp", par.cp), ("ep", par.ep)):
        if value != 1:
            raise ConfigError(f"parallel.{field}", value, f"1 with framework {FRAMEWORK!r}",
                              "the HF Trainer over FSDP2 is modelled with data parallelism only (Accelerate's "
                              "ParallelismConfig TP and CP are not)", related=("training.framework",))
    if par.dp == 1 and training.mode == "training":
        raise ConfigError("parallel.dp", par.dp, f"2 or more with framework {FRAMEWORK!r}",
                          "FSDP2 over one GPU (bf16 copies gathered from fp32 shards of the whole model) is not "
                          "modelled; one GPU runs the Trainer without FSDP: framework 'hf'",
                          related=("training.framework",))
    if par.zero_stage not in (None, 2, 3):
        raise ConfigError("parallel.zero_stage", par.zero_stage, f"2 or 3 (or empty) with framework {FRAMEWORK!r}",
                          "Accelerate's FSDP2 plugin shards every unit: reshard_after_forward True is 3, False is 2",
                          related=("training.framework",))
    if training.fp8:
        raise ConfigError("training.fp8", True, f"false with framework {FRAMEWORK!r}",
                          "Accelerate's FP8 backends are not modelled under FSDP2", related=("training.framework",))
    refuse_quantized_base(training, "Accelerate leaves bitsandbytes' quantized weights out of FSDP2's sharding "
                                    "(fsdp2_prepare_model: non-floating Params4bit are ignored_params); not modelled")


NO_SYNC_SOURCE = ("accelerate 1.15.0 accelerator.py no_sync (FSDP2: model.set_requires_gradient_sync(False)); "
                  "torch 2.13 "
                  "distributed/fsdp/_fully_shard/_fsdp_param_group.py post_backward (without reduce_grads a unit keeps "
                  "its unsharded gradient, in the reduce dtype: _fsdp_param.py to_accumulated_grad_if_needed); "
                  "transformers 5.23.0 trainer.py (every micro-batch but the last under no_sync); measured: "
                  "tests/data/measured/hf_fsdp2/*-nosync")


def is_hf_fsdp2(training) -> bool:
    return training.framework == FRAMEWORK


def no_sync_gradients(training, recipe, trainable: float, microbatches: int) -> list:
    """Under gradient accumulation, the unsharded gradient of every trainable parameter, kept from the first
    micro-batch's backward to the last one's reduce-scatter (module docstring): in the parameters' gathered dtype,
    which is the reduce dtype under Accelerate's policy (bf16 both), so FSDP2 keeps them as they are."""
    from .components import component
    from ..spec.dtypes import bytes_per_element
    if not is_hf_fsdp2(training) or microbatches <= 1:
        return []
    P = bytes_per_element(recipe.param_dtype)
    return [component("transient", "Unsharded gradients of every unit (no_sync accumulation)", P * trainable,
                      f"{P:g} B (param and reduce dtype) x {trainable:,.0f} trainable parameters, unsharded: kept from "
                      f"the first of {microbatches} micro-batches to the last one's reduce-scatter", NO_SYNC_SOURCE)]


UNITS_SOURCE = ("accelerate 1.15.0 utils/fsdp_utils.py fsdp2_prepare_model (a unit per decoder layer, the untied input "
                "embedding its own, fully_shard([final norm, (embedding,) LM head], reshard_after_forward=False)); "
                "torch 2.13 distributed/fsdp/_fully_shard/_fsdp_param_group.py (wait_for_unshard: in forward the "
                "all-gather output is kept in comm_ctx.all_gather_state until the next all-gather; post_backward "
                "reshards, then keeps the reduce-scatter input until the next unit's post-backward; a group whose "
                "first module's inputs need no gradient, the tied embedding's, runs it from the root's final "
                "callback at the end of backward); measured: tests/data/measured/hf_fsdp2")


def _layer_trainable(stage, inv) -> float:
    """One layer's trainable elements: all of a layer, or an adapter run's share of its trainable ones (`inv`:
    adapters.inventory)."""
    return inv.trainable / max(1, stage.num_layers) if inv else stage.largest_layer_local


def tail_elements(arch, stage) -> float:
    """The tail unit's elements on the last stage: the final norm and the LM head (the embedding, when tied, is
    the head)."""
    return arch.vocab_size * arch.hidden_size + arch.hidden_size if stage.last else 0.0


def tail_unit(arch, training, recipe, stage, zero: int) -> tuple:
    """Held from the loss's forward (inside the model's forward, transformers' loss_function) to its backward: the
    tail unit, not resharded after forward (zero 3; at zero 2 every unit is counted gathered already)."""
    from .components import component
    from ..spec.dtypes import bytes_per_element
    if not is_hf_fsdp2(training) or zero != 3 or not stage.last or training.mode != "training":
        return ()
    P = bytes_per_element(recipe.param_dtype)
    return (component("transient", "The tail unit (final norm, LM head) gathered: not resharded after forward",
                      P * tail_elements(arch, stage), f"{P:g} B x (V*h + h)", UNITS_SOURCE),)


def forward_gathered(arch, training, recipe, stage, layer: float) -> list:
    """Beside the loss at the forward's end: the last all-gather's output, whose free waits for the next
    all-gather (the backward's): the tail unit's, or with tied embeddings (the tail gathered at the embedding, the
    forward's first unit) the last layer's."""
    from .components import component
    from ..spec.dtypes import bytes_per_element
    P = bytes_per_element(recipe.param_dtype)
    if stage.last and not arch.tie_embeddings:
        return [component("transient", "The tail unit's all-gather output (freed at the next all-gather)",
                          P * tail_elements(arch, stage), f"{P:g} B x (V*h + h)", UNITS_SOURCE)]
    return [component("transient", "The last layer's all-gather output (freed at the next all-gather)", P * layer,
                      f"{P:g} B x a layer unit", UNITS_SOURCE)]


def block_moment(arch, training, recipe, par, stage, zero: int, inv) -> list:
    """A layer's backward beyond its saved tensors: its unit and the one prefetched gathered (zero 3), its own
    unsharded gradients and the reduce-scatter input of the unit differentiated before (both in the reduce dtype,
    the parameters'), the largest of a layer's and, untied, the tail's: the last layer's backward follows the
    tail's post-backward. With tied embeddings the tail stays gathered, the head's gradient beside it, until the
    end of backward."""
    from .components import component
    from ..spec.dtypes import bytes_per_element
    if not is_hf_fsdp2(training) or training.mode != "training" or par.dp == 1:
        return []
    P = bytes_per_element(recipe.param_dtype)
    layer = stage.largest_layer_local
    trains = _layer_trainable(stage, inv)
    tail = tail_elements(arch, stage)
    head_trains = inv is None or training.adapter.trainable_embeddings
    previous = max(trains, tail if stage.last and not arch.tie_embeddings and head_trains else 0.0)
    out = []
    if zero == 3:
        out.append(component("transient", "Unsharded parameters in flight", 2 * P * layer,
                             f"{P:g} B x (a layer unit + the prefetched one)", UNITS_SOURCE))
    out.append(component("transient", "The layer's unsharded gradients and the reduce-scatter input before them",
                         P * (trains + previous), f"{P:g} B x (a layer's trainable parameters + the " +
                         ("tail's (V*h + h), the last layer's backward following it)" if previous > trains else
                          "previous unit's)"), UNITS_SOURCE))
    if stage.last and arch.tie_embeddings and zero == 3:
        held = tail * (2 if head_trains else 1)
        out.append(component("transient", "The tied tail unit gathered" + (" and its head's gradient" if head_trains
                                                                            else "") + ", to the end of backward",
                             P * held, f"{P:g} B x {'2 x ' if head_trains else ''}(V*h + h)", UNITS_SOURCE))
    return out


def backward_end(arch, training, recipe, par, stage, zero: int, grads: float, inv):
    """Backward's last moment on the stage with the embedding, as (gradients, their formula, transients)
    (`backward_moments.BackwardEnd`'s fields): the embedding's post-backward, from the root's final callback
    (its inputs, the token ids, need no gradient), with every other unit's sharded gradient made. Untied: the
    embedding unit gathered and its reduce-scatter input; tied: the tail unit gathered, the head's and the
    lookup's gradients and their sum (autograd accumulates the second out of place); with the first layer's
    reduce-scatter input beside them (measured: tests/data/measured/hf_fsdp2/*-s512-*). None where the
    embedding trains nothing (an adapter run without trainable embeddings) or is not on this stage."""
    from .components import component
    from ..spec.dtypes import bytes_per_element
    if not is_hf_fsdp2(training) or not stage.first or par.dp == 1 or zero != 3:
        return None
    if inv is not None and not training.adapter.trainable_embeddings:
        return None
    P, G = bytes_per_element(recipe.param_dtype), bytes_per_element(recipe.grad_dtype)
    emb = tail_elements(arch, stage) if arch.tie_embeddings else arch.vocab_size * arch.hidden_size
    layer = _layer_trainable(stage, inv)
    copies, what = ((4, "the tail unit gathered, the head's and the lookup's gradients and their sum")
                    if arch.tie_embeddings else (2, "the embedding unit gathered and its reduce-scatter input"))
    unit = "tail" if arch.tie_embeddings else "embedding"
    return (grads - G * emb / par.dp, f"{G:g} B x (the stage's trainable parameters - the {unit} unit's) / d",
            [component("transient", f"The {unit}'s post-backward: {what}", copies * P * emb,
                       f"{copies} x {P:g} B x (V*h{' + h' if arch.tie_embeddings else ''})", UNITS_SOURCE),
             component("transient", "The first layer's reduce-scatter input", P * layer,
                       f"{P:g} B x a layer's trainable parameters", UNITS_SOURCE)])
