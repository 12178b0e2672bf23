"""The graph executables' driver memory: the measured constants against their record
(tests/data/measured/gpu/experiments/cuda-graphs-h200.json, validation/gpu/graphs.py), and the graphs and kernel
nodes vLLM 0.19 captures, counted by hand (estimator/serving/graph_nodes.py, cuda_graphs.driver_memory)."""

from __future__ import annotations

import json
from pathlib import Path

from estimator.models.loading import architecture_from_model
from estimator.models.presets import get_architecture
from estimator.serving.cuda_graphs import driver_memory
from estimator.serving.graph_driver import NODES_RECORD, RECORD, driver_cost
from estimator.serving.vllm_engine import estimate_vllm
from estimator.spec.hardware import Hardware
from estimator.spec.parallel import Parallel
from estimator.spec.serving import Serving

MiB = 2**20
DATA = json.loads((Path(__file__).parent.parent / RECORD).read_text())
COST = driver_cost()
PW_GRAPH, SMALL, LARGE = COST.per_graph, COST.per_small_node, COST.per_large_node


NODES = json.loads((Path(__file__).parent.parent / NODES_RECORD).read_text())


def _least_squares(points: list[dict]) -> tuple[float, float]:
    """driver bytes = per_graph x graphs + per_node x kernel nodes, no intercept (the normal equations)."""
    gg = sum(p["graphs"] ** 2 for p in points)
    nn = sum(p["kernel_nodes"] ** 2 for p in points)
    gn = sum(p["graphs"] * p["kernel_nodes"] for p in points)
    gy = sum(p["graphs"] * p["driver_bytes"] for p in points)
    ny = sum(p["kernel_nodes"] * p["driver_bytes"] for p in points)
    det = gg * nn - gn**2
    return (gy * nn - ny * gn) / det, (ny * gg - gy * gn) / det


def _points(kind: str, kernels: int) -> list[dict]:
    return [p for p in DATA["points"] if p["kind"] == kind and p["kernel_nodes_per_graph"] == kernels]


def test_constants_are_the_records_fits():
    fit = DATA["fit"]
    assert (COST.driver, COST.cuda) == (DATA["versions"]["driver"], DATA["versions"]["cuda"]) == ("580.159.04", "13.0")
    assert PW_GRAPH == round(fit["elementwise"]["per_graph_bytes"]) == 110_614
    assert SMALL == round(fit["elementwise"]["per_node_bytes"]) == 2_490
    assert LARGE == round(fit["gemm"]["per_node_bytes"]) == 3_517


def test_node_kinds_are_the_nodes_records_fits():
    """The vLLM-shaped nodes (cuda-graph-nodes-h200.json): each kind's constants are the least squares of its 24
    points (16 and 64 nodes a graph, 1-2,048 graphs), recomputed here, on the same driver as the constants."""
    assert (NODES["versions"]["driver"], NODES["versions"]["cuda"]) == (COST.driver, COST.cuda)
    assert [k.kind for k in COST.node_kinds] == ["gemm_wide", "sdpa", "triton"]
    for kind in COST.node_kinds:
        points = [p for p in NODES["points"] if p["kind"] == kind.kind]
        per_graph, per_node = _least_squares(points)
        assert len(points) == NODES["fit"][kind.kind]["points"] == 24
        assert (kind.per_graph, kind.per_node) == (round(per_graph), round(per_node))
        assert (kind.per_graph, kind.per_node) == (round(NODES["fit"][kind.kind]["per_graph_bytes"]),
                                                   round(NODES["fit"][kind.kind]["per_node_bytes"]))
    assert [(k.per_graph, k.per_node) for k in COST.node_kinds] == [(111_136, 3_540), (113_680, 2_333),
                                                                    (114_230, 2_322)]


def test_vllm_shaped_nodes_cost_no_more_than_the_constants():
    """A decoder layer's GEMM node costs the small GEMM's 3,517 B within 1% (3,540); the flash-attention and
    Inductor Triton nodes cost less than the elementwise 2,490 B (2,333, 2,322); graphs 111-114 KB against
    110,614 B. At 2,048 graphs of 64 launches the constants give 2,048 x (110,614 + 64 x 3,517) = 687,517,696 B
    of GEMM graphs against 692,060,160 measured (0.7% under) and 2,048 x (110,614 + 64 x 2,490) = 552,906,752 B of
    Triton graphs against 538,968,064 (2.6% over)."""
    gemm, sdpa, triton = COST.node_kinds
    assert abs(gemm.per_node / LARGE - 1) < 0.01
    assert sdpa.per_node < SMALL and triton.per_node < SMALL
    assert all(abs(k.per_graph / PW_GRAPH - 1) < 0.035 for k in COST.node_kinds)
    largest = {p["kind"]: p for p in NODES["points"] if p["graphs"] == 2048 and p["kernels"] == 64}
    assert 2048 * (PW_GRAPH + 64 * LARGE) == 687_517_696 and largest["gemm_wide"]["driver_bytes"] == 692_060_160
    assert 2048 * (PW_GRAPH + 64 * SMALL) == 552_906_752 and largest["triton"]["driver_bytes"] == 538_968_064
    # SDPA's call is two kernel nodes (the driver's count), both at the small cost
    assert largest["sdpa"]["kernel_nodes"] == 2048 * 128


def test_driver_memory_comes_in_2_mib_chunks_and_is_linear_at_scale():
    """Every point is a whole number of 2 MiB chunks (the first graphs fit in the probe graph's chunk: 0 bytes up to
    8 graphs); over each run's last three checkpoints (doubling) the bytes a further graph costs agree within 2%,
    so at vLLM's 1,700 graphs the chunks are noise and the cost is linear."""
    assert all(p["driver_bytes"] % (2 * MiB) == 0 for p in DATA["points"])
    runs = {(p["kind"], p["kernel_nodes_per_graph"]) for p in DATA["points"]}
    assert len(runs) == 10
    for run in runs:
        (g1, b1), (g2, b2), (g3, b3) = [(p["graphs"], p["driver_bytes"]) for p in _points(*run)[-3:]]
        assert abs(((b3 - b2) / (g3 - g2)) / ((b2 - b1) / (g2 - g1)) - 1) < 0.02, run


def test_gemm_nodes_cost_more_than_elementwise_ones():
    """At 2,048 graphs of 64 kernels: 692,060,160 B of cuBLAS GEMMs against 538,968,064 B of elementwise kernels
    (1 KiB a node more)."""
    gemm, elementwise = _points("gemm", 64)[-1], _points("elementwise", 64)[-1]
    assert gemm["graphs"] == elementwise["graphs"] == 2048
    per_node_gap = (gemm["driver_bytes"] - elementwise["driver_bytes"]) / gemm["kernel_nodes"]
    assert 1100 < per_node_gap < 1200 and 1000 < LARGE - SMALL < 1100


def test_the_mixed_chain_left_out_of_the_fits():
    """48 kernels a graph, 16 GEMMs and 32 elementwise (validation/gpu/graphs.py make_chain: gemm, add, mul):
    2,048 x (110,614 + 16 x 3,517 + 32 x 2,490) = 504,967,168 B against 499,122,176 measured (1.2% over)."""
    point = _points("mixed", 48)[-1]
    ours = point["graphs"] * (PW_GRAPH + 16 * LARGE + 32 * SMALL)
    assert ours == 504_967_168 and point["driver_bytes"] == 499_122_176
    assert abs(ours / point["driver_bytes"] - 1) < 0.013


LLAMA = get_architecture("llama-3.1-8b")


def test_llama_8b_graphs_and_nodes_by_hand():
    """51 sizes, each 33 PIECEWISE graphs (32 layers + 1) and one FULL graph (max_num_seqs 1024 >= 512).
    PIECEWISE a size: 4 GEMMs a layer (qkv, o, gate_up, down) = 128 large; 4 Triton kernels a layer (2 norms,
    rotary, SiLU x mul) + the embedding + the final norm = 130 small. FULL: + 32 KV-cache writes (small) and
    32 x 2 FA3 kernels (forward + split-KV combine, large)."""
    d = driver_memory(LLAMA, 1024, 1, "h100-80", 2, range(32), True, True, None)
    assert (d.graphs, d.small_nodes, d.large_nodes) == (51 * 34, 51 * (130 + 162), 51 * (128 + 192))
    assert d.bytes == 1734 * 110_614 + 14_892 * 2_490 + 16_320 * 3_517 == 286_283_196  # 0.27 GiB
    # no FA3 (A100): one attention kernel a layer in the FULL graph
    assert driver_memory(LLAMA, 1024, 1, "a100-80", 2, range(32), True, True, None).large_nodes == 51 * (128 + 160)


def test_inductor_schedules_the_counted_kernels_of_a_llama_piece():
    """validation/vllm/piece_kernels.py: inductor (the installed torch, combo kernels on, on fake H100 tensors)
    schedules a Llama-3.1-8B middle piece at 512 tokens as 4 cuBLAS GEMMs (o, gate_up, down, qkv), 4 Triton
    kernels (the two fused add + RMSNorm, SiLU x mul, the q/k rotary combo) and a nop (the attention's output
    buffer): graph_nodes.layer_nodes' (4 small, 4 large) for a dense layer."""
    import subprocess
    import sys

    run = subprocess.run([sys.executable, "-m", "validation.vllm.piece_kernels", "--tokens", "512", "--json"],
                         capture_output=True, text=True, timeout=600, cwd=Path(__file__).parent.parent)
    assert run.returncode == 0, run.stderr[-2000:]
    result = json.loads(run.stdout.strip().splitlines()[-1])
    kinds = [kind for kind, _ in result["nodes"]]
    assert kinds == ["ExternKernelSchedulerNode", "FusedSchedulerNode", "ExternKernelSchedulerNode", "SchedulerNode",
                     "ExternKernelSchedulerNode", "FusedSchedulerNode", "ExternKernelSchedulerNode",
                     "ForeachKernelSchedulerNode", "NopKernelSchedulerNode"]
    from estimator.serving.graph_nodes import layer_nodes
    assert (result["triton"], result["cublas"]) == layer_nodes(LLAMA, False) == (4, 4)


def test_pipeline_stage_and_tensor_parallel_counts():
    # PP 4, stage 0: 8 layers, the embedding but no final norm: 9 + 1 graphs; 33 / 41 small, 32 / 48 large
    first = driver_memory(LLAMA, 1024, 1, "h100-80", 2, range(8), True, False, None)
    assert (first.graphs, first.small_nodes, first.large_nodes) == (510, 51 * 74, 51 * 80)
    # TP 4 on H100: FlashInfer's fused all-reduce + RMSNorm up to 2 MiB / (4,096 x 2 B) = 256 tokens; the 16 sizes
    # above (272-512) add one all-reduce kernel each for 2 x 32 + 1 all-reduces, in both modes
    tp4 = driver_memory(LLAMA, 1024, 4, "h100-80", 2, range(32), True, True, 256)
    assert tp4.small_nodes == 14_892 + 16 * 65 * 2
    assert estimate_vllm(LLAMA, Serving(engine_version="0.19.0", max_model_len=8192), Parallel(tp=4),
                         Hardware("h100-80")).stages[0].components[-1].parts[1].bytes == tp4.bytes


def test_moe_layers_by_hand():
    """Qwen3-30B-A3B, 48 MoE layers: 2 norms + rotary + router top-k, align, W13, activation, W2, moe_sum = 9
    small and qkv, o, router = 3 large a layer; Qwen1.5-MoE's shared expert adds gate_up, down and its gate
    (large), its activation and the gate's mul (small)."""
    qwen3 = driver_memory(get_architecture("qwen3-30b-a3b"), 1024, 1, "h100-80", 2, range(48), True, True, None)
    assert (qwen3.graphs, qwen3.small_nodes, qwen3.large_nodes) == (51 * 50, 51 * (434 + 482), 51 * (144 + 240))
    record = next(r for r in json.loads((Path(__file__).parent / "data" / "serving" /
                                         "published_vllm_logs.json").read_text())["records"]
                  if r["id"] == "qwen1.5-moe-a2.7b-tp1-pp1-len8192")
    shared = driver_memory(architecture_from_model(record["hf_config"]), 1024, 1, "h100-80", 2, range(24), True,
                           True, None)
    assert (shared.small_nodes, shared.large_nodes) == (51 * (24 * 11 + 2) * 2 + 51 * 24, 51 * 24 * 6 * 2 + 51 * 48)


def test_not_counted_where_other_kernels_run():
    for name in ("gpt-oss-20b", "deepseek-v3"):  # MXFP4 MoE with sinks; MLA
        assert driver_memory(get_architecture(name), 1024, 1, "h100-80", 2, range(4), True, True, None).bytes == 0
    assert driver_memory(LLAMA, 1024, 1, "mi300x", 2, range(32), True, True, None).bytes == 0  # HIP: not measured


def test_019_prints_pool_plus_driver_and_020_holds_it():
    """0.19's cuda_graphs (capture_model's 'took X GiB') is the pool's segments (the pieces' 64 MiB + FA3's 256 MiB
    out_accum segment: tests/test_serving_cuda_graphs.py), the driver memory, the capture stream's 2 MiB small segment
    and its 32 MiB cuBLAS workspace, on top of the budget; 0.20 subtracts vLLM's own estimate (its samples: what the
    FULL capture adds to the pool + the largest FULL graph's driver memory, above PIECEWISE's first capture, then 50
    further captures of each mode at their graphs' driver memory), and the device total holds the same as 0.19."""
    def run(version):
        return estimate_vllm(LLAMA, Serving(engine_version=version, max_model_len=8192), Parallel(tp=1),
                             Hardware("h100-80"))
    old, new = run("0.19.0"), run("0.20.0")
    pool = (64 + 256) * MiB
    graphs = old.stages[0].components[-1]
    assert [p.bytes for p in graphs.parts] == [pool, 286_283_196, 2 * MiB, 32 * MiB]
    assert graphs.bytes == old.stages[0].cuda_graphs == pool + 286_283_196 + (2 + 32) * MiB  # 0.61 GiB
    s = new.stages[0]
    assert s.cuda_graphs == 256 * MiB + 1_189_258 + 50 * (4_424_138 + 1_189_258)
    assert new.device_total_bytes == (new.context_bytes + s.weights + s.activation + s.non_torch + pool
                                      + 286_283_196 + (2 + 32) * MiB + new.capacity.kv_cache_bytes)


def test_profiler_samples_by_hand():
    """profile_cudagraph_memory's samples for Llama-3.1-8B at TP 1 (every size has the same nodes): PIECEWISE
    33 x 110,614 + 130 x 2,490 + 128 x 3,517 = 4,424,138 B (4.2 MiB: the 0.19.0 log's profiler measured 6 MiB, in
    2 MiB chunks); FULL 110,614 + 162 x 2,490 + 192 x 3,517 = 1,189,258 B (the log: 6 MiB, not reproduced)."""
    d = driver_memory(LLAMA, 1024, 1, "h100-80", 2, range(32), True, True, None)
    assert d.samples == (4_424_138, 1_189_258, 4_424_138, 1_189_258)
    assert d.bytes == 51 * (4_424_138 + 1_189_258)
