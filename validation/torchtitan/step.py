"""One measured training step of torchtitan 0.3.0, rank 0 of a fake world, as its Trainer runs it.

Built as `Trainer.__init__` builds it (torchtitan/trainer.py): the model config from the
family's `model_registry(flavor, converters=...)`, `update_from_config`, the model on the meta
device in `training.dtype` (fp32 by default), the family's `parallelize_fn` (TP, activation
checkpointing, FSDP2 with MixedPrecisionPolicy(bf16 params, fp32 reduce)), `to_empty`, the
loss (`ChunkedLossWrapper` over `CrossEntropyLoss`, 8 chunks, lm_head run by the loss), and the
optimizer container (`default_adamw`: AdamW, fused). Weight init is skipped (it reads values;
memory does not depend on it).

The step mirrors `Trainer.train_step` / `_forward_backward_body` without its logging (which
reads tensor values, impossible under fake tensors):
    optimizers.zero_grad(set_to_none=True)        # disable_cuda_graphs=True: eager run
    masks = model.get_attention_masks(positions)  # post_dataloading_process
    # with CP: prepare_context_parallel_input shards inputs, labels, positions and the block mask
    # along the sequence (head-tail load balancer, the default); the model's inner attention was
    # wrapped by apply_cp_to_forward (parallelize_fn): flex runs on K/V all-gathered over CP
    pred = model(inputs, positions=..., attention_masks=...)
    loss, _ = loss_fn(pred, labels, global_valid_tokens, positions=...)  # runs lm_head and
    del pred                                      # its backward chunk by chunk
    loss.backward()
    clip_grad_norm_(params, max_norm=1.0, foreach=True); optimizers.step(); lr_schedulers.step()
Phases: "forward" (model forward and the chunked loss, lm_head backward included),
"backward" (the decoder's backward), "optimizer" (clipping and the step).
Step 1 creates the optimizer states; step 2 is measured.
"""

from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass

import torch

from ..core.steps import fake_mode, log_second_step
from ..core.tracker import SubclassAwareTracker, phase_summary
from ..core.world import fake_world
from .shims import cpu_emulation, use_cpu_device

use_cpu_device()  # before any other torchtitan import: it reads the device type at import


@dataclass(frozen=True)
class Run:
    family: str  # "llama3", "qwen3", "deepseek_v3"
    flavor: str  # a key of the family's config registry ("8B", "debugmodel", ...)
    world: int  # ranks; FSDP degree = world / (tp * cp)
    seq_len: int
    local_batch: int = 1
    tp: int = 1
    cp: int = 1
    ac: str = "none"  # "none", "full", "op" (SelectiveAC), "layer" (full AC on every N-th block)
    ac_every: int = 1  # with "layer"
    float8: str = "none"  # "none", "rowwise", "tensorwise" (torchao recipe names)
    fp8_all_gather: bool = False  # with "tensorwise": FSDP2 gathers float8 weights (`_float8_all_gather`)
    reshard: str = "default"  # fsdp_reshard_after_forward: "default", "always", "never"
    layers: int | None = None  # keep only the first N blocks (tiny self-test models)
    shrink: dict | None = None  # tiny self-test models: model config fields to override


def _registry(family: str):
    import importlib

    return importlib.import_module(f"torchtitan.models.{family}").model_registry


def trainer_config(run: Run):
    """The Trainer.Config of the run: torchtitan's defaults plus the run's choices."""
    from torchtitan.components.loss import ChunkedLossWrapper, CrossEntropyLoss
    from torchtitan.components.optimizer import default_adamw
    from torchtitan.config import CompileConfig, ParallelismConfig, TrainingConfig
    from torchtitan.distributed.activation_checkpoint import FullAC, SelectiveAC
    from torchtitan.models.common.config_utils import decoder_vocab_size
    from torchtitan.trainer import Trainer

    converters = None
    if run.float8 != "none":
        from torchtitan.components.quantization import Float8LinearConverter

        # llama3_405b's choice (models/llama3/config_registry.py): keep lm_head in bf16
        converters = [Float8LinearConverter.Config(recipe_name=run.float8, filter_fqns=["lm_head"],
                                                   model_compile_enabled=False)]
    spec = _registry(run.family)(run.flavor, converters=converters)
    if run.layers is not None:
        spec.model.layers = spec.model.layers[:run.layers]
    # "layer": our own wrapper on every N-th block (`_every_nth_block`); torchtitan's own AC stays off,
    # else its FullAC would wrap every block again
    ac = {"none": None, "full": FullAC.Config(), "op": SelectiveAC.Config(), "layer": None}[run.ac]
    return Trainer.Config(
        model_spec=spec,
        loss=ChunkedLossWrapper.Config(
            loss_fn=CrossEntropyLoss.Config(global_vocab_size=decoder_vocab_size(spec))),
        optimizer=default_adamw(lr=3e-4),
        training=TrainingConfig(local_batch_size=run.local_batch, seq_len=run.seq_len,
                                disable_cuda_graphs=True),
        parallelism=ParallelismConfig(
            tensor_parallel_degree=run.tp, context_parallel_degree=run.cp,
            fsdp_reshard_after_forward=run.reshard,
            # the default "spmd_types" and "full_dtensor" fail with torch 2.13's fully_shard
            spmd_backend="partial_dtensor"),
        compile=CompileConfig(enable=False),
        activation_checkpoint=ac,
    )


def _every_nth_block(model, every: int) -> None:
    """Layer-level selective AC, which torchtitan 0.3.0 no longer offers: full AC on every
    `every`-th block only, as torchtitan <= 0.2 did (`ac_freq`: wrap when the running block
    count % ac_freq == 0, counting from 1; torchtitan/distributed/activation_checkpoint.py,
    `_apply_layer_sac`)."""
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper

    for i, (name, block) in enumerate(list(model.layers.named_children()), 1):
        if i % every == 0:
            model.layers.register_module(name, checkpoint_wrapper(block, preserve_rng_state=True))


def _float8_all_gather(model) -> None:
    """torchao's FSDP2 float8 all-gather, which torchtitan 0.3.0 no longer wires up (its
    Float8LinearConverter offers the rowwise recipes only and builds Float8Linear through __init__,
    never `Float8Linear.from_float`): set `enable_fsdp_float8_all_gather` in each float8 linear's
    config and wrap its weight in `WeightWithDynamicFloat8CastTensor`, exactly as `from_float` does
    (torchao/float8/float8_linear.py), before `fully_shard`. FSDP2 then calls the subclass's
    `fsdp_pre_all_gather` (cast the shard to float8 with a tensorwise scale from an all-reduced amax)
    and gathers the float8 data (torchao/float8/fsdp_utils.py)."""
    import dataclasses

    from torchao.float8.float8_linear import Float8Linear
    from torchao.float8.fsdp_utils import WeightWithDynamicFloat8CastTensor

    for m in model.modules():
        if isinstance(m, Float8Linear):
            m.config = dataclasses.replace(m.config, enable_fsdp_float8_all_gather=True)
            m.weight = torch.nn.Parameter(
                WeightWithDynamicFloat8CastTensor(m.weight, m.linear_mm_config,
                                                  m.config.cast_config_weight.target_dtype),
                requires_grad=m.weight.requires_grad)


def build(run: Run, fake: bool):
    """Model (parallelized, on CPU), loss, optimizers, lr schedulers, parallel dims."""
    from torchtitan.distributed import ParallelDims
    from torchtitan.distributed import utils as dist_utils
    from torchtitan.tools import utils

    config = trainer_config(run)
    fake_world(run.world)
    dims = ParallelDims.from_config(config.parallelism, run.world)
    dims.build_mesh()
    dist_utils.set_spmd_backend(config.parallelism.spmd_backend)
    spec = config.model_spec
    spec.model.update_from_config(config=config)
    if run.shrink:
        for k, v in run.shrink.items():
            setattr(spec.model, k, v)
    with torch.device("meta"), utils.set_default_dtype(torch.float32):  # training.dtype
        model = spec.model.build()
    if run.ac == "layer":
        _every_nth_block(model, run.ac_every)
    if run.fp8_all_gather:
        _float8_all_gather(model)
    # parallelize on meta, outside fake mode (DeviceMesh slicing is data dependent)
    model = spec.parallelize_fn(
        model, parallel_dims=dims, training=config.training, parallelism=config.parallelism,
        compile_config=config.compile, ac_config=config.activation_checkpoint, dump_folder="/tmp")
    loss_fn = config.loss.build(compile_config=config.compile)
    return config, dims, model, loss_fn


def materialize(config, dims, model, loss_fn):
    model.to_empty(device="cpu")
    model.train()
    loss_fn.set_lm_head(model.lm_head)
    model._skip_lm_head = True  # trainer.py: the ChunkedLossWrapper runs lm_head
    optimizers = config.optimizer.build(model_parts=[model])
    if config.model_spec.post_optimizer_build_fn is not None:
        config.model_spec.post_optimizer_build_fn(optimizers, [model], dims)
    schedulers = config.lr_scheduler.build(optimizers=optimizers, training_steps=config.training.steps)
    return optimizers, schedulers


def train_step(model, loss_fn, optimizers, schedulers, config, dims, batch,
               phase=lambda name: nullcontext()):
    from torchtitan.distributed import utils as dist_utils

    inputs, labels, positions = batch
    optimizers.zero_grad(set_to_none=config.training.disable_cuda_graphs)
    with phase("forward"):
        valid = (labels != -100).sum()
        if dims.dp_enabled:
            valid = dist_utils.dist_sum_tensor(valid, dims.get_mesh("batch"))
        masks = model.get_attention_masks(positions=positions)
        if dims.cp_enabled:  # trainer.py post_dataloading_process: shard after building the masks
            from torchtitan.distributed.context_parallel import prepare_context_parallel_input

            inputs, labels, extra = prepare_context_parallel_input(
                inputs, labels, {"positions": positions, "attention_masks": masks},
                dims.get_mesh("cp"), torch.device("cpu"),
                config.parallelism.context_parallel_load_balancer,
                config.parallelism.context_parallel_ptrr_mask_key)
            positions, masks = extra["positions"], extra["attention_masks"]
        pred = model(inputs, positions=positions, attention_masks=masks)
        loss, _ = loss_fn(pred, labels, valid, positions=positions)
        del pred
    with phase("backward"):
        loss.backward()
        del loss
    with phase("optimizer"):
        dist_utils.clip_grad_norm_([p for p in model.parameters()], config.training.max_norm,
                                   foreach=True, pp_mesh=None, ep_enabled=dims.ep_enabled)
        optimizers.step()
        schedulers.step()


def _local(t):
    """The plain tensor that holds the data: a DTensor's local tensor, and inside torchao's
    WeightWithDynamicFloat8CastTensor (float8 all-gather) the wrapped fp32 shard, `_tensor`."""
    t = t.to_local() if hasattr(t, "to_local") else t
    from torch.utils._python_dispatch import is_traceable_wrapper_subclass

    while is_traceable_wrapper_subclass(t) and type(t).__name__ == "WeightWithDynamicFloat8CastTensor":
        t = t._tensor
    return t


def traced_step(run: Run, fake: bool = True, seed: int = 0):
    tracker = SubclassAwareTracker()
    torch.manual_seed(seed)
    with cpu_emulation(tracker):
        config, dims, model, loss_fn = build(run, fake)  # on meta, outside fake mode
        with fake_mode(fake):
            optimizers, schedulers = materialize(config, dims, model, loss_fn)
            vocab = config.model_spec.model.vocab_size
            shape = (run.local_batch, run.seq_len)
            batch = (torch.randint(0, vocab, shape), torch.randint(0, vocab, shape),
                     torch.arange(run.seq_len).repeat(run.local_batch, 1))

            def owners():
                params = {tracker.adopt(_local(p)) for p in model.parameters()}
                for t in (*model.buffers(), *batch):
                    tracker.adopt(t)
                # fused AdamW keeps its `step` on the device (torch/optim/adamw.py)
                return params, {tracker.adopt(_local(t)) for opt in optimizers.optimizers
                                for state in opt.state.values() for t in state.values() if torch.is_tensor(t)}

            category = log_second_step(
                tracker, lambda phase: train_step(model, loss_fn, optimizers, schedulers, config, dims, batch, phase),
                owners, lambda: {tracker.key(_local(p.grad)) for p in model.parameters() if p.grad is not None})
    return tracker, category


def measure(run: Run, fake: bool = True, seed: int = 0) -> dict:
    """Bytes per category at each phase's peak of the second training step."""
    return phase_summary(*traced_step(run, fake, seed))
