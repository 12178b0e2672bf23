"""Which frameworks build DeepSeek-V3's multi-token-prediction module (memory/mtp_built.py): Megatron-Core
builds --mtp-num-layers modules; transformers 5.23 (the HF Trainer, DeepSpeed, FSDP1), torchtitan 0.3.0's
671B recipe and torchtune build none, so their estimates count no MTP parameters, gradients or states."""

from __future__ import annotations

import pytest

from estimator import estimate_config
from estimator.models.presets import get_architecture
from estimator.spec.architecture import parameter_counts
from estimator.spec.config import architecture_to_dict

GiB = 2**30


def _estimate(framework: str, model: object = "deepseek-v3"):
    return estimate_config({"model": model, "training": {"framework": framework, "seq_len": 4096,
                                                          "micro_batch_size": 1},
                            "parallel": {"dp": 1}, "hardware": {"gpu": "h200"}})


def _without_mtp() -> dict:
    return dict(architecture_to_dict(get_architecture("deepseek-v3")), mtp_layers=0)


def _meta_count(layers: int) -> tuple[int, int]:
    """transformers 5.23 DeepseekV3ForCausalLM's parameters and floating-point buffers, built on the meta device."""
    import torch
    from transformers import DeepseekV3Config, DeepseekV3ForCausalLM

    with torch.device("meta"):
        model = DeepseekV3ForCausalLM(DeepseekV3Config(num_hidden_layers=layers))
    return (sum(p.numel() for p in model.parameters()),
            sum(b.numel() for name, b in model.named_buffers() if "e_score_correction_bias" in name))


def test_hf_parameter_count_is_transformers_without_layer_61():
    """The full model by hand from two trimmed meta builds: 3 dense layers (with the embedding, final norm and head),
    then 4 layers, whose difference is one MoE layer; DeepSeek-V3 has 58 of them. Each MoE layer's router bias
    (e_score_correction_bias, 256) is a buffer in transformers, a stored tensor in the checkpoint."""
    pytest.importorskip("transformers.models.deepseek_v3")
    dense3, _ = _meta_count(3)
    dense3_moe1, bias = _meta_count(4)
    moe = dense3_moe1 - dense3
    assert (dense3, moe, bias) == (3_603_815_424, 11_507_286_016, 256)
    full = dense3 + 58 * (moe + bias)
    assert full == 671_026_419_200
    est = _estimate("hf")
    assert est.parameters_total == full == parameter_counts(get_architecture("deepseek-v3"), include_mtp=False).total
    # the MTP module the checkpoint has and Megatron builds: 13,463,426,304 more, with its embedding and head copies
    assert _estimate("megatron").parameters_total - full == 13_463_426_304


@pytest.mark.parametrize("framework", ["hf", "deepspeed", "fsdp1", "fsdp2"])
def test_frameworks_that_do_not_build_mtp_estimate_the_model_without_it(framework):
    """The preset (mtp_layers 1) and the same model with mtp_layers 0 give the same estimate, byte for byte, and the
    breakdown says why the module is absent."""
    with_mtp, without = _estimate(framework), _estimate(framework, _without_mtp())
    assert with_mtp.device_total_bytes == without.device_total_bytes
    assert with_mtp.stages[0].component("mtp") is None
    assert with_mtp.config.mtp.checkpoint == 1 and with_mtp.config.mtp.built == 0
    assert any("multi-token-prediction module(s) are not built" in note for note in with_mtp.notes)
    assert not any("multi-token-prediction" in note for note in without.notes)


def test_hf_model_states_leave_out_the_mtp_layer():
    """Pure bf16 AdamW under the HF Trainer: parameters 2 bytes, gradients 2, AdamW's two moments 2 + 2, over
    671,026,419,200 parameters (the estimate's optimizer-step components), none for the MTP layer's 11,507,286,016 +
    its norms and 2h -> h projection."""
    est = estimate_config({"model": "deepseek-v3", "training": {"framework": "hf", "seq_len": 4096,
                                                               "param_dtype": "bf16"},
                           "parallel": {"dp": 1}, "hardware": {"gpu": "h200"}})
    step = {c.key: c.bytes for c in next(p for p in est.stages[0].phases if p.name == "optimizer").components}
    n = 671_026_419_200
    assert step["parameters"] == pytest.approx(2 * n, abs=2 * 1e6)
    assert step["gradients"] == pytest.approx(2 * n, abs=2 * 1e6)
    assert step["optimizer_states"] == pytest.approx(4 * n, abs=4 * 1e6)


def test_megatron_builds_mtp_layers_modules():
    """Megatron-Core builds --mtp-num-layers modules (model.mtp_layers): the last stage keeps the module's
    activations and its parameters (norms, 2h -> h projection, one MoE layer) on top of the model without it."""
    config = {"training": {"framework": "megatron", "seq_len": 4096, "micro_batch_size": 1},
              "parallel": {"tp": 8, "pp": 2, "pp_first_stage_layers": 30, "ep": 8, "dp": 8}, "hardware": {"gpu": "h200"}}
    built = estimate_config({**config, "model": "deepseek-v3"})
    none = estimate_config({**config, "model": _without_mtp()})
    assert built.config.mtp.built == 1 and not any("multi-token" in note for note in built.notes)
    last = built.stages[-1]
    assert last.component("mtp") is not None and none.stages[-1].component("mtp") is None
    assert built.stages[0].device_total_bytes == none.stages[0].device_total_bytes
    assert last.device_total_bytes > none.stages[-1].device_total_bytes



def test_rl_trainer_under_fsdp2_says_why_the_mtp_module_is_absent():
    """GRPO on DeepSeek-V3 with the torchtitan trainer: the trainer's step counts the model without its MTP
    module (torchtitan 0.3.0's recipes build none) and the RL estimate keeps the note that says why."""
    est = estimate_config({"model": "deepseek-v3", "training": {"framework": "fsdp2", "recompute": "full",
                                                               "rl": {"algorithm": "grpo", "rollout_batch_size": 32,
                                                                      "samples_per_prompt": 8,
                                                                      "max_prompt_len": 1024,
                                                                      "max_response_len": 1024, "rollout_tp": 8}},
                           "parallel": {"dp": 256}, "hardware": {"gpu": "h200"}})
    assert est.parameters_total == 671_026_419_200
    assert any("torchtitan 0.3.0 builds MTP modules only when" in note for note in est.notes)
