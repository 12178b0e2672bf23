"""vLLM V1's start-up accounting, term by term, for the rank that limits capacity.

budget (requested_memory) = gpu_memory_utilization x total GPU memory (gpu_worker.py init_device;
math.ceil from 0.21's request_memory). Per rank: available KV memory = budget - weights as loaded -
torch activation peak of the profiling run - non-torch growth (- CUDA graphs where the version counts
them inside the budget). The KV cache is then cut into blocks (kv_cache.py); every rank takes the
smallest block count, so the stage with the least room limits capacity.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from ..spec.architecture import Architecture
from ..memory.components import Component, component
from ..spec.errors import ConfigError
from ..spec.field import MAX_TOKENS
from ..spec.hardware import Hardware
from ..spec.parallel import Parallel
from . import kv_cache, overheads, prefix_default, vllm_versions
from .allreduce_fusion import fusion_workspace
from .cuda_graphs import driver_memory, graph_memory, model_max_capture, vllm_estimate
from .nccl_comm import communicator_bytes, tp_group_nccl
from .activations import COMPUTE_UNITS, activation_peak
from .profile_buffers import autotune_flush_bytes, blas_workspace_bytes, capture_blas_bytes
from .encoder import encoder_profile, encoder_weights, modality_limits, tower_built
from .checkpoint import checkpoint_format, context_length
from ..spec.serving import Serving, version_tuple
from .mxfp4_experts import mxfp4_experts
from .weights import IN_BLOCKS, stage_layers, stage_weights, vllm_rope_dtype_bytes

KV_DTYPE_BYTES = {"fp8": 1, "fp8_e4m3": 1, "fp8_e5m2": 1}  # vLLM STR_DTYPE_TO_TORCH_DTYPE: fp8 -> uint8
BLACKWELL = ("b200", "b300")  # compute capability 10.x: CUTLASS MLA
HOPPER = ("h100-80", "h100-nvl", "h100-pcie", "h200", "gh200")  # FlashMLA (sm90)
GiB = 1024**3
# The total memory torch.cuda.mem_get_info reports, which vLLM multiplies by gpu_memory_utilization
# (gpu_worker.py init_device); it is less than nvidia-smi's "Total" (the catalog's capacity). H100 SXM 80GB:
# "total_memory=79.19GiB" in every vLLM 0.19.0 DEBUG start-up log of llm-d-planner PR #205
# (tests/data/serving/published_vllm_logs.json), against nvidia-smi's 81,559 MiB (79.65 GiB).
CUDA_REPORTED_TOTAL = {"h100-80": round(79.19 * GiB)}
ROCM_GRAPH_PROFILE = (0, 26)  # the first release whose profile_cudagraph_memory runs on ROCm (_cuda_graphs)


@dataclass(frozen=True)
class Resolved:
    """The engine's settings after its defaults (what the start-up log prints)."""

    rules: vllm_versions.VllmRules
    max_model_len: int
    context_length: int | None
    max_num_seqs: int
    max_num_batched_tokens: int
    block_size: int
    kv_cache_dtype: str
    kv_bytes: int
    weight_format: str
    weights: object  # WeightFormat
    gpu_id: str = "h100-80"
    release: tuple[int, int] = (0, 0)  # the requested release (major, minor); the rules' record where none is named
    prefix_caching: bool = False  # as the engine runs it (prefix_default.py)
    prefix_caching_default: bool = False  # True: the engine's default (serving.prefix_caching unset)
    prefix_caching_note: str = ""  # which mode and why, with the engine source


@dataclass(frozen=True)
class StageBudget:
    stage: int
    layers: range
    weights: int
    activation: int
    non_torch: int
    cuda_graphs: int
    available: int  # the KV cache's share of the budget on this rank
    components: tuple[Component, ...]
    graphs_held: int | None = None  # the CUDA graphs the device holds, where it differs from cuda_graphs (vLLM 0.20+)


@dataclass(frozen=True)
class ServingEstimate:
    engine: str
    engine_version: str
    resolved: Resolved
    budget_bytes: int
    total_bytes: int
    stages: tuple[StageBudget, ...]
    limiting_stage: int
    capacity: kv_cache.KvCapacity
    max_model_len_that_fits: int
    device_total_bytes: int
    effective_concurrency: float
    context_bytes: int
    notes: tuple[str, ...]

    @property
    def limiting(self) -> StageBudget:
        return self.stages[self.limiting_stage]

    @property
    def starts(self) -> bool:
        """vLLM starts when the KV memory is positive and holds one request of max_model_len
        (kv_cache_utils check_enough_kv_cache_memory)."""
        return min(s.available for s in self.stages) > 0 and self.max_model_len_that_fits >= self.resolved.max_model_len

    def to_json(self) -> dict:
        s, r = self.limiting, self.resolved
        return {
            "engine": self.engine, "engine_version": self.engine_version, "rules_version": r.rules.label,
            "budget_bytes": self.budget_bytes, "weights_bytes": s.weights, "activation_peak_bytes": s.activation,
            "non_torch_bytes": s.non_torch, "cuda_graph_bytes": s.cuda_graphs,
            "kv_cache_bytes": self.capacity.kv_cache_bytes, "kv_cache_tokens": self.capacity.tokens,
            "num_gpu_blocks": self.capacity.num_blocks, "max_concurrency": self.capacity.max_concurrency,
            "max_model_len_that_fits": self.max_model_len_that_fits, "device_total_bytes": self.device_total_bytes,
            "effective_concurrency": self.effective_concurrency,
            "starts": self.starts, "limiting_stage": self.limiting_stage, "max_model_len": r.max_model_len,
            "max_num_seqs": r.max_num_seqs, "max_num_batched_tokens": r.max_num_batched_tokens,
            "block_size": r.block_size, "kv_cache_dtype": r.kv_cache_dtype, "weight_format": r.weight_format,
            "prefix_caching": r.prefix_caching, "prefix_caching_engine_default": r.prefix_caching_default,
            "prefix_caching_note": r.prefix_caching_note,
            "components": {c.key: c.bytes for c in s.components},
        }


def resolve(arch: Architecture, serving: Serving, hardware: Hardware, checkpoint: dict | None) -> Resolved:
    rules = vllm_versions.rules_for(serving.engine_version)
    gpu = hardware.device
    tier = vllm_versions.batch_defaults(rules, gpu.capacity_bytes, gpu.id)
    context = context_length(checkpoint)
    max_model_len = serving.max_model_len or context
    if max_model_len is None:
        raise ConfigError("serving.max_model_len", None, "a positive integer",
                          "the model's config gives no context length (max_position_embeddings)")
    if context and max_model_len > context:
        raise ConfigError("serving.max_model_len", max_model_len, f"at most the model's context length ({context:,})",
                          "vLLM refuses a max_model_len above max_position_embeddings (config/model.py)")
    fmt = checkpoint_format(checkpoint, serving.weight_format, arch)
    if fmt.name == "mxfp4":
        experts = mxfp4_experts(rules.version, gpu)
        fmt = dataclasses.replace(fmt, mxfp4_padding=experts.padding, mxfp4_fp32_bias=experts.fp32_bias,
                                  mxfp4_triton=experts.triton,
                                  mxfp4_marlin_repack=experts.backend == "marlin" and rules.version < (0, 15),
                                  mxfp4_marlin_sms=COMPUTE_UNITS[gpu.id])
    kv_bytes = KV_DTYPE_BYTES.get(serving.kv_cache_dtype, fmt.dtype_bytes)
    kv_dtype = serving.kv_cache_dtype or fmt.dtype_name
    if arch.uses_sparse_attention:  # DeepSeek-V3.2: fp8_ds_mla and 64-token blocks (sparse_cache.py)
        from .sparse_cache import check_block_size, vllm_kv_dtype
        check_block_size(serving.block_size)
        kv_dtype, kv_bytes = vllm_kv_dtype(serving.kv_cache_dtype, rules.version, fmt.dtype_bytes)
    block = serving.block_size or _default_block_size(arch, gpu.id)
    return Resolved(rules, max_model_len, context, serving.max_num_seqs or tier.max_num_seqs,
                    serving.max_num_batched_tokens or tier.max_num_batched_tokens, block,
                    kv_dtype, kv_bytes, fmt.name, fmt, gpu.id, _release(serving, rules))


def _release(serving: Serving, rules: vllm_versions.VllmRules) -> tuple[int, int]:
    if serving.engine_version is None:
        return rules.version
    major, minor, _ = version_tuple(serving.engine_version)
    return major, minor


def sampler_rule(rules: vllm_versions.VllmRules, gpu_id: str) -> str:
    """FlashInfer's sampler runs on CUDA only: on ROCm TopKTopPSampler takes forward_native, whose top-k/top-p
    is the Triton kernel from 0.17 on (v1/sample/ops/topk_topp_sampler.py, 0.21 and 0.33)."""
    if rules.sampler == "flashinfer" and gpu_id.startswith("mi"):
        return "triton"
    return rules.sampler


def _default_block_size(arch: Architecture, gpu_id: str) -> int:
    """16 (platforms/cuda.py); MLA forces 64 for FlashMLA on Hopper and 128 for CUTLASS MLA on
    Blackwell (vLLM 0.11 platforms/cuda.py check_and_update_config); 64 for sparse MLA on any GPU there."""
    if arch.uses_sparse_attention:
        return 64
    if arch.uses_mla and gpu_id in BLACKWELL:
        return 128
    if arch.uses_mla and gpu_id in HOPPER:
        return 64
    return 16


def _stage_budget(arch: Architecture, r: Resolved, serving: Serving, par: Parallel, budget: int,
                  stage: int, layers: range, draft=None) -> StageBudget:
    weights = stage_weights(arch, r.weights, par.tp, par.ep, par.pp, stage, layers, r.context_length,
                            vllm_rope_dtype_bytes(arch), as_allocated=True)
    if draft is not None and stage == par.pp - 1:
        weights = dataclasses.replace(weights, bytes=weights.bytes + draft.weights_bytes,
                                      formula=f"{weights.formula} + {draft.formula}")
    kinds = {kind for kind, _ in arch.kind_counts(layers.start, layers.stop)}
    act_bytes = r.weights.dtype_bytes
    compiled = serving.cuda_graphs  # --enforce-eager turns off torch.compile too (config/vllm.py, 0.19.0)
    blas = blas_workspace_bytes(r.gpu_id)
    peak = activation_peak(arch, r.max_num_batched_tokens, r.max_num_seqs, par.tp, act_bytes, kinds,
                           stage == par.pp - 1, sampler_rule(r.rules, r.gpu_id), r.gpu_id, stage == 0,
                           r.rules.moe_workspace_kept and r.weight_format != "mxfp4", par.ep, compiled,
                           autotune_flush_bytes(r.release, r.gpu_id, compiled), blas)
    limits = modality_limits(arch, serving.limit_mm_per_prompt)
    encoder = encoder_profile(arch, r.max_num_batched_tokens, r.max_num_seqs, r.max_model_len, par.tp, act_bytes,
                              serving.engine_version, limits)
    if tower_built(arch, limits, serving.engine_version):  # every rank builds the vision encoder (serving/encoder.py)
        tower = encoder_weights(arch, par.tp, r.weights.dtype_bytes)
        weights = dataclasses.replace(weights, bytes=weights.bytes + tower,
                                      formula=f"{weights.formula} + vision encoder (its linears / TP)")
    if encoder:  # and profiles it, unless every modality's limit is 0
        # the encoder runs the first GEMM, so its forward holds the cuBLAS workspace too (profile_buffers.py)
        tower_sets_it = encoder.forward_bytes + blas > encoder.cache_bytes + peak.bytes
        peak = dataclasses.replace(
            peak, bytes=max(encoder.forward_bytes + blas, encoder.cache_bytes + peak.bytes),
            flush_bytes=0 if tower_sets_it else peak.flush_bytes,
            formula=f"max(encoder forward + cuBLAS workspace, encoder cache + {peak.formula}); {encoder.formula}")
    non_torch_part = _non_torch(arch, r, par)
    non_torch = non_torch_part.bytes
    first, last = stage == 0, stage == par.pp - 1
    graph = _cuda_graphs(arch, r, par, act_bytes, layers, first, last) if serving.cuda_graphs else None
    graphs, counted = (graph.bytes, graph.in_budget) if graph else (0, False)
    in_budget = graphs if counted else 0
    available = budget - weights.bytes - peak.bytes - non_torch - in_budget
    src = f"vLLM {r.rules.label}"
    components = (
        component("weights", "Weights as loaded", weights.bytes, weights.formula,
                  f"{src} parallel layers and quantization methods' tensors (estimator/serving/weights.py)",
                  _weight_parts(weights, src)),
        component("activation_peak", "Profiling run's activation peak", peak.bytes, peak.formula,
                  f"{src} gpu_model_runner.py profile_run; torch's cuBLAS workspace and inductor's autotune flush "
                  "buffer (estimator/serving/activations.py, "
                  + ("sort_sampler.py, " if r.rules.sampler == "sort" else "")
                  + "profile_buffers.py; modelled, not measured)",
                  _activation_parts(peak, src)),
        non_torch_part,
        component("cuda_graphs", "CUDA graphs" + (" (in the budget)" if in_budget else " (on top of the budget)"),
                  graphs, graph.formula if graph else "off",
                  f"{src} v1/worker/gpu_model_runner.py profile_cudagraph_memory / capture_model, "
                  "compilation/cuda_graph.py, v1/attention/backends/flash_attn.py (estimator/serving/cuda_graphs.py)",
                  graph.parts if graph else ()),
    )
    held = graph.held if graph else 0
    return StageBudget(stage, layers, weights.bytes, peak.bytes, non_torch, graphs, available, components, held)


def _weight_parts(weights, src: str) -> tuple[Component, ...]:
    """The tensors and what the caching allocator's blocks hold beyond them (serving/weight_blocks.py)."""
    if not weights.block_excess:
        return ()
    return (component("weights", "Parameters and buffers", weights.bytes - weights.block_excess,
                      weights.formula.replace(f"{IN_BLOCKS} (+{weights.block_excess:,} B)", ""),
                      f"{src} parallel layers and quantization methods' tensors (estimator/serving/weights.py)"),
            component("weights", "Caching allocator's whole blocks", weights.block_excess,
                      "the parameters' allocations replayed in construction order: a new segment of 10 MiB or more is "
                      "the request rounded up to 2 MiB, and a block keeps a rest of at most 1 MiB (memory_allocated "
                      "counts the block)",
                      "vLLM 0.11-0.33 DeviceMemoryProfiler (utils/mem_utils.py: max_memory_allocated after "
                      "empty_cache); torch c10/cuda/CUDACachingAllocator.cpp (estimator/serving/weight_blocks.py)"))


def _activation_parts(peak, src: str) -> tuple[Component, ...]:
    """The profile peak's buffers that are not the model's tensors, beside those tensors (profile_buffers.py)."""
    if not peak.blas_bytes and not peak.flush_bytes:
        return ()
    parts = [component("activation_peak", "Tensors of the profiling run",
                       peak.bytes - peak.blas_bytes - peak.flush_bytes, peak.formula,
                       f"{src} gpu_model_runner.py profile_run (estimator/serving/activations.py)"),
             component("activation_peak", "cuBLAS workspace (the run's first GEMM)", peak.blas_bytes,
                       f"{peak.blas_bytes:,} B, one handle and stream",
                       "PyTorch aten/src/ATen/cuda/CublasHandlePool.cpp (estimator/serving/profile_buffers.py)")]
    if peak.flush_bytes:
        parts.append(component("activation_peak", "Autotuner's L2 flush buffer (compiled MLP's first launch)",
                               peak.flush_bytes, f"{peak.flush_bytes:,} B: the GPU's L2 size",
                               "torch/_inductor/runtime/benchmarking.py InductorBenchmarker.benchmark_gpu "
                               "(estimator/serving/profile_buffers.py)"))
    return tuple(parts)


@dataclass(frozen=True)
class StageGraphs:
    bytes: int  # what the engine reports: 0.19's "took X GiB", or from 0.20 the estimate the budget gives up
    in_budget: bool
    held: int  # what the device holds after capturing: the pool, the driver memory, the capture stream's workspace
    formula: str
    parts: tuple[Component, ...]


def _cuda_graphs(arch: Architecture, r: Resolved, par: Parallel, act_bytes: int, layers: range, first: bool,
                 last: bool) -> StageGraphs:
    """What capturing leaves (up to 0.19, on top of the budget: capture_model's "took X GiB" is free memory before
    minus after): the shared pool, the graph executables' driver memory and the capture stream's cuBLAS workspace;
    or, where the version takes the graphs from the budget (0.20 on), what profile_cudagraph_memory returns as we
    model it (serving/cuda_graphs.py), while the device holds the same three. 0.20.0-0.25.0 profile on CUDA only
    (gpu_worker.py: current_platform.is_cuda(); ROCm's estimate stays 0); 0.26.0 on include ROCm (#44825, read in
    0.26.0, 0.27.0 and 0.33.0)."""
    model_max = model_max_capture(arch, r.release)
    graphs = graph_memory(arch, r.max_num_seqs, par.tp, act_bytes, r.gpu_id, model_max, r.max_num_batched_tokens,
                          layers, last)
    fusion = fusion_workspace(r.rules, r.gpu_id, arch, par.tp, par.pp, r.max_num_batched_tokens)
    driver = driver_memory(arch, r.max_num_seqs, par.tp, r.gpu_id, act_bytes, layers, first, last,
                           fusion.tokens if fusion else None, model_max, r.max_num_batched_tokens)
    # capture_model runs inside graph_capture(), which makes a new stream (distributed/parallel_state.py, 0.19.0);
    # the warm-up runs before each capture are its first GEMMs, so torch keeps one more cuBLAS workspace for it, where
    # a piece's GEMM goes through cuBLAS (not the CUTLASS / Marlin kernels of fp8, int8 and int4 weights)
    workspace = capture_blas_bytes(r.gpu_id, r.weight_format, arch.is_moe, arch.uses_mla)
    held = graphs.captured_pool + graphs.stream_held + driver.bytes + workspace
    pool_formula = (f"PIECEWISE {graphs.piecewise_pool / 2**20:.0f} MiB + FULL {graphs.full_pool / 2**20:.0f} MiB "
                    f"(captured one after the other: FA3's accumulators take new segments); {graphs.formula}")
    parts = (component("cuda_graphs", "Shared graph pool", graphs.captured_pool, pool_formula,
                       "vLLM compilation/cuda_graph.py, v1/attention/backends/flash_attn.py; PyTorch "
                       "CUDACachingAllocator.cpp (serving/cuda_graphs.py, serving/graph_pool.py)"),
             component("cuda_graphs", "Graph executables' driver memory", driver.bytes, driver.formula,
                       f"vLLM 0.19.0 compilation/backends.py split_graph, config/compilation.py "
                       f"(serving/graph_nodes.py); {driver.source}"),
             component("cuda_graphs", "Capture stream's segments after the first piece", graphs.stream_held,
                       f"{graphs.stream_held / 2**20:.0f} MiB: the last capture run's logit indices and picked row "
                       "(size 1) in the capture stream's small pool",
                       "vLLM 0.19.0 v1/worker/gpu_model_runner.py _dummy_run, compilation/cuda_graph.py gc_disable; "
                       "torch/cuda/graphs.py graph.__enter__ empty_cache (serving/graph_pool.py)"),
             component("cuda_graphs", "cuBLAS workspace of the capture stream", workspace,
                       f"{workspace:,} B, one more (handle, stream)",
                       "vLLM 0.19.0 v1/worker/gpu_model_runner.py capture_model (graph_capture's new stream, "
                       "_warmup_and_capture's eager runs on it); PyTorch CublasHandlePool.cpp "
                       "(serving/profile_buffers.py)"))
    rocm_skipped = r.gpu_id.startswith("mi") and r.release < ROCM_GRAPH_PROFILE
    if r.rules.cuda_graphs_in_budget and not rocm_skipped:
        estimate, formula = vllm_estimate(graphs, driver, workspace)
        return StageGraphs(estimate, True, held, f"{formula}; the device holds the pool + the capture stream's "
                           f"segments + the executables' driver memory + its cuBLAS workspace = {held / GiB:.2f} GiB",
                           ())
    note = " (not profiled on ROCm before 0.26: captured on top of the budget)" if rocm_skipped else ""
    return StageGraphs(held, False, held, f"pool {pool_formula} + the capture stream's segments "
                       f"{graphs.stream_held / 2**20:.0f} MiB + driver memory {driver.formula} + its cuBLAS workspace "
                       f"{workspace / 2**20:.0f} MiB{note}", parts)


def _non_torch(arch: Architecture, r: Resolved, par: Parallel) -> Component:
    """The profiling run's non-torch growth: a measured constant per release and layout, plus FlashInfer's
    all-reduce fusion workspace where the version builds one (serving/allreduce_fusion.py) and the NCCL
    communicator of the TP group that building it creates (serving/nccl_comm.py)."""
    value, source = overheads.non_torch_base(r.rules, par.tp, par.pp)
    base = component("non_torch", "Non-torch memory outside the modelled buffers", value,
                     "measured constant: cuBLAS, lazily loaded kernels, the CUDA-graph profile's leftovers", source)
    fusion = fusion_workspace(r.rules, r.gpu_id, arch, par.tp, par.pp, r.max_num_batched_tokens)
    if fusion is None:
        return base
    parts = [base, component("non_torch", "All-reduce fusion workspace", fusion.bytes, fusion.formula,
                             fusion.source)]
    nccl = tp_group_nccl(r.release)
    comm = communicator_bytes(par.tp, r.gpu_id, nccl) if nccl else None
    if comm is not None:
        parts.append(component("non_torch", "TP group's NCCL communicator (torch process group)", comm.bytes,
                               comm.formula + " (modelled)", comm.source))
    formula = " + ".join(p.formula for p in parts)
    if nccl and comm is None:  # the channel count is derived for H100/H200 SXM only
        formula += f" (the TP group's NCCL communicator is not modelled on {r.gpu_id})"
    return component("non_torch", "Non-torch memory", sum(p.bytes for p in parts), formula,
                     "; ".join(p.source for p in parts), tuple(parts))


def _draft(arch: Architecture, serving: Serving, r: Resolved, par: Parallel):
    spec = serving.speculative
    if spec is None:
        return None
    from .speculative import draft_for
    draft_arch = None
    if spec.draft_model:
        from ..models.loading import architecture_from_model  # a preset, a Hub id (fetched) or a config object
        draft_arch = architecture_from_model(spec.draft_model)
    return draft_for(arch, spec, r.weights, par.tp, par.ep, r.block_size, r.kv_bytes, draft_arch)


def _hybrid_block(arch: Architecture, serving: Serving, r: Resolved, par: Parallel):
    """A hybrid's attention block, grown until its page holds a recurrent state, and the state pages one request
    holds, by release, prefix caching and speculative decoding (recurrent_state.py)."""
    from .recurrent_state import plan
    layout = plan(arch, r.rules, r.gpu_id, par.tp, r.kv_bytes, r.weights.dtype_bytes, serving.block_size,
                  serving.prefix_caching, serving.speculative)
    return dataclasses.replace(r, block_size=layout.block_size), layout


def estimate_vllm(arch: Architecture, serving: Serving, par: Parallel, hardware: Hardware,
                  checkpoint: dict | None = None) -> ServingEstimate:
    if serving.mem_fraction_static is not None:
        raise ConfigError("serving.mem_fraction_static", serving.mem_fraction_static, "empty with vLLM",
                          "vLLM sizes its share with gpu_memory_utilization", ("serving.engine",))
    if serving.enable_multimodal is not None:
        raise ConfigError("serving.enable_multimodal", serving.enable_multimodal, "empty with vLLM", "SGLang's "
                          "--enable-multimodal; vLLM serves every modality unless limit_mm_per_prompt sets it to 0",
                          ("serving.engine",))
    pc = prefix_default.resolve(arch, serving, checkpoint)
    serving = dataclasses.replace(serving, prefix_caching=pc.on)  # what follows reads the engine's own choice
    r = dataclasses.replace(resolve(arch, serving, hardware, checkpoint), prefix_caching=pc.on,
                            prefix_caching_default=pc.engine_default, prefix_caching_note=pc.note)
    r, layout = _hybrid_block(arch, serving, r, par) if arch.is_hybrid else (r, None)
    gpu = hardware.device
    total = CUDA_REPORTED_TOTAL.get(gpu.id, gpu.capacity_bytes)
    requested = total * serving.gpu_memory_utilization
    budget = math.ceil(requested) if r.rules.version >= (0, 21) else int(requested)
    ranges = stage_layers(arch.num_layers, par.pp)
    draft = _draft(arch, serving, r, par)
    stages = tuple(_stage_budget(arch, r, serving, par, budget, s, layers, draft) for s, layers in enumerate(ranges))
    specs = kv_cache.layer_specs(arch, par.tp, r.block_size, r.kv_bytes, r.weights.dtype_bytes,
                                 *((layout.state_pages, layout.state_every) if layout else ()))
    eagle = serving.speculative is not None and serving.speculative.method in ("eagle", "eagle3")
    specs = kv_cache.without_hybrid_allocator(specs, r.rules.version, eagle)
    if draft is not None:  # the drafter's layers follow the target's, on the last stage
        specs += draft.kv_layers
        ranges = ranges[:-1] + (range(ranges[-1].start, len(specs)),)
    groups = kv_cache.kv_groups(specs, r.rules.version)
    in_flight = kv_cache.in_flight_tokens(r.max_num_batched_tokens, par.pp, r.rules.version)
    available = tuple(s.available for s in stages)
    cap = kv_cache.capacity(groups, ranges, available, r.max_model_len, in_flight, r.rules.kv_tokens_rule)
    ceiling = r.context_length or MAX_TOKENS
    longest = kv_cache.longest_model_len(groups, ranges, available, in_flight, ceiling, r.rules.version)
    limiting = min(range(len(stages)), key=lambda i: (available[i] // groups.block_bytes_on(ranges[i]), i))
    s = stages[limiting]
    device_total = (gpu.cuda_context_bytes + s.weights + s.activation + s.non_torch + s.graphs_held
                    + cap.kv_cache_bytes)
    notes = ("The profiling run's activation peak, the non-torch memory and the CUDA graphs are modelled from "
             "vLLM's source and public start-up logs; vLLM measures them on the GPU.", pc.note)
    notes += layout.notes if layout else ()
    effective = kv_cache.effective_concurrency(groups, cap, serving.shared_prefix_tokens or 0)
    return ServingEstimate("vllm", serving.engine_version or vllm_versions.CURRENT, r, budget, total, stages,
                           limiting, cap, longest, device_total, effective, gpu.cuda_context_bytes, notes)
