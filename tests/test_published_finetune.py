"""The estimator against published, really measured fine-tuning memory (issue #23: "Published LoRA/QLoRA runs:
median <= 5%, no under-estimate beyond 10%; full fine-tuning the same").

tests/data/measured/published_finetune holds one JSON per source (write_records.py wrote them): Qwen's README
profiling table (QwenLM/Qwen), torchtune's README optimization-flags table and lit-gpt's resource tables. Each row
states its source and commit, the run's setup as the table and the scripts at that commit give it, the published
figure, which number it is (``device_total``: nvidia-smi, ``allocated_peak``: max_memory_allocated or the
allocator's active peak), and our configuration of the run. The figure is held against the matching output number.
A row the model misses by more than the issue allows is listed in MISSES with the mechanism it lacks, as a strict
expected failure: a miss that closes fails the test until it leaves the list.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest

from estimator import estimate_config

DATA = Path(__file__).parent / "data" / "measured" / "published_finetune"
SOURCES = {"qwen": "QwenLM/Qwen", "torchtune": "pytorch/torchtune", "litgpt": "Lightning-AI/litgpt"}
OUTPUT = {"device_total": "device_total_bytes", "allocated_peak": "allocated_peak_bytes"}
UNIT = {"GB": 10**9, "GiB": 2**30}
MEDIAN_BOUND = 0.05  # the goal: median |error| per group
UNDER_BOUND = 0.10  # the goal: no under-estimate beyond it


def load(name: str) -> dict:
    return json.loads((DATA / f"{name}.json").read_text())


ROWS = {r["id"]: r for name in SOURCES for r in load(name)["rows"]}


def error(row: dict) -> float:
    estimate = estimate_config(row["config"])
    return getattr(estimate, OUTPUT[row["measured"]["metric"]]) / row["measured"]["bytes"] - 1


_QWEN_HF = ("Qwen's HF Trainer LoRA rows (finetune_lora_single_gpu.sh, no DeepSpeed): with the caching allocator replayed "
            "over the ledger the table holds 1.4-2.4 GB above the estimated reserved memory at every length up to 4096 "
            "tokens, on 1.8B, 7B and 14B alike (on the H200 records the replay is within 2%% of max_memory_reserved and "
            "767 MiB is outside the allocator); on 1.8B's small total that is over 10%%. Not found in the code: the remote "
            "modeling_qwen.py adds KB-sized rotary and logn caches under flash attention, PyTorch 2.0's foreach AdamW "
            "one temporary per tensor (torch/optim/adamw.py _multi_tensor_adamw). Not established in the CUDA context: "
            "the table's stack (CUDA 11.8, PyTorch 2.0, A100; Qwen's docker/Dockerfile: torch 2.0.1, flash-attention "
            "2.3.3 with csrc/layer_norm) sets no CUDA_MODULE_LOADING, and PyTorch 2.0 sets LAZY only at its CUDA init "
            "(CUDAHooks.cpp initCUDA, pytorch/pytorch#85692), after TrainingArguments has counted the devices, so the "
            "runs may have loaded every module eagerly (pytorch/pytorch#113326: 2.06 GB of host memory, not 0.44, when "
            "the count came first, torch 2.2+cu118); eager costs 1,034 MB more than lazy on our H200 (torch "
            "2.11+cu130, tests/data/measured/gpu/experiments/cuda-context-h200.json) and 380 MB before cuBLAS on "
            "torch 1.13+cu117 (pytorch/pytorch#85692), none is measured for torch 2.0+cu118 on an A100, and one "
            "per-process constant cannot close a gap that spreads from -1.3 to 3.4 GB over the HF rows up to 4096 "
            "tokens (test_the_qwen_hf_gap_is_not_one_constant); under by %s")
_QWEN_8192 = ("Qwen's 8192-token HF LoRA rows read less than the loss's own tensors need: modeling_qwen.py "
              "QWenLMHeadModel.forward keeps the bf16 logits (2.49 GB at 8192 x 151,936) and makes their shifted "
              "contiguous copy (2.49 GB) beside the fp32 upcast and log-softmax (4.98 GB each), and log-softmax's "
              "backward needs a third fp32 block beside its output and incoming gradient; with the model's 4.2 GB "
              "that is over 24 GB of segments where the table reads 21.8 GB (1.8B) in all; the replay (the ledger's "
              "loss, without the shifted copy) gives 24.0 GB reserved; over by %s")
# torchtune's '+ 8-bit AdamW' row (under by 8.2% since the chunked head's backward is modelled, memory/activations/
# chunked_head.py; 15.2% before) does not name the optimizer: its drop of 4.2 GiB from the row before rules out
# bitsandbytes' PagedAdamW8bit (12 GiB of bf16 moments would leave the allocator), so the row takes torchao's AdamW8bit
# row id -> the mechanism the estimate lacks (the next modelling step)
MISSES: dict[str, str] = {
    **{f"qwen-1.8b-{m}-s{s}": _QWEN_HF % pct for m, s, pct in (
        ("lora", 256, "16.0%"), ("lora", 512, "16.1%"), ("lora", 1024, "12.3%"), ("lora-emb", 256, "13.6%"),
        ("lora-emb", 512, "11.3%"), ("lora-emb", 1024, "11.9%"))},
    "qwen-7b-lora-emb-s256": _QWEN_HF % "10.0%",
}
# row id -> why the estimate is over by more than 10%
OVERS: dict[str, str] = {"qwen-1.8b-lora-s8192": _QWEN_8192 % "12.7%", "qwen-1.8b-lora-emb-s8192": _QWEN_8192 % "11.1%"}
MEDIAN_MISSES = {
    "full": ("full fine-tuning: 7.1% over 16 rows (7.4% before the H200 DeepSpeed runs); torchtune's seven have a median "
             "of 1.1%, Qwen's nine are nvidia-smi readings of DeepSpeed ZeRO-3 runs. On one GPU the estimate now follows "
             "four real DeepSpeed 0.19.5 steps of Qwen-1.8B's shape on an H200 to their allocated, reserved and "
             "nvidia-smi readings (tests/test_gpu_deepspeed.py: the gradient partitions ZeRO-3 keeps, its sub-group "
             "step, DeepSpeed's order of allocations replayed, its NCCL world of one rank): 40.4 GB with a fused AdamW, "
             "what ds_config_zero3.json's optimizer section builds (DeepSpeed's FusedAdam), 44.4 GB with torch's foreach "
             "AdamW. Qwen's table reads 43.5 GB from 256 to 2048 tokens, so its 1.8B rows stay 7.8-9.6% under: about "
             "3 GB that the H200 step with the fused optimizer does not hold, from the table's stack (torch 2.0, CUDA "
             "11.8, A100, DeepSpeed of late 2023: module loading, NCCL's communicator, that ZeRO-3) or a foreach AdamW "
             "after all; not measured. 7B on 2 GPUs grows 11.4 GB a GPU from 256 to 1024 tokens where the estimate's "
             "peak, the ZeRO-3 step, does not move (+8.9% to -6.4%): not ZeRO-3's gathered parameters, replayed "
             "(zero3_replay.py) the coordinator holds 2.24e9 elements (4.5 GB) through 7B's backward, below the step's "
             "sub-group copies, whatever the length; nothing DeepSpeed allocates grows with the sequence (stage3.py: "
             "the IPG bucket, the gradient partitions and the sub-groups are sized by parameters; "
             "partitioned_param_coordinator.py by max_live and the prefetch bucket)"),
}


# --- the records ------------------------------------------------------------------------------------------

def test_the_published_rows_are_there():
    counts = {name: len(load(name)["rows"]) for name in SOURCES}
    assert counts == {"qwen": 75, "torchtune": 9, "litgpt": 27}
    assert len(ROWS) == 111
    groups = [r["group"] for r in ROWS.values()]
    assert groups.count("lora") == 95 and groups.count("full") == 16


@pytest.mark.parametrize("name", SOURCES)
def test_each_source_names_its_table_commit_and_number(name):
    data = load(name)
    src = data["source"]
    assert src["repo"] == SOURCES[name] and src["path"] and src["table"]
    assert len(src["commit"]) == 40 and int(src["commit"], 16) >= 0
    assert set(data["metric"]) >= {"reported", "unit", "compared_with"}
    for row in data["rows"]:
        pub, measured = row["published"], row["measured"]
        assert measured["metric"] in OUTPUT and row["group"] in ("lora", "full")
        assert measured["bytes"] == round(pub["value"] * UNIT[pub["unit"]] / pub.get("gpus_summed", 1))
        assert row["setup"] and row["table_row"]


def test_qwen_rows_on_several_gpus_are_the_tables_sum_per_gpu():
    """Qwen's table prints the sum over the GPUs: 7B full-parameter on 2 A100-80G reads 162.0G at 1024 tokens,
    81.0 GB (75.4 GiB) per GPU, which an 80 GiB A100 can hold only in GB."""
    row = ROWS["qwen-7b-full-s1024"]
    assert row["published"]["text"].startswith("162.0G") and row["measured"]["bytes"] == 81_000_000_000
    assert row["measured"]["bytes"] < 80 * 2**30 < 81 * 2**30


# --- the goals ------------------------------------------------------------------------------------

@pytest.mark.parametrize("group", [pytest.param(g, marks=pytest.mark.xfail(reason=MEDIAN_MISSES[g], strict=True))
                                   if g in MEDIAN_MISSES else g for g in ("lora", "full")])
def test_median_error_within_the_goal(group):
    errors = [abs(error(r)) for r in ROWS.values() if r["group"] == group]
    assert statistics.median(errors) <= MEDIAN_BOUND


@pytest.mark.parametrize("row_id", [pytest.param(i, marks=pytest.mark.xfail(reason=MISSES[i], strict=True))
                                    if i in MISSES else i for i in ROWS])
def test_no_estimate_under_by_more_than_the_goal(row_id):
    assert error(ROWS[row_id]) >= -UNDER_BOUND


@pytest.mark.parametrize("row_id", [pytest.param(i, marks=pytest.mark.xfail(reason=OVERS[i], strict=True))
                                    if i in OVERS else i for i in ROWS])
def test_no_estimate_over_by_more_than_ten_percent(row_id):
    """Over-estimates cost GPUs: none is over by 10%."""
    assert error(ROWS[row_id]) <= 0.10


def test_the_misses_are_rows():
    assert set(MISSES) <= set(ROWS) and set(OVERS) <= set(ROWS)


# --- the mechanisms these tables showed, by hand ------------------------------------------------------------

def qwen7b(seq: int, **training) -> dict:
    arch = {"name": "qwen-7b", "hidden_size": 4096, "num_layers": 32, "num_attention_heads": 32,
            "intermediate_size": 11008, "vocab_size": 151936, "qkv_bias": True}
    base = {"framework": "deepspeed", "seq_len": seq, "micro_batch_size": 1, "param_dtype": "fp16",
            "compute_dtype": "fp16", "recompute": "full",
            "adapter": {"method": "lora", "rank": 64, "target_modules": ["all-linear"], "base_dtype": "int4"}}
    return {"model": arch, "training": {**base, **training}, "parallel": {"zero_stage": 2},
            "hardware": {"gpu": "a100-80"}}


def loss_parts(config: dict) -> dict[str, int]:
    stage = estimate_config(config).stages[0]
    return {p.label: p.bytes for c in stage.components for p in (c.parts or (c,))
            if "log-softmax" in p.label}


def test_a_16_bit_loss_outside_autocast_keeps_16_bit_log_softmax_and_gradients():
    """Qwen-1's modeling_qwen.py runs CrossEntropyLoss on fp16 logits, and DeepSpeed's fp16 engine has no
    autocast: the log-softmax (kept) and the two gradients of backward's first step are fp16, 2 B per logit
    where transformers' loss upcasts to 4 B. 8192 tokens x 151,936 logits."""
    T, V = 8192, 151936
    arch16 = qwen7b(8192)
    arch16["model"]["loss_in_logits_dtype"] = True
    assert loss_parts(arch16) == {"log-softmax of the logits, in their 16-bit dtype": 2 * T * V,
                                  "16-bit gradients of the log-softmax output and input": 2 * 2 * T * V}
    assert loss_parts(qwen7b(8192)) == {"fp32 log-softmax of the logits": 4 * T * V,
                                        "fp32 gradients of the log-softmax output and input": 2 * 4 * T * V}


def test_under_the_trainers_autocast_the_loss_is_fp32_anyway():
    """autocast runs log_softmax and nll_loss in fp32: the field changes nothing under the HF Trainer."""
    config = qwen7b(4096, framework="hf", training_loop="trainer", param_dtype="bf16", compute_dtype="bf16")
    config["parallel"] = {}
    config["training"]["adapter"].pop("base_dtype")
    with_field = json.loads(json.dumps(config))
    with_field["model"]["loss_in_logits_dtype"] = True
    assert estimate_config(with_field).allocated_peak_bytes == estimate_config(config).allocated_peak_bytes


def test_zero3_casts_each_sub_group_from_a_flat_16_bit_copy():
    """stage3.py _prepare_fp32_grad_for_sub_group: flatten (torch.cat, bf16) then .to(fp32): both alive for the
    cast, 2 + 4 B x the largest sub-group. Qwen-1.8B on one GPU: _create_fp16_sub_groups closes the first sub-group
    at the first weight that takes it to 1e9 elements: the embedding (151,936 x 2048), 13 layers (50,593,792 each) and
    the 14th's q, k, v, o, gate and up: 1,008,205,824, what the H200 run's first fp32 partition holds
    (tests/data/measured/gpu/deepspeed, fp32_partition_numels)."""
    config = {"model": {"hidden_size": 2048, "num_layers": 24, "num_attention_heads": 16,
                        "intermediate_size": 5504, "vocab_size": 151936},
              "training": {"framework": "deepspeed", "seq_len": 256, "recompute": "full"},
              "parallel": {"zero_stage": 3}, "hardware": {"gpu": "a100-80"}}
    stage = estimate_config(config).stages[0]
    parts = {p.label: p.bytes for c in stage.components for p in (c.parts or (c,))}
    first = 151_936 * 2048 + 13 * (4 * 2048**2 + 3 * 2048 * 5504) + 4 * 2048**2 + 2 * 2048 * 5504
    assert first == 1_008_205_824
    assert parts["fp32 copy of the gradient partition for the step"] == 4 * first
    assert parts["flat copy of the sub-group's gradients, cast to fp32"] == 2 * first


def test_peft_before_0_12_keeps_adapters_in_the_base_dtype():
    """peft 0.5.0 (Qwen's pin for PyTorch 2.0): LoRA layers take the bf16 base's dtype; 0.12.0 on casts them to
    fp32. Qwen-7B, rank 64 on every linear: per layer 64 x (in + out) for q, k, v, o (4096 + 4096), gate and up
    (4096 + 11008) and down (11008 + 4096); the weights and both AdamW moments halve."""
    r, h, f, layers = 64, 4096, 11008, 32
    adapters = layers * r * (4 * (h + h) + 3 * (h + f))
    assert adapters == 159_907_840

    def states(version: str) -> dict[str, int]:
        config = qwen7b(2048, framework="hf", param_dtype="bf16", compute_dtype="bf16")
        config["parallel"] = {}
        config["training"]["adapter"].pop("base_dtype")
        config["training"]["adapter"]["peft_version"] = version
        stage = estimate_config(config).stages[0]
        return {c.label: c.bytes for c in stage.components}

    new, old = states("0.12.0"), states("0.11.1")
    assert new["Parameters"] - old["Parameters"] == 2 * adapters
    assert new["Optimizer states"] - old["Optimizer states"] == 2 * 2 * adapters


def test_a_peft_version_is_a_release():
    from estimator import ConfigError

    config = qwen7b(2048, framework="hf")
    config["training"]["adapter"].update(peft_version="0.0.9")
    with pytest.raises(ConfigError, match=r"peft_version.*0\.1\.0 or later"):
        estimate_config(config)


def test_the_qwen_hf_gap_is_not_one_constant():
    """The CUDA context is one constant per process, whatever the model or length; over Qwen's HF LoRA rows up to
    4096 tokens the table's excess over the estimated device total spreads from -1.33 GB (14B LoRA (emb), 4096)
    to 3.43 GB (14B LoRA (emb), 512), over four times what eager module loading adds on the H200 (1,837,957,120 -
    804,061,184 B, spec/cuda_modules.py); torch 1.13+cu117 added 666,632,192 - 287,047,680 B before cuBLAS
    (pytorch/pytorch#85692's two readings)."""
    from estimator.spec.cuda_modules import H200_STACK

    eager_more = H200_STACK.loaded("eager").total(flash=True) - H200_STACK.loaded("lazy").total(flash=True)
    assert eager_more == 1_837_957_120 - 804_061_184 == 1_033_895_936
    assert 666_632_192 - 287_047_680 == 379_584_512
    rows = [r for r in ROWS.values() if r["id"].startswith("qwen-") and r["config"]["training"]["framework"] == "hf"
            and r["config"]["training"]["seq_len"] <= 4096]
    gaps = {r["id"]: r["measured"]["bytes"] - estimate_config(r["config"]).device_total_bytes for r in rows}
    assert len(gaps) == 30
    low, high = min(gaps, key=gaps.get), max(gaps, key=gaps.get)
    assert (low, high) == ("qwen-14b-lora-emb-s4096", "qwen-14b-lora-emb-s512")
    assert gaps[low] == pytest.approx(-1.33e9, abs=0.01e9) and gaps[high] == pytest.approx(3.43e9, abs=0.01e9)
    assert gaps[high] - gaps[low] > 4 * eager_more


def test_the_readme_states_these_numbers():
    """The README's table of these rows is what this test computes (rows, within 5%, median, worst)."""
    readme = (Path(__file__).parent.parent / "README.md").read_text()
    for group, label in (("lora", "LoRA / QLoRA"), ("full", "full fine-tuning")):
        errors = [error(r) for r in ROWS.values() if r["group"] == group]
        within = sum(abs(e) <= 0.05 for e in errors)
        median = f"{100 * statistics.median(abs(e) for e in errors):.1f}%"
        under, over = f"−{-100 * min(errors):.1f}%", f"+{100 * max(errors):.1f}%"
        line = next(l for l in readme.splitlines() if l.startswith(f"| {label} |"))
        cells = [c.strip() for c in line.strip("|").split("|")]
        assert cells[1:3] == [str(len(errors)), str(within)]
        assert cells[3].startswith(median) and cells[4].startswith(under) and cells[5].startswith(over)


def test_fsdp1_under_a_loop_of_its_own_has_no_accelerate_autocast():
    """Lightning Fabric's FSDPStrategy over bf16-true weights (lit-gpt's multi-GPU LoRA) runs no autocast: phi-1.5's
    own loss stays 16-bit, 2 B per logit kept and 4 B in backward's first step (1044 tokens x 4 x 51,200);
    through the HF Trainer (Accelerate's autocast) it is the fp32 ledger."""
    row = ROWS["litgpt-phi-1.5-lora-bf16-mb4-g2"]
    assert row["config"]["training"]["training_loop"] == "plain"
    T, V = 1044 * 4, 51200
    assert loss_parts(row["config"]) == {"log-softmax of the logits, in their 16-bit dtype": 2 * T * V,
                                         "16-bit gradients of the log-softmax output and input": 2 * 2 * T * V}
    trainer = json.loads(json.dumps(row["config"]))
    trainer["training"]["training_loop"] = "trainer"
    assert loss_parts(trainer)["fp32 log-softmax of the logits"] == 4 * T * V


def backward_labels(config: dict) -> set[str]:
    stage = estimate_config(config).stages[0]
    backward = next(p for p in stage.phases if p.name == "backward")
    return {p.label for c in backward.components for p in (c.parts or (c,))}


def test_a_recomputed_layer_runs_after_the_loss_has_freed_its_saved_tensors():
    """Autograd frees a node's saved tensors once its backward has run, so the loss's (torchtune's compiled loss:
    the bf16 logits, 2 x 4096 x 128,256 x 2 B) are gone when the last layer is recomputed: backward's largest
    moment is the one or the other, never both (memory/static_stage.py)."""
    lora = backward_labels(ROWS["torchtune-llama-3.2-3b-lora"]["config"])
    assert "logits in the compute dtype, kept by the compiled cross-entropy" in lora
    assert "One recomputed layer's activations" not in lora
    small_vocab = {"model": {"hidden_size": 4096, "num_layers": 32, "num_attention_heads": 32, "num_kv_heads": 8,
                             "intermediate_size": 14336, "vocab_size": 256},
                   "training": {"framework": "hf", "seq_len": 4096, "recompute": "full"}}
    layer = backward_labels(small_vocab)
    assert "One recomputed layer's activations" in layer
    assert not any("log-softmax" in label for label in layer)
