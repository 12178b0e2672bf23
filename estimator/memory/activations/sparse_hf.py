"""DeepSeek Sparse Attention in training as transformers 5.23 runs it (models/deepseek_v32/
modeling_deepseek_v32.py, DeepseekV32Attention and DeepseekV32Indexer), under eager attention.

What that code does, and so what the estimate models:
- `DeepseekV32Indexer.forward` is decorated `@torch.no_grad()`: nothing it makes is saved for backward, its
  weights (wq_b, wk, k_norm, weights_proj) get no gradient, and torch's AdamW, which skips a parameter whose
  `.grad` is None, keeps no state for them (memory/states.py leaves them out of the trained parameters). The
  indexer is not trained: there is no KL loss (Megatron-Core's DSAttention has one, sparse.py).
- `DeepseekV32Attention.forward` folds the top-k into the attention mask (a bool [b, s, s] scattered from the
  indices, then `masked_fill` of the mask) and runs dense attention over every key: under eager attention the
  scores are [b, a, s, s], their fp32 softmax and its 16-bit cast are kept, as for any eager model.
- Its MLA: `q_a_layernorm` and `kv_a_layernorm` are the model's RMSNorm (fp32 upcast, rsqrt and the normalised
  tensor kept, as for the layer norms); `query_states = torch.cat((q_pass, q_rot))` and `expand_kv`'s
  `key_states = new_empty(...)` filled with copy_ are kept by QK^T; `value_states` is a view of kv_b_proj's
  output: matmul's reshape keeps that view (the whole output, d_nope + d_v per head) when b = 1 and a
  contiguous copy of v when b > 1 (the batch and head dims then do not merge into one stride).

Moments (bytes over what the layer keeps; dsa_hf_moments.py adds the gradients made before them):
- forward, the larger of the indexer's (its matmul's fp32 scores [b, s, H_I, s] and their scaled copy, 8 b s^2
  H_I, beside its 16-bit q and k; with b > 1 the matmul broadcasts k over the queries and copies it, [b s, D_I,
  s] in fp32) and the softmax's (`softmax(..., dtype=float32)` copies the masked 16-bit scores to fp32 beside
  its output: 4 b a s^2 over what the layer keeps), each beside the attention's unsaved locals and the masks;
- with every layer checkpointed (HF gradient checkpointing) the first forward saves nothing, and its moment is
  the layer's whole working set (`hf_checkpointed_forward`);
- backward, the softmax's backward: the fp32 gradient of the cast, CUDA's `tmp = grad * output` (PyTorch
  aten/src/ATen/native/cuda/SoftMax.cu `softmax_backward_cuda_out`, alive while the kernel runs) and the
  softmax's input gradient (12 b a s^2) beside the kept softmax, once scores x V's backward freed the 16-bit
  probabilities and v and made dV. The temporary is CUDA's: H200 runs (torch 2.11, transformers 5.17,
  tests/data/measured/gpu/deepseek-v3.2-*) allocated 4 b a s^2 more than the harness before it emulated it.
Checked against the HF harness under fake tensors (tests/data/measured/deepseek-v3.2-*).
"""

from __future__ import annotations

from ...spec.architecture import Architecture
from ...spec.dtypes import bytes_per_element
from ...spec.parallel import Parallel
from ...spec.training import Training
from .entries import CORE, Entry, tokens_per_gpu

HF_SOURCE = "transformers 5.23 models/deepseek_v32/modeling_deepseek_v32.py (DeepseekV32Attention, DeepseekV32Indexer)"


def _latent_norm(name: str, T: float, width: int, symbol: str, B: float) -> list[Entry]:
    """DeepseekV32RMSNorm over a latent: x.float() (kept by pow and mul), the rsqrt per token, the normalised
    tensor cast back before the scale (kept by the scale's mul)."""
    return [Entry(f"{name} (fp32 upcast)", T * width, 4, "none", f"4*s*b*{symbol}"),
            Entry(f"{name} (rsqrt per token, fp32)", T, 4, "none", "4*s*b"),
            Entry(f"{name} (normalised, before the scale)", T * width, B, "none", f"B*s*b*{symbol}")]


def hf_dsa_entries(arch: Architecture, training: Training, par: Parallel) -> list[Entry]:
    """What one DeepseekV32Attention keeps beyond its input norm, the compressed q and kv (attention.py) and
    its output (the output projection's input): the latent norms, q and k, the eager softmax and v."""
    B = bytes_per_element(training.compute_dtype)
    T = tokens_per_gpu(training, par)
    b, s, a = training.micro_batch_size, training.seq_len, arch.num_attention_heads
    qk = arch.qk_nope_head_dim + arch.qk_rope_head_dim
    scores = b * a * s * s
    out = _latent_norm("q latent norm", T, arch.q_lora_rank, "q_lora_rank", B)
    out += _latent_norm("kv latent norm", T, arch.kv_lora_rank, "kv_lora_rank", B)
    out += [Entry("query states (torch.cat of the nope and rotated parts, kept by QK^T)", T * a * qk, B, "tp",
                  "B*s*b*a*(d_nope + d_rope)"),
            Entry("key states (expand_kv's new_empty, the rope key copied to every head, kept by QK^T)", T * a * qk,
                  B, "tp", "B*s*b*a*(d_nope + d_rope)"),
            Entry("softmax output (fp32, every key: the top-k is a mask)", scores, 4, "tp", "4*a*s^2*b",
                  recompute=CORE),
            Entry("softmax output cast to the compute dtype", scores, B, "tp", "B*a*s^2*b", recompute=CORE)]
    if b == 1:
        out.append(Entry("kv up-projection output (v is a view of it, kept by scores x V)",
                         T * a * (arch.qk_nope_head_dim + arch.v_head_dim), B, "tp", "B*s*b*a*(d_nope + d_v)"))
    else:
        out.append(Entry("v made contiguous by matmul (kept by scores x V)", T * a * arch.v_head_dim, B, "tp",
                         "B*s*b*a*d_v"))
    return out


def _value_kept(arch: Architecture, training: Training) -> float:
    """Bytes per token of the entry that keeps v (see hf_dsa_entries)."""
    B = bytes_per_element(training.compute_dtype)
    a = arch.num_attention_heads
    if training.micro_batch_size == 1:
        return B * a * (arch.qk_nope_head_dim + arch.v_head_dim)
    return B * a * arch.v_head_dim


def _masks(arch: Architecture, training: Training, core: bool) -> tuple[float, str]:
    """The masks alive in a layer's forward: the model's eager causal mask (B b s^2, made once per forward);
    at the core also the top-k indices (int32), the bool index mask scattered from them and the masked copy
    of the causal mask (DeepseekV32Attention.forward)."""
    B = bytes_per_element(training.compute_dtype)
    b, s = training.micro_batch_size, training.seq_len
    k = min(arch.index_topk, s)
    if not core:
        return B * b * s * s, "B*b*s^2"
    return (2 * B + 1) * b * s * s + 4 * b * s * k, "(2*B + 1)*b*s^2 + 4*s*b*min(topk, s)"


def _indexer(arch: Architecture, training: Training) -> float:
    """The indexer's largest moment: its matmul's fp32 scores [b, s, H_I, s] and their scaled copy beside its
    16-bit q (wq_b's output, which q_pass keeps alive, the cat, the rotated half) and k (wk's and k_norm's
    outputs, the rotated half); with b > 1 matmul's broadcast copy of k, [b s, D_I, s] in fp32, beside its own
    fp32 q and k and the scores, when larger."""
    B = bytes_per_element(training.compute_dtype)
    b, s = training.micro_batch_size, training.seq_len
    T, S = b * s, b * s * s
    heads, dim, rope = arch.index_n_heads, arch.index_head_dim, arch.qk_rope_head_dim
    local = B * T * (heads * (2 * dim + rope) + 2 * dim + rope)
    matmul = 4 * T * (heads * dim + dim) + 4 * S * heads + (4 * S * dim if b > 1 else 0)
    return local + max(8 * S * heads, matmul)


def _attention_locals(arch: Architecture, training: Training) -> float:
    """What DeepseekV32Attention.forward holds unsaved while its indexer and softmax run: q_b_proj's output
    (q_pass a view of it), the rotated q_rot, kv_a_proj_with_mqa's output and the rotated k_rot."""
    B = bytes_per_element(training.compute_dtype)
    T, a, rope = training.micro_batch_size * training.seq_len, arch.num_attention_heads, arch.qk_rope_head_dim
    return B * T * (a * (arch.qk_nope_head_dim + 2 * rope) + arch.kv_lora_rank + 2 * rope)


def hf_dsa_moments(arch: Architecture, training: Training, par: Parallel) -> tuple[float, float, str, str]:
    """(forward, backward) bytes one layer holds at its worst moment beyond what the layer keeps, with their
    formulas (module docstring; Sa = b a s^2). Forward, the larger of the indexer's moment (before q, k and v's
    softmax exists) and the softmax's (its fp32 copy of the masked bf16 scores beside its output)."""
    B = bytes_per_element(training.compute_dtype)
    b, s = training.micro_batch_size, training.seq_len
    T, Sa = b * s, b * s * s * arch.num_attention_heads
    local = _attention_locals(arch, training)
    indexer = _indexer(arch, training) + local + _masks(arch, training, False)[0] - (4 + B) * Sa
    softmax = 4 * Sa + local + _masks(arch, training, True)[0]
    forward = max(indexer, softmax)
    # the cast's fp32 gradient, CUDA's tmp = grad * output and the input's gradient (module docstring)
    backward = (12 - B) * Sa + B * T * arch.num_attention_heads * arch.v_head_dim - T * _value_kept(arch, training)
    forward_formula = ("max(the indexer's scores, 8*b*s^2*H_I (fp32, with b > 1 its copy of k 4*b*s^2*D_I) and "
                       "its q and k - (4 + B)*Sa, the softmax's fp32 copy of its input 4*Sa and the masks) + "
                       "q_b_proj's output, the rotated q and k, kv_a's output (Sa = b*a*s^2)")
    v = "B*s*b*a*(d_nope + d_v)" if b == 1 else "B*s*b*a*d_v"
    backward_formula = (f"(12 - B)*Sa + B*s*b*a*d_v - {v}: the softmax's backward in fp32, CUDA's grad * output "
                        "temporary included (Sa = b*a*s^2)")
    return forward, backward, forward_formula, backward_formula


def hf_checkpointed_forward(arch: Architecture, training: Training, par: Parallel) -> tuple[float, str]:
    """A layer's largest moment in its checkpointed forward (torch.utils.checkpoint, every layer under HF's
    gradient checkpointing), which saves nothing: beside its input (kept by the checkpoint) the outputs of its
    norms, q and k, kv_b_proj's output and the attention locals, with the indexer's moment or the softmax's
    (the masked 16-bit scores, their fp32 copy and the softmax output, (8 + B) Sa) and the masks."""
    B = bytes_per_element(training.compute_dtype)
    b, s, a = training.micro_batch_size, training.seq_len, arch.num_attention_heads
    T, Sa = b * s, b * s * s * a
    qk = arch.qk_nope_head_dim + arch.qk_rope_head_dim
    held = B * T * (arch.hidden_size + arch.q_lora_rank + arch.kv_lora_rank + a * (2 * qk + arch.qk_nope_head_dim
                                                                                  + arch.v_head_dim))
    held += _attention_locals(arch, training)
    indexer = _indexer(arch, training) + _masks(arch, training, False)[0]
    softmax = (8 + B) * Sa + _masks(arch, training, True)[0]
    formula = ("B*s*b*(h + q_lora_rank + kv_lora_rank + a*(3*(d_nope + d_rope) + d_v) + ...) + max(the indexer's "
               "scores, (8 + B)*Sa + the masks): the checkpointed forward saves nothing (Sa = b*a*s^2)")
    return held + max(indexer, softmax), formula


def check_hf_training(arch: Architecture, training: Training) -> None:
    """What transformers' DeepSeek-V3.2 training is modelled for (a ConfigError naming the field otherwise)."""
    from ...spec.errors import ConfigError
    related = ("model.index_n_heads", "training.framework")
    if training.attention != "eager":
        raise ConfigError("training.attention", training.attention, "'eager' for a model with sparse attention "
                          "under framework 'hf'", "transformers 5.23 DeepseekV32Attention folds the top-k into a "
                          "materialised mask, so SDPA runs its masked kernel (not flash attention), which is not "
                          "modelled", related=related)
    if training.param_dtype != training.compute_dtype or training.compute_dtype not in ("bf16", "fp16"):
        raise ConfigError("training.param_dtype", training.param_dtype, f"equal to compute_dtype "
                          f"({training.compute_dtype}), bf16 or fp16, for a model with sparse attention under "
                          "framework 'hf'", "the indexer's fp32 scores under autocast are not modelled",
                          related=related)
    if training.adapter or training.compile or training.dropout or training.offload_activations:
        field = ("training.adapter" if training.adapter else "training.compile" if training.compile else
                 "training.dropout" if training.dropout else "training.offload_activations")
        value = getattr(training, field.split(".")[1])
        raise ConfigError(field, value, "unset for a model with sparse attention under framework 'hf'",
                          "transformers' DeepSeek-V3.2 training is modelled for full fine-tuning in eager mode",
                          related=related)
    if not arch.q_lora_rank:
        raise ConfigError("model.q_lora_rank", arch.q_lora_rank, "set for a model with sparse attention under "
                          "framework 'hf'", "DeepseekV32Attention always projects q through q_a_proj (its indexer "
                          "reads the compressed q)", related=related)
