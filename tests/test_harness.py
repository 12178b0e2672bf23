"""The measuring harness (validation/): fake-tensor measurements equal real CPU runs byte for byte,
and its numbers agree with hand computation. Needs the [validate] extra (torch, transformers)."""

import contextlib
import copy
import functools
import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch", reason="the measuring harness needs torch (the [validate] extra)")
pytest.importorskip("transformers", reason="the measuring harness needs transformers (the [validate] extra)")

from validation.core.emulation import FlashAttention  # noqa: E402
from validation.core.tracker import StorageTracker, cuda_block_bytes  # noqa: E402
from validation.hf.cases import CASES, contract_config  # noqa: E402
from validation.hf.plugin import HARNESS  # noqa: E402
from validation.hf.step import Run, measure  # noqa: E402

SEQ, BATCH = 64, 2

# Every recipe / recompute / attention variant the harness supports, on tiny models (2 layers,
# hidden 64, vocab 1000, 4 query heads over 2 KV heads).
VARIANTS = [
    Run("tiny-llama", SEQ, BATCH, recipe=r, recompute=rc, attention=a)
    for r in ("bf16", "amp") for rc in ("none", "full") for a in ("sdpa", "eager")
] + [
    Run("tiny-llama", SEQ, BATCH, optimizer="sgd_momentum"),
    Run("tiny-llama", SEQ, BATCH, recipe="amp", optimizer="sgd_momentum", recompute="full", attention="eager"),
    Run("tiny-mixtral", SEQ, BATCH),
    Run("tiny-mixtral", SEQ, BATCH, recompute="full"),
    Run("tiny-gemma2", SEQ, BATCH, attention="eager"),
    Run("tiny-gemma2", SEQ, BATCH, recipe="amp", recompute="full", attention="eager"),
    # the config's residual and embedding dropouts, CUDA's fused native_dropout (validation/hf/dropout.py)
    Run("tiny-phi3", SEQ, BATCH, dropout=0.1), Run("tiny-gpt2", SEQ, BATCH, recompute="full", dropout=0.1),
    Run("tiny-neox", SEQ, BATCH, recipe="amp", dropout=0.1), Run("tiny-starcoder2", SEQ, BATCH, dropout=0.1),
    Run("tiny-falcon", SEQ, BATCH, attention="eager", dropout=0.1),
    # Falcon on flash-attn's kernel (validation/hf/falcon.py): multi-query, and the new architecture's k, v copies
    Run("tiny-falcon", SEQ, BATCH, attention="flash_attention_2"),
    Run("tiny-falcon-new", SEQ, BATCH, recipe="amp", recompute="full", attention="flash_attention_2"),
    # GPT-2's gelu_new under autocast: pow on CUDA autocast's fp32 list (validation/core/autocast.py)
    Run("tiny-gpt2", SEQ, BATCH, recipe="amp", attention="eager"),
]


@functools.lru_cache(maxsize=None)  # a dozen tiny runs
def _fake(run: Run) -> dict:
    return measure(run, fake=True)


def fake_measure(run: Run) -> dict:
    """The fake-tensor measurement of `run`, once per test run (a copy each call): the by-hand checks read the
    same tiny runs as the equality with the real CPU run."""
    return copy.deepcopy(_fake(run))


@pytest.mark.parametrize("run", VARIANTS, ids=lambda r: f"{r.model}-{r.recipe}-{r.optimizer}-{r.recompute}-{r.attention}")
def test_fake_measurement_equals_real_cpu_run(run):
    fake, real = fake_measure(run), measure(run, fake=False)
    assert fake == real


def test_allocator_rounding():
    assert [cuda_block_bytes(n) for n in (0, 1, 512, 513, 128000)] == [0, 512, 512, 1024, 128000]


# tiny-llama's weights by hand: embedding and LM head 1000 x 64; per layer q, o 64x64, k, v 32x64
# (2 KV heads of 16), gate, up 160x64, down 64x160, two norms of 64; a final norm of 64.
TINY_LLAMA_NUMELS = [1000 * 64, 1000 * 64, 64] + 2 * [64 * 64, 32 * 64, 32 * 64, 64 * 64,
                                                     160 * 64, 160 * 64, 64 * 160, 64, 64]


@pytest.mark.parametrize("recipe, width", [("bf16", 2), ("amp", 4)])
def test_state_categories_by_hand(recipe, width):
    weights = sum(cuda_block_bytes(n * width) for n in TINY_LLAMA_NUMELS)
    adamw = fake_measure(Run("tiny-llama", SEQ, BATCH, recipe=recipe))
    sgd = fake_measure(Run("tiny-llama", SEQ, BATCH, recipe=recipe, optimizer="sgd_momentum"))
    for m in (adamw, sgd):
        assert all(p["parameters"] == weights for p in m["phases"].values())
        # zero_grad(set_to_none) left no gradient; the optimizer step runs with all of them
        assert m["phases"]["forward"]["gradients"] == 0
        assert m["phases"]["optimizer"]["gradients"] == weights
    assert adamw["optimizer_states"] == 2 * weights  # exp_avg, exp_avg_sq in the param dtype
    assert sgd["optimizer_states"] == weights  # momentum buffer
    # foreach AdamW's one temporary: _foreach_sqrt(exp_avg_sq), a copy of every state
    assert adamw["phases"]["optimizer"]["activations"] - sgd["phases"]["optimizer"]["activations"] == weights


def test_flash_attention_keeps_q_k_v_output_and_lse():
    b, h, g, s, d = 2, 8, 2, 256, 64
    tracker = StorageTracker()
    q = torch.randn(b, h, s, d, dtype=torch.bfloat16, requires_grad=True)
    k, v = (torch.randn(b, g, s, d, dtype=torch.bfloat16, requires_grad=True) for _ in range(2))
    with tracker:
        tracker.start()
        before = sum(tracker.adopt(x) * 0 + tracker.live_at(len(tracker.events))[tracker.key(x)] for x in (q, k, v))
        out = FlashAttention.apply(q, k, v, None, True, tracker.hidden)
    forward = sum(tracker.live_at(len(tracker.events)).values()) - before
    # new in the forward: the (b, s, h, d) output in bf16 and the fp32 log-sum-exp (b, h, s)
    assert forward == b * s * h * d * 2 + b * h * s * 4
    reference = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    assert torch.allclose(out.float(), reference.float(), atol=1e-2)
    grads = torch.autograd.grad(out, (q, k, v), torch.ones_like(out))
    ref_grads = torch.autograd.grad(reference, (q, k, v), torch.ones_like(reference))
    for g_, r_ in zip(grads, ref_grads):
        assert torch.allclose(g_.float(), r_.float(), atol=5e-2)


def test_flash_backward_transients_by_hand():
    """mha_bwd's scratch: dq_accum fp32 (b, s rounded to 128, h, d), softmax_d fp32 (b, h, s
    rounded to 128), and for GQA per-query-head dK and dV, on top of dq, dk, dv."""
    b, h, g, s, d = 1, 8, 2, 200, 64

    def projected(heads):  # as transformers hands them over: a (b, s, heads, d) projection, transposed
        return torch.randn(b, s, heads, d, dtype=torch.bfloat16).transpose(1, 2).requires_grad_()

    q, k, v = projected(h), projected(g), projected(g)
    tracker = StorageTracker()
    with tracker:
        out = FlashAttention.apply(q, k, v, None, True, tracker.hidden)
        grad_out = torch.ones(b, s, h, d, dtype=torch.bfloat16).transpose(1, 2)  # o_proj's layout
        tracker.start()  # the log starts with q, k, v, out, lse, grad_out
        before = sum(size for _, size in tracker.events)
        with tracker.phase("backward"):
            out.backward(grad_out)
    peak = tracker.peaks(lambda key: "activations")["backward"]["activations"] - before
    bf16 = b * s * h * d + 2 * (b * s * g * d) + 2 * (b * s * h * d)  # dq, dk, dv, dK/dV expanded
    fp32 = b * h * 256 + b * 256 * h * d  # softmax_d, dq_accum (s rounded up to 256)
    assert peak == 2 * bf16 + 4 * fp32


def test_records_are_complete():
    records = HARNESS.load_all()
    assert len(records) >= 30 and {r["id"] for r in records} == set(CASES)
    for r in records:
        assert r["step_measured"] == 2
        assert r["config"] == contract_config(CASES[r["id"]])
        m = r["measured"]
        assert m["peak_bytes"] == sum(m[c] for c in ("parameters", "gradients", "optimizer_states", "activations"))
        assert m["phases"][m["peak_phase"]]["total"] == m["peak_bytes"]
        assert all(isinstance(v, int) for p in m["phases"].values() for v in p.values())
        assert r["command"] == f"python -m validation measure --case {r['id']}"


def test_a_record_reproduces():
    case = "llama-3.1-8b-bf16-adamw-norecompute-sdpa-s2048-b2"
    stored = json.loads(Path(HARNESS.records / f"{case}.json").read_text())
    if {k: stored["versions"][k] for k in ("torch", "transformers")} != \
            {k: HARNESS.versions()[k] for k in ("torch", "transformers")}:
        pytest.skip(f"records were measured with {stored['versions']}, this is {HARNESS.versions()}")
    assert measure(CASES[case]) == stored["measured"]


def test_cpu_autocast_gets_cudas_fp32_lists():
    """Under the emulation a CPU autocast runs CUDA autocast's fp32 ops in fp32 (autocast_mode.h AT_FORALL_FP32,
    AT_FORALL_FP32_SET_OPT_DTYPE), the cast recorded by autograd, so GPT-2's gelu_new saves an fp32 copy of its
    bf16 input for pow's backward: 4 B an element where the CPU's own autocast keeps the 2 B input itself. An
    explicit dtype is kept; outside autocast nothing changes."""
    from torch.autograd.graph import saved_tensors_hooks
    from transformers.activations import NewGELUActivation
    from validation.core.autocast import cuda_autocast_lists

    def saved_by_gelu(emulate: bool) -> list[torch.dtype]:
        x = torch.randn(4, 8, dtype=torch.bfloat16, requires_grad=True)
        saved = []
        with (cuda_autocast_lists() if emulate else contextlib.nullcontext()), \
                torch.autocast("cpu", dtype=torch.bfloat16), saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
            y = NewGELUActivation()(x)
        return y.dtype, [t.dtype for t in saved if t.shape == x.shape]

    assert saved_by_gelu(False) == (torch.bfloat16, [torch.bfloat16] * 4)  # x (by pow), tanh, 0.5 x, 1 + tanh
    out, dtypes = saved_by_gelu(True)
    # pow's fp32 x, tanh's output, the last product's 1 + tanh and 0.5 x
    assert (out, dtypes) == (torch.float32, [torch.float32, torch.float32, torch.float32, torch.bfloat16])
    x = torch.randn(4, 8, dtype=torch.bfloat16)
    with cuda_autocast_lists(), torch.autocast("cpu", dtype=torch.bfloat16):
        assert (x.softmax(-1).dtype, x.softmax(-1, dtype=torch.bfloat16).dtype, x.sum().dtype) == \
            (torch.float32, torch.bfloat16, torch.float32)
    with cuda_autocast_lists():
        assert x.pow(3.0).dtype == torch.bfloat16
