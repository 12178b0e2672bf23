"""The operations of one layer (attention, MLP or MoE, adapters), the embedding and the head, and
the model's matmul parameters and FLOPs per token."""

from __future__ import annotations

import dataclasses

from . import kernels
from ..spec import hybrid
from .hybrid_operations import (gated_delta_net_core_flops, gated_delta_net_operations, mamba1_operations,
                                mamba_operations, selective_scan_flops, ssd_core_flops)
from ..spec.architecture import Architecture
from ..spec.parallel import Parallel
from ..spec.training import Training
from .liger_operations import flce_operations, runs_liger_flce
from .operations import (CORE_ATTN, GELU_FLOPS, MOE_MODULE, NORM_FLOPS, NORM_MODULE, Operation, ROPE_FLOPS,
                         SOFTMAX_FLOPS, SWIGLU_FLOPS, UP_PROJ_MODULE, _Context, _elementwise, _gemm, bf16_matmuls)


def attended_keys(seq_len: int, window: int | None, causal: bool = True, chunked: bool = False) -> float:
    """Keys a query attends to on average. Causal: (1/s) sum_i min(i, w) = w - w^2/(2s) for a
    window w <= s, which is s/2 for full attention (the causal half). Chunked (Llama 4, `window` the
    chunk c): a query sees the earlier keys of its own chunk, (q c^2 + r^2) / (2s) with s = q c + r."""
    if chunked and window and causal:
        whole, rest = divmod(seq_len, window)
        return (whole * window * window + rest * rest) / (2 * seq_len)
    w = min(window or seq_len, seq_len)
    if not causal:
        return float(w)
    return w - w * w / (2 * seq_len)


def _attention_widths(arch: Architecture) -> tuple[int, int, int]:
    """(query/key width per head, value width per head, key/value heads that move in memory)."""
    if arch.uses_mla:
        # MLA: the shared rope key is broadcast and the latent expanded to every head
        return arch.qk_nope_head_dim + arch.qk_rope_head_dim, arch.v_head_dim, arch.num_attention_heads
    return arch.head_dim, arch.head_dim, arch.num_kv_heads


def _attention_core(ctx: _Context, arch: Architecture, training: Training, par: Parallel, scope: str,
                    window: int | None, count: int) -> list[Operation]:
    """softmax(Q K^T / sqrt(d)) V for the a/t heads of this GPU.

    QK^T and AV each cost 2*b*s_q*s_k*d per head. Flash attention skips the masked half of a
    causal mask; with CP each GPU holds s/CP queries against all s keys, the same causal half
    after Megatron's load-balanced split. Eager attention computes the full s_q x s_k scores,
    writes them, reads them for the softmax, writes the probabilities and reads them again."""
    if arch.uses_sparse_attention:  # DeepSeek-V3.2 under Megatron-Core 0.16.1's unfused DSA
        from .sparse_operations import dsa_core_operations
        return dsa_core_operations(ctx, arch, training, par, scope, count)
    if training.attention == "flash":
        return _flash_attention_core(ctx, arch, training, par, scope, window, count)
    return _eager_attention_core(ctx, arch, training, par, scope, window, count)


def _flash_attention_core(ctx: _Context, arch: Architecture, training: Training, par: Parallel, scope: str,
                          window: int | None, count: int) -> list[Operation]:
    """The flash kernel: the causal half of the scores (or the window's keys), q, k, v and o read or written
    once, and its backward."""
    a_t = arch.num_attention_heads / par.tp
    d_qk, d_v, kv_heads = _attention_widths(arch)
    seq = training.seq_len
    s_q = seq / par.cp
    io = ctx.T * (a_t * (d_qk + d_v) + kv_heads / par.tp * (d_qk + d_v)) * ctx.B  # q, o; k, v
    keys = attended_keys(seq, window, chunked=bool(arch.attention_chunk_size))
    flops = 2 * training.micro_batch_size * a_t * s_q * keys * (d_qk + d_v)
    # the kernel sees blocks of s/cp queries (ring attention runs one block per step), at most the window
    span = min(window or s_q, s_q)

    def efficiency(direction):
        return kernels.attention_efficiency(ctx.gpu, ctx.framework, direction, span, d_qk)

    fwd = Operation("attention core (flash)", "forward", scope, "attention", flops,
                    io + ctx.T * a_t * 4, ctx.peak, ctx.bandwidth, count,
                    "2*b*(a/t)*(s/cp)*keys*(d_qk + d_v), keys = causal average", CORE_ATTN,
                    efficiency("forward"), kernels.BANDWIDTH_EFFICIENCY)
    if not ctx.training:
        return [fwd]
    # backward reads q, k, v, o, dO, lse and writes dq, dk, dv
    bwd = Operation("attention core (flash) (backward)", "backward", scope, "attention", 2.5 * flops,
                    2 * io + ctx.T * a_t * (d_v * ctx.B + 4), ctx.peak, ctx.bandwidth, count,
                    "2.5 x forward (FlashAttention-2: 5 matmuls against 2, the scores recomputed)", CORE_ATTN,
                    efficiency("backward"), kernels.BANDWIDTH_EFFICIENCY)
    return [fwd, bwd]


def _eager_attention_core(ctx: _Context, arch: Architecture, training: Training, par: Parallel, scope: str,
                          window: int | None, count: int) -> list[Operation]:
    """Eager attention: the scores, the softmax and the probabilities x V as unfused operations that write and
    read the full scores, their backwards, at the GEMM rate of the head-wide batched matmuls."""
    a_t = arch.num_attention_heads / par.tp
    d_qk, d_v, kv_heads = _attention_widths(arch)
    seq = training.seq_len
    s_q = seq / par.cp
    # the mask is applied after the full matmul (a chunk mask too: transformers 5.23 eager_attention_forward)
    keys = float(seq if arch.attention_chunk_size else min(window or seq, seq))
    scores = training.micro_batch_size * a_t * s_q * keys
    qk = Operation("attention scores QK^T (eager)", "forward", scope, "attention", 2 * scores * d_qk,
                   ctx.T * a_t * d_qk * ctx.B + ctx.T * kv_heads / par.tp * d_qk * ctx.B + scores * ctx.B,
                   ctx.peak, ctx.bandwidth, count, "2*b*(a/t)*s*s*d, scores written")
    sm = Operation("attention softmax (eager)", "forward", scope, "elementwise", SOFTMAX_FLOPS * scores,
                   2 * scores * ctx.B, ctx.peak, ctx.bandwidth, count, "read and write b*(a/t)*s*s")
    av = Operation("attention probabilities x V (eager)", "forward", scope, "attention", 2 * scores * d_v,
                   scores * ctx.B + ctx.T * kv_heads / par.tp * d_v * ctx.B + ctx.T * a_t * d_v * ctx.B,
                   ctx.peak, ctx.bandwidth, count, "2*b*(a/t)*s*s*d_v, probabilities read")
    ops = [qk, sm, av]
    if ctx.training:  # eager attention: unfused batched GEMMs of head width d, at the GEMM rate of that shape
        ops += _eager_backward(qk, sm, av, scores, ctx, scope, count)
    gemm = kernels.gemm_efficiency(ctx.gpu, s_q, d_qk, keys)
    return [dataclasses.replace(op, modules=CORE_ATTN, compute_efficiency=gemm if op.kind == "attention" else 1.0,
                                memory_efficiency=kernels.BANDWIDTH_EFFICIENCY) for op in ops]


def _eager_backward(qk: Operation, sm: Operation, av: Operation, scores: float, ctx: _Context, scope: str,
                    count: int) -> list[Operation]:
    """The eager operations' backwards, last first: each two matmuls (or twice the softmax's work) of its forward,
    reading the scores' gradient."""
    return [
        Operation("attention probabilities x V (eager) (backward)", "backward", scope, "attention",
                  2 * av.flops, av.bytes + scores * ctx.B, ctx.peak, ctx.bandwidth, count,
                  "dP = dO V^T, dV = P^T dO"),
        Operation("attention softmax (eager) (backward)", "backward", scope, "elementwise",
                  2 * sm.flops, 3 * scores * ctx.B, ctx.peak, ctx.bandwidth, count, "read P, dP; write dS"),
        Operation("attention scores QK^T (eager) (backward)", "backward", scope, "attention",
                  2 * qk.flops, qk.bytes + scores * ctx.B, ctx.peak, ctx.bandwidth, count,
                  "dQ = dS K, dK = dS^T Q"),
    ]


def _mlp(ctx: _Context, arch: Architecture, scope: str, prefix: str, M: float, width: float,
         count: int, weights: float = 1, modules: tuple[str, ...] = ("mlp",),
         act_modules: tuple[str, ...] = ("mlp",)) -> list[Operation]:
    """fc1 (gate and up fused for a gated MLP), the activation, fc2; width is already per GPU."""
    h = arch.hidden_size
    fc1 = 2 * width if arch.gated_mlp else width
    act = ("SwiGLU", SWIGLU_FLOPS, 2 * M * width) if arch.gated_mlp else ("GELU", GELU_FLOPS, M * width)
    return (_gemm(ctx, scope, f"{prefix}fc1{' (gate and up)' if arch.gated_mlp else ''}", M, h, fc1, count, weights,
                  modules=modules)
            + _elementwise(ctx, scope, f"{prefix}{act[0]} activation", act[2], M * width, act[1], count,
                           f"read {'2*' if arch.gated_mlp else ''}M*f, write M*f", act_modules,
                           kernels.activation_group(arch.gated_mlp))
            + _gemm(ctx, scope, f"{prefix}fc2", M, width, h, count, weights, modules=modules))


def layer_operations(ctx: _Context, arch: Architecture, training: Training, par: Parallel, kind: str,
                     window: int | None, count: int) -> tuple[list[Operation], list[Operation]]:
    """(forward operations in order, backward operations in reverse order) of one layer: its token
    mixer (attention, or a hybrid model's Gated DeltaNet or Mamba-2), then its MLP or MoE."""
    local = "attention chunk" if arch.attention_chunk_size else "sliding window"
    scope = f"layer ({kind}{', ' + local if window else ''})"
    mixer, ffn = hybrid.MIXER[kind], hybrid.FFN[kind]
    groups: list[list[Operation]] = []
    if mixer in ("attention", "attention_mamba"):
        groups += _attention_groups(ctx, arch, training, par, scope, window, count)
    if mixer == "attention_mamba":  # Falcon-H1: the Mamba-2 mixer on the same norm's output, outputs summed
        groups += mamba_operations(ctx, arch, par, scope, count, beside_attention=True)
    elif mixer == "linear_attention":
        groups += gated_delta_net_operations(ctx, arch, par, scope, count)
    elif mixer == "mamba":
        groups += mamba_operations(ctx, arch, par, scope, count)
    elif mixer == "mamba1":
        groups += mamba1_operations(ctx, arch, par, scope, count)
    if ffn is not None:
        groups += _ffn_groups(ctx, arch, training, par, scope, ffn, count)
    if training.adapter:
        groups += _adapter_operations(ctx, arch, training, scope, kind, count)
    forward = [op for g in groups for op in g if op.phase == "forward"]
    backward = [op for g in reversed(groups) for op in reversed(g) if op.phase == "backward"]
    return forward, backward


def _attention_groups(ctx: _Context, arch: Architecture, training: Training, par: Parallel, scope: str,
                      window: int | None, count: int) -> list[list[Operation]]:
    """Norm, projections, rotary embedding, the attention core, output projection, residual add."""
    h, t, T, T_sp = arch.hidden_size, par.tp, ctx.T, ctx.T_sp
    norm_flops = NORM_FLOPS[arch.norm]
    norm_formula = f"read and write {'s*b*h/t' if par.sequence_parallel else 's*b*h'} (sequence parallel: /t)"
    groups: list[list[Operation]] = []
    groups.append(_elementwise(ctx, scope, "attention norm", T_sp * h, T_sp * h, norm_flops, count, norm_formula,
                               NORM_MODULE, kernels.norm_group(arch.norm)))
    # --- attention projections (column-parallel: output width / t)
    if arch.uses_mla:
        a = arch.num_attention_heads
        qk_head = arch.qk_nope_head_dim + arch.qk_rope_head_dim
        if arch.q_lora_rank:
            groups.append(_gemm(ctx, scope, "q down-projection (MLA, replicated)", T, h, arch.q_lora_rank, count))
            groups.append(_elementwise(ctx, scope, "q latent norm", T * arch.q_lora_rank, T * arch.q_lora_rank,
                                       norm_flops, count, "read and write s*b*q_lora_rank"))
            groups.append(_gemm(ctx, scope, "q up-projection (MLA)", T, arch.q_lora_rank, a * qk_head / t, count,
                                modules=UP_PROJ_MODULE))
        else:
            groups.append(_gemm(ctx, scope, "q projection (MLA)", T, h, a * qk_head / t, count))
        groups.append(_gemm(ctx, scope, "kv down-projection (MLA, replicated)", T, h,
                            arch.kv_lora_rank + arch.qk_rope_head_dim, count))
        groups.append(_elementwise(ctx, scope, "kv latent norm", T * arch.kv_lora_rank, T * arch.kv_lora_rank,
                                   norm_flops, count, "read and write s*b*kv_lora_rank"))
        groups.append(_gemm(ctx, scope, "kv up-projection (MLA)", T, arch.kv_lora_rank,
                            a * (arch.qk_nope_head_dim + arch.v_head_dim) / t, count, modules=UP_PROJ_MODULE))
        rope_elements = T * (a / t + 1) * arch.qk_rope_head_dim
    else:
        # Qwen3-Next's q_proj also gives the output gate (Qwen3NextAttention): a second query width
        qkv = (2 if arch.attention_output_gate else 1) * arch.q_width + 2 * arch.kv_width
        groups.append(_gemm(ctx, scope, "QKV projection" + (" (and output gate)" if arch.attention_output_gate else ""),
                            T, h, qkv / t, count, formula=f"2*T*h*(a + 2g)*d/t, M={T:g} K={h} N={qkv / t:g}"))
        if arch.qk_norm:
            qk = T * (arch.q_width + arch.kv_width) / t
            groups.append(_elementwise(ctx, scope, "q and k norms", qk, qk, norm_flops, count,
                                       "read and write s*b*(a + g)*d/t", group=kernels.norm_group(arch.norm)))
        rope_elements = T * (arch.q_width + arch.kv_width) / t
    if arch.position_embedding == "rope":
        groups.append(_elementwise(ctx, scope, "rotary embedding", rope_elements, rope_elements, ROPE_FLOPS, count,
                                   "read and write q and k (rope part)", UP_PROJ_MODULE if arch.uses_mla else (),
                                   "rope"))
    groups.append(_attention_core(ctx, arch, training, par, scope, window, count))
    if arch.attention_output_gate:
        gated = T * arch.attention_output_width / t
        groups.append(_elementwise(ctx, scope, "output gate (sigmoid and product)", 2 * gated, gated, 5, count,
                                   "read the output and the gate, write s*b*a*d/t", group="activation"))
    groups.append(_gemm(ctx, scope, "output projection", T, arch.attention_output_width / t, h, count))
    groups.append(_elementwise(ctx, scope, "residual add (attention)", 2 * T_sp * h, T_sp * h, 0.5, count,
                               "read 2*s*b*h, write s*b*h (/t with sequence parallelism)"))
    return groups


def _ffn_groups(ctx: _Context, arch: Architecture, training: Training, par: Parallel, scope: str, ffn: str,
                count: int) -> list[list[Operation]]:
    """Norm, the MLP or the MoE, residual add."""
    h, t, T, T_sp = arch.hidden_size, par.tp, ctx.T, ctx.T_sp
    norm_formula = f"read and write {'s*b*h/t' if par.sequence_parallel else 's*b*h'} (sequence parallel: /t)"
    groups: list[list[Operation]] = []
    groups.append(_elementwise(ctx, scope, "MLP norm", T_sp * h, T_sp * h, NORM_FLOPS[arch.norm], count, norm_formula,
                               NORM_MODULE, kernels.norm_group(arch.norm)))
    # --- MLP
    if ffn == "dense":
        groups.append(_mlp(ctx, arch, scope, "", T, arch.intermediate_size / t, count))
    else:
        e, k, phi = arch.num_experts, arch.num_experts_per_token, training.moe_capacity_factor
        from ..memory.activations.llama4 import dense_moe
        if dense_moe(arch, training):  # transformers' Llama4TextMoe: every token through all E experts (bmm)
            k, phi = e, 1.0
        # the router sees the sequence-parallel shard of the tokens (Megatron-Core TopKRouter)
        groups.append(_gemm(bf16_matmuls(ctx), scope, "router", T_sp, h, e, count, modules=MOE_MODULE))
        groups.append(_elementwise(ctx, scope, "router softmax and top-k", T_sp * e, T_sp * e, SOFTMAX_FLOPS, count,
                                   "read and write s*b*E/t", MOE_MODULE))
        # Per GPU the routed tokens are k*phi*T/t in expert-TP groups of etp (activations.py):
        # M = k*phi*T*etp/t tokens through the e/ep local experts at width f_e/etp.
        routed = k * phi * T * par.etp / t
        groups.append(_elementwise(ctx, scope, "token permute (dispatch)", routed * h, routed * h, 0, count,
                                   "read and write k*phi*s*b*h*etp/t", MOE_MODULE))
        groups.append(_mlp(ctx, arch, scope, "experts: ", routed, arch.moe_intermediate_size / par.etp, count,
                           weights=e / par.ep, modules=MOE_MODULE, act_modules=MOE_MODULE + ("moe_act",)))
        groups.append(_elementwise(ctx, scope, "token unpermute and weighted combine", routed * h, T_sp * h, 2, count,
                                   "read k*phi*s*b*h*etp/t, write s*b*h/t", MOE_MODULE))
        if arch.num_shared_experts:
            width = arch.shared_expert_intermediate_size * arch.num_shared_experts
            shared = MOE_MODULE + ("shared_experts",)
            groups.append(_mlp(ctx, arch, scope, "shared experts: ", T, width / t, count, modules=shared,
                               act_modules=shared))
    groups.append(_elementwise(ctx, scope, "residual add (MLP)", 2 * T_sp * h, T_sp * h, 0.5, count,
                               "read 2*s*b*h, write s*b*h (/t with sequence parallelism)"))
    return groups


def _adapter_operations(ctx: _Context, arch: Architecture, training: Training, scope: str, kind: str,
                        count: int) -> list[list[Operation]]:
    """Each adapted module's LoRA branch (adapters.py): the input cast to the adapters' dtype, then
    lora_A (T x in -> r) and lora_B (T x r -> out), trained (their weight gradients computed)."""
    from ..memory.adapters import adapted_modules
    trained = dataclasses.replace(ctx, frozen=frozenset())
    T, r = ctx.T, training.adapter.rank
    groups = []
    for m in adapted_modules(training.adapter, arch, kind):
        rank = r * m.rank_factor
        label = f"{m.name} adapter"
        groups.append(_elementwise(ctx, scope, f"{label}: input cast", T * m.in_features * m.copies,
                                   T * m.in_features * m.copies, 0, count, "read s*b*in, write s*b*in"))
        groups.append(_gemm(trained, scope, f"{label}: lora_A", T, m.in_features, rank * m.copies, count))
        groups.append(_gemm(trained, scope, f"{label}: lora_B", T, rank, m.out_features * m.copies, count))
    return groups


def embedding_operations(ctx: _Context, arch: Architecture, count: int) -> list[Operation]:
    """Vocabulary-parallel lookup: gather T rows of h, write T x h; backward scatter-adds the
    gradient rows into the table (read the gradient, read and write the rows)."""
    T, h = ctx.T, arch.hidden_size
    ops = [Operation("embedding lookup", "forward", "embedding", "elementwise", 0, 2 * T * h * ctx.B,
                     ctx.peak, ctx.bandwidth, count, "read s*b*h rows, write s*b*h")]
    if ctx.training:
        ops.append(Operation("embedding lookup (backward)", "backward", "embedding", "elementwise", T * h,
                             T * h * ctx.B + 2 * T * h * ctx.grad, ctx.peak, ctx.bandwidth, count,
                             "scatter-add s*b*h gradient rows"))
    return [dataclasses.replace(op, memory_efficiency=kernels.BANDWIDTH_EFFICIENCY) for op in ops]


def head_operations(ctx: _Context, arch: Architecture, training: Training, par: Parallel, vocab: int,
                    count: int) -> tuple[list[Operation], list[Operation]]:
    """Final norm, LM head (column-parallel over the vocabulary) and cross-entropy. Inference
    (prefill) computes the logits of the last token of each sequence only, as servers do."""
    h, t = arch.hidden_size, par.tp
    groups = [_elementwise(ctx, "head", "final norm", ctx.T_sp * h, ctx.T_sp * h, NORM_FLOPS[arch.norm], count,
                           "read and write s*b*h (/t with sequence parallelism)", group=kernels.norm_group(arch.norm))]
    rows = ctx.T if ctx.training else training.micro_batch_size
    if ctx.training and runs_liger_flce(training):
        groups.append(flce_operations(bf16_matmuls(ctx), training, h, vocab / t, count))
        return _ordered(groups)
    groups.append(_gemm(bf16_matmuls(ctx) if ctx.training else ctx, "head", "LM head", rows, h, vocab / t, count,
                        formula=f"2*T*h*V/t, M={rows:g} K={h} N={vocab / t:g}"))
    if ctx.training:
        logits = ctx.T * vocab / t
        B = ctx.B
        if training.loss == "standard":
            # upcast to fp32 and softmax, kept for backward (Korthikanti section 4.3); frameworks
            # without a fused kernel make a separate fp32 copy first
            fwd_bytes = logits * (B + 4) + (0 if training.framework == "megatron" else logits * 8)
            bwd_bytes = logits * (4 + B)
        else:  # fused in place, or chunked (Liger's chunks still pass through memory)
            fwd_bytes, bwd_bytes = 2 * logits * B, 2 * logits * B
        groups.append([dataclasses.replace(op, memory_efficiency=kernels.BANDWIDTH_EFFICIENCY) for op in [
            Operation("cross-entropy loss", "forward", "head", "elementwise", SOFTMAX_FLOPS * logits, fwd_bytes,
                      ctx.peak, ctx.bandwidth, count, f"softmax over s*b*V/t logits ({training.loss})"),
            Operation("cross-entropy loss (backward)", "backward", "head", "elementwise", 2 * logits, bwd_bytes,
                      ctx.peak, ctx.bandwidth, count, "softmax - one-hot, in the compute dtype"),
        ]])
    return _ordered(groups)


def _ordered(groups: list[list[Operation]]) -> tuple[list[Operation], list[Operation]]:
    """(forward operations in order, backward operations in reverse order) of groups of operations."""
    forward = [op for g in groups for op in g if op.phase == "forward"]
    backward = [op for g in reversed(groups) for op in reversed(g) if op.phase == "backward"]
    return forward, backward


# --- model FLOPs (for MFU) ---------------------------------------------------------------------------

def matmul_parameters(arch: Architecture) -> float:
    """N of the MFU: the weights of the matrix multiplications one token passes through, i.e.
    every layer's 2-D hidden matrices (routed experts: the top-k it is sent to, shared experts,
    routers, MLA's projections) plus the LM head (V x h, also when tied to the embedding). The
    embedding lookup, norms and biases are not matmuls and are left out. Layer index i's kind
    decides its weights; MTP modules are left out."""
    total = 0.0
    for kind, n_layers in arch.kind_counts():
        per_layer = 0.0
        for tensor in arch.layer_tensors(kind):
            if tensor.role != "hidden_matrix":
                continue
            if tensor.is_expert:
                per_layer += tensor.numel / tensor.copies * arch.num_experts_per_token
            else:
                per_layer += tensor.numel
        total += n_layers * per_layer
    return total + arch.vocab_size * arch.hidden_size


def model_flops_per_token(arch: Architecture, seq_len: int, training: bool = True) -> float:
    """`_model_flops_per_token`, remembered on the architecture: it reads the sequence length and the mode alone,
    and a layout search builds an operation table (operation_table.py) for each of hundreds of other settings."""
    return arch.cached(("model flops per token", seq_len, training),
                       lambda: _model_flops_per_token(arch, seq_len, training))


def _model_flops_per_token(arch: Architecture, seq_len: int, training: bool) -> float:
    """PaLM appendix B: 6N + 12*L*H*Q*T per token for training, with N = `matmul_parameters`,
    H heads of width Q and T = seq_len. We halve the attention term for the causal mask (the keys
    a query attends to, s/2 on average, or w - w^2/(2s) with a sliding window w), the work flash
    attention actually does; PaLM, Megatron-LM and torchtitan quote the unhalved term, so our MFU
    of the same run is a little lower than theirs. With MLA, 2Q = d_qk + d_v. Inference (a
    prefill): 2N + the forward third of the attention term, the LM head counted for one token of
    each sequence (2*V*h / seq_len per token)."""
    d_qk, d_v, _ = _attention_widths(arch)
    attention = sum(n * 2 * arch.num_attention_heads * (d_qk + d_v)
                    * attended_keys(seq_len, arch.local_attention if windowed else None,
                                    chunked=bool(arch.attention_chunk_size))
                    for (kind, windowed), n in arch.variant_counts().items() if hybrid.attends(kind))
    # a hybrid's chunked recurrences (hybrid_operations.py), their forward FLOPs per token, in the same term
    core = {"linear_attention": gated_delta_net_core_flops, "mamba": ssd_core_flops, "mamba1": selective_scan_flops,
            "attention_mamba": ssd_core_flops}
    attention += sum(n * core[hybrid.MIXER[kind]](arch) for kind, n in arch.kind_counts() if hybrid.MIXER[kind] in core)
    n = matmul_parameters(arch)
    if training:
        return 6 * n + 3 * attention
    head = arch.vocab_size * arch.hidden_size
    return 2 * (n - head) + attention + 2 * head / seq_len
