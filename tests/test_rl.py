"""RL with a colocated rollout engine (estimator/memory/rl.py), per phase, by hand."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from estimator import estimate_config
from estimator.spec.errors import ConfigError

GiB = 2**30
H100 = 85_520_809_984  # the catalog's h100-80 capacity (CUDA's total memory)
QWEN_7B = 7_615_616_512  # Qwen2.5-7B parameters (the preset's count, tests/test_presets.py)
QWEN_VOCAB = 152_064


def grpo(**rl) -> dict:
    """The issue's example: Qwen2.5-7B on 8 H100s, FSDP2 trainer, rollout with TP 4, 32 prompts x 8
    samples, 1k-token prompts and 8k-token responses."""
    return {"model": "qwen2.5-7b", "training": {"framework": "fsdp2", "recompute": "full",
                                                 "rl": {"algorithm": "grpo", "rollout_batch_size": 32,
                                                        "samples_per_prompt": 8, "max_prompt_len": 1024,
                                                        "max_response_len": 8192, "rollout_tp": 4, **rl}},
            "parallel": {"dp": 8}, "hardware": {"gpu": "h100-80"}}


def phases(result) -> dict:
    return {p.name: p for p in result.rl_phases}


def parts(phase) -> dict[str, int]:
    out: dict[str, int] = {}
    for c in phase.components:
        out[c.key] = out.get(c.key, 0) + c.bytes
    return out


def test_the_rollout_takes_its_memory_fraction_and_the_trainer_is_offloaded():
    result = estimate_config(grpo(engine_memory_fraction=0.5))
    rollout = phases(result)["rollout"]
    p = parts(rollout)
    # the engine's pool is exactly half the GPU: weights + KV cache + working set
    assert p["rollout_weights"] + p["kv_cache"] + p["activations"] == pytest.approx(0.5 * H100, abs=2)
    # bf16 weights over the engine's TP 4; the 57 norms of width 3584 are replicated on every rank
    norms = 3584 * (2 * 28 + 1)
    assert p["rollout_weights"] == 2 * ((QWEN_7B - norms) / 4 + norms)
    assert p["offloaded"] == 0  # the trainer's states are on the host
    # plus the CUDA context and kernels (766.8 MiB measured on Hopper) and one NCCL communicator (DP,
    # 0.5 GiB); nothing fragments
    assert rollout.device_total_bytes == pytest.approx(0.5 * H100 + 804_061_184 + GiB / 2, abs=2)


def test_without_a_fraction_the_kv_cache_holds_every_rollout_sequence():
    # Qwen2.5-7B: 28 layers, 4 KV heads of 128; at TP 4 one KV head per GPU: 2 x 1 x 128 x 2 B x 28
    per_token = 2 * 1 * 128 * 2 * 28
    assert per_token == 14_336
    replicas = 8 // 4
    sequences = 32 * 8 // replicas  # 128 sequences per engine replica
    kv = sequences * (1024 + 8192) * per_token
    p = parts(phases(estimate_config(grpo(engine_memory_fraction=None)))["rollout"])
    assert p["kv_cache"] == kv
    assert kv / GiB == pytest.approx(15.75, abs=0.01)


def test_scoring_holds_the_models_and_one_micro_batch_of_logits():
    result = estimate_config(grpo())
    p = parts(phases(result)["scoring"])
    # FSDP2 over 8 GPUs: fp32 parameter shards and AdamW moments of the policy, the bf16 reference shard
    assert p["parameters"] == round(4 * QWEN_7B / 8)
    assert p["optimizer_states"] == round(8 * QWEN_7B / 8)
    assert p["reference"] == round(2 * QWEN_7B / 8)
    # log-probs of one micro-batch of 1024 + 8192 tokens: bf16 logits and their fp32 log-softmax
    assert p["logits"] == 9216 * QWEN_VOCAB * (2 + 4)


def test_the_training_phase_is_the_trainers_step_on_prompt_plus_response_beside_the_reference():
    result = estimate_config(grpo())
    plain = estimate_config({"model": "qwen2.5-7b", "training": {"framework": "fsdp2", "recompute": "full",
                                                                  "seq_len": 9216},
                             "parallel": {"dp": 8}, "hardware": {"gpu": "h100-80"}})
    training = phases(result)["training"]
    reference = round(2 * QWEN_7B / 8)
    assert training.allocated_bytes == plain.allocated_peak_bytes + reference
    # the verdict is the largest phase's
    assert result.device_total_bytes == max(p.device_total_bytes for p in result.rl_phases)
    assert result.training.seq_len == 9216


def test_ppo_keeps_the_critics_states_in_every_phase_but_the_offloaded_rollout():
    grpo_result = estimate_config(grpo())
    ppo = estimate_config(grpo(algorithm="ppo", critic_model=True, offload_during_rollout=False))
    # the policy's fp32 shards and moments, and fsdp2's (torchtitan's) RoPE caches: 28 layers x 9216 positions
    # x 64 complex64 (the critic has the policy's architecture)
    states = round(4 * QWEN_7B / 8) + round(8 * QWEN_7B / 8) + 28 * 9216 * 64 * 8
    assert parts(phases(ppo)["training"])["critic"] == states
    assert phases(ppo)["scoring"].allocated_bytes == phases(grpo_result)["scoring"].allocated_bytes + states
    # not offloaded: the rollout holds the trainer's states (policy, reference, critic) beside the engine
    held = parts(phases(ppo)["rollout"])
    assert held["parameters"] + held["optimizer_states"] + held["buffers"] + held["reference"] + held["critic"] == \
        2 * states + round(2 * QWEN_7B / 8)


def test_dpo_trains_chosen_and_rejected_together_with_no_rollout():
    dpo = {"model": "qwen2.5-7b", "training": {"framework": "fsdp2", "recompute": "full",
                                                "rl": {"algorithm": "dpo", "max_prompt_len": 1024,
                                                       "max_response_len": 1024}},
           "parallel": {"dp": 8}}
    result = estimate_config(dpo)
    assert [p.name for p in result.rl_phases] == ["scoring", "training"]
    doubled = estimate_config({"model": "qwen2.5-7b", "training": {"framework": "fsdp2", "recompute": "full",
                                                                    "seq_len": 2048, "micro_batch_size": 2},
                               "parallel": {"dp": 8}})
    assert phases(result)["training"].allocated_bytes == doubled.allocated_peak_bytes + round(2 * QWEN_7B / 8)


def test_the_four_gpu_setup_with_halved_batch_samples_and_responses():
    """The issue's second setup: 4 GPUs, 16 prompts x 4 samples, 4k responses, the rollout on TP 4."""
    result = estimate_config({"model": "qwen2.5-7b", "training": {
        "framework": "fsdp2", "recompute": "full",
        "rl": {"rollout_batch_size": 16, "samples_per_prompt": 4, "max_response_len": 4096, "rollout_tp": 4,
               "engine_memory_fraction": None}}, "parallel": {"dp": 4}})
    p = parts(phases(result)["rollout"])
    assert p["kv_cache"] == 64 * (1024 + 4096) * 14_336  # one replica serves all 64 sequences
    assert parts(phases(result)["scoring"])["parameters"] == round(4 * QWEN_7B / 4)


def test_json_output_has_the_rl_phases(tmp_path):
    path = tmp_path / "rl.json"
    path.write_text(json.dumps(grpo()))
    run = subprocess.run([sys.executable, "-m", "estimator", "estimate", "--config", str(path), "--json"],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    out = json.loads(run.stdout)
    assert [p["phase"] for p in out["rl_phases"]] == ["rollout", "scoring", "training"]
    assert out["device_total_bytes"] == max(p["device_total_bytes"] for p in out["rl_phases"])
    assert all({"device_total_bytes", "components"} <= set(p) for p in out["rl_phases"])
    flags = subprocess.run([sys.executable, "-m", "estimator", "estimate", "--config", str(path), "--json",
                            "--rl-samples-per-prompt", "4"], capture_output=True, text=True, timeout=120)
    assert json.loads(flags.stdout)["device_total_bytes"] > 0 and flags.returncode == 0


@pytest.mark.parametrize("rl, training, field", [
    ({"algorithm": "ppo"}, {}, "training.rl.critic_model"),
    ({"critic_model": True}, {}, "training.rl.critic_model"),
    ({"algorithm": "dpo", "reference_model": False}, {}, "training.rl.reference_model"),
    ({}, {"seq_len": 2048}, "training.seq_len"),
    ({"rollout_tp": 3}, {}, "training.rl.rollout_tp"),
    ({"engine_memory_fraction": 1.5}, {}, "training.rl.engine_memory_fraction"),
    ({"engine": "tgi"}, {}, "training.rl.engine"),
    ({"rollouts": 3}, {}, "training.rl.rollouts"),
    ({"algorithm": "dpo"}, {}, "training.rl.rollout_tp"),  # grpo() sets the rollout's TP, unused by DPO
])
def test_bad_rl_settings_name_the_field(rl, training, field):
    cfg = grpo(**rl)
    cfg["training"].update(training)
    with pytest.raises(ConfigError) as err:
        estimate_config(cfg)
    assert err.value.field == field


def test_the_grpo_recipe_fits_with_the_rollout_deciding():
    from estimator.models.presets import get_recipe
    result = estimate_config(get_recipe("qwen2-7b-grpo-8xh100").config)
    assert result.fit.verdict == "fits"
    rollout = phases(result)["rollout"]
    assert result.device_total_bytes == rollout.device_total_bytes
    p = parts(rollout)
    # 0.6 of the GPU for vLLM, the actor's fp32 shards and AdamW moments and the reference's bf16
    # shard left resident (offload_during_rollout false): 4 + 8 + 2 B per parameter over DP 8
    assert p["rollout_weights"] + p["kv_cache"] + p["activations"] == pytest.approx(0.6 * H100, abs=2)
    assert p["parameters"] + p["optimizer_states"] + p["reference"] == \
        round(4 * QWEN_7B / 8) + round(8 * QWEN_7B / 8) + round(2 * QWEN_7B / 8)


def test_the_exports_carry_the_rl_phases_and_round_trip():
    from ui import exports
    cfg = grpo()
    result = estimate_config(cfg)
    rows = [r for r in exports.breakdown_rows(result) if r["kind"] == "rl_phase" and r["component"] == "device_total"]
    assert [(r["peak_phase"], r["bytes"]) for r in rows] == [(p.name, p.device_total_bytes) for p in result.rl_phases]
    back = estimate_config(json.loads(exports.config_json(cfg, result)))
    assert back.device_total_bytes == result.device_total_bytes
    assert exports.report_pdf(result, cfg).startswith(b"%PDF")


def test_the_step_time_is_the_trainers_update_and_says_generation_is_not_timed():
    from estimator.models.loading import load_config
    from estimator.speed.roofline import roofline_config
    rl = roofline_config(load_config(grpo()))
    plain = roofline_config(load_config({"model": "qwen2.5-7b", "training": {
        "framework": "fsdp2", "recompute": "full", "seq_len": 9216}, "parallel": {"dp": 8}}))
    assert rl.step.time_s == plain.step.time_s
    assert any("generation" in note and "not timed" in note for note in rl.notes)


def test_the_advice_offloads_the_trainer_during_the_rollout():
    from estimator.search.advice import suggestions
    from estimator.models.loading import load_config
    from estimator.models.presets import get_recipe
    cfg = get_recipe("qwen2-7b-grpo-8xh100").config  # its rollout phase decides the fit
    found = {s.description: s for s in suggestions(load_config(cfg), limit=20)}
    offload = found["offload the trainer's states to the host during the rollout"]
    cfg["training"]["rl"]["offload_during_rollout"] = True
    assert offload.device_total_bytes == estimate_config(cfg).device_total_bytes


def test_the_trainer_offloaded_during_the_rollout_needs_host_memory():
    result = estimate_config(grpo())  # offload_during_rollout is on by default
    host = result.host_memory_json()
    # the policy's fp32 shards and AdamW moments, its RoPE caches (28 layers x 9216 positions x 64 complex64) and
    # the reference's bf16 shard, per GPU process
    assert host["cpu_bytes_per_gpu"] == round(4 * QWEN_7B / 8) + round(8 * QWEN_7B / 8) + 28 * 9216 * 64 * 8 + \
        round(2 * QWEN_7B / 8)
    kept = estimate_config(grpo(offload_during_rollout=False)).host_memory_json()
    assert kept["cpu_bytes_per_gpu"] == 0


def test_the_phase_chart_draws_the_estimators_components():
    from ui.rl_view import phase_rows, phases_spec
    result = estimate_config(grpo())
    rows = phase_rows(result)
    for p in result.rl_phases:
        drawn = sum(r["GiB"] for r in rows if r["phase"] == p.name)
        assert drawn * GiB == pytest.approx(p.device_total_bytes, abs=1)
    spec = phases_spec(result)
    assert spec["layer"][1]["data"]["values"] == [{"capacity": result.fit.capacity_bytes / GiB}]


@pytest.mark.parametrize("training", [
    {"framework": "megatron", "recompute": "full", "recompute_layers": 1},  # slime's --recompute-num-layers 1
    {"framework": "megatron", "recompute": "selective", "recompute_modules": ["core_attn", "mlp"]},
    {"framework": "fsdp2", "recompute": "full", "recompute_every": 2},
])
def test_the_rollout_drops_the_trainers_recompute_settings(training):
    """The engine runs without recompute: the settings that belong to a recompute mode go with it, and the
    rollout is the same as the one of a trainer that recomputes every layer."""
    cfg = {"model": "qwen2.5-7b", "training": {**training, "rl": {"max_response_len": 4096, "rollout_tp": 4}},
           "parallel": {"tp": 4, "dp": 2} if training["framework"] == "megatron" else {"dp": 8}}
    rollout = phases(estimate_config(cfg))["rollout"]
    plain = dict(cfg, training={"framework": training["framework"], "recompute": "full", "rl": cfg["training"]["rl"]})
    assert parts(rollout) == parts(phases(estimate_config(plain))["rollout"])
