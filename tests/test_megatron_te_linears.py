"""TransformerEngine's linears in the Megatron replay (estimator/memory/megatron_te_linears.py): what their forward
and backward allocate beyond the tensors they keep, with and without sequence parallelism, request by request as
TE v2.11's layernorm_linear.py and linear.py make them."""

from __future__ import annotations

import pytest

from estimator.memory import megatron_te_linears as te
from estimator.memory.megatron_te_linears import Linears
from tests.test_megatron_cp_a2a import _Recorder, _a, _f
from tests.test_published_megatron_reserved import B200
from validation.published_megatron.replay import imported

SP = Linears(full=20, local=10, tp=2, gathers=True)  # a CP rank's [s, h] of 20 bytes over TP 2
PLAIN = Linears(full=20, local=20, tp=1, gathers=False)


@pytest.mark.parametrize("lin, log", [
    # LayerNormLinear: the norm's output, its all-gather, the GEMM's output, the gather freed
    (SP, [_a(10, 1), _a(20, 2), _a(80, 3), *_f(2)]),
    (PLAIN, [_a(20, 1), _a(80, 2)]),
])
def test_column_forward(lin, log):
    program = _Recorder()
    assert te.column_forward(program, lin, lin.local, 80) == (1, 3 if lin.gathers else 2)
    assert [e for e in program.log if e != ("free", None)] == log


@pytest.mark.parametrize("lin, log, out", [
    (SP, [_a(20, 1), _a(10, 2), *_f(1)], 2),  # the GEMM's [s, h] output reduce-scattered, dropped
    (PLAIN, [_a(20, 1)], 1),
])
def test_row_forward(lin, log, out):
    program = _Recorder()
    assert te.row_forward(program, lin) == out
    assert program.log == log


@pytest.mark.parametrize("lin, log", [
    # the output gradient all-gathered, the input gradient, the weight's gradient (the mark), the gather freed
    (SP, [_a(20, 1), _a(60, 2), ("weight",), *_f(1)]),
    (PLAIN, [_a(60, 1), ("weight",)]),
])
def test_row_backward(lin, log):
    program = _Recorder()
    grad = te.row_backward(program, lin, 60, lambda: program.log.append(("weight",)))
    assert grad == (2 if lin.gathers else 1)
    assert [e for e in program.log if e != ("free", None)] == log


@pytest.mark.parametrize("lin, log", [
    # blocks 1, 2, 3: the kept norm output, the saved norm input, the output gradient given; then the norm output's
    # all-gather, the input gradient's GEMM output, its reduce-scatter, the weight's gradient, the norm output and its
    # gather freed, rmsnorm_bwd's input gradient, the reduce-scatter's output dropped, the norm weight's gradient;
    # as backward returns the GEMM output, then autograd's output gradient and saved input, and the input gradient
    # once added into the residual's
    (SP, [_a(20, 4), _a(20, 5), _a(10, 6), ("weight",), *_f(1, 4), _a(10, 7), *_f(6), ("norm",), *_f(5, 3, 2, 7)]),
    (PLAIN, [_a(20, 4), ("weight",), *_f(1), _a(20, 5), ("norm",), *_f(4, 3, 2, 5)]),
])
def test_column_backward(lin, log):
    program = _Recorder()
    saved = [program.alloc(n) for n in (lin.local, lin.local, 80)]
    start = len(program.log)
    te.column_backward(program, lin, *saved, lambda: program.log.append(("weight",)),
                       lambda: program.log.append(("norm",)))
    assert [e for e in program.log[start:] if e != ("free", None)] == log


def test_the_embedding_under_sequence_parallelism():
    """Forward: the lookup over the whole sequence, reduce-scattered, the lookup dropped (the scattered output is freed
    by the caller once the clone exists). Backward: the gradient all-gathered, the masked lookup's index_put gradient,
    the gather freed, the weight's gradient, the masked gradient freed; at TP 1 only the weight's gradient."""
    program = _Recorder()
    assert te.embedding_forward(program, SP) == 2
    te.embedding_backward(program, SP, lambda: program.log.append(("weight",)))
    assert program.log == [_a(20, 1), _a(10, 2), *_f(1), _a(20, 3), _a(20, 4), *_f(3), ("weight",), *_f(4)]
    plain = _Recorder()
    assert te.embedding_forward(plain, PLAIN) is None
    te.embedding_backward(plain, PLAIN, lambda: plain.log.append(("weight",)))
    assert [e for e in plain.log if e != ("free", None)] == [("weight",)]


@pytest.mark.parametrize("run, full, local", [
    # 131,072 tokens / CP 4 = 32,768 a GPU x 16,384 x 2 B = 1 GiB, over TP 2 under sequence parallelism
    ("llama3_405b_l4_tp2_cp4_pp1_dp1_seq131072_mbc4_cef", 2**30, 2**29),
    # 32,768 / CP 8 = 4,096 x 8,192 x 2 B = 64 MiB, TP 1: nothing gathered
    ("llama3_70b_l12_tp1_cp8_pp1_dp1_seq32768_mbc4_cef", 2**26, 2**26),
])
def test_linears_of_a_run(run, full, local):
    from estimator.models.loading import load_config

    cfg = load_config(imported(B200[run]).config)
    lin = te.linears(cfg)
    assert (lin.full, lin.local, lin.gathers) == (full, local, full != local)
