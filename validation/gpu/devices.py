"""The device an experiment (validation/gpu/graphs.py, context.py) reads its memory from: the real CUDA
device, or a CPU stand-in that CI runs so the experiments' own code is exercised without a GPU.

What the experiments read, on CUDA:
- used bytes: `torch.cuda.mem_get_info()` total - free, the driver's own count (the CUDA context, the
  loaded kernel modules, graph executables and every allocator segment);
- reserved and allocated bytes: the caching allocator's (`torch.cuda.memory_reserved/allocated`), graph
  pools included;
- a captured graph's nodes by type, from the CUDA driver API (cuGraphGetNodes / cuGraphNodeGetType on
  the cudaGraph_t that `torch.cuda.CUDAGraph(keep_graph=True).raw_cuda_graph()` returns; a cudaGraph_t
  is a CUgraph, cuda_runtime_api.h).

The CPU stand-in (`FakeDevice`) runs the same tensor code on the CPU. Its "graph" counts the aten ops
run while capturing as kernel nodes, and instantiating one charges `per_graph + per_node x nodes`
bytes of simulated driver memory, so a test can check that the experiment's deltas and fit give those
two constants back. It knows nothing of a real driver: its numbers are never recorded as measured.
"""

from __future__ import annotations

import ctypes
from collections import Counter
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch
from torch.utils._python_dispatch import TorchDispatchMode

# CUgraphNodeType (cuda.h, CUDA 12.x and 13.x): the values the driver returns
NODE_TYPES = {0: "kernel", 1: "memcpy", 2: "memset", 3: "host", 4: "graph", 5: "empty", 6: "wait_event",
              7: "event_record", 8: "ext_semas_signal", 9: "ext_semas_wait", 10: "mem_alloc", 11: "mem_free",
              12: "batch_mem_op", 13: "conditional"}


def _libcuda():
    return ctypes.CDLL("libcuda.so.1")


def _check(rc: int, call: str) -> None:
    if rc != 0:
        raise RuntimeError(f"{call} returned CUresult {rc}")


def driver_api_version() -> int | None:
    """cuDriverGetVersion: the CUDA version the driver implements (13000 for 13.0), or None without one."""
    try:
        version = ctypes.c_int(0)
        _check(_libcuda().cuDriverGetVersion(ctypes.byref(version)), "cuDriverGetVersion")
        return version.value
    except (OSError, RuntimeError):
        return None


def cuda_graph_node_types(raw_graph: int) -> dict[str, int]:
    """The nodes of a cudaGraph_t by type (driver API)."""
    lib = _libcuda()
    count = ctypes.c_size_t(0)
    _check(lib.cuGraphGetNodes(ctypes.c_void_p(raw_graph), None, ctypes.byref(count)), "cuGraphGetNodes")
    nodes = (ctypes.c_void_p * count.value)()
    _check(lib.cuGraphGetNodes(ctypes.c_void_p(raw_graph), nodes, ctypes.byref(count)), "cuGraphGetNodes")
    types: Counter = Counter()
    for node in nodes[:count.value]:
        kind = ctypes.c_int(-1)
        _check(lib.cuGraphNodeGetType(ctypes.c_void_p(node), ctypes.byref(kind)), "cuGraphNodeGetType")
        types[NODE_TYPES.get(kind.value, str(kind.value))] += 1
    return dict(types)


class CudaDevice:
    """The real device (device 0)."""

    name = "cuda"
    counts_nodes_by = "the driver (cuGraphGetNodes)"

    def synchronize(self) -> None:
        torch.cuda.synchronize()

    def used_bytes(self) -> int:
        free, total = torch.cuda.mem_get_info()
        return total - free

    def total_bytes(self) -> int:
        return torch.cuda.mem_get_info()[1]

    def reserved_bytes(self) -> int:
        return torch.cuda.memory_reserved()

    def allocated_bytes(self) -> int:
        return torch.cuda.memory_allocated()

    def stream(self):
        return torch.cuda.Stream()

    @contextmanager
    def on(self, stream):
        """Work on `stream` after what the current stream has queued (the tensors' first fill), and the
        current stream after it (torch.cuda.graphs' own side-stream pattern)."""
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            yield
        torch.cuda.current_stream().wait_stream(stream)

    def pool(self):
        return torch.cuda.graph_pool_handle()

    def graph(self, keep: bool = False):
        return torch.cuda.CUDAGraph(keep_graph=True) if keep else torch.cuda.CUDAGraph()

    def node_types(self, graph) -> dict[str, int]:
        return cuda_graph_node_types(graph.raw_cuda_graph())

    def process_bytes(self) -> int | None:
        """This process's used memory as nvidia-smi prints it (None without nvidia-smi)."""
        from .measure import nvidia_smi_used_bytes

        return nvidia_smi_used_bytes()


class _OpCounter(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.ops = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops += 1
        return func(*args, **(kwargs or {}))


@dataclass
class FakeGraph:
    """A CUDAGraph's interface on the CPU: the ops run while capturing are its kernel nodes."""

    device: "FakeDevice"
    keep: bool
    nodes: int = 0
    charged: int = 0
    _counter: _OpCounter | None = None

    def capture_begin(self, pool=None) -> None:
        self._counter = _OpCounter()
        self._counter.__enter__()

    def capture_end(self) -> None:
        self._counter.__exit__(None, None, None)
        self.nodes = self._counter.ops
        if not self.keep:
            self.instantiate()

    def instantiate(self) -> None:
        if not self.charged:
            self.charged = self.device.per_graph + self.device.per_node * self.nodes
            self.device.driver += self.charged

    def replay(self) -> None:
        pass

    def reset(self) -> None:
        self.device.driver -= self.charged
        self.charged = 0


@dataclass
class FakeDevice:
    """The CPU stand-in: a context of `context` bytes, and `per_graph + per_node x nodes` bytes of driver
    memory for each instantiated graph."""

    per_graph: int = 64 * 1024
    per_node: int = 8 * 1024
    context: int = 512 * 1024**2
    total: int = 80 * 1024**3
    driver: int = 0
    name: str = field(default="cpu", init=False)
    counts_nodes_by: str = field(default="the CPU stand-in (aten ops run while capturing)", init=False)

    def synchronize(self) -> None:
        pass

    def used_bytes(self) -> int:
        return self.context + self.driver

    def total_bytes(self) -> int:
        return self.total

    def reserved_bytes(self) -> int:
        return 0

    def allocated_bytes(self) -> int:
        return 0

    def stream(self):
        return None

    @contextmanager
    def on(self, stream):
        yield

    def pool(self):
        return None

    def graph(self, keep: bool = False) -> FakeGraph:
        return FakeGraph(self, keep)

    def node_types(self, graph: FakeGraph) -> dict[str, int]:
        return {"kernel": graph.nodes}

    def process_bytes(self) -> int | None:
        return None


def device_named(name: str):
    if name == "cuda":
        return CudaDevice()
    if name == "cpu":
        return FakeDevice()
    raise ValueError(f"device {name!r}: 'cuda' or 'cpu' (the CPU stand-in)")
