"""The registry's entries for hybrid decoders' layers: linear attention (Qwen3-Next's Gated DeltaNet), Mamba-2
blocks (Nemotron-H's pattern, Falcon-H1's parallel mixer) and Mamba-1 layers (Jamba), as the architecture section of
the one field registry (estimator/spec/fields.py) splices them in."""

from __future__ import annotations

from .choices import SSM_KERNELS
from .field import MAX_HEADS, MAX_LAYERS, MAX_WIDTH, Field, _bool, _choice, _int

_M, _HYB = "model", "Hybrid layers"


def _w(name, label, help, group=_HYB, lo=1, hi=MAX_WIDTH, **kw) -> Field:
    return _int(name, _M, label, help, group, lo=lo, hi=hi, **kw)


HYBRID_FIELDS: tuple[Field, ...] = (
    _w("full_attention_interval", "Full attention every N layers", "Linear-attention hybrids (Qwen3-Next): every N-th "
       "layer is softmax attention, the others Gated DeltaNet; 0 = every layer is attention.", _HYB, lo=0,
       hi=MAX_LAYERS),
    _w("linear_num_key_heads", "Linear-attention key heads", "Gated DeltaNet query/key heads.", _HYB, hi=MAX_HEADS,
       optional=True, auto="none: required with linear attention"),
    _w("linear_num_value_heads", "Linear-attention value heads", "Gated DeltaNet value heads (a multiple of the key "
       "heads).", _HYB, hi=MAX_HEADS, optional=True, auto="none: required with linear attention"),
    _w("linear_key_head_dim", "Linear-attention key head dim", "Width of a Gated DeltaNet query/key head.", _HYB,
       optional=True, auto="none: required with linear attention"),
    _w("linear_value_head_dim", "Linear-attention value head dim", "Width of a Gated DeltaNet value head.", _HYB,
       optional=True, auto="none: required with linear attention"),
    _w("linear_conv_kernel_dim", "Linear-attention conv kernel", "Taps of the causal convolution over q, k, v.", _HYB,
       hi=64),
    _bool("attention_output_gate", _M, "Gated attention output", "Qwen3-Next: q_proj also gives a sigmoid gate on the "
          "attention output (twice the query width).", _HYB),
    Field("hybrid_override_pattern", _M, "text", "Hybrid block pattern", "State-space hybrids (Nemotron-H): one "
          "character per layer (block), each one norm and one sublayer: M Mamba-2, * attention, - MLP, E MoE "
          "(Megatron-Core's symbols). Empty: every layer is attention + MLP.", _HYB, optional=True,
          auto="none: no state-space blocks", pattern=r"[M*\-E]+",
          pattern_text="a string of M (Mamba-2), * (attention), - (MLP) and E (MoE), one per layer, at most 200"),
    _w("mamba_num_heads", "Mamba heads", "Mamba-2 heads (H).", _HYB, hi=MAX_HEADS, optional=True,
       auto="none: required with Mamba blocks"),
    _w("mamba_head_dim", "Mamba head dim", "Width of a Mamba-2 head (p); the mixer's inner width is H x p.", _HYB,
       optional=True, auto="none: required with Mamba blocks"),
    _w("mamba_state_size", "SSM state size", "Mamba-2 state size per head and channel (n, HF ssm_state_size).", _HYB,
       optional=True, auto="none: required with Mamba blocks"),
    _w("mamba_num_groups", "Mamba groups", "Groups sharing B and C (g, HF n_groups).", _HYB, hi=MAX_HEADS,
       optional=True, auto="none: required with Mamba blocks"),
    _w("mamba_conv_kernel", "Mamba conv kernel", "Taps of the causal convolution over x, B, C.", _HYB, hi=64),
    _bool("mamba_conv_bias", _M, "Mamba conv bias", "The causal convolution has a bias.", _HYB),
    _w("mamba_chunk_size", "SSM chunk size", "Tokens per chunk of the chunked scan (its temporaries scale with "
       "it).", _HYB, hi=4096),
    _bool("mamba_gated_norm", _M, "Mamba gated norm", "The Mamba-2 mixer normalises its gated output (a gated "
          "RMSNorm of width H x p): always in Nemotron-H, Falcon-H1's mamba_rms_norm.", _HYB),
    _bool("parallel_mamba", _M, "Attention and Mamba-2 in every layer", "Parallel hybrids (Falcon-H1): every layer "
          "runs softmax attention and a Mamba-2 mixer (the mamba_* fields) side by side on one norm's output and adds "
          "them, then an MLP; the attention keeps a KV cache, the mixer a fixed state per sequence.", _HYB),
    _w("attention_layer_period", "Attention every N layers (Mamba-1)", "Mamba-1 hybrids (Jamba): layer i is softmax "
       "attention when i % N equals the offset, a Mamba-1 mixer otherwise; 0 = no Mamba-1 layers.", _HYB, lo=0,
       hi=MAX_LAYERS),
    _w("attention_layer_offset", "Attention layer offset", "Mamba-1 hybrids: the first attention layer's index "
       "(below the period).", _HYB, lo=0, hi=MAX_LAYERS),
    _w("mamba_expand", "Mamba-1 expansion", "Mamba-1 inner width = expansion x hidden size (HF mamba_expand).", _HYB,
       hi=64, optional=True, auto="none: required with Mamba-1 layers"),
    _w("mamba_dt_rank", "Mamba-1 time-step rank", "Rank of the Mamba-1 time-step projection (HF mamba_dt_rank).",
       _HYB, optional=True, auto="none: required with Mamba-1 layers"),
)

# the training section's entry for hybrids, spliced in after TRAINING_FIELDS (estimator/spec/fields.py)
HYBRID_TRAINING_FIELDS: tuple[Field, ...] = (
    _choice("ssm_kernels", "training", "SSM kernels (Mamba, Gated DeltaNet)", "hf, deepspeed, fsdp1, hf_fsdp2 on a model with "
            "Mamba mixers (Falcon-H1, Nemotron-H: Mamba-2; Jamba: Mamba-1) or Gated DeltaNet (Qwen3-Next): fused = "
            "mamba-ssm's, causal-conv1d's and flash-linear-attention's CUDA kernels are installed; torch = they are "
            "not, and transformers (5.18 or later) falls back to its reference PyTorch code (it logs 'falling back "
            "to its reference PyTorch implementation'): a Mamba-2 mixer keeps per-chunk fp32 tensors (segment sums, "
            "G = C B^T, the einsums' copies of B, C and x, the chunk states), 2 to 5 times the activations; a Mamba-1 "
            "mixer's recurrent scan keeps every token's state; a Gated DeltaNet its fp32 per-chunk matrices and "
            "copies of q, k, v (its backward's per-chunk gradients not modelled); torch_5.17 = the same fallback in transformers 5.17 or earlier, whose Mamba-2 scan multiplies "
            "broadcast operands into 6-D fp32 products and, in backward, holds two gradients of the largest at once "
            "(Falcon-H1-0.5B at 2 x 4k: 25.8 GB more; Mamba-1's code is 5.23's).", "Run", SSM_KERNELS),
)
