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


_QWEN_HF = ("Qwen's HF Trainer LoRA rows (finetune_lora_single_gpu.sh, no DeepSpeed, torch 2.0): with the caching "
            "allocator replayed over the ledger and torch 2.0's foreach AdamW (torch_version 2.0: sqrt(v) + eps out of "
            "place, two temporaries a group) and the fused c_attn's one adapter (fused_qkv) the table holds "
            "1.15-1.36 GB above the estimate at every length from 256 to 2048 tokens on 1.8B (chat model, adapters "
            "only: the step is not the peak; 1.57 GB at 4096), 0.4-2.2 GB on 26 of the 30 HF rows up to 4096; on "
            "1.8B's small total that is over 10%%. Read and ruled out: the remote modeling_qwen.py's rotary and logn caches (KB-sized under flash attention); finetune.py at e8e15962 "
            "(the 1.8B rows' commit) loads with device_map 'auto' (weights straight to the GPU; one device: no "
            "hooks), not a copy; the Trainer's loss returns no logits (compute_loss). Not established: the CUDA "
            "context of torch 2.0.1+cu118 with flash-attention 2.3.3 and its csrc/layer_norm on an A100 (the "
            "estimate charges the A100 constant, 512 MiB): torch 2.0.1 sets CUDA_MODULE_LOADING=LAZY in "
            "torch/cuda/__init__.py _lazy_init (l. 245), after TrainingArguments has counted the devices "
            "(cudaGetDeviceCount initialises the driver first: pytorch/pytorch#113326, torch 2.2+cu118, 2.06 GB "
            "of host memory, not 0.44), so the runs may have loaded every module eagerly; eager costs 1,034 MB "
            "more than lazy on our H200 (torch 2.11+cu130, tests/data/measured/gpu/experiments/cuda-context-h200"
            ".json), near the 1.8B rows' gap, and 380 MB before cuBLAS on torch 1.13+cu117 (pytorch/pytorch#85692); "
            "none is measured for torch 2.0+cu118 on an A100, and the same runs' Q-LoRA (ZeRO-2) rows fit within "
            "8%% with the lazy charge (test_the_qwen_hf_gap_is_not_one_constant); under by %s")
_QWEN_8192 = ("Qwen's 8192-token HF LoRA rows read less than the loss's own tensors need: modeling_qwen.py "
              "QWenLMHeadModel.forward keeps the bf16 logits (2.49 GB at 8192 x 151,936) and makes their shifted "
              "contiguous copy (2.49 GB) beside the fp32 upcast and log-softmax (4.98 GB each), and log-softmax's "
              "backward needs a third fp32 block beside its output and incoming gradient; with the model's 4.2 GB "
              "that is over 24 GB of segments where the table reads 21.8 GB (1.8B) in all; the replay (the ledger's "
              "loss, without the shifted copy) gives 24.0 GB reserved; over by %s")
# torchtune's '+ 8-bit AdamW' row (under by 8.2% since the chunked head's backward is modelled, memory/activations/
# chunked_head.py; 15.2% before) does not name the optimizer: its drop of 4.2 GiB from the row before rules out
# bitsandbytes' PagedAdamW8bit (12 GiB of bf16 moments would leave the allocator), so the row takes torchao's AdamW8bit
_QWEN_ONE_RANK = ("Qwen-1.8B with DeepSpeed on one GPU (finetune_qlora_single_gpu.sh's ZeRO-2, the full-parameter "
                  "ZeRO-3 rows), torch 2.0.1: its NCCL 2.14 allocates without cuMem (NCCL_CUMEM_ENABLE arrived in "
                  "2.18 off and is on by default from 2.19.1; torch 2.2 ships 2.19.3), so each communicator of one "
                  "rank is the net proxy's shared buffer, one cudaMalloc of 32 channels x 16 steps x 128 KiB = 64 MiB "
                  "made at initialisation, its small allocations sharing one 2 MiB page (the mechanism the H200 "
                  "measured with NCCL_CUMEM_ENABLE=0: 512 MiB a communicator there at 64 channels x 512 KiB; "
                  "estimator/spec/nccl.py), where the H200's torch 2.11 holds 388 MiB a communicator. "
                  "The estimate charged the H200's measured 950 MiB for DeepSpeed's world of one rank until it was "
                  "modelled by release (then 170 MiB, the requested bytes; now 300 MiB); the Q-LoRA rows sit "
                  "0.67-0.85 GB under the table from 256 to 4096 tokens, below the 1.15-1.36 GB the same stack's HF "
                  "LoRA rows sit under (MISSES' _QWEN_HF: eager module loading adds 1.03 GB on the H200) and the full "
                  "rows 4.4 GB (MEDIAN_MISSES['full']): what that stack holds outside the allocator (A100, torch "
                  "2.0.1+cu118) is not measured; under by %s")
# row id -> the mechanism the estimate lacks (the next modelling step)
MISSES: dict[str, str] = {
    # 16.6%, 16.6% and 12.7% (2048: 9.8%) before the replay allocated c_attn's frozen weight as the one tensor it is
    # (memory/reserved_tensors.py: 0.09-0.15 GB less cached)
    **{f"qwen-1.8b-lora-s{s}": _QWEN_HF % pct for s, pct in ((256, "18.9%"), (512, "18.3%"), (1024, "13.6%"),
                                                          (2048, "11.1%"))},
    **{f"qwen-1.8b-qlora-s{s}": _QWEN_ONE_RANK % pct for s, pct in ((256, "12.9%"), (512, "11.1%"), (1024, "10.5%"),
                                                                  (8192, "11.8%"))},
    **{f"qwen-1.8b-full-s{s}": _QWEN_ONE_RANK % pct for s, pct in ((512, "10.0%"), (1024, "10.0%"))},
    "qwen-1.8b-full-s8192": (
        "Qwen-1.8B full-parameter (ZeRO-3 on one GPU, DeepSpeed 0.12.3: the moments made at initialisation, "
        "deepspeed_replay.py): the table reads 48.3 GB, 1.2 GB over its 4096-token row, where the replay of 0.12.3's "
        "order puts the 8192-token loss's blocks in segments the first step left free (41.7 GB reserved, 42.0 at "
        "4096); the same 3.5-3.7 GB the 256-4096 rows hold above the estimate (MEDIAN_MISSES['full']) and 1.3 GB "
        "more; under by 11.8% (12.1% while torch 2.0's NCCL was charged its requested bytes, 10.4% while "
        "DeepSpeed's world of one rank was charged the H200's 950 MiB: _QWEN_ONE_RANK)"),
}
# row id -> why the estimate is over by more than 10%
OVERS: dict[str, str] = {
    "qwen-1.8b-lora-s8192": _QWEN_8192 % "11.7%", "qwen-1.8b-lora-emb-s8192": _QWEN_8192 % "10.1%",
    "qwen-7b-full-s256": (
        "Qwen-7B full-parameter on 2 GPUs (ZeRO-3, DeepSpeed 0.12.3): the table's 69.6 GB a GPU leaves 0.6 GB above "
        "the allocated peak (67.9 GB, the step's first sub-group) and what lies outside the allocator (1.1 GB), where "
        "the replay over the 2 ranks (deepspeed_replay.py, deepspeed_gathers.py) keeps 10.0 GB of segments unused at "
        "the step, the same at 256, 512 and 1024 tokens (nothing DeepSpeed allocates grows with the length): 6.0 GB on "
        "the all-gather stream, which the default stream's requests never reuse (the gathered parameters, 2.24e9 "
        "elements at their peak in backward, each a torch.cat of a coalesced call's flat tensor beside it: "
        "partition_parameters.py all_gather_coalesced and AllGatherCoalescedHandle.wait, v0.12.3 l. 618-658, "
        "1064-1169), and 4.0 GB in the default pool from 0.12.3's initialisation (the first fp32 partition's 16-bit "
        "clone leaves a 1,946 MiB segment of which the IPG bucket and the cuBLAS workspaces then take 52 MiB, so the "
        "step's flat copy of the first sub-group, 1,944 MiB, takes the freed gradient buffer's segment and its fp32 "
        "cast a new one); the "
        "1024-token row (81.0 GB) is 2.5% under with the same cache, the 512-token row 6.8% over. What the table "
        "holds at 256 tokens would mean no cache at all; v0.19.5's one-GPU order is measured (tests/test_gpu_deepspeed"
        ".py), v0.12.3's initialisation and the reserved memory of the gathers over ranks are not (their allocations are, "
        "over gloo on the CPU: tests/test_deepspeed_gathers.py); over by 13.5%"),
}
MEDIAN_MISSES = {
    "full": ("full fine-tuning: 7.0% over 16 rows (7.1% while torch 2.0's NCCL was charged its requested bytes, "
             "_QWEN_ONE_RANK; 6.9% before ZeRO-3 over 2 GPUs was replayed; 6.0% while "
             "DeepSpeed's world of one rank was charged the H200's 950 MiB, _QWEN_ONE_RANK; 7.1% before DeepSpeed "
             "0.12.3's initialisation was replayed, 7.4% before the H200 DeepSpeed runs); torchtune's seven have a median of 1.1%, Qwen's nine are nvidia-smi "
             "readings of DeepSpeed ZeRO-3 runs. On one GPU the estimate follows four real DeepSpeed 0.19.5 steps of "
             "Qwen-1.8B's shape on an H200 (tests/test_gpu_deepspeed.py) and, for the table's DeepSpeed of late 2023 "
             "(framework_version 0.12.3), that release's initialisation (stage3.py: each fp32 partition cast from a "
             "16-bit clone, one FusedAdam step per sub-group making the moments, removed in 0.13.2) and the step's "
             "fp64 copy of each gradient for its norm (both releases), replayed: the 1.8B rows stay 5.6-8.4% under "
             "from 256 to 4096 tokens, 3.5-3.7 GB (2.4 at 2048) above the estimate (7.2-10.0%, 3.1-4.4 GB, with "
             "NCCL priced for torch 2.0). Read and ruled out at 0.12.3 "
             "(6ea44d02): the step (_prepare_fp32_grad_for_sub_group, unscale_and_clip_grads in place, "
             "_reassign_or_swap_out_partitioned_parameters a copy_ in place, _post_step), the overflow check (fp16 "
             "only), the IPG bucket and gradient partitions (sized as in 0.19.5), all_gather on one rank "
             "(_no_gather_coalesced, no gathered copy), __avg_scatter_grads and comm/coalesced_collectives.py "
             "reduce_scatter_coalesced (as 0.19.5), the gradient-accumulation and communication dtypes (engine.py "
             "get_data_types, communication_data_type: bf16 under ZeRO with bf16); with the ds_config's "
             "optimizer section DeepSpeed builds FusedAdam over the Trainer's one list of parameters (transformers "
             "integrations/deepspeed.py deepspeed_optim_sched: DummyOptim(params=model_parameters); no weight-decay "
             "split, so the sub-groups take the norms and biases in place: 248K elements, not modelled). "
             "finetune.py at e8e15962 (the 1.8B rows' commit) passes device_map "
             "'auto', which transformers refuses under ZeRO-3 (from_pretrained: 'DeepSpeed Zero-3 is not compatible "
             "with low_cpu_mem_usage=True or with passing a device_map'; None again from 23a01b0, 2024-01-08), so the "
             "script that ran the rows is not the one published. Not established: the CUDA context and NCCL of "
             "torch 2.0.1+cu118 (NCCL 2.14) on an A100 (the estimate charges the A100 constant, 512 MiB, and NCCL's "
             "950 MiB measured on H200, torch 2.11); module loading eager or lazy (see the HF rows' reason); the "
             "Q-LoRA (ZeRO-2) and 72B rows of the same stack fit within 10% with the same charges. 7B on 2 GPUs "
             "grows 11.4 GB a GPU from 256 to 1024 tokens where the estimate's peak, the ZeRO-3 step, does not move "
             "(+13.5% to -2.5%; +8.9% to -6.4% with the flat share): not ZeRO-3's gathered parameters, replayed (zero3_replay.py) the coordinator holds "
             "2.24e9 elements (4.5 GB) through 7B's backward, below the step's sub-group copies, whatever the "
             "length; nothing DeepSpeed allocates grows with the sequence (stage3.py: the IPG bucket, the gradient "
             "partitions and the sub-groups are sized by parameters; partitioned_param_coordinator.py by max_live "
             "and the prefetch bucket). The growth is 17.2 MB a token from 256 to 512 and 13.7 from 512 to 1024: "
             "2.4 times what the ledger keeps with no recompute at all (6.0 MB a token: recompute 'none' moves the "
             "estimate 1.5 to 6.1 GB) and 55 times the checkpointed layer inputs (0.26 MB), and it slows where a "
             "quadratic term (eager attention's scores, 64 B x s^2 a layer) would speed up. The replayed cache "
             "(OVERS['qwen-7b-full-s256']) makes the 256-token row's over; allocated plus what lies outside "
             "the allocator is 0.8% under it. Also read and ruled out: the rows' own scripts at e6f2a7a (2023-10-11: "
             "finetune_ds.sh --gradient_checkpointing True, per_device_train_batch_size 1, ds_config_zero3.json as "
             "at 2df8e8ac; finetune.py pads every sample to model_max_length, device_map None under ZeRO-3); "
             "DeepSpeed v0.11.1 (e9503fe4, the newest on that date) against v0.12.3: stage3.py differs by the "
             "partial optimizer offload (offload_ratio) and the sequence-parallel size, nothing sized by tokens; "
             "Qwen-1's modeling_qwen.py under flash-attn (c_attn, FlashSelfAttention unpads by the mask, the "
             "rotary cache a few MB, torch.utils.checkpoint per block)"),
}
# Qwen's Q-LoRA rows (DeepSpeed ZeRO-2 on one GPU, fp16, GPTQ int4 base): v0.12.3 stage_1_and_2.py step (l. 1755-1761)
# does flatten the partition's 16-bit gradients (flatten_dense_tensors_aligned, a torch.cat) before the fp32 cast,
# both alive, beside the contiguous gradient buffer (freed after the cast: free_grad_in_param_list); with adapters only
# that copy is 2 B x the trainable adapters (754,974,720 on 72B with c_attn fused: 1.51 GB). The fp16 overflow check
# (_has_inf_or_nan: x.float() per gradient) and the fp64 norm (g.double() per gradient) copy one adapter tensor at a
# time (under 13 MB). From the second micro-batch on, copy_grads_in_partition makes a second contiguous gradient
# buffer each backward (the first is averaged_gradients' storage until the step; _release_ipg_buffers frees the new
# one after add_), modelled (deepspeed_accumulation.py, measured over gloo: tests/test_deepspeed_accumulation.py): it
# raises the backward where that is the peak (7B +4.2% -> +6.9% at 256 tokens, 14B -4.3% -> -1.7%, 72B +3.7% ->
# +6.1% at 1024). What remains over on 72B (+3.7% to +7.7% before it) is the flat 10% fragmentation share (5.8-7.3 GB): allocated plus what lies outside the allocator is
# 1.9-5.5% under the table. Replaying 0.12.3's ZeRO-2 initialisation for adapters through deepspeed_replay.py (the
# base loaded, the adapters moved to the host, the flat buffer and its fp32 clone, FusedAdam's moments made by the
# init step) was tried and not kept: 72B +5.2% at 256 but +10.9% at 8192, 14B +19.0% and 1.8B +15.4% at 1024,
# unmeasured for adapter runs; the GPTQ unpacking's transients (an int32 expansion and its int8 cast, 5 B x the
# largest linear's weights) are not modelled either.


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


# Qwen-1.8B under ZeRO-3 on one GPU: every parameter (T), its sub-groups (n0: the embedding, 13 layers and the 14th's
# q, k, v, o, gate and up; n1: the rest of the matrices with the head; n2: the 24 x 2 + 1 norms of 2048 and the 24
# c_attn biases of 6144), and the IPG bucket ('auto': hidden_size**2 elements)
_T, _N = 1_836_828_672, (1_008_205_824, 828_375_040, 24 * 2 * 2048 + 2048 + 24 * 6144)
_BUCKET = 2048 * 2048


def _segment(nbytes: int) -> int:
    """A large request's new segment: rounded up to 2 MiB (CUDACachingAllocator.cpp get_allocation_size)."""
    return -(-nbytes // 2**21) * 2**21


def test_deepspeed_before_0_13_2_makes_adams_moments_at_initialisation():
    """DeepSpeed v0.12.3 stage3.py: `_create_fp32_partitions` casts a 16-bit clone of each sub-group to fp32 (the clone
    freed), then initialize_optimizer_states steps FusedAdam on each sub-group over a zeroed fp32 gradient buffer of the
    largest, making both moments there (removed in v0.13.2, commit 18179807). Replayed: the segments are each tensor
    rounded up to 2 MiB, the second sub-group's clone in the first's freed segment, the third's blocks (under 1 MiB)
    in two 2 MiB small-pool segments, the IPG bucket split off the clone's segment and the gradient partitions in the
    freed gradient buffer's; at the first step no moment is made."""
    from estimator.memory.deepspeed_replay import _init_zero3_stepped
    from estimator.memory.reserved import _Program

    assert sum(_N) == _T and _N[2] == 247_808
    program = _Program()
    moments = _init_zero3_stepped(program, list(map(float, _N)), _T, 2, 2, _BUCKET, 0)
    n0, n1, _ = _N
    large = [2 * _T, 2 * n0, 4 * n0, 4 * n1, 4 * n0, 4 * n0, 4 * n0, 4 * n1, 4 * n1]
    assert len(moments) == 6
    assert program.allocator.reserved == sum(map(_segment, large)) + 2 * 2**21 == 31_767_658_496
    assert program.allocator.segments == 9 + 2
    # kept: the flat 16-bit buffer (whole in its segment: a rest under 1 MiB is not split off), the fp32 partitions,
    # both moments, the bucket and the gradient partitions
    rest = _segment(2 * _T) - 2 * _T
    assert rest == 552_960
    assert program.allocator.allocated == 2 * _T + rest + 4 * _T + 8 * _T + 2 * _BUCKET + 2 * _T


def test_zero3_steps_copy_each_gradient_to_fp64_for_the_norm():
    """stage3.py step -> _get_norm_groups -> get_grad_norm_direct (v0.12.3 l. 1677, v0.19.5 l. 2255):
    `g.double().norm(2)` of each gradient partition, one at a time, before the first sub-group steps. After 0.12.3's
    initialisation no free block holds the embedding's (151,936 x 2048 x 8 B): a segment of its own, which the
    head's copy and then the first sub-group's flat 16-bit gradients reuse (the clone's freed segment lost 8 MiB to the
    IPG bucket); the sub-group's fp32 gradient takes a new one. After 0.19.5's, the second sub-group's freed fp32 cast (3.3 GB) holds it: no segment more."""
    from types import SimpleNamespace

    from estimator.memory.allocator import CachingAllocator
    from estimator.memory.deepspeed_replay import _init_zero3, _init_zero3_stepped, _step
    from estimator.memory.reserved import _Program

    cfg = SimpleNamespace(recipe=SimpleNamespace(grad_dtype="bf16"), training=SimpleNamespace(
        framework="deepspeed", adamw_implementation="fused", offload_optimizer="none"))
    embedding = 151_936 * 2048
    norms = [embedding, 5504 * 2048, embedding]  # the embedding's, one MLP matrix's, the head's
    groups = list(map(float, _N))
    program = _Program()
    moments = _init_zero3_stepped(program, groups, _T, 2, 2, _BUCKET, 0)
    before = program.allocator.reserved
    _step(program, cfg, groups, moments, CachingAllocator(), norms)
    # and the third sub-group's fp32 gradient (4 x 247,808 B) a 2 MiB small-pool segment: the two it has hold its
    # fp32 partition and moments with its flat copy beside them
    assert program.allocator.reserved - before == 8 * embedding + _segment(4 * _N[0]) + 2**21 == 6_524_239_872

    def grown(with_norms: list[int]) -> int:
        program = _Program()
        _init_zero3(program, groups, _T, 2, 2, _BUCKET)
        start = program.allocator.reserved
        _step(program, cfg, groups, [], CachingAllocator(), with_norms)
        return program.allocator.reserved - start

    assert grown(norms) == grown([])


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
    """The CUDA context is one constant per process, whatever the model or length. With torch 2.0's foreach AdamW
    (torch_version 2.0) and c_attn's one adapter and one frozen weight (fused_qkv) the 1.8B chat LoRA rows sit
    1.15-1.36 GB under the table at every length from 256 to 2048 tokens (1.57 at 4096),
    about what eager module loading adds on the H200 (1,837,957,120 - 804,061,184 B, spec/cuda_modules.py; torch
    1.13+cu117 added 666,632,192 - 287,047,680 B before cuBLAS: pytorch/pytorch#85692's two readings). But over the
    30 HF rows up to 4096 tokens the gap spreads from -3.58 GB (14B LoRA (emb), 4096) to 2.18 GB (14B LoRA, 512):
    not charged without a measurement of that stack. The same finetune.py's 1.8B Q-LoRA rows (DeepSpeed ZeRO-2, the
    same stack) were over by more than 10% with it while DeepSpeed's world of one rank was charged the H200's 950 MiB;
    with NCCL priced for torch 2.0's NCCL 2.14 (no cuMem: estimator/spec/nccl.py) they would be 1.8-6.1% over with
    it from 256 to 4096 tokens (_QWEN_ONE_RANK; 0.4-3.9% while that NCCL was charged its requested bytes): that no
    longer rules it out."""
    from estimator.spec.cuda_modules import H200_STACK

    eager_more = H200_STACK.loaded("eager").total(flash=True) - H200_STACK.loaded("lazy").total(flash=True)
    assert eager_more == 1_837_957_120 - 804_061_184 == 1_033_895_936
    assert 666_632_192 - 287_047_680 == 379_584_512
    rows = [r for r in ROWS.values() if r["id"].startswith("qwen-") and r["config"]["training"]["framework"] == "hf"
            and r["config"]["training"]["seq_len"] <= 4096]
    gaps = {r["id"]: r["measured"]["bytes"] - estimate_config(r["config"]).device_total_bytes for r in rows}
    assert len(gaps) == 30
    low, high = min(gaps, key=gaps.get), max(gaps, key=gaps.get)
    assert (low, high) == ("qwen-14b-lora-emb-s4096", "qwen-14b-lora-s512")
    assert gaps[low] == pytest.approx(-3.58e9, abs=0.01e9) and gaps[high] == pytest.approx(2.19e9, abs=0.01e9)
    small = [gaps[f"qwen-1.8b-lora-s{s}"] for s in (256, 512, 1024, 2048)]
    assert min(small) == pytest.approx(1.15e9, abs=0.01e9) and max(small) == pytest.approx(1.36e9, abs=0.01e9)
    with_eager = [(estimate_config(q["config"]).device_total_bytes + eager_more) / q["measured"]["bytes"] - 1
                  for q in (ROWS[f"qwen-1.8b-qlora-s{s}"] for s in (256, 512, 1024, 2048, 4096))]
    assert min(with_eager) == pytest.approx(0.018, abs=0.001) and max(with_eager) == pytest.approx(0.061, abs=0.001)


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


def step_parts(config: dict) -> dict[str, int]:
    stage = estimate_config(config).stages[0]
    step = next(p for p in stage.phases if p.name == "optimizer")
    return {p.label: p.bytes for c in step.components for p in (c.parts or (c,)) if "AdamW" in p.label}


def test_torch_before_2_1_holds_sqrt_v_plus_eps_beside_sqrt_v():
    """torch 2.0.1 torch/optim/adamw.py _multi_tensor_adamw: `denom = torch._foreach_add(exp_avg_sq_sqrt, eps)` out of
    place, beside sqrt(v) (2.1.0: `_foreach_add_`, in place). Qwen-7B LoRA (emb) under peft 0.5: the adapters (rank 64
    on every linear, 159,907,840) and the embedding and head copies (2 x 151,936 x 4096) are all bf16, one (device,
    dtype) group: 2 B each for sqrt(v) and as much again. With peft 0.12's fp32 adapters, two groups: the second's
    iteration holds the first's sqrt(v) + eps beside its own two, so the larger group's bytes again."""
    adapters, copies = 159_907_840, 2 * 151_936 * 4096
    config = qwen7b(256, framework="hf", training_loop="trainer", param_dtype="bf16", compute_dtype="bf16")
    config["parallel"] = {}
    config["training"]["adapter"].pop("base_dtype")
    config["training"]["adapter"].update(peft_version="0.5.0", trainable_embeddings=True)
    sqrt, denom = "foreach AdamW temporary (sqrt of the second moment)", \
        "foreach AdamW's sqrt(v) + eps, out of place (torch before 2.1)"
    assert step_parts(config) == {sqrt: 2 * (adapters + copies)}
    for version in ("2.1", "2.13"):
        config["training"]["torch_version"] = version
        assert step_parts(config) == {sqrt: 2 * (adapters + copies)}
    config["training"]["torch_version"] = "2.0"
    assert 2 * (adapters + copies) == 2_809_135_104
    assert step_parts(config) == {sqrt: 2 * (adapters + copies), denom: 2 * (adapters + copies)}
    config["training"]["adapter"]["peft_version"] = "0.12.0"
    assert step_parts(config) == {sqrt: 4 * adapters + 2 * copies, denom: max(4 * adapters, 2 * copies)}


def test_torch_before_2_1_under_deepspeed_steps_two_fp32_temporaries_of_the_sub_group():
    """DeepSpeed with torch's foreach AdamW (adamw_implementation foreach) steps each ZeRO-3 sub-group's flat fp32
    tensor: under torch 2.0 sqrt(v) and sqrt(v) + eps, 4 B each of Qwen-1.8B's first sub-group (1,008,205,824)."""
    config = json.loads(json.dumps(ROWS["qwen-1.8b-full-s256"]["config"]))
    config["training"].update(adamw_implementation="foreach", torch_version="2.0")
    assert step_parts(config) == {"foreach AdamW temporary (sqrt of the second moment)": 4 * _N[0],
                                  "foreach AdamW's sqrt(v) + eps, out of place (torch before 2.1)": 4 * _N[0]}


def test_qwens_fused_c_attn_takes_one_adapter():
    """Qwen-1's modeling_qwen.py QWenAttention: c_attn = nn.Linear(hidden_size, 3 * projection_size), one module,
    a LoRA target of finetune.py (lora_target_modules c_attn, c_proj, w1, w2): peft wraps it with one lora_A
    (r x h) and one lora_B (3h x r). Qwen-72B, rank 64, per layer: c_attn 64 x (8192 + 24576), the attention's
    c_proj 64 x (8192 + 8192), w1 and w2 64 x (8192 + 24576) each and the MLP's c_proj 64 x (24576 + 8192); over 80
    layers 754,974,720 adapter weights, 80 x 2 x 64 x 8192 fewer than three separate q, k, v projections would take.
    Under DeepSpeed's fp16 ZeRO-2 (the Q-LoRA rows) the gradients are 2 B each, the master weights 4 B."""
    h, f, r, layers = 8192, 24576, 64, 80
    adapters = layers * r * ((h + 3 * h) + (h + h) + 2 * (h + f) + (f + h))
    assert adapters == 754_974_720

    def states(fused: bool) -> dict[str, int]:
        config = json.loads(json.dumps(ROWS["qwen-72b-qlora-s256"]["config"]))
        config["model"]["fused_qkv"] = fused
        return {c.label: c.bytes for c in estimate_config(config).stages[0].components}

    fused, apart = states(True), states(False)
    assert fused["Gradients"] == 2 * adapters and fused["Master weights (fp32)"] == 4 * adapters
    assert apart["Gradients"] - fused["Gradients"] == 2 * layers * 2 * r * h


def test_a_fused_qkv_is_targeted_whole():
    """peft wraps the one fused module (c_attn, Phi-3's qkv_proj): q, k or v names it, so ["q", "v"] adapts it once,
    as ["q"] does, and ["q", "o"] adds the output projection's adapter: 64 x (4096 + 4096) a layer, 32 layers."""
    config = json.loads(json.dumps(ROWS["qwen-7b-qlora-s256"]["config"]))

    def gradients(targets: list[str]) -> int:
        config["training"]["adapter"]["target_modules"] = targets
        return next(c.bytes for c in estimate_config(config).stages[0].components if c.label == "Gradients")

    assert gradients(["q", "v"]) == gradients(["q"]) == gradients(["v"]) == gradients(["k", "v", "q"])
    assert gradients(["q", "o"]) - gradients(["q"]) == 2 * 32 * 64 * (4096 + 4096)
    phi = {"model": "phi-4", "training": {"framework": "hf", "adapter": {"method": "lora"}}}  # targets q, v
    assert estimate_config(phi).allocated_peak_bytes > 0


def test_gptq_int4_layers_keep_their_weight_dequantized_for_backward():
    """auto-gptq's cuda-old QuantLinear (v0.4.2 and v0.5.1 qlinear_cuda_old.py, the one Qwen's GPTQConfig(bits=4,
    disable_exllama=True) gets for desc_act False) unpacks its weight to fp16 from 128 rows on and runs torch.matmul,
    which keeps that fp16 weight for the input's gradient: Qwen-7B's recomputed layer holds c_attn (4096 x 12288), the
    attention's c_proj (4096 x 4096), w1 and w2 (4096 x 11008) and the MLP's c_proj (11008 x 4096), 2 B each; at
    127 tokens the CUDA kernel runs and nothing is kept."""
    from estimator import load_config
    from estimator.memory.adapter_activations import gptq_dequantized

    h, f = 4096, 11008
    weights = 2 * (h * 3 * h + h * h + 3 * h * f)
    assert weights == 404_750_336

    def kept(seq: int) -> float:
        config = json.loads(json.dumps(ROWS["qwen-7b-qlora-s256"]["config"]))
        config["training"]["seq_len"] = seq
        cfg = load_config(config)
        return sum(e.bytes(cfg.parallel) for e in gptq_dequantized(cfg.architecture, cfg.training, cfg.parallel,
                                                                   "dense", False))

    assert kept(256) == kept(128) == weights and kept(127) == 0
    backward = {p.label: p.bytes for c in estimate_config(ROWS["qwen-7b-qlora-s256"]["config"]).stages[0].components
                for p in (c.parts or (c,))}
    assert backward["One recomputed layer's activations"] > weights
