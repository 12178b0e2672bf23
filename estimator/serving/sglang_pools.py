"""SGLang's KV pool and recurrent-state pool sizing (SGLang 0.5.23), from the bytes left for them.

Read in SGLang 0.5.23 (srt/model_executor/pool_configurator.py, srt/mem_cache/kv_cache_configurator.py,
srt/configs/mamba_utils.py, srt/configs/model_config.py) and recorded by running those functions on CPU
(validation/sglang/pool_records.py, tests/data/serving/sglang-0.5.23.json):

- One pool of ``max_total_num_tokens`` tokens (DefaultPoolConfigurator): a token costs, on every attention
  layer of the rank's stage, max(1, KV heads // TP) x (head_dim + v_head_dim) x dtype bytes
  (ModelConfig.get_num_kv_heads), or (kv_lora_rank + rope dim) x dtype bytes with MLA (one latent on
  every TP rank). tokens = bytes // cell, rounded down to the page size.
- A sliding window gets a pool of its own only for the architectures SGLang lists as hybrid SWA
  (configs/model_config.py is_hybrid_swa_model, e.g. gpt-oss): full tokens = bytes // (full cell +
  swa_full_tokens_ratio x SWA cell) and SWA tokens = full x the ratio (0.8 unless given;
  HybridSWAPoolConfigurator). Any other model with a window (Gemma 3, Mistral) keeps every layer's tokens
  in the one pool.
- A hybrid model's Gated DeltaNet and Mamba-2 layers keep one state per request slot in a pool of their
  own, sized first (KVCacheConfigurator._handle_max_mamba_cache): the state pool gets
  ratio / (1 + ratio) of the bytes (mamba_full_memory_ratio, 0.9), that is max_mamba_cache_size =
  (budget - slot) // slot slots, and takes (slots + 1) slots (one padding slot); the attention layers'
  KV pool gets the rest. A slot is, per recurrent layer on the largest stage, the conv window
  (conv_dim / TP) x (kernel - 1) in bf16 (SGLANG_MAMBA_CONV_DTYPE) and the recurrent matrix
  (heads / TP) x head_dim x state in the config's ``mamba_ssm_dtype``, fp32 when it has none
  (mamba2_state_dtype); conv_dim = heads x head_dim + 2 x groups x state, groups widened to TP when TP
  does not divide them (Mamba2StateShape.create). Gated DeltaNet maps to it as value heads x value dim,
  key heads as groups, key dim as state (configs/qwen3_next.py mamba2_cache_params).
- Without the radix cache (serving.prefix_caching off: --disable-radix-cache) a given max_running_requests
  is the state pool's slot count and the KV pool gets the rest.
- max_running_requests = min(clamp(tokens / context_len x 512, 2048, 4096), tokens // 2) unless given
  (resolve_max_num_reqs), and for a hybrid at most slots // slots per request (with the radix cache 3,
  plus 2 for its extra buffer under the overlap schedule, 1 without it as under PP; without it 1:
  _calculate_mamba_ratio, get_mamba_tracking_slots).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..spec import hybrid
from ..spec.architecture import Architecture
from ..spec.errors import ConfigError

SWA_FULL_TOKENS_RATIO = 0.8  # arg_groups/fields/schedule.py swa_full_tokens_ratio fallback
MAMBA_FULL_MEMORY_RATIO = 0.9  # arg_groups/fields/schedule.py mamba_full_memory_ratio fallback
MAMBA_CONV_BYTES = 2  # environ.py SGLANG_MAMBA_CONV_DTYPE "bfloat16"
SSM_DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
# configs/model_config.py is_hybrid_swa_model: the architectures (of those our presets and Hub models name)
# whose sliding-window layers get a pool of their own
HYBRID_SWA_ARCHITECTURES = frozenset({"GptOssForCausalLM", "Llama4ForConditionalGeneration", "Gemma4ForCausalLM",
                                      "Gemma4ForConditionalGeneration", "MiMoV2FlashForCausalLM",
                                      "Step3p5ForCausalLM", "GraniteSWAForCausalLM"})
MAMBA_SLOTS_PER_REQUEST = 3  # kv_cache_configurator.py MAMBA_CACHE_SIZE_MAX_RUNNING_REQUESTS_RATIO
EXTRA_BUFFER_SLOTS = 2  # allocation_sizing.py get_mamba_tracking_slots(extra_buffer, overlap)


@dataclass(frozen=True)
class Pools:
    tokens: int  # max_total_num_tokens (the full-attention pool's tokens)
    kv_bytes: int  # the KV pools' bytes on the limiting rank
    cell_bytes: int  # bytes per token of max_total_num_tokens (the configurator's cell size)
    swa_tokens: int | None  # the sliding-window pool's tokens, when it has one
    state_slots: int  # max_mamba_cache_size (0 without recurrent layers)
    state_bytes: int  # the recurrent-state pool, padding slot included
    state_per_request: int  # one slot's bytes on this rank


def is_hybrid_swa(arch: Architecture, checkpoint: dict | None) -> bool:
    names = (checkpoint or {}).get("architectures") or ()
    return bool(arch.local_attention) and any(name in HYBRID_SWA_ARCHITECTURES for name in names)


def attention_layers(arch: Architecture, layers: range) -> tuple[int, ...]:
    """The layers of a stage that keep keys and values (a hybrid's attention layers only)."""
    if not arch.is_hybrid:
        return tuple(layers)
    return tuple(i for i in layers if hybrid.attends(arch.layer_kind(i)))


def token_bytes(arch: Architecture, tp: int, kv_bytes: int, kv_dtype: str = "") -> int:
    """One token on one attention layer (ModelConfig.get_num_kv_heads; calculate_mla_kv_cache_dim); with
    DeepSeek Sparse Attention its latent layout and index key (sparse_cache.py)."""
    if arch.uses_sparse_attention:
        from .sparse_cache import sglang_cell_per_layer
        return sglang_cell_per_layer(arch, kv_dtype, kv_bytes)
    if arch.uses_mla:
        return (arch.kv_lora_rank + arch.qk_rope_head_dim) * kv_bytes
    return max(1, arch.num_kv_heads // tp) * 2 * arch.head_dim * kv_bytes


def ssm_dtype_bytes(checkpoint: dict | None) -> int:
    """The recurrent matrix's dtype: the config's mamba_ssm_dtype (its text_config's for a VLM), else fp32
    (configs/mamba_utils.py mamba2_state_dtype)."""
    cfg = checkpoint or {}
    name = (cfg.get("text_config") or {}).get("mamba_ssm_dtype") or cfg.get("mamba_ssm_dtype")
    return SSM_DTYPE_BYTES.get(name, 4)


def state_layer_bytes(arch: Architecture, kind: str, tp: int, ssm_bytes: int) -> int:
    """One request's state of one recurrent layer on one TP rank (Mamba2StateShape.create)."""
    mixer = hybrid.MIXER[kind]
    if mixer == "linear_attention":
        heads, head_dim, state = arch.linear_num_value_heads, arch.linear_value_head_dim, arch.linear_key_head_dim
        groups, kernel = arch.linear_num_key_heads, arch.linear_conv_kernel_dim
    elif mixer in ("mamba", "attention_mamba"):  # Falcon-H1: every layer both (configs/falcon_h1.py linear_layer_ids)
        heads, head_dim, state = arch.mamba_num_heads, arch.mamba_head_dim, arch.mamba_state_size
        groups, kernel = arch.mamba_num_groups, arch.mamba_conv_kernel
    else:
        return 0
    if groups % tp:
        groups += tp - groups  # extra_groups_for_head_shards
    conv_dim = heads * head_dim + 2 * groups * state
    return conv_dim // tp * (kernel - 1) * MAMBA_CONV_BYTES + heads // tp * head_dim * state * ssm_bytes


def state_per_request(arch: Architecture, tp: int, ssm_bytes: int, stages: tuple[range, ...]) -> int:
    """A slot: every recurrent layer's state, scaled to the stage with the most recurrent layers
    (_handle_max_mamba_cache: per_req x max stage layers / all recurrent layers, truncated)."""
    recurrent = [i for i in range(arch.num_layers) if hybrid.recurrent(arch.layer_kind(i))]
    if not recurrent:
        return 0
    per_req = sum(state_layer_bytes(arch, arch.layer_kind(i), tp, ssm_bytes) for i in recurrent)
    most = max(sum(1 for i in recurrent if i in layers) for layers in stages)
    return int(per_req * most / len(recurrent))


def state_slots(rest_bytes: int, per_request: int, ratio: float = MAMBA_FULL_MEMORY_RATIO) -> int:
    """max_mamba_cache_size when neither it nor max_running_requests is given (no speculative decoding)."""
    budget = rest_bytes * ratio / (1 + ratio)
    return int((budget - per_request) // per_request)


def size_pools(arch: Architecture, checkpoint: dict | None, tp: int, kv_bytes: int, page: int,
               stage: range, stages: tuple[range, ...], available: int, radix_cache: bool = True,
               requested: int | None = None, kv_dtype: str = "") -> Pools:
    """The pools one rank sizes from the `available` bytes SGLang's profile leaves it. Without the radix cache
    a given max_running_requests is the state pool's slot count (_handle_max_mamba_cache). `kv_dtype`: the
    cache dtype's name, which decides a sparse-attention model's latent layout (sparse_cache.py)."""
    per_request = state_per_request(arch, tp, ssm_dtype_bytes(checkpoint), stages) if arch.is_hybrid else 0
    if per_request and requested and not radix_cache:
        slots = max(1, requested)
    else:
        slots = max(state_slots(available, per_request), 0) if per_request else 0
    if per_request and not slots:  # SGLang refuses to start: no room for one state slot
        return Pools(0, 0, token_bytes(arch, tp, kv_bytes, kv_dtype) * len(attention_layers(arch, stage)), None, 0, 0,
                     per_request)
    state = (slots + 1) * per_request if per_request else 0
    rest = max(available - state, 0)
    per_token = token_bytes(arch, tp, kv_bytes, kv_dtype)
    layers = attention_layers(arch, stage)
    if not layers:  # the token pool's cell is the stage's attention layers: none leaves its size undefined
        raise ConfigError("parallel.pp", len(stages), "a pipeline split that gives every stage an attention layer",
                          f"stage {stages.index(stage)} (layers {stage.start}-{stage.stop - 1}) holds recurrent layers "
                          "only; how SGLang sizes such a rank's token pool is not modelled")
    if is_hybrid_swa(arch, checkpoint):
        n_full = arch.global_attention_layers_in(stage.start, stage.stop)
        n_swa = len(layers) - n_full
        cell = per_token * n_full + SWA_FULL_TOKENS_RATIO * per_token * n_swa
        full = int(rest // cell) // page * page
        swa = int(full * SWA_FULL_TOKENS_RATIO) // page * page
        return Pools(full, full * per_token * n_full + swa * per_token * n_swa, int(cell), swa, 0, 0, 0)
    cell = per_token * len(layers)
    tokens = rest // cell // page * page
    return Pools(tokens, tokens * cell, cell, None, slots, state, per_request)


def max_running_requests(tokens: int, context_len: int, requested: int | None, pools: Pools,
                         overlap: bool = True, radix_cache: bool = True) -> int:
    """resolve_max_num_reqs: SGLang's cap on the requests it runs at once. A request holds 3 state slots and
    the radix cache's extra buffer 2 more under the overlap schedule, 1 without it (pipeline parallelism
    turns the overlap schedule off); without the radix cache it holds one (_calculate_mamba_ratio)."""
    if requested is not None:
        limit = min(requested, tokens // 2)
    else:
        limit = min(max(min(int(tokens / context_len * 512), 4096), 2048), tokens // 2)
    if pools.state_slots:
        per_request = MAMBA_SLOTS_PER_REQUEST + (EXTRA_BUFFER_SLOTS if overlap else 1) if radix_cache else 1
        limit = min(limit, pools.state_slots // per_request)
    return limit
