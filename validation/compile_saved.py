"""What a torch.compile'd decoder layer saves for backward (training.compile, GitHub issue #12).

Compiles one tiny transformers decoder layer with AOTAutograd and Inductor's own partitioner
(torch._functorch.partitioners.min_cut_rematerialization_partition, with Inductor's decomposition
table, as torch._inductor.compile_fx runs it) but without Inductor's code generation, on CPU, and
lists the tensors the compiled forward hands to the backward graph: the backward graph's inputs that
are not gradients. Parameters and the rotary tables (inputs shared by every layer) are left out.
A run with backend="inductor" on CPU (torch 2.13) saved the same tensors (the attention output once).

    python -m validation.compile_saved [layers | torchtitan-loss | megatron-cross-entropy ...]
                                                  # writes tests/data/measured/compile/<id>.json

`megatron_cross_entropy_buffers` lists, the same way, what Inductor's generated code allocates in each
`@jit_fuser` function of Megatron-Core's native fused cross-entropy (fusions/fused_cross_entropy.py,
0.16.1; megatron/core/jit.py makes jit_fuser torch.compile), called as _VocabParallelCrossEntropy
calls them: the harness's stand-ins (validation/megatron/fused.py) allocate what it lists.

`loss_buffers` does the same for torchtitan's loss (torchtitan 0.3.0 compiles it by default,
CompileConfig.components = ["model", "loss"]): it compiles components/loss.py's cross_entropy_loss
with backend="inductor" on CPU, as CrossEntropyLoss._maybe_compile does, on one chunk of bf16 logits
without a TP mesh, and lists the buffers Inductor's generated forward and backward allocate
(empty_strided calls; reinterpret_tensor reuses none) and what the forward hands to the backward.
"""

from __future__ import annotations

from pathlib import Path

RECORDS = Path(__file__).resolve().parents[1] / "tests" / "data" / "measured" / "compile"
RECORD_ID = "transformers-tiny-layers-bf16-b2-s8"
CASES = {"llama-sdpa": ("llama", "sdpa"), "llama-eager": ("llama", "eager"), "qwen3-sdpa": ("qwen3", "sdpa")}


def saved_tensors(model: str = "llama", attention: str = "sdpa", dtype: str = "bf16", b: int = 2,
                  s: int = 8) -> list[dict]:
    import torch
    import torch._functorch.partitioners as partitioners
    from functorch.compile import make_boxed_func
    from torch._dynamo.backends.common import aot_autograd
    from torch._inductor.decomposition import select_decomp_table

    torch._dynamo.reset()
    torch.manual_seed(0)
    if model == "qwen3":
        from transformers import Qwen3Config as Config
        from transformers.models.qwen3.modeling_qwen3 import Qwen3DecoderLayer as Layer, \
            Qwen3RotaryEmbedding as Rope
    else:
        from transformers import LlamaConfig as Config
        from transformers.models.llama.modeling_llama import LlamaDecoderLayer as Layer, \
            LlamaRotaryEmbedding as Rope
    cfg = Config(hidden_size=64, num_attention_heads=4, num_key_value_heads=2, intermediate_size=96,
                 num_hidden_layers=1, vocab_size=32, head_dim=16)
    cfg._attn_implementation = attention
    torch_dtype = {"bf16": torch.bfloat16, "fp32": torch.float32}[dtype]
    layer = Layer(cfg, 0).to(torch_dtype)
    x = torch.randn(b, s, cfg.hidden_size, dtype=torch_dtype, requires_grad=True)
    pos = torch.arange(s).unsqueeze(0)
    cos, sin = Rope(cfg)(x, pos)
    mask = None
    if attention == "eager":
        mask = torch.full((s, s), float("-inf"), dtype=torch_dtype).triu(1)[None, None]

    found: list[dict] = []

    aten = torch.ops.aten
    views = {aten.alias, aten.view, aten._unsafe_view, aten.permute, aten.t, aten.transpose, aten.expand}

    def base(node):  # a view shares its base's storage: count the storage once
        while node.op == "call_function" and getattr(node.target, "overloadpacket", None) in views:
            node = node.args[0]
        return node.name

    def partition(joint, joint_inputs, **kwargs):
        fw, bw = partitioners.min_cut_rematerialization_partition(joint, joint_inputs, **kwargs)
        fw_nodes = {n.name: n for n in fw.graph.nodes}
        for node in bw.graph.nodes:
            if node.op == "placeholder" and not node.name.startswith("tangents"):
                val = node.meta.get("val")
                if isinstance(val, torch.Tensor):
                    found.append({"name": node.name, "shape": list(val.shape), "bytes_per_element": val.element_size(),
                                  "base": base(fw_nodes[node.name]) if node.name in fw_nodes else node.name})
        return fw, bw

    def forward(x):
        return layer(x, attention_mask=mask, position_embeddings=(cos, sin), position_ids=pos)

    compiled = torch.compile(forward, backend=aot_autograd(
        fw_compiler=lambda gm, _: make_boxed_func(gm), bw_compiler=lambda gm, _: make_boxed_func(gm),
        partition_fn=partition, decompositions=select_decomp_table()))
    out = compiled(x)
    (out[0] if isinstance(out, tuple) else out).float().sum().backward()
    # parameters and the rope tables are graph inputs ("primals") too: keep only the layer input among
    # them; a view of a tensor already listed (flash attention's output and its reshape) is left out
    out, bases = [], set()
    for t in found:
        if (t["name"].startswith("primals_") and t["name"] != "primals_1") or t["base"] in bases:
            continue
        bases.add(t["base"])
        out.append(dict(name=t["name"], shape=t["shape"], bytes_per_element=t["bytes_per_element"]))
    return out


LOSS_RECORD_ID = "torchtitan-cross-entropy-bf16-n64-v4096"


def loss_buffers(n: int = 64, v: int = 4096) -> dict:
    """The compiled torchtitan cross-entropy on (1, n, v) bf16 logits: each generated function's
    allocations (shape, bytes per element) and the forward's outputs beyond the loss (the tensors it
    saves for the backward, named as in the generated code)."""
    import re

    import torch
    from torch._inductor.utils import run_and_get_code
    from torchtitan.components.loss import cross_entropy_loss

    torch._dynamo.reset()
    torch.manual_seed(0)
    logits = torch.randn(1, n, v, dtype=torch.bfloat16, requires_grad=True)
    labels = torch.randint(0, v, (1, n))
    fn = torch.compile(cross_entropy_loss, backend="inductor")

    def step():
        fn(logits, labels).backward()

    _, codes = run_and_get_code(step)
    allocation = re.compile(r"(buf\d+) = empty_strided_\w+\(\(([^)]*)\), \([^)]*\), torch\.(\w+)\)")
    sizes = {"float32": 4, "bfloat16": 2, "int64": 8, "bool": 1}
    graphs = []
    for code in codes:
        body = code[code.index("def call(self, args):"):]
        buffers = [{"name": name, "shape": [int(x) for x in shape.split(",") if x.strip()],
                    "bytes_per_element": sizes[dtype]} for name, shape, dtype in allocation.findall(body)]
        returned = re.search(r"return \((.*)\)", body).group(1)
        graphs.append({"buffers": buffers, "returns": [r.strip() for r in returned.split(",") if r.strip()]})
    forward, backward = graphs
    return {"forward_buffers": forward["buffers"], "saved": forward["returns"][1:],
            "backward_buffers": backward["buffers"]}


_ALLOCATION = r"(buf\d+) = empty_strided_\w+\(\(([^)]*)\), \([^)]*\), torch\.(\w+)\)"
_BYTES = {"float32": 4, "bfloat16": 2, "int64": 8, "bool": 1}


def generated_buffers(code: str) -> dict:
    """One generated module's `call`: the buffers it allocates (a reused buffer, ``bufB = bufA;
    del bufA  # reuse``, is the same allocation) and what it returns (``argN_1`` is an input)."""
    import re

    body = code[code.index("def call(self, args):"):]
    body = body[:body.index("\n\n")]
    names = {name: name for name, _ in re.findall(r"(buf\d+) = (buf\d+); del \2  # reuse", body)}
    for new, old in re.findall(r"(buf\d+) = (buf\d+); del \2  # reuse", body):
        names[new] = names.get(old, old)
    buffers = [{"name": name, "shape": [int(x) for x in shape.split(",") if x.strip()], "dtype": dtype,
                "bytes_per_element": _BYTES[dtype]} for name, shape, dtype in re.findall(_ALLOCATION, body)]
    returned = re.search(r"return \((.*)\)", body).group(1)
    returns = [names.get(r, r) for r in re.findall(r"(?:reinterpret_tensor\()?(buf\d+|arg\d+_1)", returned)]
    for b in buffers:
        b["returned"] = b["name"] in returns
    return {"buffers": buffers, "returns": returns}


MEGATRON_CE_RECORD_ID = "megatron-fused-cross-entropy-bf16-s16-b2-v512"


def megatron_cross_entropy_buffers(s: int = 16, b: int = 2, v: int = 512) -> dict:
    """Each of the four compiled functions of Megatron-Core's native fused cross-entropy on [s, b, v]
    bf16 logits (one TP rank, its whole vocabulary), called in _VocabParallelCrossEntropy's order with
    the tensors the previous one returned: `generated_buffers` of each."""
    import torch
    from torch._inductor.utils import run_and_get_code
    from megatron.core.fusions import fused_cross_entropy as fce

    torch._dynamo.reset()
    torch.manual_seed(0)
    logits = torch.randn(s, b, v, dtype=torch.bfloat16)
    target = torch.randint(0, v, (s, b))
    out = {}

    def run(name, *args):
        result, codes = run_and_get_code(getattr(fce, name), *args)
        (code,) = codes
        out[name] = generated_buffers(code)
        return result

    with torch.no_grad():  # autograd Function forward and backward run without a graph
        fp32_logits, logits_max = run("calculate_logits_max", logits)
        target_mask, masked_target_1d, predicted_sum_exp, exp_logits = run(
            "calculate_predicted_logits", fp32_logits, target, logits_max, 0, v)
        softmax, _ = run("calculate_cross_entropy_loss", exp_logits, predicted_sum_exp)
        run("calculate_gradients", softmax, torch.ones(s, b), target_mask, masked_target_1d)
    return out


def megatron_cross_entropy_record() -> dict:
    from .core.record import package_versions

    return {"id": MEGATRON_CE_RECORD_ID, "logits": {"shape": [16, 2, 512], "dtype": "bfloat16"},
            "functions": megatron_cross_entropy_buffers(), "versions": package_versions("torch", "megatron-core"),
            "command": "python -m validation.compile_saved megatron-cross-entropy"}


def loss_record() -> dict:
    from .core.record import package_versions

    return {"id": LOSS_RECORD_ID, "logits": {"shape": [1, 64, 4096], "dtype": "bfloat16"}, **loss_buffers(),
            "versions": package_versions("torch", "torchtitan"), "command": "python -m validation.compile_saved"}


def record() -> dict:
    """Every case's saved set, with the versions it ran on (the measured records' shape)."""
    from .core.record import package_versions

    return {"id": RECORD_ID, "cases": {case: saved_tensors(*args) for case, args in CASES.items()},
            "versions": package_versions("torch", "transformers"), "command": "python -m validation.compile_saved"}


RECORDS_BY_NAME = {"layers": record, "torchtitan-loss": loss_record, "megatron-cross-entropy": megatron_cross_entropy_record}

if __name__ == "__main__":
    import sys

    from .core.record import write_record

    for name in sys.argv[1:] or RECORDS_BY_NAME:  # python -m validation.compile_saved [name ...]
        print(write_record(RECORDS_BY_NAME[name](), RECORDS))
