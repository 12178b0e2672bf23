"""flash-linear-attention's chunked gated delta rule on a real GPU against its emulation.

`python -m validation.hybrid.gpu_fla OUT.json` on a CUDA machine with fla importable runs
`chunk_gated_delta_rule` as Qwen3-Next's layer calls it (q, k, v as views of the conv output,
l2-normalised in the kernel, fp32 g, bf16 beta) and writes torch.cuda's counts: the bytes the forward
leaves alive (saved tensors and output), the forward's peak and the backward's peak above what was
alive when it started. `emulated(shape)` gives the same four numbers from validation/hybrid/kernels.py
under fake tensors (tests/test_harness_hybrid.py compares them with the stored GPU record)."""

from __future__ import annotations

import json
import sys

SHAPES = [  # (B, T, H, K, HV, V): Qwen3-Next-80B-A3B's linear-attention layer
    (1, 4096, 16, 128, 32, 128),
    (2, 2048, 16, 128, 32, 128),
    (1, 8192, 16, 128, 32, 128),
]


def inputs(torch, shape, device):
    B, T, H, K, HV, V = shape
    bf16 = torch.bfloat16
    mixed = torch.randn(B, T, 2 * H * K + HV * V, dtype=bf16, device=device, requires_grad=True)
    q, k, v = mixed.split([H * K, H * K, HV * V], dim=-1)  # Qwen3NextGatedDeltaNet.forward's views
    q, k, v = q.reshape(B, T, H, K), k.reshape(B, T, H, K), v.reshape(B, T, HV, V)
    g = -torch.rand(B, T, HV, device=device, requires_grad=True)
    beta = torch.rand(B, T, HV, dtype=bf16, device=device, requires_grad=True)
    return q, k, v, g, beta


def measure_gpu(shape) -> dict:
    import torch

    import fla.ops.common.chunk_o as chunk_o
    from fla.ops.gated_delta_rule import chunk_gated_delta_rule

    # fla refuses the gated chunk_bwd_dqkwg on Hopper with Triton 3.4 to 3.7.0 (wrong values, fla #640); the
    # allocations do not depend on the values, so the refusal is lifted for this memory measurement
    chunk_o.TRITON_ABOVE_3_7_1 = True

    def step():
        q, k, v, g, beta = inputs(torch, shape, "cuda")
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        o, _ = chunk_gated_delta_rule(q, k, v, g=g, beta=beta, use_qk_l2norm_in_kernel=True)
        torch.cuda.synchronize()
        forward_alive = torch.cuda.memory_allocated() - base
        forward_peak = torch.cuda.max_memory_allocated() - base
        do = torch.randn_like(o)
        torch.cuda.synchronize()
        start = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        o.backward(do)
        torch.cuda.synchronize()
        return {"forward_alive": forward_alive, "forward_peak": forward_peak,
                "backward_peak": torch.cuda.max_memory_allocated() - start}

    step()  # Triton autotuning and compilation happen here
    torch.cuda.empty_cache()
    return step()


def emulated(shape) -> dict:
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode
    from transformers.models.qwen3_next.modeling_qwen3_next import torch_chunk_gated_delta_rule

    from ..core.tracker import StorageTracker
    from .kernels import chunk_gated_delta_rule

    tracker = StorageTracker()
    with FakeTensorMode(), tracker:
        fn = chunk_gated_delta_rule(tracker.hidden, torch_chunk_gated_delta_rule)
        q, k, v, g, beta = inputs(torch, shape, "cpu")
        tracker.start()
        base = sum(size for _, size in tracker.events)
        with tracker.phase("forward"):
            o, _ = fn(q, k, v, g=g, beta=beta, use_qk_l2norm_in_kernel=True)
        alive = sum(tracker.live_at(len(tracker.events)).values()) - base
        do = torch.randn_like(o)
        start = sum(tracker.live_at(len(tracker.events)).values())
        with tracker.phase("backward"):
            o.backward(do)
    peaks = tracker.peaks(lambda key: "activations")
    return {"forward_alive": alive, "forward_peak": peaks["forward"]["total"] - base,
            "backward_peak": peaks["backward"]["total"] - start}


def main(argv=None) -> int:
    import torch
    import triton

    import fla

    out = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
           "fla": getattr(fla, "__version__", None), "shapes": {}}
    for shape in SHAPES:
        try:
            out["shapes"][str(shape)] = measure_gpu(shape)
        except Exception as e:  # noqa: BLE001 - reported, not hidden
            out["shapes"][str(shape)] = {"error": f"{type(e).__name__}: {e}"}
    text = json.dumps(out, indent=2)
    print(text)
    if argv or sys.argv[1:]:
        with open((argv or sys.argv[1:])[0], "w") as f:
            f.write(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
