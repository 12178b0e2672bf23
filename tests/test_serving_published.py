"""Our vLLM estimate, term by term, against start-up logs published with their model, release, GPU and flags
(tests/data/serving/published_vllm_logs.json: 40 runs of vLLM 0.10.1 to 0.19.0 on H100 and A100, TP 1/2/4,
PP 2/4, dense, MoE, MLA, sliding window, fp8/int8/int4/MXFP4 weights, fp8 KV cache). Most come from one
public sweep run with DEBUG logging (llm-d-planner PR #205), which prints every rank's terms; the rest from
vLLM issue threads and a blog post.

Each printed term is held to 3% of the printed value (plus half its last printed digit) where the mechanism
behind it is modelled. A term we do not reproduce is in MISSES with the mechanism that makes it miss; those
cases are strict xfails, so a fix that makes one pass must move it out of the list.

In-sample terms: the non-torch constants of 0.15-0.19 at TP 1 and of a 0.19 multi-GPU worker have no formula in
vLLM's source and are read from the same sweep (serving/vllm_versions.py cites each), so their TP-1 and PP rows
check the constant, not a prediction; the TP > 1 rows of 0.19 add the modelled NCCL communicator and fusion
workspace to the PP-measured worker constant and are predictions.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path

import pytest

from estimator.models.loading import architecture_from_model
from estimator.models.presets import get_architecture, get_hf_config
from estimator.serving.vllm_engine import estimate_vllm
from estimator.spec.hardware import Hardware
from estimator.spec.parallel import Parallel
from estimator.spec.serving import Serving

GiB = 2**30
TOLERANCE = 0.03
HALF_DIGIT = {"gib": 0.005, "tokens": 0, "concurrency": 0.005, "ratio": 0}
DATA = json.loads((Path(__file__).parent / "data" / "serving" / "published_vllm_logs.json").read_text())
RECORDS = {r["id"]: r for r in DATA["records"]}

# --- the mechanisms behind the terms we do not reproduce ---------------------------------------------
NON_TORCH_TP = ("non-torch of Llama-3.1-70B FP8 at TP 4: 2.21 GiB against ours 2.09 (0.07 measured + 1.5 GiB fusion "
                "workspace + NCCL 2.27.5's TP communicator, 0.52 GiB, serving/nccl_comm.py). Not its FP8 kernels "
                "(CutlassFP8ScaledMMLinearKernel in the log): what the 0.19 sweep prints beyond ours grows with the "
                "layer count and the TP degree in every weight format (TP 2: 0.02-0.03 GiB for 24-32 layers, 0.05 for "
                "Qwen2.5-72B in bf16, 0.06 for the FP8 70B, 0.07 for the int8 70B, all 80 layers; TP 4: 0.04 for 28-32 "
                "layers, 0.12 for 80). The fusion workspace is the same for both (the logs' FlashInfer workspace: "
                "max_token_num 128 x hidden 8192 for the 70B, 256 x 4096 for the 8B; one workspace, the quant "
                "patterns reuse it: flashinfer_all_reduce.py get_fi_ar_quant_workspace). The custom all-reduce's IPC "
                "buffers and the symmetric-memory buffer are built with the TP group before the start-up snapshot "
                "(gpu_worker.py init_device) and have no per-layer part. A candidate, not established: 0.19 profiles "
                "the CUDA graphs inside memory_profiling, and custom_all_reduce.py capture() ends with "
                "register_graph_buffers, which hands every peer the IPC handles of the graph-pool blocks holding each "
                "captured all-reduce's input (2 a layer; it takes inputs under 8 MiB: Llama-8B's 496- and 512-token "
                "captures, the 70B's 496-token one); if the peers' mappings outlive clear_all_graphs and empty_cache, "
                "the driver keeps those blocks outside torch (the C++ side was not read: the wheel has no csrc; the "
                "CUDA driver API calls freeing an exported region before the importers close it undefined, "
                "cuIpcOpenMemHandle, so no documented rule says what stays). How much stays needs a GPU; no "
                "formula is modelled")
NON_TORCH_BASE = ("non-torch at TP 1 in 0.19: 0.27 GiB for Qwen3-30B-A3B against the 0.25 GiB constant (0.24-0.26 "
                  "GiB in the other 0.19 runs). Not the MoE's workspaces: 0.19 runs TritonExperts ('Using TRITON "
                  "backend for Unquantized MoE' in the log), whose workspaces come from v1/worker/workspace.py and "
                  "whose Triton kernels get any global scratch through triton_utils/allocation.py, both torch.empty "
                  "(so torch peak); the separate shared-experts stream is enabled for every MoE, and Qwen1.5-MoE "
                  "prints 0.25. What differs is the captured graphs: the log's per-graph CUDA-graph estimate is 10 "
                  "MiB in both modes against 4-8 MiB for Llama-3.1-8B and Qwen3-8B, and 0.19 runs that CUDA-graph "
                  "memory profile inside memory_profiling (gpu_worker.py), so what the driver keeps after "
                  "clear_all_graphs counts as non-torch. The sweep's TP-1 values rise with the layer count in dense "
                  "models too (0.24 GiB at 26-28 layers, 0.25 at 32-42, 0.26 at Gemma-3-27B's 62), which a constant "
                  "does not follow; at 48 layers that trend gives 0.25-0.26, so about 0.01-0.02 GiB is the MoE's own. "
                  "No source gives that driver memory; no formula is modelled")
GRAPHS = ("CUDA graphs in 0.19 ('Graph capturing finished ... took X GiB': free memory before minus after capturing "
          "every graph). Ours (serving/cuda_graphs.py, graph_pool.py, graph_nodes.py, graph_driver.py) is the pool's "
          "segments, replayed through the caching allocator (the pieces' 64 MiB, 20 + 2 + 28 + 14, then FA3's 256 MiB "
          "out_accum segment of the FULL graphs: 0.31 GiB for Llama-3.1-8B), the capture stream's small segment and "
          "cuBLAS workspace (0.03 GiB) and the graph executables' driver memory: 51 sizes x (32 + 1 "
          "PIECEWISE + 1 FULL) = 1,734 graphs, 14,892 small and 16,320 GEMM/attention kernel nodes at the H200 / "
          "driver 580.159.04 record's 110,614 B a graph, 2,490 and 3,517 B a node = 0.27 GiB: 0.61 GiB against 0.91. "
          "The printed value falls 17.1 MiB a layer from PP 1 to PP 2 to PP 4 (0.91, 0.65, 0.51 GiB for 32, 16, 8 "
          "layers), ours 8.2 MiB. Ours is 40-82% of the printed value (median 63%) where the kernels are counted. "
          "Checked and not the cause: the graph count (the logs' compile step stores pieces 0 to L, 33 for 32 layers "
          "and 81 for 80: L + 1 PIECEWISE graphs a size; 'PIECEWISE=51 ..., FULL=51'); a piece's kernels (inductor "
          "schedules a Llama middle piece as 4 GEMMs and 4 Triton kernels, validation/vllm/piece_kernels.py); FA3's "
          "kernels in a FULL layer (with the metadata builder's AOT scheduler metadata flash_api.cpp runs the forward"
          " and the split-KV combine, 2 as counted); the node cost of vLLM's kernel kinds (cuda-graph-"
          "nodes-h200.json, graph_driver.py node_kinds: GEMM 3,540 B, flash forward 2,333 B, Triton RMSNorm 2,322 B);"
          " nodes on distinct tensors (an unfiled probe of this session on the same H200 and driver: 256 graphs of 32"
          " add_ or 32 mm nodes took 48,234,496 and 56,623,104 B whether the nodes shared their tensors, differed "
          "within a graph, or every node of every graph had its own). Where it is short, per mode (the records' "
          "cuda_graphs_profile: the profiler's second-largest capture, in 2 MiB chunks, across the 33 logs): "
          "PIECEWISE grows 0.24 MiB a layer (1 MiB at 8 layers, 6 at 32, 10 at 48, 18-20 at 80) against our 0.13 (one"
          " graph and 8 nodes), FULL 0.13 MiB a layer (4-6 at 28-42, 10-14 at 80) against our 0.03 (11 nodes): both "
          "about 0.1 MiB a layer a capture above ours. The logs ran vllm/vllm-openai:v0.19.0, CUDA 12.9 (envs.py "
          "VLLM_MAIN_CUDA_VERSION, printed in each log; 0.15-0.19, 13.0 from 0.20) and torch 2.10, our record CUDA "
          "13.0 and torch 2.11: at NVIDIA cccl PR #3768's 'about 10 KB a kernel node' (February 2025) FULL's 11 nodes"
          " a layer would be 0.1 MiB; a CUDA 12.9 stack was not measured (the GPU machine has no cu129 torch). The "
          "fixed part is closer: the logs' PIECEWISE first capture is above ours (the pool's segments + the capture "
          "stream's segments after the first piece, 22 MiB on a last stage with _dummy_run's picked rows + its graphs "
          "+ the 32 MiB workspace) by 12.9-15.8 MiB on every Llama-3.1-8B pipeline stage (112-138 MiB printed; 25-48 "
          "with the live tensors' 54 MiB before), 0.4-22.3 MiB over the 16-bit-weight logs at TP 1, 2.3-35.8 over the "
          "dense fp8 / int8 / GPTQ ones at TP 1 (their CUTLASS / Marlin GEMMs make no cuBLAS workspace on the capture "
          "stream: profile_buffers.py capture_blas_bytes); at TP 2 and 4, the pieces' out-of-place all-reduce "
          "outputs replayed, ours is up to 18 MiB above (FlashInfer's fused all-reduce + RMSNorm not replayed). "
          "gpt-oss's MXFP4 MoE with sinks and "
          "DeepSeek-V2-Lite's MLA are not counted (2-3%, their pools alone; DeepSeek's MLA FULL first capture is 522 "
          "MiB in its log)")
FORWARD = ("the first pipeline stage's peak: 1.10 GiB printed under PP 2 and PP 4 against ours 0.92 (the compiled "
           "MLP's T x (o + 2h + 3I), the autotuner's 50 MiB L2 flush buffer and the 32 MiB cuBLAS workspace; "
           "serving/activations.py, serving/profile_buffers.py), which hold the middle stages and CodeLlama-7B within "
           "0.2%: the first stage holds 171-181 MiB more than a middle stage less its 128 MiB receive buffers, "
           "whatever the layer count. Read and ruled out in 0.19.0: profile_run/_dummy_run (gpu_model_runner.py) "
           "give the first rank no receive buffers and no sampler, and IntermediateTensors.__getitem__ with the "
           "logit indices returns None; memory_profiling resets the peak first (utils/mem_utils.py); "
           "cudagraph_copy_inputs is off, so no input clones (compilation/backends.py); the AOT save puts the "
           "example inputs on meta (compilation/caching.py); the log shows the pieces compiled afresh inside the "
           "profiling window, so inductor's compile-time benchmarks count. The candidate that they include the "
           "embedding table (benchmark_combo_kernel=True benchmarks each combo subkernel on random copies of its "
           "arguments, torch/_inductor/scheduler.py speedup_by_combo_kernel) is ruled out: torch 2.13's scheduler, "
           "run on fake CUDA tensors over the first piece (embedding, RMSNorm, qkv GEMM, rotary, output buffer; "
           "validation/vllm/combo_windows.py), fuses the gather into the RMSNorm kernel, the only kernel at its "
           "topological level, and the one combo window is the q/k rotary pair (qkv, cos/sin cache and outputs: "
           "208 MiB + the flush buffer), the same on the middle stages. The same holds under torch 2.10.0, which vLLM "
           "0.19.0 pins: its scheduler, run by the same script (torch 2.10.0+cu128, triton 3.6.0), fuses the gather "
           "into the RMSNorm kernel and forms the one q/k rotary window on both stages, with the token dimension "
           "static or a symbol as vLLM compiles it (--symbolic); read, its "
           "create_combo_kernel_nodes benchmarks each topological level's combinable nodes in chunks of 8 (2.13 "
           "adds distance windows, off by default, and a 5% peak-memory gate) and speedup_by_combo_kernel and "
           "benchmark_codegened_module (random get_args() copies, mutated arguments cloned) are as in 2.13; the "
           "runtime autotuner (triton_heuristics.py bench) clones only mutated arguments; the profiling compile is "
           "the range [1, 8192] (config/vllm.py _set_compile_ranges), not one size, so max_autotune and coordinate "
           "descent stay off (compiler_interface.py set_inductor_config) and no GEMM template is benchmarked with "
           "the gather as a prologue. Arithmetic only, no "
           "mechanism found: a copy of the embedding table (128,256 x 4,096 bf16, 1,002 MiB) beside two T x h bf16 "
           "buffers (128 MiB) is 1,130 MiB, 1.10 GiB as printed, and would hide under every single-stage peak "
           "(Llama-3.1-8B 1.89, CodeLlama-7B's 250 MiB table 0.77); with one buffer and the 50 MiB flush it is "
           "1.09; equally, ours + 128 MiB + a second 50 MiB flush buffer is 1,124 MiB (1.10), so the sizes do not "
           "single out a mechanism. Not modelled")
SMALL_REMAINDER = ("1.71 GiB of KV left of a 75 GiB budget, so the 3% is 0.05 GiB (0.07% of the budget): ours is "
                   "1.7672, 0.9 MiB past the edge (1.7663). The weights are the Marlin load replayed "
                   "(serving/marlin_blocks.py: 65.9651 GiB, to the digit what 0.10.1 printed for the same load in "
                   "vllm#23278; 0.10.1 and 0.11.0 load it alike: marlin_utils_fp4.py is the same file and "
                   "Mxfp4MoEMethod's Marlin branches are the same), so the rest lies in the profile's terms, which "
                   "this log does not print. The sort sampler's allocation list, read in PyTorch's SortStable.cu "
                   "(1,024 rows of 201,088 logits take segmented_sort_pairs: an int64 index input and cub's "
                   "temporary storage, alternate fp32 keys and int64 values + 255 B), is replayed in the caching "
                   "allocator's blocks (serving/sort_sampler.py): the fp32 tensors of 785.5 MiB hold 786 MiB blocks, "
                   "the int64 ones of 1,571 MiB 1,572 MiB, cub's rest is split off: 3 MiB more than the tensors, "
                   "which took ours from 4.0 MiB past the edge to 0.9. The same sampler code (vLLM 0.15.0, read) "
                   "gives Qwen3-14B a 5.6380 GiB peak where 0.15 and 0.16 print 5.64, so that peak holds at most "
                   "7.2 MiB beyond ours, not the 0.06 GiB. Left: 0.11's 0.16 GiB non-torch constant "
                   "(read from other models' logs) and the budget's base, total_memory, 79.19 GiB in the other H100 "
                   "logs (their third decimal alone is 4.9 MiB of budget at 0.95) and not one value across drivers: "
                   "deviceQuery prints 85,045,477,376 B (79.204 GiB) for an H100 80GB HBM3 under a CUDA 12.7 driver "
                   "(thamada/nvidia-smi nvsim/H100SXMx8_deviceQuery.py), 14 MiB of budget above ours, and public "
                   "torch prints (floored MiB) read 81,082 and 81,089 against our 81,090.56; this log's driver "
                   "(535.247.01) has none printed: each spread is more than the 0.9 MiB. The 0.10.1 record of the "
                   "same model and sampler misses the other way (ours 23 MiB beyond its edge, under its KV), so no "
                   "one term is established")
DEFAULTS_ASSUMED = ("the command is not quoted, and the record assumes vLLM's defaults (utilization 0.9, "
                    "max_num_batched_tokens 8192, 1,024 sequences). The issue's collect_env gives the run: an "
                    "'NVIDIA H100 PCIe' (114 SMs: they move only Marlin's workspace, 18 KiB over 36 layers, not "
                    "the printed 65.9651), torch 2.7.1+cu126, driver 570.148.08; no vLLM log gives a PCIe card's "
                    "total_memory, so the record keeps the SXM's 79.19 GiB (a public torch 2.0.1 print of an H100 "
                    "PCIe reads 81,008 MiB, 83 MiB below it, which would take ours 0.07 GiB further). 0.10.1's "
                    "profile path, read in its wheel, is 0.11.0's: profile_run's sampler step and "
                    "_dummy_sampler_run (the same dummy metadata), Sampler.forward's fp32 cast, apply_top_k_top_p "
                    "and random_sample (the same code), "
                    "determine_available_memory and memory_profiling (the same sum: weights + torch peak increase "
                    "+ non-torch increase), and torch 2.7.1's SortStable.cu takes the same segmented sort "
                    "(serving/sort_sampler.py), so 0.11.0's rules stand for it by source. With the weights at the "
                    "printed 65.9651 GiB (serving/marlin_blocks.py) our non-KV memory is 0.09 GiB more than the log "
                    "leaves (-2.2317 against -2.14 GiB; 23 MiB beyond the edge), while the 0.11.0 run of the same "
                    "model, whose flags are quoted, leaves 0.06 GiB less KV than ours: opposite signs with the same "
                    "sampler (now in the allocator's blocks, 4 MiB more here) and non-torch rules. It would pass "
                    "with a PCIe total 26 MiB above the SXM's, non-torch 23 MiB under 0.16 GiB on that stack, or "
                    "other flags; none is established")

MISSES: dict[tuple[str, str], str] = {}


def _miss(ids, terms, why):
    for rid in ids:
        for term in terms:
            MISSES[(rid, term)] = why


for _r in DATA["records"]:
    _miss([_r["id"]], ["cuda_graphs"], GRAPHS)
_miss(["llama-3.1-8b-tp1-pp2-len8192", "llama-3.1-8b-tp1-pp4-len8192"], ["activation_peak[stage 0]"], FORWARD)
_miss(["llama-3.1-70b-fp8-tp4-pp1-len8192"], ("non_torch",), NON_TORCH_TP)
_miss(["qwen3-30b-a3b-tp1-pp1-len8192"], ("non_torch",), NON_TORCH_BASE)
_miss(["gpt-oss-120b-v0.11.0-h100-mnbt1024"], ["kv_cache"], SMALL_REMAINDER)
_miss(["gpt-oss-120b-v0.10.1-h100-defaults"], ["kv_cache"], DEFAULTS_ASSUMED)


def _arch(record):
    """The preset's architecture and config, with the logged checkpoint's own config values where they differ
    (the record's config_overrides: the Qwen2.5 Instruct checkpoints' max_position_embeddings)."""
    if record.get("model"):
        checkpoint = {**get_hf_config(record["model"]), **record.get("config_overrides", {})}
        return get_architecture(record["model"]), checkpoint
    return architecture_from_model(record["hf_config"]), record["hf_config"]


@functools.lru_cache(maxsize=None)
def estimate(record_id: str):
    record = RECORDS[record_id]
    arch, checkpoint = _arch(record)
    return estimate_vllm(arch, Serving(**record["serving"]), Parallel(tp=record["tp"], pp=record["pp"]),
                         Hardware(record["gpu"]), checkpoint)


PER_STAGE = {"weights": ("weights", "weights_gib"), "activation_peak": ("activation", "activation_peak_gib"),
             "non_torch": ("non_torch", "non_torch_gib")}
SINGLE = {"cuda_graphs": ("cuda_graphs_gib", "gib"), "kv_cache": ("kv_cache_gib", "gib"),
          "kv_tokens": ("kv_cache_tokens", "tokens"), "max_concurrency": ("max_concurrency", "concurrency"),
          # the KV cache accounting alone (page sizes, layer groups, sliding windows, MLA), apart from the budget
          "tokens_per_kv_gib": ("kv_cache_tokens", "ratio")}
TERMS = tuple(PER_STAGE) + tuple(SINGLE)


def ours_and_printed(record: dict, term: str, stage: int) -> tuple[float, float, str]:
    """Our value and the printed one for a term (of one pipeline stage for the per-stage terms)."""
    e, p = estimate(record["id"]), record["printed"]
    if term in PER_STAGE:
        ours, printed = PER_STAGE[term]
        value = p["stages"][stage][printed] if "stages" in p else p[printed]
        return getattr(e.stages[stage], ours) / GiB, value, "gib"
    key, unit = SINGLE[term]
    ours = {"cuda_graphs": lambda: e.stages[0].cuda_graphs / GiB,  # rank 0 prints both
            "kv_cache": lambda: e.stages[0].available / GiB,
            "kv_tokens": lambda: e.capacity.tokens,
            "max_concurrency": lambda: e.capacity.max_concurrency,
            "tokens_per_kv_gib": lambda: e.capacity.tokens / (e.stages[0].available / GiB)}[term]()
    if term == "tokens_per_kv_gib":  # the printed GiB has two decimals: its rounding is part of the tolerance
        return ours, p[key] / p["kv_cache_gib"], unit
    return ours, p[key], unit


def _printed_stages(record: dict, term: str) -> list[int | None]:
    p = record["printed"]
    if term in PER_STAGE:
        if "stages" in p:
            return list(range(len(p["stages"])))
        return [0] if PER_STAGE[term][1] in p else []
    if term == "tokens_per_kv_gib" and not ("kv_cache_gib" in p and p.get("kv_cache_gib", 0) > 1):
        return []
    return [None] if SINGLE[term][0] in p else []


def _cases():
    for record in DATA["records"]:
        for term in TERMS:
            for stage in _printed_stages(record, term):
                name = term if stage is None or record["pp"] == 1 else f"{term}[stage {stage}]"
                why = MISSES.get((record["id"], name))
                marks = [pytest.mark.xfail(strict=True, reason=why)] if why else []
                yield pytest.param(record["id"], term, stage or 0, id=f"{record['id']}-{name}", marks=marks)


@pytest.mark.parametrize("record_id, term, stage", list(_cases()))
def test_term_matches_the_published_log(record_id, term, stage):
    ours, printed, unit = ours_and_printed(RECORDS[record_id], term, stage)
    assert abs(ours - printed) <= TOLERANCE * abs(printed) + HALF_DIGIT[unit], (term, ours, printed)


@pytest.mark.parametrize("record_id", [r["id"] for r in DATA["records"] if "defaults" in r["printed"]])
def test_batch_defaults_match_the_log(record_id):
    """'Defaulting max_num_batched_tokens to 8192 / max_num_seqs to 1024' (engine/arg_utils.py, H100)."""
    record = RECORDS[record_id]
    resolved = estimate(record_id).resolved
    printed = record["printed"]["defaults"]
    assert (resolved.max_num_batched_tokens, resolved.max_num_seqs) == (printed["max_num_batched_tokens"],
                                                                       printed["max_num_seqs"])


def test_cuda_total_is_what_the_logs_print():
    """Every H100 log prints 'total_memory=79.19GiB': the budget's base (vllm_engine.CUDA_REPORTED_TOTAL)."""
    from estimator.serving.vllm_engine import CUDA_REPORTED_TOTAL
    totals = {r["printed"]["total_gib"] for r in DATA["records"] if "total_gib" in r["printed"]}
    assert totals == {79.19} and round(CUDA_REPORTED_TOTAL["h100-80"] / GiB, 2) == 79.19


def test_records_cover_the_grid():
    """Releases 0.10 to 0.19, TP 1/2/4, PP 2 and 4, dense, MoE, MLA, sliding window, each quantized weight format
    the logs show, fp8 KV; and the passing cases cover weights, activation peak, KV GiB, tokens and concurrency
    for TP 1, 2 and 4 and PP 2."""
    records = DATA["records"]
    assert {r["vllm_version"][:4] for r in records} >= {"0.10", "0.11", "0.15", "0.16", "0.17", "0.18", "0.19"}
    assert {r["tp"] for r in records} >= {1, 2, 4} and {r["pp"] for r in records} >= {2, 4}
    formats = {r["serving"].get("weight_format") for r in records} | {"mxfp4", "fp8"}  # gpt-oss, the FP8 preset
    assert {"fp8", "int8", "gptq_int4", "mxfp4"} <= formats
    assert any(r["serving"].get("kv_cache_dtype") == "fp8" for r in records)
    models = {r.get("model") or r["hf_model"] for r in records}
    assert {"qwen3-30b-a3b", "gemma-3-27b", "gpt-oss-20b", "deepseek-ai/DeepSeek-V2-Lite-Chat"} <= models
    passing = {(RECORDS[c.values[0]]["tp"], RECORDS[c.values[0]]["pp"], c.values[1]) for c in _cases() if not c.marks}
    for layout in ((1, 1), (2, 1), (4, 1), (1, 2)):
        for term in ("weights", "activation_peak", "kv_cache", "kv_tokens", "max_concurrency"):
            assert (*layout, term) in passing, (layout, term)
