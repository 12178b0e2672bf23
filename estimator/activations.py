"""Activations: what autograd keeps per layer and per micro-batch, tensor by tensor.

The ledger follows Korthikanti et al. 2022 ("Reducing Activation Recomputation in Large
Transformer Models", arXiv 2205.05198, section 4): every tensor a layer saves for its backward
pass is one entry, with its size in bytes and whether tensor parallelism divides it. With their
GPT layer (LayerNorm, 4h GELU MLP, dropout, attention that materialises the scores) the entries
add up to their Table 2, s*b*h*(34 + 5*a*s/h). Modern layers change the entries, not the method:
flash attention keeps no s^2 scores, only a log-sum-exp of 4 bytes per query and head (Dao et
al. 2022); GQA keeps K and V at g/a of the query width; a gated MLP keeps two fc1 outputs.

Notation: s = sequence length, b = micro-batch, h = hidden, a = query heads, g = KV heads, f =
MLP width, t = TP, cp = CP, B = bytes of the compute dtype. An entry marked "sp" is divided by t
only with sequence parallelism (Korthikanti section 4.2.2); "tp" is divided by t always; "none" by
neither. Context parallelism splits every tensor that holds tokens along the sequence (Megatron-Core
context parallel docs). A formula is written before these divisions and shown with them, "/cp" and
"/t", exactly where this layout applies them (`Entry.shown_formula`). The framework decides which
kernels run:

- megatron: fused kernels (TransformerEngine/Apex norms save their input; the fused SwiGLU
  ``bias_swiglu_impl`` saves only fc1's output and recomputes the product; softmax in the
  compute dtype).
- hf / fsdp2 / deepspeed: the model's own PyTorch modules (transformers, torchtitan): norms
  upcast to fp32 and keep the fp32 copy; the gated MLP keeps gate, up, act(gate) and their
  product.

With fused kernels, the norms' per-token statistics (8 bytes per token per norm) are left out,
as Korthikanti do (below 0.01% of a layer); with PyTorch modules the fp32 rsqrt per token is
kept, as measured (tests/data/measured).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

from .architecture import Architecture
from .dtypes import bytes_per_element
from .parallel import Parallel
from .training import FSDP_FRAMEWORKS, Training

# Selective recompute modules (Megatron-Core ``--recompute-modules``): a tensor is dropped from the
# ledger when a module that produces it is recomputed in backward.
# The modules are training.RECOMPUTE_MODULES.
CORE = ("core_attn",)
NORM = ("layernorm",)  # the norms' outputs, which the next linear layer would keep
UP_PROJ = ("mla_up_proj",)  # MLA's up-projected q, k, v (with rope), recomputed from the latents
MOE = ("moe",)

KORTHIKANTI = "Korthikanti et al. 2022, arXiv 2205.05198, section 4 and Table 2"


class Entry(NamedTuple):
    """One saved tensor (or a group of like tensors) of a layer, per micro-batch. (A NamedTuple:
    every estimate builds the ledger anew.)"""

    name: str
    elements: float  # before any parallel division
    bytes_per_element: float
    divided_by: str  # "sp", "tp" or "none"
    formula: str  # a product, before the parallel divisions
    recompute: tuple[str, ...] = ()  # selective-recompute modules whose recomputation drops this tensor
    gemm_input: bool = False  # saved as the quantized FP8 copy under the FP8 recipe
    split_by_cp: bool = True  # it holds tokens (`elements` counts those of this GPU's share of s)
    # kept only for the gradients of these weights (a linear's input, a norm's normalised output before
    # its scale): with those weights frozen it is not kept (autograd saves what the gradients it must
    # compute read: ``should_compute_output`` in the generated backward nodes); `adapters`
    for_weights: tuple[str, ...] = ()

    def divided_by_tp(self, par: Parallel) -> bool:
        return self.divided_by == "tp" or (self.divided_by == "sp" and par.sequence_parallel)

    def bytes(self, par: Parallel) -> float:
        if self.divided_by_tp(par):
            return self.elements * self.bytes_per_element / par.tp
        return self.elements * self.bytes_per_element

    def shown_formula(self, par: Parallel) -> str:
        """The formula with the divisions the layout applies to its bytes (none of size 1)."""
        formula = self.formula
        if self.split_by_cp and par.cp > 1:
            formula += "/cp"
        if self.divided_by_tp(par) and par.tp > 1:
            formula += "/t"
        return formula


def fused_kernels(training: Training) -> bool:
    return training.framework == "megatron"


def tokens_per_gpu(training: Training, par: Parallel) -> float:
    """s*b/cp, the tokens on one GPU before TP: context parallelism splits every activation along
    the sequence (Megatron-Core context parallel docs)."""
    return training.seq_len / par.cp * training.micro_batch_size


def autocast(training: Training) -> bool:
    """fp32 parameters run under a 16-bit autocast: the residual stream stays fp32."""
    return training.param_dtype == "fp32" and training.compute_dtype != "fp32"


def torch_fused_rms_norm(arch: Architecture, training: Training) -> bool:
    """fsdp2 (torchtitan) runs torch.nn.RMSNorm: on CUDA ``F.rms_norm`` -> ``aten::rms_norm`` calls
    ``at::_fused_rms_norm`` (aten/src/ATen/native/layer_norm.cpp ``rms_norm_symint``), one kernel that
    keeps only its input and a per-row fp32 rstd (torch 2.13; measured, tests/data/measured/torchtitan).
    Gemma's (1 + w) norm is the model's own code, not nn.RMSNorm."""
    # torchtune's RMSNorm calls F.rms_norm on x.float() with a bf16 scale: the dtype mismatch sends
    # it down the composite path on CUDA too (layer_norm.cpp: "Mismatch dtype between input and
    # weight ... Cannot dispatch to fused implementation")
    return training.framework == "fsdp2" and arch.norm == "rmsnorm" and not arch.norm_unit_offset


# torch.compile (training.compile): Inductor partitions each compiled layer's joint forward-backward graph
# with AOTAutograd's min-cut partitioner (torch 2.13 torch/_functorch/partitioners.py
# min_cut_rematerialization_partition, called by torch/_inductor/compile_fx.py). Its rules
# (get_default_op_list, should_ban_recomputation; _functorch/config.py ban_recompute_* all True,
# activation_memory_budget 1.0): pointwise and view ops (casts, pow, rsqrt, mul, silu, exp, div, neg, cat)
# may be recomputed in backward; mm/bmm and the attention kernels may not, nor reductions (mean, amax, sum:
# ban_recompute_reductions), nor a tensor a non-fusible backward op reads (ban_recompute_materialized_
# backward: a matmul's input, the attention kernel's q, k, v, output and log-sum-exp); the cut between
# forward and backward is then the smallest set of bytes. For a pre-norm layer that keeps: the norms'
# inputs (the layer input; the residual after attention, as the output projection's result) and their fp32
# rsqrt per token; every matmul's input and the SiLU gate's inputs (gate and up outputs); flash attention's
# q, k, v, output and log-sum-exp. Recomputed: the norms' fp32 upcasts and normalised tensors, the SiLU
# output, and with eager attention the fp32 softmax (from the kept QK^T scores and the softmax's per-row
# max and sum). Measured: validation/compile_saved.py (tiny transformers Llama and Qwen3 layers, SDPA and
# eager attention, bf16, the same saved set with backend="inductor" on CPU; tests/data/measured/compile).
COMPILE_SOURCE = ("torch 2.13 torch/_functorch/partitioners.py min_cut_rematerialization_partition (Inductor's "
                  "partitioner); measured with validation/compile_saved.py, tests/data/measured/compile")


def compiled(training: Training) -> bool:
    """The layers run under torch.compile (Inductor): training.compile, refused under megatron and deepspeed."""
    return training.compile and not fused_kernels(training)


def _norm(name: str, T: float, arch: Architecture, training: Training) -> list[Entry]:
    """A norm's saved tensors. Fused norms (Apex/TE) keep their input (and per-token statistics,
    left out as Korthikanti do). transformers' RMSNorm runs in PyTorch ops: ``x.float()`` (kept by
    ``pow`` and ``mul``), the per-token ``rsqrt`` (fp32), and the normalised ``x * rsqrt`` cast
    back to the input's dtype before the scale (kept by the scale's ``mul``). Under autocast the
    residual stream is already fp32, so the upcast is the residual itself."""
    B = bytes_per_element(training.compute_dtype)
    h = arch.hidden_size
    if fused_kernels(training) or training.compute_dtype == "fp32":
        return [Entry(name, T * h, B, "sp", "B*s*b*h")]
    if torch_fused_rms_norm(arch, training):
        # torch's CUDA kernel: autograd saves the input and the fp32 rstd of each row
        # (derivatives.yaml `_fused_rms_norm`; layer_norm_kernel.cu `_fused_rms_norm_cuda`)
        kept = 4 if autocast(training) else B  # under autocast the residual it normalises is fp32
        return [Entry(f"{name} (fused RMSNorm input)", T * h, kept, "sp", f"{kept:g}*s*b*h"),
                Entry(f"{name} (fused RMSNorm rstd per token, fp32)", T, 4, "sp", "4*s*b")]
    if compiled(training):
        # Inductor's partitioner (COMPILE_SOURCE): the upcast and the normalised tensor are pointwise and
        # recomputed in backward from the norm's input (the residual stream, fp32 under autocast) and the
        # rsqrt, a reduction's result that is kept; measured (tests/data/measured/compile)
        kept = 4 if autocast(training) else B
        return [Entry(f"{name} (kept by the compiled layer)", T * h, kept, "sp", f"{kept:g}*s*b*h"),
                Entry(f"{name} (rsqrt per token, fp32, kept by the compiled layer)", T, 4, "sp", "4*s*b")]
    # Gemma scales by (1 + w) in fp32, so the normalised tensor it keeps is fp32 too; so does torchtune's
    # RMSNorm, which normalises x.float() with F.rms_norm's composite ops (torchtune/modules/rms_norm.py)
    kept = 4 if autocast(training) or arch.norm_unit_offset or training.framework == "torchtune" else B
    return [Entry(f"{name} (fp32 upcast)", T * h, 4, "sp", "4*s*b*h"),
            Entry(f"{name} (rsqrt per token, fp32)", T, 4, "sp", "4*s*b"),
            Entry(f"{name} (normalised, before the scale)", T * h, kept, "sp", f"{kept:g}*s*b*h",
                  for_weights=("norm",))]


def _norm_output(name: str, T: float, arch: Architecture, training: Training, readers: int,
                 recompute: tuple[str, ...], gemm: bool = True, weights: tuple[str, ...] = ()) -> list[Entry]:
    """The norm's output as the next linear layers keep it: one shared tensor, except under
    autocast, where every linear keeps its own 16-bit cast of the fp32 input (q, k and v: 3;
    gate and up: 2). Under fsdp2 with TP the block gathers the sequence-parallel norm output
    to Replicate at its boundary and the column-parallel linears keep that gathered tensor, so it
    is not divided by t (torchtitan v0.3.0 models/common/decoder_sharding.py: in_dst_shardings
    x_BLD Replicate; measured, tests/data/measured/torchtitan); Megatron keeps the SP shard and
    gathers it again in backward (Korthikanti section 4.2.2)."""
    B = bytes_per_element(training.compute_dtype)
    copies = readers if autocast(training) and not fused_kernels(training) else 1
    label = name if copies == 1 else f"{name} ({copies} autocast casts, one per linear)"
    formula = "B*s*b*h" if copies == 1 else f"{copies}*B*s*b*h"
    divided = "none" if training.framework == "fsdp2" else "sp"
    return [Entry(label, copies * T * arch.hidden_size, B, divided, formula, gemm_input=gemm, recompute=recompute,
                  for_weights=weights)]


CP_FLEX_SOURCE = ("torchtitan v0.3.0 distributed/context_parallel/api.py apply_cp_to_forward (FlexAttention: "
                  "flex_cp_allgather of k and v on the sequence dim); torch 2.13 distributed/tensor/experimental/"
                  "_context_parallel/_cp_custom_ops.py flex_cp_allgather (all_gather_single, no saved tensors; "
                  "its backward reduce-scatters); measured: tests/data/measured/torchtitan/*-cp*")


def cp_flex_all_gather(training: Training, par: Parallel | None) -> bool:
    """torchtitan (fsdp2) with context parallelism runs flex attention on K/V all-gathered over CP."""
    return training.framework == "fsdp2" and par is not None and par.cp > 1 and training.attention == "flash"


def attention_entries(arch: Architecture, training: Training, par: Parallel) -> list[Entry]:
    B = bytes_per_element(training.compute_dtype)
    T = tokens_per_gpu(training, par)
    b, s = training.micro_batch_size, training.seq_len / par.cp
    h, a = arch.hidden_size, arch.num_attention_heads
    qw = arch.q_width
    from .kbit import math_attention, prepared
    math_sdpa = math_attention(arch, training)  # fp32 SDPA with grouped KV heads: the math backend (kbit.py)
    out = _norm("attention norm input", T, arch, training)
    out += _norm_output("QKV projection input", T, arch, training, 1 if arch.uses_mla else 3, NORM,
                        weights=("q", "k", "v"))
    if arch.uses_mla:
        # DeepSeek-V2 MLA (arXiv 2405.04434 section 2.1): the compressed latents feed the
        # up-projections (replicated over TP); the core sees q, k (the shared rope key
        # broadcast to every head) and v per head.
        if arch.q_lora_rank:
            out.append(Entry("compressed q (q up-projection input)", T * arch.q_lora_rank, B, "none", "B*s*b*q_lora_rank",
                             gemm_input=True))
        out.append(Entry("compressed kv (kv up-projection input)", T * arch.kv_lora_rank, B, "none",
                         "B*s*b*kv_lora_rank", gemm_input=True))
        k_width, v_width = qw, a * arch.v_head_dim
        v_formula = "B*s*b*a*(2*(d_nope + d_rope) + d_v)"
    else:
        k_width = v_width = arch.kv_width
        v_formula = "B*s*b*(a + 2*g)*d_head"
        if arch.qk_norm and fused_kernels(training):
            out.append(Entry("q and k norm inputs", T * (qw + arch.kv_width), B, "tp", "B*s*b*(a + g)*d_head"))
        elif arch.qk_norm and torch_fused_rms_norm(arch, training):
            # torch's fused kernel over each head (see torch_fused_rms_norm): the input and an fp32 rstd per head
            out.append(Entry("q and k norm inputs (fused RMSNorm)", T * (qw + arch.kv_width), B, "tp",
                             "B*s*b*(a + g)*d_head"))
            out.append(Entry("q and k norms (fused RMSNorm rstd per head, fp32)", T * (a + arch.num_kv_heads), 4, "tp",
                             "4*s*b*(a + g)"))
        elif arch.qk_norm and compiled(training):
            # Inductor's partitioner (COMPILE_SOURCE): the q and k projections' outputs and the rsqrt per
            # head are kept, the upcast and normalised tensors recomputed; measured (Qwen3 layer)
            out.append(Entry("q and k norm inputs (q and k projection outputs, kept by the compiled layer)",
                             T * (qw + arch.kv_width), B, "tp", "B*s*b*(a + g)*d_head"))
            out.append(Entry("q and k norms (rsqrt per head, fp32, kept by the compiled layer)",
                             T * (a + arch.num_kv_heads), 4, "tp", "4*s*b*(a + g)"))
        elif arch.qk_norm:  # transformers' RMSNorm over each head: fp32 upcast, rsqrt, normalised
            heads = a + arch.num_kv_heads
            out.append(Entry("q and k norms (fp32 upcast)", T * (qw + arch.kv_width), 4, "tp", "4*s*b*(a + g)*d_head"))
            out.append(Entry("q and k norms (rsqrt per head, fp32)", T * heads, 4, "tp", "4*s*b*(a + g)"))
            out.append(Entry("q and k norms (normalised, before the scale)", T * (qw + arch.kv_width), B, "tp",
                             "B*s*b*(a + g)*d_head", for_weights=("norm",)))
    if training.attention == "flash" and fused_kernels(training) and not arch.uses_mla \
            and arch.position_embedding == "rope":
        # Megatron-Core SelfAttention: q, k, v are views of the fused QKV output (torch.split); the
        # rotary embedding returns new q and k, so the whole QKV output stays alive through v
        # (transformer/attention.py, measured in tests/data/measured/megatron)
        out.append(Entry("QKV projection output (v is a view of it)", T * (qw + 2 * arch.kv_width), B, "tp",
                         "B*s*b*(a + 2*g)*d_head"))
        out.append(Entry("q and k after the rotary embedding", T * (qw + arch.kv_width), B, "tp",
                         "B*s*b*(a + g)*d_head"))
        out.append(Entry("flash log-sum-exp (fp32)", T * a, 4, "tp", "4*s*b*a", recompute=CORE))
    elif training.attention == "flash" and training.framework == "torchtune" and not arch.uses_mla:
        # torchtune's MultiHeadAttention expands k and v to every query head before SDPA
        # (modules/attention.py: k.unsqueeze(2).expand(...).flatten(1, 2)), so flash keeps them at a heads
        out.append(Entry("q, and k, v expanded to all heads, kept by flash attention", T * 3 * qw, B, "tp",
                         "3*B*s*b*a*d_head", recompute=UP_PROJ))
        out.append(Entry("flash log-sum-exp (fp32)", T * a, 4, "tp", "4*s*b*a", recompute=CORE))
    elif cp_flex_all_gather(training, par):
        # torchtitan's context parallelism for flex attention (CP_FLEX_SOURCE): each rank keeps its s/cp
        # queries, but flex runs them against the keys and values of the whole sequence, all-gathered over
        # the CP group, and saves those (the all-gather itself saves nothing for its backward)
        kv_formula = "B*s*b*a*(d_nope + d_rope + d_v)" if arch.uses_mla else "B*s*b*2*g*d_head"
        out.append(Entry("q kept by flex attention (this rank's s/cp queries)", T * qw, B, "tp",
                         "B*s*b*a*(d_nope + d_rope)" if arch.uses_mla else "B*s*b*a*d_head", recompute=UP_PROJ))
        out.append(Entry("k, v all-gathered over CP (the whole sequence), kept by flex attention",
                         T * par.cp * (k_width + v_width), B, "tp", kv_formula, recompute=UP_PROJ,
                         split_by_cp=False))
        out.append(Entry("flash log-sum-exp (fp32)", T * a, 4, "tp", "4*s*b*a", recompute=CORE))
    elif training.attention == "flash" and not math_sdpa:
        out.append(Entry("q, k, v kept by flash attention", T * (qw + k_width + v_width), B, "tp", v_formula,
                         recompute=UP_PROJ))
        out.append(Entry("flash log-sum-exp (fp32)", T * a, 4, "tp", "4*s*b*a", recompute=CORE))
    else:
        # Unfused attention expands K and V to every query head before the matmuls (repeat_kv).
        scores = b * a * s * training.seq_len
        head_v = arch.v_head_dim if arch.uses_mla else arch.head_dim
        out.append(Entry("q and k (keys expanded to all heads) for QK^T", T * 2 * qw, B, "tp", "2*B*s*b*a*d_head",
                         recompute=UP_PROJ))
        if fused_kernels(training) and megatron_fused_softmax(arch, training, par):
            out.append(Entry("softmax output (scores)", scores, B, "tp", "B*a*s^2*b", recompute=CORE))
        elif fused_kernels(training):
            # Megatron-Core FusedScaleMaskSoftmax.forward_torch_softmax (fusions/fused_softmax.py) with
            # attention_softmax_in_fp32: softmax keeps its fp32 output, scores x V its 16-bit copy, and
            # masked_fill_ the causal mask that transformer/utils.py get_default_causal_mask makes per layer
            out.append(Entry("softmax output (fp32, unfused softmax)", scores, 4, "tp", "4*a*s^2*b", recompute=CORE))
            if B < 4:
                out.append(Entry("softmax output cast to the compute dtype", scores, B, "tp", "B*a*s^2*b",
                                 recompute=CORE))
            out.append(Entry("causal mask (bool, made per layer)", s * training.seq_len, 1, "none", "s^2",
                             recompute=CORE))
        elif compiled(training):
            # Inductor's partitioner (COMPILE_SOURCE): the QK^T scores (a bmm output) and the softmax's per-row
            # max and sum (reductions) are kept and the fp32 softmax recomputed from them; the compute-dtype
            # probabilities are kept for scores x V's backward (measured, Llama layer with eager attention).
            # A soft-capping tanh is pointwise and recomputed (derived, not measured).
            out.append(Entry("QK^T scores (kept by the compiled layer)", scores, B, "tp", "B*a*s^2*b", recompute=CORE))
            out.append(Entry("softmax max and sum per row (fp32, kept by the compiled layer)", 2 * T * a, 4, "tp",
                             "2*4*s*b*a", recompute=CORE))
            out.append(Entry("softmax output cast to the compute dtype", scores, B, "tp", "B*a*s^2*b", recompute=CORE))
        elif math_sdpa:  # SDPA's math backend (kbit.py): q and k scaled, _safe_softmax's fp32 output
            out.append(Entry("softmax output (fp32, SDPA math backend)", scores, 4, "tp", "4*a*s^2*b", recompute=CORE))
        else:  # transformers' eager attention: softmax in fp32, then cast back for scores x V
            if arch.attention_logit_softcapping:  # tanh keeps its output for backward
                out.append(Entry("soft-capped scores (tanh output)", scores, B, "tp", "B*a*s^2*b", recompute=CORE))
            out.append(Entry("softmax output (fp32)", scores, 4, "tp", "4*a*s^2*b", recompute=CORE))
            if not prepared(training):  # an fp32 query (kbit.py): the cast back is no copy
                out.append(Entry("softmax output cast to the compute dtype", scores, B, "tp", "B*a*s^2*b",
                                 recompute=CORE))
        if training.dropout > 0:
            out.append(Entry("attention dropout mask", scores, 1, "tp", "a*s^2*b", recompute=CORE))
            out.append(Entry("attention dropout output", scores, B, "tp", "B*a*s^2*b", recompute=CORE))
        out.append(Entry("v (expanded to all heads) for scores x V", T * a * head_v, B, "tp", "B*s*b*a*d_head",
                         recompute=UP_PROJ))
    fused = training.attention == "flash" and not math_sdpa  # a fused kernel keeps its output for its backward
    out.append(Entry(ATTENTION_OUTPUT, T * arch.attention_output_width, B, "tp",
                     "B*s*b*a*d_v", gemm_input=True, for_weights=() if fused else ("o",)))
    if arch.norms_per_layer > 2:  # Gemma-2/3 normalise the attention output before the residual add
        out += _norm("post-attention norm input", T, arch, training)
    if training.dropout > 0:
        out.append(Entry("attention residual dropout mask", T * h, 1, "sp", "s*b*h"))
    return out


def megatron_fused_softmax(arch: Architecture, training: Training, par: Parallel) -> bool:
    """Megatron-Core runs the fused upper-triangular softmax kernel (one 16-bit output kept) when
    attention_softmax_fusion is on and FusedScaleMaskSoftmax.is_kernel_available holds: 16-bit scores,
    16 < s <= 4096, s % 4 == 0 and b x heads/t a multiple of the kernel's batches per block, 4 (8 for
    s <= 128: get_batch_per_block in csrc scaled_masked_softmax.h); else its torch softmax."""
    s, heads = training.seq_len, training.micro_batch_size * arch.num_attention_heads // par.tp
    return (training.attention_softmax_fusion and training.compute_dtype in ("bf16", "fp16") and 16 < s <= 4096
            and s % 4 == 0 and heads % (8 if s <= 128 else 4) == 0)


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
    if compiled(training):
        # Inductor's partitioner (COMPILE_SOURCE): act(gate) is pointwise and recomputed from the kept gate
        # output; gate, up and their product (the down projection's input) stay (measured)
        return [Entry(f"{prefix}gate and up projections", 2 * T * width, B, divided_by, f"2*B*s*b*{f}", recompute=tags),
                Entry(f"{prefix}fc2 input (gated product)", T * width, B, divided_by, f"B*s*b*{f}", gemm_input=True,
                      recompute=act_tags, for_weights=(down,))]
    # transformers' LlamaMLP: down(act(gate(x)) * up(x)) keeps gate, up, act(gate) and the product
    return [Entry(f"{prefix}gate and up projections", 2 * T * width, B, divided_by, f"2*B*s*b*{f}", recompute=tags),
            Entry(f"{prefix}activation output", T * width, B, divided_by, f"B*s*b*{f}", recompute=act_tags),
            Entry(f"{prefix}fc2 input (gated product)", T * width, B, divided_by, f"B*s*b*{f}", gemm_input=True,
                  recompute=act_tags, for_weights=(down,))]


def mlp_entries(arch: Architecture, training: Training, par: Parallel, kind: str) -> list[Entry]:
    B = bytes_per_element(training.compute_dtype)
    T = tokens_per_gpu(training, par)
    h = arch.hidden_size
    out = _norm("MLP norm input", T, arch, training)
    if kind == "dense":
        out += _norm_output("fc1 input", T, arch, training, 1 if fused_kernels(training) or not arch.gated_mlp else 2,
                            NORM, weights=("gate", "up"))
        out += _mlp("", T, arch.intermediate_size, arch, training, "tp", "f", ("mlp",))
    else:
        e, k, phi = arch.num_experts, arch.num_experts_per_token, training.moe_capacity_factor
        out.append(Entry("router input", T * h, B, "sp", "B*s*b*h", recompute=NORM, for_weights=("router",)))
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
        if arch.num_shared_experts:
            width = arch.shared_expert_intermediate_size * arch.num_shared_experts
            out += _mlp("shared experts: ", T, width, arch, training, "tp", "f_shared", ("shared_experts", "moe"))
    if arch.norms_per_layer > 2:
        out += _norm("post-MLP norm input", T, arch, training)
    if training.dropout > 0:
        out.append(Entry("MLP residual dropout mask", T * h, 1, "sp", "s*b*h"))
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


# --- Megatron's all-to-all dispatcher: the moments inside an MoE layer ---------------------------------

MEGATRON_ALLTOALL = (
    "Megatron-Core 0.16.1 transformer/moe/token_dispatcher.py MoEAlltoAllTokenDispatcher (drop-and-pad): "
    "dispatch_preprocess permutes the tokens (moe_utils.permute), token_dispatch sends them (all_to_all), "
    "dispatch_postprocess gathers them over expert-TP and sorts them by local expert (a contiguous copy); "
    "combine_preprocess unsorts the experts' outputs (a copy) and reduce-scatters them over expert-TP in the "
    "probabilities' dtype, token_combine sends them back; moe_layer.py MoELayer.forward holds the permuted tokens "
    "until it returns; experts.py SequentialMLP runs its local experts one after another and concatenates their "
    "outputs; measured, tests/data/measured/megatron")


def _routed(arch: Architecture, training: Training, par: Parallel) -> tuple[float, int]:
    """k*phi*s*b/cp, the routed tokens of this rank's tokens before the sequence-parallel division, and the
    local experts per rank."""
    return (tokens_per_gpu(training, par) * arch.num_experts_per_token * training.moe_capacity_factor,
            max(1, arch.num_experts // par.ep))


def _router_dtype_bytes(training: Training) -> float:
    return 8 if training.moe_router_dtype == "fp64" else bytes_per_element(training.moe_router_dtype)


def moe_combine_moment(arch: Architecture, training: Training, par: Parallel, send_bytes: float) -> list[Entry]:
    """The last moment of an MoE layer's forward (MEGATRON_ALLTOALL), beside the tensors the layer keeps: the
    permuted tokens it sent (`send_bytes` per element), the experts' concatenated outputs and their copy
    unsorted by local expert, while the expert-TP reduce-scatter and the returning all-to-all allocate their
    outputs. With --moe-router-dtype the outputs are cast to that dtype before the reduce-scatter, whose output is
    in it too (the largest moment then: the bf16 copy and the all-to-all come after both are freed)."""
    B = bytes_per_element(training.compute_dtype)
    n, local = _routed(arch, training, par)
    h = arch.hidden_size
    out = []
    if par.ep > 1:
        out.append(Entry("permuted tokens sent by the all-to-all (held by MoELayer.forward)", n * h, send_bytes, "sp",
                         f"{send_bytes:g}*phi*k*s*b*h"))
    out.append(Entry("experts' outputs, concatenated", n * h * par.etp, B, "sp", "B*phi*k*s*b*h*etp"))
    if local > 1 and par.ep * par.etp > 1:  # [etp*ep, E_local, ...].transpose(0, 1).contiguous(): no copy for 1
        out.append(Entry("experts' outputs unsorted by local expert (a copy)", n * h * par.etp, B, "sp",
                         "B*phi*k*s*b*h*etp"))
    if par.etp > 1 and training.moe_router_dtype:
        R, dt = _router_dtype_bytes(training), training.moe_router_dtype
        out.append(Entry(f"experts' outputs cast to the router dtype ({dt}) for the expert-TP reduce-scatter",
                         n * h * par.etp, R, "sp", "R*phi*k*s*b*h*etp"))
        out.append(Entry(f"expert-TP reduce-scatter output ({dt})", n * h, R, "sp", "R*phi*k*s*b*h"))
        return out
    if par.etp > 1:
        out.append(Entry("expert-TP reduce-scatter output", n * h, B, "sp", "B*phi*k*s*b*h"))
    if par.ep > 1:
        out.append(Entry("all-to-all output (the tokens back on their rank)", n * h, B, "sp", "B*phi*k*s*b*h"))
    return out


def moe_expert_backward_moment(arch: Architecture, training: Training, par: Parallel) -> list[Entry]:
    """The largest moment of an MoE layer's backward in its experts (MEGATRON_ALLTOALL), beside the kept tensors:
    the gradient of the experts' outputs sorted by local expert (the backward of combine_preprocess's unsort
    copy, or the gradient arriving in its place), and for the expert being differentiated (SequentialMLP: one at
    a time, each with 1/E_local of the tokens) the gradient of its fc2 input and the weighted SwiGLU's backward
    output, its fc1 output's gradient (twice the width; without a gated MLP the activation's gradient, as wide).
    GroupedMLP (--moe-grouped-gemm) differentiates all local experts at once: `grouped_mlp_backward_moment`."""
    if training.moe_grouped_gemm:
        return grouped_mlp_backward_moment(arch, training, par)
    B = bytes_per_element(training.compute_dtype)
    n, local = _routed(arch, training, par)
    f = arch.moe_intermediate_size
    one = n * f / local  # one expert's n*etp/E_local tokens x its f_e/etp columns on this rank
    return [Entry("gradient of the experts' outputs (sorted by local expert)", n * arch.hidden_size * par.etp, B,
                  "sp", "B*phi*k*s*b*h*etp"),
            Entry("one expert's gradient of its fc2 input", one, B, "sp", "B*phi*k*s*b*f_e/E_local"),
            Entry("one expert's gradient of its fc1 output" + (" (gate and up)" if arch.gated_mlp else ""),
                  one * (2 if arch.gated_mlp else 1), B, "sp",
                  ("2*" if arch.gated_mlp else "") + "B*phi*k*s*b*f_e/E_local")]


MEGATRON_GROUPED_MLP = (
    "Megatron-Core 0.16.1 transformer/moe/experts.py GroupedMLP.forward (--moe-grouped-gemm): fc1 and fc2 are one "
    "grouped GEMM each over all local experts (grouped_gemm ops.py GroupedGemm: forward saves (a, b, batch_sizes); "
    "backward returns agrad = gmm(grad, b, trans_b=not trans_b) [tokens, k] and bgrad = gmm(a, grad, trans_a=True) "
    "[experts, k, n], b's shape), between them the weighted activation (activation_func_with_probs; with moe_act "
    "recompute under tensor_parallel.CheckpointWithoutOutput, whose backward holds the recomputed output until it "
    "returns); the weight gradients flow through the views of weight1/weight2 to the DDP hooks; "
    "measured, tests/data/measured/megatron (emulated gmm, validation/megatron/kernels.py)")


def grouped_mlp_backward_moment(arch: Architecture, training: Training, par: Parallel) -> list[Entry]:
    """The largest moment of GroupedMLP's backward (MEGATRON_GROUPED_MLP), beside the kept tensors, every local
    expert's tokens at once; the larger of two:
    - fc2's grouped GEMM backward returning: the gradient of the experts' outputs (sorted by local expert) it reads,
      its input gradient (the activation's output gradient, [phi*k*s*b*etp, f_e/etp]) and its weight gradient
      ([E_local, f_e/etp, h], b's shape);
    - the weighted activation's backward writing fc1's output gradient (gate and up for a gated MLP: twice f_e/etp
      wide): the outputs' gradient and fc2's saved input (the activation's output) are freed by then; the weight
      gradient is not yet handed to the DDP hook (the activation's backward node, created later in forward, runs
      first). The activation's output gradient takes the place of the freed kept output, so it adds nothing.
    With moe_act recomputed the activation's output is not kept: before fc2's backward the checkpoint recomputes
    it (held by the checkpoint until its backward returns) and copies it into the discarded output's storage (fc2's
    saved input, freed after fc2's backward), so both moments hold the recomputed output and the first its copy
    too, and the activation's output gradient adds to the second."""
    B = bytes_per_element(training.compute_dtype)
    n, local = _routed(arch, training, par)
    f, h = arch.moe_intermediate_size, arch.hidden_size
    gated = arch.gated_mlp
    act_recomputed = training.recompute == "selective" and "moe_act" in training.recompute_modules
    wgrad = Entry("experts' fc2 weight gradient (all local experts, grouped GEMM)", local * f * h / par.etp, B, "none",
                  "B*E_local*f_e*h/etp", split_by_cp=False)
    act_grad = Entry("gradient of the experts' activation output (fc2's input), all local experts", n * f, B, "sp",
                     "B*phi*k*s*b*f_e")
    recomputed = Entry("experts' activation output recomputed (held by the moe_act checkpoint)", n * f, B, "sp",
                       "B*phi*k*s*b*f_e")
    fc2 = [Entry("gradient of the experts' outputs (sorted by local expert)", n * h * par.etp, B, "sp",
                 "B*phi*k*s*b*h*etp"), act_grad, wgrad]
    if act_recomputed:
        fc2 += [recomputed, recomputed._replace(name="its copy in the discarded output's storage (fc2's saved input)")]
    fc1_grad = Entry("gradient of the experts' fc1 output, all local experts" + (" (gate and up)" if gated else ""),
                     n * f * (2 if gated else 1), B, "sp", ("2*" if gated else "") + "B*phi*k*s*b*f_e")
    activation = [wgrad, fc1_grad]
    if act_recomputed:
        activation += [act_grad, recomputed]
    return max(fc2, activation, key=lambda moment: sum(e.bytes(par) for e in moment))


def moe_router_dtype_backward_moment(arch: Architecture, training: Training, par: Parallel) -> list[Entry]:
    """--moe-router-dtype under expert-TP: in backward the gradient of the reduce-scatter's output is cast to the
    router dtype and all-gathered in it (the backward of combine_preprocess's cast and reduce-scatter)."""
    if not (training.moe_router_dtype and par.etp > 1):
        return []
    n, _ = _routed(arch, training, par)
    R, dt, h = _router_dtype_bytes(training), training.moe_router_dtype, arch.hidden_size
    return [Entry(f"gradient cast to the router dtype ({dt}) before the expert-TP all-gather", n * h, R, "sp",
                  "R*phi*k*s*b*h"),
            Entry(f"expert-TP all-gather of that gradient ({dt})", n * h * par.etp, R, "sp", "R*phi*k*s*b*h*etp")]


MEGATRON_ALLGATHER = (
    "Megatron-Core 0.16.1 transformer/moe/token_dispatcher.py MoEAllGatherTokenDispatcher: token_dispatch "
    "all-gathers the hidden states over the EP x expert-TP group into the global memory buffer 'mpu' "
    "(tensor_parallel/mappings.py _gather_along_first_dim use_global_buffer=True; utils.py GlobalMemoryBuffer, "
    "allocated once and kept), dispatch_postprocess permutes this rank's local experts' tokens out of it "
    "(moe_utils.permute: index_select), combine_preprocess unpermutes the experts' outputs into zeros over every "
    "gathered token (moe_utils.unpermute: scatter_add) and token_combine reduce-scatters them back; in backward "
    "the reduce-scatter's gradient is all-gathered (a new tensor) and gathered per routed token; "
    "measured, tests/data/measured/megatron")


def _gathered(training: Training, par: Parallel) -> float:
    """s*b/cp*ep*etp: the tokens every rank of the EP x expert-TP group gathers, before the sequence-parallel
    division (with it each rank contributes s*b/(cp*t))."""
    return tokens_per_gpu(training, par) * par.ep * par.etp


MEGATRON_GLOBAL_BUFFER = ("Megatron-Core 0.16.1 utils.py GlobalMemoryBuffer.get_tensor (one buffer per name and dtype, "
                          "grown to the largest request, never freed): 'mpu' holds tensor_parallel/layers.py's "
                          "sequence-parallel all-gather of a column-parallel linear's input and "
                          "MoEAllGatherTokenDispatcher's all-gather of the hidden states")


def global_memory_buffer(arch: Architecture, training: Training, par: Parallel, moe_stage: bool) -> list[Entry]:
    """Megatron's global memory buffer 'mpu' (MEGATRON_GLOBAL_BUFFER): one per rank, as large as its largest
    request, kept from the first step on. Sequence parallelism gathers every column-parallel linear's input
    into it (s*b*h over the TP group); the all-gather dispatcher gathers the hidden states over the EP x
    expert-TP group into the same buffer."""
    gathers = [par.tp] if par.sequence_parallel and par.tp > 1 else []
    if moe_stage and training.moe_dispatcher == "allgather" and par.ep * par.etp > 1:
        gathers.append(par.ep * par.etp)
    if not gathers:
        return []
    widest = max(gathers)
    return [Entry("global memory buffer 'mpu' (the all-gathered hidden states; allocated once, kept)",
                  tokens_per_gpu(training, par) * widest * arch.hidden_size, bytes_per_element(training.compute_dtype),
                  "sp", f"B*s*b*h*{widest}")]


def moe_allgather_combine_moment(arch: Architecture, training: Training, par: Parallel) -> list[Entry]:
    """The last moment of an MoE layer's forward under the all-gather dispatcher (MEGATRON_ALLGATHER), beside
    the tensors the layer keeps: the experts' concatenated outputs while the unpermute's zeros over every
    gathered token are filled; both are freed before the reduce-scatter's output (s*b*h/t) is allocated."""
    B = bytes_per_element(training.compute_dtype)
    n, _ = _routed(arch, training, par)
    h = arch.hidden_size
    return [Entry("experts' outputs, concatenated", n * h * par.etp, B, "sp", "B*phi*k*s*b*h*etp"),
            Entry("experts' outputs unpermuted over the gathered tokens (zeros, scatter_add)",
                  _gathered(training, par) * h, B, "sp", "B*s*b*h*ep*etp")]


def moe_allgather_combine_backward_moment(arch: Architecture, training: Training, par: Parallel) -> list[Entry]:
    """The first moment of an MoE layer's backward under the all-gather dispatcher (MEGATRON_ALLGATHER): the
    reduce-scatter's gradient all-gathered over the EP x expert-TP group (a new tensor, not the global buffer)
    while the unpermute's backward gathers it per routed token (the gradient of the experts' outputs)."""
    B = bytes_per_element(training.compute_dtype)
    n, _ = _routed(arch, training, par)
    h = arch.hidden_size
    out = []
    if par.ep * par.etp > 1:
        out.append(Entry("gradient of the combine all-gathered over EP x expert-TP", _gathered(training, par) * h,
                         B, "sp", "B*s*b*h*ep*etp"))
    out.append(Entry("gradient of the experts' outputs (gathered per routed token)", n * h * par.etp, B, "sp",
                     "B*phi*k*s*b*h*etp"))
    return out


def moe_recomputed_entries(arch: Architecture, training: Training, par: Parallel) -> list[Entry]:
    """Selective recompute of "moe" (Megatron's MoELayer.forward under tensor_parallel.checkpoint,
    moe_layer.py): in backward the block's forward runs again, so every tensor of the MoE block that the
    recompute dropped (the router's, the dispatched tokens, the experts', the shared experts') exists again,
    with the norm's output it starts from when "layernorm" is recomputed too, beside the block's own moments."""
    if training.recompute != "selective" or "moe" not in training.recompute_modules:
        return []
    modules = frozenset(training.recompute_modules)
    block = {e.name for e in mlp_entries(arch, training, par, "moe")}
    return [e for e in layer_entries(arch, training, par, "moe") if e.name in block and dropped(e, modules)]


def fp8_activation_bytes(training: Training) -> float:
    """A quantized GEMM input: 1 byte plus its scales (MXFP8: one per 32; blockwise: one fp32 per
    1x128 tile, DeepSeek-V3 section 3.3.1). Under fsdp2, torchao's Float8Linear saves the
    high-precision input and casts it again in backward (torchao/float8/float8_linear.py,
    matmul_with_hp_or_float8_args.forward: ``ctx.save_for_backward(input_hp, weight_hp_t)``)."""
    if torchao_float8(training):
        return bytes_per_element(training.compute_dtype)
    return {"mxfp8": 1 + 1 / 32, "blockwise": 1 + 4 / 128}.get(training.fp8_recipe, 1.0)


TE_FLASH_OUTPUT_SOURCE = ("TransformerEngine 2.x pytorch/attention/dot_product_attention/backends.py FusedAttnFunc."
                          "forward: without FP8 attention (fp8_dpa) it saves (q, k, v, out) in the compute dtype for its "
                          "backward, while the output projection (an FP8 linear) saves its own quantized copy of `out`")


ATTENTION_OUTPUT = "attention output (output projection input)"
MLA_ORIGINAL_INPUT_SOURCE = ("Megatron-Core 0.16.1 transformer/multi_latent_attention.py MLASelfAttention.__init__: "
                             "with FP8 (a recipe other than delayed, TE >= 2.6) set_save_original_input(linear_proj), "
                             "so the output projection saves the attention output the fused attention already keeps")


def _proj_saves_original_input(arch: Architecture, training: Training) -> bool:
    """Megatron's MLA output projection keeps the attention output itself under FP8 (every recipe the
    estimator offers under megatron is a current-scaling one, not delayed), not a quantized copy."""
    return arch.uses_mla and training.framework == "megatron" and training.attention == "flash"


def _flash_output_beside_fp8_copy(arch: Architecture, training: Training, par: Parallel) -> list[Entry]:
    """Under TransformerEngine's FP8 recipe the attention kernel still runs in the compute dtype and
    keeps its output for its own backward; the output projection keeps a quantized copy beside it
    (the FP8 ledger's "attention output" entry), so the compute-dtype output is a second tensor,
    except where the projection saves its original input (MLA under Megatron: one tensor, kept in
    the compute dtype). Recomputing the core attention (selective core_attn) drops it with the
    kernel's other tensors."""
    if training.attention != "flash" or training.mode != "training" or _proj_saves_original_input(arch, training):
        return []
    T = tokens_per_gpu(training, par)
    return [Entry("attention output kept by flash attention (compute dtype, beside the FP8 copy)",
                  T * arch.attention_output_width,
                  bytes_per_element(training.compute_dtype), "tp", "B*s*b*a*d_v", recompute=CORE)]


def torchao_float8(training: Training) -> bool:
    """fp8 under fsdp2 is torchao's Float8Linear (torchtitan's Float8LinearConverter)."""
    return training.fp8 and training.framework == "fsdp2"


def layer_entries(arch: Architecture, training: Training, par: Parallel, kind: str, first: bool = False) -> list[Entry]:
    """One layer's saved tensors; `first`: the first layer of an adapter run whose input needs no
    gradient (`adapters.first_layer_input_frozen`)."""
    entries = attention_entries(arch, training, par) + mlp_entries(arch, training, par, kind)
    if training.adapter:
        from .adapters import adapted_layer_entries
        entries = adapted_layer_entries(entries, arch, training, par, kind, first)
    if training.fp8 and not torchao_float8(training):
        # TransformerEngine saves each FP8 GEMM's quantized input for backward
        q = fp8_activation_bytes(training)
        original = ATTENTION_OUTPUT if _proj_saves_original_input(arch, training) else None
        entries = [e._replace(bytes_per_element=q, formula=e.formula.replace("B*", "B_fp8*", 1))
                   if e.gemm_input and e.name != original else e
                   for e in entries] + _flash_output_beside_fp8_copy(arch, training, par)
    if op_level(training):
        # every tensor the eager layer keeps is recomputed; the policy's saves are entries of their own
        entries = [e._replace(recompute=e.recompute + OP_LEVEL) for e in entries] + op_level_saved_entries(
            arch, training, par)
    return entries


# --- torchtitan's operator-level selective checkpointing (recompute "selective" under fsdp2) ----------

OP_LEVEL = ("op_level",)  # the tag of everything operator-level checkpointing recomputes
OP_LEVEL_SOURCE = ("torchtitan v0.3.0 distributed/activation_checkpoint.py SelectiveAC: a block's input is kept by "
                   "the checkpoint; the outputs of compute-intensive ops (torch._functorch.partitioners."
                   "get_default_op_list: mm, flash attention) and of reduce_scatter/all_to_all are saved, except "
                   "every second mm of the block; everything else is recomputed in backward")


def op_level(training: Training) -> bool:
    """recompute "selective" means torchtitan's operator-level policy under fsdp2 (the contract)."""
    return training.recompute == "selective" and training.framework == "fsdp2"


class BlockGemm(NamedTuple):
    name: str
    width: int  # output features before TP
    symbol: str  # the width in the ledger's notation
    row_parallel: bool  # its input is split over TP, its output whole until the reduce-scatter
    saved: bool  # the operator-level policy keeps its output


def op_level_gemms(arch: Architecture) -> list[BlockGemm]:
    """A dense block's matmuls in the order torchtitan runs them: the policy counts mm calls per
    block from 1 and recomputes the even ones. Attention: wq, wk, wv, wo; FeedForward
    w2(silu(w1(x)) * w3(x)) runs w1, w3, w2; a plain MLP fc1, fc2."""
    h = arch.hidden_size
    f = arch.intermediate_size
    order = [("q projection", arch.q_width, "a*d_head", False), ("k projection", arch.kv_width, "g*d_head", False),
             ("v projection", arch.kv_width, "g*d_head", False), ("output projection", h, "h", True)]
    if arch.gated_mlp:
        order += [("w1 (gate)", f, "f", False), ("w3 (up)", f, "f", False), ("w2 (down)", h, "h", True)]
    else:
        order += [("fc1", f, "f", False), ("fc2", h, "h", True)]
    return [BlockGemm(name, width, symbol, row, count % 2 == 1)
            for count, (name, width, symbol, row) in enumerate(order, start=1)]


def op_level_saved_entries(arch: Architecture, training: Training, par: Parallel) -> list[Entry]:
    """What the operator-level policy keeps per dense layer: the block input, the odd matmuls'
    outputs (column-parallel ones divided by TP; a row-parallel one is whole, partial sums before
    its reduce-scatter), under TP every reduce-scatter's output, and flash attention's output and
    log-sum-exp."""
    B, T = bytes_per_element(training.compute_dtype), tokens_per_gpu(training, par)
    out = [Entry("block input (kept by the checkpoint)", T * arch.hidden_size, B, "sp", "B*s*b*h", recompute=())]
    for g in op_level_gemms(arch):
        if g.saved:
            out.append(Entry(f"{g.name} output (saved matmul)", T * g.width, B, "none" if g.row_parallel else "tp",
                             "B*s*b*h" if g.row_parallel else f"B*s*b*{g.symbol}"))
        if g.row_parallel and par.tp > 1:  # the policy saves every reduce-scatter, whatever the mm count
            out.append(Entry(f"{g.name} reduce-scatter output (saved collective)", T * g.width, B, "sp", "B*s*b*h"))
    out.append(Entry("flash attention output (saved)", T * arch.attention_output_width, B, "tp", "B*s*b*a*d_head"))
    out.append(Entry("flash log-sum-exp (saved, fp32)", T * arch.num_attention_heads, 4, "tp", "4*s*b*a"))
    return out


def op_level_recomputed_matmul_share(arch: Architecture) -> float:
    """Share of a dense block's matmul FLOPs the operator-level policy runs again in backward (its
    even matmuls; the roofline's recompute time)."""
    gemms = op_level_gemms(arch)
    width_in = {g.name: (arch.attention_output_width if g.name == "output projection" else
                         arch.intermediate_size if g.row_parallel else arch.hidden_size) for g in gemms}
    flops = {g.name: width_in[g.name] * g.width for g in gemms}
    return sum(flops[g.name] for g in gemms if not g.saved) / sum(flops.values())


def recomputed_layer_count(training: Training, layers: int) -> int:
    """Layers of a stage that full recompute checkpoints (keeping only their input): the first
    `recompute_layers` (Megatron's block method), or every `recompute_every`-th, floor(layers / N)
    (torchtitan's and torchtune's layer-level AC), or all of them."""
    if training.recompute != "full":
        return 0
    if training.recompute_every > 1:
        return layers // training.recompute_every
    return layers if training.recompute_layers is None else min(training.recompute_layers, layers)


def recomputed_modules(training: Training) -> frozenset[str]:
    """Modules whose outputs are recomputed instead of kept: selective recompute's list (Megatron),
    torchtitan's operator-level policy (fsdp2), or none."""
    if op_level(training):
        return frozenset(OP_LEVEL)
    return frozenset(training.recompute_modules) if training.recompute == "selective" else frozenset()


def dropped(entry: Entry, modules: frozenset[str]) -> bool:
    return any(tag in modules for tag in entry.recompute)


def layer_bytes(arch: Architecture, training: Training, par: Parallel, kind: str, selective: bool = False) -> float:
    modules = frozenset(training.recompute_modules) if selective else frozenset()
    return sum(e.bytes(par) for e in layer_entries(arch, training, par, kind) if not dropped(e, modules))


def layer_input_entry(arch: Architecture, training: Training, par: Parallel) -> Entry:
    """What full recompute keeps per layer: its input, 2sbh (divided by t with sequence
    parallelism), Korthikanti section 5."""
    return Entry("layer input", tokens_per_gpu(training, par) * arch.hidden_size,
                 bytes_per_element(training.compute_dtype), "sp", "B*s*b*h")


def layer_input_bytes(arch: Architecture, training: Training, par: Parallel) -> float:
    return layer_input_entry(arch, training, par).bytes(par)


# --- first and last stage ------------------------------------------------------------------------

def embedding_entries(arch: Architecture, training: Training, par: Parallel) -> list[Entry]:
    """First stage, per micro-batch: the int64 token ids the embedding keeps for its backward, and
    the embedding dropout mask (Korthikanti section 4.3: 8sbp + sbhp over p micro-batches)."""
    T = tokens_per_gpu(training, par)
    out = [Entry("token ids (int64)", T, 8, "none", "8*s*b", for_weights=("embedding",))]
    if training.dropout > 0:
        out.append(Entry("embedding dropout mask", T * arch.hidden_size, 1, "sp", "s*b*h"))
    from .adapters import kept  # a frozen embedding keeps no token ids
    return kept(out, training, arch)


@dataclass(frozen=True)
class LossMemory:
    saved: list[Entry]  # kept from the forward pass to the backward pass
    forward: list[Entry]  # alive only while the loss is computed (the forward pass's last moment)
    backward: list[Entry]  # alive only while the loss is differentiated (the backward pass's first)
    source: str


DEFER_WGRAD_SOURCE = (
    "Megatron-Core 0.16.1 tensor_parallel/layers.py ColumnParallelLinear.forward appends the output layer's "
    "input_parallel to embedding_activation_buffer and LinearWithGradAccumulationAndAsyncCommunication.backward "
    "appends its grad_output to grad_output_buffer instead of running the weight-gradient GEMM, while fewer than "
    "wgrad_deferral_limit (0: no limit) are held; pipeline_parallel/schedules.py finish_embedding_wgrad_compute "
    "drains both (utils.py drain_embedding_wgrad_compute) after the last micro-batch's backward")


def deferred_wgrad_entries(arch: Architecture, training: Training, par: Parallel, vocab: int) -> list[Entry]:
    """One micro-batch's pair held by --defer-embedding-wgrad-compute on the last stage (DEFER_WGRAD_SOURCE):
    the output layer's input, [s/cp, b, h] in the compute dtype (sequence-parallel: this rank's s/t share, the
    tensor that was gathered), and the gradient of its output, the logits' gradient [s/cp, b, V/t]."""
    B = bytes_per_element(training.compute_dtype)
    T = tokens_per_gpu(training, par)
    return [Entry("output layer input (embedding_activation_buffer)", T * arch.hidden_size, B, "sp", "B*s*b*h"),
            Entry("output layer output gradient (grad_output_buffer)", T * vocab, B, "tp", "B*s*b*V")]


def deferred_wgrad_microbatches(training: Training, microbatches: int) -> int:
    """Micro-batches whose deferred pair is held at the last micro-batch's forward and backward on the last
    stage: those before it whose backward ran (1F1B's last stage runs each micro-batch's backward right after its
    forward), at most wgrad_deferral_limit (the buffer stops growing there; later ones compute at once). The
    current micro-batch's own pair is its saved head input and its loss gradient, counted with the loss."""
    if not training.defer_embedding_wgrad_compute:
        return 0
    earlier = microbatches - 1
    return min(earlier, training.wgrad_deferral_limit) if training.wgrad_deferral_limit else earlier


def loss_memory(arch: Architecture, training: Training, par: Parallel, vocab: int) -> LossMemory:
    """Final norm, LM head and cross-entropy on the last stage, per loss implementation.

    standard, fused kernels (Megatron's vocab-parallel cross-entropy): the logits are upcast to
    fp32 and the softmax is kept for backward, 4sbV/t (Korthikanti section 4.3: 4sbh(1 + V/h)/t
    with the two h-sized inputs); the compute-dtype logits sit beside it while it is made, and
    the compute-dtype gradient of the logits beside it in backward (stas00: "practically 6 bytes
    per logit").
    standard, PyTorch modules (transformers' ``ForCausalLMLoss``, the Trainer's compute_loss):
    forward holds the compute-dtype logits, their fp32 upcast and the fp32 log-softmax (kept for
    backward) at once; the Trainer returns only the loss, so the logits are gone before
    backward, whose first step holds the log-softmax and two fp32 gradients (nll_loss and
    log_softmax backward), as measured (tests/data/measured).
    fused: a fused cross-entropy kernel (Apex/TE, Liger's cross-entropy) works on the
    compute-dtype logits in place: B*s*b*V/t. Megatron's --cross-entropy-loss-fusion runs its
    default native implementation (fusions/fused_cross_entropy.py), which upcasts the logits and
    keeps the fp32 softmax as the unfused one does, and whose compiled backward holds one more fp32
    copy of it (Inductor's index_put): 4 more bytes per logit than standard at the start of
    backward (measured, tests/data/measured/megatron).
    chunked: fused linear + cross-entropy in token chunks (Liger FusedLinearCrossEntropy, Cut
    Cross-Entropy): logits never exist beyond one chunk; Liger computes the gradients of the
    head's input and weight during forward and keeps them for backward. Under fsdp2 it is
    torchtitan's ChunkedLossWrapper (`_torchtitan_chunked_loss`).
    """
    B = bytes_per_element(training.compute_dtype)
    T = tokens_per_gpu(training, par)
    h = arch.hidden_size
    saved = _norm("final norm input", T, arch, training)
    saved += _norm_output("LM head input", T, arch, training, 1, (), gemm=False, weights=("head",))
    forward: list[Entry] = []
    backward: list[Entry] = []
    if training.loss == "fused" and fused_kernels(training) and training.cross_entropy_impl == "te":
        # TE's CrossEntropyFunction (TE 2.x pytorch/cross_entropy.py, pytorch/triton/cross_entropy.py): the
        # forward writes the loss's gradient into the 16-bit logits and saves only them; it allocates an fp32
        # loss and an fp32 (max, sum, label logit) triple per token, gathered over TP; the backward scales
        # the logits in place (element_mul_kernel) and returns them
        gathered = 12 * par.tp if par.tp > 1 else 0
        saved.append(Entry("logits, holding their gradient (TE cross-entropy, in place)", T * vocab, B, "tp",
                           "B*s*b*V"))
        forward.append(Entry("TE cross-entropy fp32 loss and (max, sum, label logit) per token"
                             + (", gathered over TP" if gathered else ""), T * (16 + gathered), 1, "none",
                             "(4 + 12 + 12*t)*s*b" if gathered else "(4 + 12)*s*b"))
        source = ("TransformerEngine 2.x pytorch/cross_entropy.py CrossEntropyFunction and pytorch/triton/"
                  "cross_entropy.py cross_entropy_forward/backward; Megatron-Core language_module.py "
                  "(--cross-entropy-fusion-impl te)")
    elif training.loss in ("standard", "fused") and fused_kernels(training):
        saved.append(Entry("fp32 softmax of the logits", T * vocab, 4, "tp", "4*s*b*V"))
        forward.append(Entry("logits in the compute dtype, before the fp32 upcast", T * vocab, B, "tp", "B*s*b*V"))
        backward.append(Entry("gradient of the logits in the compute dtype", T * vocab, B, "tp", "B*s*b*V"))
        source = ("Korthikanti et al. 2022 section 4.3; stas00 ml-engineering (logits ~6 bytes each); Megatron-Core "
                  "fusions/fused_cross_entropy.py (native fusion: the same fp32 softmax)")
        if training.loss == "fused":
            # the native fusion's compiled backward (jit_fuser = torch.compile) copies the softmax before its
            # index_put (Inductor lowers index_put as a scatter into clone(x)); the unfused loss writes into it
            backward.append(Entry("fp32 copy of the softmax (the compiled backward's index_put)", T * vocab, 4, "tp",
                                  "4*s*b*V"))
            source += f"; {MEGATRON_NATIVE_CE_SOURCE}"
    elif training.loss == "standard" and compiled_loss(arch, training, par):  # torchtitan's compiled CrossEntropyLoss
        kept_logits, backward = compiled_cross_entropy(T, 1, vocab, training)
        saved += kept_logits
        source = TORCHTITAN_COMPILED_LOSS_SOURCE
    elif training.loss == "standard":
        saved.append(Entry("fp32 log-softmax of the logits", T * vocab, 4, "tp", "4*s*b*V"))
        if arch.final_logit_softcapping:  # cap * tanh(logits / cap): tanh keeps its output
            saved.append(Entry("soft-capped logits (tanh output)", T * vocab, B, "tp", "B*s*b*V"))
        forward.append(Entry("logits in the compute dtype", T * vocab, B, "tp", "B*s*b*V"))
        from .kbit import prepared
        if not prepared(training):  # fp32 logits (kbit.py): logits.float() is no copy
            forward.append(Entry("fp32 upcast of the logits (log-softmax input)", T * vocab, 4, "tp", "4*s*b*V"))
        backward.append(Entry("fp32 gradients of the log-softmax output and input", 2 * T * vocab, 4, "tp",
                              "2*4*s*b*V"))
        source = "transformers ForCausalLMLoss (logits.float(), cross_entropy); measured in tests/data/measured"
    elif training.loss == "chunked" and training.framework == "fsdp2":
        return _torchtitan_chunked_loss(arch, training, par, vocab)
    elif training.loss == "chunked" and training.framework == "torchtune":
        return _torchtune_chunked_loss(arch, training, par, vocab)
    elif training.loss == "fused":
        saved.append(Entry("logits (softmax and gradient computed in place)", T * vocab, B, "tp", "B*s*b*V"))
        source = "Megatron-Core cross_entropy_loss_fusion; Apex/TE fused cross-entropy"
    else:
        chunk = max(1.0, T * h / vocab)  # Liger: chunk = BT / ceil(V/h) tokens
        saved.append(Entry("gradient of the LM head input (computed in forward)", T * h, B, "sp", "B*s*b*h"))
        P = bytes_per_element(training.param_dtype)  # Liger allocates it like the weight
        # Liger allocates it only when the head's weight requires grad (not under a frozen-head adapter)
        saved.append(Entry("gradient of the LM head weight (computed in forward)", vocab * h, P, "tp", "P*V*h",
                           split_by_cp=False, for_weights=("head",)))
        forward.append(Entry("one chunk of logits and their fp32 gradient", chunk * vocab, B + 4, "tp",
                             "(B + 4)*(s*b*h/V)*V"))
        source = "Liger-Kernel fused_linear_cross_entropy (chunk = BT / ceil(V/h))"
    from .adapters import kept  # a frozen head keeps no input for its weight's gradient
    return LossMemory(saved=kept(saved, training, arch), forward=forward, backward=backward, source=source)


MEGATRON_NATIVE_CE_SOURCE = (
    "Megatron-Core 0.16.1 = 0.19.0 fusions/fused_cross_entropy.py calculate_gradients under torch.compile (core/jit.py); "
    "torch 2.13 torch/_inductor/lowering.py index_put -> index_put_impl_(clone(x)); Inductor's generated code: "
    "tests/data/measured/compile/megatron-fused-cross-entropy-bf16-s16-b2-v512.json")

TORCHTUNE_LOSS_CHUNKS = 8  # CEWithChunkedOutputLoss.num_output_chunks


def compiled_loss(arch: Architecture, training: Training, par: Parallel) -> bool:
    """The cross-entropy runs under torch.compile: torchtitan compiles its loss whenever compile is on
    (CompileConfig.components defaults to ["model", "loss"]: 0.3.0 config/configs.py, the same on main
    and since v0.1.0's components/loss.py, versions.py), the standard CrossEntropyLoss and the chunked
    wrapper's per-chunk loss alike; torchtune's recipes call training.compile_loss whenever compile=True
    (0.6.1 recipes/*.py), which compiles CEWithChunkedOutputLoss.compute_cross_entropy in place, while
    for another loss most recipes drop the compiled module it returns (full_finetune_distributed.py:345),
    so only the chunked loss counts. Measured without TP (the loss-parallel autograd Function and
    DTensor logits are not) and without a final logit soft-cap (no torchtitan or torchtune model has one)."""
    if not compiled(training) or par.tp > 1 or arch.final_logit_softcapping:
        return False
    return (training.framework == "fsdp2" and training.loss in ("standard", "chunked")) or \
        (training.framework == "torchtune" and training.loss == "chunked")


def compiled_cross_entropy(tokens: float, chunks: int, vocab: int, training: Training) -> tuple[list[Entry], list[Entry]]:
    """(kept for backward, backward's largest moment) of a compiled cross-entropy over `tokens` tokens'
    compute-dtype logits in `chunks` compiled calls: Inductor fuses the fp32 upcast, log-softmax and NLL
    into row reductions, so the graph keeps the 16-bit logits (its input) and an fp32 max and log-sum-exp
    per token; one call's backward allocates the 16-bit gradient of its logits and an fp32 value per token
    (measured, TORCHTITAN_COMPILED_LOSS_SOURCE). The backward runs the calls one by one, latest first."""
    B = bytes_per_element(training.compute_dtype)
    part = f"/{chunks}" if chunks > 1 else ""
    kept = [Entry("logits in the compute dtype, kept by the compiled cross-entropy", tokens * vocab, B, "tp",
                  "B*s*b*V"),
            Entry("fp32 max and log-sum-exp per token (compiled cross-entropy)", tokens, 8, "none", "8*s*b")]
    backward = [Entry(("one chunk's " if chunks > 1 else "") + "gradient of the logits in the compute dtype and an "
                      "fp32 value per token (compiled backward)", tokens / chunks * vocab, B, "tp", f"B*s*b*V{part}"),
                Entry("compiled backward's fp32 value per token", tokens / chunks, 4, "none", f"4*s*b{part}")]
    return kept, backward


def _torchtune_chunked_loss(arch: Architecture, training: Training, par: Parallel, vocab: int) -> LossMemory:
    """torchtune's CEWithChunkedOutputLoss (modules/loss/ce_chunked_output_loss.py): the decoder
    projects the final hidden states chunk by chunk (8 chunks, each chunk's input copied for the head
    matmul) and hands the loss the list of bf16 logits; the loss upcasts one chunk at a time and keeps
    every chunk's fp32 log-softmax for backward. So forward ends with every chunk's bf16 logits and one
    fp32 upcast; backward starts with one chunk's two fp32 gradients (measured,
    tests/data/measured/torchtune)."""
    B = bytes_per_element(training.compute_dtype)
    T, h, n = tokens_per_gpu(training, par), arch.hidden_size, TORCHTUNE_LOSS_CHUNKS
    saved = _norm("final norm input", T, arch, training)
    saved.append(Entry("LM head input (a copy per chunk)", T * h, B, "sp", "B*s*b*h", for_weights=("head",)))
    compiled_source = ""
    if compiled_loss(arch, training, par):  # compile_loss: every chunk's bf16 logits stay, no fp32 copy
        kept_logits, backward = compiled_cross_entropy(T, n, vocab, training)
        saved += kept_logits
        forward: list[Entry] = []
        compiled_source = f"; training/_compile.py compile_loss; {TORCHTITAN_COMPILED_LOSS_SOURCE}"
    else:
        saved.append(Entry("fp32 log-softmax of every chunk", T * vocab, 4, "tp", "4*s*b*V"))
        forward = [Entry("bf16 logits of every chunk", T * vocab, B, "tp", "B*s*b*V"),
                   Entry("one chunk's fp32 upcast", T / n * vocab, 4, "tp", f"4*s*b*V/{n}")]
        backward = [Entry("one chunk's fp32 gradients of the log-softmax output and input", 2 * T / n * vocab, 4,
                          "tp", f"2*4*s*b*V/{n}")]
    from .adapters import kept  # a frozen head keeps no input
    return LossMemory(saved=kept(saved, training, arch), forward=forward, backward=backward,
                      source="torchtune v0.6.1 modules/loss/ce_chunked_output_loss.py (8 chunks); "
                             "modules/transformer.py chunked_output" + compiled_source)


TORCHTITAN_LOSS_CHUNKS = 8  # ChunkedLossWrapper.Config.num_chunks


def torchtitan_loss_moments(arch: Architecture, training: Training, par: Parallel, vocab: int) -> list[list[Entry]]:
    """The chunked loss's moments beside its two accumulators (`_torchtitan_chunked_loss`): a chunk's
    cross-entropy, a chunk's head-weight gradient, and under FSDP the last chunk's reduce-scatter."""
    B, P = bytes_per_element(training.compute_dtype), bytes_per_element(training.param_dtype)
    T, h, n = tokens_per_gpu(training, par), arch.hidden_size, TORCHTITAN_LOSS_CHUNKS
    d = par.dp * par.cp
    if compiled_loss(arch, training, par):
        # the compiled cross-entropy of one chunk, forward and backward: the chunk's logits and their gradient,
        # three fp32 values per token (`compiled_cross_entropy`); under TP the loss-parallel autograd Function
        # (vocab-sharded logits, collectives in its forward) is not measured: eager ledger
        kept_logits, backward = compiled_cross_entropy(T / n, 1, vocab, training)
        chunk = [e._replace(name="one chunk: " + e.name) for e in kept_logits + backward]
    else:
        chunk = [Entry("one chunk: logits, fp32 log-softmax and its two fp32 gradients", T / n * vocab, B + 12, "tp",
                       f"(B + 12)*s*b*V/{n}")]
    moments = [chunk,
               [Entry("one chunk's LM head weight gradient (parameter dtype)", vocab * h, P, "tp", "P*V*h",
                      split_by_cp=False),
                Entry("one chunk's logits and their gradient", 2 * T / n * vocab, B, "tp", f"2*B*s*b*V/{n}")]]
    if d > 1:
        moments.append([Entry("LM head's reduce-scatter input (fp32), after the last chunk", vocab * h, 4, "tp",
                              "4*V*h", split_by_cp=False),
                        Entry("the last chunk's logits", T / n * vocab, B, "tp", f"B*s*b*V/{n}")])
    return moments


def _torchtitan_chunked_loss(arch: Architecture, training: Training, par: Parallel, vocab: int) -> LossMemory:
    """torchtitan's ChunkedLossWrapper (components/loss.py, the default of its recipes) runs the LM
    head's forward and backward chunk by chunk inside the loss call, during the forward pass: the
    head stays gathered (FSDP transients), its unsharded gradient accumulates in fp32 (FSDP2's
    reduce dtype) over the 8 chunks and is reduce-scattered after the last, and the hidden-state
    gradient accumulates in an fp32 buffer. Beside those two accumulators the loss's largest moment
    is one of: a chunk's cross-entropy (its logits, fp32 log-softmax and two fp32 gradients); a
    chunk's head-weight gradient (the parameter dtype, before FSDP2 adds it to the fp32 one) beside
    the chunk's logits and their gradient; under FSDP (d > 1) the last chunk's reduce-scatter, whose
    fp32 input (torch 2.13 FSDP2 foreach_reduce) sits beside the accumulated gradient and the last
    chunk's logits (measured, tests/data/measured/torchtitan, per-tensor breakdown). What backward
    keeps is the hidden-state gradient in the compute dtype (and the LM head's sharded gradient)."""
    B = bytes_per_element(training.compute_dtype)
    T, h, d = tokens_per_gpu(training, par), arch.hidden_size, par.dp * par.cp
    saved = _norm("final norm input", T, arch, training)
    saved.append(Entry("hidden-state gradient from the chunked loss", T * h, B, "sp", "B*s*b*h"))
    saved.append(Entry("LM head's sharded gradient (fp32, reduced inside the loss)", vocab * h / d, 4, "tp",
                       "4*V*h/d", split_by_cp=False))
    accumulators = [Entry("fp32 hidden-state gradient accumulator", T * h, 4, "sp", "4*s*b*h"),
                    Entry("LM head's unsharded fp32 gradient, accumulated over the chunks", vocab * h, 4, "tp",
                          "4*V*h", split_by_cp=False)]
    moments = torchtitan_loss_moments(arch, training, par, vocab)
    forward = accumulators + max(moments, key=lambda m: sum(e.bytes(par) for e in m))
    return LossMemory(saved=saved, forward=forward, backward=[],
                      source="torchtitan v0.3.0 components/loss.py ChunkedLossWrapper (8 chunks), GradAccumulator; "
                             "torch 2.13 distributed/fsdp/_fully_shard/_fsdp_collectives.py foreach_reduce"
                             + (f"; {TORCHTITAN_COMPILED_LOSS_SOURCE}" if compiled_loss(arch, training, par) else ""))


TORCHTITAN_COMPILED_LOSS_SOURCE = (
    "torchtitan v0.3.0 components/loss.py CrossEntropyLoss._maybe_compile (torch.compile of cross_entropy_loss, "
    "components default ['model', 'loss']); measured with validation/compile_saved.py loss_buffers (Inductor on CPU, "
    "torch 2.13): tests/data/measured/compile/torchtitan-cross-entropy-bf16-n64-v4096.json")


# --- pipeline schedule -----------------------------------------------------------------------------

def pipeline_filling_microbatches(par: Parallel, group: int | None = None) -> int:
    """The fewest micro-batches per step at which every pipeline rank holds as many in flight as
    any larger global batch would (see `in_flight_chunks`): p for 1F1B, where rank r holds
    min(p - r, m); interleaved, the fewest that Megatron-Core accepts (`interleaved_microbatches_error`)
    with m v >= W_0 + 1 chunk-forwards for rank 0's warm-up W_0 = 2(p - 1) + (v - 1)g: with the group
    g of `microbatch_group` that is g when g >= 2p - 1, else g + p (2p for the default g = p); 2p under
    DualPipe(V), the fewest it runs. Without a pipeline, one."""
    if par.pp == 1:
        return 1
    if par.schedule == "interleaved":
        return interleaved_filling_microbatches(par.pp, microbatch_group(par, group))
    # DualPipe and DualPipeV assert num_chunks >= 2 x num_ranks (deepseek-ai/DualPipe); ZB-H1 fills as 1F1B
    return 2 * par.pp if par.schedule in ("dualpipe", "dualpipev") else par.pp


def interleaved_filling_microbatches(p: int, group: int) -> int:
    """`pipeline_filling_microbatches` of Megatron's interleaved schedule: g when g >= 2p - 1, else g + p."""
    return group if group >= 2 * p - 1 else group + p


def global_batch_size(training: Training, par: Parallel) -> int:
    """The global batch the estimate assumes: the one given, else micro-batch x DP x the micro-batches
    that fill the pipeline, so that the default is what a real run on this layout holds rather than
    one micro-batch in flight."""
    if training.global_batch_size:
        return training.global_batch_size
    fill = pipeline_filling_microbatches(par, training.microbatch_group_size) if training.mode == "training" else 1
    return training.micro_batch_size * par.dp * fill


def microbatches(training: Training, par: Parallel) -> int:
    """m = global batch / (micro-batch x DP)."""
    return global_batch_size(training, par) // (training.micro_batch_size * par.dp)


# Qi et al. 2023 (Zero Bubble Pipeline Parallelism), Table 1: a layer's F pass keeps M_B = 34sbh
# (+ 5as^2b without flash attention); its B pass frees all but M_W = 32sbh, the inputs of its linear
# layers and their output gradients, which the deferred W pass reads (sail-sg zero-bubble
# WeightGradStore.put(total_input, grad_output, ...)). The share of a micro-batch's activations a
# deferred W holds is therefore 32/34.
ZB_W_SHARE = 32 / 34


def in_flight_chunks(rank: int, par: Parallel, m: int, chunks: tuple[range, ...] = (), group: int | None = None) -> float:
    """Micro-batches whose activations a pipeline rank holds at its peak, in units of the rank's
    whole layer stack (`chunks`, its layer ranges, weigh DualPipe's two chunks by their layers).

    1F1B (PipeDream-Flush, Narayanan et al. 2021): rank r runs p - r forwards before its first
    backward, so it holds min(p - r, m) micro-batches.
    Interleaved 1F1B with v chunks: `interleaved_in_flight` (Megatron-Core's warm-up, `group` its
    micro-batch group size). ZB-H1 and DualPipe(V): `zero_bubble_in_flight`, `dualpipe_in_flight`.
    """
    p, v = par.pp, par.vpp
    if par.schedule == "zero_bubble":
        return zero_bubble_in_flight(rank, p, m)
    if par.schedule in ("dualpipe", "dualpipev"):
        return dualpipe_in_flight(rank, par, chunks)
    if v == 1:
        return float(min(p - rank, m))
    return interleaved_in_flight(rank, p, v, m, microbatch_group(par, group))


def in_flight_per_rank(par: Parallel, m: int, chunks: list[tuple[range, ...]], group: int | None = None) -> list[float]:
    """`in_flight_chunks` of every rank, first to last (`chunks`: each rank's layer ranges), in one
    pass: an estimate asks for all of them, and 1F1B's and the interleaved schedule's closed forms
    cost one arithmetic step per rank."""
    p, v = par.pp, par.vpp
    if par.schedule in ("zero_bubble", "dualpipe", "dualpipev"):
        return [in_flight_chunks(r, par, m, c) for r, c in enumerate(chunks)]
    if v == 1:
        return [float(min(p - r, m)) for r in range(p)]
    g = microbatch_group(par, group)
    return [interleaved_in_flight(r, p, v, m, g) for r in range(p)]


# Megatron-Core's interleaved schedule (pipeline_parallel/schedules.py), the same at every release the
# estimator offers (versions.py: core_v0.16.1 and core_v0.19.0; tests/test_megatron_schedules.py runs
# each release's own code). It dates from core_v0.10.0 (commit 4295be1a, "tunable schedule with
# overlapping", 2024-11-01); before it, m = p ran every chunk-forward first (all m v in flight).
MEGATRON_SCHEDULE_SOURCE = ("Megatron-Core pipeline_parallel/schedules.py get_pp_rank_microbatches and "
                            "get_schedule_table (core_v0.16.1 = core_v0.19.0; since core_v0.10.0, commit 4295be1a)")


def microbatch_group(par: Parallel, group: int | None) -> int:
    """--microbatch-group-size-per-virtual-pipeline-stage, Megatron's default pp when unset
    (model_parallel_config.py __post_init__)."""
    return par.pp if group is None else group


def interleaved_warmup(rank: int, p: int, v: int, m: int, group: int) -> int:
    """Chunk-forwards rank r runs before its first backward (get_pp_rank_microbatches, training,
    without --overlap-moe-expert-parallel-comm): 2(p - r - 1) + (v - 1)g, all m v when that many or more."""
    return min(2 * (p - rank - 1) + (v - 1) * group, m * v)


def interleaved_in_flight(rank: int, p: int, v: int, m: int, group: int) -> float:
    """Rank r's chunk activations at its peak, in whole stacks (each chunk is 1/v of its layers): the
    warm-up W, then the steady state runs one forward before each backward, W + 1 at its top; all m v
    when the warm-up runs every chunk. For r = 0 and g = p that is p(1 + (p - 1)/(p v)) stacks,
    Korthikanti's factor."""
    warmup = interleaved_warmup(rank, p, v, m, group)
    return (warmup if warmup == m * v else warmup + 1) / v


def interleaved_microbatches_error(p: int, m: int, group: int) -> str:
    """Why Megatron-Core's interleaved schedule refuses m micro-batches in groups of g (schedules.py
    forward_backward_pipelining_with_interleaving: p <= g <= m, and the last group, m mod g, empty or
    at least p), or "" when it runs them."""
    if not p <= group <= m:
        return f"at least one whole group (the group is {group}, pp = {p} or more)"
    if 0 < m % group < p:
        return f"a last group (micro-batches mod group) of 0 or at least pp = {p}, not {m % group}"
    return ""


def in_flight_rule(par: Parallel, group: int | None = None) -> tuple[str, str]:
    """(text appended to the activations' formula, its source) for the schedules beyond 1F1B."""
    schedule = par.schedule
    if schedule == "interleaved":
        return (f"; interleaved in flight: min(2(p - r - 1) + (v - 1) x {microbatch_group(par, group)} + 1, m v) "
                "chunks / v (micro-batch group of the virtual stages)", MEGATRON_SCHEDULE_SOURCE)
    if schedule == "zero_bubble":
        return ("; ZB-H1 in flight: min(p - r, m) + 32/34 x min(r, m - p + r) deferred W inputs",
                "Qi et al. 2023 (ZB-H1, Table 1); sail-sg zb-h1-quick-start schedules.py")
    if schedule in ("dualpipe", "dualpipev"):
        return (f"; {'DualPipe' if schedule == 'dualpipe' else 'DualPipeV'} in flight: (2n - k) x chunk 0 + "
                "(k + 1) x chunk 1 by layer share, 2n + 1 = PP + 1 stages in all",
                "deepseek-ai/DualPipe README and dualpipe.py/dualpipev.py step(); DeepSeek-V3 report 3.2.1")
    return "", ""


def zero_bubble_in_flight(rank: int, p: int, m: int) -> float:
    """ZB-H1 (Qi et al. 2023, section 2.1; sail-sg zb-h1-quick-start ``schedules.py``): rank r keeps
    1F1B's min(p - r, m) micro-batches and defers the W pass of its first r steady-state backwards,
    holding ZB_W_SHARE of a micro-batch for each: min(p - r, m) + 32/34 x min(r, m - (p - r)). Rank 0
    defers nothing, so the peak over ranks is 1F1B's (the paper's "same peak memory as 1F1B")."""
    return min(p - rank, m) + ZB_W_SHARE * min(rank, max(0, m - (p - rank)))


def dualpipe_in_flight(rank: int, par: Parallel, chunks: tuple[range, ...] = ()) -> float:
    """DualPipe and DualPipeV (deepseek-ai/DualPipe ``dualpipe.py``/``dualpipev.py`` step()): with
    n = p/2 and k = min(r, p - 1 - r) under DualPipe (n = p, k = r under DualPipeV), a rank runs
    2(n - k - 1) + (k + 1) forwards of its chunk in code phase 0 and k + 1 of phase 1, then one more
    phase-0 forward opens the main F&B loop, whose pairs keep the level: the peak holds 2n - k chunks
    of phase 0 and k + 1 of phase 1, 2n + 1 chunks in all: the README's "PP + 1" activations. Each
    chunk counts by its share of the rank's layers (DualPipe's second-half ranks run phase 0 on their
    second chunk). The deferred W passes (enable_zb) come after backwards, below this peak."""
    p = par.pp
    n, k = (p // 2, min(rank, p - 1 - rank)) if par.pp_schedule == "dualpipe" else (p, rank)
    sizes = [len(c) for c in chunks] if len(chunks) == 2 and any(chunks) else [1, 1]
    share = [size / sum(sizes) for size in sizes]
    swap = par.pp_schedule == "dualpipe" and rank >= p // 2  # dualpipe.py: phase ^= is_in_second_half
    return (2 * n - k) * share[swap] + (k + 1) * share[1 - swap]
