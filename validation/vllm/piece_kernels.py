"""The kernels inductor makes of one middle piece of vLLM's piecewise-compiled Llama, on CPU.

    python3 -m validation.vllm.piece_kernels [--tokens 512] [--json]

vLLM 0.19 splits the compiled forward at the attention ops (compilation/backends.py split_graph), so a middle
piece holds the previous layer's o_proj, its post-attention add + RMSNorm and MLP, then the next layer's
add + RMSNorm, qkv projection, rotary embedding and the attention's output buffer; each piece is one PIECEWISE
CUDA graph and, inside the FULL graph, the same kernels again. This lowers that piece of Llama-3.1-8B as vLLM
0.19 writes it with its custom ops off (native RMSNorm, SiluAndMul and rotary; the ops and H100 properties of
validation/vllm/combo_windows.py) on fake CUDA tensors, builds inductor's Scheduler with combo_kernels on and
prints the scheduled nodes: each extern node is one cuBLAS GEMM launch, each fused, single or combo node one
Triton launch, a nop node none. The count is what serving/graph_nodes.py takes for a dense layer (held by
tests/test_serving_graph_driver.py). It uses the installed torch (2.13 here; vLLM 0.19.0 pins torch 2.10, whose
scheduler was not run).
"""

from __future__ import annotations

import argparse
import json

import torch
import torch.nn.functional as F

from .combo_windows import HEAD, KV, MAX_POS, Q, H, _attention_inputs, _pretend_h100

INTERMEDIATE = 14336  # Llama-3.1-8B


def _rms_norm(x, weight):  # vLLM 0.19 RMSNorm.forward_static
    xf = x.to(torch.float32)
    xf = xf * torch.rsqrt(xf.pow(2).mean(dim=-1, keepdim=True) + 1e-5)
    return xf.to(torch.bfloat16) * weight


def middle_piece(attention_out, residual, positions, o_w, post_norm_w, gate_up_w, down_w, input_norm_w, qkv_w,
                 cos_sin_cache):
    residual = attention_out @ o_w.t() + residual  # o_proj, then post_attention_layernorm's fused add
    gate, up = (_rms_norm(residual, post_norm_w) @ gate_up_w.t()).split([INTERMEDIATE, INTERMEDIATE], dim=-1)
    residual = (F.silu(gate) * up) @ down_w.t() + residual  # SiluAndMul, down_proj, the next input_layernorm's add
    return (*_attention_inputs(residual, positions, input_norm_w, qkv_w, cos_sin_cache), residual)


def scheduled_nodes(tokens: int) -> list[tuple[str, tuple[str, ...]]]:
    """(scheduler node type, its buffers) for each node inductor schedules for the piece."""
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
    inductor_config.benchmark_combo_kernel = False  # nothing runs here
    saved = sched.Scheduler.speedup_by_combo_kernel
    sched.Scheduler.speedup_by_combo_kernel = lambda self, nodes: True  # keep every combo window
    mode, cuda = FakeTensorMode(allow_non_fake_inputs=True, shape_env=ShapeEnv()), torch.device("cuda", 0)
    try:
        with mode:
            def bf16(*shape):
                return torch.empty(*shape, dtype=torch.bfloat16, device=cuda)
            args = (bf16(tokens, Q), bf16(tokens, H), torch.empty(tokens, dtype=torch.int64, device=cuda),
                    bf16(H, Q), bf16(H), bf16(2 * INTERMEDIATE, H), bf16(H, INTERMEDIATE), bf16(H),
                    bf16(Q + 2 * KV, H), bf16(MAX_POS, HEAD))
            gm = make_fx(middle_piece, decomposition_table=select_decomp_table())(*args)
        graph = GraphLowering(gm, example_inputs=list(args), shape_env=mode.shape_env)
        with virtualized.set_graph_handler(graph), virtualized.set_fake_mode(mode):
            graph.run(*args)
            with DebugContext():
                scheduler = sched.Scheduler(graph.operations)
    finally:
        sched.Scheduler.speedup_by_combo_kernel = saved
    return [(type(n).__name__, tuple(n.get_buffer_names())) for n in scheduler.nodes]


def launches(nodes: list[tuple[str, tuple[str, ...]]]) -> tuple[int, int]:
    """(Triton launches, cuBLAS launches) of the scheduled nodes."""
    extern = sum(kind == "ExternKernelSchedulerNode" for kind, _ in nodes)
    nop = sum(kind == "NopKernelSchedulerNode" for kind, _ in nodes)
    return len(nodes) - extern - nop, extern


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=512)
    parser.add_argument("--json", action="store_true", help="one JSON line: the nodes and the launch counts")
    args = parser.parse_args()
    nodes = scheduled_nodes(args.tokens)
    triton, gemms = launches(nodes)
    if args.json:  # the pretended device stays in this process: tests run it as a child
        print(json.dumps({"nodes": nodes, "triton": triton, "cublas": gemms}))
        return
    for kind, buffers in nodes:
        print(f"  {kind:28s} {', '.join(buffers)}")
    print(f"{triton} Triton and {gemms} cuBLAS launches")


if __name__ == "__main__":
    main()
