"""The attention block's saved tensors: q, k, v, scores or the flash statistics, MLA's latents
and up-projections, context parallelism's gathered keys and values.
"""

from __future__ import annotations

from ...spec.architecture import Architecture
from ...spec.dtypes import bytes_per_element
from ...spec.parallel import Parallel
from ...spec.training import Training
from ...spec.choices import TRANSFORMERS_FRAMEWORKS
from .entries import (ATTENTION_OUTPUT, CORE, Entry, NORM, UP_PROJ, _norm, _norm_output, compiled, fused_kernels,
                      config_dropout, eager_softmax_16_bit, tokens_per_gpu, torch_fused_rms_norm)
from .sdpa_math import falcon_math_entries, falcon_math_sdpa


CP_FLEX_SOURCE = ("torchtitan v0.3.0 distributed/context_parallel/api.py apply_cp_to_forward (FlexAttention: "
                  "flex_cp_allgather of k and v on the sequence dim); torch 2.13 distributed/tensor/experimental/"
                  "_context_parallel/_cp_custom_ops.py flex_cp_allgather (all_gather_single, no saved tensors; "
                  "its backward reduce-scatters); measured: tests/data/measured/torchtitan/*-cp*")


def cp_flex_all_gather(training: Training, par: Parallel | None) -> bool:
    """torchtitan (fsdp2) with context parallelism runs flex attention on K/V all-gathered over CP; its
    December 2024 main ran torch's ring attention over SDPA instead, which saves what flash does (cp_ring.py)."""
    from ..titan_releases import titan_rules
    return training.framework == "fsdp2" and par is not None and par.cp > 1 and training.attention == "flash" \
        and titan_rules(training).cp_attention == "flex all-gather"


def attention_entries(arch: Architecture, training: Training, par: Parallel) -> list[Entry]:
    """What one attention block keeps for backward, in the order its forward makes it: the norm and the
    QKV projection's input, MLA's latents or the q and k norms, the attention core, the output."""
    from ..kbit import math_attention
    math_sdpa = math_attention(arch, training)  # fp32 SDPA with grouped KV heads: the math backend (kbit.py)
    T = tokens_per_gpu(training, par)
    out = _norm("attention norm input", T, arch, training)
    # under autocast each linear casts its input: one for MLA's down-projection and a fused QKV (Architecture.fused_qkv)
    readers = 1 if arch.uses_mla or (arch.fused_qkv and training.framework in TRANSFORMERS_FRAMEWORKS) else 3
    out += _norm_output("QKV projection input", T, arch, training, readers, NORM, weights=("q", "k", "v"))
    out += _mla_latent_entries(arch, training, par) if arch.uses_mla else _qk_norm_entries(arch, training, par)
    out += _core_entries(arch, training, par, math_sdpa)
    out += _output_entries(arch, training, par, math_sdpa)
    return out


def _mla_latent_entries(arch: Architecture, training: Training, par: Parallel) -> list[Entry]:
    """DeepSeek-V2 MLA (arXiv 2405.04434 section 2.1): the compressed latents feed the up-projections
    (replicated over TP); the core sees q, k (the shared rope key broadcast to every head) and v per head."""
    B = bytes_per_element(training.compute_dtype)
    T = tokens_per_gpu(training, par)
    out = []
    if arch.q_lora_rank:
        out.append(Entry("compressed q (q up-projection input)", T * arch.q_lora_rank, B, "none", "B*s*b*q_lora_rank",
                         gemm_input=True))
    out.append(Entry("compressed kv (kv up-projection input)", T * arch.kv_lora_rank, B, "none",
                     "B*s*b*kv_lora_rank", gemm_input=True))
    return out


def _qk_norm_entries(arch: Architecture, training: Training, par: Parallel) -> list[Entry]:
    """The q and k norms of a model without MLA, by the stack that runs them."""
    B = bytes_per_element(training.compute_dtype)
    T = tokens_per_gpu(training, par)
    a, qw = arch.num_attention_heads, arch.q_width
    out = []
    if arch.qk_l2_norm:  # Llama 4's weightless L2 norm in the RoPE layers (llama4.py)
        from .llama4 import l2_qk_norm_entries
        out += l2_qk_norm_entries(arch, training, par)
    if arch.qk_norm and fused_kernels(training):
        out.append(Entry("q and k norm inputs", T * (qw + arch.kv_width), B, "tp", "B*s*b*(a + g)*d_head"))
    elif arch.qk_norm and training.liger_kernel:
        # LigerRMSNormFunction over each head (memory/liger.py; apply_liger_kernel_to_qwen3 patches q_norm and
        # k_norm): the q and k projections' outputs and an fp32 rstd per head
        out.append(Entry("q and k norm inputs (Liger RMSNorm)", T * (qw + arch.kv_width), B, "tp",
                         "B*s*b*(a + g)*d_head"))
        out.append(Entry("q and k norms (Liger RMSNorm rstd per head, fp32)", T * (a + arch.num_kv_heads), 4, "tp",
                         "4*s*b*(a + g)"))
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
        # a norm that scales in fp32 (Gemma-3's and Qwen3-Next's 1 + w) keeps its normalised tensor in fp32
        kept = 4 if arch.norm_unit_offset or arch.norm_fp32_scale else B
        out.append(Entry("q and k norms (fp32 upcast)", T * (qw + arch.kv_width), 4, "tp", "4*s*b*(a + g)*d_head"))
        out.append(Entry("q and k norms (rsqrt per head, fp32)", T * heads, 4, "tp", "4*s*b*(a + g)"))
        out.append(Entry("q and k norms (normalised, before the scale)", T * (qw + arch.kv_width), kept, "tp",
                         f"{kept:g}*s*b*(a + g)*d_head" if kept != B else "B*s*b*(a + g)*d_head",
                         for_weights=("norm",)))
    return out


def _core_entries(arch: Architecture, training: Training, par: Parallel, math_sdpa: bool) -> list[Entry]:
    """What the attention core keeps, by the kernel and the stack that run it (the first that applies)."""
    if arch.uses_sparse_attention and training.framework == "hf":  # transformers 5.23's DeepSeek-V3.2 (sparse_hf.py)
        from .sparse_hf import hf_dsa_entries
        return hf_dsa_entries(arch, training, par)
    if arch.uses_sparse_attention:  # Megatron-Core 0.16.1's unfused DSAttention (sparse.py)
        from .sparse import dsa_entries
        return dsa_entries(arch, training, par)
    if falcon_math_sdpa(arch, training):  # a multi-query Falcon on SDPA: the math backend (sdpa_math.py)
        return falcon_math_entries(arch, training, par)
    if training.attention == "flash" and fused_kernels(training) and not arch.uses_mla \
            and arch.position_embedding == "rope":
        return _fused_qkv_flash_entries(arch, training, par)
    if transformers_fused_qkv(arch, training, math_sdpa):
        from .sdpa_mask import masked_sdpa_entries
        return _fused_qkv_flash_entries(arch, training, par) + masked_sdpa_entries(arch, training, par)
    if training.attention == "flash" and training.framework == "torchtune" and not arch.uses_mla:
        return _torchtune_flash_entries(arch, training, par)
    if cp_flex_all_gather(training, par):
        return _cp_flex_entries(arch, training, par)
    if training.attention == "flash" and not math_sdpa:  # with transformers' masked SDPA path (sdpa_mask.py)
        from .sdpa_mask import masked_sdpa_entries
        return _flash_entries(arch, training, par) + masked_sdpa_entries(arch, training, par)
    return _unfused_entries(arch, training, par, math_sdpa)


def _flash_lse(arch: Architecture, training: Training, par: Parallel) -> Entry:
    """The flash kernel's fp32 log-sum-exp per query and head, kept for its backward."""
    return Entry("flash log-sum-exp (fp32)", tokens_per_gpu(training, par) * arch.num_attention_heads, 4, "tp",
                 "4*s*b*a", recompute=CORE)


def _fused_qkv_flash_entries(arch: Architecture, training: Training, par: Parallel) -> list[Entry]:
    """q, k, v are views of one fused QKV output and the rotary embedding returns new q and k, so the whole QKV
    output stays alive through v beside them: Megatron-Core SelfAttention (torch.split; transformer/attention.py,
    measured in tests/data/measured/megatron), and transformers 5.23's Phi-3 (modeling_phi3.py Phi3Attention:
    qkv_proj sliced) and GPT-NeoX (modeling_gpt_neox.py: query_key_value chunked), whose apply_rotary_pos_emb ends
    in torch.cat (`Architecture.fused_qkv`; measured: tests/data/measured/phi-3-mini-8layers-*-sdpa-*,
    pythia-1.4b-8layers-*-sdpa-*)."""
    B = bytes_per_element(training.compute_dtype)
    T = tokens_per_gpu(training, par)
    qw = arch.q_width
    return [Entry("QKV projection output (v is a view of it)", T * (qw + 2 * arch.kv_width), B, "tp",
                  "B*s*b*(a + 2*g)*d_head"),
            Entry(ROTARY_QK, T * (qw + arch.kv_width), B, "tp", "B*s*b*(a + g)*d_head"),
            _flash_lse(arch, training, par)]


def transformers_fused_qkv(arch: Architecture, training: Training, math_sdpa: bool = False) -> bool:
    """transformers' fused QKV with a torch.cat rotary embedding (`Architecture.fused_qkv`) under flash attention."""
    return (arch.fused_qkv and not arch.qkv_split_copies and training.framework in TRANSFORMERS_FRAMEWORKS
            and training.attention == "flash" and not math_sdpa and arch.position_embedding == "rope"
            and not arch.uses_mla)


def _torchtune_flash_entries(arch: Architecture, training: Training, par: Parallel) -> list[Entry]:
    """torchtune's MultiHeadAttention expands k and v to every query head before SDPA
    (modules/attention.py: k.unsqueeze(2).expand(...).flatten(1, 2)), so flash keeps them at a heads."""
    B = bytes_per_element(training.compute_dtype)
    T = tokens_per_gpu(training, par)
    return [Entry("q, and k, v expanded to all heads, kept by flash attention", T * 3 * arch.q_width, B, "tp",
                  "3*B*s*b*a*d_head", recompute=UP_PROJ),
            _flash_lse(arch, training, par)]


def _kv_widths(arch: Architecture) -> tuple[int, int]:
    """(k width, v width) per token of what the core sees: MLA's per head (the shared rope key broadcast to
    every head), else the grouped KV heads'."""
    if arch.uses_mla:
        return arch.q_width, arch.num_attention_heads * arch.v_head_dim
    return arch.kv_width, arch.kv_width


def _cp_flex_entries(arch: Architecture, training: Training, par: Parallel) -> list[Entry]:
    """torchtitan's context parallelism for flex attention (CP_FLEX_SOURCE): each rank keeps its s/cp queries,
    but flex runs them against the keys and values of the whole sequence, all-gathered over the CP group, and
    saves those (the all-gather itself saves nothing for its backward)."""
    B = bytes_per_element(training.compute_dtype)
    T = tokens_per_gpu(training, par)
    k_width, v_width = _kv_widths(arch)
    kv_formula = "B*s*b*a*(d_nope + d_rope + d_v)" if arch.uses_mla else "B*s*b*2*g*d_head"
    return [Entry("q kept by flex attention (this rank's s/cp queries)", T * arch.q_width, B, "tp",
                  "B*s*b*a*(d_nope + d_rope)" if arch.uses_mla else "B*s*b*a*d_head", recompute=UP_PROJ),
            Entry("k, v all-gathered over CP (the whole sequence), kept by flex attention",
                  T * par.cp * (k_width + v_width), B, "tp", kv_formula, recompute=UP_PROJ, split_by_cp=False),
            _flash_lse(arch, training, par)]


FALCON_FLASH_SOURCE = ("transformers 5.23 models/falcon/modeling_falcon.py: _split_heads (lines 254-263) copies the "
                       "new architecture's q, k and v out a heads wide, forward takes num_kv_heads = num_heads (line "
                       "442); FalconFlashAttention2 hands the rotary q, k and v to flash (lines 461-463, 494) and "
                       "dense reads its output through a view (lines 506-507); multi-query keeps k, v one head wide "
                       "(lines 269-272); measured: tests/data/measured/falcon-*-flash_attention_2-*")


def _flash_entries(arch: Architecture, training: Training, par: Parallel) -> list[Entry]:
    """A flash kernel keeps its q, k and v (MLA's up-projected per head) and its log-sum-exp. transformers' Falcon
    with the new decoder architecture hands it k and v copied out to every query head (FALCON_FLASH_SOURCE)."""
    B = bytes_per_element(training.compute_dtype)
    T = tokens_per_gpu(training, par)
    k_width, v_width = _kv_widths(arch)
    v_formula = "B*s*b*a*(2*(d_nope + d_rope) + d_v)" if arch.uses_mla else "B*s*b*(a + 2*g)*d_head"
    if arch.qkv_split_expands_kv and training.framework in TRANSFORMERS_FRAMEWORKS:
        k_width = v_width = arch.q_width
        v_formula = "3*B*s*b*a*d_head"
    return [Entry("q, k, v kept by flash attention", T * (arch.q_width + k_width + v_width), B, "tp", v_formula,
                  recompute=UP_PROJ),
            _flash_lse(arch, training, par)]


QK_T_INPUTS = "q and k (keys expanded to all heads) for QK^T"
ROTARY_QK = "q and k after the rotary embedding"  # a fused QKV's (`_fused_qkv_flash_entries`)
SCORES_V_INPUT = "v (expanded to all heads) for scores x V"
EAGER_SOFTMAX_FP32 = "softmax output (fp32)"
UNFUSED_SOFTMAX_FP32 = "softmax output (fp32, unfused softmax)"  # Megatron's torch softmax
SOFTMAX_CAST = "softmax output cast to the compute dtype"
SOFTCAP_OUTPUT = "soft-capped scores (tanh output)"
DROPOUT_MASK = "attention dropout mask"
DROPOUT_OUTPUT = "attention dropout output"
RESIDUAL_DROPOUT_MASK = "attention residual dropout mask"


def _unfused_entries(arch: Architecture, training: Training, par: Parallel, math_sdpa: bool) -> list[Entry]:
    """Unfused attention expands K and V to every query head before the matmuls (repeat_kv): q and k for
    QK^T, the softmax's tensors, the dropout's, and v for scores x V."""
    B = bytes_per_element(training.compute_dtype)
    T = tokens_per_gpu(training, par)
    a, qw = arch.num_attention_heads, arch.q_width
    scores = training.micro_batch_size * a * (training.seq_len / par.cp) * training.seq_len
    head_v = arch.v_head_dim if arch.uses_mla else arch.head_dim
    broadcast = arch.eager_kv_broadcast and training.framework in TRANSFORMERS_FRAMEWORKS and not math_sdpa
    if broadcast:  # modeling_falcon.py FalconAttention: query_layer @ key_layer.transpose(-1, -2), one k head
        out = [Entry(QK_T_INPUTS, T * (qw + arch.kv_width), B, "tp", "B*s*b*(a + g)*d_head", recompute=UP_PROJ,
                     tensors=2)]
    else:
        out = [Entry(QK_T_INPUTS, T * 2 * qw, B, "tp", "2*B*s*b*a*d_head", recompute=UP_PROJ, tensors=2)]
    out += _softmax_entries(arch, training, par, math_sdpa, scores)
    if training.dropout > 0:
        out.append(Entry(DROPOUT_MASK, scores, 1, "tp", "a*s^2*b", recompute=CORE))
        out.append(Entry(DROPOUT_OUTPUT, scores, B, "tp", "B*a*s^2*b", recompute=CORE))
    out.append(Entry(SCORES_V_INPUT, T * (arch.kv_width if broadcast else a * head_v), B, "tp",
                     "B*s*b*g*d_head" if broadcast else "B*s*b*a*d_head", recompute=UP_PROJ))
    return out


def _softmax_entries(arch: Architecture, training: Training, par: Parallel, math_sdpa: bool,
                     scores: float) -> list[Entry]:
    """The unfused softmax's kept tensors (`scores` elements each), by the stack that runs it."""
    if fused_kernels(training) and megatron_fused_softmax(arch, training, par):
        return [Entry("softmax output (scores)", scores, bytes_per_element(training.compute_dtype), "tp", "B*a*s^2*b",
                      recompute=CORE)]
    if fused_kernels(training):
        return _megatron_torch_softmax_entries(training, par, scores)
    if compiled(training):
        return _compiled_softmax_entries(arch, training, par, scores)
    if math_sdpa:  # SDPA's math backend (kbit.py): q and k scaled, _safe_softmax's fp32 output
        return [Entry("softmax output (fp32, SDPA math backend)", scores, 4, "tp", "4*a*s^2*b", recompute=CORE)]
    return _eager_softmax_entries(arch, training, scores)


def _megatron_torch_softmax_entries(training: Training, par: Parallel, scores: float) -> list[Entry]:
    """Megatron-Core FusedScaleMaskSoftmax.forward_torch_softmax (fusions/fused_softmax.py) with
    attention_softmax_in_fp32: softmax keeps its fp32 output, scores x V its 16-bit copy, and masked_fill_ the
    causal mask that transformer/utils.py get_default_causal_mask makes per layer. With attention dropout
    scores x V keeps the dropout's output instead, and the dropout (ATen native_dropout) only its mask: the
    16-bit copy is freed (the golden values of Megatron-LM core_v0.16.1's gpt3_mcore_tp2_pp2_uninstall_te,
    dropout 0.1, measured without it)."""
    B = bytes_per_element(training.compute_dtype)
    out = [Entry(UNFUSED_SOFTMAX_FP32, scores, 4, "tp", "4*a*s^2*b", recompute=CORE)]
    if B < 4 and not training.dropout:
        out.append(Entry(SOFTMAX_CAST, scores, B, "tp", "B*a*s^2*b", recompute=CORE))
    out.append(Entry("causal mask (bool, made per layer)", training.seq_len / par.cp * training.seq_len, 1, "none",
                     "s^2", recompute=CORE))
    return out


def _compiled_softmax_entries(arch: Architecture, training: Training, par: Parallel, scores: float) -> list[Entry]:
    """Inductor's partitioner (COMPILE_SOURCE): the QK^T scores (a bmm output) and the softmax's per-row max
    and sum (reductions) are kept and the fp32 softmax recomputed from them; the compute-dtype probabilities
    are kept for scores x V's backward (measured, Llama layer with eager attention). A soft-capping tanh is
    pointwise and recomputed (derived, not measured)."""
    B = bytes_per_element(training.compute_dtype)
    T = tokens_per_gpu(training, par)
    return [Entry("QK^T scores (kept by the compiled layer)", scores, B, "tp", "B*a*s^2*b", recompute=CORE),
            Entry("softmax max and sum per row (fp32, kept by the compiled layer)", 2 * T * arch.num_attention_heads,
                  4, "tp", "2*4*s*b*a", recompute=CORE),
            Entry(SOFTMAX_CAST, scores, B, "tp", "B*a*s^2*b", recompute=CORE)]


EAGER_DROPOUT_SOURCE = ("transformers 5.23 models/llama/modeling_llama.py eager_attention_forward: softmax(dtype=float32)"
                        ".to(query.dtype), then nn.functional.dropout(p=attention_dropout) rebinding attn_weights; "
                        "torch 2.13 derivatives.yaml: native_dropout's backward reads its mask only, _to_copy's "
                        "nothing; measured: tests/data/measured/peft/llama-3.2-1b-lora-r16-*-eager-attndrop10")


def _eager_softmax_entries(arch: Architecture, training: Training, scores: float) -> list[Entry]:
    """transformers' eager attention: softmax in fp32, then cast back for scores x V. With attention
    dropout the cast copy only feeds the dropout, whose mask and output are kept instead (EAGER_DROPOUT_SOURCE):
    the copy is freed."""
    from ..kbit import prepared
    B = bytes_per_element(training.compute_dtype)
    out = []
    if arch.attention_logit_softcapping:  # tanh keeps its output for backward
        out.append(Entry(SOFTCAP_OUTPUT, scores, B, "tp", "B*a*s^2*b", recompute=CORE))
    in_compute = eager_softmax_16_bit(arch, training)
    if in_compute:  # Llama 4, GPT-2, Falcon without autocast: the softmax of the 16-bit scores, kept
        out.append(Entry("softmax output (compute dtype, no fp32 upcast)", scores, B, "tp", "B*a*s^2*b",
                         recompute=CORE))
    else:
        out.append(Entry(EAGER_SOFTMAX_FP32, scores, 4, "tp", "4*a*s^2*b", recompute=CORE))
    if not prepared(training) and not in_compute and not training.dropout:
        # an fp32 query (kbit.py): no copy
        out.append(Entry(SOFTMAX_CAST, scores, B, "tp", "B*a*s^2*b", recompute=CORE))
    return out


def attention_output_entries(arch: Architecture, training: Training, par: Parallel) -> list[Entry]:
    """The entries of `attention_entries` after the core: the output, the post-attention norm, the residual dropout."""
    from ..kbit import math_attention
    return _output_entries(arch, training, par, math_attention(arch, training))


def _output_entries(arch: Architecture, training: Training, par: Parallel, math_sdpa: bool) -> list[Entry]:
    """The attention output (o_proj's input, or Qwen3-Next's gate), the post-attention norm, the residual dropout."""
    B = bytes_per_element(training.compute_dtype)
    T = tokens_per_gpu(training, par)
    # a fused kernel keeps its output for its backward (DSA's unfused one does not)
    fused = training.attention == "flash" and not math_sdpa and not arch.uses_sparse_attention
    if arch.attention_output_gate:
        out = _output_gate_entries(arch, training, par, fused)
    elif transformers_fused_qkv(arch, training, math_sdpa):
        # q leaves torch.cat contiguous in (b, heads, s, d): flash's output takes its layout (mha_fwd
        # empty_like(q)) and sdpa_attention_forward's transpose(1, 2).contiguous() copies it for o_proj, while the
        # kernel keeps its own (as `_output_gate_entries`; measured: tests/data/measured/phi-3-mini-8layers-*-sdpa-*)
        out = [Entry("attention output (kept by flash attention)", T * arch.attention_output_width, B, "tp",
                     "B*s*b*a*d_v"),
               Entry(ATTENTION_OUTPUT, T * arch.attention_output_width, B, "tp", "B*s*b*a*d_v", gemm_input=True,
                     for_weights=("o",))]
    else:
        out = [Entry(ATTENTION_OUTPUT, T * arch.attention_output_width, B, "tp",
                     "B*s*b*a*d_v", gemm_input=True, for_weights=() if fused else ("o",))]
    if arch.norms_per_layer > 2:  # Gemma-2/3 normalise the attention output before the residual add
        out += _norm("post-attention norm input", T, arch, training)
    if config_dropout(arch.attention_residual_dropout, training):
        out.append(Entry(RESIDUAL_DROPOUT_MASK, T * arch.hidden_size, 1, "sp", "s*b*h"))
    return out


def megatron_fused_softmax(arch: Architecture, training: Training, par: Parallel) -> bool:
    """Megatron-Core runs the fused upper-triangular softmax kernel (one 16-bit output kept) when
    attention_softmax_fusion is on and FusedScaleMaskSoftmax.is_kernel_available holds: 16-bit scores,
    16 < s <= 4096, s % 4 == 0 and b x heads/t a multiple of the kernel's batches per block, 4 (8 for
    s <= 128: get_batch_per_block in csrc scaled_masked_softmax.h); else its torch softmax."""
    s, heads = training.seq_len, training.micro_batch_size * arch.num_attention_heads // par.tp
    return (training.attention_softmax_fusion and training.compute_dtype in ("bf16", "fp16") and 16 < s <= 4096
            and s % 4 == 0 and heads % (8 if s <= 128 else 4) == 0)


def _output_gate_entries(arch: Architecture, training: Training, par: Parallel, fused: bool) -> list[Entry]:
    """Qwen3-Next's gated attention (transformers 5.23 Qwen3NextAttention.forward): q_proj also gives a
    gate, and ``attn_output * torch.sigmoid(gate)`` goes to o_proj, so the product keeps the attention
    output and the sigmoid's output (sigmoid keeps it too), and o_proj keeps the product. The attention
    output it keeps is a copy: with the partial rotary embedding q is the ``torch.cat`` of its rotated and
    passed parts in (b, heads, s, d) layout, flash attention's output takes q's layout (mha_fwd
    ``empty_like(q)``), and sdpa_attention_forward's ``transpose(1, 2).contiguous()`` copies it back to
    (b, s, heads, d), while the kernel keeps its own (measured: tests/data/measured/qwen3-next-*)."""
    B = bytes_per_element(training.compute_dtype)
    T = tokens_per_gpu(training, par)
    width = T * arch.attention_output_width
    out = [Entry("attention output (kept by flash attention)" if fused else "attention output (scores x V)", width, B,
                 "tp", "B*s*b*a*d_v")]
    if fused:
        out.append(Entry("attention output made contiguous (kept by the gate product)", width, B, "tp", "B*s*b*a*d_v"))
    out.append(Entry("sigmoid of the output gate (kept by sigmoid and the gate product)", width, B, "tp", "B*s*b*a*d_v"))
    out.append(Entry(ATTENTION_OUTPUT, width, B, "tp", "B*s*b*a*d_v", gemm_input=True, for_weights=("o",)))
    return out
