"""Which kernels of vLLM's first compiled piece inductor would benchmark as combo-kernel subkernels, on CPU.

    python3 -m validation.vllm.combo_windows [--stage first|middle] [--symbolic]

vLLM 0.19 compiles with ``combo_kernels`` and ``benchmark_combo_kernel`` on (config/compilation.py), and the
model compiles inside the profiling run, so inductor's compile-time benchmarks count towards the printed torch
peak: ``Scheduler.speedup_by_combo_kernel`` runs every member of a combo window on random copies of all its
arguments (``benchmark_fused_nodes``: ``mod.get_args()``) beside an L2 flush buffer. This script lowers the
first piece of Llama-3.1-8B as vLLM 0.19 writes it with its custom ops off (the first pipeline stage: embedding,
RMSNorm without residual, qkv GEMM, native rotary, the attention's output buffer; ``--stage middle``: the
received hidden states and residual added first) on fake CUDA tensors, builds inductor's Scheduler with
``combo_kernels`` on and prints the fused kernels and each combo window with its arguments' bytes. No GPU: the
H100's device properties are supplied by hand, so nothing is compiled or run. It uses the torch it runs under:
the installed 2.13, and 2.10.0 (the version vLLM 0.19.0 pins; PyPI's CUDA wheel in a venv of its own, with
triton 3.6.0: ``PYTHONPATH=. /work/venvs/torch210/venv/bin/python -m validation.vllm.combo_windows``).
Recorded in the xfail reason of tests/test_serving_published.py (FORWARD): under both, the gather is fused into
the RMSNorm kernel, the only kernel of its topological level, and the one window is the q/k rotary pair
(op4 192.1 MiB, op5 144.1 MiB of arguments) on both stages, with the token dimension static or a symbol
(2.13 prints it twice: its peak-memory gate, _try_combo_with_halving, asks speedup_by_combo_kernel again).
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F

T, H, V, Q, KV, HEAD, MAX_POS = 8192, 4096, 128256, 4096, 1024, 128, 131072  # Llama-3.1-8B, 8,192 tokens
MiB = 1024**2


def _rope(x, cos, sin):  # vLLM 0.19 ApplyRotaryEmb.forward_static, neox style
    cos, sin = cos.unsqueeze(-2).to(x.dtype), sin.unsqueeze(-2).to(x.dtype)
    x1, x2 = torch.chunk(x, 2, dim=-1)
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)


def _attention_inputs(x, positions, norm_w, qkv_w, cos_sin_cache):
    xf = x.to(torch.float32)  # RMSNorm.forward_static
    xf = xf * torch.rsqrt(xf.pow(2).mean(dim=-1, keepdim=True) + 1e-5)
    qkv = (xf.to(torch.bfloat16) * norm_w) @ qkv_w.t()
    q, k, v = qkv.split([Q, KV, KV], dim=-1)
    n = positions.shape[0]
    cos, sin = torch.ops.aten.index.Tensor(cos_sin_cache, [positions]).chunk(2, dim=-1)  # index_select
    q = _rope(q.view(n, -1, HEAD), cos, sin).reshape(n, Q)
    k = _rope(k.view(n, -1, HEAD), cos, sin).reshape(n, KV)
    return q, k, v, torch.empty((n, Q), dtype=torch.bfloat16, device=q.device)  # Attention.forward's output


def first_piece(input_ids, positions, emb_w, norm_w, qkv_w, cos_sin_cache):
    residual = F.embedding(input_ids.long(), emb_w)  # VocabParallelEmbedding.forward_native at TP 1
    return (*_attention_inputs(residual, positions, norm_w, qkv_w, cos_sin_cache), residual)


def middle_piece(hidden, received_residual, positions, emb_w, norm_w, qkv_w, cos_sin_cache):
    residual = hidden + received_residual  # the fused add of input_layernorm(hidden, residual)
    return (*_attention_inputs(residual, positions, norm_w, qkv_w, cos_sin_cache), residual)


def _pretend_h100() -> None:
    """Inductor asks the device for its properties while lowering; answer for an H100 SXM."""
    from torch._inductor.runtime import hints

    props = hints.DeviceProperties(type="cuda", index=0, multi_processor_count=132, cc=90, major=9,
                                   regs_per_multiprocessor=65536, max_threads_per_multi_processor=2048,
                                   max_threads_per_block=1024, warp_size=32)
    hints.DeviceProperties.create = classmethod(lambda cls, device: props)

    class _Props:
        multi_processor_count, major, minor, warp_size = 132, 9, 0, 32
        regs_per_multiprocessor, max_threads_per_multi_processor, max_threads_per_block = 65536, 2048, 1024
        L2_cache_size, total_memory, name, gcnArchName = 50 * MiB, 80 * 1024 * MiB, "NVIDIA H100 80GB HBM3", ""
        shared_memory_per_block_optin = max_shared_memory_per_block_optin = 232448
        shared_memory_per_multiprocessor = 233472

    torch.cuda.get_device_properties = lambda *a, **k: _Props()
    torch.cuda.get_device_capability = lambda *a, **k: (9, 0)
    torch.cuda.is_available = lambda: True
    torch.cuda.current_device = lambda: 0
    torch.cuda.device_count = lambda: 1
    from torch._subclasses import fake_tensor  # a CUDA build (torch 2.10's wheel) would touch the missing driver
    fake_tensor.init_gpu_context = lambda device: None


def _piece_inputs(mode, stage: str, symbolic: bool):
    """The piece and its fake CUDA inputs; with ``symbolic`` the token dimension is a symbol, as vLLM marks it."""
    from torch._dynamo.source import LocalSource
    from torch.fx.experimental.symbolic_shapes import DimDynamic, StatelessSymbolicContext

    fn, per_token = (first_piece, 2) if stage == "first" else (middle_piece, 3)  # leading args with T rows
    shapes = ([(T,), (T,)] if stage == "first" else [(T, H), (T, H), (T,)]) + [(V, H), (H,), (Q + 2 * KV, H),
                                                                              (MAX_POS, HEAD)]
    dtypes = ([torch.int32, torch.int64] if stage == "first" else [torch.bfloat16] * 2 + [torch.int64]) \
        + [torch.bfloat16] * 4
    cuda, args = torch.device("cuda", 0), []
    with mode:
        for i, (shape, dtype) in enumerate(zip(shapes, dtypes)):
            if not symbolic:
                args.append(torch.empty(shape, dtype=dtype, device=cuda))
                continue
            dims = [DimDynamic.DYNAMIC if d == 0 and i < per_token else DimDynamic.STATIC for d in range(len(shape))]
            meta = torch.empty(shape, dtype=dtype, device="meta")
            args.append(mode.from_tensor(meta, source=LocalSource(f"arg{i}"),
                                         symbolic_context=StatelessSymbolicContext(dynamic_sizes=dims)).to(cuda))
        for arg in args[1:per_token] if symbolic else ():
            torch._check(arg.shape[0] == args[0].shape[0])  # one token count across the inputs
    return fn, args


def combo_windows(stage: str, symbolic: bool = False) -> tuple[list[str], list[list[tuple[str, int]]]]:
    """The scheduled kernels and the combo windows (each member with its arguments' bytes at T tokens)."""
    import torch._inductor.config as inductor_config
    from torch._inductor import scheduler as sched
    from torch._inductor.debug import DebugContext
    from torch._inductor.decomposition import select_decomp_table
    from torch._inductor.graph import GraphLowering
    from torch._inductor.virtualized import V as virtualized
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.proxy_tensor import make_fx
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

    _pretend_h100()
    inductor_config.combo_kernels = True
    inductor_config.benchmark_combo_kernel = False  # nothing runs here; the windows are recorded instead
    mode = FakeTensorMode(allow_non_fake_inputs=True, shape_env=ShapeEnv())
    fn, args = _piece_inputs(mode, stage, symbolic)
    with mode:
        gm = make_fx(fn, decomposition_table=select_decomp_table(), tracing_mode="symbolic" if symbolic else "real")(
            *args)
    args = [node.meta["val"] for node in gm.graph.nodes if node.op == "placeholder"] if symbolic else args
    windows: list[list[tuple[str, int]]] = []

    def record(self, nodes):
        def size(name):
            buf, sizevars = virtualized.graph.get_buffer(name), virtualized.graph.sizevars
            hint = getattr(sizevars, "size_hint", None) or sizevars.optimization_hint  # 2.10 / 2.13 spelling
            return hint(buf.get_numel(), fallback=T) * buf.get_dtype().itemsize if buf is not None else 0
        def arguments(node):  # each buffer once, as the benchmark module's get_args() allocates it
            return {dep.name for dep in node.read_writes.reads | node.read_writes.writes}
        windows.append([(n.get_name(), sum(size(name) for name in arguments(n))) for n in nodes])
        return True

    sched.Scheduler.speedup_by_combo_kernel = record
    graph = GraphLowering(gm, example_inputs=list(args), shape_env=mode.shape_env)
    with virtualized.set_graph_handler(graph), virtualized.set_fake_mode(mode):
        graph.run(*args)
        with DebugContext():
            scheduler = sched.Scheduler(graph.operations)
    kernels = [f"{n.get_name()} ({type(n).__name__}: {', '.join(n.get_buffer_names())})" for n in scheduler.nodes]
    return kernels, windows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--stage", choices=("first", "middle"), default="first")
    parser.add_argument("--symbolic", action="store_true", help="the token dimension a symbol, as vLLM compiles it")
    options = parser.parse_args()
    kernels, windows = combo_windows(options.stage, options.symbolic)
    print("kernels:", *kernels, sep="\n  ")
    for window in windows:
        print("combo window:", ", ".join(f"{name} ({size / MiB:.1f} MiB of arguments)" for name, size in window))


if __name__ == "__main__":
    main()
