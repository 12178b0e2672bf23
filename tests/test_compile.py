"""training.compile (GitHub issue #12): each compiled layer keeps what Inductor's min-cut partitioner
saves (torch 2.13 torch/_functorch/partitioners.py min_cut_rematerialization_partition).

Ground truth: validation/compile_saved.py compiled tiny transformers layers (h 64, 4 heads, 2 KV heads,
d_head 16, f 96; b 2, s 8, bf16) with AOTAutograd, Inductor's decompositions and its partitioner on CPU
(torch 2.13, transformers 5.23) and listed the backward graph's saved inputs
(tests/data/measured/compile/transformers-tiny-layers-bf16-b2-s8.json); backend="inductor" saved the same.
torchtitan's compiled loss: validation/compile_saved.py loss_buffers compiled its cross_entropy_loss with
backend="inductor" on CPU and listed the generated code's allocations
(tests/data/measured/compile/torchtitan-cross-entropy-bf16-n64-v4096.json).
"""

import json
import math
from collections import Counter
from pathlib import Path

import pytest

from estimator.memory.activations.layer import layer_bytes, layer_entries
from estimator.memory.activations.loss import loss_memory, torchtitan_loss_moments
from estimator.spec.architecture import Architecture
from estimator.spec.errors import ConfigError
from estimator.spec.parallel import Parallel
from estimator.spec.training import Training

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
    return layer_entries(arch, tr, PAR, "dense")


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
    assert layer_bytes(LLAMA_8B, tr, PAR, "dense") == 4096 * 139400 == 570_982_400
    eager = layer_bytes(LLAMA_8B, Training(framework="hf", seq_len=4096, micro_batch_size=1), PAR, "dense")
    # per norm eager keeps the fp32 upcast (4h) and the normalised tensor (2h) where compiled keeps the input
    # (2h): +4h each, two norms; and the SiLU output (2f): per token 2*4*4096 + 2*14336 = 61440
    assert eager - 4096 * 139400 == 4096 * (2 * 4 * 4096 + 2 * 14336)


def test_torchtune_keeps_the_expanded_keys_and_values():
    # torchtune expands k and v to every head before SDPA; the copy is read by the attention kernel's backward
    # (ban_recompute_materialized_backward), so it is kept: 3*a*d instead of (a + 2g)*d, +2*(32 - 8)*128*2 per token
    tr = Training(framework="torchtune", compile=True, seq_len=4096, micro_batch_size=1)
    assert layer_bytes(LLAMA_8B, tr, PAR, "dense") == 4096 * (139400 + 12288) == 621_314_048


def test_autocast_keeps_the_fp32_residual_as_the_norm_input():
    tr = Training(framework="hf", compile=True, seq_len=4096, micro_batch_size=1, param_dtype="fp32")
    norms = [e for e in layer_entries(LLAMA_8B, tr, PAR, "dense") if "kept by the compiled layer" in e.name
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


# --- torchtitan's compiled loss (CompileConfig.components = ["model", "loss"]) --------------------------------

LOSS_RECORD = json.loads((Path(__file__).parent / "data/measured/compile/torchtitan-cross-entropy-bf16-n64-v4096.json")
                         .read_text())


def test_compiled_cross_entropy_by_hand():
    """Inductor fuses cross_entropy_loss's fp32 upcast, log-softmax and NLL (64 x 4096 bf16 logits): the forward
    allocates two fp32 values per row (max, log-sum-exp) and the fp32 loss, and hands the backward the logits,
    the labels and those two per-row values; the backward allocates one fp32 value per row and the bf16 gradient
    of the logits. No (64, 4096) fp32 tensor exists: eager makes the upcast, the log-softmax and two gradients."""
    def total(buffers):
        return sum(math.prod(b["shape"]) * b["bytes_per_element"] for b in buffers)

    n, v = 64, 4096
    assert total(LOSS_RECORD["forward_buffers"]) == 2 * 4 * n + 4
    assert LOSS_RECORD["saved"] == ["primals_1", "primals_2", "buf0", "buf2"]  # logits, labels, max, log-sum-exp
    assert total(LOSS_RECORD["backward_buffers"]) == 4 * n + 2 * n * v
    assert LOSS_RECORD["versions"]["torch"] == "2.13.0+cpu" and LOSS_RECORD["versions"]["torchtitan"] == "0.3.0"


def _chunk(compile: bool, seq: int, dp: int = 8) -> dict[str, float]:
    tr = Training(framework="fsdp2", compile=compile, seq_len=seq, micro_batch_size=1, loss="chunked")
    par = Parallel(dp=dp)
    return {e.name: e.bytes(par) for e in loss_memory(LLAMA_8B, tr, par, LLAMA_8B.vocab_size).forward}


def test_compiled_loss_chunk_per_token_is_the_measured_one():
    # per token of a chunk: the bf16 logits (2V, the lm_head's output) + what the record's compiled functions add
    # per token (2V + 4 in backward, 8 kept from forward) = 4V + 12 bytes
    measured = 2 * 4096 + LOSS_RECORD["backward_buffers"][1]["shape"][1] * 2 + 4 + 8
    assert measured == 4 * 4096 + 12
    tr = Training(framework="fsdp2", compile=True, seq_len=8192, micro_batch_size=1, loss="chunked")
    chunk = torchtitan_loss_moments(LLAMA_8B, tr, PAR, LLAMA_8B.vocab_size)[0]
    assert sum(e.bytes(PAR) for e in chunk) == 8192 / 8 * (4 * LLAMA_8B.vocab_size + 12) == 525_348_864
    eager = torchtitan_loss_moments(LLAMA_8B, Training(framework="fsdp2", seq_len=8192, micro_batch_size=1,
                                                           loss="chunked"), PAR, LLAMA_8B.vocab_size)[0]
    assert sum(e.bytes(PAR) for e in eager) == 8192 / 8 * 14 * LLAMA_8B.vocab_size


def test_compiled_loss_moves_the_largest_moment():
    """Llama-3.1-8B at 64k tokens on one GPU, 8 chunks of 8192 tokens: eager, a chunk's cross-entropy is the
    loss's largest moment, (2 + 12) B x 8192 x 128,256 = 14.7 GB; compiled it is 4 B x 8192 x 128,256 + 12 B x
    8192, and the chunk's head-weight gradient (2 B x 128,256 x 4096) with the chunk's logits and their
    gradient (2 x 2 B x 8192 x 128,256) is larger: 5.25 GB. Both beside the accumulators (4 B x 65,536 x 4096
    and 4 B x 128,256 x 4096)."""
    V, h, c = 128_256, 4096, 8192
    eager, compiled = _chunk(False, 65536, dp=1), _chunk(True, 65536, dp=1)
    accumulators = 4 * 65536 * h + 4 * V * h
    assert sum(eager.values()) == accumulators + 14 * c * V == 17_884_512_256
    assert sum(compiled.values()) == accumulators + 2 * V * h + 4 * c * V == 8_428_453_888
    assert "one chunk's LM head weight gradient (parameter dtype)" in compiled


def test_live_loss_measurement_matches_the_record():
    pytest.importorskip("torch", reason="measuring needs torch")
    pytest.importorskip("torchtitan", reason="measuring needs torchtitan")
    from validation.compile_saved import loss_buffers
    assert loss_buffers() == {k: LOSS_RECORD[k] for k in ("forward_buffers", "saved", "backward_buffers")}


# --- the compiled loss, one implementation: torchtitan's CrossEntropyLoss and torchtune's compile_loss ---------

def _loss(framework: str, loss: str, compile: bool, tp: int = 1):
    tr = Training(framework=framework, compile=compile, seq_len=8192, micro_batch_size=1, loss=loss)
    par = Parallel(tp=tp, dp=8)
    m = loss_memory(LLAMA_8B, tr, par, LLAMA_8B.vocab_size)
    return ({e.name: e.bytes(par) for e in m.saved}, {e.name: e.bytes(par) for e in m.forward},
            {e.name: e.bytes(par) for e in m.backward}, m.source)


S, V = 8192, 128_256


def test_torchtitan_compiled_standard_loss_keeps_bf16_logits_and_row_statistics():
    """torchtitan compiles CrossEntropyLoss with the model (components ["model", "loss"]): kept for backward
    the bf16 logits (2 B each) and an fp32 max and log-sum-exp per token; backward allocates the bf16 gradient
    and an fp32 value per token (the record above, per token). Eager keeps the fp32 log-softmax (4 B), makes
    the fp32 upcast beside the bf16 logits in forward and two fp32 gradients in backward."""
    saved, forward, backward, source = _loss("fsdp2", "standard", True)
    assert saved["logits in the compute dtype, kept by the compiled cross-entropy"] == 2 * S * V
    assert saved["fp32 max and log-sum-exp per token (compiled cross-entropy)"] == 8 * S
    assert forward == {} and sum(backward.values()) == 2 * S * V + 4 * S
    assert "torchtitan-cross-entropy-bf16-n64-v4096" in source
    e_saved, e_forward, e_backward, _ = _loss("fsdp2", "standard", False)
    assert e_saved["fp32 log-softmax of the logits"] == 4 * S * V
    assert sum(e_forward.values()) == (2 + 4) * S * V and sum(e_backward.values()) == 8 * S * V


def test_torchtune_compile_loss_compiles_each_chunk_of_the_chunked_loss():
    """torchtune 0.6.1 recipes call training.compile_loss whenever compile=True: for CEWithChunkedOutputLoss it
    compiles compute_cross_entropy (upcast + cross-entropy per chunk) in place. Every chunk's bf16 logits are
    then kept (the compiled graphs' inputs) with 8 B per token, instead of every chunk's fp32 log-softmax; the
    backward's largest moment is one chunk's bf16 gradient and 4 B per token of it (8 chunks)."""
    saved, forward, backward, source = _loss("torchtune", "chunked", True)
    assert saved["logits in the compute dtype, kept by the compiled cross-entropy"] == 2 * S * V
    assert "fp32 log-softmax of every chunk" not in saved and forward == {}
    assert sum(backward.values()) == (2 * S * V + 4 * S) / 8
    assert "compile_loss" in source
    e_saved, e_forward, e_backward, _ = _loss("torchtune", "chunked", False)
    assert e_saved["fp32 log-softmax of every chunk"] == 4 * S * V
    assert sum(e_forward.values()) == 2 * S * V + 4 * S * V / 8


@pytest.mark.parametrize("framework, loss, tp", [
    ("fsdp2", "standard", 2),  # the loss-parallel autograd Function under TP: not measured, eager ledger
    ("torchtune", "standard", 1),  # full_finetune_distributed.py:345 drops compile_loss's compiled module
    ("hf", "standard", 1),  # the Trainer's loss: eager ledger
])
def test_the_loss_stays_eager_where_it_is_not_compiled_or_not_measured(framework, loss, tp):
    saved, _, _, _ = _loss(framework, loss, True, tp)
    assert not any("compiled cross-entropy" in name for name in saved)
    assert saved["fp32 log-softmax of the logits"] == 4 * S * V / tp  # the eager ledger's


def test_torchtitan_releases_share_the_compiled_loss():
    """versions.py: torchtitan 0.3.0 and main compile the loss alike, so the estimate is the same."""
    from estimator.memory.memory import estimate_config

    config = {"model": "llama-3.1-8b", "training": {"framework": "fsdp2", "compile": True, "seq_len": 8192},
              "parallel": {"dp": 8}}
    main = {**config, "training": {**config["training"], "framework_version": "main"}}
    assert estimate_config(config).allocated_peak_bytes == estimate_config(main).allocated_peak_bytes
