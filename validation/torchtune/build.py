"""A torchtune model, optimizer and loss as recipes/full_finetune_single_device.py (torchtune
0.6.1) sets them up, or lora_finetune_single_device.py for LoRA / QLoRA, without allocating the
weights for real.

The recipe instantiates the model on the GPU under `training.set_default_dtype(bf16)`. Here it is
instantiated on the meta device; RoPE's buffers (`theta` and the cos/sin `cache` of
max_seq_len x head_dim/2 x 2 fp32, Qwen2's max_seq_len x 2 head_dim, which the recipe keeps on the
GPU; one module shared by every layer, but one per layer in lora_qwen2) are then computed for real
on the CPU: Llama 3.1's scaled RoPE reads the frequencies' values, which fake tensors do not have.
`validation.core.meta.materialize` then gives the parameters (fake or real) CPU storage.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial

import torch

from ..core.meta import materialize
from ..core.world import fake_world
from .models import TUNE_MODELS


@dataclass(frozen=True)
class TuneRun:
    model: str  # a key of TUNE_MODELS
    seq_len: int
    batch_size: int = 1
    activation_checkpointing: bool = False  # enable_activation_checkpointing
    activation_offloading: bool = False  # enable_activation_offloading
    loss: str = "standard"  # "standard" (nn.CrossEntropyLoss on fp32 logits) or "chunked"
    optimizer: str = "adamw"  # "adamw" (torch AdamW, fused) or "adamw8bit" (torchao)
    optimizer_in_bwd: bool = False
    method: str = "full"  # "full", "lora" or "qlora" (lora_finetune_single_device)
    world: int = 1  # > 1: lora_finetune_distributed on rank 0 of a fake process group (FSDP2, `shard`)


# recipes/configs/llama3_1/8B_lora_single_device.yaml and 8B_qlora_single_device.yaml
LORA = dict(lora_attn_modules=["q_proj", "v_proj", "output_proj"], apply_lora_to_mlp=True,
            apply_lora_to_output=False, lora_rank=8, lora_alpha=16, lora_dropout=0.0)


def meta_model(run: TuneRun):
    """The model on meta with real RoPE buffers, AC applied as the recipe applies it."""
    from torchtune import modules, training
    from torchtune.modules.peft import get_adapter_params, set_trainable_params

    lora = None if run.method == "full" else dict(LORA, quantize_base=run.method == "qlora")
    with training.set_default_dtype(torch.bfloat16), torch.device("meta"):
        model = TUNE_MODELS[run.model].build(lora)
    if lora is not None:  # recipe: only the adapters train
        set_trainable_params(model, get_adapter_params(model))
    for module in model.modules():
        if hasattr(module, "rope_init"):
            with torch.device("cpu"):
                module.rope_init()
    if run.activation_checkpointing:
        # recipe: set_activation_checkpointing(model, auto_wrap_policy={TransformerSelfAttentionLayer})
        training.set_activation_checkpointing(model, auto_wrap_policy={modules.TransformerSelfAttentionLayer})
    return model


def shard(model, run: TuneRun) -> None:
    """recipes/lora_finetune_distributed.py (torchtune 0.6.1) _setup_model: on the meta device,
    `training.shard_model` applies FSDP2's fully_shard to every TransformerSelfAttentionLayer
    (`get_shard_conditions` without custom_sharded_layers) and to the model, resharding after forward
    (fsdp_reshard_after_forward: True, its configs' default); no mixed-precision policy, so the bf16
    parameters are gathered and their gradients reduced in bf16. NF4 shards gather as NF4 (torchao's
    NF4Tensor.fsdp_pre_all_gather / fsdp_post_all_gather)."""
    from torchtune import training

    fake_world(run.world)
    training.shard_model(model=model, shard_conditions=[partial(training.get_shard_conditions,
                                                                names_to_match=None)],
                         cpu_offload=False, reshard_after_forward=True)


def materialize_sharded(model) -> None:
    """The distributed recipe's loading, with zeros for the checkpoint: the adapters `to_empty` and
    initialised (`initialize_parameters`), then the base weights through
    `training.load_from_full_model_state_dict`, which quantizes a full NF4 weight and keeps this
    rank's chunk (its NF4 path) or distributes the bf16 ones (`set_model_state_dict`)."""
    from torchtune import training

    for m in model.modules():
        if hasattr(m, "adapter_params") and hasattr(m, "initialize_parameters"):  # the recipe's AdapterModule
            m.to_empty(device="cpu")
            m.initialize_parameters()
    full = {k: torch.zeros(v.shape, dtype=torch.bfloat16) for k, v in model.state_dict().items() if "lora_" not in k}
    training.load_from_full_model_state_dict(model, full, torch.device("cpu"), strict=False)


def loss_function(run: TuneRun):
    from torchtune.modules.loss import CEWithChunkedOutputLoss

    # the recipes' configs: CEWithChunkedOutputLoss (8 chunks, its default), or the plain
    # torch.nn.CrossEntropyLoss of older configs
    return CEWithChunkedOutputLoss() if run.loss == "chunked" else torch.nn.CrossEntropyLoss()


def make_optimizer(run: TuneRun, params):
    if run.optimizer == "adamw8bit":
        from torchao.prototype.low_bit_optim import AdamW8bit

        return AdamW8bit(params, lr=2e-5)
    # recipes/configs/llama3_1/8B_full.yaml (and 8B_lora_single_device.yaml): torch.optim.AdamW,
    # fused: True
    return torch.optim.AdamW(params, lr=2e-5, fused=True)


def materialize_nf4(model) -> None:
    """QLoRA's frozen NF4 weights (torchtune LoRALinear / FrozenNF4Linear with quantize_base)
    were quantized on meta: quantize a fresh bf16 tensor of the same shape instead."""
    from ..core.nf4 import nf4_class, to_nf4

    for module in model.modules():
        for name, p in list(module._parameters.items()):
            if isinstance(p, nf4_class()) and p.is_meta:
                with torch.no_grad():
                    weight = torch.empty(p.shape, dtype=torch.bfloat16, device="cpu").normal_(std=0.02)
                module._parameters[name] = torch.nn.Parameter(to_nf4(weight), requires_grad=False)


def own_buffers(model) -> None:
    """Copy the buffers computed for real into the current mode: under FakeTensorMode a real
    buffer is a constant that every op converts anew, so a view of it (the RoPE cache slice the
    attention saves) would get a storage of its own instead of sharing the buffer's."""
    for module in model.modules():
        for name, b in list(module._buffers.items()):
            if b is not None:
                module._buffers[name] = b.clone()


def setup(model, run: TuneRun, on_grad=None):
    """Storage for the meta model, then the optimizer (or per-parameter optimizers stepped in the
    backward), the loss and the activation-offloading context, as the recipe's setup does.
    `on_grad(param)` runs as each gradient is accumulated, before an in-backward step frees it."""
    from torchtune import training

    if run.world > 1:
        materialize_sharded(model)
    else:
        materialize_nf4(model)
        materialize(model)
    own_buffers(model)
    model.train()
    if on_grad is not None:
        for p in model.parameters():
            if p.requires_grad:
                p.register_post_accumulate_grad_hook(on_grad)
    # the full recipe hands every parameter to the optimizer; so does the LoRA recipe, whose
    # frozen ones never get a gradient, hence no state
    params = [p for p in model.parameters() if p.requires_grad or run.method != "full"]
    if run.optimizer_in_bwd:
        # recipe _setup_optimizer: one optimizer per parameter, stepped and zeroed by a
        # post-accumulate-grad hook (training.register_optim_in_bwd_hooks)
        optim_dict = {p: make_optimizer(run, [p]) for p in params}
        training.register_optim_in_bwd_hooks(model=model, optim_dict=optim_dict)
        optimizer = None
        states_of = lambda: [s for o in optim_dict.values() for s in o.state.values()]  # noqa: E731
    else:
        optimizer = make_optimizer(run, params)
        states_of = lambda: list(optimizer.state.values())  # noqa: E731
    loss_fn = loss_function(run)
    if run.loss == "chunked":
        model.set_num_output_chunks(loss_fn.num_output_chunks)
    offload = training.get_act_offloading_ctx_manager(model, run.activation_offloading)
    return optimizer, states_of, loss_fn, offload
