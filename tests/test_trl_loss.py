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
    ({"framework": "deepspeed"}, "training.loss"),  # chunked_nll under ZeRO-3 gathers the head per chunk
    ({"framework": "hf", "param_dtype": "fp32", "compute_dtype": "fp32", "grad_dtype": "fp32",
      "optimizer_dtype": "fp32"}, "training.loss"),  # w.float() of an fp32 head copies nothing: not modelled
])
def test_what_is_not_modelled_is_refused(change, field):
    cfg = config("chunked", **change)
    if change["framework"] == "deepspeed":
        cfg["parallel"] = {"dp": 2, "zero_stage": 3}
    with pytest.raises(ConfigError) as error:
        estimate_config(cfg)
    assert error.value.field == field


# --- by TRL release (training.trl_version, estimator/spec/trl.py) ---------------------------------------------

def metrics(version: str | None, batch: int = B) -> dict:
    """nll_metrics' entries (bytes by name) for a TRL release: Qwen2.5-0.5B, `batch` x 2048, Accelerate's autocast."""
    from estimator.memory.activations.trl_loss import nll_metrics
    from estimator import load_config
    cfg = load_config(config("standard", trl_version=version, micro_batch_size=batch))
    return {e.name: e.bytes(cfg.parallel) for e in nll_metrics(cfg.architecture, cfg.training, cfg.parallel, V)}


LOGITS = "the outputs' logits, kept by compute_loss for its metrics"


def test_the_measured_release_is_the_default():
    measured = estimate_config(config("standard", trl_version="1.9.0"))
    assert estimate_config(config("standard")).allocated_peak_bytes == measured.allocated_peak_bytes
    assert metrics(None) == metrics("1.3.0")  # from c693ca12 (1.3.0) the shifted logits' entropy, as measured


def test_before_0_15_the_sft_trainer_computes_no_metrics():
    """trl 0.14: SFTTrainer has no compute_loss of its own, so its step is the Trainer's."""
    old = estimate_config(config("standard", trl_version="0.14.0"))
    trainer = estimate_config({**config("standard"), "training": {**config("standard")["training"],
                                                                  "training_loop": "trainer"}})
    assert old.allocated_peak_bytes == trainer.allocated_peak_bytes
    assert old.allocated_peak_bytes < estimate_config(config("standard")).allocated_peak_bytes


def test_0_16_to_0_21_take_the_accuracy_alone():
    """trl 0.16-0.21 compute_loss: logits[..., :-1, :].contiguous() (a copy above one sample) and its argmax."""
    assert metrics("0.19.1") == {LOGITS: 4 * B * S * V,
                                 "their shifted copy (logits[..., :-1, :].contiguous())": 4 * B * (S - 1) * V,
                                 "the accuracy's argmax (int64)": 8 * B * (S - 1)}
    assert metrics("0.19.1", batch=1) == {LOGITS: 4 * S * V, "the accuracy's argmax (int64)": 8 * (S - 1)}


def test_0_22_takes_a_whole_samples_entropy_at_once():
    """trl 0.22 utils.py entropy_from_logits(logits, chunk_size=1) splits the [b, s, V] logits along dim 0: one
    sample's log-softmax, exp and product (3 x s x V fp32), above the accuracy's copy and argmax."""
    assert metrics("0.22.2") == {LOGITS: 4 * B * S * V, "entropy of one sample: log-softmax, exp and product":
                                 3 * 4 * S * V}
    moment = estimate_config(config("standard", trl_version="0.22.2"))
    assert parts(moment, "forward")["entropy of one sample: log-softmax, exp and product"] == 3 * 4 * S * V


def test_0_23_to_1_2_take_the_larger_of_the_entropys_rows_and_the_accuracys_copy():
    """From 0.23 the entropy of 128 flattened rows of the unshifted logits (a view), then the accuracy's copy."""
    copy_and_argmax = {"their shifted copy (logits[..., :-1, :].contiguous())": 4 * B * (S - 1) * V,
                       "the accuracy's argmax (int64)": 8 * B * (S - 1)}
    assert metrics("1.2.0") == {LOGITS: 4 * B * S * V, **copy_and_argmax}
    assert metrics("0.23.0", batch=1) == {LOGITS: 4 * S * V,
                                          "entropy of 128 rows: log-softmax, exp and product": 3 * 4 * 128 * V}


@pytest.mark.parametrize("loss, version, field", [
    ("standard", "0.15.2", "training.trl_version"),  # 0.15 gathers every rank's logits: not modelled
    ("chunked", "1.3.0", "training.loss"),  # chunked_nll arrived in 1.4.0
    ("standard", "one.nine", "training.trl_version"),
])
def test_a_release_without_the_rule_is_refused(loss, version, field):
    with pytest.raises(ConfigError) as error:
        estimate_config(config(loss, trl_version=version))
    assert error.value.field == field


def test_a_trl_version_outside_the_sft_trainer_is_refused():
    cfg = config("standard", trl_version="1.9.0", training_loop="trainer")
    with pytest.raises(ConfigError) as error:
        estimate_config(cfg)
    assert error.value.field == "training.trl_version"


def test_the_release_is_the_installed_packages_not_the_files():
    """`emit hf` writes the loss_type; the TRL release that runs it is the machine's, carried to the read-back as the
    GPU is (importers/emit_check.py _INSTALLED), so a configuration naming one still writes its file."""
    from estimator.importers.emit import emit
    cfg = {"model": "llama-3.2-1b", "hardware": {"gpu": "h100-80"}, "parallel": {"dp": 2},
           "training": {"framework": "hf", "training_loop": "trl_sft", "trl_version": "1.5.0", "seq_len": 2048,
                        "loss": "chunked"}}
    assert "loss_type: chunked_nll" in emit("hf", cfg)
    cfg["training"]["trl_version"] = "1.3.0"  # no chunked_nll yet: the configuration itself is refused
    with pytest.raises(ConfigError) as error:
        emit("hf", cfg)
    assert error.value.field == "training.loss"


def test_the_importer_says_which_release_its_default_loss_is():
    from estimator.importers import import_config
    imported = import_config("model_name_or_path: meta-llama/Llama-3.2-1B\nmax_length: 2048\nbf16: true\n"
                             "per_device_train_batch_size: 1\n", "hf", gpus=1)
    assert imported.config["training"]["loss"] == "chunked"
    assert any("nll before it: set training.trl_version" in setting.note for setting in imported.read)


# --- chunked_nll alone, with and without autocast (validation/accelerate/trl_loss_alone.py) ---------------------

@pytest.mark.parametrize("framework", ["hf", "deepspeed", "hf_fsdp2"])
def test_chunked_nll_alone_is_what_the_ledger_keeps(framework):
    """TRL's own _chunked_cross_entropy_loss on fake tensors, Qwen2.5-0.5B's head over 2 x 2048 tokens: under
    Accelerate's autocast (hf) and without it (a 16-bit model run as it is: DeepSpeed ZeRO 2, the Trainer's FSDP2,
    whose fp32 matmul adds the weight copy's fp32 gradient beside its cast, 4 V h). What it keeps after the forward,
    and its forward and backward peaks above its inputs, against the ledger's loss entries (activations/loss.py
    LossMemory, without the final norm's input, which the function does not see): within 0.2% (the chunk's own
    [256, h] casts, 2 x 0.9 MiB, are left out)."""
    pytest.importorskip("trl", reason="TRL's loss needs trl 1.9.0 (validation/install_frameworks.sh)")
    from estimator import load_config
    from estimator.memory.activations.loss import loss_memory
    from validation.accelerate.trl_loss_alone import measure
    cfg = load_config(config("chunked", framework, param_dtype="bf16"))
    if framework != "hf":
        cfg = load_config({**config("chunked", framework), "parallel": {"dp": 2, "zero_stage": 2}})
    memory = loss_memory(cfg.architecture, cfg.training, cfg.parallel, V)

    def total(entries):
        return sum(e.bytes(cfg.parallel) for e in entries if not e.name.startswith("final norm input"))

    got = measure(B, S, H, V, autocast=framework == "hf")
    assert got["saved"] == pytest.approx(total(memory.saved), rel=1e-3)
    assert got["forward"] == pytest.approx(total(memory.saved) + total(memory.forward), rel=2e-3)
    assert got["backward"] == pytest.approx(total(memory.saved) + total(memory.backward), rel=2e-3)
