"""The activation ledger's entry and what every block's entries share: tokens per GPU, the
norms, autocast, torch.compile, FP8 GEMM inputs.
"""

from __future__ import annotations

from typing import NamedTuple

from ...spec.architecture import Architecture
from ...spec.choices import TRANSFORMERS_FRAMEWORKS
from ...spec.dtypes import bytes_per_element
from ...spec.parallel import Parallel
from ...spec.training import Training

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
    # how many like tensors of equal size the entry stands for (autograd makes them one by one): the
    # allocator replay (memory/reserved.py) requests each apart, as the caching allocator sees them
    tensors: int = 1

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


def eager_softmax_16_bit(arch: Architecture, training: Training) -> bool:
    """transformers' eager softmax without the fp32 upcast (`Architecture.eager_softmax_in_compute_dtype`: Llama 4,
    GPT-2, Falcon) keeps a 16-bit output, except under autocast: torch's autocast runs softmax in fp32 (its fp32
    op list; GPT-2's and Llama 4's softmax(scores)) and Falcon's softmax(dtype=hidden_states.dtype) is that of the
    fp32 residual stream, so the fp32 output and the 16-bit copy scores x V reads are kept as with the upcast
    (measured: tests/data/measured/falcon-7b-8layers-amp-adamw-norecompute-eager-s2048-b1)."""
    return arch.eager_softmax_in_compute_dtype and not autocast(training)


def torch_fused_rms_norm(arch: Architecture, training: Training) -> bool:
    """fsdp2 (torchtitan) runs torch.nn.RMSNorm: on CUDA ``F.rms_norm`` -> ``aten::rms_norm`` calls
    ``at::_fused_rms_norm`` (aten/src/ATen/native/layer_norm.cpp ``rms_norm_symint``), one kernel that
    keeps only its input and a per-row fp32 rstd (torch 2.13; measured, tests/data/measured/torchtitan).
    Gemma's (1 + w) norm is the model's own code, not nn.RMSNorm."""
    # torchtune's RMSNorm calls F.rms_norm on x.float() with a bf16 scale: the dtype mismatch sends
    # it down the composite path on CUDA too (layer_norm.cpp: "Mismatch dtype between input and
    # weight ... Cannot dispatch to fused implementation")
    return training.framework == "fsdp2" and arch.norm == "rmsnorm" and not arch.norm_unit_offset \
        and not arch.norm_fp32_scale


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


RESIDUAL_DROPOUT_SOURCE = ("transformers 5.23 models/llama/modeling_llama.py: LlamaAttention passes "
                           "config.attention_dropout to the attention function, and nothing else of the decoder drops "
                           "out (so Mistral, Mixtral, Qwen2/3, Gemma 1-3, OLMo-2, Granite, DeepSeek-V2/V3); measured: "
                           "tests/data/measured/peft/llama-3.2-1b-lora-r16-*-eager-attndrop10; Megatron-Core's "
                           "hidden_dropout drops the embeddings and both residual branches (Korthikanti section 4.3)")
# transformers 5.23: models/phi3/modeling_phi3.py Phi3DecoderLayer resid_attn_dropout / resid_mlp_dropout,
# models/gpt2/modeling_gpt2.py GPT2Model.drop, GPT2Attention.resid_dropout, GPT2MLP.dropout, models/gpt_neox/
# modeling_gpt_neox.py emb_dropout / post_attention_dropout / post_mlp_dropout, models/starcoder2/
# modeling_starcoder2.py embedding_dropout and residual_dropout after o_proj and c_proj, models/falcon/
# modeling_falcon.py dropout_add: each nn.Dropout / F.dropout runs CUDA's fused native_dropout, which keeps a bool
# mask of its input's shape (torch 2.13 derivatives.yaml: native_dropout_backward reads the mask only), and its
# output goes to a residual add, which keeps nothing
CONFIG_DROPOUT_SOURCE = ("transformers 5.23 modeling_phi3.py, modeling_gpt2.py, modeling_gpt_neox.py, "
                         "modeling_starcoder2.py, modeling_falcon.py (each residual and embedding dropout a fused "
                         "native_dropout: one bool mask); measured: tests/data/measured/*-drop10")


def config_dropout(p: float, training: Training) -> bool:
    """Whether a residual or embedding dropout keeps its mask: under the transformers frameworks, where
    `training.dropout` is the model config's attention_dropout, when the model config's own probability `p` for it
    (an Architecture *_dropout field) is above 0 (CONFIG_DROPOUT_SOURCE; the decoders without one drop out nothing
    else, RESIDUAL_DROPOUT_SOURCE); elsewhere with dropout (Megatron-Core's hidden_dropout)."""
    if training.framework in TRANSFORMERS_FRAMEWORKS:
        return p > 0
    return training.dropout > 0


def _norm(name: str, T: float, arch: Architecture, training: Training) -> list[Entry]:
    """A norm's saved tensors. Fused norms (Apex/TE) keep their input (and per-token statistics,
    left out as Korthikanti do). transformers' RMSNorm runs in PyTorch ops: ``x.float()`` (kept by
    ``pow`` and ``mul``), the per-token ``rsqrt`` (fp32), and the normalised ``x * rsqrt`` cast
    back to the input's dtype before the scale (kept by the scale's ``mul``). Under autocast the
    residual stream is already fp32, so the upcast is the residual itself."""
    B = bytes_per_element(training.compute_dtype)
    h = arch.hidden_size
    if training.liger_kernel:
        # LigerRMSNormFunction (memory/liger.py RMS_NORM_SOURCE) saves its input, whatever its dtype (the
        # residual stream: fp32 under autocast), and one fp32 rstd per row ("llama" casting mode)
        kept = 4 if autocast(training) else B
        return [Entry(f"{name} (Liger RMSNorm input)", T * h, kept, "sp", f"{kept:g}*s*b*h"),
                Entry(f"{name} (Liger RMSNorm rstd per token, fp32)", T, 4, "sp", "4*s*b")]
    if fused_kernels(training) or training.compute_dtype == "fp32":
        return [Entry(name, T * h, B, "sp", "B*s*b*h")]
    if arch.norm == "layernorm":
        # nn.LayerNorm is ATen's native_layer_norm: autograd keeps its input and the per-row mean and rstd
        # (torch 2.13 derivatives.yaml native_layer_norm; CUDA's layer_norm_kernel.cu makes them in the fp32
        # accumulate type), not a normalised copy; its output is the next linear's input (measured:
        # tests/data/measured/starcoder2-3b-8layers-*, pythia-1.4b-8layers-*)
        kept = 4 if autocast(training) else B  # under autocast the residual it normalises is fp32
        return [Entry(f"{name} (LayerNorm input)", T * h, kept, "sp", f"{kept:g}*s*b*h"),
                Entry(f"{name} (LayerNorm mean and rstd per token, fp32)", 2 * T, 4, "sp", "8*s*b")]
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
    # Gemma and Qwen3-Next scale by (1 + w) in fp32, and Nemotron-H by w in fp32 (NemotronHRMSNorm: the scale's
    # product is cast after), so the normalised tensor they keep is fp32 too; so does torchtune's
    # RMSNorm, which normalises x.float() with F.rms_norm's composite ops (torchtune/modules/rms_norm.py)
    kept = 4 if autocast(training) or arch.norm_unit_offset or arch.norm_fp32_scale or training.framework == "torchtune" \
        else B
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


def fp8_activation_bytes(training: Training) -> float:
    """A quantized GEMM input: 1 byte plus its scales (MXFP8: one per 32; blockwise: one fp32 per
    1x128 tile, DeepSeek-V3 section 3.3.1). Under fsdp2, torchao's Float8Linear saves the
    high-precision input and casts it again in backward (torchao/float8/float8_linear.py,
    matmul_with_hp_or_float8_args.forward: ``ctx.save_for_backward(input_hp, weight_hp_t)``)."""
    if torchao_float8(training):
        return bytes_per_element(training.compute_dtype)
    return {"mxfp8": 1 + 1 / 32, "blockwise": 1 + 4 / 128}.get(training.fp8_recipe, 1.0)


ATTENTION_OUTPUT = "attention output (output projection input)"


def torchao_float8(training: Training) -> bool:
    """fp8 under fsdp2 is torchao's Float8Linear (torchtitan's Float8LinearConverter)."""
    return training.fp8 and training.framework == "fsdp2"
