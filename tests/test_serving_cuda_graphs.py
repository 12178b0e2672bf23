"""vLLM's CUDA-graph memory (estimator/serving/cuda_graphs.py): the capture sizes, FlashAttention 3's split-KV
pool of the FULL graphs against what vLLM 0.19.0's profiler measured, the profiler's own total, and where the
budget gives it up (0.20 on)."""

from __future__ import annotations

import functools
import json
from pathlib import Path

import pytest

from estimator.models.loading import architecture_from_model
from estimator.models.presets import get_architecture
from estimator.serving.cuda_graphs import (capture_sizes, graph_memory, model_max_capture, piecewise_bytes,
                                           profiler_total, split_kv_bytes)
from estimator.serving.vllm_engine import estimate_vllm
from estimator.spec.hardware import Hardware
from estimator.spec.parallel import Parallel
from estimator.spec.serving import Serving

MiB = 2**20
RECORDS = {r["id"]: r for r in json.loads((Path(__file__).parent / "data" / "serving" /
                                           "published_vllm_logs.json").read_text())["records"]}
# "Estimated FULL CUDA graph memory: X MiB first-capture + (51-1) x Y MiB per-graph" (DEBUG), vLLM 0.19.0 on
# H100, llm-d-planner PR #205's sweep (github.com/jgchn/llm-d-planner at d3121e05, accuracy/results/v0.19.0/logs/)
FULL_FIRST_CAPTURE = [
    ("llama-3.1-8b", 1, 260, "meta-llama-llama-3-1-8b---h100-80gb--tp1pp1dp1--8192.log"),
    ("llama-3.1-8b", 2, 132, "meta-llama-llama-3-1-8b---h100-80gb--tp2pp1dp1--8192.log"),
    ("llama-3.1-8b", 4, 70, "meta-llama-llama-3-1-8b---h100-80gb--tp4pp1dp1--8192.log"),
    ("qwen2.5-7b", 1, 228, "qwen-qwen2-5-7b-instruct--h100-80gb--tp1pp1dp1--8192.log"),
    ("qwen2.5-7b", 2, 116, "qwen-qwen2-5-7b-instruct--h100-80gb--tp2pp1dp1--8192.log"),
    ("qwen2.5-7b", 4, 60, "qwen-qwen2-5-7b-instruct--h100-80gb--tp4pp1dp1--8192.log"),
    ("phi-4", 1, 328, "microsoft-phi-4--h100-80gb--tp1pp1dp1--8192.log"),
    ("gemma-2-2b-tp1-pp1-len8192", 1, 134, "google-gemma-2-2b-it--h100-80gb--tp1pp1dp1--8192.log"),
    ("gemma-2-9b-tp1-pp1-len8192", 1, 262, "google-gemma-2-9b-it--h100-80gb--tp1pp1dp1--8192.log"),
]


def _architecture(name):
    """A bundled preset, or the HF config a published record carries (tests/data/serving/published_vllm_logs.json)."""
    if name in RECORDS:
        return architecture_from_model(RECORDS[name]["hf_config"])
    return get_architecture(name)


def test_capture_sizes_by_hand():
    """1, 2, 4, 8-248 by 8, 256-512 by 16: 3 + 31 + 17 = 51 (the 0.19 logs: 'PIECEWISE=51 (largest=512)')."""
    assert len(capture_sizes(1024)) == 51 and capture_sizes(1024)[-1] == 512
    # max_num_seqs 128: up to 256 -> 3 + 31 + 1; FULL (uniform decode) only up to 128: 3 + 16
    assert len(capture_sizes(128)) == 35
    graphs = graph_memory(get_architecture("llama-3.1-8b"), 128, 1, 2, "h100-80")
    assert (graphs.piecewise_captures, graphs.full_captures) == (35, 19)
    # the pool replayed (serving/graph_pool.py): PIECEWISE at 256 tokens holds its 4 MiB tensors in a 20 MiB segment,
    # its 2 MiB k in a small one and the 14 MiB gate-up output in its own; at 248 the 3.9 MiB requests no longer fit
    # the freed blocks as they lie and take a second 20 MiB segment (56 MiB); FULL at 128 tokens: FA3's out_accum
    # (32 x 32 heads x 128 x 128 x 4 B = 64 MiB) takes its own segment, and the 1 MiB hidden-size tensors are small-pool
    # requests (<= kSmallSize), which take two more 2 MiB small segments
    assert graphs.piecewise_pool == (20 + 2 + 14 + 20) * MiB
    assert graphs.full_pool == (64 + 2 + 2) * MiB == 32 * 128 * 32 * 128 * 4 + 4 * MiB
    # gpt-oss raises the largest size to 1024 from 0.19 (GptOssForCausalLMConfig): 3 + 31 + 49 = 83, as its log prints
    gpt_oss = get_architecture("gpt-oss-20b")
    assert len(capture_sizes(1024, model_max_capture(gpt_oss, (0, 19)), 8192)) == 83
    assert model_max_capture(gpt_oss, (0, 11)) is None and model_max_capture(get_architecture("llama-3.1-8b"), (0, 33)) is None


@pytest.mark.parametrize("model, tp, printed_mib, log", FULL_FIRST_CAPTURE)
def test_split_kv_pool_matches_the_profiler(model, tp, printed_mib, log):
    """32 splits x 512 tokens x heads a rank x (head_dim + 1) x 4 B; the profiler's figure is 2-6 MiB more (the
    caching allocator rounds each of the two buffers up to 2 MiB, plus the capture's own small tensors)."""
    ours = split_kv_bytes(_architecture(model), tp, 512) / MiB
    assert ours + 1 <= printed_mib <= ours + 6, (ours, printed_mib)


def test_fa3_pool_by_hand_and_where_it_applies():
    """The pool replayed through the caching allocator (serving/graph_pool.py) at 512 tokens, Llama-3.1-8B in bf16:
    the first piece's residual, q, qkv (6 MiB) and attention output, 18 MiB of 1-10 MiB requests, share one 20 MiB
    segment (kLargeBuffer) and k (exactly 1 MiB, kSmallSize) takes a 2 MiB small segment; the MLP piece's gate-up
    (28 MiB) and SiLU output (14 MiB) each take a segment of their own (>= kMinLargeAlloc) and every other request
    reuses freed blocks: 64 MiB reserved, against 58 MiB held at once (the attention output and residual the caller
    holds, the o_proj output, the normed input kept for the down projection, 28 + 14). FULL at 512: FA3's out_accum
    (32 splits x 32 heads x 512 x 128 x 4 B = 256 MiB) takes a new segment; softmax_lse (64 KiB) and lse_accum
    (2 MiB) fit blocks the pieces freed."""
    llama = get_architecture("llama-3.1-8b")
    pool = graph_memory(llama, 1024, 1, 2, "h100-80")
    assert (pool.piecewise_pool, pool.live) == ((20 + 2 + 28 + 14) * MiB, (4 + 4 + 4 + 4 + 28 + 14) * MiB)
    assert pool.full_pool == 32 * 512 * 32 * 128 * 4 == 256 * MiB
    assert pool.captured_pool == pool.pool == 320 * MiB
    # the live-tensor figure this module took before: the MLP piece's o + 2h + 3I = 55,296 a token (54 MiB)
    assert piecewise_bytes(llama, 1, 512, 2) == 512 * 55296 * 2
    # the capture stream after the first piece's empty_cache: _dummy_run's 512 picked rows of 4,096 x 2 B (4 MiB, a
    # 20 MiB segment) on the last stage and its logit indices (a 2 MiB small segment); capture_model's last capture
    # (size 1) picks one row, a small request
    assert (pool.stream, pool.stream_held) == (22 * MiB, 2 * MiB)
    middle = graph_memory(llama, 1024, 1, 2, "h100-80", layers=range(8, 16), last=False)
    assert (middle.piecewise_pool, middle.full_pool, middle.stream) == (64 * MiB, 256 * MiB, 2 * MiB)
    assert graph_memory(llama, 1024, 1, 2, "a100-80").full_pool == 0  # FA3 is sm90 only: FULL reuses the pool
    assert graph_memory(get_architecture("gpt-oss-20b"), 1024, 2, 2, "h100-80").full_pool == 0  # sinks
    # a routed MoE layer's piece keeps its boundary tensors: Qwen3-30B-A3B's q and attention output (4 MiB each), qkv
    # (5 MiB), residual and normed input (2 MiB each) fill one 20 MiB segment and need a second; k (0.5 MiB) a small one
    moe = graph_memory(get_architecture("qwen3-30b-a3b"), 1024, 1, 2, "h100-80")
    assert moe.piecewise_pool == (20 + 20 + 2) * MiB


@pytest.mark.parametrize("first, per_graph, captures, printed_gib", [
    ({"PIECEWISE": 138, "FULL": 260}, {"PIECEWISE": 6, "FULL": 6}, 51, 0.84),  # Llama-3.1-8B TP 1
    ({"PIECEWISE": 156, "FULL": 328}, {"PIECEWISE": 6, "FULL": 4}, 51, 0.81),  # Phi-4
    ({"PIECEWISE": 128, "FULL": 8}, {"PIECEWISE": 6, "FULL": 6}, 83, 1.09),  # gpt-oss-20b TP 2
    ({"PIECEWISE": 112, "FULL": 256}, {"PIECEWISE": 1, "FULL": 4}, 51, 0.49),  # Llama-3.1-8B PP 4
])
def test_profiler_total_reproduces_the_logged_estimate(first, per_graph, captures, printed_gib):
    """'Estimated CUDA graph memory: X GiB total' from the same log's per-mode lines (0.19.0 logs as above)."""
    total = profiler_total({m: v * MiB for m, v in first.items()}, {m: v * MiB for m, v in per_graph.items()},
                           dict.fromkeys(first, captures))
    assert round(total / 2**30, 2) == printed_gib


PROFILED = [r for r in RECORDS.values() if "cuda_graphs_profile" in r["printed"]]


def test_every_logged_profile_gives_its_printed_estimate():
    """The per-mode samples of the 33 published 0.19.0 logs that print them (the records' cuda_graphs_profile,
    read by validation/vllm/published_logs.py) give each log's 'Estimated CUDA graph memory: X GiB total' by
    profile_cudagraph_memory's rule; every pipeline stage is profiled, the TP ranks alike."""
    assert len(PROFILED) == 33
    for record in PROFILED:
        profile = record["printed"]["cuda_graphs_profile"]
        assert len(profile) == record["pp"]
        rank0 = profile[0]
        total = profiler_total({m: v["first_capture_mib"] * MiB for m, v in rank0.items()},
                               {m: v["per_graph_mib"] * MiB for m, v in rank0.items()},
                               {m: v["captures"] for m, v in rank0.items()})
        assert round(total / 2**30, 2) == record["printed"]["cuda_graphs_estimated_gib"], record["id"]
    # Llama-3.1-8B at PP 4: the last stage's PIECEWISE first capture is 20 MiB above the others'
    pp4 = [s["PIECEWISE"]["first_capture_mib"] for s in RECORDS["llama-3.1-8b-tp1-pp4-len8192"]["printed"]
           ["cuda_graphs_profile"]]
    assert pp4 == [112, 112, 112, 132]


def _llama(version):
    return estimate_vllm(get_architecture("llama-3.1-8b"), Serving(engine_version=version, max_model_len=8192),
                         Parallel(tp=1), Hardware("h100-80"))


def test_budget_gives_up_the_estimate_from_0_20():
    """0.19: captured after the KV cache is sized (on top of the budget); 0.20: the budget gives up
    profile_cudagraph_memory's estimate (envs.py VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS defaults to 1,
    gpu_worker.py determine_available_memory): ours is the larger first capture (FULL: FA3's 256 MiB out_accum segment
    + its graph's 1,189,258 B of driver memory, above PIECEWISE's pool 64 MiB + the capture stream's 22 MiB + 32 MiB
    cuBLAS workspace + 4,424,138 B) + 50 further captures of each mode at their graphs' driver memory (PIECEWISE
    4,424,138 B, FULL 1,189,258 B: tests/test_serving_graph_driver.py) = 550,294,514 B. 0.19 prints what capturing
    leaves: the pool's 64 + 256 MiB (test_fa3_pool_by_hand_and_where_it_applies), the capture stream's 2 MiB small
    segment, the executables' driver memory (286,283,196 B: tests/test_serving_graph_driver.py) and the capture
    stream's 32 MiB cuBLAS workspace; the device holds the same in either release."""
    old, new = _llama("0.19.0").stages[0], _llama("0.20.0").stages[0]
    held = (64 + 256 + 2 + 32) * MiB + 286_283_196
    assert old.cuda_graphs == held == old.graphs_held == new.graphs_held == 657_479_100
    assert old.available == _llama("0.19.0").budget_bytes - old.weights - old.activation - old.non_torch
    assert new.cuda_graphs == 256 * MiB + 1_189_258 + 50 * (4_424_138 + 1_189_258) == 550_294_514
    assert new.available == (_llama("0.20.0").budget_bytes - new.weights - new.activation - new.non_torch
                             - new.cuda_graphs)


def test_rocm_profiles_the_graphs_from_0_26():
    """0.20.0-0.25.0 gpu_worker.py profile the graphs on CUDA only (ROCm's estimate stays 0, the graphs are captured
    on top of the budget); 0.26.0 on include ROCm (#44825). No FA3 on ROCm: the pool is the pieces' 64 MiB of segments
    (the same caching allocator rules, hipified); HIP graphs' driver memory was not measured (0, so each further
    capture is at the 1 MiB floor); MI300X's hipBLAS workspace is 128 MiB, in the PIECEWISE first capture of 0.26's
    profiler too, with the capture stream's 22 MiB (the picked rows' 20 MiB segment and a small one); what capturing
    leaves holds 2 MiB of it (the last capture picks one row)."""
    def stage(version):
        e = estimate_vllm(get_architecture("llama-3.1-8b"), Serving(engine_version=version, max_model_len=8192),
                          Parallel(tp=1), Hardware("mi300x"))
        return e, e.stages[0]
    (e25, s25), (e26, s26) = stage("0.25.0"), stage("0.26.0")
    assert s25.available == e25.budget_bytes - s25.weights - s25.activation - s25.non_torch
    assert s25.cuda_graphs == (64 + 2 + 128) * MiB == s26.graphs_held
    assert s26.cuda_graphs == (64 + 22 + 128) * MiB + 100 * MiB
    assert s26.available == e26.budget_bytes - s26.weights - s26.activation - s26.non_torch - s26.cuda_graphs


class _Recorder:
    """A pool that records graph_pool.forward's calls: ("malloc", bytes) and ("free", bytes)."""

    def __init__(self):
        self.calls, self.sizes = [], {}

    def malloc(self, nbytes):
        self.calls.append(("malloc", nbytes))
        self.sizes[len(self.sizes)] = nbytes
        return len(self.sizes) - 1

    def free(self, block):
        self.calls.append(("free", self.sizes[block]))


@functools.lru_cache(maxsize=1)
def _generated_pieces() -> dict[str, list[tuple]]:
    """The allocations and frees of inductor's code for vLLM 0.19's Llama pieces, at TP 1 and with the TP all-reduce
    (validation/vllm/piece_allocations.py, run once in its own process: it compiles with inductor on CPU)."""
    import subprocess
    import sys

    pieces = ("first", "middle", "last", "first_tp", "middle_tp", "last_tp")
    run = subprocess.run([sys.executable, "-m", "validation.vllm.piece_allocations", "--piece", *pieces, "--symbolic",
                          "--json"], capture_output=True, text=True, timeout=900, cwd=Path(__file__).parent.parent)
    assert run.returncode == 0, run.stderr[-2000:]
    calls = json.loads(run.stdout.strip().splitlines()[-1])
    return {piece: [tuple(call) for call in calls[piece]] for piece in pieces}


def generated(piece: str) -> list[tuple]:
    return _generated_pieces()[piece]


def test_replayed_pieces_are_inductors():
    """serving/graph_pool.py's sequence for Llama-3.1-8B at 512 tokens is what inductor's generated code requests
    (validation/vllm/piece_allocations.py: the installed torch's wrapper code for vLLM 0.19's pieces, the token
    dimension a symbol as vLLM compiles them, taken at 512): the first piece
    asks for the residual, the normed input (reused as q), qkv, k and the output buffer; a middle piece for the o_proj
    output (reused as the next output buffer), the normed input (reused for the down projection and as the residual),
    gate-up and SiLU output (freed), then the next normed input, qkv and k; the last piece the same MLP buffers and
    the final norm's output. Between them the split module frees the layer's q, k and qkv after its attention call,
    and the previous output buffer and residual after the piece."""
    from estimator.serving import graph_pool

    llama, pool = get_architecture("llama-3.1-8b"), _Recorder()
    graph_pool.forward(pool, llama, graph_pool.widths(llama, 1, 2), 1, 512, range(2), True)
    first, between, middle, after = pool.calls[:5], pool.calls[5:8], pool.calls[8:17], pool.calls[17:19]
    assert first == generated("first")
    assert middle == generated("middle")
    assert between == [("free", 4 * MiB), ("free", 1 * MiB), ("free", 6 * MiB)]  # q, k, qkv
    assert after == [("free", 4 * MiB), ("free", 4 * MiB)]  # the previous output buffer and residual
    # the last layer's piece ends the model: its output (the normed buffer) is a weak reference, freed at once
    assert pool.calls[19:22] == between and pool.calls[22:29] == generated("last")
    assert pool.calls[29:] == [("free", 4 * MiB)] + after


def test_replayed_tp_pieces_are_inductors():
    """At TP > 1 (serving/graph_pool.py _reduced_layer) against inductor's code for the pieces with vLLM's out-of-place
    all_reduce op (validation/vllm/piece_allocations.py first_tp / middle_tp / last_tp, at TP 1's widths so that the
    code is Llama-3.1-8B's): the embedding's all-reduce output is the residual and the lookup's buffer the normed input
    (the same requests as at TP 1); a middle piece asks for the o_proj output, its all-reduce output (the residual),
    gate-up and SiLU (freed), the down projection's all-reduce output (the next residual; the o_proj buffer is reused
    for the normed input, the down projection and the next normed input), then qkv and k, and keeps the first
    all-reduce output as the next attention output buffer; the last piece frees the o_proj buffer and the first
    output and returns the second."""
    from estimator.serving import graph_pool

    llama, pool = get_architecture("llama-3.1-8b"), _Recorder()
    graph_pool.forward(pool, llama, graph_pool.widths(llama, 1, 2), 1, 512, range(2), True, reduced=True)
    assert pool.calls[:5] == generated("first_tp")
    assert pool.calls[5:8] == [("free", 4 * MiB), ("free", 1 * MiB), ("free", 6 * MiB)]  # q, k, qkv
    assert pool.calls[8:17] == generated("middle_tp")
    assert pool.calls[17:19] == [("free", 4 * MiB), ("free", 4 * MiB)]  # the previous output buffer and residual
    # the last piece frees the o_proj buffer and the first output inside it; then its output (a weak reference), the
    # layer's attention output buffer and residual go
    assert pool.calls[19:22] == [("free", 4 * MiB), ("free", 1 * MiB), ("free", 6 * MiB)]
    assert pool.calls[22:31] == generated("last_tp") and pool.calls[31:] == [("free", 4 * MiB)] * 3
    # the all-reduce outputs fit the pieces' 20 MiB segment: Llama-3.1-8B's pool at TP 2 and 4 is what it was without
    # them (56 and 44 MiB)
    assert graph_memory(llama, 1024, 2, 2, "h100-80").piecewise_pool == (20 + 2 + 14 + 20) * MiB


def _profiled(record: dict, stage: int):
    """Our graph pool, driver memory and capture-stream workspace for one pipeline stage of a published record."""
    from estimator.serving.allreduce_fusion import fusion_workspace
    from estimator.serving.cuda_graphs import driver_memory
    from estimator.serving.profile_buffers import capture_blas_bytes
    arch = _architecture(record["id"]) if "hf_config" in record else get_architecture(record["model"])
    tp, pp = record["tp"], record["pp"]
    e = estimate_vllm(arch, Serving(**record["serving"]), Parallel(tp=tp, pp=pp), Hardware(record["gpu"]))
    r, layers, last = e.resolved, e.stages[stage].layers, stage == pp - 1
    args = (model_max_capture(arch, r.release), r.max_num_batched_tokens)
    graphs = graph_memory(arch, r.max_num_seqs, tp, r.weights.dtype_bytes, record["gpu"], *args, layers, last)
    fusion = fusion_workspace(r.rules, r.gpu_id, arch, tp, pp, r.max_num_batched_tokens)
    driver = driver_memory(arch, r.max_num_seqs, tp, r.gpu_id, r.weights.dtype_bytes, layers, stage == 0, last,
                           fusion.tokens if fusion else None, *args)
    return graphs, driver, capture_blas_bytes(r.gpu_id, r.weight_format, arch.is_moe, arch.uses_mla)


SIXTEEN_BIT = [r for r in PROFILED if not any(word in r["id"] for word in ("weight", "fp8", "gpt-oss", "deepseek"))]


def test_piecewise_first_capture_against_the_logs():
    """'Estimated PIECEWISE CUDA graph memory: X MiB first-capture' (the records' cuda_graphs_profile, every pipeline
    stage) against ours: the pool's segments (serving/graph_pool.py) + the capture stream's segments + the graphs'
    driver memory + the 32 MiB cuBLAS workspace. Llama-3.1-8B in bf16 at TP 1 is 12.9-15.8 MiB short on every stage,
    the last stages included (their 20 MiB segment of picked rows is modelled), where the pool's live tensors (54 MiB)
    left 24.9-26.8 MiB on the first and middle stages and 45.8-47.8 on a last one. Over the 16-bit-weight logs at TP 1
    (not gpt-oss's MXFP4, not DeepSeek's MLA) ours is 0.4-22.3 MiB short (median 12.9; live tensors: 24.9-58.3, median
    47.8); at TP 2 and 4, whose pieces' out-of-place all-reduce outputs are replayed (they fit the segments already
    taken: test_replayed_tp_pieces_are_inductors; the fused all-reduce + RMSNorm is not), ours is 18.4 MiB above to 2.3
    below (Llama-3.1-8B's 96 and 84 MiB printed against 114 and 102)."""
    from statistics import median
    gaps, llama = {1: [], 2: []}, {}
    for record in SIXTEEN_BIT:
        for stage, printed in enumerate(record["printed"]["cuda_graphs_profile"]):
            graphs, driver, workspace = _profiled(record, stage)
            ours = graphs.piecewise_pool + graphs.stream + driver.samples[0] + workspace
            gap = round(printed["PIECEWISE"]["first_capture_mib"] - ours / MiB, 1)
            gaps[min(record["tp"], 2)].append(gap)
            if record["id"].startswith("llama-3.1-8b-tp1-pp") and record["id"].endswith("len8192"):
                llama.setdefault(record["pp"], []).append(gap)
    assert llama == {1: [15.8], 2: [13.8, 13.8], 4: [12.9, 12.9, 12.9, 12.9]}
    assert (len(gaps[1]), min(gaps[1]), median(gaps[1]), max(gaps[1])) == (19, 0.4, 12.9, 22.3)
    assert (len(gaps[2]), min(gaps[2]), max(gaps[2])) == (6, -18.4, 2.3)


def test_quantized_first_capture_has_no_cublas_workspace():
    """fp8, int8 and int4 weights run CUTLASS / Marlin GEMMs (vLLM kernels/scaled_mm: CutlassFP8ScaledMMLinearKernel
    below compute capability 100, CutlassInt8ScaledMMLinearKernel; Marlin for GPTQ), so no piece makes the capture
    stream's cuBLAS workspace (32 MiB on an H100); a MoE router or MLA's bmm stays a cuBLAS GEMM. The dense quantized
    logs' PIECEWISE first capture (records' cuda_graphs_profile) minus ours: Llama-3.1-8B fp8 / int8 / GPTQ 7.8, 21.8,
    35.8 MiB and Qwen2.5-7B fp8 / int8 2.3 and 22.3 (with the workspace: -24.2, -10.2, 3.8, -29.7, -9.7), in or near
    the 16-bit logs' 0.4-22.3 at TP 1; the fp8 KV cache keeps the workspace (1.8, 22.3)."""
    from estimator.serving.profile_buffers import capture_blas_bytes
    assert capture_blas_bytes("h100-80", "bf16", False, False) == 32 * MiB
    assert capture_blas_bytes("h100-80", "fp8", False, False) == 0
    assert capture_blas_bytes("h100-80", "fp8", True, False) == capture_blas_bytes("h100-80", "int8", False, True) \
        == 32 * MiB
    gaps = {}
    for record in PROFILED:
        if record["tp"] == 1 and record["pp"] == 1 and record["model"] in ("llama-3.1-8b", "qwen2.5-7b") \
                and record["id"].endswith(("weightfp8", "weightint8", "weightgptq_int4", "kvfp8")):
            graphs, driver, workspace = _profiled(record, 0)
            ours = graphs.piecewise_pool + graphs.stream + driver.samples[0] + workspace
            gaps[record["id"]] = round(record["printed"]["cuda_graphs_profile"][0]["PIECEWISE"]["first_capture_mib"]
                                       - ours / MiB, 1)
    assert gaps == {"llama-3.1-8b-tp1-pp1-len8192-kvfp8": 1.8, "llama-3.1-8b-tp1-pp1-len8192-weightfp8": 7.8,
                    "llama-3.1-8b-tp1-pp1-len8192-weightint8": 21.8,
                    "llama-3.1-8b-tp1-pp1-len8192-weightgptq_int4": 35.8,
                    "qwen2.5-7b-tp1-pp1-len8192-kvfp8": 22.3, "qwen2.5-7b-tp1-pp1-len8192-weightfp8": 2.3,
                    "qwen2.5-7b-tp1-pp1-len8192-weightint8": 22.3}


def test_full_first_capture_against_the_logs():
    """'Estimated FULL CUDA graph memory: X MiB first-capture' against ours: what the FULL capture adds to the pool
    the PIECEWISE captures left (FA3's out_accum segment; softmax_lse and lse_accum fit freed blocks) + its graph's
    driver memory. From 0.6 MiB above to 7.9 below over the 16-bit-weight logs that run FA3, every stage (the
    accumulators' 258 MiB taken whole, as before: 2.6 above to 5.9 below)."""
    gaps = []
    for record in SIXTEEN_BIT:
        for stage, printed in enumerate(record["printed"]["cuda_graphs_profile"]):
            graphs, driver, _ = _profiled(record, stage)
            if graphs.full_pool:
                ours = graphs.full_pool + driver.samples[1]
                gaps.append(round(printed["FULL"]["first_capture_mib"] - ours / MiB, 1))
    assert (len(gaps), min(gaps), max(gaps)) == (24, -0.6, 7.9)


def test_our_estimate_is_below_the_019_profilers_in_every_log():
    """What the 0.20+ budget gives up, as we model it, against 'Estimated CUDA graph memory: X GiB total' of the 33
    published 0.19.0 logs that print it (rank 0: the first pipeline stage): never above, 14-79% of it (median 61%).
    Where the kernels are counted (not gpt-oss, DeepSeek-V2-Lite) 23-79%: the further captures' driver memory is about
    half of what the logs' profiler measures (their per-graph samples, 1-26 MiB a capture size, come in 2 MiB chunks
    and are multiplied by 50); the first captures are the pool's segments (test_piecewise_first_capture_against_the_
    logs), so from 0.20 our KV cache is larger than vLLM's by about 0.1-1.3 GiB a rank."""
    from statistics import median

    from estimator.serving.cuda_graphs import vllm_estimate
    ratios, counted = [], []
    for record in RECORDS.values():
        printed = record["printed"].get("cuda_graphs_estimated_gib")
        if printed is None:
            continue
        graphs, driver, workspace = _profiled(record, 0)
        ours = vllm_estimate(graphs, driver, workspace)[0] / 2**30
        assert ours <= printed, (record["id"], ours, printed)
        ratios.append(ours / printed)
        if driver.bytes:
            counted.append(ours / printed)
    assert len(ratios) == 33 and len(counted) == 31
    assert (round(min(ratios), 2), round(median(ratios), 2), round(max(ratios), 2)) == (0.14, 0.61, 0.79)
    assert round(min(counted), 2) == 0.23  # Llama-3.1-8B at TP 2, whose log estimates 1.69 GiB (0.57 at TP 4)
