"""A stage's transients and persistent buffers: what it holds beside its model states and activations.

FSDP's and ZeRO's gathered parameters and reduction buckets, DDP's gradient buckets, the
frameworks' persistent buffers (torchtune's and torchtitan's RoPE caches, Megatron's global
memory buffer), autocast's weight copies and the optimizer step's temporaries (with the optimizer
in backward, one parameter's step), sorted by the phase that holds them (`Transients`); the
estimate takes each phase's largest moment (memory.py). Sources: the PyTorch FSDP2 and DDP docs,
DeepSpeed's ZeRO config defaults, torch.optim's foreach AdamW, torchtune v0.6.1 and torchtitan
v0.3.0, each cited where used.
"""

from __future__ import annotations

from typing import NamedTuple

from .activations.moe import MEGATRON_GLOBAL_BUFFER, global_memory_buffer
from .pipeline import microbatches
from .pp_buffers import pipelining_buffers
from .adapters import Inventory, adapter_dtype, saved_copy_bytes
from ..spec.architecture import Architecture
from .backward_moments import FSDP2_RS_SOURCE, titan_full_ac
from .components import Component, component
from .deepspeed_noncontiguous import contiguous
from .deepspeed_offload import gpu_buffer as deepspeed_gpu_buffer
from .deepspeed_step import (FOREACH_DENOM_SOURCE, DeepSpeedBuffers, deepspeed_settings,
                             runs_foreach as deepspeed_foreach,
                             step_transients, zero3_whole_gradient)
from ..spec.dtypes import bytes_per_element
from ..spec.optimizers import FOREACH_FRAMEWORKS, FOREACH_SQRT, LARGEST_TENSOR, MEGATRON_TORCH_ADAMW_SOURCE, \
    OPTIMIZERS, megatron_torch_adamw, step_scratch
from ..spec.parallel import Parallel
from .sharding import StageParameters
from .states import fsdp2_gathered_block_bytes, untrained
from .hf_fsdp2 import forward_gathered, no_sync_gradients
from .megatron_fsdp import PREFETCH_ELEMENTS, PREFETCH_SOURCE, backward_gathered_elements
from .titan_releases import SOURCES as TITAN_SOURCES, titan_rules
from ..spec.choices import FSDP_FRAMEWORKS
from ..spec.training import Recipe, Training
from ..spec.versions import TORCH_FOREACH_ADD_IN_PLACE, torch_release
from .zero3_replay import SOURCE as ZERO3_REPLAY_SOURCE
from .zero3_trace import SOURCE as TRACE_SOURCE, gathered_elements


class Transients(NamedTuple):
    forward: list[Component]
    backward: list[Component]
    optimizer: list[Component]
    persistent: list[Component]  # allocated once and kept (DDP buckets)
    step_in_backward: list[Component]  # a moment of backward when the optimizer steps there
    # a moment of forward of its own, not beside the loss's: the end of the model's forward (torchtune's
    # FSDP2 root unit gathered for the output projection, resharded before the loss runs)
    forward_end: list[Component] = []
    # a moment of backward after the loss's tensors are freed: the largest tensor stepped in backward with its
    # compiled step's scratch (torchao's AdamW8bit), once its gradient is whole
    step_after_loss: list[Component] = []


def transients(arch: Architecture, training: Training, recipe: Recipe, par: Parallel, stage: StageParameters,
               zero: int, inv: Inventory | None) -> Transients:
    """`inv`: an adapter run's parameter inventory of the stage (adapters.inventory), else None."""
    fw, P = training.framework, bytes_per_element(recipe.param_dtype)
    G = bytes_per_element(recipe.grad_dtype)
    fwd: list[Component] = []
    bwd: list[Component] = []
    layer = stage.largest_layer_local
    d_dense = par.dp * par.cp
    # what has gradients, buckets and optimizer steps: every parameter, or an adapter run's trainable ones
    trainable = inv.trainable if inv else stage.local
    if not inv:  # a frozen vision encoder and HF's indexers step nothing (states.untrained)
        trainable -= untrained(stage, training).dense
    largest = inv.largest if inv else stage.total.largest_tensor
    layer_trainable = trainable / max(1, stage.num_layers) if training.adapter else layer
    forward_end: list[Component] = []
    if fw in ("megatron", *FSDP_FRAMEWORKS) and zero >= 2 and d_dense > 1:
        fwd, bwd, forward_end = _gathered_parameters(arch, training, recipe, par, stage, zero, inv, P, layer)
        bwd += [] if fw == "hf_fsdp2" else [_unit_gradients(training, recipe, par, stage, P, G, layer, layer_trainable)]
    b_fwd, b_bwd, opt, persistent = _framework_buffers(arch, training, recipe, par, stage, zero, inv, trainable,
                                                       d_dense, G)
    fwd += b_fwd
    bwd += b_bwd
    if recipe.autocast_weight_copies:
        autocast_fwd, autocast_bwd = _autocast_copies(training, recipe, stage, layer)
        fwd.append(autocast_fwd)
        bwd.append(autocast_bwd)
    if training.optimizer_in_backward:
        return Transients(fwd, bwd, opt, persistent, [_step_in_backward(training, recipe, stage, zero, d_dense)],
                          forward_end, _scratch_in_backward(training, recipe, stage, zero, d_dense))
    opt.extend(_step_temporaries(training, recipe, stage, zero, d_dense, trainable, largest, inv))
    return Transients(fwd, bwd, opt, persistent, [], forward_end, zero3_whole_gradient(arch, training, zero, largest, G))


SHARDED_SOURCE = "PyTorch FSDP2 fully_shard docs (all-gather prefetch, reduce-scatter); torchtitan; Megatron-FSDP"


def _titan_gathered(arch: Architecture, training: Training, par: Parallel, stage: StageParameters, P: float,
                    layer: float) -> tuple[list[Component], list[Component]]:
    """(forward's, backward's) gathered parameters of FSDP2's units (ZeRO-3)."""
    fw, src = training.framework, SHARDED_SOURCE
    fwd: list[Component] = []
    bwd: list[Component] = []
    # torchtitan's units (distributed/fsdp.py): each block, the embedding, and the final norm
    # with the head, which is not resharded after forward: forward ends with the head and a
    # block gathered, backward starts with a block and the one prefetched
    head = arch.hidden_size * arch.vocab_size / par.tp if stage.last else 0.0
    Pb, pb = fsdp2_gathered_block_bytes(training, P, stage)  # fp8_all_gather: float8 linear weights
    root_unit = fw == "fsdp2" and titan_rules(training).root_unit_has_embedding_and_head
    if root_unit:
        fwd_root, bwd_root = _titan_root_unit(arch, par, stage, P, Pb, pb, layer)
        fwd.append(fwd_root)
        bwd.append(bwd_root)
    elif head and fw == "fsdp2" and training.loss == "chunked":
        # torchtitan's ChunkedLossWrapper runs the head after the model's forward, every block
        # resharded by then (reshard_after_forward): its moments hold the head unit alone
        fwd.append(component("transient", "Unsharded parameters in flight", P * head,
                             f"{P:g} B x the head unit unsharded (the blocks resharded after their forward)",
                             src + " (distributed/fsdp.py units); torchtitan v0.3.0 components/loss.py "
                             "ChunkedLossWrapper (lm_head.unshard(), kept across the chunks)"))
    else:
        fwd.append(component("transient", "Unsharded parameters in flight",
                             Pb * layer + max(Pb * layer, P * head),
                             f"{pb} x a block + " + (f"{P:g} B x the head unit" if head else
                                                     f"{pb} x the next block") + " unsharded",
                             src + " (distributed/fsdp.py units)"))
    if not root_unit:
        bwd.append(component("transient", "Unsharded parameters in flight", Pb * 2 * layer,
                             f"{pb} x (a block + the prefetched block) unsharded", src))
    return fwd, bwd


def _gathered_parameters(arch: Architecture, training: Training, recipe: Recipe, par: Parallel,
                         stage: StageParameters, zero: int, inv: Inventory | None, P: float,
                         layer: float) -> tuple[list[Component], list[Component], list[Component]]:
    """(forward's, backward's, the end of forward's) parameters gathered in flight by a sharded run."""
    fw, src = training.framework, SHARDED_SOURCE
    fwd: list[Component] = []
    bwd: list[Component] = []
    forward_end: list[Component] = []
    if zero == 3 and fw == "hf_fsdp2":  # the layers' units are charged at their backward (hf_fsdp2.block_moment)
        fwd = forward_gathered(arch, training, recipe, stage, layer)
    elif zero == 3 and fw == "torchtune":
        forward_end, gathered_bwd = _torchtune_gathered(arch, training, recipe, par, stage, inv, P)
        bwd.append(gathered_bwd)
    elif zero == 3 and fw in FSDP_FRAMEWORKS:
        fwd, bwd = _titan_gathered(arch, training, par, stage, P, layer)
    elif zero == 3:  # Megatron-FSDP: forward ends with its blocks released; backward prefetches (megatron_fsdp)
        gathered = P * (2 * layer + stage.root_local)
        formula = f"{P:g} B x (2 layers in flight + embedding/head root unit) unsharded"
        fwd.append(component("transient", "Unsharded parameters in flight", gathered, formula, src))
        elements, units = backward_gathered_elements(stage)
        bwd.append(component("transient", "Unsharded parameters in flight", P * elements,
                             f"{P:g} B x ({units} of {stage.num_layers} layers: the one in backward and those "
                             f"prefetched up to {PREFETCH_ELEMENTS:,} elements + the root unit) unsharded",
                             PREFETCH_SOURCE))
    else:  # reshard_after_forward=False: every unit stays gathered from forward to backward
        Pb, pb = fsdp2_gathered_block_bytes(training, P, stage)  # fp8_all_gather: float8 linear weights
        gathered = Pb * (stage.dense_local - stage.root_local) + P * stage.root_local
        formula = (f"{P:g} B x all of the stage's parameters, gathered after forward" if Pb == P else
                   f"{pb} x the blocks' + {P:g} B x the root unit's parameters, gathered after forward")
        fwd.append(component("transient", "Unsharded parameters in flight", gathered, formula, src))
        bwd.append(component("transient", "Unsharded parameters in flight", gathered, formula, src))
    return fwd, bwd, forward_end


def _unit_gradients(training: Training, recipe: Recipe, par: Parallel, stage: StageParameters, P: float, G: float,
                    layer: float, layer_trainable: float) -> Component:
    """Backward's unsharded gradients of one unit before its reduce-scatter, in a sharded run."""
    fw, src = training.framework, SHARDED_SOURCE
    if titan_full_ac(training) and not training.adapter and not (fw == "fsdp2" and par.pp > 1):
        # the moment that matters is a block's recomputation: its own gradients do not exist yet, the
        # previous block's reduce-scatter input does (`backward_moments.block_backward_extras`)
        return component("transient", "Reduce-scatter input of the previous block (kept by FSDP2)",
                         layer * G, f"{G:g} B x one layer's parameters", FSDP2_RS_SOURCE)
    if training.adapter:
        # frozen weights get no gradient: a unit's unsharded gradients are its adapters' (in their dtype)
        # with the reduce-scatter input (in the gradients' dtype)
        A = bytes_per_element(adapter_dtype(training, recipe))
        return component("transient", "Unsharded gradients of one unit (and the reduce-scatter input)",
                         layer_trainable * (A + G), f"({A:g} + {G:g}) B x one layer's trainable parameters "
                         "(the frozen base gets none)", src + "; " + FSDP2_RS_SOURCE)
    if fw == "fsdp2" and par.pp > 1:
        return _pipelined_fsdp2_gradients(stage, P, G, layer)
    return component("transient", "Unsharded gradients of one unit (and the reduce-scatter input)",
                     layer * P + layer_trainable * G,
                     f"({P:g} + {G:g}) B x one layer's parameters" if not training.adapter else
                     f"{P:g} B x one layer's parameters + {G:g} B x its trainable ones", src)


def _framework_buffers(arch: Architecture, training: Training, recipe: Recipe, par: Parallel,
                       stage: StageParameters, zero: int, inv: Inventory | None, trainable: float, d_dense: int,
                       G: float) -> tuple[list[Component], list[Component], list[Component], list[Component]]:
    """(forward's, backward's, the step's transients, the persistent buffers) a framework keeps of its own:
    FSDP1's and DeepSpeed's buckets, DDP's, the RoPE caches, Megatron's global buffer, pipelining's."""
    fw = training.framework
    fwd: list[Component] = []
    bwd: list[Component] = []
    opt: list[Component] = []
    persistent: list[Component] = []
    if fw == "fsdp1":
        from .fsdp1 import transients as fsdp1_transients
        f1, b1 = fsdp1_transients(training, par, recipe, stage, microbatches(training, par), inv)
        fwd += f1
        bwd += b1
    if fw == "hf_fsdp2":  # no_sync's unsharded gradients, through forward and backward
        held = no_sync_gradients(training, recipe, trainable, microbatches(training, par))
        fwd, bwd = fwd + held, bwd + held
    if fw == "deepspeed":
        b_fwd, b_bwd, b_persistent = deepspeed_buffers(arch, training, recipe, stage, zero, trainable, d_dense,
                                                       microbatches(training, par))
        fwd += b_fwd
        bwd += b_bwd
        persistent += b_persistent + deepspeed_gpu_buffer(arch, training, recipe, stage, zero, par)
        if zero >= 1 and recipe.master_weights:  # the step's fp32 gradient, sub-group by sub-group (ZeRO-3)
            whole = inv is None and not untrained(stage, training).dense
            opt += step_transients(arch, training, stage, zero, trainable / d_dense, d_dense, G, whole)
    if fw == "hf" and d_dense > 1:
        persistent.append(component(
            "buckets", "DDP gradient buckets", trainable * G,
            f"{G:g} B x {'trainable ' if training.adapter else ''}params (gradient_as_bucket_view=False)",
            "PyTorch DistributedDataParallel docs: gradient_as_bucket_view saves memory equal to the gradients"))
    if fw == "torchtune" and arch.position_embedding == "rope" and not arch.uses_mla:
        persistent.append(_torchtune_rope_cache(arch, training, stage))
    if fw == "megatron" and training.mode == "training":
        moe = any(kind == "moe" and n for kind, n in stage.kind_counts)
        persistent += [component("buffers", e.name, e.bytes(par), e.shown_formula(par), MEGATRON_GLOBAL_BUFFER)
                       for e in global_memory_buffer(arch, training, par, moe)]
    if fw == "fsdp2" and arch.position_embedding == "rope" and stage.num_layers:
        rules = titan_rules(training)
        persistent.append(_torchtitan_rope_caches(arch, training, stage) if rules.rope == "per layer" else
                          _torchtitan_model_rope(arch, training, par, stage, rules.cp_rope_clone))
    if fw == "fsdp2" and par.pp > 1:
        persistent += pipelining_buffers(arch, training, par, stage, microbatches(training, par))
    return fwd, bwd, opt, persistent


def _autocast_copies(training: Training, recipe: Recipe, stage: StageParameters,
                     layer: float) -> tuple[Component, Component]:
    """(forward's, backward's) cached autocast copies of the weights."""
    matrices = stage.total.matrices
    cb = bytes_per_element(recipe.compute_dtype)
    src = "PyTorch autocast: casts of leaf weights are cached until the autocast region exits and kept for backward"
    in_bwd = matrices * cb if training.recompute != "full" else layer * cb
    return (component("transient", "Autocast copies of the weights", matrices * cb,
                      f"{cb:g} B x matrix parameters", src),
            component("transient", "Autocast copies of the weights", in_bwd,
                      f"{cb:g} B x matrix parameters" if training.recompute != "full" else
                      f"{cb:g} B x one recomputed layer", src))



TORCHTUNE_FSDP_SOURCE = (
    "torchtune 0.6.1 training.shard_model (fully_shard on every TransformerSelfAttentionLayer and on the model, "
    "reshard_after_forward True) and recipes/lora_finetune_distributed.py (the loss runs after the model's forward); "
    "torchao 0.10 NF4Tensor.fsdp_pre_all_gather (an NF4 shard gathers its codes, int8 scales and bf16 factors); "
    "measured: tests/data/measured/torchtune/*-w*")


def _torchtune_gathered(arch: Architecture, training: Training, recipe: Recipe, par: Parallel,
                        stage: StageParameters, inv: Inventory | None, P: float) -> tuple[list[Component], Component]:
    """torchtune's FSDP2 units: every layer, and the root (embedding, final norm, output). The root is
    resharded at the end of the model's forward, so the loss, which runs after it, sees no gathered
    parameter: the root unit gathered is a moment of its own (the output projection's). In backward a
    layer and the prefetched one are gathered, in their storage dtype: an NF4 shard gathers as NF4."""
    unit, text = gathered_layer_bytes(training, recipe, stage, inv, P)
    end = [component("transient", "Unsharded parameters in flight (the root unit, for the output projection)",
                     P * stage.root_local, f"{P:g} B x the embedding, final norm and output unsharded (the blocks "
                     "resharded after their forward)", TORCHTUNE_FSDP_SOURCE)] if stage.last else []
    return end, component("transient", "Unsharded parameters in flight", 2 * unit,
                          f"2 x ({text}): a block and the prefetched block", TORCHTUNE_FSDP_SOURCE)


def gathered_layer_bytes(training: Training, recipe: Recipe, stage: StageParameters, inv: Inventory | None,
                         P: float) -> tuple[float, str]:
    """One unsharded layer unit's bytes: its parameters in the weights dtype, or an adapter run's frozen
    base in its storage (NF4 codes, int8 scales and bf16 factors: what torchao's NF4 all-gather moves) and
    its adapters in theirs."""
    layers = max(1, stage.num_layers)
    if inv is None:
        return P * stage.largest_layer_local, f"{P:g} B x one layer's parameters"
    A = bytes_per_element(adapter_dtype(training, recipe))
    frozen = (inv.frozen_bytes - P * stage.root_local) / layers
    return frozen + A * inv.adapters / layers, (f"{frozen / 2**20:,.1f} MiB of one layer's frozen base in its storage "
                                                f"+ {A:g} B x its adapters")


DEEPSPEED_SOURCE = ("DeepSpeed v0.19.5 runtime/zero/config.py (reduce_bucket_size 5e8, stage3_prefetch_bucket_size 5e7, "
                    "stage3_max_live_parameters 1e9, stage3_param_persistence_threshold 1e5, sub_group_size 1e9, "
                    "contiguous_gradients true, overlap_comm true under stage 3 only: overlap_comm_valid); "
                    "transformers integrations/deepspeed.py trainer_config_finalize ('auto': h x h, int(0.9 h x h), "
                    "10 h)")
# DeepSpeed's ZeRO-1/2 allocates its gradient bucket in full when the first gradient of a backward is
# ready (stage_1_and_2.py setup_buckets: torch.empty(reduce_bucket_size) in the parameters' 16-bit dtype,
# a second one with overlap_comm, one per communication dtype) and frees it at the end of the backward
# (_release_ipg_buffers); ZeRO-3 allocates its one at initialisation and keeps it (stage3.py __init__ "IPG")
ZERO12_BUCKET_SOURCE = "DeepSpeed v0.19.5 runtime/zero/stage_1_and_2.py setup_buckets, _release_ipg_buffers"
ZERO3_BUCKET_SOURCE = "DeepSpeed v0.19.5 runtime/zero/stage3.py __init__ (IPG bucket.buffer, contiguous_gradients)"
# without ZeRO the engine reduces flattened gradients in buffers of a fixed size, not reduce_bucket_size
# (engine.py allreduce_gradients(bucket_size=MEMORY_OPT_ALLREDUCE_SIZE = 5e8), buffered_allreduce_fallback)
ENGINE_ALLREDUCE_ELEMENTS = 500_000_000


def deepspeed_buffers(arch: Architecture, training: Training, recipe: Recipe, stage: StageParameters, zero: int,
                      trainable: float, d: int, m: int) -> tuple[list[Component], list[Component], list[Component]]:
    """DeepSpeed's gradient buckets and ZeRO-3's gathered parameters: (forward, backward, persistent);
    `d` ranks share the partitions, `m` micro-batches make a step."""
    ds = deepspeed_settings(arch, training, zero)
    P, G = bytes_per_element(recipe.param_dtype), bytes_per_element(recipe.grad_dtype)
    fwd: list[Component] = []
    bwd: list[Component] = []
    persistent: list[Component] = []
    if zero == 0:
        bucket = min(ENGINE_ALLREDUCE_ELEMENTS, trainable) * G
        bwd.append(component("transient", "Gradient all-reduce buffer", bucket,
                             f"min({ENGINE_ALLREDUCE_ELEMENTS:,} (engine's buffer), trainable params) x {G:g} B",
                             "DeepSpeed v0.19.5 runtime/engine.py allreduce_gradients, buffered_allreduce_fallback"))
    elif zero in (1, 2) and not contiguous(training):
        pass  # no bucket buffer: the .grad tensors are reduced where they are (deepspeed_noncontiguous)
    elif zero in (1, 2):
        copies = 2 if ds.overlap_comm else 1
        bwd.append(component("transient", "Gradient reduction bucket" + ("s (overlap_comm: two)" if copies > 1 else ""),
                             copies * ds.reduce_bucket_size * P,
                             f"{copies} x reduce_bucket_size {ds.reduce_bucket_size:,} x {P:g} B, whatever the "
                             "trainable count", ZERO12_BUCKET_SOURCE + "; " + DEEPSPEED_SOURCE))
    else:
        persistent.append(component("buckets", "Gradient reduction bucket (ZeRO-3)", ds.reduce_bucket_size * P,
                                    f"reduce_bucket_size {ds.reduce_bucket_size:,} x {P:g} B",
                                    ZERO3_BUCKET_SOURCE + "; " + DEEPSPEED_SOURCE))
        f, b = _zero3_gathered(arch, training, stage, ds, P, d, m)
        fwd += f
        bwd += b
        small = persistent_elements(arch, stage, ds.persistence_threshold)
        if small:
            persistent.append(component(
                "buffers", "ZeRO-3 persistent parameters (kept gathered)", P * small,
                f"{P:g} B x {small:,.0f} elements of the tensors of at most stage3_param_persistence_threshold "
                f"{ds.persistence_threshold:,} elements (norms, biases), whole beside their shards",
                "DeepSpeed v0.19.5 runtime/zero/parameter_offload.py mark_persistent_parameters (ds_persist: not "
                "released after the first gather); " + DEEPSPEED_SOURCE))
    return fwd, bwd, persistent


def _zero3_gathered(arch: Architecture, training: Training, stage: StageParameters, ds: DeepSpeedBuffers, P: float,
                    d: int, m: int) -> tuple[list[Component], list[Component]]:
    """ZeRO-3's gathered parameters in forward and in backward: its coordinator replayed over the
    micro-batch's module hooks (zero3_trace.py, zero3_replay.py)."""
    if d == 1:  # one rank: the "gather" points the parameter at its own partition (partition_parameters.py
        return [], []  # all_gather_coalesced -> _no_gather_coalesced, v0.12.3 and v0.19.5): nothing allocated
    g = gathered_elements(arch, training, stage, ds.prefetch_bucket_size, ds.max_live_parameters,
                          ds.persistence_threshold, m)
    held = (f" (the embedding, {g.held:,} elements, held from the micro-batch before outside its count)"
            if g.held else "")
    label = "Gathered parameters (ZeRO-3 prefetch up to stage3_max_live_parameters)"
    out = []
    for elements, at in ((g.forward, g.forward_at), (g.backward, g.backward_at)):
        text = (f"{P:g} B x {elements:,} elements, the most the coordinator holds gathered (at {at}) when "
                f"replayed over the micro-batch's module hooks: every hook prefetches whole tensors up to "
                f"min(max_live {ds.max_live_parameters:,} - its count, prefetch bucket {ds.prefetch_bucket_size:,})"
                f"{held}")
        out.append(component("transient", label, P * elements, text, ZERO3_REPLAY_SOURCE + "; " + TRACE_SOURCE))
    return [out[0]], [out[1]]


def persistent_elements(arch: Architecture, stage: StageParameters, threshold: int) -> float:
    """Elements of the stage's tensors that ZeRO-3 keeps gathered: those of at most `threshold`
    elements (HF fuses a MoE layer's routed experts into one tensor, so they count as one)."""
    def small(tensors) -> int:
        return sum(t.numel for t in tensors if t.numel <= threshold)
    out = float(sum(n * arch.cached(("persistent", kind, threshold), lambda k=kind: small(arch.layer_tensors(k)))
                    for kind, n in stage.kind_counts))
    if stage.first:
        out += small(arch.embedding_tensors())
    if stage.last:
        out += small(arch.head_tensors())
    return out


# the max_seq_len torchtune v0.6.1's llama3_1, llama3_2 and qwen2_5 (7B and up) model builders pass
TORCHTUNE_ROPE_POSITIONS = 131_072
TORCHTUNE_ROPE_SOURCE = (
    "torchtune v0.6.1: Llama3ScaledRoPE (models/llama3_1/_position_embeddings.py) and RotaryPositionalEmbeddings "
    "(modules/position_embeddings.py) keep cache [max_seq_len, head_dim/2, 2] fp32 (cos, sin); "
    "Qwen2RotaryPositionalEmbeddings (models/qwen2/_positional_embeddings.py) cache [max_seq_len, 2 x head_dim] fp32 "
    "(cos, sin of the duplicated frequencies); each with theta [head_dim/2] fp32, non-persistent buffers on the GPU. "
    "One module shared by every layer (the component builders), one per layer in lora_qwen2 "
    "(models/qwen2/_component_builders.py lora_qwen2_self_attention); measured: buffer_bytes of "
    "tests/data/measured/torchtune")


def _torchtune_rope_cache(arch: Architecture, training: Training, stage: StageParameters) -> Component:
    """torchtune's RoPE modules build their cos/sin cache for the model's max_seq_len once, on the
    GPU, and keep it through the run; a forward slices it (a view). Qwen2's module (the contract's
    qkv_bias marks Qwen2) caches twice Llama's floats per position, and torchtune's LoRA Qwen2
    builder gives every layer its own module."""
    positions = arch.max_position_embeddings or TORCHTUNE_ROPE_POSITIONS
    half = arch.head_dim // 2
    qwen2 = arch.qkv_bias
    width = 4 * half if qwen2 else 2 * half  # fp32 values per position
    copies = stage.num_layers if qwen2 and training.adapter else 1
    nbytes = copies * 4 * (positions * width + half)
    where = f"{copies} modules (one per layer, lora_qwen2) x" if copies > 1 else "one module shared by every layer:"
    values = f"cos, sin of the {half} frequencies" + (" twice (Qwen2)" if qwen2 else "")
    return component("buffers", "RoPE cos/sin cache (torchtune)", nbytes,
                     f"{where} 4 B x ({positions:,} positions x {width} ({values}) + theta {half}); positions: "
                     f"max_position_embeddings if given, else {TORCHTUNE_ROPE_POSITIONS:,} (torchtune's Llama 3.1/3.2 "
                     "and Qwen2.5 7B+ builders' max_seq_len)", TORCHTUNE_ROPE_SOURCE)


TORCHTITAN_ROPE_SOURCE = (
    "torchtitan v0.3.0 models/common/rope.py: every attention module builds its own RoPE module, whose "
    "non-persistent buffer `cache` is ComplexRoPE's (max_seq_len, dim/2) complex64 (llama3, deepseek_v3 over "
    "qk_rope_head_dim) or CosSinRoPE's (max_seq_len, 2 x dim) fp32 (qwen3); Decoder.Config.update_from_config "
    "(models/common/decoder.py) sets max_seq_len to training.seq_len; measured: 64 caches of 8 MiB alive "
    "through the step of tests/data/measured/torchtitan/titan-qwen3-32b-w64-tp4-fullac-s8192-b1 (per-tensor "
    "breakdown)")


def _torchtitan_rope_caches(arch: Architecture, training: Training, stage: StageParameters) -> Component:
    """torchtitan's per-layer RoPE caches: one module per attention layer, each with its cache for
    seq_len positions, alive from the model's build to the end of the run. Qwen3's CosSinRoPE (the
    contract's qk_norm marks Qwen3 among torchtitan's families) keeps cos and sin of the duplicated
    frequencies, 8 B x dim per position; ComplexRoPE one complex64 per frequency pair, 4 B x dim."""
    dim = arch.qk_rope_head_dim if arch.uses_mla else arch.head_dim
    cos_sin = arch.qk_norm
    per_position = (8 if cos_sin else 4) * dim
    kind = (f"CosSinRoPE: 2 x {dim} fp32 (cos, sin)" if cos_sin else f"ComplexRoPE: {dim // 2} complex64")
    return component("buffers", "RoPE caches (torchtitan, one per layer)",
                     stage.num_layers * training.seq_len * per_position,
                     f"{stage.num_layers} layers x {training.seq_len:,} positions (seq_len) x {per_position} B "
                     f"({kind})", TORCHTITAN_ROPE_SOURCE)


def _torchtitan_model_rope(arch: Architecture, training: Training, par: Parallel, stage: StageParameters,
                           cp_clone: str | None) -> Component:
    """torchtitan before its per-layer RoPE modules: one freqs_cis buffer per model chunk, seq_len x d/2
    complex64 (8 B per frequency pair), and under CP context_parallel's clone of each buffer it restores
    (`TitanRules.cp_rope_clone`)."""
    dim = arch.qk_rope_head_dim if arch.uses_mla else arch.head_dim
    chunks = max(1, len(stage.chunks))
    clones = 0 if par.cp == 1 or cp_clone is None else chunks if cp_clone == "chunks" else int(par.pp == 1)
    nbytes = (chunks + clones) * training.seq_len * 4 * dim
    clone_text = f" + {clones} copy kept by context_parallel to restore it" if clones else ""
    return component("buffers", "RoPE freqs_cis (torchtitan, one per model chunk)", nbytes,
                     f"({chunks} chunk(s){clone_text}) x {training.seq_len:,} positions (seq_len) x {dim // 2} "
                     f"complex64", TITAN_SOURCES["rope"])


def _runs_foreach(training: Training) -> bool:
    """torch's foreach AdamW steps this setup: the HF Trainer's adamw_torch, torchtitan's AdamW in the
    releases that left it unfused (titan_releases.py adamw_foreach), DeepSpeed's client AdamW (deepspeed_step.py),
    Megatron-Core's fallback without TransformerEngine or Apex (spec/optimizers.py megatron_torch_adamw)."""
    if OPTIMIZERS[training.optimizer].temporaries != FOREACH_SQRT:
        return False
    rules = titan_rules(training)
    return training.framework in FOREACH_FRAMEWORKS or (rules is not None and rules.adamw_foreach) \
        or deepspeed_foreach(training) or megatron_torch_adamw(training.framework, training.te_version)



def foreach_denom(groups: list[float], formula: str) -> Component:
    """torch before 2.1: what foreach AdamW's out-of-place sqrt(v) + eps adds to the one-temporary-a-group count
    (`sum(groups)`, the temporary beside it). In a group's iteration the previous group's sqrt(v) + eps is still
    alive as its own are made (FOREACH_DENOM_SOURCE: each name is rebound only once the next group's is made): the
    step's moment is the largest of
    previous + 2 x this or 2 x previous + this, over the (device, dtype) groups in turn."""
    peak = max(max(a + 2 * b, 2 * a + b) for a, b in zip([0.0] + groups[:-1], groups))
    more = "the same bytes again" if len(groups) == 1 else "the larger group's bytes again"
    return component("transient", "foreach AdamW's sqrt(v) + eps, out of place (torch before 2.1)",
                     peak - sum(groups), f"{more}: {formula}", FOREACH_DENOM_SOURCE)


def _step_temporaries(training: Training, recipe: Recipe, stage: StageParameters, zero: int,
                      d_dense: int, trainable: float, largest: float,
                      inv: Inventory | None = None) -> list[Component]:
    """Optimizer-step temporaries. torch's foreach AdamW (the default on CUDA) materialises sqrt(v)
    for a whole parameter group at once (torch/optim/adam.py _multi_tensor_adam); fused kernels
    (Megatron/TE FusedAdam, DeepSpeed FusedAdam, bitsandbytes) work in place."""
    states_dtype = bytes_per_element(recipe.optimizer_dtype)
    shard = trainable / (d_dense if zero >= 1 and d_dense > 1 else 1)
    optimizer = OPTIMIZERS[training.optimizer]
    if training.framework == "deepspeed" and zero >= 1 and recipe.master_weights and deepspeed_foreach(training):
        return []  # stepped on the flat fp32 partitions: deepspeed_step.step_transients holds its temporary
    if _runs_foreach(training):
        # the states are sharded from ZeRO 1 (HF ZeRO, FSDP, Megatron's distributed optimizer): so is sqrt(v)
        divisor = f" / d ({d_dense})" if zero >= 1 and d_dense > 1 else ""
        temporary, formula = shard * states_dtype, f"{states_dtype:g} B x parameters on this GPU{divisor}"
        if inv is not None and training.framework == "hf" and inv.saved:
            # torch 2.13 _multi_tensor_adam makes sqrt(v) per (device, dtype) group
            # (Optimizer._group_tensors_by_device_and_dtype), each in its states' dtype, and keeps every group's
            # until the step returns (no del): fp32 adapters beside the 16-bit embedding/head copies (adapters.py)
            A, S = bytes_per_element(adapter_dtype(training, recipe)), saved_copy_bytes(training, recipe)
            temporary = (A * inv.adapters + S * inv.saved) * shard / trainable
            formula = f"({A:g} B x adapter parameters + {S:g} B x embedding/head copies){divisor}"
        source = "torch.optim.AdamW foreach implementation (_multi_tensor_adam)"
        if titan_rules(training) is not None:
            source += "; " + TITAN_SOURCES["adamw_foreach"]
        if megatron_torch_adamw(training.framework, training.te_version):
            source += "; " + MEGATRON_TORCH_ADAMW_SOURCE
        out = [component("transient", "foreach AdamW temporary (sqrt of the second moment)", temporary, formula,
                         source)]
        if torch_release(training.torch_version) < TORCH_FOREACH_ADD_IN_PLACE:
            groups = [temporary]
            if inv is not None and training.framework == "hf" and inv.saved and A != S:  # (device, dtype) groups
                groups = [b for b in (A * inv.adapters * shard / trainable, S * inv.saved * shard / trainable) if b]
            out.append(foreach_denom(groups, formula))
        return out
    scratch = step_scratch(training.optimizer, training.framework, training.framework_version)
    if scratch is not None:  # stepped one tensor (its local shard) at a time
        d = d_dense if zero >= 1 and d_dense > 1 else 1
        return [component("transient", "compiled step's scratch (the largest tensor)", scratch.per_element * largest / d,
                          f"{scratch.formula} x largest trainable tensor" + (f" / d ({d})" if d > 1 else ""),
                          scratch.source)]
    if optimizer.temporaries == LARGEST_TENSOR:
        return [component("transient", "per-tensor update temporaries (two of the largest tensor, fp32)",
                          2 * 4 * largest, "2 x 4 B x largest trainable tensor", optimizer.source)]
    return []


OPTIMIZER_IN_BACKWARD_SOURCE = ("torchtune training.register_optim_in_bwd_hooks: one optimizer per parameter, "
                                "stepped and zeroed by its post-accumulate-grad hook; PyTorch tutorial 'How to save "
                                "memory by fusing the optimizer step into the backward pass'")


def _step_in_backward(training: Training, recipe: Recipe, stage: StageParameters, zero: int,
                      d_dense: int) -> Component:
    """With the optimizer in backward, a parameter is stepped as soon as its gradient is ready and
    the gradient freed: no full gradient set ever exists. At the worst moment one parameter's
    gradient (its shard under ZeRO 2/3) is alive with its own step temporary (none for the fused
    AdamW torchtune builds)."""
    shard = d_dense if zero >= 2 and d_dense > 1 else 1
    G, S = bytes_per_element(recipe.grad_dtype), bytes_per_element(recipe.optimizer_dtype)
    optimizer = OPTIMIZERS[training.optimizer]
    temporary = S if _runs_foreach(training) else 2 * 4 if optimizer.temporaries == LARGEST_TENSOR else 0
    largest = stage.total.largest_tensor / shard
    return component("transient", "One parameter's gradient and its step (optimizer in backward)",
                     largest * (G + temporary),
                     f"({G:g} B gradient + {temporary:g} B step temporary) x largest tensor"
                     + (f" / d ({shard})" if shard > 1 else ""), OPTIMIZER_IN_BACKWARD_SOURCE)


def _scratch_in_backward(training: Training, recipe: Recipe, stage: StageParameters, zero: int,
                         d_dense: int) -> list[Component]:
    """torchao's compiled step (spec/optimizers.py step_scratch) of the largest tensor, in backward: its hook runs
    once the gradient is whole, after every use of the tensor has sent its part, so for the embedding and the LM
    head after the loss's backward has freed the loss's tensors (torch autograd: a node's saved tensors are
    released after it runs; the tied embedding's last part comes from the lookup, at backward's end). The
    torchtune harness's eager record of the README row's setup puts backward's peak beside the loss, below
    the step with its scratch beside it (tests/test_torchao_step_scratch.py)."""
    scratch = step_scratch(training.optimizer, training.framework, training.framework_version)
    if scratch is None:
        return []
    shard = d_dense if zero >= 2 and d_dense > 1 else 1
    G = bytes_per_element(recipe.grad_dtype)
    return [component("transient", "The largest tensor's gradient and its compiled step's scratch",
                      stage.total.largest_tensor / shard * (G + scratch.per_element),
                      f"({G:g} B gradient + {scratch.per_element:g} B scratch: {scratch.formula}) x largest tensor"
                      + (f" / d ({shard})" if shard > 1 else ""),
                      OPTIMIZER_IN_BACKWARD_SOURCE + "; " + scratch.source)]


def _titan_root_unit(arch: Architecture, par: Parallel, stage: StageParameters, P: float, Pb: float, pb: str,
                     layer: float) -> tuple[Component, Component]:
    """torchtitan 2024-12 and 0.1.0 (titan_releases.py root_unit): the root unit holds the embedding, the
    final norm and the head, gathered from the first forward to the end of backward (the torch of those
    runs kept a root's parameters after forward), beside a block and the next one; the head's 16-bit
    gradient waits for the root's reduce-scatter at the end of backward, after the embedding's."""
    emb = arch.hidden_size * arch.vocab_size / par.tp if stage.first else 0.0
    head = arch.hidden_size * arch.vocab_size / par.tp if stage.last else 0.0
    root = P * (emb + head)
    forward = component("transient", "Unsharded parameters in flight", Pb * 2 * layer + root,
                        f"{pb} x (a block + the next one) + {P:g} B x the root unit (embedding and head) unsharded",
                        TITAN_SOURCES["root_unit"])
    backward = component("transient", "Unsharded parameters in flight, and the head's gradient",
                         Pb * 2 * layer + root + P * head,
                         f"{pb} x (a block + the prefetched one) + {P:g} B x the root unit unsharded + "
                         f"{P:g} B x the head's unsharded gradient", TITAN_SOURCES["root_unit"])
    return forward, backward


# torch.distributed.pipelining runs every micro-batch's backward of an FSDP2 stage without gradient sync
# (torch 2.13 pipelining/stage.py backward_maybe_with_nosync: set_requires_gradient_sync(False); Dec 2024's
# the same until the last micro-batch), so FSDP2 upcasts each unit's unsharded gradient to the reduce dtype
# and adds the next micro-batches' into it (fsdp/_fully_shard/_fsdp_param.py to_accumulated_grad_if_needed,
# accumulate_unsharded_grad_if_needed); the reduce-scatters run once, after the last backward. torchtitan
# keeps the stage's parameters gathered meanwhile (no reshard after forward under PP: zero_stage 2).
PIPELINED_FSDP2_GRADIENTS_SOURCE = (
    "torch 2.13 distributed/pipelining/stage.py backward_maybe_with_nosync; distributed/fsdp/_fully_shard/"
    "_fsdp_param.py to_accumulated_grad_if_needed (unsharded gradients kept in reduce_dtype across micro-batches); "
    "torchtitan distributed/fsdp.py get_fsdp_reshard_after_forward_policy (9dec370 parallelize_llama.apply_fsdp)")


PIPELINED_GRADIENTS_LABEL = "Unsharded gradients accumulated over the micro-batches"


def _pipelined_fsdp2_gradients(stage: StageParameters, P: float, G: float, layer: float) -> Component:
    """A pipeline stage's FSDP2 gradients during backward: every parameter's unsharded gradient in the
    reduce dtype, accumulated over the micro-batches, and the unit being run's in the compute dtype
    before its upcast."""
    return component("transient", PIPELINED_GRADIENTS_LABEL,
                     G * stage.local + P * layer,
                     f"{G:g} B x the stage's parameters (unsharded, reduce dtype) + {P:g} B x one layer's",
                     PIPELINED_FSDP2_GRADIENTS_SOURCE)
