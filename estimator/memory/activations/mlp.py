"""The dense MLP block's saved tensors (plain or gated, fused or PyTorch modules)."""

from __future__ import annotations

from ...spec.architecture import Architecture
from ...spec.dtypes import bytes_per_element
from ...spec.parallel import Parallel
from ...spec.training import Training
from .entries import (Entry, MOE, NORM, _norm, _norm_output, autocast, compiled, fused_kernels, config_dropout,
                      tokens_per_gpu)
from .llama4 import TRANSFORMERS_FRAMEWORKS, dense_moe, dense_moe_entries, dense_moe_rows


def _mlp(prefix: str, T: float, width: float, arch: Architecture, training: Training, divided_by: str,
         width_formula: str, tags: tuple[str, ...], down: str = "down") -> list[Entry]:
    """An MLP's saved tensors beyond its input. A plain MLP keeps fc1's output (the activation's
    input) and the activation's output (fc2's input): 8sbh + 8sbh in Korthikanti's 4h GELU MLP.
    Recomputing the activation function (Megatron's ``moe_act``) drops its output: the routed experts' only
    (transformer/moe/experts.py GroupedMLP/TEGroupedMLP activation_recompute; SharedExpertMLP has none)."""
    B = bytes_per_element(training.compute_dtype)
    f = width_formula
    act_tags = tags + (("moe_act",) if tags == MOE else ())
    if not arch.gated_mlp:
        return [Entry(f"{prefix}fc1 output (activation input)", T * width, B, divided_by, f"B*s*b*{f}", recompute=tags),
                Entry(f"{prefix}fc2 input (activation output)", T * width, B, divided_by, f"B*s*b*{f}", gemm_input=True,
                      recompute=act_tags, for_weights=(down,))]
    if fused_kernels(training):
        # Megatron-Core fused_bias_swiglu: saves fc1's output (gate and up) and recomputes the rest;
        # --activation-func-fp8-input-store saves it as float8_e4m3fn (SwiGLUFunction / WeightedSwiGLUFunction:
        # `input.to(torch.float8_e4m3fn)`), except where moe_act's CheckpointWithoutOutput holds the experts'
        # activation input as it is (experts.py: the activation runs inside the checkpoint, without autograd)
        checkpointed = "moe_act" in act_tags and training.recompute == "selective" \
            and "moe_act" in training.recompute_modules
        if training.activation_func_fp8_input_store and not checkpointed:
            return [Entry(f"{prefix}fc1 output (gate and up, kept in FP8 by fused SwiGLU)", 2 * T * width, 1,
                          divided_by, f"2*1*s*b*{f}", recompute=tags),
                    Entry(f"{prefix}fc2 input (SwiGLU output)", T * width, B, divided_by, f"B*s*b*{f}",
                          gemm_input=True, recompute=act_tags)]
        return [Entry(f"{prefix}fc1 output (gate and up, kept by fused SwiGLU)", 2 * T * width, B, divided_by,
                      f"2*B*s*b*{f}", recompute=tags),
                Entry(f"{prefix}fc2 input (SwiGLU output)", T * width, B, divided_by, f"B*s*b*{f}", gemm_input=True,
                      recompute=act_tags)]
    if training.liger_kernel:
        # LigerSiLUMulFunction (memory/liger.py SWIGLU_SOURCE) keeps gate and up and recomputes silu(gate) in
        # backward; its product is the down projection's input, kept by that linear
        return [Entry(f"{prefix}gate and up projections (kept by Liger SwiGLU)", 2 * T * width, B, divided_by,
                      f"2*B*s*b*{f}", recompute=tags, tensors=2),
                Entry(f"{prefix}fc2 input (Liger SwiGLU output)", T * width, B, divided_by, f"B*s*b*{f}",
                      gemm_input=True, recompute=act_tags, for_weights=(down,))]
    if compiled(training):
        # Inductor's partitioner (COMPILE_SOURCE): act(gate) is pointwise and recomputed from the kept gate
        # output; gate, up and their product (the down projection's input) stay (measured)
        return [Entry(f"{prefix}gate and up projections", 2 * T * width, B, divided_by, f"2*B*s*b*{f}", recompute=tags),
                Entry(f"{prefix}fc2 input (gated product)", T * width, B, divided_by, f"B*s*b*{f}", gemm_input=True,
                      recompute=act_tags, for_weights=(down,))]
    # transformers' LlamaMLP: down(act(gate(x)) * up(x)) keeps gate, up, act(gate) and the product
    return [Entry(f"{prefix}gate and up projections", 2 * T * width, B, divided_by, f"2*B*s*b*{f}", recompute=tags,
                  tensors=2),
            Entry(f"{prefix}activation output", T * width, B, divided_by, f"B*s*b*{f}", recompute=act_tags),
            Entry(f"{prefix}fc2 input (gated product)", T * width, B, divided_by, f"B*s*b*{f}", gemm_input=True,
                  recompute=act_tags, for_weights=(down,))]


def mlp_entries(arch: Architecture, training: Training, par: Parallel, kind: str) -> list[Entry]:
    B = bytes_per_element(training.compute_dtype)
    T = tokens_per_gpu(training, par)
    h = arch.hidden_size
    # Falcon's parallel layer with one norm (transformers 5.23 modeling_falcon.py FalconDecoderLayer:
    # mlp_layernorm_out = attention_layernorm_out): the MLP reads the attention norm's output, which keeps it as
    # the QKV projection's input; under autocast fc1 keeps its own cast (measured: tests/data/measured/falcon-7b-*)
    one_norm = arch.parallel_attention and arch.norms_per_layer == 1
    out = [] if one_norm else _norm("MLP norm input", T, arch, training)
    if arch.parallel_attention and arch.norm == "layernorm":
        # the MLP's LayerNorm reads the layer input, which the attention's keeps already (transformers 5.23
        # modeling_gpt_neox.py GPTNeoXLayer with use_parallel_residual; measured: tests/data/measured/pythia-1.4b-*)
        out = [e for e in out if e.name != "MLP norm input (LayerNorm input)"]
    if kind == "dense" and not (one_norm and not autocast(training)):
        out += _norm_output("fc1 input", T, arch, training, 1 if fused_kernels(training) or not arch.gated_mlp else 2,
                            NORM, weights=("gate", "up"))
    if kind == "dense":
        out += _composite_gelu_input(_mlp("", T, arch.intermediate_size, arch, training, "tp", "f", ("mlp",)),
                                     arch, training)
        out += composite_gelu_entries(arch, training, T)
    else:
        e, k, phi = arch.num_experts, arch.num_experts_per_token, training.moe_capacity_factor
        if dense_moe(arch, training):  # transformers' Llama 4: every token through every expert
            out += dense_moe_entries(arch, training, par)
            out += _mlp("experts (every token): ", dense_moe_rows(training, par, arch), arch.moe_intermediate_size,
                        arch, training, "sp", "E*f_e", MOE, down="experts")
            out += _shared_expert_entries(arch, training, T)
            return out + mlp_tail_entries(arch, training, T)
        out.append(Entry("router input", T * h, B, "sp", "B*s*b*h", recompute=NORM, for_weights=("router",)))
        if fp32_topk_router(arch, training):
            out += _fp32_topk_router_entries(arch, T)
        else:
            out.append(Entry("router logits and probabilities (fp32)", 2 * T * e, 4, "sp", "2*4*s*b*E", recompute=MOE))
        # Tokens are exchanged across EP, not removed; ETP gathers them while it splits the expert
        # width, so per GPU the routed tokens are k*phi*s*b/t for every expert-width tensor.
        routed = T * k * phi
        out.append(Entry("dispatched tokens (expert fc1 input)", routed * h * par.etp, B, "sp",
                         "B*phi*k*s*b*h*etp", gemm_input=True, recompute=MOE, for_weights=("experts",)))
        out += _mlp("experts: ", routed, arch.moe_intermediate_size, arch, training, "sp", "phi*k*f_e", MOE,
                    down="experts")
        if training.framework == "fsdp2":
            # torchtitan's combine (models/common/token_dispatcher.py): (routed_output.to(float32) * scores)
            # .to(bf16) before the scatter_add, so the product's backward keeps the fp32 copy (measured)
            out.append(Entry("expert outputs kept for the weighted combine (fp32 copy)", routed * h * par.etp, 4,
                             "sp", "4*phi*k*s*b*h*etp", recompute=MOE))
        elif fused_kernels(training):
            out += _megatron_routing_weights(routed, arch, training, par)
        else:
            out.append(Entry("expert outputs kept for the weighted combine", routed * h * par.etp, B, "sp",
                             "B*phi*k*s*b*h*etp", recompute=MOE))
        out += _shared_expert_entries(arch, training, T)
    return out + mlp_tail_entries(arch, training, T)


FP32_ROUTER_SOURCE = ("transformers 5.23 models/deepseek_v3/modeling_deepseek_v3.py DeepseekV3TopkRouter.forward (and "
                      "deepseek_v32/modeling_deepseek_v32.py DeepseekV32TopkRouter): F.linear(hidden_states.type("
                      "torch.float32), self.weight.type(torch.float32)), sigmoid, group-limited top-k, gather")


def fp32_topk_router(arch: Architecture, training: Training) -> bool:
    """transformers' DeepSeek-V3 router (sigmoid scores with e_score_correction_bias: router_bias without the
    linear biases gpt-oss's router has) runs its linear in fp32 (FP32_ROUTER_SOURCE), outside torch.compile,
    whose partitioner would recompute the casts rather than keep their outputs."""
    return (training.framework in TRANSFORMERS_FRAMEWORKS and arch.router_bias and not arch.linear_bias
            and not compiled(training))


def _fp32_topk_router_entries(arch: Architecture, T: float) -> list[Entry]:
    """What DeepseekV3TopkRouter keeps for backward (FP32_ROUTER_SOURCE; checked against a real CPU run in
    tests/test_hf_fp32_router.py): the linear's fp32 copies of its input and of its weight, the sigmoid's output, the
    masked_fill's mask, the top-k indices the gather keeps, and the normalisation's numerator and denominator.
    The group-limited selection's int64 indices (8*s*b*(2*n_group + topk_group), 0.7 MB a layer at 4k tokens)
    are left out: n_group and topk_group are not architecture fields."""
    e, k, h = arch.num_experts, arch.num_experts_per_token, arch.hidden_size
    return [Entry("router input, fp32 copy (transformers' fp32 router linear)", T * h, 4, "sp", "4*s*b*h",
                  recompute=MOE, for_weights=("router",)),
            Entry("router weight, fp32 copy (kept for the input's gradient)", e * h, 4, "none", "4*E*h",
                  recompute=MOE, split_by_cp=False),
            Entry("router scores (sigmoid output, fp32)", T * e, 4, "sp", "4*s*b*E", recompute=MOE),
            Entry("router group mask (bool)", T * e, 1, "sp", "s*b*E", recompute=MOE),
            Entry("router top-k indices (int64)", T * k, 8, "sp", "8*s*b*k", recompute=MOE),
            Entry("router top-k weights and their sum (fp32)", T * (k + 1), 4, "sp", "4*s*b*(k+1)", recompute=MOE)]


def _shared_expert_entries(arch: Architecture, training: Training, T: float) -> list[Entry]:
    if not arch.num_shared_experts:
        return []
    B = bytes_per_element(training.compute_dtype)
    width = arch.shared_expert_intermediate_size * arch.num_shared_experts
    out = _mlp("shared experts: ", T, width, arch, training, "tp", "f_shared", ("shared_experts", "moe"))
    if arch.shared_expert_gate:
        # Qwen2-MoE / Qwen3-Next: sigmoid(shared_expert_gate(x)) * shared_expert(x) keeps the sigmoid's
        # output (one per token) and the shared expert's output (transformers 5.23
        # Qwen3NextSparseMoeBlock.forward; measured, tests/data/measured/qwen3-next-*)
        out.append(Entry("shared expert gate (sigmoid output)", T, B, "sp", "B*s*b", recompute=MOE))
        out.append(Entry("shared expert output (kept by the gate product)", T * arch.hidden_size, B, "sp", "B*s*b*h",
                         recompute=MOE))
    return out


COMPOSITE_GELU_AUTOCAST = (
    "torch 2.13 aten/src/ATen/autocast_mode.h AT_FORALL_FP32 (CUDA autocast's fp32 list; torch 2.11 the same): "
    "pow.Tensor_Scalar runs in fp32, so pow keeps an fp32 copy of x and the tanh chain after it is fp32; "
    "measured on an H200: tests/data/measured/gpu/gpt2-medium-8layers-amp-adamw-norecompute-eager-s1024-b4")


def _composite_gelu(arch: Architecture, training: Training) -> bool:
    return arch.composite_gelu and not arch.gated_mlp and training.framework in TRANSFORMERS_FRAMEWORKS \
        and not compiled(training)


def _composite_gelu_input(entries: list[Entry], arch: Architecture, training: Training) -> list[Entry]:
    """Under CUDA autocast, gelu_new's ``torch.pow(x, 3.0)`` casts the bf16 fc1 output to fp32 and keeps that copy
    for backward, not x itself (COMPOSITE_GELU_AUTOCAST): the activation input is kept in 4 bytes."""
    if not (_composite_gelu(arch, training) and autocast(training)):
        return entries
    return [e._replace(name="fc1 output (activation input, pow's fp32 copy under autocast)", bytes_per_element=4,
                       formula=e.formula.replace("B*", "4*", 1)) if e.name == "fc1 output (activation input)" else e
            for e in entries]


def composite_gelu_entries(arch: Architecture, training: Training, T: float) -> list[Entry]:
    """transformers 5.23 activations.py NewGELUActivation: ``0.5 * x * (1.0 + torch.tanh(c * (x + 0.044715 *
    torch.pow(x, 3.0))))``. Beside x (kept by pow) and the output (fc2's input), autograd keeps tanh's output and
    both factors of the last product, 0.5 * x and 1 + tanh (torch 2.13 derivatives.yaml: tanh saves its result, mul
    both operands); measured: tests/data/measured/gpt2-medium-8layers-*. Under CUDA autocast pow runs in fp32
    (COMPOSITE_GELU_AUTOCAST): tanh's output and 1 + tanh are fp32, 0.5 * x (of the bf16 x) stays 16-bit, and the
    fp32 product is cast to bf16 by fc2 (its input entry). Under the transformers frameworks, uncompiled; a
    non-gated MLP only (`Architecture.composite_gelu`)."""
    if not _composite_gelu(arch, training):
        return []
    f, B = T * arch.intermediate_size, bytes_per_element(training.compute_dtype)
    if autocast(training):
        return [Entry("gelu_new: tanh output and 1 + tanh (fp32 under autocast)", 2 * f, 4, "tp", "2*4*s*b*f",
                      recompute=("mlp",), tensors=2),
                Entry("gelu_new: 0.5 * x", f, B, "tp", "B*s*b*f", recompute=("mlp",))]
    return [Entry("gelu_new: tanh output, 0.5 * x and 1 + tanh", 3 * f, B, "tp", "3*B*s*b*f", recompute=("mlp",),
                  tensors=3)]


def mlp_tail_entries(arch: Architecture, training: Training, T: float) -> list[Entry]:
    """After the MLP: the post-MLP norm (Gemma-2/3, OLMo-2) and the residual dropout."""
    out = _norm("post-MLP norm input", T, arch, training) if arch.norms_per_layer > 2 else []
    if config_dropout(arch.mlp_residual_dropout, training):
        out.append(Entry("MLP residual dropout mask", T * arch.hidden_size, 1, "sp", "s*b*h"))
    return out


MEGATRON_WEIGHTED_ACTIVATION = (
    "Megatron-Core 0.16.1 transformer/moe/experts.py SequentialMLP.forward passes the permuted routing weights "
    "to each expert as per_token_scale; transformer/mlp.py MLP.forward applies them in the activation "
    "(weighted_bias_swiglu_impl, fusions/fused_bias_swiglu.py WeightedSwiGLUFunction: saves fc1's output and the "
    "weights); token_dispatcher.py combine_postprocess unpermutes without probs, so no expert output is kept "
    "(measured, tests/data/measured/megatron)")


def _megatron_routing_weights(routed: float, arch: Architecture, training: Training, par: Parallel) -> list[Entry]:
    """Megatron applies the routing weights inside the experts, not at the combine
    (MEGATRON_WEIGHTED_ACTIVATION): the weighted SwiGLU keeps one weight per dispatched token, in the
    router's dtype (the probabilities' dtype: moe_utils.py topk_routing_with_score_function ends in
    `type_as(logits)`). Without a gated MLP the product act(fc1) * weights (mlp.py, the unfused path)
    also keeps the activation's output for the weights' gradient."""
    R = 8 if training.moe_router_dtype == "fp64" else bytes_per_element(training.moe_router_dtype or
                                                                        training.compute_dtype)
    out = [Entry("routing weights per dispatched token (kept by the weighted activation)", routed * par.etp, R,
                 "sp", "R*phi*k*s*b*etp", recompute=MOE)]
    if not arch.gated_mlp:
        B = bytes_per_element(training.compute_dtype)
        out.append(Entry("experts: activation output (kept by the routing-weight product)",
                         routed * arch.moe_intermediate_size, B, "sp", "B*s*b*phi*k*f_e", recompute=MOE + ("moe_act",)))
    return out
