"""A Gated DeltaNet mixer (Qwen3-Next) on transformers' torch fallback (training.ssm_kernels "torch"): what runs
without flash-linear-attention and causal-conv1d. transformers 5.23.0 models/qwen3_next/modeling_qwen3_next.py
(cited QN with its line numbers): Qwen3NextGatedDeltaNet.forward (QN 658-778) calls causal_conv1d_fn's torch code
(QN 338-360) and torch_chunk_gated_delta_rule (QN 369-508) in place of fla's chunk_gated_delta_rule.

What autograd keeps beyond the ops around the kernels (memory/activations/hybrid.py gated_delta_net_entries keeps
those: the concatenated q, k, v, beta, the softplus, the gated norm, out_proj's input), every tensor checked by name
against a real CPU run of the layer's autograd graph (tests/test_ssm_torch.py):
  - the conv's output, (s + k - 1) long, kept by its SiLU (QN 350-359);
  - q and k over every value head (repeat_interleave) in fp32, kept by l2norm's products, and its rsqrt per head
    (QN 363-366, 403-411);
  - per chunk of 64 tokens (padded, F.pad copies): the two products k_beta k^T and q k^T before the decay (kept by
    the decay's products), the pairwise decay exp(...) (kept by both), ut_system (kept by the two triangular solves)
    and intra_chunk_attn (kept by each chunk's bmm), each (b, Hv, c, 64, 64) fp32 (QN 441-455);
  - q scaled and padded, q decayed, k normalised and padded, k_beta, k decayed and k_cumdecay (a solve's result),
    (b, Hv, c 64, K) fp32 each (one chunk: no decayed q or k, the last chunk's state update being discarded); v padded, new_values (a solve's result) and every chunk's v_new, (b, Hv, c 64, V) fp32
    each; beta padded and the three exponentials of the cumulated decay, (b, Hv, c 64) fp32; the chunk decay
    (b, Hv, c); each chunk's input state (b, Hv, K, V) fp32, c of them (QN 431-500);
  - per layer: the chunk's bool mask (64 x 64), A_log's exp twice.
"""

from __future__ import annotations

from ...spec.architecture import Architecture
from ...spec.dtypes import bytes_per_element
from ...spec.parallel import Parallel
from ...spec.training import Training
from .entries import Entry, tokens_per_gpu

CHUNK = 64  # torch_chunk_gated_delta_rule's chunk_size default (QN 375), as the layer calls it
SOURCE = "transformers 5.23.0 models/qwen3_next/modeling_qwen3_next.py torch_chunk_gated_delta_rule (torch fallback)"


def torch_gdn_entries(arch: Architecture, training: Training, par: Parallel) -> list[Entry]:
    """The fallback's own saved tensors (see the module docstring), in place of fla's and causal-conv1d's."""
    B = bytes_per_element(training.compute_dtype)
    T, b = tokens_per_gpu(training, par), training.micro_batch_size
    s = training.seq_len / par.cp
    hk, hv = arch.linear_num_key_heads, arch.linear_num_value_heads
    K, V, k = arch.linear_key_head_dim, arch.linear_value_head_dim, arch.linear_conv_kernel_dim
    c = -(-int(s) // CHUNK)
    Tp = b * c * CHUNK  # the tokens padded to whole chunks
    # the last chunk's state update is discarded (output_final_state False, QN 502): with one chunk nothing reads the
    # decayed k, the decayed q against a state that needs a gradient, k's decay or the chunk decay
    later = 1 if c > 1 else 0
    return [
        Entry("conv output, k - 1 positions longer (kept by its SiLU)", b * (s + k - 1) * (2 * hk * K + hv * V), B,
              "tp", "B*b*(s + k - 1)*(2*Hk*K + Hv*V)"),
        Entry("q and k over every value head in fp32 (kept by l2norm) and its rsqrt per head",
              T * 2 * hv * (K + 1), 4, "tp", "2*4*s*b*Hv*(K + 1)", tensors=4),
        Entry(f"per chunk: k_beta k^T and q k^T, the pairwise decay, ut_system, intra_chunk_attn (fp32, "
              f"{CHUNK} x {CHUNK})", Tp * 5 * hv * CHUNK, 4, "tp", f"5*4*b*c*{CHUNK}*Hv*{CHUNK}", tensors=5),
        Entry("q scaled, k normalised, k_beta, k_cumdecay; with 2 chunks or more q and k decayed (fp32, padded)",
              Tp * (4 + 2 * later) * hv * K, 4, "tp", f"{4 + 2 * later}*4*b*c*{CHUNK}*Hv*K", tensors=4 + 2 * later),
        Entry("v padded, new_values and every chunk's v_new (fp32)", Tp * 3 * hv * V, 4, "tp",
              f"3*4*b*c*{CHUNK}*Hv*V", tensors=3),
        Entry("beta padded and the cumulated decay's exponentials (three with 2 chunks or more, else two) (fp32)",
              Tp * (3 + later) * hv, 4, "tp", f"{3 + later}*4*b*c*{CHUNK}*Hv", tensors=3 + later),
        Entry("each chunk's input state (fp32) and the chunk decay", b * hv * c * (K * V + later), 4, "tp",
              "4*b*Hv*c*(K*V + 1)" if later else "4*b*Hv*K*V", split_by_cp=False),
        Entry("the chunk's bool mask and A_log's exp twice (per layer)", CHUNK * CHUNK + 2 * 4 * hv, 1, "none",
              f"{CHUNK}^2 + 2*4*Hv", split_by_cp=False),
    ]
