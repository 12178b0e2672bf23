"""training.liger_kernel: what liger-kernel 0.8.5's patched model keeps, computed here by hand from its
source (estimator/memory/liger.py cites each file), its fused linear cross-entropy's chunk rule, the cases
it refuses, and the front ends that turn it on."""

import json
from pathlib import Path
import subprocess
import sys

import pytest

from estimator import ConfigError, estimate_config
from estimator.importers import import_config
from estimator.memory.activations.layer import layer_entries
from estimator.memory.activations.loss import liger_chunk_tokens, loss_memory
from estimator.models.presets import get_architecture
from estimator.spec.parallel import Parallel
from estimator.spec.training import Training

PAR = Parallel()


def layer_bytes(arch, **training):
    return sum(e.bytes(PAR) for e in layer_entries(arch, Training(framework="hf", **training), PAR, "dense"))


def test_llama_layer_keeps_the_liger_kernels_tensors():
    # Llama-3.2-1B, 2 x 2048 tokens: h 2048, f 8192. Eager LlamaRMSNorm keeps an fp32 upcast (4Th), the rsqrt
    # (4T) and the bf16 normalised tensor (2Th); LigerRMSNorm its bf16 input (2Th) and an fp32 rstd (4T): 4Th
    # less per norm, two norms. Eager LlamaMLP keeps silu(gate) (2Tf) that LigerSiLUMulFunction recomputes.
    arch = get_architecture("llama-3.2-1b")
    T, h, f = 4096, 2048, 8192
    eager = layer_bytes(arch, seq_len=2048, micro_batch_size=2)
    liger = layer_bytes(arch, seq_len=2048, micro_batch_size=2, liger_kernel=True, loss="chunked")
    assert eager - liger == 2 * 4 * T * h + 2 * T * f == 128 * 2**20
    entries = layer_entries(arch, Training(framework="hf", seq_len=2048, micro_batch_size=2, liger_kernel=True),
                            PAR, "dense")
    norms = [(e.elements, e.bytes_per_element) for e in entries if "Liger RMSNorm" in e.name]
    assert norms == [(T * h, 2), (T, 4)] * 2
    mlp = [(e.elements, e.bytes_per_element) for e in entries if "Liger SwiGLU" in e.name]
    assert mlp == [(2 * T * f, 2), (T * f, 2)]


def test_qwen3_qk_norms_and_autocast():
    # Qwen3-8B's q_norm and k_norm over each head (apply_liger_kernel_to_qwen3 patches both): 32 + 8 heads of
    # 128; eager keeps an fp32 upcast of q and k (4T x 5120) beside the bf16 normalised ones, Liger their input
    arch = get_architecture("qwen3-8b")
    T, h, f, qk = 4096, 4096, 12288, (32 + 8) * 128
    eager = layer_bytes(arch, seq_len=4096)
    liger = layer_bytes(arch, seq_len=4096, liger_kernel=True)
    assert eager - liger == 2 * 4 * T * h + 2 * T * f + 4 * T * qk
    # fp32 parameters under bf16 autocast: the residual stream each norm keeps is fp32
    entries = layer_entries(arch, Training(framework="hf", seq_len=4096, param_dtype="fp32", liger_kernel=True),
                            PAR, "dense")
    assert [e.bytes_per_element for e in entries if "Liger RMSNorm input" in e.name] == [4, 4]


@pytest.mark.parametrize("tokens, hidden, vocab, chunk", [
    (16384, 4096, 32000, 2048),  # Liger's own example in fused_linear_cross_entropy_forward's comment
    (4096, 2048, 128256, 128),  # cdiv(V, H) = 63, cdiv(4096, 63) = 66, next power of two 128 (not 4096*2048/V = 65)
    (8192, 3584, 152064, 256),  # Qwen2.5-7B: cdiv(V, H) = 43, cdiv(8192, 43) = 191 -> 256
    (100, 4096, 1000, 100),  # one chunk: next_power_of_2(100) = 128, capped at BT
])
def test_fused_linear_cross_entropy_chunk(tokens, hidden, vocab, chunk):
    assert liger_chunk_tokens(tokens, hidden, vocab) == chunk


def test_fused_linear_cross_entropy_tensors():
    # Llama-3.2-1B (tied head, V 128256), 4096 tokens: saved grad_input [BT, H] bf16 and grad_weight [V, H] like
    # the weight; during forward the head's input, one bf16 chunk of 128 x V logits and the fp32 loss + bool mask
    arch = get_architecture("llama-3.2-1b")
    V, h, T = 128256, 2048, 4096
    training = Training(framework="hf", seq_len=2048, micro_batch_size=2, liger_kernel=True, loss="chunked")
    loss = loss_memory(arch, training, PAR, V)
    assert [(e.elements, e.bytes_per_element) for e in loss.saved] == [(T * h, 2), (T, 4), (T * h, 2), (V * h, 2)]
    assert [(e.elements, e.bytes_per_element) for e in loss.forward] == [(T * h, 2), (128 * V, 2), (T, 5)]
    assert "next_power_of_2" in loss.source
    # a LoRA run's frozen head: Liger allocates no weight gradient (weight.requires_grad is False)
    lora = Training(framework="hf", seq_len=2048, micro_batch_size=2, liger_kernel=True, loss="chunked",
                    adapter={"method": "lora", "rank": 16, "alpha": 32, "target_modules": "all-linear"})
    assert [e.elements for e in loss_memory(arch, lora, PAR, V).saved] == [T * h, T, T * h]


CONFIG = {"model": "llama-3.2-1b", "training": {"framework": "hf", "seq_len": 2048, "liger_kernel": True,
                                                "loss": "chunked"}}


@pytest.mark.parametrize("change, field", [
    ({"training": {"framework": "megatron"}}, "training.liger_kernel"),
    ({"training": {"loss": "fused"}}, "training.loss"),
    ({"training": {"compile": True}}, "training.liger_kernel"),
    ({"model": "qwen3-30b-a3b"}, "training.liger_kernel"),  # MoE experts: patched, not modelled
    ({"model": "gemma-3-27b"}, "training.liger_kernel"),  # Gemma's (1 + w) norms and GeGLU: not modelled
])
def test_refused_where_not_modelled(change, field):
    config = {"model": change.get("model", CONFIG["model"]),
              "training": {**CONFIG["training"], **change.get("training", {})}}
    with pytest.raises(ConfigError) as error:
        estimate_config(config)
    assert error.value.field == field


def test_refused_where_liger_patches_nothing():
    # gpt2 is not in liger-kernel 0.8.5's MODEL_TYPE_TO_APPLY_LIGER_FN: the Trainer runs it unpatched
    gpt2 = {"model_type": "gpt2", "n_embd": 768, "n_layer": 12, "n_head": 12, "vocab_size": 50257,
            "n_positions": 1024}
    with pytest.raises(ConfigError, match="no patch for LayerNorm decoders"):
        estimate_config({"model": gpt2, "training": {"framework": "hf", "seq_len": 1024, "liger_kernel": True}})
    with pytest.raises(ConfigError, match="no patch for Nemotron-H"):  # a hybrid model type it leaves alone too
        estimate_config({"model": "nemotron-h-8b", "training": {"framework": "hf", "seq_len": 1024, "liger_kernel": True}})


def test_cli_names_the_field(tmp_path):
    path = tmp_path / "c.json"
    path.write_text(json.dumps({**CONFIG, "training": {**CONFIG["training"], "framework": "fsdp2"}}))
    run = subprocess.run([sys.executable, "-m", "estimator", "estimate", "--config", str(path)],
                         capture_output=True, text=True)
    assert run.returncode == 2 and run.stdout == ""
    assert "training.liger_kernel" in run.stderr and len(run.stderr.strip().splitlines()) == 1


HF_ARGS = """model_name_or_path: meta-llama/Llama-3.1-8B
per_device_train_batch_size: 2
max_length: 4096
bf16: true
gradient_checkpointing: false
use_liger_kernel: true
"""


@pytest.mark.parametrize("extra, training", [
    ("", {"liger_kernel": True, "loss": "chunked"}),
    ("liger_kernel_config:\n  fused_linear_cross_entropy: false\n", {"liger_kernel": True}),
    ("liger_kernel_config:\n  rms_norm: false\n  swiglu: false\n", {"loss": "chunked"}),
])
def test_trainer_use_liger_kernel(extra, training):
    result = import_config(HF_ARGS + extra, "hf")
    assert {k: v for k, v in result.config["training"].items() if k in ("liger_kernel", "loss")} == training
    assert result.unsupported == ()


def test_llama_factory_keeps_the_logits_outside_sft():
    # LLaMA-Factory apply_liger_kernel: fused_linear_cross_entropy=False where require_logits (stage not pt/sft)
    base = ("model_name_or_path: Qwen/Qwen3-8B\nstage: {stage}\nfinetuning_type: full\ncutoff_len: 2048\n"
            "per_device_train_batch_size: 1\nbf16: true\nenable_liger_kernel: true\n")
    sft = import_config(base.format(stage="sft"), "llama-factory", gpus=1).config["training"]
    dpo = import_config(base.format(stage="dpo"), "llama-factory", gpus=1).config["training"]
    assert (sft["liger_kernel"], sft["loss"]) == (True, "chunked")
    assert dpo["liger_kernel"] is True and "loss" not in dpo


def test_axolotl_plugin_flags():
    base = ("base_model: meta-llama/Llama-3.1-8B\nsequence_len: 2048\nmicro_batch_size: 1\nbf16: true\n"
            "plugins:\n  - axolotl.integrations.liger.LigerPlugin\n")
    every = import_config(base + "liger_rope: true\nliger_rms_norm: true\nliger_glu_activation: true\n"
                                 "liger_fused_linear_cross_entropy: true\n", "axolotl", gpus=1)
    assert (every.config["training"]["liger_kernel"], every.config["training"]["loss"]) == (True, "chunked")
    loss_only = import_config(base + "liger_fused_linear_cross_entropy: true\n", "axolotl", gpus=1)
    assert loss_only.config["training"]["loss"] == "chunked" and "liger_kernel" not in loss_only.config["training"]
    half = import_config(base + "liger_rms_norm: true\n", "axolotl", gpus=1)
    assert "liger_kernel" not in half.config["training"] and [s.name for s in half.unsupported] == ["liger_rms_norm"]


def test_openrlhf_gets_the_layers_not_the_loss():
    # OpenRLHF's Actor calls the model without labels: Liger's lce_forward makes the logits
    result = import_config("deepspeed --num_gpus 8 --module openrlhf.cli.train_sft --model.model_name_or_path "
                           "meta-llama/Meta-Llama-3-8B --ds.use_liger_kernel", "openrlhf")
    assert result.config["training"]["liger_kernel"] is True and "loss" not in result.config["training"]


LIGER_RECORDS = sorted((Path(__file__).parent / "data" / "measured").glob("*-liger.json"))


def test_the_liger_records_are_there():
    from validation.hf.cases import CASES
    assert sorted(p.stem for p in LIGER_RECORDS) == sorted(c for c in CASES if c.endswith("-liger"))
    assert len(LIGER_RECORDS) == 7


@pytest.mark.parametrize("path", LIGER_RECORDS, ids=lambda p: p.stem)
def test_forward_and_backward_within_one_percent_of_the_harness(path):
    # The fake-tensor HF harness with liger-kernel 0.8.5 applied (validation/hf/liger.py): the optimizer step's
    # peak hides the activations in most cases, so each phase's peak is held here. Eager modules instead of
    # Liger's keep 13.3 GB more in Llama-3.1-8B's forward at 4096 tokens: far outside 1%.
    record = json.loads(path.read_text())
    stage = estimate_config(record["config"]).stages[0]
    for phase in stage.phases:
        if phase.name in ("forward", "backward"):
            assert phase.allocated_bytes == pytest.approx(record["measured"]["phases"][phase.name]["total"],
                                                          rel=0.01), phase.name


def test_each_liger_record_names_the_liger_kernel_release_it_ran():
    """The HF harness records liger-kernel's version beside torch's and transformers' for a Liger case only
    (validation/hf/cases.py run_versions); validation/hf/liger.py refuses to run any release but 0.8.5."""
    from validation.hf.plugin import HARNESS
    from validation.hf.step import Run
    run_versions = HARNESS.load(HARNESS.run_versions)
    assert run_versions(Run("llama-3.2-1b", 8192, 2, liger=True)) == {"liger-kernel": "0.8.5"}
    assert run_versions(Run("llama-3.2-1b", 8192, 2)) == {}
    assert len(LIGER_RECORDS) == 7
    for path in LIGER_RECORDS:
        assert json.loads(path.read_text())["versions"]["liger-kernel"] == "0.8.5"
