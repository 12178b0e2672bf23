"""The `hf` kind: TrainingArguments (or a TRL config) alone, the distributed side in the arguments
(DDP, a DeepSpeed dict, FSDP's fsdp_config), mapped to JSON configs written out here by hand; and
`plan --emit hf` reading back to the configuration it was written from."""

from pathlib import Path

import pytest

from estimator import ConfigError, estimate_config
from estimator.importers import estimate_imported, import_config
from estimator.importers.emit_hf import emit_hf, sft_config
from import_refusals import SUBSTITUTION, TOO_LARGE

DATA = Path(__file__).parent / "data" / "launch" / "hf"
QWEN7B = ("--model_name_or_path", "Qwen/Qwen2.5-7B")  # open-r1's RoPE-extended Qwen2.5-Math-7B has its shapes


def same_estimate(result, expected):
    assert result.config == expected
    assert estimate_imported(result).to_json() == estimate_config(expected).to_json()


def test_openr1_sft_config_alone_is_ddp():
    # open-r1's SFT recipe without its accelerate file: DDP over 8 GPUs; batch 2 x 8 x 8, max_length 32768,
    # gradient checkpointing, Liger kernels, bf16
    result = import_config((DATA / "openr1_sft_config_distill.yaml").read_text(), "hf", gpus=8, overrides=QWEN7B)
    same_estimate(result, {"model": "qwen2.5-7b",
                           "parallel": {"dp": 8},
                           "training": {"framework": "hf", "attn_implementation": "flash_attention_2", "micro_batch_size": 2, "global_batch_size": 128,
                                        "recompute": "full", "liger_kernel": True, "loss": "chunked", "seq_len": 32768,
                                        "training_loop": "trl_sft"}})


DS_INLINE = """model_name_or_path: meta-llama/Llama-3.1-8B
per_device_train_batch_size: 2
gradient_accumulation_steps: 4
max_length: 4096
bf16: true
learning_rate: 1.0e-5
deepspeed:
  zero_optimization:
    stage: 3
    offload_optimizer: {device: cpu}
    reduce_bucket_size: 50000000
    stage3_prefetch_bucket_size: 40000000
  bf16: {enabled: auto}
  train_micro_batch_size_per_gpu: auto
  gradient_clipping: 1.0
"""


def test_a_deepspeed_dict_in_the_arguments():
    # TrainingArguments.deepspeed as a loaded dict: ZeRO-3 with the optimizer on the CPU and the buckets it
    # states; the Trainer's micro-batch ("auto"); TRL's SFTConfig defaults: gradient checkpointing
    result = import_config(DS_INLINE, "hf", gpus=8)
    same_estimate(result, {"model": "llama-3.1-8b", "parallel": {"dp": 8, "zero_stage": 3},
                           "training": {"framework": "deepspeed", "micro_batch_size": 2, "global_batch_size": 64,
                                        "recompute": "full", "seq_len": 4096, "offload_optimizer": "cpu",
                                        "reduce_bucket_size": 50_000_000,
                                        "stage3_prefetch_bucket_size": 40_000_000, "training_loop": "trl_sft"}})
    assert {"learning_rate", "deepspeed.gradient_clipping"} <= {s.name for s in result.ignored}


def test_fsdp_config_in_the_arguments():
    text = ("model_name_or_path: Qwen/Qwen3-8B\nper_device_train_batch_size: 1\nmax_length: 8192\nfsdp: true\n"
            "fsdp_config:\n  reshard_after_forward: false\n  activation_checkpointing: true\n"
            "  state_dict_type: SHARDED_STATE_DICT\n  limit_all_gathers: true\n")
    result = import_config(text, "hf", gpus=8)
    # transformers 5.23: FSDP version 2 unless 1; no resharding after forward is shard-grad-op (ZeRO-2)
    assert result.config == {"model": "qwen3-8b", "parallel": {"dp": 8, "zero_stage": 2},
                             "training": {"framework": "hf_fsdp2", "recompute": "full", "micro_batch_size": 1,
                                          "seq_len": 8192, "training_loop": "trl_sft", "loss": "chunked"}}
    assert [s.name for s in result.unsupported] == ["fsdp_config.limit_all_gathers"]  # chunked_nll: _sft_loss


HF = [
    {"model": "llama-3.1-8b", "training": {"framework": "hf", "seq_len": 4096, "micro_batch_size": 2,
                                           "global_batch_size": 64, "recompute": "full",
                                           "adapter": {"method": "qlora", "rank": 32, "alpha": 16,
                                                       "target_modules": "all-linear", "dropout": 0.05}},
     "parallel": {"dp": 8}},
    {"model": "qwen3-8b", "training": {"framework": "deepspeed", "seq_len": 8192, "recompute": "full",
                                       "loss": "chunked", "liger_kernel": True, "offload_optimizer": "cpu",
                                       "reduce_bucket_size": 50_000_000},
     "parallel": {"dp": 8, "zero_stage": 3}},
    # contiguous_gradients off under ZeRO-2 (memory/deepspeed_noncontiguous.py), written into the ds_config
    {"model": "qwen3-8b", "training": {"framework": "deepspeed", "seq_len": 4096, "recompute": "full",
                                       "contiguous_gradients": False},
     "parallel": {"dp": 4, "zero_stage": 2}},
    {"model": "qwen3-8b", "training": {"framework": "hf_fsdp2", "seq_len": 8192, "recompute": "full"},
     "parallel": {"dp": 8, "zero_stage": 2}},
    {"model": "qwen3-8b", "training": {"framework": "fsdp1", "seq_len": 8192, "recompute": "full"},
     "parallel": {"dp": 8}},
    {"model": "llama-3.1-8b", "training": {"framework": "hf_fsdp2", "seq_len": 4096, "offload_optimizer": "cpu",
                                           "offload_parameters": "cpu"},
     "parallel": {"dp": 4}},
    # liger_kernel_config {fused_linear_cross_entropy: false}: Liger's layers, transformers' loss
    {"model": "qwen3-8b", "training": {"framework": "hf", "seq_len": 2048, "liger_kernel": True}, "parallel": {"dp": 1}},
    # liger_kernel_config {cross_entropy: true} alone: Liger's cross-entropy kernel (loss "fused", as axolotl's)
    {"model": "llama-3.2-3b", "training": {"framework": "hf", "seq_len": 2048, "loss": "fused"}, "parallel": {"dp": 1}},
    # liger_kernel_config {rms_norm: false, swiglu: false}: Liger's fused linear cross-entropy alone
    {"model": "llama-3.2-3b", "training": {"framework": "hf", "seq_len": 2048, "loss": "chunked"}, "parallel": {"dp": 1}},
    {"model": "qwen3-8b", "training": {"framework": "hf", "seq_len": 2048, "param_dtype": "fp32",
                                       "compute_dtype": "fp32", "compile": True, "optimizer": "adam8bit"},
     "parallel": {"dp": 2}},
]


@pytest.mark.parametrize("config", HF, ids=lambda c: c["training"]["framework"])
def test_emit_hf_round_trip(config):
    text = emit_hf(config)
    result = import_config(text, gpus=config["parallel"]["dp"])  # the kind guessed
    assert result.kind == "hf" and result.unknown == ()
    # the file runs TRL's SFTTrainer (emit_hf.sft_config)
    assert estimate_imported(result).to_json() == estimate_config(sft_config(config)).to_json(), text


def test_emit_hf_refuses_what_the_arguments_cannot_say():
    with pytest.raises(ConfigError, match="training.stage3_param_persistence_threshold"):
        emit_hf({**HF[1], "training": {**HF[1]["training"], "stage3_param_persistence_threshold": 10_000}})
    with pytest.raises(ConfigError, match="training.loss"):  # Liger's cross-entropy beside its layers: not modelled
        emit_hf({**HF[0], "training": {**HF[0]["training"], "loss": "fused", "liger_kernel": True}})
    with pytest.raises(ConfigError, match="--emit"):
        emit_hf({"model": "llama-3.1-8b", "training": {"seq_len": 4096}})  # a Megatron configuration


NOT_DATA = "could not determine a constructor for the tag 'tag:yaml.org,2002:python/object/apply:os.system'"


@pytest.mark.parametrize("text, refusal", [
    ("model_name_or_path: !!python/object/apply:os.system ['touch /tmp/hf-pwned']\nper_device_train_batch_size: 1\n",
     NOT_DATA),
    ("python train.py --model_name_or_path $(touch /tmp/hf-pwned) --per_device_train_batch_size 2", SUBSTITUTION),
    ("model_name_or_path: a/b\nper_device_train_batch_size: 1\n" + "x: 1\n" * 60_000, TOO_LARGE),
])
def test_hostile_arguments_are_refused_by_their_guard(text, refusal, importer_reads):
    """Each is refused by the guard that bounds its cost, not by a clock (their times:
    bench/bench_refusals.py): a !!python tag by the safe YAML loader, a command substitution by the
    shell reader, which never runs it; text over MAX_BYTES by the size check, before any reader runs."""
    with pytest.raises(ConfigError) as info:
        import_config(text, "hf", gpus=8)
    assert refusal in str(info.value)
    assert importer_reads == ([] if refusal == TOO_LARGE else ["hf"])
    assert not Path("/tmp/hf-pwned").exists()


def test_yaml_arguments_that_mention_a_flag_stay_yaml():
    """A TrainingArguments YAML whose comment or value holds " --word" was read as a command line (every
    key dropped); the first key: value line decides."""
    from estimator.importers.hf_trainer import parse_args_text

    text = ("# launched as: accelerate launch --config_file fsdp.yaml train.py\n"
            "per_device_train_batch_size: 4\nrun_name: sweep --lr 1e-5\nbf16: true\n")
    assert parse_args_text(text, "args.yaml") == {"per_device_train_batch_size": 4,
                                                  "run_name": "sweep --lr 1e-5", "bf16": True}
    assert parse_args_text("trl sft --per_device_train_batch_size 4 --bf16", "line") == {
        "per_device_train_batch_size": 4, "bf16": True}


PAGED = """model_name_or_path: meta-llama/Llama-3.1-8B
per_device_train_batch_size: 1
gradient_accumulation_steps: 8
max_length: 2048
bf16: true
optim: {optim}
"""


@pytest.mark.parametrize("optim, ours", [("paged_adamw_8bit", "paged_adamw8bit"), ("paged_adamw_32bit", "paged_adamw")])
def test_the_trainers_paged_optimizers_are_paged(optim, ours):
    """transformers' OptimizerNames PAGED_ADAMW_8BIT / PAGED_ADAMW are bitsandbytes' PagedAdamW8bit / PagedAdamW, whose
    states live in managed memory outside the caching allocator (memory/paged.py, measured on the H200): they were read
    as the unpaged adam8bit (paged_adamw_32bit as an unknown name, AdamW), which puts the states in the allocated peak.
    Under DeepSpeed, which steps its own flat partitions, the unpaged twin stays, with a note."""
    result = import_config(PAGED.format(optim=optim), "hf", gpus=1)
    assert result.config["training"]["optimizer"] == ours
    # Llama-3.1-8B's 8,030,261,248 parameters less its 65 RMSNorm scales of 4,096 (under get_paged's 1e5 elements)
    paged = 8_030_261_248 - 65 * 4096
    per_element = {"paged_adamw8bit": 2, "paged_adamw": 8}[ours]  # two uint8 or two fp32 states
    assert estimate_imported(result).stages[0].component("managed").bytes == paged * per_element
    with_ds = import_config(PAGED.format(optim=optim) + "deepspeed:\n  zero_optimization:\n    stage: 2\n", "hf", gpus=8)
    assert with_ds.config["training"]["framework"] == "deepspeed"
    assert with_ds.config["training"].get("optimizer", "adamw") == {"paged_adamw8bit": "adam8bit",
                                                                   "paged_adamw": "adamw"}[ours]
    assert any(s.name == "optim" and "paged states under deepspeed" in s.note for s in with_ds.unsupported)


FSDP_ARGS = """model_name_or_path: meta-llama/Llama-3.1-8B
per_device_train_batch_size: 1
gradient_accumulation_steps: 1
max_length: 2048
bf16: true
fsdp: {fsdp}
fsdp_config:
  version: {version}
"""


@pytest.mark.parametrize("fsdp, version, framework, parallel", [
    ("full_shard auto_wrap", 1, "fsdp1", {"dp": 8, "fsdp_sharding_strategy": "FULL_SHARD"}),
    ("shard_grad_op auto_wrap", 1, "fsdp1", {"dp": 8, "fsdp_sharding_strategy": "SHARD_GRAD_OP"}),
    ("hybrid_shard auto_wrap", 1, "fsdp1", {"dp": 8, "fsdp_sharding_strategy": "HYBRID_SHARD"}),
    ("full_shard auto_wrap", 2, "hf_fsdp2", {"dp": 8}),
    # transformers maps SHARD_GRAD_OP to FSDP2's reshard_after_forward False (ZeRO-2's layout)
    ("shard_grad_op auto_wrap", 2, "hf_fsdp2", {"dp": 8, "zero_stage": 2}),
])
def test_the_fsdp_option_strings_sharding(fsdp, version, framework, parallel):
    """TrainingArguments.fsdp's sharding option (FSDPOption) was read only as 'FSDP on': FSDP1 took FULL_SHARD
    whatever it said. Now FSDP1's strategy, FSDP2's reshard under shard_grad_op."""
    result = import_config(FSDP_ARGS.format(fsdp=fsdp, version=version), "hf", gpus=8)
    assert result.config["training"]["framework"] == framework
    assert result.config["parallel"] == parallel


def test_the_fsdp_option_strings_offload():
    result = import_config(FSDP_ARGS.format(fsdp="full_shard offload auto_wrap", version=2), "hf", gpus=8)
    training = result.config["training"]
    assert (training["offload_optimizer"], training["offload_parameters"]) == ("cpu", "cpu")


@pytest.mark.parametrize("extra, framework, loss, unsupported", [
    ("", "hf", "chunked", False),  # trl v1.7.0 on: chunked_nll unless Liger, under Accelerate's autocast
    ("loss_type: nll\n", "hf", "standard", False),
    # over a 16-bit model run as it is (the HF Trainer's FSDP2; DeepSpeed below ZeRO-3): measured alone,
    # tests/test_trl_loss.py test_chunked_nll_alone_is_what_the_ledger_keeps
    ("loss_type: chunked_nll\nfsdp: true\nfsdp_config:\n  version: 2\n", "hf_fsdp2", "chunked", False),
    ("deepspeed:\n  zero_optimization:\n    stage: 2\n", "deepspeed", "chunked", False),
    ("deepspeed:\n  zero_optimization:\n    stage: 3\n", "deepspeed", "standard", True),  # gathered per chunk
])
def test_trls_sft_loss_is_its_loss_type(extra, framework, loss, unsupported):
    """TRL's SFTTrainer runs its own loss (memory/activations/trl_loss.py): chunked_nll, its default from trl
    v1.7.0 without Liger (sft_config.py), is loss "chunked" under the SFTTrainer's loop where the head runs 16-bit
    (the Trainer's autocast, or a 16-bit model run as it is below ZeRO-3); under ZeRO-3 it is reported not
    modelled, and estimated as transformers' loss; nll is the model's loss with the SFTTrainer's metrics from the
    kept logits."""
    text = "model_name_or_path: Qwen/Qwen3-8B\nper_device_train_batch_size: 2\nmax_length: 4096\n" + extra
    result = import_config(text, "hf", gpus=8)
    training = result.config["training"]
    assert (training["framework"], training["training_loop"], training.get("loss", "standard")) == \
        (framework, "trl_sft", loss)
    assert ("loss_type" in {s.name for s in result.unsupported}) == unsupported
    liger = import_config(text + "use_liger_kernel: true\n", "hf", gpus=8)
    assert "loss_type" not in {s.name for s in liger.unsupported}


@pytest.mark.parametrize("value", ["mse", "[nll]", "{a: 1}", "3"])
def test_an_sft_loss_type_trl_does_not_have_is_refused_by_name(value):
    text = f"model_name_or_path: Qwen/Qwen3-8B\nper_device_train_batch_size: 2\nmax_length: 4096\nloss_type: {value}\n"
    with pytest.raises(ConfigError) as error:
        import_config(text, "hf", gpus=8)
    assert error.value.field == "loss_type"
