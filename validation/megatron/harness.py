"""One pipeline rank of a Megatron-Core training run, measured one micro-batch at a time.

A single process plays one rank of a world of tp x cp x dp x pp ranks: torch's fake process
group (backend "fake", `FakeStore`) gives `parallel_state` every group with the right sizes and
no traffic. The rank's stage of `GPTModel` is built with the local layer spec (TE's fused
attention and norms emulated, see kernels.py), wrapped in Megatron's DDP (fp32 gradient buffer,
`main_grad`) and given Megatron's optimizer (the distributed optimizer where configured).

Measured, as Megatron's 1F1B schedule runs one micro-batch on this rank
(`pipeline_parallel/schedules.py`):
- input: the first stage embeds token ids; later stages receive the hidden states
  [s/cp (/tp with sequence parallelism), b, h] from the previous stage (`get_tensor_shapes`)
  and keep them until that micro-batch's backward;
- forward; on a non-last stage the output is sent and pseudo-freed
  (`deallocate_output_tensor`, `deallocate_pipeline_outputs=True` as Megatron-LM sets it);
  the last stage reduces the per-token losses with a loss mask as `pretrain_gpt.loss_func` does;
- backward: the last stage from its loss, other stages from a received output gradient
  (`custom_backward`); DDP's hooks add each weight gradient into the fp32 `main_grad` buffer.
Step 1 (forward, backward, optimizer step) creates the optimizer's states; step 2 is measured.
How many micro-batches are in flight at once is the pipeline schedule's business (our
estimator's pipeline model); the record holds one micro-batch's activations and the static
parts, so both can be compared.
"""

from __future__ import annotations

import contextlib
import gc
from dataclasses import dataclass, field

import torch
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from ..core.emulation import cuda_softmax_backward
from ..core.tracker import CATEGORIES, StorageTracker, category_of
from ..core.world import end_world, fake_world
from . import fused, kernels
from .shims import STORAGE_RESIZED, gloo_as_fake, megatron_shims


@dataclass(frozen=True)
class Arch:
    """A model's shape in Megatron's terms (`TransformerConfig` / Megatron-LM arguments)."""

    hidden_size: int
    num_layers: int
    num_attention_heads: int
    num_query_groups: int
    kv_channels: int
    ffn_hidden_size: int
    vocab_size: int
    swiglu: bool = True  # else GeLU
    normalization: str = "RMSNorm"
    add_bias_linear: bool = False
    add_qkv_bias: bool = False
    qk_layernorm: bool = False
    position_embedding: str = "rope"  # or "learned_absolute"
    max_position_embeddings: int = 4096
    untie_embeddings: bool = True
    num_experts: int | None = None
    moe_router_topk: int = 2
    moe_ffn_hidden_size: int | None = None
    moe_shared_expert_intermediate_size: int | None = None
    first_dense_layers: int = 0
    mla: tuple = ()  # (q_lora_rank or None, kv_lora_rank, qk_head_dim, qk_pos_emb_head_dim, v_head_dim)
    dsa: tuple = ()  # with mla: (index heads, index head dim, top-k): DeepSeek Sparse Attention (dsa_spec)


@dataclass(frozen=True)
class Setup:
    arch: Arch
    seq_len: int
    micro_batch_size: int = 1
    tp: int = 1
    pp: int = 1
    stage: str = "first"  # "first", "middle", "last" (with pp == 1, the only stage)
    layers: int | None = None  # layers built on this stage; None: num_layers / pp
    dp: int = 1
    cp: int = 1
    ep: int = 1
    etp: int | None = None
    sequence_parallel: bool | None = None  # None: on when tp > 1
    recompute: str = "none"  # "none", "full", "selective"
    recompute_method: str = "uniform"  # with "full": "uniform" or "block"
    recompute_num_layers: int = 1
    recompute_modules: tuple = ("core_attn",)  # with "selective"
    attention: str = "fused"  # "fused" (TE cuDNN attention, emulated) or "unfused" (local spec)
    dispatcher: str = "alltoall"  # MoE: "alltoall" or "allgather"
    grouped_gemm: bool = False
    capacity_factor: float = 1.0  # MoE: drop-and-pad to this capacity (static shapes)
    router_dtype: str | None = None  # MoE: "fp32" for --moe-router-dtype fp32
    distributed_optimizer: bool = True
    overlap_grad_reduce: bool = False
    overlap_param_gather: bool = False
    loss_fusion: bool = False  # --cross-entropy-loss-fusion
    ce_impl: str = "native"  # with loss_fusion: --cross-entropy-fusion-impl native or te (TE's kernel emulated)
    softmax_fusion: bool = False  # with attention "unfused": masked_softmax_fusion (needs the CUDA kernel)
    extra: dict = field(default_factory=dict, hash=False, compare=False)

    @property
    def sp(self) -> bool:
        return self.tp > 1 if self.sequence_parallel is None else self.sequence_parallel

    @property
    def stage_index(self) -> int:
        return {"first": 0, "middle": self.pp // 2, "last": self.pp - 1}[self.stage]

    @property
    def stage_layers(self) -> int:
        return self.layers if self.layers is not None else self.arch.num_layers // self.pp

    @property
    def world_size(self) -> int:
        return self.tp * self.cp * self.dp * self.pp


# --- the world ----------------------------------------------------------------------------------
@contextlib.contextmanager
def megatron_world(setup: Setup):
    """Initialise torch.distributed (fake) and Megatron's parallel_state as this rank sees them:
    rank order "tp-cp-ep-dp-pp" makes pipeline stage i start at rank i x tp x cp x dp."""
    from megatron.core import parallel_state as ps
    from megatron.core.tensor_parallel import random as mrandom

    fake_world(setup.world_size, rank=setup.stage_index * setup.tp * setup.cp * setup.dp)
    try:
        ps.initialize_model_parallel(
            tensor_model_parallel_size=setup.tp, pipeline_model_parallel_size=setup.pp,
            context_parallel_size=setup.cp, expert_model_parallel_size=setup.ep,
            expert_tensor_parallel_size=setup.etp or setup.tp)
        mrandom.model_parallel_cuda_manual_seed(1234)
        # the aux-loss log (moe_utils.py) is a process-wide global: one per measured run
        import megatron.core.transformer.moe.moe_utils as moe_utils

        moe_utils._MOE_LAYER_WISE_LOGGING_TRACKER = {}
        # so is the aux loss's backward scale (a class attribute made by the first backward that
        # needs it, MoEAuxLossAutoScaler.backward): one made under fake tensors would turn the next
        # run's aux-loss gradient, and the backward behind it, fake
        moe_utils.MoEAuxLossAutoScaler.main_loss_backward_scale = None
        yield
    finally:
        import megatron.core.transformer.moe.moe_utils as moe_utils

        moe_utils.MoEAuxLossAutoScaler.main_loss_backward_scale = None
        ps.destroy_model_parallel()
        end_world()


# --- the model ----------------------------------------------------------------------------------
def transformer_config(setup: Setup):
    from megatron.core.transformer.transformer_config import MLATransformerConfig, TransformerConfig

    a = setup.arch
    kwargs = dict(
        num_layers=setup.stage_layers * setup.pp, hidden_size=a.hidden_size,
        num_attention_heads=a.num_attention_heads, num_query_groups=a.num_query_groups,
        kv_channels=a.kv_channels, ffn_hidden_size=a.ffn_hidden_size,
        tensor_model_parallel_size=setup.tp, pipeline_model_parallel_size=setup.pp,
        context_parallel_size=setup.cp, expert_model_parallel_size=setup.ep,
        expert_tensor_parallel_size=setup.etp or setup.tp, sequence_parallel=setup.sp,
        bf16=True, params_dtype=torch.bfloat16, pipeline_dtype=torch.bfloat16,
        use_cpu_initialization=True, perform_initialization=False,
        normalization=a.normalization, gated_linear_unit=a.swiglu,
        activation_func=torch.nn.functional.silu if a.swiglu else torch.nn.functional.gelu,
        # Megatron-LM's defaults (arguments.py: --bias-gelu-fusion / --bias-swiglu-fusion on):
        # the fused activations are autograd Functions that keep only their input
        bias_activation_fusion=True, add_bias_linear=a.add_bias_linear,
        add_qkv_bias=a.add_qkv_bias, qk_layernorm=a.qk_layernorm,
        hidden_dropout=0.0, attention_dropout=0.0, masked_softmax_fusion=setup.softmax_fusion,
        # fused into the GEMM by apex/TE in production; needs their CUDA extension here
        gradient_accumulation_fusion=False, apply_rope_fusion=False,
        cross_entropy_loss_fusion=setup.loss_fusion, cross_entropy_fusion_impl=setup.ce_impl,
        deallocate_pipeline_outputs=True, variable_seq_lengths=False,
    )
    if setup.recompute == "full":
        kwargs.update(recompute_granularity="full", recompute_method=setup.recompute_method,
                      recompute_num_layers=setup.recompute_num_layers)
    elif setup.recompute == "selective":
        kwargs.update(recompute_granularity="selective", recompute_modules=list(setup.recompute_modules))
    if a.num_experts:
        kwargs.update(
            num_moe_experts=a.num_experts, moe_router_topk=a.moe_router_topk,
            moe_ffn_hidden_size=a.moe_ffn_hidden_size,
            moe_shared_expert_intermediate_size=a.moe_shared_expert_intermediate_size,
            moe_token_dispatcher_type=setup.dispatcher, moe_grouped_gemm=setup.grouped_gemm,
            moe_router_load_balancing_type="aux_loss", moe_aux_loss_coeff=1e-2,
            # dropless routing has data-dependent shapes (token counts per expert); drop-and-pad
            # gives every expert exactly its capacity, as a balanced router would
            moe_expert_capacity_factor=setup.capacity_factor, moe_pad_expert_input_to_capacity=True,
            moe_router_dtype=setup.router_dtype,
            moe_layer_freq=[0] * a.first_dense_layers + [1] * (a.num_layers - a.first_dense_layers)
            if a.first_dense_layers else 1,
        )
    kwargs.update(setup.extra)
    if a.dsa:
        # the KL loss is computed and attached whatever its coefficient; 0 skips its logging tracker, a CUDA
        # tensor the CPU run has no use for (dsa.py DSAttention.forward)
        kwargs.update(experimental_attention_variant="dsa", dsa_indexer_n_heads=a.dsa[0],
                      dsa_indexer_head_dim=a.dsa[1], dsa_indexer_topk=a.dsa[2], dsa_indexer_loss_coeff=0.0)
    if a.mla:
        q_lora, kv_lora, qk_dim, rope_dim, v_dim = a.mla
        return MLATransformerConfig(**kwargs, multi_latent_attention=True, q_lora_rank=q_lora,
                                    kv_lora_rank=kv_lora, qk_head_dim=qk_dim,
                                    qk_pos_emb_head_dim=rope_dim, v_head_dim=v_dim,
                                    rope_type="rope")
    return TransformerConfig(**kwargs)


def layer_spec(setup: Setup):
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec

    a = setup.arch
    spec = get_gpt_layer_local_spec(num_experts=a.num_experts, moe_grouped_gemm=setup.grouped_gemm,
                                    qk_layernorm=a.qk_layernorm, multi_latent_attention=bool(a.mla),
                                    normalization=a.normalization)
    _replace_norms(spec)
    if a.dsa:
        spec.submodules.self_attention.submodules.core_attention = dsa_spec()
    elif setup.attention == "fused":
        spec.submodules.self_attention.submodules.core_attention = kernels.fused_core_attention_class()
    return spec


def dsa_spec():
    """Megatron-Core 0.16.1's DSAttention and its DSAIndexer as get_dsa_module_spec_for_backend builds them
    (experimental_attention_variant_module_specs.py), with the local spec's pieces: the provider's `linear`
    (TE's, in "duplicated" mode) is kernels.DuplicatedLinear, the LayerNorm kernels.FusedNorm (TE's). The
    Hadamard rotation (fast_hadamard_transform, CUDA-only; its autograd Function keeps nothing) is the
    identity here (build_stage)."""
    from megatron.core.transformer.experimental_attention_variant.dsa import (
        DSAIndexer, DSAIndexerSubmodules, DSAttention, DSAttentionSubmodules)
    from megatron.core.transformer.spec_utils import ModuleSpec

    indexer = ModuleSpec(module=DSAIndexer, submodules=DSAIndexerSubmodules(
        linear_wq_b=kernels.DuplicatedLinear, linear_wk=kernels.DuplicatedLinear, k_norm=kernels.FusedNorm,
        linear_weights_proj=kernels.DuplicatedLinear))
    return ModuleSpec(module=DSAttention, submodules=DSAttentionSubmodules(indexer=indexer))


def _replace_norms(spec):
    """Every torch norm of the local spec becomes TE's fused norm (kernels.FusedNorm)."""
    from megatron.core.transformer.spec_utils import ModuleSpec
    from megatron.core.transformer.torch_norm import WrappedTorchNorm

    def walk(obj):
        if isinstance(obj, ModuleSpec):
            walk(obj.submodules)
            return
        if obj is None or isinstance(obj, type) or not hasattr(obj, "__dict__"):
            return
        for name in list(vars(obj)):
            value = getattr(obj, name)
            if value is WrappedTorchNorm:
                setattr(obj, name, kernels.FusedNorm)
            elif isinstance(value, ModuleSpec) and value.module is WrappedTorchNorm:
                setattr(obj, name, ModuleSpec(module=kernels.FusedNorm, params=value.params))
            else:
                walk(value)

    walk(spec)


def build_stage(setup: Setup):
    from megatron.core.models.gpt.gpt_model import GPTModel

    config = transformer_config(setup)
    first, last = setup.stage_index == 0, setup.stage_index == setup.pp - 1
    import megatron.core.transformer.transformer_block as block

    # the block's final norm is built from this module global (transformer_block.py,
    # _get_block_submodules); restored after the build
    saved = block.LayerNormImpl
    block.LayerNormImpl = kernels.FusedNorm
    a = setup.arch
    if a.dsa:
        import megatron.core.transformer.experimental_attention_variant.dsa as dsa
        dsa.rotate_activation = lambda x: x  # see dsa_spec
    model = GPTModel(config, layer_spec(setup), vocab_size=a.vocab_size,
                     max_sequence_length=max(a.max_position_embeddings, setup.seq_len),
                     pre_process=first, post_process=last,
                     share_embeddings_and_output_weights=not a.untie_embeddings,
                     position_embedding_type=a.position_embedding)
    block.LayerNormImpl = saved
    _as_float16_module(model)
    return model, config


def _as_float16_module(model) -> None:
    """Megatron-LM wraps the model in `Float16Module` (transformer/module.py), whose
    `module.bfloat16()` makes every parameter bf16, also those built in fp32 (the learned
    position table). Done on `.data`: fake parameters cannot be swapped by `Module._apply`."""
    for p in model.parameters():
        if p.dtype == torch.float32:
            p.data = p.data.to(torch.bfloat16)


def wrap(setup: Setup, model, config):
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer

    ddp_config = DistributedDataParallelConfig(
        grad_reduce_in_fp32=True, overlap_grad_reduce=setup.overlap_grad_reduce,
        overlap_param_gather=setup.overlap_param_gather,
        use_distributed_optimizer=setup.distributed_optimizer)
    ddp = DistributedDataParallel(config, ddp_config, model)
    opt_config = OptimizerConfig(
        optimizer="adam", lr=1e-4, bf16=True, params_dtype=torch.bfloat16, clip_grad=0.0,
        use_distributed_optimizer=setup.distributed_optimizer,
        overlap_param_gather=setup.overlap_param_gather)
    optimizer = get_megatron_optimizer(opt_config, [ddp])
    return ddp, optimizer


# --- one micro-batch ------------------------------------------------------------------------------
def stage_inputs(setup: Setup, model):
    """What this rank holds when its micro-batch starts: token ids (and labels on the last
    stage) from the data loader, hidden states received from the previous stage otherwise."""
    b, s = setup.micro_batch_size, setup.seq_len
    vocab = setup.arch.vocab_size
    inputs = {}
    if model.pre_process:
        inputs["input_ids"] = torch.randint(0, vocab, (b, s))
        inputs["position_ids"] = torch.arange(s).unsqueeze(0).expand(b, s).contiguous()
    else:
        s_local = s // setup.cp // (setup.tp if setup.sp else 1)
        inputs["received"] = torch.randn(s_local, b, setup.arch.hidden_size, dtype=torch.bfloat16,
                                         requires_grad=True)
    if model.post_process:
        inputs["labels"] = torch.randint(0, vocab, (b, s))
        inputs["loss_mask"] = torch.ones(b, s)
    return inputs


def forward(ddp, model, inputs):
    if "received" in inputs:
        model.set_input_tensor(inputs["received"])
    out = ddp(input_ids=inputs.get("input_ids"), position_ids=inputs.get("position_ids"),
              attention_mask=None, labels=inputs.get("labels"))
    if model.post_process:
        # pretrain_gpt.loss_func: losses.float() * loss_mask, summed
        loss_mask = inputs["loss_mask"]
        return torch.sum(out.float().view(-1) * loss_mask.view(-1)) / loss_mask.sum()
    return out


def backward(model, out):
    from megatron.core.pipeline_parallel.schedules import custom_backward, deallocate_output_tensor

    if model.post_process:
        # schedules.backward_step on the last stage: custom_backward(loss, None) (Megatron-LM sets
        # deallocate_pipeline_outputs), the C++ engine called directly; Tensor.backward would pass
        # through CudaToCpu's handler, where the mode is off, and full recompute's re-run forward
        # would lose the known MoE token counts (shims._KNOWN)
        custom_backward(out, None)
        return
    # schedules.forward_step / send_forward: the output's data is freed once sent; the backward
    # starts from the gradient received from the next stage
    shape = out.shape
    deallocate_output_tensor(out, deallocate_pipeline_outputs=True)
    grad = torch.randn(shape, dtype=out.dtype)
    custom_backward(out, grad)


def optimizer_step(ddp, optimizer):
    ddp.finish_grad_sync()
    optimizer.step()
    ddp.zero_grad_buffer()
    optimizer.zero_grad()


class RealOnly(TorchDispatchMode):
    """A real run's check: no op returns a fake tensor (a fake one left by an earlier fake run in
    a process-wide cache would turn the real run's backward fake from there on, unnoticed)."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if any(isinstance(t, FakeTensor) for t in tree_leaves(out)):
            raise RuntimeError(f"{func} returned a fake tensor in a real run")
        return out


@dataclass
class Trace:
    tracker: StorageTracker
    params: set
    grads: set
    states: set
    layer_marks: list  # (event index at a layer's forward start, at its end)

    def category(self, key):
        return category_of(key, self.params, self.grads, self.states)


def _layer_hooks(model, marks, tracker, armed):
    from megatron.core.transformer.transformer_layer import TransformerLayer

    handles = []
    for layer in model.modules():
        if isinstance(layer, TransformerLayer):
            def pre(module, args, kwargs=None):
                if armed[0]:
                    marks.append([len(tracker.events), None])

            def post(module, args, output):
                if armed[0]:
                    marks[-1][1] = len(tracker.events)

            handles.append(layer.register_forward_pre_hook(pre))
            handles.append(layer.register_forward_hook(post))
    return handles


def _state_keys(tracker, ddp, optimizer):
    params = {tracker.key(p) for p in ddp.module.parameters()}
    grads = {tracker.key(buffer.grad_data) for buffer in ddp.buffers + ddp.expert_parallel_buffers}
    states = set()
    for sub in getattr(optimizer, "chained_optimizers", [optimizer]):
        inner = sub.optimizer
        for group in inner.param_groups:
            for p in group["params"]:
                states.add(tracker.key(p))  # fp32 main (master) parameters
                for name, t in inner.state.get(p, {}).items():
                    if name == "step":  # torch Adam keeps its step counter on the host
                        tracker.ignore(t)
                    elif torch.is_tensor(t):
                        states.add(tracker.key(t))
    return params, grads - params, states - params


def traced_step(setup: Setup, fake: bool = True, seed: int = 0) -> Trace:
    tracker = StorageTracker()
    tracker.recording = False
    fused.EAGER_CALLS.clear()
    torch.manual_seed(seed)
    kernels.HIDDEN["context"] = tracker.hidden
    STORAGE_RESIZED["adopt"] = tracker.adopt
    marks: list = []
    armed = [False]
    mode = RealOnly()
    if fake:
        mode = FakeTensorMode(allow_non_fake_inputs=True)
        # the fake dispatch cache keeps the storages named in its keys alive (e.g. `aten.set_`
        # with a storage, as CheckpointWithoutOutput's recompute restores its outputs); a freed
        # storage must be freed for the tracker
        mode.cache_enabled = False
    try:
        # CUDA's softmax backward allocates a gradient-sized temporary the CPU kernel does not (emulation.py)
        with megatron_shims(), gloo_as_fake(), megatron_world(setup), mode, tracker, cuda_softmax_backward(tracker):
            model, config = build_stage(setup)
            ddp, optimizer = wrap(setup, model, config)
            _layer_hooks(model, marks, tracker, armed)
            inputs = stage_inputs(setup, model)
            backward(model, forward(ddp, model, inputs))  # step 1: creates the optimizer states
            optimizer_step(ddp, optimizer)
            del inputs
            gc.collect()
            inputs = stage_inputs(setup, model)
            tracker.start()
            params, grads, states = _state_keys(tracker, ddp, optimizer)
            armed[0] = True
            with tracker.phase("forward"):
                out = forward(ddp, model, inputs)
            armed[0] = False
            with tracker.phase("backward"):
                backward(model, out)
                del out
            with tracker.phase("after_backward"):
                pass
            tracker.stop()
    finally:
        kernels.HIDDEN["context"] = contextlib.nullcontext
        STORAGE_RESIZED["adopt"] = None
    if fused.EAGER_CALLS:  # a compiled function building an autograd graph: what it saves is not emulated
        calls = dict(fused.EAGER_CALLS)
        fused.EAGER_CALLS.clear()
        raise RuntimeError(f"jit_fuser functions ran eagerly under autograd (not emulated): {calls}")
    return Trace(tracker, params, grads, states, marks)


def _live_activations(trace: Trace, index: int) -> int:
    live = trace.tracker.live_at(index)
    return sum(size for key, size in live.items() if trace.category(key) == "activations")


def measure(setup: Setup, fake: bool = True, seed: int = 0) -> dict:
    """Bytes per category at each phase's peak of one micro-batch on this rank, what the
    forward leaves alive for the backward, and each layer's share of it."""
    trace = traced_step(setup, fake, seed)
    tracker = trace.tracker
    phases = {name: {c: p[c] for c in CATEGORIES} | {"total": p["total"]}
              for name, p in tracker.peaks(trace.category).items()}
    peak_phase = max(("forward", "backward"), key=lambda name: phases[name]["total"])
    peak = phases[peak_phase]
    start = tracker.marks[0][0]
    backward_start = dict((name, i) for i, name in tracker.marks)["backward"]
    at_start = _live_activations(trace, start)
    kept = _live_activations(trace, backward_start) - at_start
    layers = [_live_activations(trace, end) - _live_activations(trace, begin) for begin, end in trace.layer_marks]
    return {
        **{c: peak[c] for c in CATEGORIES}, "peak_bytes": peak["total"], "peak_phase": peak_phase,
        "phases": phases,
        "activations_at_start": at_start,  # the micro-batch's inputs and persistent buffers
        "activations_kept_by_forward": kept,  # alive when the backward starts, beyond the start
        "layer_kept_bytes": layers,  # per transformer layer: what its forward leaves alive
    }
