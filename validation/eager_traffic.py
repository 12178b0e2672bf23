"""The HBM traffic and kernel launches of the eager PyTorch op chains that a norm, a rotary embedding and an
activation run as without fused kernels (kernels.EAGER_TRAFFIC in the roofline), per framework's model
code, forward and backward separately.

Each chain runs on CPU, in bf16, under a TorchDispatchMode that sees every aten op the chain (and autograd's
backward through it) dispatches. Per op: the bytes it reads (each distinct tensor argument once, at the elements
it addresses: a broadcast input with a stride-0 dimension counts once at its storage size, a slice its own
elements) and the bytes it writes (its outputs; an in-place op's mutated argument), and one kernel. View and
allocation ops (view, expand, slice, view_as_complex, detach, empty...) launch no kernel and move nothing.
The sums are divided by the fused kernel's bytes as the roofline defines them (estimator/speed/operations.py
`_elementwise`): forward reads the input and writes the output, backward reads the output gradient and the saved
input and writes the input gradient.

Chains (versions in the record):
- transformers' LlamaRMSNorm (models/llama/modeling_llama.py), apply_rotary_pos_emb with rotate_half, and
  LlamaMLP's act_fn(gate) * up (ACT2FN["silu"]): the HF Trainer's models (frameworks hf, fsdp1, deepspeed).
- torchtitan 0.3.0's nn.RMSNorm (models/common/nn_modules.py RMSNorm) and ComplexRoPE.apply_rotary_emb
  (models/common/rope.py), FeedForward's F.silu(w1(x)) * w3(x): framework fsdp2. On CUDA torch 2.13's
  F.rms_norm calls aten::_fused_rms_norm, a CUDA kernel (native_functions.yaml registers _fused_rms_norm_cuda
  and _fused_rms_norm_backward_cuda; this CPU build has only the CompositeImplicitAutograd decomposition, which
  is what the CPU chain "torch-rms-norm-composite" measures; torchtune's call warns "Mismatch dtype between input
  and weight ... Cannot dispatch to fused implementation", layer_norm.cpp:346). The CUDA kernel is counted from
  its tensors:
  forward reads x and the weight and writes y and an fp32 rstd per row; backward (layer_norm_kernel.cu's
  backward structure: a grad-input kernel, then a GammaBetaBackward kernel that reads dY and X again) reads
  dY, X, rstd and the weight and writes dX, then reads dY, X and rstd and writes dW.
- nn.LayerNorm (aten::native_layer_norm, a CUDA kernel each way; counted from its tensors as for the RMSNorm) and an
  ungated GELU (one aten op each way): every framework's LayerNorm models and ungated MLPs.
- torchtune 0.6.1's RMSNorm (modules/rms_norm.py: F.rms_norm on x.float() with a bf16 scale, which the
  dtype mismatch keeps off the fused kernel on CUDA too, then .to(x.dtype)) and RotaryPositionalEmbeddings
  (modules/position_embeddings.py): framework torchtune; measured when torchtune imports (its venv,
  /work/main/.venv/torchtune, has the system's torch, transformers and torchtitan too).

    python -m validation.eager_traffic [--tokens 4096 --hidden 4096 ...]   # writes the record

Kernel counts are one per aten op (a CUDA reduction over a long row is one kernel; a split reduction or a
cat's two copies may launch more).
"""

from __future__ import annotations

import argparse
import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path

RECORDS = Path(__file__).resolve().parents[1] / "tests" / "data" / "measured" / "eager_traffic"
RECORD_NAME = "eager-traffic-bf16.json"
# Llama-3.1-8B's widths: hidden 4096, 32 query and 8 key/value heads of 128, MLP 14336.
SHAPE = {"tokens": 4096, "hidden": 4096, "q_heads": 32, "kv_heads": 8, "head_dim": 128, "ffn": 14336}
# Ops that launch no kernel although their schema does not mark the output as an alias: allocations, and
# _unsafe_view (a view whose schema returns a fresh tensor so autograd does not track the alias).
_NO_KERNEL = ("empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided", "_unsafe_view")


@dataclass(frozen=True)
class Kernel:
    op: str
    read: int
    written: int


def _addressed_bytes(t) -> int:
    """Bytes of the distinct elements a tensor addresses: a stride-0 (broadcast) dimension counts once."""
    elements = math.prod(n for n, s in zip(t.shape, t.stride()) if s != 0)
    return elements * t.element_size()


def _tensors(tree) -> list:
    import torch
    from torch.utils._pytree import tree_leaves
    return [x for x in tree_leaves(tree) if isinstance(x, torch.Tensor)]


def _distinct(tensors: list) -> list:
    seen, out = set(), []
    for t in tensors:
        key = (t.data_ptr(), tuple(t.shape), tuple(t.stride()), t.dtype)
        if key not in seen:
            seen.add(key)
            out.append(t)
    return out


def _moves_nothing(func) -> bool:
    """A view (its output aliases an input without writing it) or an allocation: no kernel."""
    schema = func._schema
    if func.overloadpacket.__name__ in _NO_KERNEL or schema.name.startswith("prim::"):
        return True
    aliases = [r.alias_info for r in schema.returns if r.alias_info is not None]
    return bool(aliases) and not any(a.is_write for a in aliases)


def counting_mode(kernels: list):
    """A TorchDispatchMode appending one Kernel per aten op that moves data."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Count(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            out = func(*args, **kwargs)
            if _moves_nothing(func):
                return out
            inputs = _tensors((args, kwargs))
            written = _distinct(_tensors(out))
            if func.overloadpacket.__name__ == "copy_":
                inputs = inputs[1:]  # copy_(self, src) reads src only
            read = sum(_addressed_bytes(t) for t in _distinct(inputs))
            kernels.append(Kernel(str(func.overloadpacket.__name__), read, sum(_addressed_bytes(t) for t in written)))
            return out

    return Count()


def measure(forward, inputs: list, grads_like=None) -> dict:
    """Run `forward(*inputs)` and autograd's backward through it, each under its own counting mode."""
    import torch
    fwd, bwd = [], []
    with counting_mode(fwd):
        outputs = forward(*inputs)
    outputs = outputs if isinstance(outputs, tuple) else (outputs,)
    grads = [torch.randn_like(o) for o in outputs]
    with counting_mode(bwd):
        torch.autograd.backward(outputs, grads)
    return {"forward": fwd, "backward": bwd}


def _bf16(*shape, grad=True):
    import torch
    return torch.randn(*shape, dtype=torch.bfloat16).requires_grad_(grad)


# --- the chains ------------------------------------------------------------------------------------------

def hf_rms_norm(s: dict) -> dict:
    from transformers.models.llama.modeling_llama import LlamaRMSNorm
    import torch
    norm = LlamaRMSNorm(s["hidden"]).to(torch.bfloat16)
    return measure(norm, [_bf16(s["tokens"], s["hidden"])])


def torch_rms_norm_composite(s: dict) -> dict:
    """torch.nn.RMSNorm as torch 2.13 runs it off CUDA (aten::_fused_rms_norm's CompositeImplicitAutograd)."""
    import torch
    norm = torch.nn.RMSNorm(s["hidden"], eps=1e-5).to(torch.bfloat16)
    return measure(norm, [_bf16(s["tokens"], s["hidden"])])


def torch_rms_norm_cuda(s: dict) -> dict:
    """torch.nn.RMSNorm on CUDA: _fused_rms_norm_cuda and _fused_rms_norm_backward_cuda, counted from the tensors
    each of their kernels reads and writes (the module docstring); shapes and dtypes from the decomposition."""
    import torch
    from torch._decomp.decompositions import _fused_rms_norm as forward_decomp
    x, w = _bf16(s["tokens"], s["hidden"], grad=False), _bf16(s["hidden"], grad=False)
    y, rstd = forward_decomp(x, [s["hidden"]], w, 1e-5)
    dy, dx, dw = torch.randn_like(y), torch.empty_like(x), torch.empty_like(w)
    size = _addressed_bytes
    return {"forward": [Kernel("_fused_rms_norm", size(x) + size(w), size(y) + size(rstd))],
            "backward": [Kernel("_fused_rms_norm_backward (grad input)", size(dy) + size(x) + size(rstd) + size(w),
                                size(dx)),
                         Kernel("_fused_rms_norm_backward (GammaBeta)", size(dy) + size(x) + size(rstd), size(dw))]}


def torch_layer_norm_cuda(s: dict) -> dict:
    """nn.LayerNorm on CUDA (F.layer_norm -> aten::native_layer_norm, one op on every device; this CPU build's kernel
    also computes dW and dB inside its one backward op), counted as layer_norm_kernel.cu runs it (pytorch/pytorch at
    0005c538): forward one kernel reads X, gamma and beta and writes Y and an fp32 mean and rstd a row; backward's
    grad-input kernel reads dY, X, mean, rstd and gamma and writes dX, then GammaBetaBackward (M >= 128 rows) reads
    dY, X, mean and rstd again and writes dgamma and dbeta."""
    import torch
    norm = torch.nn.LayerNorm(s["hidden"]).to(torch.bfloat16)
    x = _bf16(s["tokens"], s["hidden"], grad=False)
    y, mean, rstd = torch.native_layer_norm(x, [s["hidden"]], norm.weight.detach(), norm.bias.detach(), 1e-5)
    w, b = norm.weight.detach(), norm.bias.detach()
    dy, dx = torch.randn_like(y), torch.empty_like(x)
    size = _addressed_bytes
    stats = size(mean) + size(rstd)
    return {"forward": [Kernel("native_layer_norm", size(x) + size(w) + size(b), size(y) + stats)],
            "backward": [Kernel("native_layer_norm_backward (grad input)", size(dy) + size(x) + stats + size(w),
                                size(dx)),
                         Kernel("native_layer_norm_backward (GammaBeta)", size(dy) + size(x) + stats,
                                size(w) + size(b))]}


def torchtune_rms_norm(s: dict) -> dict:
    import torch
    from torchtune.modules import RMSNorm
    return measure(RMSNorm(s["hidden"]).to(torch.bfloat16), [_bf16(s["tokens"], s["hidden"])])


def _rope_tables(s: dict):
    """HF's cos and sin as LlamaRotaryEmbedding returns them: (1, tokens, head_dim), cast to the input's dtype."""
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding
    import torch
    cfg = LlamaConfig(hidden_size=s["q_heads"] * s["head_dim"], num_attention_heads=s["q_heads"],
                      num_key_value_heads=s["kv_heads"], head_dim=s["head_dim"], max_position_embeddings=s["tokens"])
    x = torch.zeros(1, 1, dtype=torch.bfloat16)
    return LlamaRotaryEmbedding(cfg)(x, torch.arange(s["tokens"]).unsqueeze(0))


def hf_rope(s: dict) -> dict:
    """apply_rotary_pos_emb on q (1, Hq, T, d) and k (1, Hk, T, d), made from the projections' (1, T, H * d) outputs
    as LlamaAttention makes them (view, transpose(1, 2)): their backward's reshape copies the transposed gradient."""
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb
    cos, sin = _rope_tables(s)
    T, d = s["tokens"], s["head_dim"]

    def heads(x):
        return x.view(1, T, -1, d).transpose(1, 2)
    q, k = _bf16(1, T, s["q_heads"] * d), _bf16(1, T, s["kv_heads"] * d)
    return measure(lambda q, k: apply_rotary_pos_emb(heads(q), heads(k), cos, sin), [q, k])


def torchtitan_rope(s: dict) -> dict:
    """ComplexRoPE.apply_rotary_emb on q (1, T, Hq, d) and k (1, T, Hk, d) with its complex64 cache."""
    from torchtitan.models.common.rope import ComplexRoPE
    rope = ComplexRoPE(ComplexRoPE.Config(dim=s["head_dim"], max_seq_len=s["tokens"]))
    T, d = s["tokens"], s["head_dim"]
    q, k = _bf16(1, T, s["q_heads"], d), _bf16(1, T, s["kv_heads"], d)
    cache = rope._reshape_cache(q.detach())
    return measure(lambda q, k: rope.apply_rotary_emb(q, k, cache), [q, k])


def torchtune_rope(s: dict) -> dict:
    """RotaryPositionalEmbeddings applied to q and k (1, T, H, d), as torchtune's MultiHeadAttention does."""
    from torchtune.modules import RotaryPositionalEmbeddings
    rope = RotaryPositionalEmbeddings(s["head_dim"], max_seq_len=s["tokens"])
    T, d = s["tokens"], s["head_dim"]
    q, k = _bf16(1, T, s["q_heads"], d), _bf16(1, T, s["kv_heads"], d)
    return measure(lambda q, k: (rope(q), rope(k)), [q, k])


def swiglu(s: dict) -> dict:
    """act(gate) * up: LlamaMLP with ACT2FN["silu"] (transformers), FeedForward's F.silu(w1(x)) * w3(x)
    (torchtitan, torchtune): the same two aten ops."""
    from transformers.activations import ACT2FN
    act = ACT2FN["silu"]
    return measure(lambda gate, up: act(gate) * up, [_bf16(s["tokens"], s["ffn"]), _bf16(s["tokens"], s["ffn"])])


def gelu(s: dict) -> dict:
    """An ungated MLP's activation: F.gelu (ACT2FN["gelu_pytorch_tanh"], nn.GELU), one aten op each way."""
    from transformers.activations import ACT2FN
    return measure(ACT2FN["gelu_pytorch_tanh"], [_bf16(s["tokens"], s["ffn"])])


def fused_bytes(kind: str, s: dict) -> dict:
    """The fused kernel's bytes (operations._elementwise) in bf16: forward in + out, backward out + 2 * in."""
    T = s["tokens"]
    elements_in, elements_out = {
        "norm": (T * s["hidden"], T * s["hidden"]),
        "layernorm": (T * s["hidden"], T * s["hidden"]),
        "gelu": (T * s["ffn"], T * s["ffn"]),
        "rope": ((T * (s["q_heads"] + s["kv_heads"]) * s["head_dim"],) * 2),
        "activation": (2 * T * s["ffn"], T * s["ffn"]),
    }[kind]
    return {"forward": 2 * (elements_in + elements_out), "backward": 2 * (elements_out + 2 * elements_in)}


# chain id -> (kind, measure, the implementations whose eager code it is)
CHAINS = {
    "transformers-llama-rms-norm": ("norm", hf_rms_norm, ("transformers",)),
    "torch-rms-norm-cuda": ("norm", torch_rms_norm_cuda, ("torchtitan",)),
    "torch-rms-norm-composite": ("norm", torch_rms_norm_composite, ()),
    "torchtune-rms-norm": ("norm", torchtune_rms_norm, ("torchtune",)),
    "transformers-rotate-half-rope": ("rope", hf_rope, ("transformers",)),
    "torchtitan-complex-rope": ("rope", torchtitan_rope, ("torchtitan",)),
    "torchtune-rope": ("rope", torchtune_rope, ("torchtune",)),
    "swiglu": ("activation", swiglu, ("transformers", "torchtitan", "torchtune")),
    "torch-layer-norm-cuda": ("layernorm", torch_layer_norm_cuda, ("transformers", "torchtitan", "torchtune")),
    "gelu": ("gelu", gelu, ("transformers", "torchtitan", "torchtune")),
}


def chain_record(chain: str, s: dict) -> dict:
    kind, run, used_by = CHAINS[chain]
    counted = run(s)
    fused = fused_bytes(kind, s)
    out = {"kind": kind, "used_by": list(used_by)}
    for phase, kernels in counted.items():
        moved = sum(k.read + k.written for k in kernels)
        out[phase] = {"bytes": moved, "fused_bytes": fused[phase], "passes": round(moved / fused[phase], 4),
                      "kernels": len(kernels), "ops": [asdict(k) for k in kernels]}
    return out


def torchtune_available() -> bool:
    try:
        import torchtune  # noqa: F401
    except ImportError:
        return False
    return True


def versions() -> dict:
    import torch
    import transformers
    from importlib.metadata import version
    out = {"torch": torch.__version__, "transformers": transformers.__version__, "torchtitan": version("torchtitan")}
    if torchtune_available():
        out["torchtune"] = version("torchtune")
    return out


def record(s: dict | None = None) -> dict:
    s = dict(SHAPE, **(s or {}))
    chains = [c for c in CHAINS if torchtune_available() or not c.startswith("torchtune")]
    return {"id": "eager-traffic-bf16", "harness": "validation/eager_traffic.py", "device": "cpu", "dtype": "bf16",
            "versions": versions(), "shape": s, "chains": {c: chain_record(c, s) for c in chains}}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    for key, value in SHAPE.items():
        parser.add_argument(f"--{key.replace('_', '-')}", type=int, default=value)
    parser.add_argument("--print", action="store_true", help="print the record instead of writing it")
    args = parser.parse_args(argv)
    result = record({k: getattr(args, k) for k in SHAPE})
    text = json.dumps(result, indent=1) + "\n"
    if args.print:
        print(text)
        return
    RECORDS.mkdir(parents=True, exist_ok=True)
    (RECORDS / RECORD_NAME).write_text(text)
    for chain, r in result["chains"].items():
        print(f"{chain:32s} forward {r['forward']['passes']:7.3f}x {r['forward']['kernels']:3d} kernels   "
              f"backward {r['backward']['passes']:7.3f}x {r['backward']['kernels']:3d} kernels")


if __name__ == "__main__":
    main()
