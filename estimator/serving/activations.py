"""The torch activation peak of vLLM's profiling run (a model, not a measurement).

`profile_run` (v1/worker/gpu_model_runner.py, 0.11 and 0.33) runs one forward pass over
``max_num_batched_tokens`` dummy tokens split into min(tokens, max_num_seqs) requests, then, on the last
pipeline stage, the LM head and the sampler over one row per request. The increase of
``torch.cuda.max_memory_allocated`` during it is taken from the budget. Without a GPU we model it from
the tensors that source allocates (vLLM's own figure needs a GPU; the record says so):

- forward, in the widest layer: the residual stream and the layer's input (2 x T x h), with either
  the attention's q, k, v and output (T x (q + 2 kv + q)/TP) or the MLP's gate-up output and its
  activation (T x 3 x I/TP); a routed MoE layer's fused_moe caches hold T x top-k rows of 2I/TP and
  I/TP and one of h (fused_moe.py intermediate_cache1..3). That is the eager forward (--enforce-eager).
- the compiled forward (the default: VLLM_COMPILE, its graph split at the attention ops; compilation/backends.py
  split_graph, 0.19.0, splitting_ops of config/compilation.py, 0.11.0 and 0.19.0): Attention.forward allocates
  its output buffer (T x o/TP: torch.empty in 0.19.0 and 0.33.0, torch.zeros in 0.11.0; inductor graph
  partition stays off by default in 0.33.0's optimization levels) in the piece
  before the attention op, which fills it, and the next piece's o_proj reads it; the split module passes it as
  an argument, so it stays allocated through that piece, whose MLP is the peak. With it there: the incoming
  residual (an argument too), the o_proj output (inductor keeps it and recomputes the new residual from it and
  the incoming one in the second fused add-RMSNorm kernel), the gate-up output and the SiLU-and-mul output:
  T x (o/TP + 2h + 3I/TP), read from inductor's generated code for that piece (a Llama piece written with
  vLLM 0.19's native RMSNorm, SiluAndMul and rotary ops, compiled by torch 2.13's inductor). Beside it the
  autotuner's L2 flush buffer, from 0.19 (serving/profile_buffers.py).
- every stage, under the forward and the sampler alike: the cuBLAS workspace of the run's first GEMM
  (serving/profile_buffers.py).
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
  (T x h) beside them. On CUDA, from 128 rows, each tensor in the caching allocator's block
  (serving/sort_sampler.py: 3 MiB more for 1,024 rows of Qwen3's or gpt-oss's vocabulary).
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
from . import sort_sampler
from .kv_cache import kv_heads_per_rank

MiB = 1024**2

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
    blas_bytes: int = 0  # of `bytes`: the cuBLAS workspace (profile_buffers.py)
    flush_bytes: int = 0  # of `bytes`: the autotuner's L2 flush buffer, where the compiled MLP sets the peak


def moe_tp(tp: int, ep: int) -> int:
    """What the routed experts' intermediate width is divided by: TP, or 1 under expert parallelism (each
    rank holds whole experts; vLLM fused_moe/config.py FusedMoEParallelConfig.make, 0.11 and 0.33)."""
    return 1 if ep > 1 else tp


def forward_peak(arch: Architecture, tokens: int, tp: int, act_bytes: int, kinds: set[str], ep: int = 1,
                 compiled: bool = False, flush_bytes: int = 0) -> int:
    """The widest layer's live tensors (module docstring). `compiled`: the forward runs as inductor-compiled
    pieces split at the attention ops, which holds the attention's output buffer through the next piece's
    MLP; `flush_bytes`: the autotuner's L2 flush buffer beside that MLP (serving/profile_buffers.py)."""
    h = arch.hidden_size
    kv = kv_heads_per_rank(arch, tp) * (arch.head_dim if not arch.uses_mla else 0)
    attention = tokens * (2 * arch.q_width // tp + 2 * kv + arch.attention_output_width // tp)
    if arch.uses_mla:  # the latent and rope key, replicated, beside the per-head q/k/v of the up-projections
        attention += tokens * (arch.kv_lora_rank + arch.qk_rope_head_dim)
    mixers = {hybrid.MIXER[k] for k in kinds}
    # Falcon-H1 (vLLM falcon_h1.py FalconH1ParallelHybrid.forward): attention, then the Mamba-2 mixer on the norm's
    # output x ssm_in_multiplier while the attention's output waits to be added: two h-wide tensors more
    parallel = tokens * 2 * h if "attention_mamba" in mixers else 0
    if parallel:
        mixers |= {"attention", "mamba"}
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
    dense = mlp = 0
    if "dense" in ffns:
        dense = tokens * 3 * arch.intermediate_size // tp
        if compiled and "attention" in mixers:
            dense += tokens * arch.attention_output_width // tp  # the attention's output, held (see below)
        mlp = dense
    if "moe" in ffns:
        k, width = arch.num_experts_per_token, arch.moe_intermediate_size
        mlp = max(mlp, tokens * k * (3 * width // moe_tp(tp, ep) + h))
    peak = (2 * tokens * h + max(attention + parallel, mlp)) * act_bytes
    if dense and flush_bytes:
        peak = max(peak, (2 * tokens * h + dense) * act_bytes + flush_bytes)
    return peak


def sampler_peak(arch: Architecture, tokens: int, requests: int, act_bytes: int, rule: str, gpu_id: str) -> int:
    """The dummy sampler's peak on the last stage (see the module docstring, by release rule); the sort
    sampler's tensors in the caching allocator's blocks where PyTorch's segmented sort is replayed."""
    if rule == "sort" and sort_sampler.replayable(requests, arch.vocab_size, gpu_id):
        return sort_sampler.peak(tokens, requests, arch.vocab_size, arch.hidden_size, act_bytes)
    logits = requests * arch.vocab_size
    peak = logits * SAMPLER_BYTES_PER_LOGIT[rule] + (tokens + 2 * requests) * arch.hidden_size * act_bytes
    if rule == "triton":
        units = COMPUTE_UNITS[gpu_id]
        rows = min(1 << (min(units, requests) - 1).bit_length(), units)
        peak += rows * arch.vocab_size * 4
    return peak


def _sampler_formula(arch: Architecture, rule: str, requests: int, gpu_id: str) -> str:
    formula = f"{rule} sampler of {requests:,} requests: n x V x {SAMPLER_BYTES_PER_LOGIT[rule]} B + (T + 2n) x h"
    if rule == "triton":
        return formula + " + kernel buffer)"
    if rule == "sort" and sort_sampler.replayable(requests, arch.vocab_size, gpu_id):
        return formula + ", each tensor in its allocator block)"
    if rule == "sort":
        return formula + ", the segmented sort's bytes: this sort path is not replayed)"
    return formula + ")"


def moe_workspace_bytes(arch: Architecture, tokens: int, tp: int, act_bytes: int, ep: int = 1) -> int:
    """The persistent fused_moe workspaces (see the module docstring): workspace13 and workspace2."""
    k, inter, h = arch.num_experts_per_token, arch.moe_intermediate_size // moe_tp(tp, ep), arch.hidden_size
    workspace13 = max(tokens * k * max(inter, h), tokens * h)
    workspace2 = tokens * k * max(2 * inter, h)
    return (workspace13 + workspace2) * act_bytes


def activation_peak(arch: Architecture, tokens: int, max_num_seqs: int, tp: int, act_bytes: int,
                    kinds: set[str], last_stage: bool, rule: str = "flashinfer", gpu_id: str = "h100-80",
                    first_stage: bool = True, moe_workspace: bool = False, ep: int = 1, compiled: bool = False,
                    flush_bytes: int | None = 0, blas_bytes: int = 0) -> ActivationPeak:
    # A later pipeline stage first allocates its receive buffers, the hidden states and the residual for
    # max_num_batched_tokens, and keeps them (gpu_model_runner.py _dummy_run make_empty_intermediate_tensors)
    received = 0 if first_stage else 2 * tokens * arch.hidden_size * act_bytes
    kept = received + blas_bytes  # the cuBLAS workspace stays from the first GEMM on (profile_buffers.py)
    forward = forward_peak(arch, tokens, tp, act_bytes, kinds, ep, compiled, flush_bytes or 0)
    flush_held = forward - forward_peak(arch, tokens, tp, act_bytes, kinds, ep, compiled)
    if moe_workspace and "moe" in {hybrid.FFN[k] for k in kinds}:
        workspace = moe_workspace_bytes(arch, tokens, tp, act_bytes, ep)
        if (2 * tokens * arch.hidden_size) * act_bytes + workspace >= forward:
            forward, flush_held = (2 * tokens * arch.hidden_size) * act_bytes + workspace, 0
        kept += workspace
    forward += received + blas_bytes
    requests = min(tokens, max_num_seqs)
    sampler = sampler_peak(arch, tokens, requests, act_bytes, rule, gpu_id) + kept if last_stage else 0
    dense_mlp = "T x (3I + o)/TP: compiled, the attention's output held" if compiled else "T x 3I/TP"
    dense_ffn = "dense" in {hybrid.FFN[k] for k in kinds}
    formula = (f"max(forward of {tokens:,} tokens: residual and input 2 x T x h + widest of attention "
               f"(T x (2q + 2kv + o)/TP) and MLP ({dense_mlp}, MoE T x k x (3I{'' if ep > 1 else '/TP'} + h)"
               + (": EP, whole experts per rank" if ep > 1 else "") + "); "
               + (_sampler_formula(arch, rule, requests, gpu_id) if last_stage else "no sampler on this stage)")
               + f" x {act_bytes} B"
               + ("" if first_stage else " + received hidden states and residual 2 x T x h")
               + (" + the kept fused_moe workspaces" if kept > received + blas_bytes else "")
               + (f" + cuBLAS workspace {blas_bytes / MiB:g} MiB" if blas_bytes else "")
               + (f"; the MLP's autotune L2 flush buffer {flush_bytes / MiB:g} MiB beside it"
                  if flush_bytes and dense_ffn else "")
               + ("; the autotuner's L2 flush buffer is not modelled on this GPU"
                  if flush_bytes is None and dense_ffn and compiled else ""))
    return ActivationPeak(max(forward, sampler), forward, sampler, formula, blas_bytes,
                          flush_held if forward >= sampler else 0)
