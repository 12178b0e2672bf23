"""transformers' DeepSeek-V3 router keeps its input and weight in fp32 (activations/mlp.py fp32_topk_router):
a tiny real CPU run against the ledger, and the full model's MoE layer by hand."""

from __future__ import annotations

import pytest

from estimator import estimate_config
from estimator.models.presets import get_architecture


def _estimate(framework: str):
    return estimate_config({"model": "deepseek-v3", "training": {"framework": framework, "seq_len": 4096,
                                                                 "micro_batch_size": 1},
                            "parallel": {"dp": 1}, "hardware": {"gpu": "h200"}})


def test_hf_deepseek_router_keeps_fp32_copies_as_a_real_cpu_run():
    """transformers 5.23 DeepseekV3TopkRouter (F.linear(hidden_states.type(torch.float32), self.weight.type(
    torch.float32))) on a tiny real CPU run in bf16: every storage autograd saves, counted once, equals the
    ledger's router entries (activations/mlp.py) plus the group-limited top-k's int64 indices, which the ledger
    leaves out (n_group and topk_group are not architecture fields): 8*T*(2*n_group + topk_group)."""
    pytest.importorskip("transformers.models.deepseek_v3")
    from dataclasses import replace

    import torch
    from transformers import DeepseekV3Config
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3TopkRouter

    from estimator.memory.activations.mlp import _fp32_topk_router_entries, fp32_topk_router
    from estimator.spec.parallel import Parallel
    from estimator.spec.training import Training

    h, e, k, groups, top_groups, T = 64, 16, 3, 4, 2, 32
    router = DeepseekV3TopkRouter(DeepseekV3Config(hidden_size=h, n_routed_experts=e, num_experts_per_tok=k,
                                                   n_group=groups, topk_group=top_groups)).to(torch.bfloat16)
    torch.nn.init.normal_(router.weight, std=0.02)
    x = torch.randn(T, h, dtype=torch.bfloat16, requires_grad=True)
    saved = {}

    def keep(t):
        saved[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(keep, lambda t: t):
        router(x)
    arch = replace(get_architecture("deepseek-v3"), hidden_size=h, num_experts=e, num_experts_per_token=k)
    assert fp32_topk_router(arch, Training(framework="hf"))
    assert not fp32_topk_router(arch, Training(framework="megatron"))
    ledger = sum(entry.bytes(Parallel()) for entry in _fp32_topk_router_entries(arch, T))
    # x fp32 4*T*h, weight fp32 4*E*h, sigmoid 4*T*E, mask T*E, top-k indices 8*T*k, weights and sum 4*T*(k+1)
    assert ledger == 4 * T * h + 4 * e * h + 4 * T * e + T * e + 8 * T * k + 4 * T * (k + 1) == 16_128
    assert sum(saved.values()) == ledger + 8 * T * (2 * groups + top_groups) == 18_688


def test_hf_deepseek_v3_moe_layer_keeps_the_fp32_router_copies():
    """DeepSeek-V3 under the HF Trainer, s = 4096, b = 1: an MoE layer's ledger holds the router's fp32 input
    (4*s*h = 117,440,512) and weight (4*E*h = 7,340,032) copies; Megatron's router keeps neither."""
    lines = [line for line in _estimate("hf").activation_ledger if line.kind == "moe" and "fp32 copy" in line.name]
    assert sorted(line.bytes for line in lines) == [4 * 256 * 7168, 4 * 4096 * 7168]
