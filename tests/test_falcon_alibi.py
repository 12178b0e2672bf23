"""Falcon with ALiBi (estimator/memory/activations/alibi.py): the reader's position embedding, the one
b x heads x s x s mask a step and where it outlives the forward, by hand."""

from __future__ import annotations

from dataclasses import replace

from estimator import estimate_config
from estimator.memory.activations.alibi import ALIBI_MASK
from estimator.memory.activations.attention import attention_entries
from estimator.memory.activations.layer import embedding_entries
from estimator.memory.activations.sdpa_mask import FALCON_BIAS
from estimator.memory.activations.sdpa_math import falcon_math_forward_extra
from estimator.models.hf_config import architecture_from_hf_config
from estimator.spec.parallel import Parallel
from estimator.spec.training import Training

# falcon-rw-1b's shape (FalconConfig keys): 32 heads of 64, no multi-query, ALiBi, sequential attention and MLP
RW_1B = {"model_type": "falcon", "hidden_size": 2048, "num_attention_heads": 32, "num_hidden_layers": 24,
         "vocab_size": 50304, "alibi": True, "multi_query": False, "parallel_attn": False, "bias": True}
S, B = 2048, 1


def _arch(**changes):
    arch, _ = architecture_from_hf_config({**RW_1B, **changes})
    return arch


def _names(entries, par=Parallel()):
    return {e.name: e.bytes(par) for e in entries}


def test_the_reader_reads_alibi_as_no_rope():
    arch = _arch()
    assert arch.position_embedding == "alibi" and arch.sdpa_mask_always and arch.num_kv_heads == 32
    assert _arch(alibi=False).position_embedding == "rope"


def test_on_sdpa_the_one_mask_is_kept_not_a_bias_a_layer():
    """SDPA (flash under hf) with equal heads: a fused kernel keeps the float mask FalconModel folded alibi into,
    b x heads x s^2 x 2 B = 32 x 2048^2 x 2 = 268,435,456 B, once per micro-batch (every layer's the same storage),
    and no per-layer bias (a float mask is passed through, not converted); the layer keeps the flash set, q, k and v
    (3 x 2048 x 2048 x 2 B) and the fp32 log-sum-exp (32 x 2048 x 4 B)."""
    arch = _arch()
    sdpa = Training(framework="hf", attention="flash", seq_len=S, micro_batch_size=B, param_dtype="bf16")
    first = _names(embedding_entries(arch, sdpa, Parallel()))
    assert first[ALIBI_MASK] == B * 32 * S * S * 2 == 268_435_456
    layer = _names(attention_entries(arch, sdpa, Parallel()))
    assert FALCON_BIAS not in layer
    assert layer["q, k, v kept by flash attention"] == 3 * S * 2048 * 2
    assert layer["flash log-sum-exp (fp32)"] == S * 32 * 4
    # the same model without ALiBi: a bool mask, converted to a bf16 b x 1 x s x s bias a layer, no ALiBi mask
    rope = _arch(alibi=False)
    assert _names(attention_entries(rope, sdpa, Parallel()))[FALCON_BIAS] == B * S * S * 2
    assert ALIBI_MASK not in _names(embedding_entries(rope, sdpa, Parallel()))
    # under autocast the embeddings' dtype is the fp32 parameters': 4 B an element
    amp = replace(sdpa, param_dtype="fp32", compute_dtype="bf16")
    assert _names(embedding_entries(arch, amp, Parallel()))[ALIBI_MASK] == 4 * 32 * S * S


def test_eager_keeps_it_only_under_recompute():
    """Eager attention adds the mask to its fp32 scores, which keeps no operand: freed as the model's forward
    returns; full recompute keeps it as every checkpointed layer's input."""
    arch = _arch()
    eager = Training(framework="hf", attention="eager", seq_len=S, micro_batch_size=B, param_dtype="bf16")
    assert ALIBI_MASK not in _names(embedding_entries(arch, eager, Parallel()))
    recompute = replace(eager, recompute="full")
    assert _names(embedding_entries(arch, recompute, Parallel()))[ALIBI_MASK] == 268_435_456


def test_multi_query_alibi_runs_the_math_backend_beside_the_mask():
    """A multi-query Falcon with ALiBi: SDPA's math backend (nothing of the mask kept); its forward moment holds the
    step's mask (268,435,456 B) in place of a per-call bias, the fp32 upcasts of q and k (2048 x (2048 + 64) x 4 B)
    and _safe_softmax's row mask (32 x 2048 B)."""
    arch = _arch(multi_query=True)
    assert arch.num_kv_heads == 1
    sdpa = Training(framework="hf", attention="flash", seq_len=S, micro_batch_size=B, param_dtype="bf16")
    assert ALIBI_MASK not in _names(embedding_entries(arch, sdpa, Parallel()))
    extra, formula = falcon_math_forward_extra(arch, sdpa, Parallel())
    assert extra == 268_435_456 + S * (2048 + 64) * 4 + 32 * S
    assert formula.startswith("ALiBi mask 2*b*a*s^2")


def test_the_estimate_counts_the_mask_once():
    """Through estimate_config at s 8192 (activations make the peak): the first stage's per-micro-batch activations
    are the token ids and the mask, 8 x 8192 + 32 x 8192^2 x 2 = 4,295,032,832 B, once; the same model with RoPE
    keeps the token ids alone there."""
    model = {"name": "falcon-rw-1b-like", "hidden_size": 2048, "num_layers": 24, "num_attention_heads": 32,
             "num_kv_heads": 32, "vocab_size": 50304, "intermediate_size": 8192, "gated_mlp": False,
             "norm": "layernorm", "linear_bias": True, "tie_embeddings": True, "fused_qkv": True,
             "eager_softmax_in_compute_dtype": True, "sdpa_mask_always": True}
    training = {"framework": "hf", "seq_len": 8192, "micro_batch_size": 1, "param_dtype": "bf16",
                "attention": "flash"}
    parts = {}
    for positions in ("alibi", "rope"):
        config = {"model": {**model, "position_embedding": positions}, "training": training, "parallel": {},
                  "hardware": {"gpu": "h100-80"}}
        result = estimate_config(config)
        activations = next(c for c in result.stages[0].components if c.label == "Activations")
        parts[positions] = {p.label: p.bytes for p in activations.parts}
    assert parts["alibi"]["token ids and ALiBi mask"] == 8 * 8192 + 32 * 8192**2 * 2 == 4_295_032_832
    assert parts["rope"]["token ids"] == 8 * 8192
