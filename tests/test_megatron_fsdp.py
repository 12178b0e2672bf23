"""Megatron-FSDP (estimator/memory/megatron_fsdp.py): Adam's moments at the DTensor's global shape under
TransformerEngine 2.10-2.11's FusedAdam (training.te_version; Megatron-Core 0.16's pip extra installs 2.11),
and the backward's all-gather prefetch."""

import copy

import pytest

from canonical import LLAMA_31_8B
from estimator import Parallel, Training, estimate, estimate_config
from validation.published_megatron.replay import imported, records

# Megatron-LM's golden case gpt3_mcore_te_tp2_zp_z3_resume_fsdp_dtensor: GPT, hidden 512, 12 layers, FFN 2048,
# learned positions 1024, vocabulary 50257 padded to 50432 (128 x TP 2), tied, TP 2 x DP 4, optim_grads_params
CASE = "gpt-gpt3_mcore_te_tp2_zp_z3_resume_fsdp_dtensor"
H, F, V, POS, LAYERS, TP, DP = 512, 2048, 50432, 1024, 12, 2, 4


def by_hand() -> tuple[int, int]:
    """(the whole model's parameters: each tensor at its global shape, this GPU's share under TP 2)."""
    split = 3 * H * H + 3 * H + H * H + F * H + F + H * F  # QKV weight and bias, proj, fc1 weight and bias, fc2
    replicated = H + H + 4 * H  # proj and fc2 biases (row-parallel), two layernorms' weights and biases
    whole = V * H + POS * H + LAYERS * (split + replicated) + 2 * H  # + the final layernorm
    local = V * H // TP + POS * H + LAYERS * (split // TP + replicated) + 2 * H
    return whole, local


def golden_config(version: str | None = None, te: str | None = None) -> dict:
    record = next(r for r in records("megatron_golden") if r["id"] == CASE)
    config = copy.deepcopy(imported(record).config)
    if version:
        config["training"]["framework_version"] = version
    if te:
        config["training"]["te_version"] = te
    return config


def components(result, phase: int) -> dict:
    return {c.key: c for c in result.stages[0].phases[phase].components}


def test_the_model_by_hand():
    whole, local = by_hand()
    assert (whole, local) == (64_175_104, 32_368_640)
    assert estimate_config(golden_config()).stages[0].parameters_per_gpu == local


def test_adam_moments_are_whole_under_megatron_core_0_16():
    """TE 2.11's FusedAdam: torch.empty(param.shape) of a DTensor whose shape is the whole parameter; main
    weights, gradients and bf16 weights stay sharded over DP 4. After a step Megatron-LM's golden value
    reads 700,103,168 B allocated: 96 MiB of workspaces (cuBLAS 2 x 32 MiB, TE 32 MiB) beside
    8 x 64,175,104 + (2 + 4 + 4) x 32,368,640 / 4 = 594,322,432 B of states, 5.1 MB under."""
    whole, local = by_hand()
    step = components(estimate_config(golden_config()), 2)
    assert step["optimizer_states"].bytes == 8 * whole == 513_400_832
    assert "global shape" in step["optimizer_states"].formula and "fused_adam.py" in step["optimizer_states"].source
    assert (step["parameters"].bytes, step["master_weights"].bytes, step["gradients"].bytes) == \
        (2 * local // DP, 4 * local // DP, 4 * local // DP)
    states = sum(step[k].bytes for k in ("parameters", "master_weights", "gradients", "optimizer_states"))
    assert states == 8 * whole + 10 * local // DP == 594_322_432
    assert 0 < 700_103_168 - 3 * 32 * 2**20 - states < 6_000_000  # ZeRO-3: 145,658,880


def test_megatron_core_0_19_pins_a_fused_adam_that_shards_them():
    _, local = by_hand()
    step = components(estimate_config(golden_config("0.19")), 2)
    assert step["optimizer_states"].bytes == 8 * local // DP


@pytest.mark.parametrize("version,te,whole_moments", [
    (None, "2.9", False), (None, "2.10", True), (None, "2.11", True), (None, "2.12", False),
    ("0.19", "2.11", True), ("0.19", "2.17", False), ("0.16", None, True), ("0.19", None, False)])
def test_the_rule_follows_the_transformer_engine_release(version, te, whole_moments):
    """TE v2.9's FusedAdam builds a moment with empty_like(param), v2.10 and v2.11 with empty(param.shape)
    (commit c52576053), v2.12 on with empty_like again (fe8fad59c); without te_version, the TE that the
    Megatron-Core release installs: 2.11 for 0.16 (pip extra dev: >=2.9.0a0,<2.12.0), 2.17 for 0.19 (rev 4329ff84)."""
    whole, local = by_hand()
    step = components(estimate_config(golden_config(version, te)), 2)
    assert step["optimizer_states"].bytes == (8 * whole if whole_moments else 8 * local // DP)


def test_te_version_is_refused_outside_megatron():
    from estimator import ConfigError

    config = {"model": "llama-3.1-8b", "training": {"framework": "fsdp2", "te_version": "2.11"},
              "parallel": {"dp": 8, "zero_stage": 3}}
    with pytest.raises(ConfigError, match=r"te_version.*2\.11.*unless framework is 'megatron'"):
        estimate_config(config)
    config["training"] = {"framework": "megatron", "te_version": "2.1"}
    with pytest.raises(ConfigError, match=r"te_version"):
        estimate_config(config)


def test_the_distributed_optimizer_is_untouched():
    config = golden_config()
    config["parallel"]["zero_stage"] = 1
    _, local = by_hand()
    assert components(estimate_config(config), 2)["optimizer_states"].bytes == 8 * local // DP


def parts(result, phase: int) -> dict:
    return {p.label: p for p in components(result, phase)["transient"].parts}


def test_backward_prefetches_every_unit_of_a_small_model():
    """A layer holds 1,577,728 elements on a GPU: 317 of them reach the 500M-element prefetch, so the first
    backward hook gathers all 12 layers beside the root unit: every parameter, 2 B each."""
    _, local = by_hand()
    result = estimate_config(golden_config())
    gathered = parts(result, 1)["Unsharded parameters in flight"]
    assert gathered.bytes == 2 * local and "12 of 12 layers" in gathered.formula
    layer = (3 * H * H + 3 * H + H * H + F * H + F + H * F) // TP + 6 * H
    root = V * H // TP + POS * H + 2 * H
    assert parts(result, 0)["Unsharded parameters in flight"].bytes == 2 * (2 * layer + root)  # forward: unchanged


def test_backward_prefetch_stops_at_500m_elements():
    """Llama-3.1-8B on DP 8: a layer is 218,112,000 elements, 3 more reach 500M, so 4 layers and the root
    unit (embedding, final norm, LM head) are gathered when a layer's backward starts."""
    layer, root = 218_112_000, 2 * 128256 * 4096 + 4096
    result = estimate(LLAMA_31_8B, Training(), Parallel(dp=8, zero_stage=3))
    gathered = parts(result, 1)["Unsharded parameters in flight"]
    assert gathered.bytes == pytest.approx(2 * (4 * layer + root), abs=1)
    assert "4 of 32 layers" in gathered.formula
