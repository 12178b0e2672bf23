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
- from 0.15 a routed MoE layer (the modular fused_moe kernels, unquantized or fp8) draws its workspaces from
  the worker's WorkspaceManager (v1/worker/workspace.py, locked after warm-up), which keeps its high-water
  mark: workspace13 = max(T x k x max(I/TP, h), T x h) and workspace2 = T x k x max(2I/TP, h)
  (fused_moe/modular_kernel.py _allocate_buffers, 0.15, 0.17 and 0.33; triton_moe.py TritonExperts.workspace_shapes,
  0.33; 0.19's logs: Qwen3-30B-A3B, Mixtral, DeepSeek-V2-Lite, Qwen1.5-MoE). It stays allocated under the sampler.
  MXFP4's monolithic kernels allocate inside the kernel and keep nothing.
- under expert parallelism (``enable_expert_parallel``) a rank holds whole experts: FusedMoEParallelConfig.make
  gives the MoE layers tp_size 1 (fused_moe/config.py, 0.11 and 0.33), so intermediate_size_per_partition is the
  full I, the kernels' N = w1.size(1) = 2I (modular_kernel.py moe_problem_size, 0.33; fused_moe.py
  fused_experts_impl, 0.11), and the caches and workspaces above take I, not I/TP, over every token's top-k rows
  (without DP the prepare step keeps all T tokens; the expert map masks the other ranks' experts).
- a hybrid model's Gated DeltaNet or Mamba-2 mixer in place of the attention's tensors: its in_proj output
  and the conv's and kernel's outputs (issue 28; modelled like the rest).
- sampler (``_dummy_sampler_run``: one row per request, top-k = V - 1 and top-p = 0.9), by release:
  "sort" (0.11 installed from PyPI, whose wheel makes FlashInfer an extra; 0.15, where FlashInfer is
  opt-in): topk_topp_sampler.py ``apply_top_k_top_p`` sorts the fp32 logits. At the sort, beside the
  bf16 logits and their fp32 copy (sampler.py ``logits.to(torch.float32)``): the sorted values (fp32) and
  indices (int64), PyTorch's index input (SortStable.cu ``segmented_sort_pairs``: int64 per element) and
  cub's alternate key and value buffers (fp32 + int64): 38 bytes per logit; the runner's hidden states
  (T x h) beside them.
  "flashinfer" (0.21 on, FlashInfer's sampler on by default): the bf16 logits, their fp32 copy, and
  FlashInfer's top_k_top_p_sampling_from_logits with a per-request k (no fast path): the top-k masked
  logits (top_k_mask_logits, fp32) and their softmax (fp32), 14 bytes per logit (flashinfer/sampling.py,
  v0.3.1 as 0.11's extra pins it and the current source alike), and T x h.
  "triton" (0.17 to 0.20, ``apply_top_k_top_p_triton`` masks in place): the bf16 and fp32 logits, the fp32
  probabilities and the exponential noise of ``random_sample`` (14 bytes per logit), the kernel's fp32
  buffer of min(next power of 2 of min(SMs, n), SMs) rows of V (topk_topp_triton.py) and the runner's
  hidden states (T x h).
  Every rule also holds the sampled rows and their random copy (``torch.rand_like``), 2 x n x h.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..spec import hybrid
from ..spec.architecture import Architecture
from .kv_cache import kv_heads_per_rank

SAMPLER_BYTES_PER_LOGIT = {
    "flashinfer": 2 + 4 + 4 + 4,  # bf16 and fp32 logits, FlashInfer's masked logits and probabilities (0.21 on)
    "sort": 2 + 4 + (4 + 8) + 8 + (4 + 8),  # + sorted values and indices, index input, cub's alternates
    "triton": 2 + 4 + 4 + 4,  # bf16 and fp32 logits, fp32 probabilities, exponential noise q (0.17 to 0.20)
}
# Streaming multiprocessors (compute units on ROCm) per GPU: topk_topp_triton.py sizes its buffer by
# num_compute_units(). NVIDIA and AMD product specifications.
COMPUTE_UNITS = {"a100-40": 108, "a100-80": 108, "h100-80": 132, "h100-nvl": 132, "h100-pcie": 114, "h800": 132,
                 "h100-96-500w": 132, "h200": 132, "gh200": 132, "b200": 148, "gb200": 148, "b300": 160,
                 "mi300x": 304, "mi325x": 304, "mi355x": 256, "l40s": 142, "l4": 58, "rtx-4090": 128,
                 "rtx-5090": 170, "a10g": 80}


@dataclass(frozen=True)
class ActivationPeak:
    bytes: int
    forward_bytes: int
    sampler_bytes: int
    formula: str


def moe_tp(tp: int, ep: int) -> int:
    """What the routed experts' intermediate width is divided by: TP, or 1 under expert parallelism (each
    rank holds whole experts; vLLM fused_moe/config.py FusedMoEParallelConfig.make, 0.11 and 0.33)."""
    return 1 if ep > 1 else tp


def forward_peak(arch: Architecture, tokens: int, tp: int, act_bytes: int, kinds: set[str], ep: int = 1) -> int:
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
        mlp = max(mlp, tokens * k * (3 * width // moe_tp(tp, ep) + h))
    return (2 * tokens * h + max(attention, mlp)) * act_bytes


def sampler_peak(arch: Architecture, tokens: int, requests: int, act_bytes: int, rule: str, gpu_id: str) -> int:
    """The dummy sampler's peak on the last stage (see the module docstring, by release rule)."""
    logits = requests * arch.vocab_size
    peak = logits * SAMPLER_BYTES_PER_LOGIT[rule] + (tokens + 2 * requests) * arch.hidden_size * act_bytes
    if rule == "triton":
        units = COMPUTE_UNITS[gpu_id]
        rows = min(1 << (min(units, requests) - 1).bit_length(), units)
        peak += rows * arch.vocab_size * 4
    return peak


def moe_workspace_bytes(arch: Architecture, tokens: int, tp: int, act_bytes: int, ep: int = 1) -> int:
    """The persistent fused_moe workspaces (see the module docstring): workspace13 and workspace2."""
    k, inter, h = arch.num_experts_per_token, arch.moe_intermediate_size // moe_tp(tp, ep), arch.hidden_size
    workspace13 = max(tokens * k * max(inter, h), tokens * h)
    workspace2 = tokens * k * max(2 * inter, h)
    return (workspace13 + workspace2) * act_bytes


def activation_peak(arch: Architecture, tokens: int, max_num_seqs: int, tp: int, act_bytes: int,
                    kinds: set[str], last_stage: bool, rule: str = "flashinfer", gpu_id: str = "h100-80",
                    first_stage: bool = True, moe_workspace: bool = False, ep: int = 1) -> ActivationPeak:
    # A later pipeline stage first allocates its receive buffers, the hidden states and the residual for
    # max_num_batched_tokens, and keeps them (gpu_model_runner.py _dummy_run make_empty_intermediate_tensors)
    received = 0 if first_stage else 2 * tokens * arch.hidden_size * act_bytes
    kept = received
    forward = forward_peak(arch, tokens, tp, act_bytes, kinds, ep)
    if moe_workspace and "moe" in {hybrid.FFN[k] for k in kinds}:
        workspace = moe_workspace_bytes(arch, tokens, tp, act_bytes, ep)
        forward = max(forward, (2 * tokens * arch.hidden_size) * act_bytes + workspace)
        kept += workspace
    forward += received
    requests = min(tokens, max_num_seqs)
    sampler = sampler_peak(arch, tokens, requests, act_bytes, rule, gpu_id) + kept if last_stage else 0
    formula = (f"max(forward of {tokens:,} tokens: residual and input 2 x T x h + widest of attention "
               f"(T x (2q + 2kv + o)/TP) and MLP (T x 3I/TP, MoE T x k x (3I{'' if ep > 1 else '/TP'} + h)"
               + (": EP, whole experts per rank" if ep > 1 else "") + "); "
               + (f"{rule} sampler of {requests:,} requests: n x V x {SAMPLER_BYTES_PER_LOGIT[rule]} B + (T + 2n) x h"
                  + (" + kernel buffer)" if rule == "triton" else ")")
                  if last_stage else "no sampler on this stage)") + f" x {act_bytes} B"
               + ("" if first_stage else " + received hidden states and residual 2 x T x h")
               + (" + the kept fused_moe workspaces" if kept > received else ""))
    return ActivationPeak(max(forward, sampler), forward, sampler, formula)
