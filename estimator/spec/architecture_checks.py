"""An architecture's checks: each field's type and range, then the rules between fields (a sliding window or
a chunk, a hybrid layout, multi-head latent attention, experts). Architecture.__post_init__ runs them; `arch` is
that Architecture (not imported here: the record imports its checks)."""

from __future__ import annotations

from . import hybrid as _hybrid
from . import sparse as _sparse
from . import vision as _vision
from .errors import ConfigError
from .values import check_section


def _require(arch, name: str, why: str) -> None:
    if getattr(arch, name) is None:
        raise ConfigError(f"model.{name}", None, "a positive integer", why)


def check_architecture(arch) -> None:
    """Each field's type and range (estimator/spec/fields.py), then the rules between fields."""
    check_section("model", arch)
    if arch.position_embedding == "learned":
        _require(arch, "max_position_embeddings", "required with learned position embeddings")
    kv = arch.num_kv_heads or arch.num_attention_heads
    if arch.num_attention_heads % kv:
        raise ConfigError("model.num_kv_heads", kv, f"a divisor of num_attention_heads ({arch.num_attention_heads})",
                          related=("model.num_attention_heads",))
    if arch.head_dim is None and arch.hidden_size % arch.num_attention_heads:
        raise ConfigError("model.head_dim", None, "a positive integer",
                          f"hidden_size ({arch.hidden_size}) is not divisible by num_attention_heads "
                          f"({arch.num_attention_heads}), so head_dim must be given",
                          related=("model.hidden_size", "model.num_attention_heads"))
    if arch.hybrid_override_pattern is not None:
        needs_mlp = "-" in arch.hybrid_override_pattern
    else:
        needs_mlp = not (arch.num_experts > 0 and arch.first_dense_layers == 0 and arch.moe_layer_frequency == 1)
    if needs_mlp:
        _require(arch, "intermediate_size", "required unless every layer is MoE (no - block in a hybrid pattern)")
    if arch.num_experts:
        _require(arch, "num_experts_per_token", "required with experts")
        _require(arch, "moe_intermediate_size", "required with experts")
        if arch.num_experts_per_token > arch.num_experts:
            raise ConfigError("model.num_experts_per_token", arch.num_experts_per_token,
                              f"at most num_experts ({arch.num_experts})", related=("model.num_experts",))
    elif arch.num_shared_experts:
        raise ConfigError("model.num_shared_experts", arch.num_shared_experts, "0 when num_experts is 0",
                          related=("model.num_experts",))
    if arch.first_dense_layers > arch.num_layers:
        raise ConfigError("model.first_dense_layers", arch.first_dense_layers,
                          f"at most num_layers ({arch.num_layers})", related=("model.num_layers",))
    if arch.kv_lora_rank is not None or arch.q_lora_rank is not None:
        for name in ("kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim"):
            _require(arch, name, "required with multi-head latent attention")
    if arch.sliding_window and arch.attention_chunk_size:
        raise ConfigError("model.attention_chunk_size", arch.attention_chunk_size, "none with a sliding_window",
                          "a local layer either slides or is chunked", related=("model.sliding_window",))
    _sparse.check_indexer(arch)
    _check_hybrid(arch)
    _vision.check(arch)


def _check_hybrid(arch) -> None:
    """A linear-attention interval or a state-space pattern: their fields, and what they do not combine with."""
    pattern, interval, period = arch.hybrid_override_pattern, arch.full_attention_interval, arch.attention_layer_period
    if pattern is None and interval <= 1 and not period and not arch.parallel_mamba:
        return
    which = "model.hybrid_override_pattern" if pattern is not None else "model.full_attention_interval" \
        if interval > 1 else "model.attention_layer_period" if period else "model.parallel_mamba"
    if period and (pattern is not None or interval):
        raise ConfigError("model.attention_layer_period", period, "0 with a hybrid_override_pattern or a "
                          "full_attention_interval", "a model has one kind of recurrent layer here", related=(which,))
    if pattern is not None and interval:
        raise ConfigError("model.full_attention_interval", interval, "0 with a hybrid_override_pattern",
                          "a model has either Mamba blocks or linear-attention layers here", related=(which,))
    for name, value, allowed in (("kv_lora_rank", arch.kv_lora_rank, "none"),
                                 ("sliding_window", arch.sliding_window, "none"),
                                 ("attention_chunk_size", arch.attention_chunk_size, "none"),
                                 ("mtp_layers", arch.mtp_layers or None, "0")):
        if value is not None:
            raise ConfigError(f"model.{name}", value, f"{allowed} in a hybrid model", related=(which,))
    if arch.parallel_mamba:  # first: it combines with no other layout
        _hybrid.check_parallel(arch)
    elif pattern is not None:
        _check_pattern(arch, pattern)
    elif period:
        _hybrid.check_mamba1(arch)
    else:
        for name in ("linear_num_key_heads", "linear_num_value_heads", "linear_key_head_dim", "linear_value_head_dim"):
            _require(arch, name, "required with linear-attention layers (full_attention_interval > 1)")
        if arch.linear_num_value_heads % arch.linear_num_key_heads:
            raise ConfigError("model.linear_num_value_heads", arch.linear_num_value_heads,
                              f"a multiple of linear_num_key_heads ({arch.linear_num_key_heads})",
                              related=("model.linear_num_key_heads",))


def _check_pattern(arch, pattern: str) -> None:
    if len(pattern) != arch.num_layers:
        raise ConfigError("model.hybrid_override_pattern", pattern,
                          f"{arch.num_layers} characters, one per layer (num_layers)", related=("model.num_layers",))
    for name, default in (("first_dense_layers", 0), ("moe_layer_frequency", 1)):
        if getattr(arch, name) != default:
            raise ConfigError(f"model.{name}", getattr(arch, name), f"{default} with a hybrid_override_pattern "
                              "(its E blocks are the MoE layers)", related=("model.hybrid_override_pattern",))
    if "M" in pattern:
        for name in ("mamba_num_heads", "mamba_head_dim", "mamba_state_size", "mamba_num_groups"):
            _require(arch, name, "required with Mamba blocks (M in hybrid_override_pattern)")
        if arch.mamba_num_heads % arch.mamba_num_groups:
            raise ConfigError("model.mamba_num_groups", arch.mamba_num_groups,
                              f"a divisor of mamba_num_heads ({arch.mamba_num_heads})",
                              related=("model.mamba_num_heads",))
    if ("E" in pattern) != (arch.num_experts > 0):
        raise ConfigError("model.num_experts", arch.num_experts, "more than 0 exactly when the pattern has E blocks",
                          related=("model.hybrid_override_pattern",))
