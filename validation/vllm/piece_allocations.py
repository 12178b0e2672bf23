"""What inductor's generated code for vLLM 0.19's Llama pieces allocates and frees, on CPU.

    python3 -m validation.vllm.piece_allocations [--tokens 512] [--piece first|received|middle|last|last_pp|
                                                first_tp|middle_tp|last_tp ...]
                                                [--symbolic] [--json]

(several pieces in one run: --json prints one line mapping each to its allocator calls)

The sequence serving/graph_pool.py replays through the caching allocator for each piece's CUDA-graph capture. It
lowers a piece of Llama-3.1-8B as vLLM 0.19 writes it with its custom ops off (the ops of
validation/vllm/piece_kernels.py and combo_windows.py: native RMSNorm, SiluAndMul and rotary) on fake CUDA tensors,
generates inductor's wrapper code (no GPU: the H100's properties are supplied by hand and Triton's backend hash is
stubbed, so nothing is compiled or run) and prints its buffer lines: ``empty_strided_cuda`` (a request to the caching
allocator), ``del`` (a free, where the buffer is the piece's own; its inputs stay with the caller) and inductor's
in-place reuse of a freed buffer of the same size (``bufN = bufM; del bufM  # reuse``: no request). The pieces:
``first`` (embedding, RMSNorm, qkv, rotary, the attention's output buffer), ``received`` (a later pipeline stage's
received hidden states and residual added first), ``middle`` (o_proj, add + RMSNorm, MLP, the next layer's attention
inputs), ``last`` (the last layer's MLP and the final norm) and ``last_pp`` (a non-last stage's last piece: its
hidden states and residual); ``first_tp``, ``middle_tp`` and ``last_tp`` are the same at TP > 1 (at TP 1's widths):
RowParallelLinear's all-reduce after o_proj and down_proj and VocabParallelEmbedding's after the lookup, as vLLM's
out-of-place ``all_reduce`` custom op (distributed/parallel_state.py: its fake is ``torch.empty_like``), a fallback
kernel in the wrapper code whose output the op requests itself (``bufN = torch.ops...all_reduce.default(bufM, ...)``,
one request of its input's size; the ``bufK = bufN`` name that follows is no request).
``--symbolic``: the token dimension a symbol, as vLLM compiles its pieces for a range
of sizes; the lines are the same. Uses the installed torch (2.13 here; vLLM 0.19.0 pins 2.10).
"""

from __future__ import annotations

import argparse
import json
import math
import re

import torch
import torch.nn.functional as F

from .combo_windows import HEAD, KV, MAX_POS, Q, H, V, _attention_inputs, _pretend_h100
from .piece_kernels import INTERMEDIATE, _rms_norm, middle_piece

BUFFER_LINE = re.compile(r"empty_strided_cuda|\bdel buf|# reuse|^\s*return \(|= torch\.ops\.piece_allocations"
                         r"|^\s*buf\d+ = buf\d+$")


def _mlp(attention_out, residual, o_w, post_norm_w, gate_up_w, down_w):
    residual = attention_out @ o_w.t() + residual  # o_proj, then post_attention_layernorm's fused add
    gate, up = (_rms_norm(residual, post_norm_w) @ gate_up_w.t()).split([INTERMEDIATE, INTERMEDIATE], dim=-1)
    return (F.silu(gate) * up) @ down_w.t(), residual  # SiluAndMul, down_proj


def last_piece(attention_out, residual, o_w, post_norm_w, gate_up_w, down_w, norm_w):
    hidden, residual = _mlp(attention_out, residual, o_w, post_norm_w, gate_up_w, down_w)
    return (_rms_norm(hidden + residual, norm_w),)  # the model's final norm, its fused add


def last_piece_pp(attention_out, residual, o_w, post_norm_w, gate_up_w, down_w):
    return _mlp(attention_out, residual, o_w, post_norm_w, gate_up_w, down_w)  # IntermediateTensors' two


def first_piece(input_ids, positions, emb_w, norm_w, qkv_w, cos_sin_cache):
    residual = F.embedding(input_ids.long(), emb_w)  # VocabParallelEmbedding.forward_native at TP 1
    return (*_attention_inputs(residual, positions, norm_w, qkv_w, cos_sin_cache), residual)


def received_piece(hidden, received_residual, positions, norm_w, qkv_w, cos_sin_cache):
    residual = hidden + received_residual  # input_layernorm(hidden, residual)'s fused add
    return (*_attention_inputs(residual, positions, norm_w, qkv_w, cos_sin_cache), residual)


@torch.library.custom_op("piece_allocations::all_reduce", mutates_args=())
def _all_reduce(tensor: torch.Tensor, group_name: str) -> torch.Tensor:
    """vLLM's all_reduce custom op (distributed/parallel_state.py): out of place, its fake torch.empty_like."""
    return tensor.clone()


@_all_reduce.register_fake
def _(tensor, group_name):
    return torch.empty_like(tensor)


def _reduce(x):
    return torch.ops.piece_allocations.all_reduce(x, "tp:0")


def middle_piece_tp(attention_out, residual, positions, o_w, post_norm_w, gate_up_w, down_w, input_norm_w, qkv_w,
                    cos_sin_cache):
    """middle_piece with RowParallelLinear's all-reduce after o_proj and down_proj (TP > 1), at TP 1's widths."""
    residual = _reduce(attention_out @ o_w.t()) + residual
    gate, up = (_rms_norm(residual, post_norm_w) @ gate_up_w.t()).split([INTERMEDIATE, INTERMEDIATE], dim=-1)
    residual = _reduce((F.silu(gate) * up) @ down_w.t()) + residual
    return (*_attention_inputs(residual, positions, input_norm_w, qkv_w, cos_sin_cache), residual)


def first_piece_tp(input_ids, positions, emb_w, norm_w, qkv_w, cos_sin_cache):
    """first_piece with VocabParallelEmbedding's all-reduce of the rank's masked lookup (TP > 1)."""
    residual = _reduce(F.embedding(input_ids.long(), emb_w))
    return (*_attention_inputs(residual, positions, norm_w, qkv_w, cos_sin_cache), residual)


def last_piece_tp(attention_out, residual, o_w, post_norm_w, gate_up_w, down_w, norm_w):
    residual = _reduce(attention_out @ o_w.t()) + residual
    gate, up = (_rms_norm(residual, post_norm_w) @ gate_up_w.t()).split([INTERMEDIATE, INTERMEDIATE], dim=-1)
    return (_rms_norm(_reduce((F.silu(gate) * up) @ down_w.t()) + residual, norm_w),)


def _piece(name: str, tokens: int, cuda: torch.device):
    def bf16(*shape):
        return torch.empty(*shape, dtype=torch.bfloat16, device=cuda)
    positions = torch.empty(tokens, dtype=torch.int64, device=cuda)
    mlp_weights = (bf16(H, Q), bf16(H), bf16(2 * INTERMEDIATE, H), bf16(H, INTERMEDIATE))
    attention_weights = (bf16(H), bf16(Q + 2 * KV, H), bf16(MAX_POS, HEAD))
    return {"first": (first_piece, (torch.empty(tokens, dtype=torch.int32, device=cuda), positions, bf16(V, H),
                                    *attention_weights)),
            "received": (received_piece, (bf16(tokens, H), bf16(tokens, H), positions, *attention_weights)),
            "middle_tp": (middle_piece_tp, (bf16(tokens, Q), bf16(tokens, H), positions, *mlp_weights,
                                            *attention_weights)),
            "first_tp": (first_piece_tp, (torch.empty(tokens, dtype=torch.int32, device=cuda), positions,
                                          bf16(V, H), *attention_weights)),
            "last_tp": (last_piece_tp, (bf16(tokens, Q), bf16(tokens, H), *mlp_weights, bf16(H))),
            "middle": (middle_piece, (bf16(tokens, Q), bf16(tokens, H), positions, *mlp_weights, *attention_weights)),
            "last": (last_piece, (bf16(tokens, Q), bf16(tokens, H), *mlp_weights, bf16(H))),
            "last_pp": (last_piece_pp, (bf16(tokens, Q), bf16(tokens, H), *mlp_weights))}[name]


def _symbolic_args(mode, metas: tuple, per_token: int) -> list:
    """Fake CUDA inputs whose token dimension is one symbol, as vLLM compiles the pieces (combo_windows.py)."""
    from torch._dynamo.source import LocalSource
    from torch.fx.experimental.symbolic_shapes import DimDynamic, StatelessSymbolicContext

    args = []
    for i, meta in enumerate(metas):
        dims = [DimDynamic.DYNAMIC if d == 0 and i < per_token else DimDynamic.STATIC for d in range(meta.dim())]
        args.append(mode.from_tensor(meta, source=LocalSource(f"arg{i}"),
                                     symbolic_context=StatelessSymbolicContext(dynamic_sizes=dims)).to("cuda:0"))
    for arg in args[1:per_token]:
        torch._check(arg.shape[0] == args[0].shape[0])  # one token count across the inputs
    return args


PER_TOKEN = {"first": 2, "received": 3, "middle": 3, "last": 2, "last_pp": 2,  # leading inputs with a row a token
             "first_tp": 2, "middle_tp": 3, "last_tp": 2}


def buffer_lines(name: str, tokens: int, symbolic: bool = False) -> list[str]:
    """The wrapper code's allocation, free and reuse lines for one piece, in order; `symbolic`: the token dimension
    a symbol (its sizes print as one, e.g. ``s14``)."""
    import torch._inductor.codegen.triton as triton_codegen
    import torch._inductor.config as inductor_config
    import torch.utils._triton as triton_utils
    from torch._inductor import scheduler as sched
    from torch._inductor.debug import DebugContext
    from torch._inductor.decomposition import select_decomp_table
    from torch._inductor.graph import GraphLowering
    from torch._inductor.virtualized import V as virtualized
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.proxy_tensor import make_fx
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

    _pretend_h100()
    triton_utils.triton_hash_with_backend = lambda: "no-gpu"  # the kernels' cache key asks the driver otherwise
    if hasattr(triton_codegen, "triton_hash_with_backend"):
        triton_codegen.triton_hash_with_backend = triton_utils.triton_hash_with_backend
    inductor_config.combo_kernels = True  # vLLM 0.19 config/compilation.py
    inductor_config.benchmark_combo_kernel = False  # nothing runs here
    inductor_config.compile_threads = 1
    saved = sched.Scheduler.speedup_by_combo_kernel
    sched.Scheduler.speedup_by_combo_kernel = lambda self, nodes: True
    mode = FakeTensorMode(allow_non_fake_inputs=True, shape_env=ShapeEnv())
    try:
        fn, metas = _piece(name, tokens, torch.device("meta"))  # real meta tensors, outside the fake mode
        with mode:
            if symbolic:
                args = _symbolic_args(mode, metas, PER_TOKEN[name])
            else:
                fn, args = _piece(name, tokens, torch.device("cuda", 0))
            gm = make_fx(fn, decomposition_table=select_decomp_table(),
                         tracing_mode="symbolic" if symbolic else "real")(*args)
        if symbolic:
            args = [node.meta["val"] for node in gm.graph.nodes if node.op == "placeholder"]
        graph = GraphLowering(gm, example_inputs=list(args), shape_env=mode.shape_env)
        with virtualized.set_graph_handler(graph), virtualized.set_fake_mode(mode):
            graph.run(*args)
            with DebugContext():
                code = graph.codegen()
    finally:
        sched.Scheduler.speedup_by_combo_kernel = saved
    code = code[0] if isinstance(code, tuple) else code
    code = getattr(code, "value", code)
    body = code[code.index("def call(self, args):"):]
    return [line.strip() for line in body.splitlines() if BUFFER_LINE.search(line)]


DTYPE_BYTES = {"torch.bfloat16": 2, "torch.float16": 2, "torch.float32": 4, "torch.int64": 8, "torch.int32": 4}


def requests(lines: list[str], tokens: int) -> list[tuple[str, int]]:
    """The caching-allocator calls of `buffer_lines`: ("malloc", bytes) for each allocation and ("free", bytes) for
    each of the piece's own buffers freed (a reuse makes no call; inputs are the caller's); a symbolic size is the
    token count."""
    sizes: dict[str, int] = {}
    calls: list[tuple[str, int]] = []
    aliases: dict[str, str] = {}
    for line in lines:
        op = re.match(r"(buf\d+) = torch\.ops\.piece_allocations\.all_reduce\.default\((buf\d+),", line)
        if op:  # the op's output, as large as its input, requested by the op itself
            sizes[op.group(1)] = sizes[op.group(2)]
            calls.append(("malloc", sizes[op.group(1)]))
            continue
        alias = re.match(r"(buf\d+) = (buf\d+)$", line)
        if alias:  # a name for the op's output; the `del` of the old name that follows frees nothing
            sizes[alias.group(1)] = sizes[alias.group(2)]
            aliases[alias.group(2)] = alias.group(1)
            continue
        made = re.match(r"(buf\d+) = empty_strided_cuda\(\(([^)]*)\), \([^)]*\), (torch\.\w+)\)", line)
        if made:
            shape = [int(d) if d.strip().isdigit() else tokens for d in made.group(2).split(",") if d.strip()]
            sizes[made.group(1)] = math.prod(shape) * DTYPE_BYTES[made.group(3)]
            calls.append(("malloc", sizes[made.group(1)]))
            continue
        reused = re.match(r"(buf\d+) = .*\b(buf\d+)\b.*; del \2  # reuse", line)
        if reused:
            sizes[reused.group(1)] = sizes.pop(reused.group(2))
            continue
        freed = re.match(r"del (buf\d+)$", line)
        if freed and freed.group(1) in aliases:
            sizes.pop(freed.group(1))
            continue
        if freed:
            calls.append(("free", sizes.pop(freed.group(1))))
    return calls


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=512)
    parser.add_argument("--piece", choices=tuple(PER_TOKEN), nargs="+", default=["middle"])
    parser.add_argument("--symbolic", action="store_true", help="the token dimension a symbol, as vLLM compiles it")
    parser.add_argument("--json", action="store_true", help="one JSON line: each piece's allocator calls")
    options = parser.parse_args()
    pieces = {piece: buffer_lines(piece, options.tokens, options.symbolic) for piece in options.piece}
    if options.json:  # the pretended device stays in this process: tests run it as a child
        print(json.dumps({piece: requests(lines, options.tokens) for piece, lines in pieces.items()}))
        return
    print("\n\n".join("\n".join(lines) for lines in pieces.values()))


if __name__ == "__main__":
    main()
