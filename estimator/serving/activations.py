"""The torch activation peak of vLLM's profiling run (a model, not a measurement).

`profile_run` (v1/worker/gpu_model_runner.py, 0.11 and 0.33) runs one forward pass over
``max_num_batched_tokens`` dummy tokens split into min(tokens, max_num_seqs) requests, then, on the last
pipeline stage, the LM head and the sampler over one row per request. The increase of
``torch.cuda.max_memory_allocated`` during it is taken from the budget. Without a GPU we model it from
the tensors that source allocates (vLLM's own figure needs a GPU; the record says so):

- forward, in the widest layer: the residual stream and the layer's input (2 x T x h), with either
  the attention's q, k, v and output (T x (q + 2 kv + q)/TP) or the MLP's gate-up output and its
  activation (T x 3 x I/TP); a routed MoE layer's fused_moe caches hold T x top-k rows of 2I/TP and
  I/TP and one of h (fused_moe.py intermediate_cache1..3).
- a hybrid model's Gated DeltaNet or Mamba-2 mixer in place of the attention's tensors: its in_proj output
  and the conv's and kernel's outputs (issue 28; modelled like the rest).
- sampler: the gathered logits of every request in the compute dtype (n x V), their fp32 copy
  (sampler.py ``logits.to(torch.float32)``) and FlashInfer's fp32 probabilities (topk_topp_sampler.py
  forward_cuda), 10 bytes per logit, beside the last layer's output kept by the runner (T x h).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..spec import hybrid
from ..spec.architecture import Architecture
from .kv_cache import kv_heads_per_rank

SAMPLER_BYTES_PER_LOGIT = 2 + 4 + 4  # logits in bf16, their fp32 copy, fp32 probabilities


@dataclass(frozen=True)
class ActivationPeak:
    bytes: int
    forward_bytes: int
    sampler_bytes: int
    formula: str


def forward_peak(arch: Architecture, tokens: int, tp: int, act_bytes: int, kinds: set[str]) -> int:
    h = arch.hidden_size
    kv = kv_heads_per_rank(arch, tp) * (arch.head_dim if not arch.uses_mla else 0)
    attention = tokens * (2 * arch.q_width // tp + 2 * kv + arch.attention_output_width // tp)
    if arch.uses_mla:  # the latent and rope key, replicated, beside the per-head q/k/v of the up-projections
        attention += tokens * (arch.kv_lora_rank + arch.qk_rope_head_dim)
    mixers = {hybrid.MIXER[k] for k in kinds}
    ffns = {hybrid.FFN[k] for k in kinds}
    if "attention" not in mixers:
        attention = 0
    if "linear_attention" in mixers:  # in_proj's output, the conv's and the kernel's (q, k, v, z, b, a widths)
        qk = arch.linear_num_key_heads * arch.linear_key_head_dim
        v = arch.linear_num_value_heads * arch.linear_value_head_dim
        attention = max(attention, tokens * (2 * qk + 2 * v + 2 * arch.linear_num_value_heads + 2 * qk + 2 * v) // tp)
    if "mamba" in mixers:  # in_proj's output (z, x, B, C, dt) and the scan's
        d = arch.mamba_num_heads * arch.mamba_head_dim
        attention = max(attention, tokens * (3 * d + 2 * arch.mamba_num_groups * arch.mamba_state_size
                                             + arch.mamba_num_heads) // tp)
    if "mamba1" in mixers:  # in_proj's output (x, z), the conv's, delta and the gated scan output (vLLM mamba_mixer.py)
        attention = max(attention, tokens * 5 * arch.mamba_expand * h // tp)
    mlp = 0
    if "dense" in ffns:
        mlp = tokens * 3 * arch.intermediate_size // tp
    if "moe" in ffns:
        k, width = arch.num_experts_per_token, arch.moe_intermediate_size
        mlp = max(mlp, tokens * k * (3 * width // tp + h))
    return (2 * tokens * h + max(attention, mlp)) * act_bytes


def activation_peak(arch: Architecture, tokens: int, max_num_seqs: int, tp: int, act_bytes: int,
                    kinds: set[str], last_stage: bool) -> ActivationPeak:
    forward = forward_peak(arch, tokens, tp, act_bytes, kinds)
    requests = min(tokens, max_num_seqs)
    sampler = requests * arch.vocab_size * SAMPLER_BYTES_PER_LOGIT + tokens * arch.hidden_size * act_bytes \
        if last_stage else 0
    formula = (f"max(forward of {tokens:,} tokens: residual and input 2 x T x h + widest of attention "
               f"(T x (2q + 2kv + o)/TP) and MLP (T x 3I/TP, MoE T x k x (3I/TP + h)); "
               + (f"sampler of {requests:,} requests: n x V x {SAMPLER_BYTES_PER_LOGIT} B + T x h)"
                  if last_stage else "no sampler on this stage)") + f" x {act_bytes} B")
    return ActivationPeak(max(forward, sampler), forward, sampler, formula)
