"""CUDA-graph memory outside the caching allocator: what the driver takes per graph executable and per
kernel node (issue 24).

vLLM captures about 1,700 graph executables (51 sizes x (1 FULL + layers + 1 PIECEWISE) for a 32-layer
model) into one shared pool; estimator/serving/cuda_graphs.py models the pool from vLLM's source, but no
source gives the driver memory of the executables themselves (NVIDIA cccl PR #3768: about 10 KB a kernel
node; an NVIDIA forum thread: about 65 KB on CUDA 11.2). This experiment measures it so that
`driver bytes = per_graph x graphs + per_node x kernel nodes` can be fitted, keyed on the driver version.

One sub-run (one process, one CUDA context) per (kind, kernels): a chain of `kernels` ops, each one kernel
launch that allocates nothing (in-place elementwise ops, `torch.mm(..., out=)` on bf16 [64, 256] x
[256, 256]), run three times on the capture stream first (kernel modules loaded, the cuBLAS workspace of
that stream made outside any graph), then:
- a probe graph captured with keep_graph=True: its nodes by type from the driver (cuGraphGetNodes), the
  seconds of capture_end and of instantiate (five times: each instantiate() replaces the executable),
  and `mem_get_info` around each, then reset (it also takes any first-capture cost out of what follows);
- graphs captured one after another into one shared pool (`capture_begin(pool=)`, as vLLM does: no
  torch.cuda.graph context, whose gc.collect and empty_cache per graph vLLM also skips), each
  instantiated by capture_end and kept; at 1, 2, 4, ... graphs: used bytes (mem_get_info) and the
  pool's reserved bytes above the point before the first capture. driver bytes = used - reserved;
- all graphs replayed once (does a first launch take more?), then reset (what comes back).
A sub-run stops early and says why at its deadline or when less than 10% of the device is free.
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import asdict, dataclass

import torch

from .devices import device_named

KINDS = ("elementwise", "gemm", "mixed")
# vLLM-shaped kernel nodes (the cuda-graph-nodes experiment): is a node's driver memory the same for a
# model's GEMMs (bf16 [256, 4096] x [4096, 4096]), FlashAttention's forward (SDPA's flash kernel on bf16
# [1, 32, 256, 128]) and an Inductor-generated Triton kernel (a compiled RMSNorm) as for the small ones above?
# On the CPU stand-in each link is one aten op of the same kind at a small shape (the Triton link: one
# in-place op; nothing is compiled there).
NODE_KINDS = ("gemm_wide", "sdpa", "triton")
ALL_KINDS = KINDS + NODE_KINDS
CHECKPOINTS = tuple(2**i for i in range(12))  # 1 .. 2048 graphs
NODE_CAP = 131_072  # kernel nodes a sub-run captures at most: at cccl's 10 KB a node, 1.3 GB
INSTANTIATIONS = 5  # the probe graph's instantiation timed this many times
FREE_FLOOR = 0.10  # stop when less than this share of the device is free
SHAPE, WIDTH = 64, 256


@dataclass(frozen=True)
class GraphRun:
    kind: str  # "elementwise", "gemm" or "mixed"
    kernels: int  # ops (kernel launches) per graph
    max_graphs: int

    @property
    def id(self) -> str:
        return f"{self.kind}-k{self.kernels}-g{self.max_graphs}"

    def args(self) -> tuple[str, ...]:
        return (self.kind, str(self.kernels), str(self.max_graphs))


def grid_run(kind: str, kernels: int) -> GraphRun:
    return GraphRun(kind, kernels, min(CHECKPOINTS[-1], NODE_CAP // kernels))


# Most informative first (a run cut short by its budget keeps them): elementwise chains across node counts
# (the per-node slope), then cuBLAS GEMMs, then a layer-like mix; 1024 nodes is a FULL graph's size (a 32-layer
# model at 15-30 kernels a layer), 1-64 a PIECEWISE piece's.
GRID = tuple(grid_run(k, n) for k, n in (("elementwise", 1), ("elementwise", 64), ("elementwise", 16),
                                          ("gemm", 16), ("elementwise", 4), ("elementwise", 256),
                                          ("elementwise", 1024), ("mixed", 48), ("gemm", 1), ("gemm", 64)))
# Two node counts a kind (its own per-graph and per-node fit), 16 and 64 as vLLM's pieces have (8-30 a layer)
NODE_GRID = tuple(grid_run(k, n) for k in NODE_KINDS for n in (16, 64))


def make_chain(kind: str, kernels: int, device: str):
    """A function launching `kernels` ops that allocate nothing, and the tensors it works on."""
    if kind in NODE_KINDS:
        return _node_chain(kind, kernels, device)
    a = torch.full((SHAPE, WIDTH), 0.5, device=device, dtype=torch.bfloat16)
    b = torch.empty_like(a)
    w = torch.full((WIDTH, WIDTH), 1.0 / WIDTH, device=device, dtype=torch.bfloat16)
    pair = [a, b]

    def gemm(i):  # a -> b -> a: one cuBLAS GEMM each
        torch.mm(pair[i % 2], w, out=pair[1 - i % 2])

    elementwise = (lambda i: a.add_(0.25), lambda i: a.mul_(0.5), lambda i: a.sub_(0.125),
                   lambda i: a.clamp_(-4.0, 4.0))
    cycles = {"elementwise": elementwise, "gemm": (gemm,),
              "mixed": (gemm, lambda i: a.add_(0.25), lambda i: a.mul_(0.5))}
    ops = cycles[kind]

    def chain():
        for i in range(kernels):
            ops[i % len(ops)](i)

    return chain, (a, b, w)


def _wide_gemm(device: str):
    rows, width = (256, 4096) if device == "cuda" else (8, 64)
    a = torch.full((rows, width), 0.5, device=device, dtype=torch.bfloat16)
    b, w = torch.empty_like(a), torch.full((width, width), 1.0 / width, device=device, dtype=torch.bfloat16)
    pair = [a, b]
    return (lambda i: torch.mm(pair[i % 2], w, out=pair[1 - i % 2])), (a, b, w)


def _flash(device: str):
    """SDPA's flash kernel called directly (one node; its output comes from the graph pool, which the
    points subtract); on the CPU its CPU kernel, one aten op."""
    shape = (1, 32, 256, 128) if device == "cuda" else (1, 2, 8, 16)
    q = torch.full(shape, 0.5, device=device, dtype=torch.bfloat16)
    op = (torch.ops.aten._scaled_dot_product_flash_attention if device == "cuda"
          else torch.ops.aten._scaled_dot_product_flash_attention_for_cpu)
    return (lambda i: op(q, q, q, 0.0, True)), (q,)


def _triton(device: str):
    """An RMSNorm compiled by Inductor into one Triton kernel writing in place (warmed up, so compiled,
    before any capture); on the CPU one in-place op."""
    x = torch.full((256, 4096) if device == "cuda" else (8, 64), 0.5, device=device, dtype=torch.bfloat16)
    if device != "cuda":
        return (lambda i: x.mul_(1.0)), (x,)

    def rms_norm_(t):
        t.copy_(t * torch.rsqrt(t.float().pow(2).mean(-1, keepdim=True) + 1e-6).to(t.dtype))

    compiled = torch.compile(rms_norm_, dynamic=False)
    return (lambda i: compiled(x)), (x,)


def _node_chain(kind: str, kernels: int, device: str):
    link, tensors = {"gemm_wide": _wide_gemm, "sdpa": _flash, "triton": _triton}[kind](device)

    def chain():
        for i in range(kernels):
            link(i)

    return chain, tensors


def _point(dev, graphs: int, base: dict, seconds: float) -> dict:
    dev.synchronize()
    used, reserved = dev.used_bytes() - base["used"], dev.reserved_bytes() - base["reserved"]
    return {"graphs": graphs, "used_bytes": used, "pool_bytes": reserved, "driver_bytes": used - reserved,
            "capture_seconds": round(seconds, 4)}


def probe_graph(dev, stream, chain) -> dict:
    """One graph kept (keep_graph=True): its nodes by type, and what capture_end and instantiate cost apart."""
    out: dict = {}
    try:
        graph = dev.graph(keep=True)
    except TypeError as error:  # a torch without keep_graph
        return {"error": f"keep_graph: {error}"}
    dev.synchronize()
    before = dev.used_bytes()
    with dev.on(stream):
        graph.capture_begin(pool=dev.pool())
        chain()
        start = time.perf_counter()
        graph.capture_end()
        out["capture_end_seconds"] = time.perf_counter() - start
    dev.synchronize()
    out["used_after_capture"] = dev.used_bytes() - before
    seconds = []
    for _ in range(INSTANTIATIONS):  # each instantiate() after the first replaces the executable
        start = time.perf_counter()
        graph.instantiate()
        dev.synchronize()
        seconds.append(time.perf_counter() - start)
        if len(seconds) == 1:
            out["used_after_instantiate"] = dev.used_bytes() - before
    out["instantiate_seconds"] = seconds
    out["used_after_instantiations"] = dev.used_bytes() - before
    try:
        out["node_types"] = dev.node_types(graph)
    except (OSError, RuntimeError, AttributeError) as error:
        out["node_types"], out["error"] = None, f"node count: {error}"
    graph.reset()
    dev.synchronize()
    out["used_after_reset"] = dev.used_bytes() - before
    return out


def capture_many(dev, stream, chain, run: GraphRun, deadline: float) -> tuple[list, list[dict], str, dict]:
    """Graphs captured into one shared pool until max_graphs, the deadline or the free-memory floor: the
    graphs, the points (at each checkpoint and where it stopped), why it stopped, the baseline."""
    pool, graphs, points, stopped = dev.pool(), [], [], "done"
    dev.synchronize()
    base = {"used": dev.used_bytes(), "reserved": dev.reserved_bytes()}
    floor = FREE_FLOOR * dev.total_bytes()
    seconds = 0.0
    with dev.on(stream):
        while len(graphs) < run.max_graphs and stopped == "done":
            graph = dev.graph()
            start = time.perf_counter()
            graph.capture_begin(pool=pool)
            chain()
            graph.capture_end()  # instantiates (keep_graph=False) and destroys the cudaGraph_t
            seconds += time.perf_counter() - start
            graphs.append(graph)
            n = len(graphs)
            checkpoint = n in CHECKPOINTS or n == run.max_graphs
            if time.perf_counter() > deadline:
                stopped = "deadline"
            elif (checkpoint or n % 64 == 0) and dev.total_bytes() - dev.used_bytes() < floor:
                stopped = "memory"
            if checkpoint or stopped != "done":
                points.append(_point(dev, n, base, seconds))
    return graphs, points, stopped, base


def replay_and_release(dev, graphs: list, base: dict) -> dict:
    for graph in graphs:
        graph.replay()
    after_replay = _point(dev, len(graphs), base, 0.0)
    for graph in graphs:
        graph.reset()
    after_reset = _point(dev, 0, base, 0.0)
    return {"after_replay": {k: after_replay[k] for k in ("used_bytes", "pool_bytes", "driver_bytes")},
            "after_reset": {k: after_reset[k] for k in ("used_bytes", "pool_bytes", "driver_bytes")}}


def measure_graphs(run: GraphRun, device: str, deadline_s: float) -> dict:
    """One sub-run: the probe graph, then graphs to max_graphs; `deadline_s` from the call."""
    deadline = time.perf_counter() + deadline_s
    dev = device_named(device)
    if device == "cuda":
        torch.cuda.init()
    chain, _tensors = make_chain(run.kind, run.kernels, device)
    stream = dev.stream()
    with dev.on(stream):
        for _ in range(3):  # kernel modules loaded, the cuBLAS workspace of this stream made
            chain()
    dev.synchronize()
    out = {"used_after_warm_up_bytes": dev.used_bytes()}  # the context, loaded modules, cuBLAS, the tensors
    try:  # the probe is extra: the graphs below are the measurement
        probe = probe_graph(dev, stream, chain)
    except Exception as error:  # noqa: BLE001 - recorded in the line, not hidden
        probe = {"error": f"{type(error).__name__}: {error}"}
    out |= {"probe": probe, "used_before_graphs_bytes": dev.used_bytes()}
    types = out["probe"].get("node_types")
    out["kernel_nodes_per_graph"] = types.get("kernel", 0) if types else run.kernels
    out["nodes_per_graph"] = sum(types.values()) if types else run.kernels
    out["nodes_counted_by"] = dev.counts_nodes_by if types else "the chain's design (the count failed)"
    graphs, points, stopped, base = capture_many(dev, stream, chain, run, deadline)
    for point in points:
        point["kernel_nodes"] = point["graphs"] * out["kernel_nodes_per_graph"]
    out |= {"points": points, "stopped": stopped, **replay_and_release(dev, graphs, base)}
    return out


def fit(points: list[dict]) -> dict | None:
    """driver_bytes = per_graph x graphs + per_node x kernel_nodes, least squares through the origin (each
    point is a delta from before the first capture); None where the points cannot separate the two (one
    node count per graph only)."""
    rows = [(p["graphs"], p["kernel_nodes"], p["driver_bytes"]) for p in points if p["graphs"] > 0]
    sgg = sum(g * g for g, _, _ in rows)
    sgn = sum(g * n for g, n, _ in rows)
    snn = sum(n * n for _, n, _ in rows)
    sgy = sum(g * y for g, _, y in rows)
    sny = sum(n * y for _, n, y in rows)
    det = sgg * snn - sgn * sgn
    if not rows or abs(det) <= 1e-9 * max(sgg * snn, 1):
        return None
    per_graph = (sgy * snn - sny * sgn) / det
    per_node = (sny * sgg - sgy * sgn) / det
    worst = max(abs(per_graph * g + per_node * n - y) for g, n, y in rows)
    return {"per_graph_bytes": per_graph, "per_node_bytes": per_node, "points": len(rows),
            "largest_residual_bytes": worst}


def main(argv: list[str]) -> int:
    """`python -m validation.gpu.graphs KIND KERNELS MAX_GRAPHS DEVICE DEADLINE_S`: one JSON line on stdout."""
    from .measure import versions
    from .devices import driver_api_version

    kind, kernels, max_graphs, device, deadline_s = argv
    if kind not in ALL_KINDS:
        raise SystemExit(f"kind {kind!r}: one of {', '.join(ALL_KINDS)}")
    run = GraphRun(kind, int(kernels), int(max_graphs))
    measured = measure_graphs(run, device, float(deadline_s))
    found = versions(device) | {"cuda_driver_api": driver_api_version() if device == "cuda" else None}
    print(json.dumps({"experiment": "cuda-graphs", "run": asdict(run), "measured": measured, "versions": found}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
