"""validation/gpu/accelerate_case.py on the CPU (what CI can run of the real-GPU case): the model built as
the GPU cases build it, prepared by the real Accelerate, two Trainer steps, model states counted."""

from __future__ import annotations

import pytest

pytest.importorskip("accelerate")


def tiny_llama_weights() -> int:
    # tiny-llama (validation/models.py): h 64, 2 layers, 4 heads of 16, 2 KV heads, MLP 160, vocab 1000, untied
    h, kv, mlp, vocab = 64, 2 * 16, 160, 1000
    layer = h * h * 2 + h * kv * 2 + 3 * h * mlp + 2 * h
    return 2 * layer + 2 * vocab * h + h


def tiny_llama_lora_all_seven(rank: int = 16) -> int:
    h, kv, mlp = 64, 32, 160
    per_layer = rank * ((h + h) * 2 + (h + kv) * 2 + (h + mlp) * 3)
    return 2 * per_layer


def test_the_accelerate_case_runs_on_the_cpu_through_accelerates_mixed_precision():
    from validation.gpu.accelerate_case import selftest

    result = selftest()
    full, lora = result["tiny-llama:full"], result["tiny-llama:lora"]
    for case in (full, lora):  # Accelerate's bf16 on any device outside DeepSpeed/Megatron: native_amp
        assert case["accelerate"] == {"mixed_precision": "bf16", "native_amp": True,
                                      "distributed_type": "DistributedType.NO"}
    weights = tiny_llama_weights()
    assert weights == 214_336
    # full fine-tuning: bf16 weights, foreach AdamW's two bf16 moments
    assert full["parameters"] == full["trainable_parameters"] == 2 * weights
    assert full["optimizer_states"] == 2 * 2 * weights
    # LoRA: the fp32 adapters are trained (peft keeps a bf16 base's adapters in fp32); fused AdamW's two
    # fp32 moments (its step counters are on the CPU here)
    adapters = tiny_llama_lora_all_seven()
    assert lora["trainable_parameters"] == 4 * adapters == 143_360
    assert lora["parameters"] == 2 * weights + 4 * adapters
    assert lora["optimizer_states"] == 2 * 4 * adapters
