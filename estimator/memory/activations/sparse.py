"""DeepSeek Sparse Attention's saved tensors in training, as Megatron-Core 0.16.1 runs it
(transformer/experimental_attention_variant/dsa.py, DSAttention.forward under MLA's
experimental_attention_variant "dsa").

What the estimate models: DeepSeek's sparse training stage (DeepSeek-V3.2-Exp report, section 2.1.2): the
main model learns from the language-modelling loss through the top-k sparse attention, and the lightning
indexer from the KL divergence between its scores and the main attention's (summed over heads,
L1-normalised), on inputs detached from the main model's graph (DSAttention.forward: x.detach(),
qr.detach()); `dsa_indexer_use_sparse_loss` picks the KL over the selected tokens only, which changes no
shape here. The dense warm-up stage (the main model frozen, dense attention, only the indexer trained) is
not modelled: Megatron-Core 0.16.1 has no dense-attention mode for DSA.

Megatron-Core 0.16.1's DSA is unfused: every query scores every key, so its tensors are quadratic in the
sequence. The indexer's scores are neither chunked nor split by head group: _compute_index_scores (dsa.py lines
474-516 at tag core_v0.16.1, the installed file) runs one einsum 'sbhd,tbd->sbht' over all H_I heads in fp32,
[s, b, H_I, s], and sums the weighted heads into the [b, s, s] fp32 index scores that top-k reads (line 611) and
the KL loss softmaxes (compute_dsa_indexer_loss, lines 161-252, beside the main scores [b, a/t, s, s] in fp32).
(b = micro-batch, s = sequence, a = attention heads, split over TP; H_I, D_I = index heads and head dim,
replicated; k = min(index_topk, s).) Autograd keeps, per layer and micro-batch:

- the indexer (DSAIndexer.forward_with_scores, _compute_index_scores): k_norm's input (B s b D_I) and its
  fp32 mean and rstd (CUDA layer_norm); the index weights (B s b H_I: the product with the ReLU scores keeps
  them); einsum's fp32 copies of q (4 s b H_I D_I) and k (4 s b D_I); the ReLU's fp32 output (4 b s H_I s);
  the RoPE's cos and sin in the compute dtype for q and for k (4 B s d_rope).
  topk's node would keep its indices, but only its unused values hold the node, so nothing keeps them past
  the layer. The linears' inputs are the detached hidden states and compressed query MLA's
  down-projections already keep; under sequence parallelism their all-gathered copies are new. The
  Hadamard rotation (fast_hadamard_transform) keeps nothing.
- the sparse attention (unfused_dsa_fn): bmm's fp32 copies of q and k (4 b a s (d_nope + d_rope) each),
  softmax's fp32 output (4 b a s^2), its 16-bit copy for scores x V (B b a s^2), and v (B b a s d_v; MLA
  makes it contiguous, multi_latent_attention.py, and bmm keeps the view of it).
- the KL loss (compute_dsa_indexer_loss): the index scores' fp32 softmax, the input of their log, and the
  target distribution the product keeps (3 x 4 b s^2). The loss itself is a scalar (DSAIndexerLossAutoScaler).

Beyond these, the layer's forward and backward pass through moments of quadratic temporaries
(`dsa_moments`). Both are checked on a real CPU run of these Megatron-Core functions under the harness's
storage tracker (validation/core/tracker.py): what is alive when backward starts, and the peaks of the
forward and of the backward, byte for byte (tests/test_sparse_attention.py).
"""

from __future__ import annotations

from ...spec.architecture import Architecture
from ...spec.dtypes import bytes_per_element
from ...spec.parallel import Parallel
from ...spec.sparse import selected_keys
from ...spec.training import Training
from .entries import UP_PROJ, Entry, tokens_per_gpu

SOURCE = "Megatron-Core 0.16.1 transformer/experimental_attention_variant/dsa.py"


def indexer_entries(arch: Architecture, training: Training, par: Parallel) -> list[Entry]:
    """The lightning indexer's saved tensors (replicated on every TP rank: the indexer is duplicated)."""
    B = bytes_per_element(training.compute_dtype)
    T = tokens_per_gpu(training, par)
    b, s = training.micro_batch_size, training.seq_len
    heads, dim = arch.index_n_heads, arch.index_head_dim
    out = [Entry("indexer k_norm input", T * dim, B, "none", "B*s*b*D_I"),
           Entry("indexer k_norm mean and rstd (fp32)", 2 * T, 4, "none", "2*4*s*b"),
           Entry("indexer head weights (kept by the weighting product)", T * heads, B, "none", "B*s*b*H_I"),
           Entry("indexer q and k in fp32 (kept by the scoring einsum)", T * (heads * dim + dim), 4, "none",
                 "4*s*b*(H_I + 1)*D_I"),
           Entry("indexer ReLU scores (fp32)", b * s * heads * s, 4, "none", "4*b*s^2*H_I"),
           # _apply_rope -> rope_utils._apply_rotary_pos_emb_bshd: t * cos + rotate_half(t) * sin keeps the
           # cos and sin cast to the compute dtype, [s, 1, 1, d_rope] each, for q and for k
           Entry("indexer RoPE cos and sin for q and k (compute dtype)", 4 * s * arch.qk_rope_head_dim, B, "none",
                 "4*B*s*d_rope")]
    if par.sequence_parallel and par.tp > 1:
        # gather_from_sequence_parallel_region of the detached x and qr: new tensors the linears keep
        out.append(Entry("indexer's all-gathered hidden states and compressed q (sequence parallel)",
                         T * (arch.hidden_size + (arch.q_lora_rank or arch.hidden_size)), B, "none",
                         "B*s*b*(h + q_lora_rank)"))
    return out


def sparse_core_entries(arch: Architecture, training: Training, par: Parallel) -> list[Entry]:
    """unfused_dsa_fn's and the KL loss's saved tensors (the per-head ones split over TP)."""
    B = bytes_per_element(training.compute_dtype)
    T = tokens_per_gpu(training, par)
    b, s, a = training.micro_batch_size, training.seq_len, arch.num_attention_heads
    qk = arch.qk_nope_head_dim + arch.qk_rope_head_dim
    scores = b * a * s * s
    return [Entry("q and k in fp32 (kept by the unfused sparse attention's QK^T)", 2 * T * a * qk, 4, "tp",
                  "2*4*s*b*a*(d_nope + d_rope)"),
            Entry("sparse attention softmax output (fp32, masked to the top-k keys)", scores, 4, "tp", "4*a*s^2*b"),
            Entry("sparse attention probabilities cast to the compute dtype", scores, B, "tp", "B*a*s^2*b"),
            # MLA's v itself (bmm keeps a view of it): with "mla_up_proj" recomputed, MLA frees its q, k, v
            # after the core attention and rebuilds them for its backward (multi_latent_attention.py
            # qkv_up_checkpoint.discard_output_and_register_recompute)
            Entry("v (kept by scores x V)", T * a * arch.v_head_dim, B, "tp", "B*s*b*a*d_v", recompute=UP_PROJ),
            Entry("indexer KL loss: softmax of the index scores, its log input and the target (fp32)",
                  3 * b * s * s, 4, "none", "3*4*b*s^2")]


def dsa_entries(arch: Architecture, training: Training, par: Parallel) -> list[Entry]:
    return indexer_entries(arch, training, par) + sparse_core_entries(arch, training, par)


def dsa_moments(arch: Architecture, training: Training, par: Parallel) -> tuple[float, float, str, str]:
    """(forward, backward) bytes one DSA layer holds at its worst moment beyond what the layer keeps (the
    ledger's DSA entries and the attention output), with their formulas; per rank (S2 = b s^2,
    Sa = b (a/t) s^2, Si = b s^2 H_I).

    Forward, the largest of four moments (a negative one is none):
    - the indexer's head weighting: the product (4 Si) and its sum over heads (4 S2), the index q and k in
      the compute dtype, before the attention's and the loss's tensors exist;
    - the loss's QK^T: fp32 copies of q and k (8 s b a (d_nope + d_rope)) and the scores (4 Sa), beside the
      index scores (4 S2), before the loss's own saved tensors (12 S2);
    - the loss's softmax over the main attention's scores: scores and softmax (8 Sa), the causal and top-k
      masks (4 s^2, 4 S2), before the loss's own saved tensors;
    - the loss's elementwise KL: the two logs and their difference, the index scores and top-k mask
      (20 S2);
    all three beside DSAttention.forward's fp32 causal mask (4 s^2), its top-k indices (8 b s k) and MLA's
    q and k in the compute dtype (its locals until the call returns).
    Backward (autograd runs the nodes made last first: the loss's, then the sparse attention's, then the
    indexer's, then MLA's), the larger of:
    - the sparse attention's softmax backward: the probabilities' gradient in fp32 and the softmax's input
      gradient (8 Sa) beside the loss's gradient for the index scores (4 S2), once the 16-bit probabilities
      and the loss's tensors are freed (dv replaces v);
    - the sparse attention's QK^T backward: dq and dk in fp32 (8 s b a (d_nope + d_rope)) and the scores'
      gradient (4 Sa), once the softmax output is freed too;
    - the indexer's backward: the gradients of the weighted scores and of the ReLU output (8 Si), the
      softmax's input gradient (4 S2), the index weights' (4 s b H_I) and the attention's dq, dk, dv waiting
      for MLA's backward, after the attention's (v included) and the loss's tensors are freed."""
    B = bytes_per_element(training.compute_dtype)
    t = par.tp
    b, s = training.micro_batch_size, training.seq_len
    T, heads, dim = b * s, arch.index_n_heads, arch.index_head_dim
    a, qk, dv = arch.num_attention_heads / t, arch.qk_nope_head_dim + arch.qk_rope_head_dim, arch.v_head_dim
    k = selected_keys(arch, s)
    S2, Sa, Si = b * s * s, b * a * s * s, b * s * s * heads
    core_saved = 8 * T * a * qk + (4 + B) * Sa + 12 * S2 + 4
    held = 4 * s * s + 8 * T * k + 2 * B * T * a * qk  # causal mask, top-k indices, MLA's q and k
    # no top-k indices and no attention output yet at the indexer's moment
    indexer = 4 * Si + 4 * S2 + B * T * (heads * dim + dim) + held - 8 * T * k - core_saved - B * T * a * dv
    kl_scores = 8 * T * a * qk + 4 * Sa + 4 * S2 + held - 12 * S2 - 4
    kl_softmax = 8 * Sa + 4 * s * s + 8 * S2 + held - 12 * S2 - 4
    kl_elementwise = 20 * S2 + 4 * s * s + held - 4
    forward = max(indexer, kl_scores, kl_softmax, kl_elementwise, 0)
    attention_backward = (8 - B) * Sa + 4 * S2 - 12 * S2 - 4
    scores_backward = 8 * T * a * qk - B * Sa - 8 * S2 - 4
    indexer_backward = 8 * Si + 4 * S2 + 4 * T * heads + B * T * a * (2 * qk + dv) - core_saved - B * T * a * dv
    backward = max(attention_backward, scores_backward, indexer_backward, 0)
    by_t = "/t" if t > 1 else ""
    forward_formula = (f"max(4*Si + 4*S2 + B*s*b*(H_I + 1)*D_I, 8*s*b*a*(d_nope + d_rope){by_t} + 4*Sa - 8*S2, "
                       f"8*Sa - 4*S2 + 4*s^2, 20*S2 + 4*s^2) + 4*s^2 + 8*s*b*min(topk, s) + "
                       f"2*B*s*b*a*(d_nope + d_rope){by_t} - the DSA tensors not yet saved "
                       f"(S2 = b*s^2, Sa = b*a*s^2{by_t}, Si = b*s^2*H_I)")
    backward_formula = (f"max((8 - B)*Sa - 8*S2, 8*s*b*a*(d_nope + d_rope){by_t} - B*Sa - 8*S2, "
                        f"8*Si + 4*S2 + 4*s*b*H_I + B*s*b*a*(2*(d_nope + d_rope) + d_v){by_t} "
                        f"- the freed attention and loss tensors) (S2 = b*s^2, Sa = b*a*s^2{by_t}, Si = b*s^2*H_I)")
    return forward, backward, forward_formula, backward_formula


def checkpointed_forward(arch: Architecture, training: Training, par: Parallel) -> tuple[float, str]:
    """A DSA layer's largest moment in its checkpointed forward (full recompute: CheckpointFunction runs it under
    no_grad, so it saves nothing and DSAttention makes no KL loss, `self.training and torch.is_grad_enabled()`),
    per rank: the indexer's ReLU beside the einsum's fp32 scores (8 Si, _compute_index_scores), or the sparse
    attention's softmax beside its scaled fp32 scores (8 Sa) with the index scores, the index and causal masks
    and the top-k indices; beside DSAttention's fp32 causal mask (4 s^2), MLA's q, k and v and the indexer's
    rotated q and k (measured: tests/data/measured/megatron/deepseek-v2-lite-dsa-*-full-uniform1)."""
    B = bytes_per_element(training.compute_dtype)
    b, s = training.micro_batch_size, training.seq_len
    T, heads, dim = b * s, arch.index_n_heads, arch.index_head_dim
    a, qk = arch.num_attention_heads / par.tp, arch.qk_nope_head_dim + arch.qk_rope_head_dim
    S2, Sa, Si = b * s * s, b * a * s * s, b * s * s * heads
    held = 4 * s * s + B * T * (heads * dim + dim) + B * T * a * (2 * qk + arch.v_head_dim)
    attention = 8 * Sa + 8 * S2 + 4 * s * s + 8 * T * selected_keys(arch, s)
    by_t = "/t" if par.tp > 1 else ""
    formula = (f"max(8*Si, 8*Sa + 8*S2 + 4*s^2 + 8*s*b*min(topk, s)) + 4*s^2 + B*s*b*(H_I + 1)*D_I + "
               f"B*s*b*a*(2*(d_nope + d_rope) + d_v){by_t}: the checkpointed forward saves nothing "
               f"(S2 = b*s^2, Sa = b*a*s^2{by_t}, Si = b*s^2*H_I)")
    return held + max(8 * Si, attention), formula


def check_training(arch: Architecture, training: Training, par: Parallel) -> None:
    """What training with sparse attention is modelled for (a ConfigError naming the field otherwise)."""
    from ...spec.errors import ConfigError
    if training.mode != "training":
        return
    related = ("model.index_n_heads",)
    if training.framework == "hf":  # transformers 5.23's DeepSeek-V3.2, its indexer under no_grad (sparse_hf.py)
        from .sparse_hf import check_hf_training
        check_hf_training(arch, training)
        return
    if training.framework != "megatron":
        raise ConfigError("training.framework", training.framework, "'megatron' or 'hf' for a model with sparse "
                          "attention", "DeepSeek Sparse Attention's training is modelled as Megatron-Core 0.16.1 runs "
                          "it (DSAttention with the indexer's KL loss) and as transformers 5.23 runs it (the indexer "
                          "under no_grad, not trained)", related=related)
    if par.cp > 1:
        raise ConfigError("parallel.cp", par.cp, "1 for a model with sparse attention",
                          "Megatron-Core 0.16.1 refuses it (transformer_config.py: 'Currently context parallelism is "
                          "not supported by DSAttention!')", related=related)
    if training.recompute == "selective" and "core_attn" in training.recompute_modules:
        raise ConfigError("training.recompute_modules", list(training.recompute_modules),
                          "without 'core_attn' for a model with sparse attention",
                          "Megatron-Core 0.16.1 MLA's _checkpointed_attention_forward does not pass DSAttention "
                          "its hidden states and compressed query (multi_latent_attention.py)", related=related)
