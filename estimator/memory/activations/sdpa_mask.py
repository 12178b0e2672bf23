"""transformers' SDPA path with an explicit mask: the sliding-window (or chunked) layers from the window on.

Under the transformers frameworks `attention` "flash" is transformers' default attn_implementation, SDPA (the
flash-attn package is not a dependency of transformers). Its mask builder skips the mask, and SDPA then runs its
FlashAttention-2 path with ``is_causal``, only while nothing needs one: for a sliding-window layer not once the keys
reach the window (transformers 5.23 masking_utils.py ``_ignore_causal_mask_sdpa``: ``kv_length >=
local_attention_size`` returns False, so ``sdpa_mask`` builds a 4-D bool mask, b x 1 x s x s). With a mask:
- integrations/sdpa_attention.py ``use_gqa_in_sdpa`` is False on CUDA (it needs ``attention_mask is None``), so
  ``repeat_kv`` copies k and v to every query head, and SDPA keeps those copies, a heads wide, where the unmasked
  call keeps the g grouped heads;
- torch's SDPA converts the bool mask to an additive one of the query's dtype (aten/src/ATen/native/transformers/
  attention.cpp ``convert_boolean_attn_mask``: a new b x 1 x s x s tensor each call, so each layer its own), and
  with a mask the flash kernel is out (sdp_utils.cpp ``check_for_attn_mask`` among the flash constraints). The fused
  kernel that takes it keeps that bias for its backward beside q, k, v, the output and the fp32 log-sum-exp (or
  softmax statistics, b x heads x s), which autograd keeps per layer. Which kernel (`sdpa_backend`): cuDNN's where
  torch puts it first (torch >= 2.10 with a cuDNN above 9.15.0 on sm90/sm100, the torch 2.11 cu130 wheels' 9.19
  included: its backward node keeps q, k, v, attn_bias, the output, the fp32 statistics and the philox seed and
  offset, as autograd recorded them on the H200), else the memory-efficient CUTLASS one (``_scaled_dot_product_efficient_
  attention``: attn_bias, output, log_sumexp); both keep the same bytes (the efficient kernel's log-sum-exp padded
  to 32 queries), so the ledger is one. Measured: the H200's sdpa-mask experiment (tests/data/measured/gpu/
  experiments/sdpa-mask-h200.json, torch 2.11.0+cu130, cuDNN 9.19): every sliding call ran cuDNN and saved this set to
  the byte (beside the two 8-byte philox scalars, on the device under cuDNN: 2 x 512 B a layer, left out); with
  cuDNN disabled (its gemma-3-nocudnn sub-run) the memory-efficient kernel saved it to the byte too (its seed and
  offset on the host), and the unmasked control, FlashAttention-2, the grouped set beside 24 B of RNG state.
Gemma 2 and gpt-oss are not on this path: soft-capping and attention sinks keep them off SDPA (modeling_gemma2.py
and modeling_gpt_oss.py ``_supports_sdpa = False``), so their "flash" is flash-attn's, which slides without a mask.
Mistral's sliding window (every layer, modeling_mistral.py ``create_sliding_window_causal_mask``) is, and so are
Llama 4's chunked layers from the chunk on (``create_chunked_causal_mask`` hands ``sdpa_mask`` the chunk as its
``local_size``; flash_attention_2 refuses a chunked mask, so SDPA is the path there). Measured: the
H200's gemma-3-4b-...-s2048-b2-i4x896 record (tests/data/measured/gpu; 29 sliding layers at 2,048 tokens past the
1,024-token window: 928 MiB of the 1,025 MiB it holds over the flash-attn record). The shared bool mask (b x s^2
bytes, made once a step) is left out. Under full recompute the extra tensors exist in the one layer recomputed at a
time (its twin at s4096 shows no gap: its peaks, the loss's backward and the optimizer step, come before or after).
The kernels' own buffers for the length of a call are not in the ledger (a layer's backward, with its dQ, dK and dV,
is never the step's peak beside the loss's moment in the records): cuDNN's (`cudnn_backward_workspace`, CUDNN_SOURCE)
held to the H200's experiment to the byte, and the memory-efficient kernel's (`backward_workspace`,
`forward_accumulator`, KERNEL_SOURCE), for the stacks that run it by default (`sdpa_backend`: torch 2.11 on an A100,
or with a cuDNN up to 9.15.0 as the CUDA 12 wheels ship, or torch up to 2.8), to the byte too over its five shapes
with cuDNN disabled (the k65536 and k128 backward variants).
transformers' Falcon hands SDPA its 4-D mask at every layer (`Architecture.sdpa_mask_always`; modeling_falcon.py
lines 755-761): with equal head counts (the new decoder architecture's k and v copied out to every query head, or
no multi-query) every layer takes this path (share 1; its k and v are already a heads wide, FALCON_FLASH_SOURCE),
keeping the bf16 bias SDPA makes of the bool mask (FALCON_BIAS), or with ALiBi the model's one float mask, passed
through, which alibi.py counts once; with unequal ones SDPA's math backend runs (sdpa_math.py).
"""

from __future__ import annotations

from typing import NamedTuple

from ...spec.architecture import Architecture
from ...spec.dtypes import bytes_per_element
from ...spec.parallel import Parallel
from ...spec.training import Training
from ...spec.versions import torch_release
from .entries import CORE, UP_PROJ, Entry, tokens_per_gpu
from .sdpa_math import falcon_math_sdpa, transformers_runs_sdpa

SOURCE = ("transformers 5.23 masking_utils.py _ignore_causal_mask_sdpa and sdpa_mask, integrations/sdpa_attention.py "
          "use_gqa_in_sdpa and repeat_kv; torch 2.13 aten/src/ATen/native/transformers attention.cpp "
          "convert_boolean_attn_mask, sdp_utils.cpp (a mask rules out flash; cuDNN first on sm90/sm100 from 2.10 with "
          "cuDNN > 9.15.0), derivatives.yaml _scaled_dot_product_efficient_attention (the bias kept for backward; "
          "cuDNN's node keeps the same, measured); measured: tests/data/measured/gpu/gemma-3-4b-* and "
          "tests/data/measured/gpu/experiments/sdpa-mask-h200.json (cuDNN, the saved set to the byte)")

MASKED_BIAS = "local-attention mask as SDPA's additive bias (kept by its cuDNN or memory-efficient kernel)"
FALCON_BIAS = ("causal mask as SDPA's additive bias (Falcon hands SDPA its 4-D mask; kept by its cuDNN or "
               "memory-efficient kernel)")


def masked_layer_share(arch: Architecture, training: Training) -> float:
    """The share of the layers transformers runs through SDPA with a 4-D mask: the sliding-window or chunked layers
    once the sequence reaches the window or chunk, under the transformers frameworks' SDPA; 0 elsewhere."""
    window = arch.local_attention
    transformers_sdpa = transformers_runs_sdpa(training)
    if arch.sdpa_mask_always and transformers_sdpa and training.mode == "training":
        # Falcon's mask at every layer (sdpa_math.py); with unequal head counts the math backend keeps none of it
        return 0.0 if falcon_math_sdpa(arch, training) else 1.0
    if (not transformers_sdpa or training.mode != "training" or not window or training.seq_len < window
            or arch.attention_logit_softcapping or arch.attention_sinks or arch.uses_mla or arch.uses_sparse_attention
            or arch.is_hybrid):
        return 0.0
    return 1 - arch.global_attention_layers_in(0, arch.num_layers) / arch.num_layers


def masked_sdpa_entries(arch: Architecture, training: Training, par: Parallel) -> list[Entry]:
    """What a masked SDPA call keeps beyond the unmasked one (the module docstring), averaged over the layers like
    every ledger entry (exact for the model: Gemma 3 4B's 29 sliding layers of 34 weigh 29/34)."""
    share = masked_layer_share(arch, training)
    if not share:
        return []
    B = bytes_per_element(training.compute_dtype)
    T = tokens_per_gpu(training, par)
    note = "" if share == 1 else f" x {share:.4g} (the {'chunked' if arch.attention_chunk_size else 'sliding'} layers)"
    out = []
    if arch.num_kv_heads != arch.num_attention_heads and not arch.qkv_split_expands_kv:  # Falcon's: copies already
        out.append(Entry("k and v repeated to every query head (a mask turns off SDPA's GQA), beyond the grouped",
                         share * T * 2 * (arch.num_attention_heads - arch.num_kv_heads) * arch.head_dim, B, "tp",
                         "B*s*b*2*(a - g)*d_head" + note, recompute=UP_PROJ))
    if arch.sdpa_mask_always and arch.position_embedding == "alibi":
        return out  # a float mask, passed through (no per-call bias): the one kept a step is alibi.py's
    out.append(Entry(FALCON_BIAS if arch.sdpa_mask_always else MASKED_BIAS,
                     share * training.micro_batch_size * training.seq_len ** 2, B, "none", "B*b*s^2" + note,
                     recompute=CORE, split_by_cp=False))
    return out


# --- which kernel torch's SDPA runs (a CUDA device, 16-bit q, k, v, training) --------------------------------------

DISPATCH_SOURCE = (
    "torch aten/src/ATen/native/transformers/cuda/sdp_utils.cpp (the stored main, 001f694a): priority_order and "
    "check_prefer_cudnn_attention (cuDNN, flash, efficient, math where it holds; else the default flash, efficient, "
    "math, cuDNN), can_use_cudnn_attention (check_attn_mask_shape: a mask is taken; check_cudnn_tensor_shapes: head "
    "dim <= 128, 256 on sm90/sm100), can_use_flash_attention (check_for_attn_mask), can_use_mem_efficient_attention; "
    "sdp_utils_cpp.h check_batch_size_and_num_heads_dense (unequal head counts need enable_gqa; not the efficient "
    "kernel's in torch 2.11, pytorch/pytorch#191085 later). History: cuDNN opt-in from 2.5.1 (pytorch/pytorch#138522), "
    "first on sm90 and sm100 for 2.9 (#162073, by its title: its code not read here), the gate on a runtime cuDNN above "
    "9.15.0 in 2.10 (sdp_utils.cpp at 70d99e99, as huggingface/transformers#48163 reads it; the comment there names "
    "#169849: the CUDA 12 wheels' older cuDNN), sm103 beside sm100 (#170800); head dim 256 on sm90 from cuDNN 9.5.1 "
    "(#149904), the backward not on sm100 (#152076); the stored main later asks cuDNN above 9.22 for head dim 256, "
    "which the H200's 9.19 run contradicts for 2.11. Measured: tests/data/measured/gpu/experiments/sdpa-mask-h200.json "
    "(torch 2.11.0+cu130, cuDNN 9.19, sm90: cuDNN for the masked and the enable_gqa calls at head dims 128 and 256, "
    "math for Falcon-7B's 71 heads on one without enable_gqa)")
CUDNN_FIRST_FROM = (2, 9)  # pytorch/pytorch#162073
CUDNN_VERSION_GATE_FROM = (2, 10)  # cuDNN > 9.15.0 (#169849)
CUDNN_D256_FROM = 90501  # cuDNN 9.5.1 (#149904)


def cudnn_first(torch_version: str | None, capability: tuple[int, int], cudnn_version: int) -> bool:
    """check_prefer_cudnn_attention: whether torch tries cuDNN's attention before flash (DISPATCH_SOURCE). sm90 (H100,
    H200), sm100 and (from 2.10) sm103; no environment override (TORCH_CUDNN_SDPA_DEPRIORITIZED) assumed."""
    release = torch_release(torch_version)
    if release < CUDNN_FIRST_FROM:
        return False
    if release < CUDNN_VERSION_GATE_FROM:
        return capability in ((9, 0), (10, 0))
    return cudnn_version > 91500 and capability in ((9, 0), (10, 0), (10, 3))


def sdpa_backend(torch_version: str | None, capability: tuple[int, int], cudnn_version: int, *, masked: bool,
                 head_dim: int, q_heads: int, kv_heads: int, enable_gqa: bool, cudnn: bool = True) -> str:
    """The backend ("cudnn", "flash", "efficient" or "math") select_sdp_backend picks for a 16-bit training call on
    the device: the first of the priority order whose constraints hold (DISPATCH_SOURCE; the shapes' limits beyond
    these, and sm86/sm89's flash backward above head dim 192, left out). `cudnn` False: cuDNN's attention disabled
    (torch.backends.cuda.enable_cudnn_sdp(False), or sdpa_kernel without it; check_runtime_disabled_cudnn)."""
    grouped = q_heads != kv_heads
    heads_ok = not grouped or (enable_gqa and q_heads % kv_heads == 0)
    # head dim 256 with a backward on sm90 only (sm100's backward stays at 128 in training: #152076)
    d_limit = 256 if capability == (9, 0) and cudnn_version >= CUDNN_D256_FROM else 128
    usable = {
        "cudnn": cudnn and (8, 0) <= capability <= (12, 1) and heads_ok and head_dim % 8 == 0 and head_dim <= d_limit,
        "flash": (8, 0) <= capability <= (12, 1) and not masked and heads_ok and head_dim <= 256,
        "efficient": not grouped and head_dim % 8 == 0,
        "math": True,
    }
    order = (("cudnn", "flash", "efficient", "math") if cudnn_first(torch_version, capability, cudnn_version)
             else ("flash", "efficient", "math", "cudnn"))
    return next(b for b in order if usable[b])


# --- cuDNN's own buffers for a call ------------------------------------------------------------------------------

CUDNN_SOURCE = (
    "torch aten/src/ATen/native/cudnn/MHA.cpp run_cudnn_SDP_fprop/bprop (o, the fp32 softmax statistics b x h x s x 1 "
    "and the philox seed and offset made in the forward; dq, dk, dv then one workspace of the graph's "
    "get_workspace_size in the backward, freed as it returns); NVIDIA/cudnn-frontend include/cudnn_frontend/node/"
    "scaled_dot_product_flash_attention.h CompositeSDPABackwardNode (expand_node: dQ_accum b x h_q x s_q x d fp32 and "
    "softmax_sum b x h_q x s_q fp32 sized in get_fe_workspace_size_node; for fewer KV heads dK_fullhead and "
    "dV_fullhead b x h_q x s_kv x d in q's dtype, virtual, reduced over each group: the engine's workspace); measured "
    "to the byte over 18 Gemma 3 shapes: tests/data/measured/gpu/experiments/sdpa-mask-h200.json")
CUDNN_ENGINE_BYTES = 256  # the engine's own workspace beyond the tensors, measured in every forward and backward


def cudnn_backward_workspace(batch: int, q_heads: int, kv_heads: int, seq: int, head_dim: int,
                             dtype_bytes: int = 2) -> int:
    """The one workspace run_cudnn_SDP_bprop allocates after dQ, dK, dV (CUDNN_SOURCE): the fp32 dQ accumulator and
    softmax sum, for fewer KV heads than query heads dK and dV at every query head (16-bit), and the engine's 256 B.
    The same bytes as the FlashAttention-2 backward's dq_accum, softmax_d and expanded dK, dV where the sequence is a
    multiple of 128 and the head dim of 32 (validation/core/emulation.py)."""
    per_q_head = batch * q_heads * seq
    fullhead = 2 * per_q_head * head_dim * dtype_bytes if kv_heads != q_heads else 0
    return per_q_head * head_dim * 4 + per_q_head * 4 + fullhead + CUDNN_ENGINE_BYTES


# --- the memory-efficient kernel's own buffers (not in the layer's ledger: what it allocates inside the call) -------
# Reached where cuDNN is not first (`sdpa_backend`): torch 2.11 on an A100 (sm80), on sm90 with a cuDNN up to 9.15.0,
# torch up to 2.8; measured on the H200 with cuDNN disabled (sdpa-mask-h200.json's gemma-3-nocudnn sub-run: the
# forward's accumulator and the backward's workspace are these functions' to the byte at d 256 and 128)

KERNEL_SOURCE = ("torch 2.13 aten/src/ATen/native/transformers/cuda/mem_eff_attention/kernels/cutlassB.h "
                 "dispatch_cutlassB_bf16_sm80 (the order), kernel_backward.h (kOutputInRF, kNeedsAccumGradQ/K/V, "
                 "workspace_elements_gk/gv/gq, workspace_size), cuda/attention_backward.cu _efficient_attention_"
                 "backward (grad_q, grad_k, grad_v, delta, the workspace; the split-keys heuristic), kernel_forward.h "
                 "kNeedsOutputAccumulatorBuffer and cuda/attention.cu (the fp32 output accumulator); measured to the "
                 "byte: tests/data/measured/gpu/experiments/sdpa-mask-h200.json, gemma-3-nocudnn")


class BackwardKernel(NamedTuple):
    """One bf16 sm80 backward kernel of the memory-efficient attention (the H100 and H200 run the sm80 ones)."""

    block_i: int  # queries a block
    block_j: int  # keys a block
    max_k: int  # the largest head dim it takes
    seq_aligned: bool  # only where the queries and keys are multiples of the blocks

    @property
    def name(self) -> str:
        return (f"fmha_cutlassB_bf16_aligned_{self.block_i}x{self.block_j}_k{self.max_k}"
                f"{'_seqaligned' if self.seq_aligned else ''}_sm80")

    @property
    def output_in_registers(self) -> bool:
        """kOutputInRF: a 16-bit kernel keeps dK and dV in registers where kMaxK <= kBlockSizeI."""
        return self.max_k <= self.block_i


# dispatch_cutlassB_bf16_sm80 without dropout, in its order (the 128 x 64 k96 kernel only on sm86 and sm89); the
# first whose kMaxK and alignment fit and whose shared memory the device allows runs
BACKWARD_KERNELS = tuple(BackwardKernel(*k) for k in (
    (64, 64, 32, True), (64, 64, 32, False), (64, 64, 64, True), (64, 64, 64, False), (128, 128, 128, True),
    (128, 128, 128, False), (64, 64, 128, True), (64, 64, 128, False), (128, 64, 65536, False),
    (64, 64, 65536, False)))


def backward_kernel(seq: int, head_dim: int) -> BackwardKernel:
    """The first kernel of the dispatch order for this head dim and sequence (shared memory not checked: the H100's
    and H200's 227 KiB a block are assumed to hold it)."""
    return next(k for k in BACKWARD_KERNELS if k.max_k >= head_dim
                and (not k.seq_aligned or (seq % k.block_i == 0 and seq % k.block_j == 0)))


def backward_workspace(kernel: BackwardKernel, batch: int, heads: int, seq: int, head_dim: int) -> int:
    """The fp32 workspace _efficient_attention_backward allocates for the kernel (workspace_size): per batch and head,
    dQ's accumulation tiles (each block of queries x block_j columns of d, with a 16-byte lock) and, where dK and dV
    do not fit the registers, their staging per key split. The key splits (attention_backward.cu's heuristic): one
    per key block; one where b x heads already fill 256 blocks and the keys are at most two blocks; at most
    200 / (b x heads) when dK and dV are staged."""
    splits = -(-seq // kernel.block_j)
    staged = not kernel.output_in_registers
    if batch * heads >= 256 and seq <= 2 * kernel.block_j:
        splits = 1
    if staged:
        splits = min(splits, 200 // (batch * heads))
    splits = max(splits, 1)
    d_padded = -(-head_dim // kernel.block_i) * kernel.block_i
    gk = gv = splits * kernel.block_j * d_padded if staged else 0
    gq = -(-seq // kernel.block_i) * -(-head_dim // kernel.block_j) * (4 + kernel.block_i * kernel.block_j)
    stride = -(-(gk + gv + gq) // 4) * 4
    return batch * heads * stride * 4


def forward_accumulator(batch: int, heads: int, seq: int, head_dim: int) -> int:
    """The fp32 output accumulator of the forward kernel: its bf16 sm80 kernels keep the output in registers up to
    a head dim of 128 (64 x 64 and 64 x 128 'rf'); above, the 32 x 128 'gmem' kernel accumulates in a b x s x heads
    x d fp32 buffer for the call."""
    return batch * seq * heads * head_dim * 4 if head_dim > 128 else 0
