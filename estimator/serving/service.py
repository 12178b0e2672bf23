"""One entry point for a serving estimate (by engine), its layout checks and its text report."""

from __future__ import annotations

from ..spec.architecture import Architecture
from ..spec.errors import ConfigError
from ..spec.hardware import Hardware
from ..spec.parallel import Parallel
from ..spec.serving import Serving

GiB = 1024**3


def checkpoint_of(model) -> dict | None:
    """The checkpoint's config.json for a config's ``model`` (the weight format and context length a
    serving estimate reads): a preset's bundled config (read on first use), a Hub model's (fetched, the
    one path that touches the network), or the config object given; None for a canonical architecture."""
    if isinstance(model, dict):
        return model if ("model_type" in model or "text_config" in model) else None
    if "/" in model:
        from ..models.hub import fetch_config, parse_hub_id
        repo_id, revision = parse_hub_id(model)
        return fetch_config(repo_id, revision=revision)
    from ..models.presets import get_hf_config
    return get_hf_config(model)


def serving_config(cfg):
    """A loaded `Config`'s serving estimate (its serving object, or the defaults when absent)."""
    from ..spec.serving import Serving
    return estimate_serving(cfg.architecture, cfg.serving or Serving(), cfg.parallel, cfg.hardware,
                            checkpoint_of(cfg.model))


def prefix_caching_of(cfg):
    """A loaded `Config`'s prefix caching as its engine runs it (prefix_default.py); only SGLang's model hooks read
    the checkpoint, so a vLLM configuration fetches nothing."""
    from .prefix_default import resolve
    checkpoint = checkpoint_of(cfg.model) if cfg.serving.engine == "sglang" else None
    return resolve(cfg.architecture, cfg.serving, checkpoint)


def check_layout(arch: Architecture, par: Parallel) -> None:
    """What the engines refuse at start-up: TP must divide the attention heads, and the KV heads must
    divide over TP or be replicated evenly (vLLM config/parallel.py verify_with_model_config; QKVParallelLinear);
    no more pipeline stages than layers."""
    if arch.num_attention_heads % par.tp:
        raise ConfigError("parallel.tp", par.tp, f"a divisor of the attention heads ({arch.num_attention_heads})",
                          "the engine splits the attention heads evenly over TP")
    kv = arch.num_kv_heads
    if not arch.uses_mla and kv % par.tp and par.tp % kv:
        raise ConfigError("parallel.tp", par.tp, f"a divisor or a multiple of the KV heads ({kv})",
                          "KV heads are split or replicated evenly over TP")
    if par.pp > arch.num_layers:
        raise ConfigError("parallel.pp", par.pp, f"at most the layers ({arch.num_layers})")


def estimate_serving(arch: Architecture, serving: Serving, par: Parallel, hardware: Hardware,
                     checkpoint: dict | None = None):
    check_layout(arch, par)
    if serving.engine == "vllm":
        from .vllm_engine import estimate_vllm
        return estimate_vllm(arch, serving, par, hardware, checkpoint)
    from .sglang_engine import estimate_sglang
    return estimate_sglang(arch, serving, par, hardware, checkpoint)


def headline(result) -> str:
    """"fits N concurrent sequences of L tokens" (or why the engine would not start)."""
    length = result.resolved.max_model_len
    if not result.starts:
        return (f"does not start: one sequence of {length:,} tokens needs more KV cache than is left; "
                f"the longest max_model_len that fits is {result.max_model_len_that_fits:,}")
    n = result.capacity.max_concurrency
    text = f"fits {n:,.2f} concurrent sequences of {length:,} tokens ({result.capacity.tokens:,} KV cache tokens)"
    if result.effective_concurrency != n:
        text += f"; {result.effective_concurrency:,.2f} with the shared prefix cached"
    return text


def render_text(result, replicas: int = 1) -> str:
    r, s = result.resolved, result.limiting
    lines = [f"Serving on {result.engine} {result.engine_version} (rules of {r.rules.label}): {headline(result)}"
             + (f" per replica, x {replicas} replicas" if replicas > 1 else ""),
             f"  max_model_len {r.max_model_len:,}, max_num_seqs {r.max_num_seqs:,}, max_num_batched_tokens "
             f"{r.max_num_batched_tokens:,}, block_size {r.block_size}, KV {r.kv_cache_dtype}, weights {r.weight_format}",
             f"  budget {result.budget_bytes / GiB:.2f} GiB of {result.total_bytes / GiB:.2f} GiB "
             f"(limiting rank: stage {result.limiting_stage})",
             f"  {'term':<36}{'GiB':>9}  formula"]
    for c in s.components:
        lines.append(f"  {c.label:<36}{c.bytes / GiB:9.2f}  {c.formula}")
    cap = result.capacity
    lines.append(f"  {'KV cache':<36}{cap.kv_cache_bytes / GiB:9.2f}  {cap.num_blocks:,} blocks of {r.block_size} "
                 f"tokens; {cap.blocks_per_request:,} blocks per sequence of {r.max_model_len:,}")
    lines.append(f"  {'device total':<36}{result.device_total_bytes / GiB:9.2f}  with the CUDA context "
                 f"({result.context_bytes / GiB:.2f} GiB, outside the budget)")
    lines.append(f"  longest max_model_len that fits: {result.max_model_len_that_fits:,}")
    lines += [f"Note: {n}" for n in result.notes]
    return "\n".join(lines)
