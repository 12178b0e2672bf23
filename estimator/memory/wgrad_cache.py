"""TransformerEngine's cached dummy weight gradients under Megatron-Core: allocated through PyTorch's
caching allocator on the first backward and kept for the process's life, so
`torch.cuda.max_memory_allocated()` counts them from the second step on (a fake-tensor harness
without TransformerEngine never makes them, like the workspaces).

With gradient-accumulation fusion (Megatron's default; ``--no-gradient-accumulation-fusion`` turns it
off) a linear layer's backward accumulates its weight gradient into the fp32 ``main_grad`` and hands
autograd ``get_dummy_wgrad(main_grad.shape, dtype)`` instead: TE 2.x ``module/base.py`` keeps one such
tensor per (rows, cols, dtype) in ``_dummy_wgrads``, reused by every layer and micro-batch of that
shape. TE's Linear and LayerNormLinear take it since v2.3 (commit ba5dc5dd, NVIDIA/TransformerEngine#1651),
its GroupedLinear (the grouped-GEMM experts) since v2.10 (commit d2945c6a, #2305); Megatron-Core's own
ColumnParallelLinear (the output layer, and every linear of the local spec) takes the same cache when
TE is installed (``tensor_parallel/layers.py`` ``LinearWithGradAccumulationAndAsyncCommunication.backward``,
since core_v0.14, commit e7c55de9). Megatron-Core 0.16.1 pins TE 2.12 (pyproject rev 5671fd36) and 0.19.0
TE 2.17.1: both releases the estimator offers have both. So a stage holds one weight-sized buffer per
distinct linear shape on it: the attention's and MLP's (an expert's once, whatever the expert count),
the MTP projection, and on the last stage the output layer's [V/t, h]. The legacy GroupedMLP's experts
(activations/moe.py LEGACY_GROUPED_MLP: grouped_gemm's gmm) take none: their weight gradients are real tensors.
"""

from __future__ import annotations

from ..spec.architecture import Architecture
from ..spec.dtypes import bytes_per_element
from ..spec.parallel import Parallel
from ..spec.training import Training
from .activations.moe import legacy_grouped_mlp
from .components import Component, component
from .sharding import StageParameters

SOURCE = ("TransformerEngine 2.x pytorch/module/base.py get_dummy_wgrad (one cached tensor per weight shape and "
          "dtype; Linear/LayerNormLinear since v2.3, commit ba5dc5dd; GroupedLinear since v2.10, commit d2945c6a); "
          "Megatron-Core 0.16.1 tensor_parallel/layers.py LinearWithGradAccumulationAndAsyncCommunication.backward "
          "(the output layer, since core_v0.14 commit e7c55de9); Megatron-Core 0.16.1 pins TE 2.12, 0.19.0 TE 2.17.1")
KEY = "wgrad_cache"  # a GPU-only component (validation/core/report.py tensors_peak leaves it out)


def _attention_shapes(arch: Architecture, t: int) -> set[tuple[int, int]]:
    """Megatron-Core 0.16.1's attention linears (gpt_layer_specs.py): linear_qkv fuses q, k and v; MLA
    (multi_latent_attention.py) keeps its down-projections whole on every TP rank."""
    h = arch.hidden_size
    if not arch.uses_mla:
        return {((arch.q_width + 2 * arch.kv_width) // t, h), (h, arch.attention_output_width // t)}
    a, qk = arch.num_attention_heads, arch.qk_nope_head_dim + arch.qk_rope_head_dim
    shapes = {(arch.kv_lora_rank + arch.qk_rope_head_dim, h),
              (a * (arch.qk_nope_head_dim + arch.v_head_dim) // t, arch.kv_lora_rank),
              (h, a * arch.v_head_dim // t)}
    if arch.q_lora_rank:
        return shapes | {(arch.q_lora_rank, h), (a * qk // t, arch.q_lora_rank)}
    return shapes | {(a * qk // t, h)}


def _mlp_shapes(arch: Architecture, width: int, t: int) -> set[tuple[int, int]]:
    rows = 2 * width if arch.gated_mlp else width  # fc1 holds gate and up
    return {(rows // t, arch.hidden_size), (arch.hidden_size, width // t)}


def dummy_shapes(arch: Architecture, par: Parallel, sp: StageParameters, vocab: int,
                 legacy_experts: bool = False) -> set[tuple[int, int]]:
    """The distinct weight shapes of the stage's linear layers on one GPU (`vocab`: the padded vocabulary);
    `legacy_experts`: the routed experts are the legacy GroupedMLP, whose gmm takes no dummy."""
    kinds = {kind for kind, n in sp.kind_counts if n}
    if sp.last and arch.mtp_layers:  # an MTP module: its 2h -> h projection and a layer of the last layer's kind
        kinds.add("moe" if arch.is_moe_layer(arch.num_layers - 1) else "dense")
    shapes: set[tuple[int, int]] = set()
    if kinds:
        shapes |= _attention_shapes(arch, par.tp)
    if "dense" in kinds:
        shapes |= _mlp_shapes(arch, arch.intermediate_size, par.tp)
    if "moe" in kinds:
        if not legacy_experts:
            shapes |= _mlp_shapes(arch, arch.moe_intermediate_size, par.etp)
        if arch.num_shared_experts:
            shapes |= _mlp_shapes(arch, arch.shared_expert_intermediate_size * arch.num_shared_experts, par.tp)
    if sp.last and arch.mtp_layers:
        shapes.add((arch.hidden_size // par.tp, 2 * arch.hidden_size))
    if sp.last:
        shapes.add((vocab // par.tp, arch.hidden_size))
    return shapes


def wgrad_cache(arch: Architecture, training: Training, par: Parallel, sp: StageParameters,
                vocab: int) -> Component | None:
    """The stage's cached dummy weight gradients (module docstring), or None where none are made: another
    framework, inference, an adapter run (frozen weights have no gradient) or without the fusion."""
    if training.framework != "megatron" or training.mode != "training" or training.adapter \
            or not training.gradient_accumulation_fusion:
        return None
    shapes = dummy_shapes(arch, par, sp, vocab, legacy_grouped_mlp(training))
    if not shapes:
        return None
    # TE allocates it in the weight's dtype, Megatron's output layer in its input's: both the compute dtype
    # here (16-bit weights; an FP8 weight's dtype is its high-precision one)
    B = bytes_per_element(training.compute_dtype)
    total = B * sum(rows * cols for rows, cols in shapes)
    listed = ", ".join(f"{rows:,} x {cols:,}" for rows, cols in sorted(shapes, reverse=True))
    return component(KEY, "TransformerEngine dummy weight gradients (one per weight shape)", total,
                     f"{B} B x ({listed})", SOURCE)
