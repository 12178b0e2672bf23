"""SGLang's start-up accounting (SGLang 0.5.23, the release read and run; earlier releases are refused).

SGLang sizes a static share of the GPU, ``mem_fraction_static``, for the weights and its pools; the rest
is left for activations and CUDA graphs (arg_groups/memory_hook.py, its docstring: "mem_fraction_static
= (model weights + KV cache pool) / GPU memory capacity"). At start-up (mem_cache/kv_cache_configurator.py
_profile_available_bytes) the pools get the memory free after loading the weights less
``pre_model_load_memory x (1 - mem_fraction_static)``, where pre_model_load_memory is what was free before
loading (after the CUDA context and NCCL). So the pools get pre x mem_fraction_static - weights, which
sglang_pools.py splits into the KV pool (``max_total_num_tokens``), a sliding-window pool and a hybrid
model's recurrent-state pool.

Unless given, mem_fraction_static = round((GPU MiB - reserved MiB) / GPU MiB, 3) with reserved = 512 +
1.5 x max(chunked_prefill_size, 2048) + TP x PP / 8 x 1024 + the graphs' reserve (2 x decode
cuda_graph_max_bs, plus 8 per prefill capture size, or 1536 with MLA, when the prefill graphs are on), at
least 10 GiB on GPUs above 60 GiB (memory_hook.py handle_gpu_memory_settings, reserve_for_graph_mb); a
served vision-language model's share is lowered by its vision tower. chunked_prefill_size and the decode
graphs' max batch follow the GPU's memory and TP there too. Every one of these is held to what SGLang's own
resolution computes (validation/sglang/pool_records.py, tests/data/serving/sglang-0.5.23.json).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from ..spec.architecture import Architecture
from ..memory.components import component
from ..spec.errors import ConfigError
from ..spec.hardware import Hardware
from ..spec.parallel import Parallel
from . import kv_cache
from .sglang_vlm import VLM_CACHE_MIB, multimodal, prefill_graphs_kept, vlm_fraction, with_tower
from .checkpoint import checkpoint_format, context_length
from ..spec.serving import Serving, version_tuple
from .vllm_engine import KV_DTYPE_BYTES, Resolved, ServingEstimate, StageBudget
from . import prefix_default, sglang_pools
from .sglang_dist_init import held_before_load
from .weights import stage_weights

MiB = 1024**2
GiB = 1024**3


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
                 graphs: bool, prefill_graphs: bool = True) -> tuple[float, float, float]:
    """(total, activation part, graph part) of SGLang's reservation outside mem_fraction_static, in MiB
    (memory_hook.py reserve_for_graph_mb). The prefill graphs (the breakable backend, CUDA's default) are off
    by default under pipeline parallelism (cuda_graph_hook.py apply_cuda_graph_compatibility), and with
    them their reserve, and for a served vision-language model off the allow-list (sglang_vlm.py)."""
    activation = 512 + max(chunked, 2048) * 1.5 + tp * pp / 8 * 1024
    graph = 0.0
    if graphs:
        graph = decode_bs * 2
        if pp == 1 and prefill_graphs:
            graph += 1.5 * 1024 if arch.uses_mla else prefill_capture_sizes(chunked) * 8
    total = activation + graph
    if gpu_mib > 60 * 1024:
        total = max(total, 10 * 1024)
    return total, activation, graph


def _refuse_vllm_only(serving: Serving) -> None:
    if serving.gpu_memory_utilization != 0.9:
        raise ConfigError("serving.gpu_memory_utilization", serving.gpu_memory_utilization, "0.9 (its default) with "
                          "SGLang", "SGLang sizes its share with mem_fraction_static", ("serving.engine",))
    if serving.speculative is not None:
        raise ConfigError("serving.speculative.method", serving.speculative.method, "empty with SGLang (or engine "
                          "'vllm')", "SGLang's draft workers and their pools are not modelled", ("serving.engine",))
    if serving.limit_mm_per_prompt is not None:
        raise ConfigError("serving.limit_mm_per_prompt", serving.limit_mm_per_prompt, "empty with SGLang (or engine "
                          "'vllm')", "vLLM's --limit-mm-per-prompt; SGLang profiles no encoder", ("serving.engine",))


def sglang_stage_layers(num_layers: int, pp: int) -> tuple[range, ...]:
    """SGLang's get_pp_indices (srt/distributed/utils.py, 0.5.23): an even split, the remainder one layer each
    to the last stages (vLLM's goes to the stages before the last)."""
    base, extra = divmod(num_layers, pp)
    sizes = [base + (1 if s >= pp - extra else 0) for s in range(pp)]
    starts = [sum(sizes[:s]) for s in range(pp)]
    return tuple(range(a, a + n) for a, n in zip(starts, sizes))




# Blackwell datacenter GPUs (sm100/sm103), where SGLang's default attention backend is TensorRT-LLM's
SM100_GPUS = frozenset({"b200", "gb200", "b300"})


def page_size(arch: Architecture, gpu_id: str, given: int | None) -> int:
    """--page-size: 1 unless given (overrides.py _page_size_default); on sm100 the default backend is trtllm_mha
    (MHA; model_override_base.py get_default_attn_backend) or trtllm_mla (DeepSeek's MLA), whose pages are 16,
    32, 64 or 128 tokens (MLA: 32 or 64), any other page becoming 64 (overrides.py
    _mla_backend_page_constraints)."""
    page = given or 1
    if gpu_id in SM100_GPUS and page not in ((32, 64) if arch.uses_mla else (16, 32, 64, 128)):
        return 64
    return page


def _max_len(serving: Serving, context: int | None) -> int:
    max_len = serving.max_model_len or context
    if max_len is None:
        raise ConfigError("serving.max_model_len", None, "a positive integer",
                          "the model's config gives no context length (max_position_embeddings)")
    return max_len


def _cache_layout(arch: Architecture, serving: Serving, gpu, fmt) -> tuple[int, str, int]:
    """(bytes per cached element, the cache's dtype name, tokens per page)."""
    kv_bytes = KV_DTYPE_BYTES.get(serving.kv_cache_dtype, fmt.dtype_bytes)
    kv_dtype = serving.kv_cache_dtype or fmt.dtype_name
    page = page_size(arch, gpu.id, serving.block_size)
    if arch.uses_sparse_attention:  # DeepSeek-V3.2: its own cache dtype default, 64-token pages (sparse_cache.py)
        from .sparse_cache import BLOCK, check_block_size, sglang_kv_dtype
        check_block_size(serving.block_size)
        kv_dtype, kv_bytes = sglang_kv_dtype(serving.kv_cache_dtype, gpu.id)
        page = BLOCK
    return kv_bytes, kv_dtype, page


def _stage_budgets(arch: Architecture, serving: Serving, par: Parallel, checkpoint: dict | None,
                   resolved: Resolved, static: int, held: int, act_mib: float,
                   graph_mib: float, groups=None) -> tuple[list, list]:
    """Each pipeline stage's budget and pools (PP: the stages' layers and weights differ)."""
    rules, fmt, context = resolved.rules, resolved.weights, resolved.context_length
    ranges = sglang_stage_layers(arch.num_layers, par.pp)
    stages, pools = [], []
    for s, layers in enumerate(ranges):
        weights = with_tower(arch, stage_weights(arch, fmt, par.tp, par.ep, par.pp, s, layers, context), par.tp,
                             fmt.dtype_bytes)
        available = static - weights.bytes - held
        pool = sglang_pools.size_pools(arch, checkpoint, par.tp, resolved.kv_bytes, resolved.block_size, layers,
                                       ranges, max(available, 0), serving.prefix_caching, serving.max_num_seqs,
                                       resolved.kv_cache_dtype)
        pools.append(pool)
        stages.append(StageBudget(s, layers, weights.bytes, int(act_mib * MiB), 0, int(graph_mib * MiB), available,
                                  _components(rules, weights, act_mib, graph_mib, pool, held, groups)))
    return stages, pools


def _notes(fraction: float, running: int, pool, serving: Serving) -> tuple[str, ...]:
    notes = (f"SGLang: mem_fraction_static {fraction:g} of the memory free before loading (pre_model_load_memory); "
             "its activation and CUDA graph figures are the reservation SGLang makes outside that share, not a "
             f"profile. max_running_requests {running:,}.",)
    if pool.state_slots:
        notes += (f"SGLang: {pool.state_slots:,} recurrent-state slots of {pool.state_per_request / MiB:.1f} MiB "
                  + ("(mamba_full_memory_ratio 0.9 of the pools' bytes; 3 slots per running request, + 2 for the radix "
                     "cache's extra buffer, 1 under PP)." if serving.prefix_caching else
                     "(without the radix cache: one slot per running request)."),)
    return notes


def estimate_sglang(arch: Architecture, serving: Serving, par: Parallel, hardware: Hardware,
                    checkpoint: dict | None = None) -> ServingEstimate:
    _refuse_vllm_only(serving)
    pc = prefix_default.resolve(arch, serving, checkpoint)
    serving = dataclasses.replace(serving, prefix_caching=pc.on)  # what follows reads the radix cache as SGLang runs
    if serving.enable_multimodal is not None and arch.vision_tower is None:
        raise ConfigError("serving.enable_multimodal", serving.enable_multimodal, "empty for a text-only model",
                          "the model has no vision tower")
    rules = rules_for(serving.engine_version)
    gpu = hardware.device
    gpu_mib = gpu.capacity_bytes / MiB
    chunked_default, decode_default = gpu_defaults(gpu_mib, par.tp)
    chunked = serving.max_num_batched_tokens or chunked_default
    # --max-running-requests lowers the decode graphs' default max batch (memory_hook.py)
    decode_bs = min(decode_default, serving.max_num_seqs or decode_default)
    reserve, act_mib, graph_mib = reserved_mib(arch, gpu_mib, par.tp, par.pp, chunked, decode_bs, serving.cuda_graphs,
                                               prefill_graphs_kept(checkpoint, serving.enable_multimodal))
    fraction = serving.mem_fraction_static or vlm_fraction(round((gpu_mib - reserve) / gpu_mib, 3), checkpoint,
                                                                serving.enable_multimodal)
    context = context_length(checkpoint)
    max_len = _max_len(serving, context)
    fmt = checkpoint_format(checkpoint, serving.weight_format, arch)
    kv_bytes, kv_dtype, page = _cache_layout(arch, serving, gpu, fmt)
    resolved = Resolved(rules, max_len, context, decode_bs, chunked, page,
                        kv_dtype, kv_bytes, fmt.name, fmt, prefix_caching=pc.on,
                        prefix_caching_default=pc.engine_default, prefix_caching_note=pc.note)
    # free before loading: after the CUDA context and what the process groups hold (sglang_dist_init.py)
    groups = held_before_load(version_tuple(serving.engine_version or rules.label), par.tp, par.pp, par.ep, gpu.id)
    pre = gpu.capacity_bytes - gpu.cuda_context_bytes - groups.bytes
    static = int(pre * fraction)
    held = VLM_CACHE_MIB * MiB if multimodal(checkpoint, serving.enable_multimodal) else 0
    stages, pools = _stage_budgets(arch, serving, par, checkpoint, resolved, static, held, act_mib, graph_mib,
                                   groups.component)
    # every stage takes the smallest pool (_apply_token_constraints: an all-reduce MIN over PP ranks)
    limiting = min(range(len(pools)), key=lambda i: pools[i].tokens)
    pool = pools[limiting]
    tokens = pool.tokens
    running = sglang_pools.max_running_requests(tokens, max_len, serving.max_num_seqs, pool, overlap=par.pp == 1,
                                                radix_cache=serving.prefix_caching)
    concurrency = min(tokens / max_len, running)
    capacity = kv_cache.KvCapacity(num_blocks=tokens // page, kv_cache_bytes=pool.kv_bytes, tokens=tokens,
                                   max_concurrency=concurrency, blocks_per_request=-(-max_len // page))
    longest = min(tokens, context or tokens)
    device_total = gpu.cuda_context_bytes + groups.bytes + static + int(reserve * MiB)
    outside = gpu.capacity_bytes - (gpu.cuda_context_bytes + groups.bytes + static)  # what the static share leaves
    short = (f"SGLang: mem_fraction_static {fraction:g} leaves {outside / GiB:.2f} GiB outside the static share, "
             f"less than the {reserve / 1024:.2f} GiB SGLang's own default keeps there for activations and CUDA graphs "
             "(server_args.py: the reservation its default fraction is made from): the device total is above the GPU, "
             "and a full chunked prefill or the largest graph batch may run out of memory; lower the fraction or "
             "chunked_prefill_size",) if serving.mem_fraction_static and outside < reserve * MiB else ()
    shared = (serving.shared_prefix_tokens or 0) // page * page  # the radix cache shares whole pages
    effective = (min((tokens - shared) / (max_len - shared), running) if 0 < shared < max_len else concurrency)
    return ServingEstimate("sglang", serving.engine_version or rules.label, resolved, static, gpu.capacity_bytes,
                           tuple(stages), limiting, capacity, longest, device_total, effective,
                           gpu.cuda_context_bytes, _notes(fraction, running, pool, serving) + short + (pc.note,)
                           + ((groups.note,) if groups.note else ()))


def _components(rules: SglangRules, weights, act_mib: float, graph_mib: float, pool, held: int,
                groups=None) -> tuple:
    out = (groups,) if groups is not None else ()  # outside the static share: it lowers the pre-load memory
    out += (
        component("weights", "Weights as loaded", weights.bytes, weights.formula, rules.source),
        component("activation_peak", "Activation reserve (outside the static share)", act_mib * MiB,
                  "512 + 1.5 x max(chunked_prefill_size, 2048) + TP x PP / 8 x 1024 MiB", rules.source),
        component("cuda_graphs", "CUDA graph reserve (outside the static share)", graph_mib * MiB,
                  "2 x cuda_graph_max_bs + 8 per prefill capture size (MLA: 1536; none under PP or for a served "
                  "VLM off SGLang's allow-list) MiB", rules.source),
    )
    if held:
        out += (component("mm_embedding_cache", "Multimodal embedding cache (held from the pools)", held,
                          "SGLANG_VLM_CACHE_SIZE_MB = 100 MiB",
                          "SGLang 0.5.23 mem_cache/kv_cache_configurator.py mm_runtime_reservation_gb"),)
    if pool.state_bytes:
        out += (component("recurrent_state", "Recurrent-state pool (Mamba / Gated DeltaNet)", pool.state_bytes,
                          f"({pool.state_slots:,} slots + 1) x {pool.state_per_request:,} B per slot",
                          "SGLang 0.5.23 mem_cache/kv_cache_configurator.py _handle_max_mamba_cache"),)
    return out


def pre_load_bytes(e: ServingEstimate) -> int:
    """The memory SGLang reads before loading (pre_model_load_memory): the GPU less the CUDA context and what its
    process groups hold (sglang_dist_init.py)."""
    groups = next((c.bytes for c in e.limiting.components if c.key == "dist_init"), 0)
    return e.total_bytes - e.context_bytes - groups
