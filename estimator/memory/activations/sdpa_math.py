"""transformers' Falcon on SDPA (attn_implementation "sdpa", transformers' default) with fewer key/value heads than
query heads: SDPA's math backend.

FalconModel always builds a 4-D mask (transformers 5.23 models/falcon/modeling_falcon.py lines 755-761,
``allow_is_causal_skip=False``: "Always materialize the mask so alibi can be added"), so FalconAttention calls SDPA
with a mask and ``is_causal`` False (lines 333-342). A multi-query Falcon (Falcon-7B: 71 query heads, one key/value
head, line 236) hands SDPA q at every head and k, v at one, without ``enable_gqa``: every fused backend needs equal
head counts then (torch sdp_utils_cpp.h check_batch_size_and_num_heads_dense; `sdpa_mask.sdpa_backend`), so SDPA runs
``_scaled_dot_product_attention_math`` (MATH_SOURCE), on any GPU and torch release. With 16-bit inputs it
- upcasts q, k and v to fp32 (``query_.to(at::kFloat)``, allowFP16BF16ReductionMathSDP off by default), copies that
  live until the call returns;
- scales the fp32 q (q x sqrt(scale)) and the transposed k (k^T x sqrt(scale)), and multiplies them (at::matmul):
  the matmul keeps both; at one batch the k head's expansion to the query heads reshapes into a view, beyond one
  (``matmul``'s expand then reshape of a batch-strided tensor) into a copy at every query head, which it keeps;
- adds the mask, which SDPA converted from bool to an additive one in q's dtype at the call (convert_boolean_attn_mask:
  b x 1 x s x s, new each call, freed as it returns), in place into the fp32 scores;
- takes ``_safe_softmax`` of them: softmax's fp32 output (kept, by softmax and the matmul with v), beside the scores
  an isneginf bool mask (b x heads x s^2) and its rows (b x heads x s), then ``where`` into the output;
- multiplies by the fp32 v (kept, expanded as k is) and casts the fp32 output back (``.to(origin_dtype)``: nothing
  kept), and the attention weights too (b x heads x s^2 in 16 bits, returned, dropped by SDPA).
Measured: the H200's sdpa-mask experiment (tests/data/measured/gpu/experiments/sdpa-mask-h200.json, torch
2.11.0+cu130, Falcon-7B's layer at s 2048 and 4096, b 1): the saved set to the byte (fp32 q at 71 heads, k and v at
one, the fp32 softmax), the forward's requests in the order above (the forward's peak over its start: the bias, the
three upcasts, the scaled q and k, the scores, the softmax and _safe_softmax's masks, to the 512-byte block), and the
backward's peak over its start three score-sized fp32 tensors (the gradient of the weights, softmax's gradient and
its CUDA temporary), as `kbit_attention.attention_moment` charges a prepared k-bit run's math backend. The b > 1
copies of k and v are torch's ``matmul`` (LinearAlgebra.cpp _matmul_impl), seen on the CPU (torch 2.13: its math
backend takes the same call).

Equal head counts (the new decoder architecture copies k and v out to every query head, `Architecture.
qkv_split_expands_kv`; Falcon without multi_query) leave a fused backend that takes the mask as a bias: the masked
path of `sdpa_mask` (`masked_layer_share` 1 for every layer).
"""

from __future__ import annotations

from ...spec.architecture import Architecture
from ...spec.choices import TRANSFORMERS_FRAMEWORKS
from ...spec.dtypes import bytes_per_element
from ...spec.parallel import Parallel
from ...spec.training import Training
from .alibi import alibi_mask_kept, mask_bytes_per_element
from .entries import CORE, UP_PROJ, Entry, tokens_per_gpu

MATH_SOURCE = ("torch 2.11 aten/src/ATen/native/transformers/attention.cpp _scaled_dot_product_attention_math "
               "(q, k, v upcast .to(at::kFloat) unless allowFP16BF16ReductionMathSDP; query_acc x sqrt(scale), "
               "matmul(query, key.transpose(-2, -1) x sqrt(scale)), attn.add_(mask), _safe_softmax, "
               "matmul(attn, value).to(origin_dtype)) and convert_boolean_attn_mask; LinearAlgebra.cpp _matmul_impl "
               "(batch broadcast: expand, then reshape); transformers 5.23 models/falcon/modeling_falcon.py lines "
               "333-342 and 755-761; measured: tests/data/measured/gpu/experiments/sdpa-mask-h200.json (Falcon-7B)")
SOFTMAX = "softmax output (fp32, SDPA math backend)"


def transformers_runs_sdpa(training: Training) -> bool:
    """transformers' modelling code calls torch's SDPA: "flash" under the transformers frameworks with
    attn_implementation sdpa (its default; flash_attention_2 calls flash-attn's kernel, which takes sliding windows
    itself and no mask: transformers integrations/flash_attention.py)."""
    return (training.framework in TRANSFORMERS_FRAMEWORKS and training.attention == "flash"
            and training.attn_implementation != "flash_attention_2")


def falcon_math_sdpa(arch: Architecture, training: Training) -> bool:
    """Falcon handing SDPA its 4-D mask (`Architecture.sdpa_mask_always`) with fewer key/value heads than query
    heads, under transformers' SDPA ("flash" under the transformers frameworks): the math backend."""
    return (arch.sdpa_mask_always and transformers_runs_sdpa(training)
            and arch.num_kv_heads != arch.num_attention_heads and not arch.qkv_split_expands_kv)


def _kv_heads_kept(arch: Architecture, training: Training) -> int:
    """The heads of the fp32 k and v the matmuls keep: the KV heads at one batch (the expansion is a view), every
    query head beyond (matmul's reshape copies it)."""
    return arch.num_kv_heads if training.micro_batch_size == 1 else arch.num_attention_heads


def falcon_math_entries(arch: Architecture, training: Training, par: Parallel) -> list[Entry]:
    """What the math backend keeps for a layer (module docstring): fp32 q at every head (scaled), fp32 k (scaled)
    and v at the KV heads (every head beyond one batch), the fp32 softmax; with attention dropout (Falcon's alibi
    path passes it: lines 369-375) native_dropout's bool mask and its fp32 output, which the matmul with v keeps."""
    T = tokens_per_gpu(training, par)
    d = arch.head_dim
    scores = training.micro_batch_size * arch.num_attention_heads * (training.seq_len / par.cp) * training.seq_len
    kv = _kv_heads_kept(arch, training)
    kv_formula = "4*s*b*2*g*d_head" if kv == arch.num_kv_heads else "4*s*b*2*a*d_head (matmul's copies, b > 1)"
    out = [Entry("q scaled (fp32, SDPA math backend)", T * arch.q_width, 4, "tp", "4*s*b*a*d_head",
                 recompute=UP_PROJ),
             Entry("k scaled and v (fp32, SDPA math backend)", T * 2 * kv * d, 4, "tp", kv_formula,
                   recompute=UP_PROJ, tensors=2),
             Entry(SOFTMAX, scores, 4, "tp", "4*a*s^2*b", recompute=CORE)]
    if training.dropout > 0 and arch.position_embedding == "alibi":
        out.append(Entry("attention dropout mask (SDPA math backend)", scores, 1, "tp", "a*s^2*b", recompute=CORE))
        out.append(Entry("attention dropout output (fp32, SDPA math backend)", scores, 4, "tp", "4*a*s^2*b",
                         recompute=CORE))
    return out


def falcon_math_forward_extra(arch: Architecture, training: Training, par: Parallel) -> tuple[float, str]:
    """The math backend's forward tensors beside the scores, their -inf mask and the kept set that
    `kbit_attention.attention_moment` does not count (bytes over TP, formula): SDPA's additive mask (b x s^2 in q's
    dtype; with ALiBi the model's b x heads x s^2 one where the activations do not hold it), the fp32 copies of a
    16-bit q and k (the upcasts; v's is kept), and beyond one batch the scaled k and fp32 v before the matmuls copy
    them out to every head; _safe_softmax's row mask (b x heads x s, bool)."""
    B = bytes_per_element(training.compute_dtype)
    T = tokens_per_gpu(training, par)
    b, s, a, kv_width = training.micro_batch_size, training.seq_len, arch.num_attention_heads, arch.kv_width
    bias, bias_text = b * (s / par.cp) * s * B, f"mask {B:g}*b*s^2"
    if arch.position_embedding == "alibi":  # a float mask, not converted: the one ALiBi mask of the step (alibi.py)
        size = mask_bytes_per_element(training)
        kept = alibi_mask_kept(arch, training)  # then among the activations already
        bias = 0.0 if kept else b * a * (s / par.cp) * s * size
        bias_text = "" if kept else f"ALiBi mask {size:g}*b*a*s^2 (alive through the forward)"
    upcasts = 4 * T * (arch.q_width + kv_width) / par.tp if B < 4 else 0.0
    # beyond one batch: the scaled k, and v's fp32 copy (none for fp32 inputs: v itself), before matmul's copies
    unexpanded = 4 * T * (2 if B < 4 else 1) * kv_width / par.tp if b > 1 else 0.0
    rows = T * a / par.tp
    parts = [bias_text] if bias_text else []
    parts += ["upcasts 4*s*b*(a + g)*d_head"] if upcasts else []
    if unexpanded:
        parts.append(f"k{', v' if B < 4 else ''} before matmul's copies 4*s*b*{2 if B < 4 else 1}*g*d_head")
    parts.append("row mask s*b*a")
    return bias + upcasts + unexpanded + rows, " + ".join(parts)
