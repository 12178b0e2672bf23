"""Llama 4's blocks as transformers 5.23 runs them (models/llama4/modeling_llama4.py; measured,
tests/data/measured/llama-4-scout-*): the weightless L2 norm of q and k in the RoPE layers, and the MoE block
that sends every token through every routed expert.
"""

from __future__ import annotations

from ...spec.architecture import Architecture
from ...spec.dtypes import bytes_per_element
from ...spec.parallel import Parallel
from ...spec.choices import TRANSFORMERS_FRAMEWORKS
from ...spec.training import Training
from .entries import MOE, NORM, Entry, autocast, tokens_per_gpu

LLAMA4_SOURCE = "transformers 5.23 models/llama4/modeling_llama4.py"


def l2_norm_layer_share(arch: Architecture) -> tuple[float, str]:
    """The share of the layers with rotary positions, the ones that L2-normalise q and k: every layer but the
    global NoPE ones (every sliding_window_pattern-th), all of them without local attention. A layer's ledger is
    one per kind, so these entries are an average over the model: exact for a stage of whole periods (Scout's
    48 layers hold 12 periods of 4)."""
    if not arch.local_attention or arch.sliding_window_pattern == 0:
        return 1.0, ""
    n = arch.sliding_window_pattern
    return (n - 1) / n, f" x {n - 1}/{n} (the RoPE layers)"


def l2_qk_norm_entries(arch: Architecture, training: Training, par: Parallel) -> list[Entry]:
    """Llama4TextL2Norm over each head of q and k (after the rotary embedding): ``x.float()`` kept by ``pow``
    and ``mul``, the per-head ``rsqrt`` (fp32) kept by ``mul``; the normalised tensor is cast back and has no
    weight to keep it for (LLAMA4_SOURCE Llama4TextAttention.forward)."""
    share, note = l2_norm_layer_share(arch)
    T = tokens_per_gpu(training, par) * share
    heads = arch.num_attention_heads + arch.num_kv_heads
    return [Entry("q and k L2 norms (fp32 upcast)", T * (arch.q_width + arch.kv_width), 4, "tp",
                  "4*s*b*(a + g)*d_head" + note),
            Entry("q and k L2 norms (rsqrt per head, fp32)", T * heads, 4, "tp", "4*s*b*(a + g)" + note)]


def dense_moe(arch: Architecture, training: Training) -> bool:
    return arch.moe_dense_experts and training.framework in TRANSFORMERS_FRAMEWORKS


def dense_moe_entries(arch: Architecture, training: Training, par: Parallel) -> list[Entry]:
    """Llama4TextMoe.forward and its router (LLAMA4_SOURCE): the norm's output the router's linear keeps; topk over the router's logits keeps its int64
    indices (topk's and scatter_'s backward read them), sigmoid keeps its fp32 output; the scores, transposed to
    one per (expert, token) row, are a copy; ``hidden_states.repeat(E, 1)`` and that copy are kept by their
    product, which the gate/up ``bmm`` keeps. The experts' SwiGLU keeps what transformers' MLP keeps over the
    E x tokens rows (`dense_moe_rows`: mlp.py adds it, and the shared expert beside it)."""
    B = bytes_per_element(training.compute_dtype)
    T = tokens_per_gpu(training, par)
    e, k, h = arch.num_experts, arch.num_experts_per_token, arch.hidden_size
    rows = T * e
    # under autocast the norm's output is fp32 (the residual stream's dtype): the repeat keeps it so, and the
    # router's and the shared expert's gate and up linears each keep their own 16-bit cast of it (measured)
    X, readers = (4, 1 + 2 * (arch.num_shared_experts > 0)) if autocast(training) else (B, 1)
    return [Entry("router input" + (f" ({readers} autocast casts: router, shared gate and up)" if readers > 1 else ""),
                  readers * T * h, B, "sp", f"{readers}*B*s*b*h" if readers > 1 else "B*s*b*h", recompute=NORM,
                  for_weights=("router",)),
            Entry("router top-k indices (int64)", T * k, 8, "sp", "8*s*b*k", recompute=MOE),
            Entry("router scores (sigmoid output, fp32)", rows, 4, "sp", "4*s*b*E", recompute=MOE),
            Entry("router scores, one per expert row (a copy, kept by the scaling product)", rows, B, "sp",
                  "B*E*s*b", recompute=MOE),
            Entry("tokens repeated for every expert (kept by the scaling product)", rows * h, X, "sp",
                  f"{X:g}*E*s*b*h" if X != B else "B*E*s*b*h", recompute=MOE),
            Entry("scaled tokens (expert gate/up bmm input)", rows * h, B, "sp", "B*E*s*b*h", gemm_input=True,
                  recompute=MOE, for_weights=("experts",))]


def dense_moe_rows(training: Training, par: Parallel, arch: Architecture) -> float:
    """The rows the experts' bmm runs over: every token once per routed expert."""
    return tokens_per_gpu(training, par) * arch.num_experts
