"""What to change: every suggestion is one change, estimated in full, lower than the original."""

import pytest

from estimator import estimate, load_config
from estimator.search.advice import suggestions

# Llama-3.1-70B on 8 H100s with plain data parallelism and no recompute: far over 80 GiB
OOM = {"model": "llama-3.1-70b", "training": {"seq_len": 8192, "micro_batch_size": 2, "global_batch_size": 64},
       "parallel": {"dp": 8, "zero_stage": 1}}


def test_suggestions_lower_the_total_and_are_real_estimates():
    cfg = load_config(OOM)
    base = estimate(cfg.architecture, cfg.training, cfg.parallel, cfg.hardware)
    assert base.fit.verdict == "oom"
    found = suggestions(cfg)
    assert found
    for s in found:
        again = estimate(s.config.architecture, s.config.training, s.config.parallel, s.config.hardware)
        assert again.device_total_bytes == s.device_total_bytes < base.device_total_bytes
        assert again.fit.verdict == s.verdict
        # one change at a time, on the same number of GPUs here (DP 8 can be halved)
        assert s.config.parallel.gpus == cfg.parallel.gpus
        # the same samples per optimizer step
        t = s.config.training
        assert (t.global_batch_size or t.micro_batch_size * s.config.parallel.dp) == 64
    verdicts = [s.verdict for s in found]
    assert verdicts == sorted(verdicts, key=["fits", "tight", "oom"].index)
    descriptions = " | ".join(s.description for s in found)
    assert "tensor parallel 2 (DP 4: same GPUs, same global batch)" in descriptions


def test_a_run_that_fits_can_still_be_made_smaller_but_never_larger():
    cfg = load_config({"model": "llama-3.1-8b", "parallel": {"tp": 8}})
    base = estimate(cfg.architecture, cfg.training, cfg.parallel, cfg.hardware)
    assert all(s.device_total_bytes < base.device_total_bytes for s in suggestions(cfg))


def test_invalid_variants_are_skipped():
    # Llama-3.1-8B's 8 KV heads cannot be split over TP 16: that variant must simply not appear
    cfg = load_config({"model": "llama-3.1-8b", "parallel": {"tp": 8, "dp": 1}})
    assert not any("tensor parallel 16" in s.description for s in suggestions(cfg, limit=50))


def test_a_plan_reaches_a_fit_step_by_step():
    from estimator.search.advice import plan_to_fit
    # Llama-3.1-8B at 32k tokens on 8 GPUs without recompute: over 80 GiB, yet it can fit on them
    cfg = load_config({"model": "llama-3.1-8b", "training": {"seq_len": 32768, "global_batch_size": 8},
                       "parallel": {"dp": 8, "zero_stage": 1}})
    base = estimate(cfg.architecture, cfg.training, cfg.parallel, cfg.hardware)
    assert base.fit.verdict == "oom"
    steps = plan_to_fit(cfg)
    assert steps and steps[-1].verdict == "fits"
    totals = [s.device_total_bytes for s in steps]
    assert totals == sorted(totals, reverse=True)  # every step lowers the total
    final = steps[-1].config
    result = estimate(final.architecture, final.training, final.parallel, final.hardware)
    assert result.fit.verdict == "fits" and result.device_total_bytes == totals[-1]
    assert final.parallel.gpus == 8


def test_seventy_billion_on_eight_gpus_needs_more_gpus():
    # 70.6e9 parameters x 18 bytes (Megatron bf16 + Adam) = 1.27 TB, more than 8 x 80 GB: no change
    # on 8 GPUs fits, so the plan's last steps must ask for more of them
    from estimator.search.advice import plan_to_fit
    assert 70_553_706_496 * 18 > 8 * 80e9
    steps = plan_to_fit(load_config(OOM))
    assert all(s.verdict != "fits" for s in steps if s.gpus == 8)


def test_the_advice_finds_layouts_that_move_several_settings():
    """Llama-3.1-70B at 8k tokens on DP 8: doubling one setting at a time never fits on these 8
    GPUs, and no layout of 8 H100s does: Megatron's model states alone are 70.6e9 parameters x 18 B
    (bf16 weights, fp32 gradients, master weights and two Adam moments) / 8 GPUs = 159 GB even fully
    sharded, over the 79.6 GiB of an H100. So the plan is the planner's nearest layout on the fewest
    GPUs that fit (a power of two), estimated in full."""
    from estimator import estimate
    from estimator.search.advice import plan_to_fit
    from estimator.models.loading import load_config
    cfg = load_config({"model": "llama-3.1-70b", "training": {"seq_len": 8192}, "parallel": {"dp": 8}})
    greedy = plan_to_fit(cfg, use_planner=False)
    assert greedy and greedy[-1].verdict != "fits"
    [step] = plan_to_fit(cfg)
    assert step.description.startswith("use more GPUs: at least 32 (no layout fits on 8)")
    assert step.gpus == 32 and step.verdict == "fits"
    again = estimate(step.config.architecture, step.config.training, step.config.parallel, step.config.hardware)
    assert again.device_total_bytes == step.device_total_bytes and again.fit.verdict == "fits"
    assert step.config.training.seq_len == 8192 and step.config.parallel.gpus == 32


def test_fields_that_follow_tp_are_no_moves_of_their_own():
    """One owner for "etp = tp, sequence parallel with tp > 1" (parallel.tp_following_defaults):
    a layout that moves TP 1 -> 8 carries etp 8 and sequence parallelism with it, and the
    distance counts exactly the moves the description shows: log2(8) = 3 for TP, 2 for PP 1 -> 4,
    5 for DP 32 -> 1 and 1 for the recompute setting."""
    from estimator import Parallel, Training
    from estimator.search.advice import _describe, _distance, _moves
    from estimator.search.layouts import Layout

    cfg = load_config({"model": "llama-3.1-8b", "parallel": {"dp": 32}})
    moved = Layout(parallel=Parallel(tp=8, pp=4, dp=1), training=Training(recompute="full"),
                   device_total_bytes=1, peak_stage=0, utilization=0.5, step_time_s=1.5, tokens_per_s_per_gpu=1.0,
                   mfu=0.4)
    assert [(name, before, after) for name, before, after, _ in _moves(cfg, moved)] == [
        ("tp", 1, 8), ("pp", 1, 4), ("dp", 32, 1), ("recompute", "none", "full")]
    # the moves, and 1.5 / 1.0 - 1 of slowdown against the fastest fitting layout
    assert _distance(cfg, moved, fastest_s=1.0) == 3 + 2 + 5 + 1 + 0.5
    assert _describe(cfg, moved).startswith(
        "the planner's nearest fitting layout: tp 1 -> 8, pp 1 -> 4, dp 32 -> 1, recompute none -> full (")



DEEPSPEED_FOREACH = {"model": "qwen2.5-7b", "hardware": {"gpu": "h200"}, "parallel": {"dp": 1, "zero_stage": 3},
                     "training": {"framework": "deepspeed", "seq_len": 2048, "micro_batch_size": 1,
                                  "recompute": "full", "optimizer": "adamw", "adamw_implementation": "foreach"}}


def test_the_8bit_optimizer_suggestion_drops_deepspeeds_adamw_kernel():
    """A DeepSpeed ZeRO-3 run stepped by torch's foreach AdamW (training.adamw_implementation, an AdamW setting) that
    is tight on one H200: the 8-bit optimizer suggestion clears the AdamW kernel instead of making a configuration
    the validation refuses, which ended the whole advice (and `estimate`) with an error about the user's own,
    valid configuration."""
    import json
    import subprocess
    import sys

    found = {s.description: s for s in suggestions(load_config(DEEPSPEED_FOREACH))}
    eight_bit = found["8-bit Adam (bitsandbytes)"]
    assert eight_bit.config.training.optimizer == "adam8bit" and eight_bit.config.training.adamw_implementation is None
    assert eight_bit.verdict == "fits"
    done = subprocess.run([sys.executable, "-m", "estimator", "estimate", "--config", "-"],
                          input=json.dumps(DEEPSPEED_FOREACH), capture_output=True, text=True)
    assert done.returncode == 0 and "1. 8-bit Adam (bitsandbytes)" in done.stdout, done.stderr


# Qwen3-8B LoRA r16 at 32k tokens with full recompute on one H100: 95 GiB, out of memory; the full logits and
# their fp32 softmax dominate
LIGER_OOM = {"model": "qwen3-8b", "parallel": {"dp": 1},
             "training": {"framework": "hf", "seq_len": 32768, "recompute": "full", "adapter": {"rank": 16}}}


def test_liger_kernels_are_offered_where_they_lower_the_peak():
    """The Trainer's use_liger_kernel (training.liger_kernel with Liger's fused linear cross-entropy, loss
    'chunked') is a candidate of its own: judged by a full estimate, it goes below the chunked loss alone (Liger's
    RMSNorm and SwiGLU keep less in the recomputed layer) and is the first step of the CLI's plan."""
    import json
    import subprocess
    import sys

    from estimator import estimate_config
    done = subprocess.run([sys.executable, "-m", "estimator", "estimate", "--json", "--config", "-"],
                          input=json.dumps(LIGER_OOM), capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert out["fit"]["verdict"] == "oom"
    step = out["plan_to_fit"][0]
    assert step["change"] == "Liger kernels (use_liger_kernel)" and step["verdict"] == "fits"
    assert step["config"]["training"]["liger_kernel"] is True and step["config"]["training"]["loss"] == "chunked"
    liger = {**LIGER_OOM, "training": {**LIGER_OOM["training"], "liger_kernel": True, "loss": "chunked"}}
    chunked = {**LIGER_OOM, "training": {**LIGER_OOM["training"], "loss": "chunked"}}
    assert step["device_total_bytes"] == estimate_config(liger).device_total_bytes \
        < estimate_config(chunked).device_total_bytes < out["device_total_bytes"]
    text = subprocess.run([sys.executable, "-m", "estimator", "estimate", "--config", "-"],
                          input=json.dumps(LIGER_OOM), capture_output=True, text=True).stdout
    assert "\n  1. Liger kernels (use_liger_kernel): " in text


@pytest.mark.parametrize("model, training", [
    ("qwen3-8b", {"framework": "fsdp2"}),  # Liger patches transformers models under the Trainer's stacks only
    ("qwen3-8b", {"compile": True}),  # its Triton kernels under torch.compile are not modelled
    ("qwen3-30b-a3b", {}),  # its patch of MoE experts is not modelled
    ("qwen3-8b", {"liger_kernel": True, "loss": "chunked"}),  # already on
])
def test_liger_kernels_are_never_offered_where_validation_refuses_them(model, training):
    cfg = load_config({**LIGER_OOM, "model": model, "training": {**LIGER_OOM["training"], **training}})
    assert not any("Liger kernels" in s.description for s in suggestions(cfg, limit=50))


def test_the_advice_names_only_what_the_framework_runs():
    """The HF Trainer over DDP (framework hf) has no TP, PP, CP or selective recompute (search/stacks.py): an 8B
    full fine-tune on 8 H100s replicates 16 B a parameter and does not fit; the change that fits is the same run
    sharded, DeepSpeed ZeRO-3 or Accelerate's FSDP2, each the full estimate of its configuration."""
    cfg = load_config({"model": "llama-3.1-8b", "training": {"framework": "hf", "seq_len": 4096,
                                                             "global_batch_size": 64, "recompute": "full"},
                       "parallel": {"dp": 8}, "hardware": {"gpu": "h100-80"}})
    assert estimate(cfg.architecture, cfg.training, cfg.parallel, cfg.hardware).fit.verdict == "oom"
    found = suggestions(cfg, limit=20)
    words = [s.description for s in found]
    assert not any(w.startswith(("tensor parallel", "pipeline stages", "context parallel", "selective")) for w in words)
    sharded = {s.config.training.framework: s for s in found if s.description.startswith("shard the model states")}
    assert set(sharded) == {"deepspeed", "hf_fsdp2"} and found[0] in sharded.values()
    for framework, s in sharded.items():
        assert s.config.parallel.zero_stage == 3 and s.verdict == "fits" and s.gpus == 8
        e = estimate(s.config.architecture, s.config.training, s.config.parallel, s.config.hardware)
        assert s.device_total_bytes == e.device_total_bytes


def test_megatron_is_never_advised_a_chunked_loss():
    """Megatron-LM has no chunked loss (its --cross-entropy-loss-fusion is the fused one): never suggested."""
    cfg = load_config({"model": "llama-3.1-70b", "training": {"framework": "megatron", "seq_len": 8192},
                       "parallel": {"tp": 8, "dp": 1}})
    words = [s.description for s in suggestions(cfg, limit=50)]
    assert words and not any("chunked" in w for w in words)
    hf = load_config({"model": "llama-3.1-8b", "training": {"framework": "deepspeed", "seq_len": 8192,
                                                            "recompute": "full"}, "parallel": {"dp": 8, "zero_stage": 3}})
    assert any("chunked" in s.description for s in suggestions(hf, limit=50))  # Liger's, under the Trainer
