"""TRL's SFTTrainer loss (training_loop trl_sft, estimator/memory/activations/trl_loss.py), each part by hand from
trl 1.9.0's sft_trainer.py; tests/test_accuracy.py holds the ten records of the real SFTTrainer.training_step
(tests/data/measured/accelerate/*-trl-sft-*) to 5%, these the parts to the byte."""

from __future__ import annotations

import pytest

from estimator import estimate_config
from estimator.spec.errors import ConfigError
from test_hf_fsdp2 import parts
from validation.hf.models import MODELS

V, H = 151_936, 896  # Qwen2.5-0.5B's vocabulary and hidden size
S, B = 2048, 2


def config(loss: str, framework: str = "hf", **training) -> dict:
    return {"model": MODELS["qwen2.5-0.5b"].architecture(), "parallel": {"dp": 1},
            "training": {"framework": framework, "training_loop": "trl_sft", "loss": loss, "seq_len": S,
                         "micro_batch_size": B, "param_dtype": "bf16", "grad_dtype": "bf16",
                         "optimizer_dtype": "bf16", **training}}


def test_chunked_nll_holds_the_heads_fp32_copy_and_one_chunk_not_the_logits():
    """chunked_nll under Accelerate's bf16 autocast, at a chunk's backward (measured, Qwen2.5-0.5B 2 x 2048: the
    519.31 MiB fp32 weight copy, 259.66 MiB twice (autocast's cast, the gradient summed), one 74.19 MiB chunk of
    logits and the 7 MiB gathered input and its gradient; no [b, s, V] tensor)."""
    backward = parts(estimate_config(config("chunked")), "backward")
    targets = B * (S - 1)  # every position but each sequence's last
    assert backward["fp32 copy of the LM head weight (w.float(), one chunk's)"] == 4 * V * H
    assert backward["autocast's cast of it for the matmul"] == 2 * V * H
    assert backward["one chunk's logits (256 targets)"] == 2 * 256 * V
    assert backward["the head weight's gradient, summed over the chunks done"] == 2 * V * H
    assert backward["gradient of the gathered LM head input"] == 2 * targets * H
    assert backward["LM head input gathered to the targets (hidden[order])"] == 2 * targets * H
    assert not any("log-softmax" in label for label in backward)


def test_chunked_nll_under_a_frozen_head_sums_no_weight_gradient():
    lora = config("chunked", adapter={"method": "lora", "rank": 16, "alpha": 32, "target_modules": "all-linear"})
    for auto in ("grad_dtype", "optimizer_dtype"):  # PEFT's fp32 adapters decide them
        del lora["training"][auto]
    assert "the head weight's gradient, summed over the chunks done" not in parts(estimate_config(lora), "backward")


def test_nll_keeps_the_outputs_for_its_metrics():
    """nll: after the loss's forward compute_loss keeps Accelerate's fp32 copy of the logits, reshapes
    logits[..., :-1, :] (a copy: not contiguous above one sample) and takes the entropy 128 rows at a time
    (measured: 2374.00 + 2372.84 + 3 x 74.19 MiB beside the loss's fp32 log-softmax)."""
    forward = parts(estimate_config(config("standard")), "forward")
    assert forward["the outputs' logits, kept by compute_loss for its metrics"] == 4 * B * S * V
    assert forward["their reshaped copy (logits[..., :-1, :], not contiguous above one sample)"] == 4 * B * (S - 1) * V
    assert forward["entropy of 128 rows: log-softmax, exp and product"] == 3 * 4 * 128 * V
    one = parts(estimate_config({**config("standard"), "training": {**config("standard")["training"],
                                                                     "micro_batch_size": 1}}), "forward")
    assert not any("reshaped copy" in label for label in one)


def test_an_rl_run_is_not_the_sft_trainers():
    rl = {"algorithm": "grpo", "rollout_batch_size": 64, "samples_per_prompt": 8, "max_prompt_len": 1024,
          "max_response_len": 1024, "engine": "vllm"}
    with pytest.raises(ConfigError) as error:
        estimate_config(config("standard", rl=rl))
    assert error.value.field == "training.rl"


@pytest.mark.parametrize("change, field", [
    ({"framework": "megatron"}, "training.training_loop"),
    ({"framework": "deepspeed"}, "training.loss"),  # chunked_nll without Accelerate's autocast: not measured
])
def test_what_is_not_modelled_is_refused(change, field):
    cfg = config("chunked", **change)
    if change["framework"] == "deepspeed":
        cfg["parallel"] = {"dp": 2, "zero_stage": 2}
    with pytest.raises(ConfigError) as error:
        estimate_config(cfg)
    assert error.value.field == field
