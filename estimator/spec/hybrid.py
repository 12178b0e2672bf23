"""Hybrid models (issue 28): layers whose token mixer is not softmax attention.

Two layouts, as the frameworks build them:

- Linear-attention hybrids (Qwen3-Next; transformers 5.23 `Qwen3NextDecoderLayer`, Megatron-Core
  0.16's GPT layer with `experimental_attention_variant="gated_delta_net"`): decoder layers of a token
  mixer and an MLP or MoE with two norms, the mixer a Gated DeltaNet except every
  `full_attention_interval`-th layer (layer i when (i + 1) % interval == 0: HF `layer_types`,
  Megatron `linear_attention_freq`), which is softmax attention.
- State-space hybrids (Nemotron-H; transformers `NemotronHBlock`, Megatron-Core `MambaStack`): blocks
  of one norm and one sublayer each, named by `hybrid_override_pattern`, one character per block in
  Megatron-Core's alphabet (ssm/mamba_hybrid_layer_allocation.py `Symbols`): M a Mamba-2 mixer,
  * attention, - an MLP, E a MoE.

- Mamba-1 hybrids (Jamba; transformers 5.23 `JambaAttentionDecoderLayer` / `JambaMambaDecoderLayer`): decoder
  layers of a token mixer and an MLP or MoE with two norms, the mixer a Mamba-1 selective scan except where
  i % `attention_layer_period` == `attention_layer_offset` (HF attn_layer_period / attn_layer_offset), which is
  softmax attention without positions; MoE where i % expert_layer_period == expert_layer_offset (here
  first_dense_layers = the offset, moe_layer_frequency = the period: the same layers).

- Parallel hybrids (Falcon-H1; transformers 5.23 `FalconH1DecoderLayer`): every decoder layer runs softmax
  attention and a Mamba-2 mixer side by side on the output of one norm and adds their outputs (each scaled by a
  muP multiplier, which changes no shape), then a second norm and a gated MLP (`parallel_mamba`).

Layer kinds (`Architecture.kind_counts`): "dense" and "moe" stay the attention + MLP / MoE layers;
"linear_dense" and "linear_moe" are the linear-attention layers, "mamba1_dense" and "mamba1_moe" the Mamba-1 ones; "mamba", "attention", "mlp" and
"moe_block" the blocks of a pattern; "attention_mamba" a parallel hybrid's layer (both mixers, an MLP).
"""

from __future__ import annotations

from .errors import ConfigError
from .tensors import COLUMN, REPLICATED, ROW, ParameterTensor

LINEAR_DENSE, LINEAR_MOE = "linear_dense", "linear_moe"
MAMBA1_DENSE, MAMBA1_MOE = "mamba1_dense", "mamba1_moe"
MAMBA, ATTENTION_BLOCK, MLP_BLOCK, MOE_BLOCK = "mamba", "attention", "mlp", "moe_block"
PARALLEL_DENSE = "attention_mamba"
BLOCK_OF_SYMBOL = {"M": MAMBA, "*": ATTENTION_BLOCK, "-": MLP_BLOCK, "E": MOE_BLOCK}
PATTERN_TEXT = "one character per block: M (Mamba-2), * (attention), - (MLP), E (MoE)"

# What each kind holds: its token mixer and its feed-forward part (None: it has none)
MIXER = {"dense": "attention", "moe": "attention", LINEAR_DENSE: "linear_attention", LINEAR_MOE: "linear_attention",
         MAMBA: "mamba", ATTENTION_BLOCK: "attention", MLP_BLOCK: None, MOE_BLOCK: None,
         MAMBA1_DENSE: "mamba1", MAMBA1_MOE: "mamba1", PARALLEL_DENSE: "attention_mamba"}
FFN = {"dense": "dense", "moe": "moe", LINEAR_DENSE: "dense", LINEAR_MOE: "moe",
       MAMBA: None, ATTENTION_BLOCK: None, MLP_BLOCK: "dense", MOE_BLOCK: "moe", MAMBA1_DENSE: "dense",
       MAMBA1_MOE: "moe", PARALLEL_DENSE: "dense"}


HYBRID_KINDS = (LINEAR_DENSE, LINEAR_MOE, MAMBA, ATTENTION_BLOCK, MLP_BLOCK, MOE_BLOCK, MAMBA1_DENSE, MAMBA1_MOE,
                PARALLEL_DENSE)
RECURRENT_MIXERS = ("linear_attention", "mamba", "mamba1", "attention_mamba")
ATTENDING_MIXERS = ("attention", "attention_mamba")  # the mixers that keep a key and a value per token


def attention_residue(arch) -> tuple[int, int] | None:
    """(residue, modulus) of a decoder-layer hybrid's attention layers (layer i attends when i % modulus ==
    residue): Qwen3-Next's (interval - 1, interval), Jamba's (offset, period); None when every layer attends."""
    if arch.attention_layer_period:
        return arch.attention_layer_offset, arch.attention_layer_period
    if arch.full_attention_interval > 1:
        return arch.full_attention_interval - 1, arch.full_attention_interval
    return None


def recurrent_kinds(arch) -> tuple[str, str]:
    """The (dense, MoE) kinds of a decoder-layer hybrid's layers that do not attend."""
    return (MAMBA1_DENSE, MAMBA1_MOE) if arch.attention_layer_period else (LINEAR_DENSE, LINEAR_MOE)


def check_mamba1(arch) -> None:
    """Jamba's fields: an offset inside the period, the Mamba-1 widths."""
    if not 0 <= arch.attention_layer_offset < arch.attention_layer_period:
        raise ConfigError("model.attention_layer_offset", arch.attention_layer_offset,
                          f"0 to attention_layer_period - 1 ({arch.attention_layer_period - 1})",
                          related=("model.attention_layer_period",))
    for name in ("mamba_expand", "mamba_state_size", "mamba_dt_rank"):
        if getattr(arch, name) is None:
            raise ConfigError(f"model.{name}", None, "a positive integer: required with Mamba-1 layers "
                              "(attention_layer_period > 0)", related=("model.attention_layer_period",))


def check_parallel(arch) -> None:
    """Falcon-H1's fields: no other hybrid layout, the Mamba-2 widths, no experts (its layers are dense)."""
    if arch.hybrid_override_pattern is not None or arch.full_attention_interval or arch.attention_layer_period:
        raise ConfigError("model.parallel_mamba", True, "false with a hybrid_override_pattern, a full_attention_interval "
                          "or an attention_layer_period", "a model has one kind of recurrent layer here")
    for name in ("mamba_num_heads", "mamba_head_dim", "mamba_state_size", "mamba_num_groups"):
        if getattr(arch, name) is None:
            raise ConfigError(f"model.{name}", None, "a positive integer: required with parallel_mamba",
                              related=("model.parallel_mamba",))
    if arch.mamba_num_heads % arch.mamba_num_groups:
        raise ConfigError("model.mamba_num_groups", arch.mamba_num_groups,
                          f"a divisor of mamba_num_heads ({arch.mamba_num_heads})", related=("model.mamba_num_heads",))
    if arch.num_experts:
        raise ConfigError("model.num_experts", arch.num_experts, "0 with parallel_mamba",
                          "Falcon-H1's layers have one MLP: experts in a parallel hybrid are not modelled",
                          related=("model.parallel_mamba",))


def attends(kind: str) -> bool:
    """A kind whose layers keep a key and a value per token (a parallel hybrid's layer too)."""
    return MIXER[kind] in ATTENDING_MIXERS


def is_block(kind: str) -> bool:
    """A block of a hybrid_override_pattern: one norm, one sublayer."""
    return kind in (MAMBA, ATTENTION_BLOCK, MLP_BLOCK, MOE_BLOCK)


def recurrent(kind: str) -> bool:
    """A kind whose token mixer keeps a fixed-size state per sequence, not a key and value per token."""
    return MIXER[kind] in RECURRENT_MIXERS


def pattern_counts(pattern: str, start: int, stop: int) -> tuple[tuple[str, int], ...]:
    """(kind, blocks) among blocks start .. stop - 1 of a pattern, kinds sorted, each present."""
    part = pattern[start:stop]
    counts = {kind: part.count(symbol) for symbol, kind in BLOCK_OF_SYMBOL.items()}
    return tuple(sorted((kind, n) for kind, n in counts.items() if n))


# --- weights -------------------------------------------------------------------------------------


def gated_delta_net_tensors(h: int, key_heads: int, value_heads: int, key_dim: int, value_dim: int,
                            kernel: int) -> list[ParameterTensor]:
    """A Gated DeltaNet mixer (transformers 5.23 Qwen3NextGatedDeltaNet.__init__): in_proj_qkvz
    (2 Hk K + 2 Hv V, h) and in_proj_ba (2 Hv, h), a depthwise conv over q, k, v (2 Hk K + Hv V
    channels of `kernel` taps, no bias), dt_bias and A_log per value head, a gated RMSNorm of width V
    shared by the heads, out_proj (h, Hv V). TP splits the heads (Megatron-Core 0.16
    ssm/gated_delta_net.py: in_proj column-parallel, out_proj row-parallel, the conv and the per-head
    vectors sharded with the heads; the norm replicated)."""
    qk, v = key_heads * key_dim, value_heads * value_dim
    return [ParameterTensor("linear_attn_in_proj", (2 * qk + 2 * v + 2 * value_heads, h), COLUMN, "hidden_matrix"),
            ParameterTensor("linear_attn_conv", (2 * qk + v, kernel), COLUMN, "vector"),
            ParameterTensor("linear_attn_dt_bias_a_log", (2 * value_heads,), COLUMN, "vector"),
            ParameterTensor("linear_attn_norm", (value_dim,), REPLICATED, "vector"),
            ParameterTensor("linear_attn_out_proj", (h, v), ROW, "hidden_matrix")]


def mamba_tensors(h: int, heads: int, head_dim: int, state: int, groups: int, kernel: int,
                  conv_bias: bool, gated_norm: bool = True) -> list[ParameterTensor]:
    """A Mamba-2 mixer (transformers 5.23 NemotronHMamba2Mixer.__init__, Megatron-Core 0.16
    ssm/mamba_mixer.py): in_proj (2 d + 2 g n + H, h) with d = H p (z, x, B, C, dt), a depthwise conv
    over x, B, C (d + 2 g n channels of `kernel` taps, with a bias), dt_bias, A_log and D per head, a
    gated RMSNorm of width d (normalised per group), out_proj (h, d). TP splits heads and groups
    (Megatron-Core: in_proj column-parallel, out_proj row-parallel, conv, norm and per-head vectors
    sharded with them). Falcon-H1 (FalconH1Mixer.__init__) has the same tensors, the gated norm only with
    mamba_rms_norm (`gated_norm`)."""
    d = heads * head_dim
    conv = d + 2 * groups * state
    out = [ParameterTensor("mamba_in_proj", (2 * d + 2 * groups * state + heads, h), COLUMN, "hidden_matrix"),
           ParameterTensor("mamba_conv", (conv, kernel), COLUMN, "vector")]
    if conv_bias:
        out.append(ParameterTensor("mamba_conv_bias", (conv,), COLUMN, "vector"))
    out.append(ParameterTensor("mamba_dt_bias_a_log_d", (3 * heads,), COLUMN, "vector"))
    if gated_norm:
        out.append(ParameterTensor("mamba_norm", (d,), COLUMN, "vector"))
    return out + [ParameterTensor("mamba_out_proj", (h, d), ROW, "hidden_matrix")]


def mamba1_tensors(h: int, inner: int, state: int, dt_rank: int, kernel: int, conv_bias: bool) -> list[ParameterTensor]:
    """A Mamba-1 mixer with Jamba's inner norms (transformers 5.23 JambaMambaMixer.__init__): in_proj (2 d, h)
    with d = expand h (x and the gate z), a depthwise conv over x (d channels of `kernel` taps, a bias),
    x_proj (r + 2 n, d) giving dt, B, C, dt_proj (d, r) with a bias, A_log (d, n) and D (d,), RMSNorms on dt
    (r), B and C (n each), out_proj (h, d); no projection biases (mamba_proj_bias false). TP splits the inner
    channels (vLLM 0.11 model_executor/layers/mamba/mamba_mixer.py: in_proj and dt_proj column-parallel,
    x_proj and out_proj row-parallel; the conv, A, D sharded with the channels, the inner norms replicated)."""
    out = [ParameterTensor("mamba_in_proj", (2 * inner, h), COLUMN, "hidden_matrix"),
           ParameterTensor("mamba_conv", (inner, kernel), COLUMN, "vector")]
    if conv_bias:
        out.append(ParameterTensor("mamba_conv_bias", (inner,), COLUMN, "vector"))
    return out + [ParameterTensor("mamba_x_proj", (dt_rank + 2 * state, inner), ROW, "hidden_matrix"),
                  ParameterTensor("mamba_dt_proj", (inner, dt_rank), COLUMN, "hidden_matrix"),
                  ParameterTensor("mamba_dt_bias_d", (2 * inner,), COLUMN, "vector"),
                  ParameterTensor("mamba_a_log", (inner, state), COLUMN, "vector"),
                  ParameterTensor("mamba_dt_b_c_norms", (dt_rank + 2 * state,), REPLICATED, "vector"),
                  ParameterTensor("mamba_out_proj", (h, inner), ROW, "hidden_matrix")]


# --- the state a recurrent layer keeps per sequence (inference) -----------------------------------


def state_bytes(arch, kind: str, tp: int, model_bytes: int) -> int:
    """One sequence's state of one recurrent layer on one TP rank, constant in the context length: its
    convolution window and its recurrent matrix, with the shapes vLLM allocates (model_executor/layers/
    mamba/mamba_utils.py MambaStateShapeCalculator, vllm-project/vllm@02d7108): Mamba-2 conv (kernel - 1) x
    (H p + 2 g n) / tp, g replicated up to tp when tp does not divide it (extra_groups_for_head_shards), and
    (H / tp) x p x n; Gated DeltaNet conv (kernel - 1) x (2 Hk K + Hv V) / tp and (Hv / tp) x V x K. The
    conv state in the model's dtype; the recurrent matrix too for Gated DeltaNet (mamba_ssm_cache_dtype
    "auto"), in fp32 for Mamba-2 (Nemotron-H: transformers NemotronHConfig.mamba_ssm_cache_dtype defaults
    to "float32", which vLLM's NemotronHForCausalLMConfig hook applies, and HF generate's cache keeps); a parallel
    hybrid's (Falcon-H1) layer keeps its Mamba-2 state in the model's dtype (its KV is the attention's)."""
    mixer = MIXER[kind]
    if mixer == "linear_attention":
        hk, hv, k, v = (arch.linear_num_key_heads, arch.linear_num_value_heads, arch.linear_key_head_dim,
                        arch.linear_value_head_dim)
        conv = (arch.linear_conv_kernel_dim - 1) * (2 * hk * k + hv * v) // tp
        return (conv + hv // tp * v * k) * model_bytes
    if mixer in ("mamba", "attention_mamba"):
        g = arch.mamba_num_groups
        g += 0 if g % tp == 0 else tp - g
        d = arch.mamba_num_heads * arch.mamba_head_dim
        conv = (arch.mamba_conv_kernel - 1) * (d + 2 * g * arch.mamba_state_size) // tp
        # Falcon-H1 (vLLM 0.11 and 0.33 falcon_h1.py get_mamba_state_dtype_from_config: mamba2_state_dtype with the cache
        # config's mamba_ssm_cache_dtype, "auto" by default) keeps its SSM state in the model's dtype
        ssm_bytes = 4 if mixer == "mamba" else model_bytes
        return conv * model_bytes + arch.mamba_num_heads // tp * arch.mamba_head_dim * arch.mamba_state_size * ssm_bytes
    if mixer == "mamba1":  # vLLM mamba1_state_shape: conv (d / tp) x (kernel - 1), temporal (d / tp) x n
        inner = arch.mamba_expand * arch.hidden_size // tp
        return (inner * (arch.mamba_conv_kernel - 1) + inner * arch.mamba_state_size) * model_bytes
    return 0
