"""What the compiled step of torchao's AdamW8bit allocates beside its states, read from the code
Inductor generates for a GPU, on a machine without one.

torchao (0.7.0-0.10.0: optim/adam.py and optim/subclass_8bit.py, identical in those releases)
steps every parameter with `torch.compile(single_param_adam, fullgraph=True, dynamic=False)`.
Which buffers the compiled step allocates is decided by Inductor's lowering and scheduler, before
any kernel is compiled: here Triton's scheduling is registered for the CPU device, the step is
compiled for a CPU parameter of the asked shape, and the wrapper Inductor writes (its
`empty_strided` allocations and `del`s, in order) is read before Triton, which has no CPU
backend, fails to build the first kernel. CPU's own C++ kernels fuse differently (they keep two
fp32 copies of the tensor), which is why the CPU backend is not the one read.

    python -m validation.torchtune.inductor_scratch 128256 3072   # Llama 3.2's embedding

writes tests/data/measured/compile/torchao-adamw8bit-step-scratch-<rows>x<cols>.json.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

DTYPE_BYTES = {"torch.uint8": 1, "torch.bfloat16": 2, "torch.float32": 4, "torch.int64": 8, "torch.int32": 4}
ALLOC = re.compile(r"^\s*(buf\d+) = empty_strided_\w+\(\(([\d, ]*)\), \([\d, ]*\), (torch\.\w+)\)")
FREE = re.compile(r"^\s*del (buf\d+)\s*$")
RECORDS = Path(__file__).resolve().parents[2] / "tests" / "data" / "measured" / "compile"


def wrapper_code(rows: int, cols: int) -> str:
    """The Python wrapper Inductor generates for one AdamW8bit step of a bf16 (rows, cols) parameter
    (its first step: the states are created, then stepped)."""
    import torch
    import torch._functorch.config as functorch_config
    import torch._inductor.config as inductor_config
    import torch.utils._triton as triton_utils
    from torch._inductor import graph
    from torch._inductor.codegen import common
    from torch._inductor.codegen.triton import TritonScheduling
    from torch._inductor.codegen.wrapper import PythonWrapperCodegen
    from torchao.optim import AdamW8bit

    inductor_config.fx_graph_cache = False  # a cached graph would skip the code generation read here
    functorch_config.enable_autograd_cache = False
    common.init_backend_registration()
    common.register_backend_for_device("cpu", TritonScheduling, PythonWrapperCodegen)
    triton_utils.triton_hash_with_backend = lambda: "no-gpu"  # names the kernels' cache entry only
    written: list[str] = []
    codegen = graph.GraphLowering.codegen

    def keep(self, *args, **kwargs):
        out = codegen(self, *args, **kwargs)
        written.extend(getattr(x, "value", x) for x in (out if isinstance(out, tuple) else (out,)))
        return out

    graph.GraphLowering.codegen = keep
    p = torch.nn.Parameter(torch.zeros(rows, cols, dtype=torch.bfloat16))
    p.grad = torch.zeros_like(p)
    try:
        AdamW8bit([p], lr=2e-5).step()
    except Exception:  # Triton cannot build the kernels for a CPU target; the wrapper is written
        pass
    finally:
        graph.GraphLowering.codegen = codegen
    if not written:
        raise RuntimeError("Inductor wrote no wrapper: is the compiled step cached?")
    return next(c for c in reversed(written) if isinstance(c, str) and "def call(" in c)


def scratch(code: str) -> dict:
    """The buffers the wrapper's call() allocates, and the most alive at once."""
    call = code[code.index("def call("):]
    live, peak, buffers = {}, 0, []
    for line in call.splitlines():
        if m := ALLOC.match(line):
            shape = tuple(int(d) for d in m.group(2).replace(" ", "").split(",") if d)
            n = 1
            for d in shape:
                n *= d
            live[m.group(1)] = n * DTYPE_BYTES[m.group(3)]
            buffers.append({"name": m.group(1), "shape": list(shape), "dtype": m.group(3).split(".")[1],
                            "bytes": live[m.group(1)]})
            peak = max(peak, sum(live.values()))
        elif m := FREE.match(line):
            live.pop(m.group(1), None)
    return {"buffers": buffers, "peak_bytes": peak}


def main(argv: list[str]) -> int:
    import torch
    import torchao

    from ..core.record import write_json

    rows, cols = (int(a) for a in argv[:2])
    result = scratch(wrapper_code(rows, cols))
    record = {
        "id": f"torchao-adamw8bit-step-scratch-{rows}x{cols}",
        "description": f"torchao AdamW8bit's compiled single_param_adam on a bf16 ({rows}, {cols}) parameter: "
                       "the buffers Inductor's Triton wrapper allocates beside the parameter, its gradient and "
                       "its 8-bit states",
        "measured": {"elements": rows * cols, **result},
        "method": __doc__.split("\n\n")[1].replace("\n", " "),
        "versions": {"torch": torch.__version__, "torchao": torchao.__version__},
        "command": f"python -m validation.torchtune.inductor_scratch {rows} {cols}",
    }
    write_json(RECORDS / f"{record['id']}.json", record)
    print(record["measured"])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
