"""training.compile (GitHub issue #12): each compiled layer keeps what Inductor's min-cut partitioner
saves (torch 2.13 torch/_functorch/partitioners.py min_cut_rematerialization_partition).

Ground truth: validation/compile_saved.py compiled tiny transformers layers (h 64, 4 heads, 2 KV heads,
d_head 16, f 96; b 2, s 8, bf16) with AOTAutograd, Inductor's decompositions and its partitioner on CPU
(torch 2.13, transformers 5.23) and listed the backward graph's saved inputs
(tests/data/measured/compile/transformers-tiny-layers-bf16-b2-s8.json); backend="inductor" saved the same.
"""

import json
import math
from collections import Counter
from pathlib import Path

import pytest

from estimator import activations as act
from estimator.architecture import Architecture
from estimator.errors import ConfigError
from estimator.parallel import Parallel
from estimator.training import Training

RECORD = json.loads((Path(__file__).parent / "data/measured/compile/transformers-tiny-layers-bf16-b2-s8.json")
                    .read_text())
MEASURED = RECORD["cases"]
PAR = Parallel()


def tiny(**kw) -> Architecture:
    return Architecture(name="tiny", hidden_size=64, num_layers=1, num_attention_heads=4, num_kv_heads=2,
                        intermediate_size=96, vocab_size=32, head_dim=16, **kw)


CASES = {"llama-sdpa": (tiny(), "flash"), "llama-eager": (tiny(), "eager"), "qwen3-sdpa": (tiny(qk_norm=True), "flash")}


def ledger(arch, attention, framework="hf", **kw):
    tr = Training(framework=framework, compile=True, seq_len=8, micro_batch_size=2, attention=attention, **kw)
    return act.layer_entries(arch, tr, PAR, "dense")


@pytest.mark.parametrize("case", CASES)
def test_compiled_layer_keeps_the_measured_tensors(case):
    arch, attention = CASES[case]
    measured = Counter((math.prod(t["shape"]), t["bytes_per_element"]) for t in MEASURED[case])
    # the estimator groups like tensors (q, k and v in one entry): compare bytes per dtype size, and the total
    ours = ledger(arch, attention)
    by_size = Counter()
    for e in ours:
        by_size[e.bytes_per_element] += e.bytes(PAR)
    assert dict(by_size) == {b: sum(n * b * c for (n, bb), c in measured.items() if bb == b) for b in (2, 4)}
    assert sum(e.bytes(PAR) for e in ours) == {"llama-sdpa": 23936, "llama-eager": 28288, "qwen3-sdpa": 27392}[case]


def test_measured_totals_by_hand():
    # 16 tokens; per token 2*(4h + (a + 2g)d + ad + 3f) + 4*(2 + a) = 2*(256 + 128 + 64 + 288) + 24 = 1496
    assert sum(math.prod(t["shape"]) * t["bytes_per_element"] for t in MEASURED["llama-sdpa"]) == 16 * 1496
    # eager attention: q, k, v at all heads (3*2*a*d = 384 per token) instead of flash's 2*(a + 2g)d + 4a (272);
    # the QK^T scores and the bf16 probabilities, 2*a*s^2*b = 1024 bytes each, and the softmax's fp32 max and
    # sum per row, 2*4*a*s*b = 512
    assert sum(math.prod(t["shape"]) * t["bytes_per_element"] for t in MEASURED["llama-eager"]) == \
        16 * (1496 - 272 + 384) + 2048 + 512
    # qwen3: the q and k norms keep the projections' outputs 2*(a + g)*d = 192 and rsqrt 4*(a + g) = 24 per token
    assert sum(math.prod(t["shape"]) * t["bytes_per_element"] for t in MEASURED["qwen3-sdpa"]) == 16 * (1496 + 216)


LLAMA_8B = Architecture(name="llama-8b-like", hidden_size=4096, num_layers=32, num_attention_heads=32, num_kv_heads=8,
                        intermediate_size=14336, vocab_size=128256)


def test_llama_8b_compiled_layer_by_hand():
    tr = Training(framework="hf", compile=True, seq_len=4096, micro_batch_size=1)
    # per token: 2*(4*4096 + (32 + 16)*128 + 32*128 + 3*14336) + 4*(2 + 32) = 139264 + 136 = 139400
    assert act.layer_bytes(LLAMA_8B, tr, PAR, "dense") == 4096 * 139400 == 570_982_400
    eager = act.layer_bytes(LLAMA_8B, Training(framework="hf", seq_len=4096, micro_batch_size=1), PAR, "dense")
    # per norm eager keeps the fp32 upcast (4h) and the normalised tensor (2h) where compiled keeps the input
    # (2h): +4h each, two norms; and the SiLU output (2f): per token 2*4*4096 + 2*14336 = 61440
    assert eager - 4096 * 139400 == 4096 * (2 * 4 * 4096 + 2 * 14336)


def test_torchtune_keeps_the_expanded_keys_and_values():
    # torchtune expands k and v to every head before SDPA; the copy is read by the attention kernel's backward
    # (ban_recompute_materialized_backward), so it is kept: 3*a*d instead of (a + 2g)*d, +2*(32 - 8)*128*2 per token
    tr = Training(framework="torchtune", compile=True, seq_len=4096, micro_batch_size=1)
    assert act.layer_bytes(LLAMA_8B, tr, PAR, "dense") == 4096 * (139400 + 12288) == 621_314_048


def test_autocast_keeps_the_fp32_residual_as_the_norm_input():
    tr = Training(framework="hf", compile=True, seq_len=4096, micro_batch_size=1, param_dtype="fp32")
    norms = [e for e in act.layer_entries(LLAMA_8B, tr, PAR, "dense") if "kept by the compiled layer" in e.name
             and "rsqrt" not in e.name]
    assert [(e.bytes_per_element, e.elements) for e in norms] == [(4, 4096 * 4096)] * 2


def test_adapters_still_drop_frozen_weights_inputs():
    entries = ledger(tiny(), "flash")
    assert [e.for_weights for e in entries if e.for_weights] == [("q", "k", "v"), ("gate", "up"), ("down",)]


@pytest.mark.parametrize("framework", ["megatron", "deepspeed"])
def test_refused_where_not_modelled(framework):
    with pytest.raises(ConfigError) as err:
        Training(framework=framework, compile=True)
    assert "training.compile" in str(err.value) and "'fsdp2', 'torchtune' or 'hf'" in str(err.value)
    assert "Megatron runs its own fused kernels" in str(err.value)


def test_refused_for_inference():
    with pytest.raises(ConfigError, match="training.compile"):
        Training(mode="inference", framework="hf", compile=True)


def test_live_measurement_matches_the_record():
    pytest.importorskip("torch", reason="measuring needs torch")
    pytest.importorskip("transformers", reason="measuring needs transformers")
    from validation.compile_saved import saved_tensors
    assert saved_tensors() == MEASURED["llama-sdpa"]


def test_the_record_names_the_versions_it_ran_on():
    assert RECORD["versions"]["torch"] == "2.13.0+cpu" and RECORD["versions"]["transformers"]
