"""torch.compile under torchtitan's activation checkpointing (issue #22), as measured.

Ground truth: validation/compile_sac.py compiled one tiny torchtitan 0.3.0 Llama3 block (dim 64, 8 heads,
2 KV heads, FFN 160, batch 2 x 24 tokens, bf16) with Inductor on CPU under no AC, full AC and op-level
SAC (torchtitan's own FullAC / SelectiveAC, and the 2024-12 (9dec370) / 0.1.0 policies with separate q, k, v), and
read what the partitioner hands to the backward; the same block ran eagerly for what eager checkpointing
keeps. tests/data/measured/compile/torchtitan-llama3-block-sac-bf16-b2-s24.json.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

RECORD = json.loads((Path(__file__).parent / "data" / "measured" / "compile" /
                     "torchtitan-llama3-block-sac-bf16-b2-s24.json").read_text())
B, S, H, F, Q, KV = 2, 24, 64, 160, 64, 2 * 8  # tokens = B*S; q width; one of k, v (2 KV heads x 8)
T = B * S
HEADS = 8


def _shapes(rows):
    return sorted(tuple(r["shape"]) for r in rows)


def test_the_block_is_the_one_measured():
    assert RECORD["block"] == {"dim": H, "heads": HEADS, "kv_heads": 2, "ffn_hidden": F, "batch": B, "seq": S,
                               "dtype": "bfloat16",
                               "bf16_bytes": {"T*h": 2 * T * H, "T*(q+k+v)": 2 * T * (Q + 2 * KV), "T*f": 2 * T * F}}
    assert RECORD["versions"]["torchtitan"] == "0.3.0" and RECORD["versions"]["torch"].startswith("2.13")


@pytest.mark.parametrize("case", ["0.3.0-sdpa", "0.3.0-flex", "2024-12-sdpa", "0.3.0-sdpa-float8-tensorwise"])
def test_compiled_op_sac_keeps_the_policys_saves_the_backward_reads(case):
    """By hand: the block input, the saved (odd) matmuls' outputs except the last one (w2, whose output
    only feeds the residual add: no backward op reads it), the attention output and its fp32
    log-sum-exp. 0.3.0 fuses q, k and v in one linear (matmul 1 saved); 2024-12 splits them (wq and wv
    saved, wk recomputed); w1 (gate) is saved in both."""
    op = RECORD["cases"][case]["op"]
    big = [r for r in op["compiled"] if r["bytes"] > 64]  # float8's per-tensor amax and scales aside
    attention = [(B, HEADS, S, H // HEADS), (B, HEADS, S)]
    if case.startswith("0.3.0"):
        expected = [(B, S, H), (T, Q + 2 * KV), (T, F)] + attention
        total = 2 * T * H + 2 * T * (Q + 2 * KV) + 2 * T * F + 2 * T * H + 4 * B * HEADS * S
    else:
        expected = [(B, S, H), (T, Q), (T, KV), (T, F)] + attention
        total = 2 * T * H + 2 * T * Q + 2 * T * KV + 2 * T * F + 2 * T * H + 4 * B * HEADS * S
    assert _shapes(big) == sorted(expected)
    assert sum(r["bytes"] for r in big) == total


@pytest.mark.parametrize("case", ["0.3.0-sdpa", "2024-12-sdpa", "0.1.0-sdpa", "0.3.0-sdpa-float8-tensorwise"])
def test_eager_op_sac_keeps_one_hidden_sized_tensor_more(case):
    """Eager SAC caches every MUST_SAVE op's output whether or not the backward reads it: the last
    matmul's (w2) output, T x h in bf16, is the only difference (beside float8's 0-dim amaxes and
    scales: eager caches every amax, the compiled block keeps some amaxes and some scales)."""
    op = RECORD["cases"][case]["op"]
    big = {k: sum(r["bytes"] for r in op[k] if r["bytes"] > 64) for k in ("eager", "compiled")}
    assert big["eager"] - big["compiled"] == 2 * T * H
    extra = [tuple(r["shape"]) for r in op["eager"] if r["name"] == "saved"]
    assert extra.count((T, H)) == [tuple(r["shape"]) for r in op["compiled"]].count((T, H)) + 1


@pytest.mark.parametrize("case", ["0.3.0-sdpa", "0.3.0-flex", "2024-12-sdpa"])
def test_full_ac_keeps_the_block_input_alone_compiled_or_not(case):
    full = RECORD["cases"][case]["full"]
    assert [r["shape"] for r in full["compiled"]] == [[B, S, H]]
    if "eager" in full:
        assert full["eager_bytes"] == full["compiled_bytes"] == 2 * T * H


def test_flex_and_sdpa_blocks_save_the_same():
    for mode in ("none", "full", "op"):
        assert (_shapes(RECORD["cases"]["0.3.0-flex"][mode]["compiled"])
                == _shapes(RECORD["cases"]["0.3.0-sdpa"][mode]["compiled"]))


def test_live_measurement_matches_the_record():
    from validation.compile_sac import compiled_saved, eager_saved

    op = RECORD["cases"]["0.3.0-sdpa"]["op"]
    assert compiled_saved("op") == op["compiled"]
    assert eager_saved("op") == op["eager"]
