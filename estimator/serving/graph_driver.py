"""The driver memory of CUDA graph executables, per graph and per kernel node, as measured (one record per driver).

Outside the caching allocator (mem_get_info sees it, torch's reserved bytes do not), taken at instantiation in
2 MiB chunks and linear at scale: driver bytes = per_graph x graphs + per_node x kernel nodes. The per-node cost
depends on the kernel: the cuBLAS GEMM nodes cost about 1 KiB more than the elementwise ones (their parameter
blocks are larger), so each record keeps the two fits of its measurement apart; a chain mixing them (16 GEMMs and
32 elementwise kernels a graph), left out of both fits, lands 1.2% above their sum at 2,048 graphs
(tests/test_serving_graph_driver.py).

The kernels vLLM's graphs launch cost no more a node than these (cuda-graph-nodes, the same measurement for
vLLM-shaped nodes, kept as each record's node_kinds): cuBLAS bf16 GEMMs of a decoder layer's shape 3,540 B (the
small GEMM's 3,517), PyTorch's flash-attention forward and an Inductor-compiled Triton RMSNorm 2,333 and 2,322 B
(the elementwise kernels' 2,490), each at 111-114 KB a graph. So the constants stand for the GEMM, attention and
Triton nodes vLLM captures; what vLLM 0.19's logs print beyond the driver memory we count is not a dearer node.

A new driver or CUDA release is one more record in DRIVER_COSTS, measured by `python -m validation.gpu run --case
cuda-graphs` and `--case cuda-graph-nodes` (validation/gpu/graphs.py) and its records filed under
tests/data/measured/gpu/experiments/.
"""

from __future__ import annotations

from dataclasses import dataclass

RECORD = "tests/data/measured/gpu/experiments/cuda-graphs-h200.json"
NODES_RECORD = "tests/data/measured/gpu/experiments/cuda-graph-nodes-h200.json"


@dataclass(frozen=True)
class NodeKindCost:
    """One kind of vLLM-shaped kernel node as measured: graphs of 16 and 64 such launches (the record's fit)."""

    kind: str  # the record's kind (validation/gpu/graphs.py NODE_KINDS)
    launches: str  # what each node runs
    per_graph: int  # bytes per graph executable
    per_node: int  # bytes per kernel node (as the driver counts them: cuGraphGetNodes)


@dataclass(frozen=True)
class GraphDriverCost:
    driver: str  # the NVIDIA driver it was measured on
    cuda: str  # the CUDA runtime torch was built with
    gpu: str
    per_graph: int  # bytes per graph executable
    per_small_node: int  # bytes per kernel node of a kernel with a small parameter block (elementwise, Triton)
    per_large_node: int  # bytes per kernel node of a CUTLASS/cuBLAS kernel (GEMMs; FlashAttention taken alike)
    source: str
    node_kinds: tuple[NodeKindCost, ...] = ()  # the evidence that the two node costs hold for vLLM's kernels


H200_580 = GraphDriverCost(
    "580.159.04", "13.0", "NVIDIA H200",
    # least squares of the record's points, rounded to the byte: fit.elementwise (66 points; its per_graph
    # 110,614 B and per_node 2,490 B) and fit.gemm's per_node (36 points, 3,517 B; its per_graph 112,392 B)
    per_graph=110_614, per_small_node=2_490, per_large_node=3_517,
    source=(f"measured on an H200, driver 580.159.04, CUDA 13.0, torch 2.11.0+cu130 ({RECORD}: graphs of 1-1,024 "
            "kernel nodes captured into one shared pool, mem_get_info minus the pool's reserved bytes; "
            "validation/gpu/graphs.py)"),
    # least squares of NODES_RECORD's points per kind (24 each: 16 and 64 nodes a graph, 1-2,048 graphs), rounded
    node_kinds=(
        NodeKindCost("gemm_wide", "cuBLAS bf16 [256, 4096] x [4096, 4096] (a decoder layer's GEMM)", 111_136, 3_540),
        NodeKindCost("sdpa", "PyTorch SDPA flash forward on [1, 32, 256, 128] (two kernel nodes a call)", 113_680,
                     2_333),
        NodeKindCost("triton", "an Inductor-compiled Triton RMSNorm", 114_230, 2_322),
    ),
)

DRIVER_COSTS = (H200_580,)  # the newest last


def driver_cost() -> GraphDriverCost:
    """The record an estimate uses: the one measurement so far, whatever the run's driver (the published vLLM
    logs name none)."""
    return DRIVER_COSTS[-1]
