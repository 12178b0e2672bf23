"""vLLM's memory accounting rules, one record per release where a rule changed.

Each record names the release whose source it was read from (the wheels on PyPI, whose Python files
are vLLM's source at that tag). A requested version uses the newest record at or below it; versions
below the first record (the V0 engine era) are refused. Releases read: 0.11.0, 0.15.0, 0.17.0,
0.18.0 (its hybrid rules; its non-torch record rests on 0.18.0's start-up log), 0.19.0, 0.20.0, 0.21.0, 0.25.0,
0.33.0; a rule first seen in 0.33.0 but absent from 0.25.0 is keyed on 0.33 (the releases between were not read).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..spec.errors import ConfigError
from ..spec.serving import version_tuple

GiB = 1024**3
MiB = 1024**2
# Non-torch memory printed by llm-d-planner PR #205's vLLM start-up logs on H100 (tests/data/serving/
# published_vllm_logs.json): Qwen3-14B at TP 1 prints 0.13 GiB under 0.15.0, 0.16.0 and 0.17.0 and 0.25 GiB under
# 0.18.0; the 0.19.0 sweep prints 0.24-0.27 GiB at TP 1 and 0.07 GiB on every stage under PP 2 and PP 4.
_NT_0_15 = round(0.13 * GiB)
_NT_GRAPH_PROFILE = round(0.25 * GiB)
_NT_MULTIPROC_0_19 = round(0.07 * GiB)


@dataclass(frozen=True)
class BatchDefaults:
    """`vllm serve`'s defaults for max_num_batched_tokens and max_num_seqs on GPUs with at least
    `min_memory` bytes (engine/arg_utils.py, `_set_default_args`, UsageContext.OPENAI_API_SERVER)."""

    min_memory: int
    max_num_batched_tokens: int
    max_num_seqs: int
    excludes_a100: bool = False  # the >= 70 GiB tier skips A100s ("a100" not in device_name)


@dataclass(frozen=True)
class VllmRules:
    version: tuple[int, int]
    label: str
    # The CUDA graphs' memory, estimated by profile_cudagraph_memory() during start-up, is taken from
    # the budget before the KV cache is sized (VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS=1 by default).
    # Before: graphs are captured after the KV cache is allocated, on top of the budget.
    cuda_graphs_in_budget: bool
    # How "GPU KV cache size: N tokens" is computed: "blocks" = num_blocks // groups x block_size;
    # "concurrency" = int(max_concurrency x max_model_len).
    kv_tokens_rule: str
    batch_defaults: tuple[BatchDefaults, ...]  # largest tier first
    # The dummy sampler's tensors in the profiling run (serving/activations.py): "flashinfer" (FlashInfer's
    # top-k/top-p sampler on by default), "sort" (the PyTorch sort path), "triton" (the in-place Triton mask)
    sampler: str
    # non_kv = total consumed (mem_get_info) + transient torch peak (0.33 utils/mem_utils.py) rather than
    # weights + torch peak increase + non-torch increase (0.11 utils/__init__.py memory_profiling): the
    # same terms when the profile leaves no persistent torch buffers behind.
    source: str
    # fused_moe's workspaces come from the worker's WorkspaceManager and stay allocated (activations.py)
    moe_workspace_kept: bool = False
    # What a hybrid's recurrent states do under prefix caching (model_executor/models/config.py MambaModelConfig;
    # serving/recurrent_state.py): "off" (prefix caching turned off for every hybrid, 0.11.0), "all_or_align"
    # (mamba_cache_mode "all" for models with SupportsMambaPrefixCaching, the Mamba-based hybrids, else "align",
    # 0.15.0), "align" (0.33.0: "align" for every hybrid)
    mamba_cache_modes: str = "off"
    # The hybrid attention block's alignment: "16" (HybridAttentionMambaModelConfig, 0.11.0 to 0.19.0: multiples of
    # 16, the requested block only a floor) or "requested" (platforms/interface.py _align_hybrid_block_size from
    # 0.20.0: multiples of max(the backend's smallest kernel block, the requested block))
    hybrid_block_alignment: str = "16"
    # 0.15.0 and 0.17.0 HybridAttentionMambaModelConfig: FlashInfer (sm100's first backend) with head size 256 on a
    # capability-100 GPU aligns to 32 tokens (flashinfer issue 1993; flashinfer.py asserts block_size != 16)
    blackwell_hd256_block: int | None = None
    # Which hybrids may run speculative decoding: "qwen3_next" (0.11.0 gpu_model_runner.py, 0.15.0
    # layers/mamba/abstract.py: "Mamba with speculative decoding is not supported yet" for any other model type)
    # or "any" (0.17.0 on)
    hybrid_speculative: str = "any"
    # MambaSpec.max_memory_usage_bytes counts num_speculative_blocks (0.15.0 on; 0.11.0: one page whatever the
    # drafter, though MambaManager allocates 1 + num_speculative_blocks at run time)
    speculative_state_pages: bool = True
    # The combinations MambaModelConfig changes or refuses: "align_refused" (0.15.0 asserts 'align' is not
    # compatible with speculative decoding), "all_to_align" (0.20.0/0.21.0: a SupportsMambaPrefixCaching model
    # under speculative decoding gets 'align'), None
    speculative_cache_mode: str | None = None
    # "all" mode counts the speculative blocks (MambaSpec.max_memory_usage_bytes: cdiv(max_model_len, block) +
    # num_speculative_blocks in 0.25.0; cdiv(max_model_len, block) before)
    all_mode_speculative_pages: bool = False
    # FlashInfer's all-reduce fusion workspace under TP > 1 (serving/allreduce_fusion.py): None (the pass is off
    # by default), "multicast" (each buffer rounded to the recommended multicast granularity, FlashInfer 0.6.4 to
    # 0.6.8) or "allocation" (rounded to 2 MiB, FlashInfer 0.7.2)
    allreduce_fusion: str | None = None
    # Non-torch growth outside every modelled buffer (kernels loaded lazily, cuBLAS handles, what the CUDA-graph
    # memory profile leaves behind), measured in public start-up logs: one GPU, and a worker of a multi-GPU run
    # (serving/overheads.py cites each)
    non_torch_single: int = 164 * MiB  # 0.16 GiB at TP 1 (vLLM PR #12126 start-up log)
    non_torch_distributed: int = 205 * MiB  # 0.20 GiB a worker of a 4-GPU run (vLLM PR #14447 start-up log)


_TIER_70 = BatchDefaults(70 * GiB, 8192, 1024, excludes_a100=True)
_TIER_SMALL = BatchDefaults(0, 2048, 256)

RULES: tuple[VllmRules, ...] = (
    VllmRules((0, 11), "0.11", cuda_graphs_in_budget=False, kv_tokens_rule="blocks",
              batch_defaults=(_TIER_70, _TIER_SMALL), sampler="sort", hybrid_speculative="qwen3_next",
              speculative_state_pages=False,
              source="vLLM 0.11.0 v1/worker/gpu_worker.py determine_available_memory (requested_memory = total x "
                     "gpu_memory_utilization; available = requested - (weights + torch peak increase + non-torch "
                     "increase)); v1/core/kv_cache_utils.py get_kv_cache_config_from_groups (num_blocks = available "
                     "// page_size // layers per group; tokens = num_blocks // groups x block_size); "
                     "engine/arg_utils.py _set_default_args; v1/sample/ops/topk_topp_sampler.py: FlashInfer "
                     "sampling only where FlashInfer is installed, which the PyPI wheel leaves to the "
                     "'flashinfer' extra (METADATA: flashinfer-python==0.3.1; extra == \"flashinfer\"), "
                     "else the sort path"),
    VllmRules((0, 15), "0.15", cuda_graphs_in_budget=False, kv_tokens_rule="blocks",
              batch_defaults=(_TIER_70, _TIER_SMALL), sampler="sort", moe_workspace_kept=True,
              non_torch_single=_NT_0_15, mamba_cache_modes="all_or_align", blackwell_hd256_block=32,
              hybrid_speculative="qwen3_next", speculative_cache_mode="align_refused",
              source="vLLM 0.15.0 v1/sample/ops/topk_topp_sampler.py: FlashInfer sampling only when "
                     "VLLM_USE_FLASHINFER_SAMPLER=1; apply_top_k_top_p sorts the fp32 logits; (wheel) "
                     "fused_moe/modular_kernel.py takes its workspaces from v1/worker/workspace.py's manager; "
                     "model_executor/models/config.py MambaModelConfig keeps prefix caching for hybrids "
                     "(mamba_cache_mode 'all' or 'align'), HybridAttentionMambaModelConfig aligns the block to the "
                     "Mamba chunk in 'all' mode and to 32 for head size 256 on sm100"),
    VllmRules((0, 17), "0.17", cuda_graphs_in_budget=False, kv_tokens_rule="blocks",
              batch_defaults=(_TIER_70, _TIER_SMALL), sampler="triton", moe_workspace_kept=True,
              allreduce_fusion="multicast", non_torch_single=_NT_0_15, mamba_cache_modes="all_or_align",
              blackwell_hd256_block=32,
              source="vLLM 0.17.0 (wheel) and 0.19.0 v1/sample/ops/topk_topp_sampler.py apply_top_k_top_p: the "
                     "Triton kernel of topk_topp_triton.py for 8 rows or more (FlashInfer still opt-in); "
                     "0.19.0 envs.py VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS defaults to 0; 0.17.0 and 0.19.0 "
                     "config/vllm.py enable_allreduce_rms_fusion on at TP > 1 with the required flashinfer-python "
                     "0.6.4 / 0.6.6 (METADATA), whose SymmDeviceMemory rounds to the multicast granularity; 0.17.0 "
                     "layers/mamba/abstract.py lets every hybrid run speculative decoding and MambaModelConfig no "
                     "longer refuses it in 'align' mode"),
    VllmRules((0, 18), "0.18", cuda_graphs_in_budget=False, kv_tokens_rule="blocks",
              batch_defaults=(_TIER_70, _TIER_SMALL), sampler="triton", moe_workspace_kept=True,
              allreduce_fusion="multicast", non_torch_single=_NT_GRAPH_PROFILE, mamba_cache_modes="all_or_align",
              source="vLLM 0.18: non-torch memory at TP 1 steps from 0.13 GiB (0.17.0) to 0.25 GiB (Qwen3-14B logs, "
                     "llm-d-planner PR #205), where determine_available_memory starts to run "
                     "profile_cudagraph_memory() inside memory_profiling whatever VLLM_MEMORY_PROFILER_ESTIMATE_"
                     "CUDAGRAPHS says (absent in 0.15.0, present in 0.19.0 v1/worker/gpu_worker.py; vLLM PR #51590 "
                     "names the memory that profile retains); the 0.18 source itself was not read for that. 0.18.0 "
                     "model_executor/models/config.py HybridAttentionMambaModelConfig drops the sm100 head-size-256 "
                     "alignment of 32 (and flashinfer.py its assert)"),
    VllmRules((0, 19), "0.19", cuda_graphs_in_budget=False, kv_tokens_rule="blocks",
              batch_defaults=(_TIER_70, _TIER_SMALL), sampler="triton", moe_workspace_kept=True,
              allreduce_fusion="multicast", non_torch_single=_NT_GRAPH_PROFILE,
              non_torch_distributed=_NT_MULTIPROC_0_19, mamba_cache_modes="all_or_align",
              source="vLLM 0.19.0 config/vllm.py enable_allreduce_rms_fusion: is_device_capability_family(100) "
                     "(0.17.0: is_device_capability(100)), so sm103 (B300) builds the fusion pass too, with "
                     "FI_ALLREDUCE_FUSION_MAX_SIZE_MB's new sm103 row; its workers print 'vLLM is using "
                     "nccl==2.27.5' (torch's libnccl) and distributed/device_communicators/flashinfer_all_reduce.py "
                     "_create_workspace exchanges handles over the TP group's torch process group "
                     "(serving/nccl_comm.py)"),
    VllmRules((0, 20), "0.20", cuda_graphs_in_budget=True, kv_tokens_rule="blocks",
              non_torch_single=_NT_GRAPH_PROFILE, non_torch_distributed=_NT_MULTIPROC_0_19,
              batch_defaults=(_TIER_70, _TIER_SMALL), sampler="triton", moe_workspace_kept=True,
              allreduce_fusion="multicast", mamba_cache_modes="all_or_align", hybrid_block_alignment="requested",
              speculative_cache_mode="all_to_align",
              source="vLLM 0.20.0 envs.py VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS defaults to 1 (0 in 0.19.0): "
                     "v1/worker/gpu_worker.py determine_available_memory subtracts profile_cudagraph_memory() "
                     "from the KV budget; platforms/interface.py _align_hybrid_block_size aligns a hybrid's block to "
                     "max(the backend's smallest kernel block, block_size); model_executor/models/config.py "
                     "MambaModelConfig gives a SupportsMambaPrefixCaching model 'align' under speculative decoding"),
    VllmRules((0, 21), "0.21", cuda_graphs_in_budget=True, kv_tokens_rule="concurrency",
              non_torch_single=_NT_GRAPH_PROFILE, non_torch_distributed=_NT_MULTIPROC_0_19,
              batch_defaults=(_TIER_70, _TIER_SMALL), sampler="flashinfer",
              moe_workspace_kept=True, allreduce_fusion="multicast", mamba_cache_modes="all_or_align",
              hybrid_block_alignment="requested", speculative_cache_mode="all_to_align",
              source="vLLM 0.21.0 v1/core/kv_cache_utils.py: 'GPU KV cache size' = int(max_concurrency x "
                     "max_model_len) (0.20.0: num_blocks // groups x block_size); envs.py "
                     "VLLM_USE_FLASHINFER_SAMPLER defaults to True again, and the wheel requires flashinfer-python "
                     "(METADATA: flashinfer-python==0.6.8.post1)"),
    # 0.25.0: the hybrid rules only; every other rule is 0.21.0's (read in 0.25.0: envs.py, arg_utils.py,
    # kv_cache_utils.py)
    VllmRules((0, 25), "0.25", cuda_graphs_in_budget=True, kv_tokens_rule="concurrency",
              non_torch_single=_NT_GRAPH_PROFILE, non_torch_distributed=_NT_MULTIPROC_0_19,
              batch_defaults=(_TIER_70, _TIER_SMALL), sampler="flashinfer",
              moe_workspace_kept=True, allreduce_fusion="multicast", mamba_cache_modes="all_or_align",
              hybrid_block_alignment="requested", all_mode_speculative_pages=True,
              source="vLLM 0.25.0 model_executor/models/config.py MambaModelConfig: 'all' again for a "
                     "SupportsMambaPrefixCaching model under speculative decoding (0.21.0: 'align'); "
                     "v1/kv_cache_interface.py MambaSpec.max_memory_usage_bytes: 'all' mode adds "
                     "num_speculative_blocks"),
    VllmRules((0, 33), "0.33", cuda_graphs_in_budget=True, kv_tokens_rule="concurrency",
              non_torch_single=_NT_0_15,  # 0.33.0 gpu_worker.py: the CUDA-graph profile moved out of memory_profiling
              batch_defaults=(BatchDefaults(160 * GiB, 16384, 1024), _TIER_70, _TIER_SMALL), sampler="flashinfer",
              moe_workspace_kept=True, allreduce_fusion="allocation",
              mamba_cache_modes="align", hybrid_block_alignment="requested", all_mode_speculative_pages=True,
              source="vLLM 0.33.0 engine/arg_utils.py: GPUs with >= 160 GiB (B200/B300) default to 16384 batched "
                     "tokens (absent in 0.25.0); model_executor/models/config.py MambaModelConfig: prefix caching "
                     "sets mamba_cache_mode 'align' for every hybrid (0.25.0: 'all' for SupportsMambaPrefixCaching "
                     "models), config/model.py: prefix caching on by default for hybrids, platforms/interface.py "
                     "_align_hybrid_block_size, v1/kv_cache_interface.py MambaSpec.max_memory_usage_bytes; "
                     "v1/core/kv_cache_planning.py get_kv_cache_config_from_groups "
                     "(num_blocks = available // bytes per block of the largest group); "
                     "v1/core/kv_cache_utils.py get_kv_cache_capacity; flashinfer-python 0.7.2.post1 (METADATA) "
                     "rounds the all-reduce fusion workspace to the allocation granularity only"),
)

CURRENT = RULES[-1].label


def rules_for(version: str | None) -> VllmRules:
    """The newest record at or below `version` (None: the newest record)."""
    if version is None:
        return RULES[-1]
    major, minor, _ = version_tuple(version)
    eligible = [r for r in RULES if r.version <= (major, minor)]
    if not eligible:
        raise ConfigError("serving.engine_version", version,
                          f"a vLLM release from {RULES[0].label} on (the V1 engine's accounting)")
    return eligible[-1]


def batch_defaults(rules: VllmRules, capacity_bytes: int, gpu_id: str) -> BatchDefaults:
    for tier in rules.batch_defaults:
        if capacity_bytes >= tier.min_memory and not (tier.excludes_a100 and gpu_id.startswith("a100")):
            return tier
    return rules.batch_defaults[-1]
