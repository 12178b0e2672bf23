"""Other calculators' worked examples against this estimator (estimator/memory/references.py): which figures it
reproduces and which it does not, each number by hand or quoted from the source (the figures as written
out in the project's research notes, seed-examples.md)."""

from __future__ import annotations

import pytest

from estimator import estimate_config
from estimator.memory import references
from estimator.models.presets import get_recipe

GiB = 2**30
QWEN_7B = 7_615_616_512
QWEN_PER_GPU = (QWEN_7B - 3584 * 57) // 4 + 3584 * 57  # TP 4: the matrices split, the 57 norms whole
LLAMA_8B = 8_030_261_248


def rows(comparison) -> dict:
    return {r.item: r for r in comparison.rows}


@pytest.fixture(scope="module")
def guide():
    return {s: rows(references.guide_rl(s)) for s in ("A", "B")}


def test_the_recipes_are_the_guides_runs_with_slimes_flags():
    a, b = (get_recipe(references.GUIDE_RECIPES[s]).config for s in ("A", "B"))
    assert a["parallel"] | {"gpus": 8} == {"tp": 4, "pp": 1, "dp": 2, "zero_stage": 1, "gpus": 8}
    assert (a["training"]["rl"]["rollout_batch_size"], a["training"]["rl"]["samples_per_prompt"],
            a["training"]["rl"]["max_response_len"]) == (32, 8, 8192)
    assert (b["parallel"]["tp"], b["parallel"]["dp"]) == (4, 1)
    assert (b["training"]["rl"]["rollout_batch_size"], b["training"]["rl"]["samples_per_prompt"],
            b["training"]["rl"]["max_response_len"]) == (16, 4, 4096)
    for cfg in (a, b):
        assert cfg["training"]["framework"] == "megatron" and cfg["training"]["rl"]["engine"] == "sglang"
        assert estimate_config(cfg).fit.verdict == "fits"


def test_parameters_are_unsharded_in_the_guide_and_split_by_tp_here(guide):
    row = guide["A"]["Model parameters"]
    assert row.theirs == 14e9 and QWEN_PER_GPU == 1_904_057_344
    assert row.ours == 2 * QWEN_PER_GPU and not row.reproduced


def test_gradients_b_is_fp32_over_tp_and_a_follows_no_rule(guide):
    assert guide["B"]["Gradients"].theirs == 7e9 and guide["B"]["Gradients"].ours == 4 * QWEN_PER_GPU
    assert guide["B"]["Gradients"].reproduced  # 7e9 x 4 B / 4 against 7.6B x 4 B / 4: 9% apart
    assert guide["A"]["Gradients"].theirs == pytest.approx(5.6e9) and not guide["A"]["Gradients"].reproduced


def test_the_distributed_optimizer_shards_over_dp_which_the_guide_leaves_out(guide):
    # slime always runs Megatron's distributed optimizer: 12 B (fp32 master + two Adam moments) / TP / DP
    assert guide["A"]["Optimizer states"].ours == 12 * QWEN_PER_GPU / 2
    assert guide["B"]["Optimizer states"].ours == 12 * QWEN_PER_GPU
    assert guide["B"]["Optimizer states"].theirs == 7e9 * 16 / 4 == 28e9
    assert not guide["A"]["Optimizer states"].reproduced and not guide["B"]["Optimizer states"].reproduced


def test_the_guides_kv_formula_has_no_gqa(guide):
    row = guide["A"]["KV cache"]
    # 2 x 28 layers x 3584 x 8192 tokens x 32 sequences x 2 B / TP 4: 24.5 GiB exactly
    assert row.theirs == 2 * 28 * 3584 * 8192 * 32 * 2 / 4 and row.theirs / GiB == 24.5
    # GQA: 4 KV heads of 128, one per GPU at TP 4: 2 x 128 x 2 B x 28 layers = 14,336 B per token
    assert row.ours == 32 * 8192 * 14_336 and row.theirs / row.ours == 7
    assert guide["B"]["KV cache"].theirs / GiB == 12.25  # "~12.0": the same 32 sequences at 4096 tokens
    # the rollout itself holds 32 prompts x 8 samples over 2 engines: 128 sequences of 1024 + 8192 tokens
    rollout = next(p for p in estimate_config(get_recipe(references.GUIDE_RECIPES["A"]).config).rl_phases
                   if p.name == "rollout")
    assert next(c.bytes for c in rollout.components if c.key == "kv_cache") == 128 * 9216 * 14_336


def test_activations_match_the_guides_reading_of_recompute_not_slimes(guide):
    # the guide's 9.8 is what 1 recomputed layer and 27 stored ones keep (Megatron's block method) ...
    row = guide["A"]["Activations"]
    assert row.theirs == 9.8e9 and row.reproduced
    # ... but slime's --recompute-method uniform --recompute-num-layers 1 checkpoints every layer
    assert guide["A"]["Activations as slime runs them"].ours < 0.2 * row.ours


def test_the_total_is_a_phase_not_a_sum_and_b_needs_more_per_gpu(guide):
    assert guide["A"]["Total per GPU"].theirs == 80e9 and not guide["A"]["Total per GPU"].reproduced
    claimed, ours = references.guide_memory_saving()
    assert claimed == 0.35 and ours < 0  # DP 1 shards no optimizer state: B needs more per GPU than A


def test_the_8b_calculators_states_are_megatron_with_bf16_gradients():
    r = rows(references.calculator_8b())
    assert r["Parameters"].ours == r["Gradients"].ours == 2 * LLAMA_8B
    assert r["Optimizer states"].ours == r["Optimizer states"].theirs == 12 * LLAMA_8B  # "adam, 12N": 96.4 GB
    assert r["Activations"].theirs == 34 * 4096 * 4096 * 32  # 18.3 GB
    # all but the overhead: Megatron-Core's four NCCL communicators of one rank (NCCL's kernels 85 x 2 MiB and
    # 4 x 194 allocations of 2 MiB, estimator/spec/nccl.py) come on top of the context and fragmentation
    assert [item for item, row in r.items() if not row.reproduced] == ["Framework overhead"]
    stage = estimate_config(references.CALCULATOR_8B_CONFIG).stages[0]
    assert stage.component("communication").bytes == (85 + 4 * 194) * 2 * 2**20


def test_the_mode_calculators_shapes_and_counts_describe_different_models():
    r = rows(references.mode_calculator())
    for name in ("Medium transformer training", "Serving configuration", "Large fine-tuning run"):
        assert not r[f"{name}: parameters"].reproduced
    assert r["Medium transformer training: parameters"].ours > 9 * 700e6  # 32 x 4096 is a 6-7B model
    # its KV term: batch x tokens x hidden x layers x 2 x 2 B, what a multi-head model of that shape keeps
    assert r["Serving configuration: KV cache"].ours == 4 * 1024 * 4096 * 32 * 2 * 2 and \
        r["Serving configuration: KV cache"].reproduced
    # a GPT layer without dropout keeps 32 B per token x hidden (Korthikanti's 34 less the two 1-byte dropout
    # masks) and flash attention's fp32 log-sum-exp per head, 4 x 32 / 4096: beyond the flat 8-12 x 2 B
    multiplier = r["Training: activation multiplier"]
    assert multiplier.ours == 32 + 4 * 32 / 4096 and not multiplier.reproduced
