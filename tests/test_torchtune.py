"""framework "torchtune": torchtune's recipes as the estimator models them, by hand. The measured
steps of torchtune's own code are held in tests/test_accuracy.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from estimator import estimate_config
from estimator.spec.errors import ConfigError

LLAMA_3B = 3_212_749_824  # Llama-3.2-3B (tied embeddings), the preset's count
H, LAYERS, HEADS, HEAD_DIM, VOCAB = 3072, 28, 24, 128, 128256
# torchtune's llama3_2 builder: one Llama3ScaledRoPE for every layer, max_seq_len 131,072: its cache
# [131072, head_dim/2, 2] fp32 and theta [head_dim/2] fp32, on the GPU through the run
ROPE = 4 * (131072 * 64 * 2 + 64)
RECORDS = Path(__file__).parent / "data" / "measured" / "torchtune"


def tune(**training) -> dict:
    return {"model": "llama-3.2-3b", "training": {"framework": "torchtune", "seq_len": 4096, **training}}


def components(result, phase: str) -> dict[str, int]:
    stage = result.stages[0]
    out: dict[str, int] = {}
    for c in next(p for p in stage.phases if p.name == phase).components:
        out[c.key] = out.get(c.key, 0) + c.bytes
    return out


def ledger(result, kind: str = "dense") -> dict[str, int]:
    return {line.name: line.bytes for line in result.activation_ledger if line.kind == kind}


def test_pure_bf16_states_and_a_fused_adamw_without_temporaries():
    result = estimate_config(tune())
    step = components(result, "optimizer")
    assert step["parameters"] == 2 * LLAMA_3B
    assert step["gradients"] == 2 * LLAMA_3B
    assert step["optimizer_states"] == 4 * LLAMA_3B  # two bf16 moments
    assert step.get("transient", 0) == 0  # fused AdamW: no foreach sqrt(v) copy
    assert step["buffers"] == ROPE
    assert step["workspace"] == 2 * 32 * 2**20  # PyTorch's cuBLAS workspaces, forward and backward threads
    assert result.stages[0].phase_totals[2][1] == 8 * LLAMA_3B + ROPE + step["workspace"]


def test_a_layer_keeps_the_norms_fp32_copies_and_expanded_keys_and_values():
    T = 4096
    lines = ledger(estimate_config(tune()))
    # torchtune's RMSNorm runs F.rms_norm on x.float() with a bf16 scale, which CUDA does not fuse
    # (a dtype mismatch): the composite ops keep the fp32 input, the rsqrt and the fp32 normalised x
    assert lines["attention norm input (fp32 upcast)"] == 4 * T * H
    assert lines["attention norm input (rsqrt per token, fp32)"] == 4 * T
    assert lines["attention norm input (normalised, before the scale)"] == 4 * T * H
    # k and v expanded from 8 KV heads to all 24 before SDPA: flash keeps q, k, v at 24 heads each
    assert lines["q, and k, v expanded to all heads, kept by flash attention"] == 2 * T * 3 * HEADS * HEAD_DIM


def test_chunked_cross_entropy_keeps_every_chunks_log_softmax():
    T = 4096
    result = estimate_config(tune(loss="chunked"))
    loss = {c.label: c.bytes for c in result.stages[0].components if c.key == "logits" for c in (c.parts or (c,))}
    forward = components(result, "forward")
    # saved: the final norm (fp32 input, rsqrt, fp32 normalised), the head's input copies, every
    # chunk's fp32 log-softmax
    assert sum(loss.values()) == 4 * T * H + 4 * T + 4 * T * H + 2 * T * H + 4 * T * VOCAB
    # forward ends with every chunk's bf16 logits and one chunk's fp32 upcast beside them (one GPU: no
    # other transient); backward starts with one chunk's two fp32 gradients, and once every chunk's loss backward
    # has run (the log-softmax freed), the head's: two chunks' [V, h] bf16 weight gradients and their sum beside
    # 7/8 of the bf16 logits gradients and 2/8 of the hidden-state ones, a chunk's head input freed
    # (memory/activations/chunked_head.py); at 4096 tokens the head's is the larger
    assert forward["transient"] == 2 * T * VOCAB + 4 * T * VOCAB // 8
    loss_moment = 2 * 4 * T * VOCAB // 8
    head_moment = 3 * VOCAB * H * 2 + 7 * T * VOCAB * 2 // 8 + 2 * T * H * 2 // 8 - 4 * T * VOCAB - T * H * 2 // 8
    assert components(result, "backward")["transient"] == head_moment == 1_185_153_024 > loss_moment


def test_offloaded_activations_leave_one_layer_on_the_gpu_in_backward():
    plain = estimate_config(tune(micro_batch_size=2))
    offloaded = estimate_config(tune(micro_batch_size=2, offload_activations=True))
    layer = sum(ledger(plain).values())
    stage = offloaded.stages[0]
    assert stage.host_bytes == LAYERS * layer  # every layer's saved tensors, in pinned host memory
    # on the GPU only the int64 token ids the (trained) embedding keeps
    assert components(offloaded, "forward")["activations"] == 8 * 4096 * 2
    # backward brings one layer back at a time: its last moments hold every bf16 gradient beside the
    # parameters, the AdamW moments and the last layer copied back (measured: tests/data/measured/torchtune)
    start = sum(components(offloaded, "backward").values())
    end = 2 * LLAMA_3B + 4 * LLAMA_3B + 2 * LLAMA_3B + ROPE + layer
    assert dict(stage.phase_totals)["backward"] == max(start, end)


QWEN_7B = {"hidden_size": 3584, "num_layers": 28, "num_attention_heads": 28, "num_kv_heads": 4,
           "intermediate_size": 18944, "vocab_size": 152064, "qkv_bias": True}  # Qwen2.5-7B, head_dim 128


@pytest.mark.parametrize("model, adapter, expected", [
    # Llama 3.2 3B: cos, sin of 64 frequencies per position (32 MiB each), theta
    ("llama-3.2-3b", None, 4 * (131072 * 64 * 2 + 64)),
    # Qwen2RotaryPositionalEmbeddings: cos, sin of the 64 frequencies twice, [131072, 256] fp32
    (QWEN_7B, None, 4 * (131072 * 256 + 64)),
    # lora_qwen2 builds one module per layer (lora_qwen2_self_attention): 28 caches of 128 MiB
    (QWEN_7B, {"method": "lora", "rank": 8}, 28 * 4 * (131072 * 256 + 64)),
    # a shorter builder max_seq_len given as max_position_embeddings (qwen2_5_3b passes 32,768)
    ({**QWEN_7B, "max_position_embeddings": 32768}, None, 4 * (32768 * 256 + 64)),
])
def test_rope_cache_kept_on_the_gpu_by_hand(model, adapter, expected):
    training = {"framework": "torchtune", "seq_len": 4096, **({"adapter": adapter} if adapter else {})}
    result = estimate_config({"model": model, "training": training})
    assert all(components(result, p)["buffers"] == expected for p in ("forward", "backward", "optimizer"))


@pytest.mark.parametrize("path", sorted(RECORDS.glob("*.json")), ids=lambda p: p.stem)
def test_rope_cache_as_measured(path):
    """The harness counts the buffers alive when the step starts (buffer_bytes): the estimate's
    cache and theta per module, each of theta's 256 bytes rounded up to the allocator's 512-byte block."""
    record = json.loads(path.read_text())
    estimate = components(estimate_config(record["config"]), "optimizer")["buffers"]
    modules = record["config"]["model"]["num_layers"] if "qwen" in path.stem and "lora" in path.stem else 1
    assert estimate + modules * (512 - 256) == record["measured"]["buffer_bytes"]


def test_only_torchtune_lists_a_rope_cache():
    # hf lists none; fsdp2 lists torchtitan's per-layer caches instead (transients.py _torchtitan_rope_caches):
    # 28 layers x 4096 positions x 64 complex64, not torchtune's one shared cache of 131,072 positions
    hf = estimate_config({"model": "llama-3.2-3b", "training": {"framework": "hf", "seq_len": 4096}})
    assert "buffers" not in components(hf, "optimizer")
    result = estimate_config({"model": "llama-3.2-3b", "training": {"framework": "fsdp2", "seq_len": 4096}})
    assert components(result, "optimizer")["buffers"] == 28 * 4096 * 64 * 8 == 58_720_256


@pytest.mark.parametrize("cfg, field", [
    ({**tune(), "parallel": {"tp": 2, "dp": 1}}, "parallel.tp"),
    (tune(recompute="selective"), "training.recompute"),
    ({"model": "llama-3.2-3b", "training": {"framework": "fsdp2", "offload_activations": True}},
     "training.offload_activations"),
    (tune(fp8=True), "training.fp8"),
])
def test_what_torchtune_does_not_offer_is_refused(cfg, field):
    with pytest.raises(ConfigError) as err:
        estimate_config(cfg)
    assert err.value.field == field
