"""The config.json of hybrid models (issue 28, estimator/spec/hybrid.py): Qwen3-Next's linear-attention
layers, Nemotron-H's state-space blocks, Jamba's Mamba-1 layers and Falcon-H1's parallel attention + Mamba-2
layers, registered in `hf_families.FAMILIES` on import (hf_config
imports this module).
"""

from __future__ import annotations

from typing import Any

from .hf_common import Family
from .hf_families import FAMILIES, _qwen_moe, _Reader


def _full_attention_interval(r: _Reader, num_layers: int) -> int:
    """Qwen3-Next: layer_types (or full_attention_interval, default 4, when absent) as the canonical
    interval N: layer i is softmax attention when (i + 1) % N == 0 (Qwen3NextConfig.__post_init__)."""
    types = r.list_of("layer_types", str, "a list of 'linear_attention' and 'full_attention', one per layer")
    if types is None:
        return r.int("full_attention_interval")
    full = [i for i, t in enumerate(types) if t == "full_attention"]
    period = full[0] + 1 if full else 0
    regular = len(types) == num_layers and set(types) <= {"linear_attention", "full_attention"} and period > 0 \
        and all((t == "full_attention") == ((i + 1) % period == 0) for i, t in enumerate(types))
    if not regular:
        raise r._error("layer_types", types, f"{num_layers} entries, 'full_attention' every N-th layer and "
                       "'linear_attention' elsewhere", "other placements are not modelled")
    return period


def _qwen3_next(r: _Reader) -> tuple[dict[str, Any], list[str]]:
    """Qwen3-Next (transformers 5.23 modeling_qwen3_next.py): Qwen3-MoE's decoder layers with Gated
    DeltaNet mixers, gated attention (q_proj doubled), (1 + w) RMSNorms in fp32, one gated shared expert."""
    fields, notes = _qwen_moe(r)
    fields.update(qk_norm=True, norm_unit_offset=True, attention_output_gate=True,
                  full_attention_interval=_full_attention_interval(r, fields["num_layers"]),
                  linear_num_key_heads=r.int("linear_num_key_heads"), linear_num_value_heads=r.int("linear_num_value_heads"),
                  linear_key_head_dim=r.int("linear_key_head_dim"), linear_value_head_dim=r.int("linear_value_head_dim"),
                  linear_conv_kernel_dim=r.int("linear_conv_kernel_dim"))
    shared = r.int("shared_expert_intermediate_size", required=False, minimum=0)
    if shared and fields.get("num_experts"):
        fields.update(num_shared_experts=1, shared_expert_intermediate_size=shared, shared_expert_gate=True)
    return fields, notes


# NemotronHConfig: layers_block_type names (transformers 5.23) and the older names, as pattern symbols
_NEMOTRON_BLOCKS = {"linear_attention": "M", "mamba": "M", "full_attention": "*", "attention": "*", "mlp": "-",
                    "moe": "E"}


def _nemotron_pattern(r: _Reader) -> str:
    pattern = r.text("hybrid_override_pattern")
    if pattern is None:
        types = r.list_of("layers_block_type", str, "a list of 'mamba', 'attention', 'mlp' and 'moe' blocks")
        if not types or any(t not in _NEMOTRON_BLOCKS for t in types):
            raise r._error("layers_block_type", types, "a non-empty list of " + ", ".join(map(repr, _NEMOTRON_BLOCKS)))
        pattern = "".join(_NEMOTRON_BLOCKS[t] for t in types)
    if not pattern or set(pattern) - set("M*-E"):
        raise r._error("hybrid_override_pattern", pattern, "a string of M, *, - and E (one per block)")
    return pattern


def _nemotron_h(r: _Reader) -> tuple[dict[str, Any], list[str]]:
    """Nemotron-H (transformers 5.23 modeling_nemotron_h.py): blocks of one fp32-scaled RMSNorm and a
    Mamba-2 mixer, attention without positions, a squared-ReLU MLP or a MoE."""
    pattern = _nemotron_pattern(r)
    notes = []
    if r.config.get("num_hidden_layers") not in (None, len(pattern)):
        notes.append("num_hidden_layers (the pattern's length is used, as transformers does)")
    for key in ("mamba_proj_bias", "use_bias", "mlp_bias", "attention_bias"):
        if r.bool(key):
            notes.append(f"{key} (biases not counted)")
    fields: dict[str, Any] = dict(
        hidden_size=r.int("hidden_size"), num_layers=len(pattern), num_attention_heads=r.int("num_attention_heads"),
        num_kv_heads=r.int("num_key_value_heads", required=False), head_dim=r.int("head_dim", "attention_head_dim"),
        vocab_size=r.int("vocab_size"), tie_embeddings=r.bool("tie_word_embeddings"), gated_mlp=False,
        position_embedding="none", norm_fp32_scale=True, logits_fp32=True, hybrid_override_pattern=pattern,
        intermediate_size=r.int("intermediate_size") if "-" in pattern else None)
    if "M" in pattern:
        fields.update(mamba_num_heads=r.int("mamba_num_heads"), mamba_head_dim=r.int("mamba_head_dim"),
                      mamba_state_size=r.int("ssm_state_size"), mamba_num_groups=r.int("n_groups", "mamba_n_groups"),
                      mamba_conv_kernel=r.int("conv_kernel", "mamba_d_conv"),
                      mamba_conv_bias=r.bool("use_conv_bias", True), mamba_chunk_size=r.int("chunk_size", "mamba_chunk_size"))
    if "E" in pattern:
        if r.int("moe_latent_size", required=False) is not None:
            raise r._error("moe_latent_size", r.config.get("moe_latent_size"), "null",
                           "latent expert projections are not modelled")
        shared = r.int("n_shared_experts", required=False, minimum=0) or 0
        fields.update(num_experts=r.int("n_routed_experts"), num_experts_per_token=r.int("num_experts_per_tok"),
                      moe_intermediate_size=r.int("moe_intermediate_size"), num_shared_experts=shared)
        if shared:
            fields["shared_expert_intermediate_size"] = r.int("moe_shared_expert_intermediate_size") // shared
    return fields, notes


def _jamba(r: _Reader) -> tuple[dict[str, Any], list[str]]:
    """Jamba (transformers 5.23 modeling_jamba.py, JambaConfig): decoder layers of a Mamba-1 mixer (with RMSNorms
    on dt, B and C) or attention without positions, then an MLP or a MoE of experts as wide as the MLP; attention
    where i % attn_layer_period == attn_layer_offset, MoE where i % expert_layer_period == expert_layer_offset."""
    notes = []
    if r.bool("mamba_proj_bias"):
        notes.append("mamba_proj_bias (biases not counted)")
    h = r.int("hidden_size")
    fields: dict[str, Any] = dict(
        hidden_size=h, num_layers=r.int("num_hidden_layers"), num_attention_heads=r.int("num_attention_heads"),
        num_kv_heads=r.int("num_key_value_heads", required=False), vocab_size=r.int("vocab_size"),
        intermediate_size=r.int("intermediate_size"), tie_embeddings=r.bool("tie_word_embeddings"),
        position_embedding="none", attention_layer_period=r.int("attn_layer_period"),
        attention_layer_offset=r.int("attn_layer_offset", minimum=0), mamba_expand=r.int("mamba_expand"),
        mamba_state_size=r.int("mamba_d_state"), mamba_conv_kernel=r.int("mamba_d_conv"),
        mamba_conv_bias=r.bool("mamba_conv_bias", True))
    # JambaConfig.__post_init__: "auto" is ceil(hidden_size / 16)
    fields["mamba_dt_rank"] = -(-h // 16) if r.config.get("mamba_dt_rank") == "auto" else r.int("mamba_dt_rank")
    experts = r.int("num_experts")
    if experts > 1:  # JambaConfig.layers_num_experts: 1 expert is the plain MLP
        fields.update(num_experts=experts, num_experts_per_token=r.int("num_experts_per_tok"),
                      moe_intermediate_size=fields["intermediate_size"],
                      first_dense_layers=r.int("expert_layer_offset", minimum=0),
                      moe_layer_frequency=r.int("expert_layer_period"))
    return fields, notes


def _falcon_h1(r: _Reader) -> tuple[dict[str, Any], list[str]]:
    """Falcon-H1 (transformers 5.23 modeling_falcon_h1.py, FalconH1Config): every layer runs attention (RoPE, GQA,
    head_dim from the file, else hidden / heads) and a Mamba-2 mixer of width mamba_d_ssm (else mamba_expand x
    hidden; mamba_d_head "auto" = that / mamba_n_heads) side by side, then a gated MLP; the gated RMSNorm only with
    mamba_rms_norm. Its muP multipliers scale activations and change no shape."""
    notes = [f"{key} (biases not counted)" for key in ("attention_bias", "mlp_bias", "projectors_bias", "mamba_proj_bias")
             if r.bool(key)]
    h, heads = r.int("hidden_size"), r.int("mamba_n_heads")
    # an explicit null is mamba_expand x hidden; an absent key FalconH1Config's default, 1024
    width = r.int("mamba_expand") * h if r.config.get("mamba_d_ssm", 0) is None else r.int("mamba_d_ssm")
    head = width // heads if r.config.get("mamba_d_head") in (None, "auto") else r.int("mamba_d_head")
    if head * heads != width:  # FalconH1Config.validate_architecture
        raise r._error("mamba_d_head", head, f"mamba_d_ssm / mamba_n_heads ({width} / {heads})",
                       "the Mamba heads must tile the mixer's width")
    fields: dict[str, Any] = dict(
        hidden_size=h, num_layers=r.int("num_hidden_layers"), num_attention_heads=r.int("num_attention_heads"),
        num_kv_heads=r.int("num_key_value_heads", required=False), head_dim=r.int("head_dim", required=False),
        vocab_size=r.int("vocab_size"), intermediate_size=r.int("intermediate_size"),
        tie_embeddings=r.bool("tie_word_embeddings"), parallel_mamba=True, mamba_num_heads=heads, mamba_head_dim=head,
        mamba_state_size=r.int("mamba_d_state"), mamba_num_groups=r.int("mamba_n_groups"),
        mamba_conv_kernel=r.int("mamba_d_conv"), mamba_conv_bias=r.bool("mamba_conv_bias", True),
        mamba_chunk_size=r.int("mamba_chunk_size"), mamba_gated_norm=r.bool("mamba_rms_norm"))
    return fields, notes


HYBRID_FAMILIES: dict[str, Family] = {
    "qwen3_next": Family(  # Qwen3NextConfig
        build=_qwen3_next,
        defaults=dict(vocab_size=151936, hidden_size=2048, intermediate_size=5632, num_hidden_layers=48,
                      num_attention_heads=16, num_key_value_heads=2, head_dim=256, max_position_embeddings=32768,
                      tie_word_embeddings=False, attention_bias=False, linear_conv_kernel_dim=4,
                      linear_key_head_dim=128, linear_value_head_dim=128, linear_num_key_heads=16,
                      linear_num_value_heads=32, decoder_sparse_step=1, moe_intermediate_size=512,
                      shared_expert_intermediate_size=512, num_experts_per_tok=10, num_experts=512,
                      mlp_only_layers=None, full_attention_interval=4),
        keys=frozenset({'decoder_sparse_step', 'full_attention_interval', 'layer_types', 'linear_conv_kernel_dim',
                        'linear_key_head_dim', 'linear_num_key_heads', 'linear_num_value_heads',
                        'linear_value_head_dim', 'mlp_only_layers', 'moe_intermediate_size', 'num_experts',
                        'num_experts_per_tok', 'shared_expert_intermediate_size'})),
    "nemotron_h": Family(  # NemotronHConfig
        build=_nemotron_h,
        defaults=dict(vocab_size=131072, hidden_size=4096, tie_word_embeddings=False, num_attention_heads=32,
                      num_key_value_heads=8, head_dim=128, max_position_embeddings=4096, intermediate_size=21504,
                      ssm_state_size=128, mamba_num_heads=128, mamba_head_dim=64, n_groups=8, conv_kernel=4,
                      use_conv_bias=True, chunk_size=128, n_routed_experts=8, n_shared_experts=1,
                      moe_intermediate_size=7688, moe_shared_expert_intermediate_size=7688, num_experts_per_tok=2),
        keys=frozenset({'attention_head_dim', 'chunk_size', 'conv_kernel', 'expand', 'hybrid_override_pattern',
                        'layers_block_type', 'mamba_chunk_size', 'mamba_d_conv', 'mamba_expand', 'mamba_head_dim',
                        'mamba_hidden_act', 'mamba_n_groups', 'mamba_num_heads', 'mamba_proj_bias',
                        'mamba_ssm_cache_dtype', 'mlp_hidden_act', 'n_groups', 'n_routed_experts', 'n_shared_experts',
                        'moe_intermediate_size', 'moe_shared_expert_intermediate_size', 'moe_latent_size',
                        'num_experts_per_tok', 'num_logits_to_keep', 'rescale_prenorm_residual', 'residual_in_fp32',
                        'ssm_state_size', 'time_step_floor', 'time_step_limit', 'time_step_max', 'time_step_min',
                        'use_bias', 'use_conv_bias', 'use_mamba_kernels', 'n_group', 'topk_group',
                        'routed_scaling_factor', 'norm_topk_prob', 'mtp_layers_block_type',
                        'num_nextn_predict_layers', 'moe_shared_expert_overlap'})),
    "jamba": Family(  # JambaConfig
        build=_jamba,
        defaults=dict(vocab_size=65536, tie_word_embeddings=False, hidden_size=4096, intermediate_size=14336,
                      num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8, max_position_embeddings=262144,
                      num_experts_per_tok=2, num_experts=16, expert_layer_period=2, expert_layer_offset=1,
                      attn_layer_period=8, attn_layer_offset=4, mamba_d_state=16, mamba_d_conv=4, mamba_expand=2,
                      mamba_dt_rank="auto", mamba_conv_bias=True, mamba_proj_bias=False),
        keys=frozenset({'attn_layer_offset', 'attn_layer_period', 'expert_layer_offset', 'expert_layer_period',
                        'mamba_conv_bias', 'mamba_d_conv', 'mamba_d_state', 'mamba_dt_rank', 'mamba_expand',
                        'mamba_proj_bias', 'num_experts', 'num_experts_per_tok', 'num_logits_to_keep',
                        'output_router_logits', 'router_aux_loss_coef', 'use_mamba_kernels', 'use_mambapy',
                        'use_associative_scan'})),
    "falcon_h1": Family(  # FalconH1Config
        build=_falcon_h1,
        defaults=dict(vocab_size=128000, tie_word_embeddings=False, hidden_size=4096, intermediate_size=14336,
                      num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8, max_position_embeddings=8192,
                      mamba_d_ssm=1024, mamba_n_heads=128, mamba_d_head="auto", mamba_n_groups=1, mamba_d_state=256,
                      mamba_d_conv=4, mamba_expand=2, mamba_chunk_size=256, mamba_conv_bias=True,
                      mamba_proj_bias=False, mamba_rms_norm=False, projectors_bias=False, attention_bias=False,
                      mlp_bias=False),
        keys=frozenset({'attention_bias', 'attention_in_multiplier', 'attention_out_multiplier', 'attn_layer_indices',
                        'embedding_multiplier', 'head_dim', 'key_multiplier', 'lm_head_multiplier', 'mamba_chunk_size',
                        'mamba_conv_bias', 'mamba_d_conv', 'mamba_d_head', 'mamba_d_ssm', 'mamba_d_state',
                        'mamba_expand', 'mamba_n_groups', 'mamba_n_heads', 'mamba_norm_before_gate', 'mamba_proj_bias',
                        'mamba_rms_norm', 'mamba_use_mlp', 'mlp_bias', 'mlp_multipliers', 'num_logits_to_keep',
                        'projectors_bias', 'ssm_in_multiplier', 'ssm_multipliers', 'ssm_out_multiplier',
                        'time_step_limit'})),
}
FAMILIES.update(HYBRID_FAMILIES)
