"""One measured training step of PyTorch FSDP2 (`torch.distributed.fsdp.fully_shard`) as the HF
Trainer runs it through Accelerate with `fsdp_version: 2` (transformers 5.23 `Trainer`, accelerate
1.15 `FullyShardedDataParallelPlugin`), rank 0 of a fake world.

The model. transformers 5 `from_pretrained` loads in the checkpoint's dtype unless told otherwise
(modeling_utils.py `from_pretrained`: `if dtype is None: dtype = "auto"`, which `_get_dtype` resolves
to the config's `dtype`, bf16 for every model measured here), so the model is built in bf16 (full
fine-tuning still ends in fp32 shards through accelerate's upcast below; a LoRA base stays bf16).
Gradient checkpointing (`TrainingArguments.activation_checkpointing`, `gradient_checkpointing` its
deprecated alias): the Trainer calls `model.activation_checkpointing_enable()` (trainer.py `train`),
whose default kwargs are `{"use_reentrant": False}` (modeling_utils.py
`_activation_checkpointing_enable`), every decoder layer, before wrapping. LoRA: peft's
`get_peft_model` before the Trainer; peft keeps the frozen base in bf16 and makes the adapters fp32
(`autocast_adapter_dtype=True`, its default).

The wrapping. trainer.py `_prepare_for_training`: with FSDP2 the optimizer is created first
(`delay_optimizer_creation = False`), then `accelerator.prepare(model, optimizer)`, which for FSDP2
is accelerator.py `_prepare_fsdp2`: it calls `fsdp2_prepare_model` (accelerate/utils/fsdp_utils.py)
and swaps the optimizer's parameters for the sharded ones (`fsdp2_switch_optimizer_parameters`).
`_prepare_fsdp2` never calls `prepare_model`, the only place accelerate puts the forward under
autocast and wraps it in `convert_outputs_to_fp32` (accelerator.py `prepare_model`, reached from
`_prepare_one` on the DDP/FSDP1 path of `prepare`): under FSDP2 there is no autocast, and the compute
dtype is FSDP2's MixedPrecisionPolicy's alone. That policy: `Accelerator.__init__` hands the plugin to
`AcceleratorState(mixed_precision="bf16", fsdp_plugin=...)` (accelerator.py), whose `__init__` (state.py), in
its multi-GPU branch, sets `DistributedType.FSDP` and calls `fsdp_plugin.set_mixed_precision("bf16")`, which
for `fsdp_version == 2` makes
`MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=bf16, output_dtype=bf16)` (utils/dataclasses.py).
`fsdp2_prepare_model` then (its own code, called here as it is):
  - upcasts the TRAINABLE parameters to fp32 (`mixed_precision != "no"`; frozen ones keep bf16);
  - `fully_shard` on every decoder layer (`transformer_based_wrap` over `_no_split_modules`);
  - the input embedding its own unit when it is not tied to the head;
  - the tail `[final_norm, lm_head]` (tied: `[final_norm, embed, lm_head]`) one unit with
    `reshard_after_forward=False`; the final norm is looked up among the direct children of
    `getattr(model, model.base_model_prefix)` (`_find_final_norm`): for a peft model that attribute
    is the causal-LM wrapper, so the norm is not found and stays in the root;
  - the root, with FSDP2's default (`reshard_after_forward=None`: False for the root).
`cpu_ram_efficient_loading` is False (its default, `FSDP_CPU_RAM_EFFICIENT_LOADING`), so no reload.

On the CPU. `Accelerator(cpu=True)` makes a MULTI_CPU state, whose branch of `AcceleratorState.__init__`
never attaches the FSDP plugin (only the GPU branch does). The plugin is made and given its mixed
precision exactly as that branch does, and attached to `acc.state.fsdp_plugin` by hand, so that the real
`fsdp2_prepare_model` wraps the model. `acc.prepare` itself is not called: it would not take the FSDP2 path
in a MULTI_CPU state, and its optimizer swap maps parameters by `data_ptr`, all 0 on the meta device. The
optimizer is made over the sharded parameters instead, which is what the swap leaves (AdamW's states are
made lazily at its first step either way). The model is wrapped on the meta device, outside fake mode, and
given storage inside it with `to_empty` (FSDP2's meta-device initialisation), as the torchtitan harness does.

The step (trainer.py `_inner_training_loop`, the loop over a step's micro-batches, and `training_step`):
    for each of m micro-batches, all but the last under accelerator.no_sync(model), which for FSDP2 is
    model.set_requires_gradient_sync(False) ... (True) (accelerator.py `no_sync`):
        loss = model(input_ids=ids, labels=ids).loss / m;  loss.backward()
    accelerator._clip_grad_norm_dtensor_aware(model.parameters(), 1.0)   (accelerator.py `clip_grad_norm_`,
        FSDP2 branch; one mesh: torch.nn.utils.clip_grad_norm_)
    optimizer.step();  model.zero_grad()                       (set_to_none=True, nn.Module's default)
The optimizer is torch AdamW, fused (training_args.py: `default_optim = "adamw_torch_fused"` when torch >=
2.8), weight decay 0 (its default), over the parameters that require grad (the Trainer splits them into a decay
and a no-decay group, which changes no allocation). The loss divided by m stands for the Trainer's scaling (with
`num_items_in_batch` the model sums the token losses and divides by the count instead): the same tensors but
for a scalar. The Trainer's running loss (`_tr_loss`, one scalar) is not kept. Step 1 creates the optimizer
states; step 2 is measured. Phases: "accumulate" (the micro-batches before the last, forward and backward),
"forward", "backward" (the last micro-batch) and "optimizer".

Gradients. After backward FSDP2 reduce-scatters each unit's unsharded gradients into the sharded fp32
`param.grad` (a DTensor; its local tensor is counted). Under no_sync it does not: with
reduce_dtype == param_dtype FSDP2 clamps reduce_dtype to None (torch 2.13 _fully_shard/_fsdp_param.py
`init_dtype_attrs`), so `to_accumulated_grad_if_needed` leaves the bf16 unsharded gradient where autograd put
it, on `FSDPParam._unsharded_param.grad`, for every unit, until the last micro-batch's backward adds to it in
place and reduce-scatters it (_fsdp_param_group.py `post_backward`). Those held gradients are counted as
gradients: their keys are taken when the last micro-batch starts.

Gathered units. In the forward FSDP2 keeps the last all-gather's output buffer until the next unit's copy-out
(to overlap it with the next all-gather) and frees the last one only at the root's post-forward (torch 2.13
_fsdp_param_group.py `wait_for_unshard`, _fsdp_state.py `_post_forward`). The HF model computes its loss inside
the root's forward, so the logits and the cross-entropy live beside that buffer: for an untied model the tail
unit's ([final_norm, lm_head], gathered last), beside its unsharded parameters, which `reshard_after_forward=False`
keeps into the backward. With tied embeddings the tail unit [final_norm, embed, lm_head] is gathered at the
embedding, at the start of the forward, and stays gathered through it; the last decoder layer's all-gather buffer
is then the one alive at the loss.

What a CPU run cannot show is emulated as for the HF records (validation/core/emulation.py: FlashAttention-2's
allocations for SDPA, the packed-sequence check); FSDP2's storage resizes of the unsharded parameters are
reported to the tracker (`fsdp2_storage`); DTensors are looked through to their local tensors
(`SubclassAwareTracker`). Streams and events are the CPU's no-ops: allocations in the order the CPU issues
them, without a GPU stream's delayed block reuse.
"""

from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass

import torch

from ..core.emulation import cuda_emulation, fsdp2_storage
from ..core.steps import fake_mode, log_second_step
from ..core.tracker import SubclassAwareTracker, phase_summary
from ..core.world import fake_world
from ..hf.meta_build import lora_on_all_seven, meta_causal_lm


@dataclass(frozen=True)
class Run:
    model: str  # a key of validation.hf.models.MODELS
    world: int  # ranks (FSDP2 degree)
    seq_len: int
    micro_batch_size: int = 1
    accumulation: int = 1  # micro-batches per step, all but the last under no_sync
    recompute: str = "none"  # "none" or "full"
    lora_rank: int = 0  # 0: full fine-tuning; else LoRA on q, k, v, o, gate, up, down
    layers: int | None = None  # keep only the first N decoder layers (tiny self-test models)
    reshard_after_forward: bool = True  # Accelerate's fsdp_reshard_after_forward (the decoder layers, the embedding)
    attention: str = "sdpa"  # transformers' attn_implementation: "sdpa" (FlashAttention-2 emulated) or "eager"


def accelerator(run: Run):
    """A CPU Accelerator with the FSDP2 plugin the Trainer's `fsdp_config` makes (module docstring)."""
    from accelerate import Accelerator
    from accelerate.state import AcceleratorState, GradientState, PartialState
    from accelerate.utils import FullyShardedDataParallelPlugin

    AcceleratorState._reset_state(True)
    GradientState._reset_state()
    PartialState._reset_state()
    plugin = FullyShardedDataParallelPlugin(fsdp_version=2, auto_wrap_policy="transformer_based_wrap",
                                            reshard_after_forward=run.reshard_after_forward)
    acc = Accelerator(mixed_precision="bf16", cpu=True)
    plugin.set_mixed_precision(acc.mixed_precision)  # state.py, AcceleratorState.__init__'s FSDP branch
    acc.state.fsdp_plugin = plugin
    return acc


def meta_model(run: Run):
    """The model (and its adapters) in bf16, parameters on meta, buffers real."""
    model = meta_causal_lm(run.model, run.attention, run.layers, torch.bfloat16)
    if run.recompute == "full":
        model.activation_checkpointing_enable()
    if run.lora_rank:
        model = lora_on_all_seven(model, run.lora_rank)
    model.train()
    return model


def wrap(run: Run):
    """The model as accelerate's `fsdp2_prepare_model` leaves it (on meta), and the accelerator."""
    from accelerate.utils.fsdp_utils import fsdp2_prepare_model

    acc = accelerator(run)
    return fsdp2_prepare_model(acc, meta_model(run)), acc


def _local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if hasattr(t, "to_local") else t


def materialize(model) -> None:
    """FSDP2's meta-device initialisation: `to_empty`, the sharded parameters N(0, 0.02) (a real run then
    computes finite values; memory does not depend on them), the buffers (RoPE's inverse frequencies, built
    real) given their values back."""
    buffers = {name: b.clone() for name, b in model.named_buffers()}
    model.to_empty(device="cpu")
    with torch.no_grad():
        for p in model.parameters():
            _local(p).normal_(std=0.02)
        for name, b in model.named_buffers():
            b.copy_(buffers[name])
    model.train()


def fsdp_params(model) -> list:
    """Every unit's FSDPParams (torch 2.13 _fully_shard/_fsdp_param.py)."""
    from torch.distributed.fsdp import FSDPModule

    return [p for m in model.modules() if isinstance(m, FSDPModule)
            for g in m._get_fsdp_state()._fsdp_param_groups for p in g.fsdp_params]


def held_gradients(model) -> list[torch.Tensor]:
    """The unsharded gradients FSDP2 keeps between micro-batches under no_sync (module docstring)."""
    held = []
    for p in fsdp_params(model):
        unsharded = getattr(p, "_unsharded_param", None)
        for g in (p.unsharded_accumulated_grad, unsharded.grad if unsharded is not None else None):
            if g is not None:
                held.append(g)
    return held


def train_step(model, opt, acc, input_ids, run: Run, phase=lambda name: nullcontext()):
    m = run.accumulation
    for i in range(m):
        last = i == m - 1
        if last or i == 0:
            phase("forward" if last else "accumulate").__enter__()  # a mark: nothing to close
        if not last:
            model.set_requires_gradient_sync(False)  # accelerator.no_sync(model), FSDP2
        loss = model(input_ids=input_ids, labels=input_ids).loss / m
        if last:
            phase("backward").__enter__()
        loss.backward()
        del loss
        if not last:
            model.set_requires_gradient_sync(True)
    phase("optimizer").__enter__()
    acc._clip_grad_norm_dtensor_aware(list(model.parameters()), 1.0)
    opt.step()
    model.zero_grad()


def traced_step(run: Run, fake: bool = True, seed: int = 0):
    tracker = SubclassAwareTracker()
    torch.manual_seed(seed)
    fake_world(run.world)
    model, acc = wrap(run)  # on meta, outside fake mode
    held: set[int] = set()  # the unsharded gradients kept between micro-batches

    with fake_mode(fake), cuda_emulation(tracker), fsdp2_storage(tracker):
        materialize(model)
        opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-5, weight_decay=0.0,
                                fused=True)
        input_ids = torch.randint(0, model.config.vocab_size, (run.micro_batch_size, run.seq_len))

        def owners():
            params = {tracker.adopt(_local(p)) for p in model.parameters()}
            for t in (*model.buffers(), input_ids):
                tracker.adopt(t)
            return params, {tracker.adopt(_local(t)) for s in opt.state.values() for t in s.values()
                            if torch.is_tensor(t)}

        def step(phase):
            def marked(name):
                if name == "forward" and tracker.recording and run.accumulation > 1:
                    held.update(tracker.key(g) for g in held_gradients(model))
                return phase(name)

            train_step(model, opt, acc, input_ids, run, marked)

        category = log_second_step(
            tracker, step, owners,
            lambda: held | {tracker.key(_local(p.grad)) for p in model.parameters() if p.grad is not None})
    return tracker, category


def measure(run: Run, fake: bool = True, seed: int = 0) -> dict:
    """Bytes per category at each phase's peak of the second training step."""
    return phase_summary(*traced_step(run, fake, seed))
