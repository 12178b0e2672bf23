"""SGLang's start-up accounting (SGLang 0.5.23, the release read; earlier releases are refused).

SGLang sizes a static share of the GPU, ``mem_fraction_static``, for the weights and the KV pool; the rest
is left for activations and CUDA graphs (arg_groups/memory_hook.py, its docstring: "mem_fraction_static
= (model weights + KV cache pool) / GPU memory capacity"). At start-up (mem_cache/kv_cache_configurator.py
_profile_available_bytes) the KV pool gets the memory free after loading the weights less
``pre_model_load_memory x (1 - mem_fraction_static)``, where pre_model_load_memory is what was free before
loading (after the CUDA context and NCCL). So KV = pre x mem_fraction_static - weights. The pool holds
``max_total_num_tokens`` = KV // cell size, rounded down to the page size (model_executor/
pool_configurator.py calculate_pool_sizes), with a cell of max(1, kv_heads // TP) x (head_dim + v_head_dim)
x layers x dtype bytes, or (kv_lora_rank + rope dim) x layers x dtype bytes with MLA.

Unless given, mem_fraction_static = (GPU MiB - reserved MiB) / GPU MiB with reserved = 512 + 1.5 x
max(chunked_prefill_size, 2048) + TP x PP / 8 x 1024 + the graphs' reserve (2 x decode cuda_graph_max_bs,
plus 8 per prefill capture size, or 1536 with MLA), at least 10 GiB on GPUs above 60 GiB
(memory_hook.py _handle_gpu_memory_settings, reserve_for_graph_mb). chunked_prefill_size and the decode
graphs' max batch follow the GPU's memory and TP there too.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..spec.architecture import Architecture
from ..memory.components import component
from ..spec.errors import ConfigError
from ..spec.hardware import Hardware
from ..spec.parallel import Parallel
from . import kv_cache
from .checkpoint import checkpoint_format, context_length
from ..spec.serving import Serving, version_tuple
from .vllm_engine import KV_DTYPE_BYTES, Resolved, ServingEstimate, StageBudget
from .weights import stage_layers, stage_weights

MiB = 1024**2


@dataclass(frozen=True)
class SglangRules:
    version: tuple[int, int]
    label: str
    source: str


RULES = (SglangRules((0, 5), "0.5.23", "SGLang 0.5.23 arg_groups/memory_hook.py, mem_cache/kv_cache_configurator.py, "
                                       "model_executor/pool_configurator.py"),)


def rules_for(version: str | None) -> SglangRules:
    if version is None:
        return RULES[-1]
    major, minor, _ = version_tuple(version)
    if (major, minor) < RULES[0].version:
        raise ConfigError("serving.engine_version", version, f"an SGLang release from {RULES[0].label[:3]} on")
    return RULES[-1]


def gpu_defaults(gpu_mib: float, tp: int) -> tuple[int, int]:
    """(chunked_prefill_size, decode cuda_graph_max_bs) by GPU memory and TP (memory_hook.py)."""
    small_tp = tp < 4
    if gpu_mib < 20 * 1024:
        return 2048, 8
    if gpu_mib < 35 * 1024:
        return 4096, 48 if small_tp else 160
    if gpu_mib < 60 * 1024:
        return 4096, 32 if small_tp else 160
    if gpu_mib < 160 * 1024:
        return 8192, 256 if small_tp else 512
    return 16384, 512


def prefill_capture_sizes(max_bs: int) -> int:
    """How many token counts the prefill graphs capture (cuda_graph_hook.py generate_prefill_cuda_graph_batch_sizes)."""
    sizes = (list(range(4, 33, 4)) + list(range(48, 257, 16)) + list(range(288, 513, 32))
             + list(range(576, 1025, 64)) + list(range(1280, 4097, 256)) + list(range(4608, max_bs + 1, 512)))
    return sum(1 for s in sizes if s <= max_bs)


def reserved_mib(arch: Architecture, gpu_mib: float, tp: int, pp: int, chunked: int, decode_bs: int,
                 graphs: bool) -> tuple[float, float, float]:
    """(total, activation part, graph part) of SGLang's reservation outside mem_fraction_static, in MiB."""
    activation = 512 + max(chunked, 2048) * 1.5 + tp * pp / 8 * 1024
    graph = 0.0
    if graphs:
        graph = decode_bs * 2 + (1.5 * 1024 if arch.uses_mla else prefill_capture_sizes(
            min(8192, chunked) if arch.uses_mla else chunked) * 8)
    total = activation + graph
    if gpu_mib > 60 * 1024:
        total = max(total, 10 * 1024)
    return total, activation, graph


def _refuse_vllm_only(serving: Serving) -> None:
    if serving.gpu_memory_utilization != 0.9:
        raise ConfigError("serving.gpu_memory_utilization", serving.gpu_memory_utilization, "0.9 (its default) with "
                          "SGLang", "SGLang sizes its share with mem_fraction_static", ("serving.engine",))


def estimate_sglang(arch: Architecture, serving: Serving, par: Parallel, hardware: Hardware,
                    checkpoint: dict | None = None) -> ServingEstimate:
    _refuse_vllm_only(serving)
    if serving.speculative is not None:
        raise ConfigError("serving.speculative.method", serving.speculative.method, "empty with SGLang (or engine "
                          "'vllm')", "SGLang's draft workers and their pools are not modelled", ("serving.engine",))
    if arch.sliding_window:
        raise ConfigError("serving.engine", "sglang", "'vllm' for a sliding-window model",
                          "SGLang's separate sliding-window pool (SWAKVPool) is not modelled")
    if arch.is_hybrid:
        raise ConfigError("serving.engine", "sglang", "'vllm' for a model with linear-attention or Mamba layers",
                          "SGLang's separate pool of recurrent states (MambaPool) is not modelled")
    rules = rules_for(serving.engine_version)
    gpu = hardware.device
    gpu_mib = gpu.capacity_bytes / MiB
    chunked_default, decode_default = gpu_defaults(gpu_mib, par.tp)
    chunked = serving.max_num_batched_tokens or chunked_default
    decode_bs = serving.max_num_seqs or decode_default
    reserve, act_mib, graph_mib = reserved_mib(arch, gpu_mib, par.tp, par.pp, chunked, decode_bs, serving.cuda_graphs)
    fraction = serving.mem_fraction_static or round((gpu_mib - reserve) / gpu_mib, 3)
    context = context_length(checkpoint)
    max_len = serving.max_model_len or context
    if max_len is None:
        raise ConfigError("serving.max_model_len", None, "a positive integer",
                          "the model's config gives no context length (max_position_embeddings)")
    fmt = checkpoint_format(checkpoint, serving.weight_format)
    kv_bytes = KV_DTYPE_BYTES.get(serving.kv_cache_dtype, fmt.dtype_bytes)
    kv_dtype = serving.kv_cache_dtype or fmt.dtype_name
    page = serving.block_size or 1  # --page-size, 1 by default
    if arch.uses_sparse_attention:  # DeepSeek-V3.2: its own cache dtype default, 64-token pages (sparse_cache.py)
        from .sparse_cache import BLOCK, check_block_size, sglang_kv_dtype
        check_block_size(serving.block_size)
        kv_dtype, kv_bytes = sglang_kv_dtype(serving.kv_cache_dtype, gpu.id)
        page = BLOCK
    pre = gpu.capacity_bytes - gpu.cuda_context_bytes  # free before loading: after the CUDA context
    static = int(pre * fraction)
    ranges = stage_layers(arch.num_layers, par.pp)
    stages, pools = [], []
    for s, layers in enumerate(ranges):
        weights = stage_weights(arch, fmt, par.tp, par.ep, par.pp, s, layers, context)
        per_layer = ((arch.kv_lora_rank + arch.qk_rope_head_dim) if arch.uses_mla
                     else 2 * kv_cache.kv_heads_per_rank(arch, par.tp) * arch.head_dim) * kv_bytes
        if arch.uses_sparse_attention:
            from .sparse_cache import sglang_cell_per_layer
            per_layer = sglang_cell_per_layer(arch, kv_dtype, kv_bytes)
        cell = per_layer * len(layers)
        available = static - weights.bytes
        tokens = max(available, 0) // cell // page * page
        pools.append((tokens, cell))
        components = (
            component("weights", "Weights as loaded", weights.bytes, weights.formula, rules.source),
            component("activation_peak", "Activation reserve (outside the static share)", act_mib * MiB,
                      "512 + 1.5 x max(chunked_prefill_size, 2048) + TP x PP / 8 x 1024 MiB", rules.source),
            component("cuda_graphs", "CUDA graph reserve (outside the static share)", graph_mib * MiB,
                      "2 x cuda_graph_max_bs + 8 per prefill capture size (MLA: 1536) MiB", rules.source),
        )
        stages.append(StageBudget(s, layers, weights.bytes, int(act_mib * MiB), 0, int(graph_mib * MiB), available,
                                  components))
    limiting = min(range(len(pools)), key=lambda i: pools[i][0])
    tokens, cell = pools[limiting]
    capacity = kv_cache.KvCapacity(num_blocks=tokens // page, kv_cache_bytes=tokens * cell, tokens=tokens,
                                   max_concurrency=tokens / max_len, blocks_per_request=-(-max_len // page))
    resolved = Resolved(rules, max_len, context, decode_bs, chunked, page,
                        kv_dtype, kv_bytes, fmt.name, fmt)
    longest = min(tokens, context or tokens)
    device_total = gpu.cuda_context_bytes + static + int(reserve * MiB)
    notes = (f"SGLang: mem_fraction_static {fraction:g} of the memory free before loading (pre_model_load_memory); "
             "its activation and CUDA graph figures are the reservation SGLang makes outside that share, not a "
             "profile.",)
    shared = (serving.shared_prefix_tokens or 0) // page * page  # the radix cache shares whole pages
    effective = ((tokens - shared) / (max_len - shared) if 0 < shared < max_len else capacity.max_concurrency)
    return ServingEstimate("sglang", serving.engine_version or rules.label, resolved, static, gpu.capacity_bytes,
                           tuple(stages), limiting, capacity, longest, device_total, effective,
                           gpu.cuda_context_bytes, notes)
