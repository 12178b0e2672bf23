"""Adapter fine-tuning sharded by FSDP2 (torchtune's lora_finetune_distributed), by hand: frozen weights get
no gradient, an NF4 shard is gathered as NF4 (torchao's NF4Tensor.fsdp_pre_all_gather), and the root unit,
resharded at the end of the model's forward, is not gathered beside the loss. The measured steps
(tests/data/measured/torchtune/*-w*, validation/torchtune on a fake process group) are held in
tests/test_accuracy.py."""

from __future__ import annotations

import pytest

from estimator import estimate_config

H, F, KV, LAYERS, VOCAB = 4096, 14336, 1024, 32, 128256  # Llama-3.1-8B
RANK = 8
# torchtune's 8B LoRA targets: q, v, output_proj and the MLP's w1, w2, w3 (recipes/configs/llama3_1/8B_lora.yaml)
TARGETS = ["q", "v", "o", "gate", "up", "down"]
ADAPTERS_PER_LAYER = RANK * ((H + H) + (H + KV) + (H + H) + 3 * (H + F))
LINEARS = [H * H, KV * H, KV * H, H * H, F * H, F * H, F * H]  # q, k, v, o, gate, up, down


def sharded(method: str, dp: int = 8, recompute: str = "full") -> dict:
    return {"model": "llama-3.1-8b", "training": {
        "framework": "torchtune", "seq_len": 4096, "micro_batch_size": 2, "param_dtype": "bf16", "grad_dtype": "bf16",
        "optimizer_dtype": "bf16", "recompute": recompute, "loss": "chunked",
        "adapter": {"method": method, "rank": RANK, "alpha": 16, "target_modules": TARGETS}},
        "parallel": {"dp": dp, "zero_stage": 3}}


def transients(cfg: dict, phase: str) -> dict[str, int]:
    stage = estimate_config(cfg).stages[0]
    return {c.label: c.bytes for p in stage.phases if p.name == phase for c in p.components
            for c in (c.parts or (c,)) if c.key == "transient"}


def test_a_units_unsharded_gradients_are_its_adapters_only():
    backward = transients(sharded("lora"), "backward")
    # bf16 adapter gradients and bf16 reduce-scatter input: 2 x 2 B x one layer's adapters; no frozen weight's
    assert backward["Unsharded gradients of one unit (and the reduce-scatter input)"] == (2 + 2) * ADAPTERS_PER_LAYER


def test_a_layer_is_gathered_in_its_storage_dtype():
    norms = 2 * H
    lora = transients(sharded("lora"), "backward")["Unsharded parameters in flight"]
    assert lora == 2 * (2 * (sum(LINEARS) + norms) + 2 * ADAPTERS_PER_LAYER)  # a layer and the prefetched one
    qlora = transients(sharded("qlora", dp=4), "backward")["Unsharded parameters in flight"]
    # torchao NF4 (the stored layout): codes 0.5 B, an int8 scale per 64, a bf16 factor per 256 scales, and two
    # 512-byte allocations per weight (its mean and code book), the norms bf16
    nf4 = sum(n / 2 + n / 64 + 2 * n / 16384 + 1024 for n in LINEARS)
    assert qlora == pytest.approx(2 * (nf4 + 2 * norms + 2 * ADAPTERS_PER_LAYER), abs=2)
    assert qlora < lora / 3


def test_the_root_unit_is_gathered_at_the_end_of_the_forward_not_beside_the_loss():
    forward = transients(sharded("lora"), "forward")
    # the loss's moment (after the model's forward, the root resharded): the bf16 logits of the 8 chunks and one
    # chunk's fp32 upcast, and no unsharded parameter beside them
    loss = 2 * 2 * 4096 * VOCAB + 4 * (2 * 4096 // 8) * VOCAB
    assert forward == {"bf16 logits of every chunk": 2 * 2 * 4096 * VOCAB, "one chunk's fp32 upcast": loss - 2 * 2 * 4096 * VOCAB}
    # the other moment, the output projection with the root unit (embedding, output, final norm) gathered, is smaller
    root = 2 * (2 * VOCAB * H + H)
    assert root < loss
    stage = estimate_config(sharded("lora")).stages[0]
    assert stage.phase_totals[0][1] == sum(c.bytes for c in next(p for p in stage.phases if p.name == "forward").components)


def step_parts(cfg: dict) -> dict[str, int]:
    stage = estimate_config(cfg).stages[0]
    return {c.key: c.bytes for p in stage.phases if p.name == "optimizer" for c in p.components}


def test_each_rank_keeps_a_step_counter_per_adapter_tensor():
    # fused AdamW's 0-dim fp32 step per parameter (a 512-byte block), on every rank: each holds a shard of each
    # tensor. 32 layers x 6 adapted modules x (A, B) = 384 counters beside the bf16 moments' shard
    tensors = 32 * 6 * 2
    assert step_parts(sharded("lora"))["optimizer_states"] == 2 * 2 * LAYERS * ADAPTERS_PER_LAYER / 8 + 512 * tensors


def test_torchtunes_qwen2_keeps_its_attention_projections_without_adapters_in_bf16():
    # lora_qwen2_self_attention builds the projections it does not adapt as nn.Linear (with their biases)
    # whatever quantize_base: k_proj stays bf16 beside the NF4 q, v, o and MLP (Qwen2.5-7B: 512 x 3584)
    cfg = {"model": "qwen2.5-7b", "training": {
        "framework": "torchtune", "seq_len": 4096, "param_dtype": "bf16", "grad_dtype": "bf16",
        "optimizer_dtype": "bf16", "recompute": "full", "loss": "chunked",
        "adapter": {"method": "qlora", "rank": RANK, "alpha": 16, "target_modules": TARGETS}}}
    all_nf4 = dict(cfg, training=dict(cfg["training"], adapter=dict(cfg["training"]["adapter"],
                                                                     target_modules=TARGETS + ["k"])))
    k = 512 * 3584
    nf4_k = k / 2 + k / 64 + 2 * k / 16384 + 1024
    adapter_k = RANK * (3584 + 512)
    difference = step_parts(cfg)["parameters"] - step_parts(all_nf4)["parameters"]
    assert difference == round(28 * (2 * k - nf4_k - 2 * adapter_k))
