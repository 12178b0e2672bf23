"""Issue 22's terms of the step time, each by hand: torch.compile's fused kernels, FP8's casts and its
GEMM efficiency, TP overlap (Megatron's backward, async TP), ring collectives across nodes through
every rank's NIC, and MoE all-to-alls inside and across nodes. The published runs they are held to
are in tests/test_published_throughput.py."""

from __future__ import annotations

import pytest

from estimator.models.presets import get_architecture
from estimator.spec.hardware import Hardware
from estimator.spec.parallel import Parallel
from estimator.spec.training import Training
from estimator.speed import kernels
from estimator.speed.roofline import roofline

H100 = Hardware("h100-80")


def llama_8b():
    return get_architecture("llama-3.1-8b")


def op(result, name, phase="forward"):
    return next(o for o in result.operations if o.name == name and o.phase == phase)


# --- torch.compile ------------------------------------------------------------------------------------

def test_compile_runs_each_norm_rotary_and_activation_as_one_kernel():
    """Eager PyTorch runs RMSNorm as six kernels over ~4x the fused traffic, rotary as four (~4x), SwiGLU
    as two (5/3x) (kernels.EAGER_TRAFFIC); compiled (Inductor fuses each chain into one kernel) they move
    what TransformerEngine's fused kernels move: read the input once, write the output once."""
    tr = Training(framework="fsdp2", seq_len=4096, global_batch_size=8)
    eager = roofline(llama_8b(), tr, Parallel(dp=8), H100)
    compiled = roofline(llama_8b(), Training(framework="fsdp2", seq_len=4096, global_batch_size=8, compile=True),
                        Parallel(dp=8), H100)
    megatron = roofline(llama_8b(), Training(seq_len=4096, global_batch_size=8), Parallel(dp=8), H100)
    for name, passes, launches in (("attention norm", 4.0, 6), ("rotary embedding", 4.0, 4),
                                   ("SwiGLU activation", 5 / 3, 2)):
        assert (op(eager, name).passes, op(eager, name).kernels) == (passes, launches)
        assert (op(compiled, name).passes, op(compiled, name).kernels) == (1.0, 1)
        assert op(compiled, name).expected_time_s == pytest.approx(op(megatron, name).expected_time_s)
    # the norm: 4096 tokens x 4096 in and out, bf16, at 90% of 3.35 TB/s
    assert op(compiled, "attention norm").expected_time_s == pytest.approx(2 * 4096 * 4096 * 2 / (0.9 * 3.35e12))
    assert op(eager, "attention norm").expected_time_s == pytest.approx(4 * 2 * 4096 * 4096 * 2 / (0.9 * 3.35e12))
    # only the memory-bound kernels change: the matmuls and the attention core keep their time
    assert op(compiled, "QKV projection").expected_time_s == op(eager, "QKV projection").expected_time_s
    assert compiled.step.compute_s < eager.step.compute_s
