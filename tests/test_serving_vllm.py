"""Serving capacity on vLLM V1 (estimator/serving/): by hand, against vLLM's own KV cache accounting
run on CPU (tests/data/serving/vllm-*.json, made by validation/vllm/kv_records.py), against public
start-up logs, and one test per version rule."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from estimator.spec.architecture import Architecture
from estimator.spec.errors import ConfigError
from estimator.spec.gpus import GPUS
from estimator.spec.hardware import Hardware
from estimator.spec.parallel import Parallel
from estimator.models.presets import get_architecture, get_hf_config
from estimator.serving import kv_cache, recurrent_state
from estimator.spec.serving import Serving
from estimator.serving.vllm_engine import estimate_vllm
from estimator.serving.vllm_versions import rules_for
from estimator.serving.weights import WeightFormat, matrix_bytes, stage_layers, stage_weights

GiB = 2**30
MiB = 2**20
# torch's cuBLAS workspace on compute capability 9.x (CublasHandlePool.cpp: 4096 KiB x 8), allocated by the profiling
# run's first GEMM and counted in its torch peak (serving/profile_buffers.py)
CUBLAS_HOPPER = 4096 * 8 * 1024
DATA = Path(__file__).parent / "data" / "serving"
LLAMA_8B_PARAMS = 8_030_261_248  # the preset's exact count (tests/test_presets.py)
H100 = round(79.19 * 2**30)  # the total CUDA reports on an H100 SXM (vllm_engine.CUDA_REPORTED_TOTAL)


def serve(model: str, gpu: str = "h100-80", tp: int = 1, pp: int = 1, checkpoint: dict | None = None, **serving):
    hf = get_hf_config(model) if checkpoint is None else checkpoint
    return estimate_vllm(get_architecture(model), Serving(**serving), Parallel(tp=tp, pp=pp), Hardware(gpu), hf)


# --- vLLM's own accounting, recorded -------------------------------------------------------------

def _records():
    for path in sorted(DATA.glob("vllm-*.json")):
        if path.name.endswith("-weights.json"):
            continue
        data = json.loads(path.read_text())
        assert "-m validation.vllm.kv_records --out" in data["command"], "each file names the command that made it"
        for record in data["records"]:
            yield pytest.param(record, id=f"{data['vllm_version']}-{record['case']['model']}-tp{record['case']['tp']}"
                                          f"-pp{record['case']['pp']}")


def within(ours: float, theirs: float, tolerance: float = 0.03) -> bool:
    return abs(ours - theirs) <= tolerance * abs(theirs)


@pytest.mark.parametrize("record", list(_records()))
def test_kv_cache_matches_vllm_own_accounting(record):
    """Given the KV memory of each stage, our blocks, KV bytes, tokens, concurrency and longest
    max_model_len are vLLM's (get_kv_cache_configs, estimate_max_model_len) within 3%; the layer
    split and the number of groups exactly."""
    case, given, vllm = record["case"], record["given"], record["vllm"]
    arch = get_architecture(case["model"])
    rules = rules_for(case["serving"]["engine_version"])
    kv_bytes = 1 if case["serving"].get("kv_cache_dtype", "auto").startswith("fp8") else 2
    block, state_pages, state_every = given["block_size"], 1, None
    if arch.is_hybrid:  # the block, the states' mode and pages by release (recurrent_state.py)
        layout = recurrent_state.plan(arch, rules, case["gpu"], case["tp"], kv_bytes, 2, None,
                                      case["serving"].get("prefix_caching", False), None)
        block, state_pages, state_every = layout.block_size, layout.state_pages, layout.state_every
        assert block == vllm["block_size"]
        assert vllm.get("mamba_cache_mode", "none") == layout.mode
    specs = kv_cache.layer_specs(arch, case["tp"], block, kv_bytes, state_pages=state_pages, state_every=state_every)
    # Llama 4's chunked layers: full-attention ones where the release turns the hybrid manager off (0.11)
    specs = kv_cache.without_hybrid_allocator(specs, rules.version, eagle=False)
    groups = kv_cache.kv_groups(specs, rules.version)
    ranges = stage_layers(arch.num_layers, case["pp"])
    in_flight = kv_cache.in_flight_tokens(given["max_num_batched_tokens"], case["pp"], rules.version)
    available = tuple(given["available_kv_bytes"])
    cap = kv_cache.capacity(groups, ranges, available, given["max_model_len"], in_flight, rules.kv_tokens_rule)
    longest = kv_cache.longest_model_len(groups, ranges, available, in_flight, given["model_len_ceiling"],
                                         rules.version)
    assert [[r.start, r.stop] for r in ranges] == vllm["stage_layers"]
    assert groups.count == vllm["num_groups"]
    assert kv_cache.kv_heads_per_rank(arch, case["tp"]) == vllm["num_kv_heads_per_rank"] or vllm["use_mla"]
    assert within(cap.num_blocks, vllm["num_blocks"])
    limiting = min(range(len(ranges)), key=lambda s: available[s] // groups.block_bytes_on(ranges[s]))
    assert within(cap.kv_cache_bytes, vllm["kv_cache_bytes_per_stage"][limiting])
    assert within(cap.tokens, vllm["kv_cache_tokens"])
    assert within(cap.max_concurrency, vllm["max_concurrency"])
    assert within(longest, vllm["max_model_len_that_fits"])


def test_records_cover_the_grid():
    """Both releases, TP 1/2/4/8, PP 2, dense, GQA, MoE, sliding window, MLA, fp8 KV."""
    cases = [r.values[0]["case"] for r in _records()]
    assert {c["serving"]["engine_version"] for c in cases} == {"0.11", "0.33"}
    assert {c["tp"] for c in cases} >= {1, 2, 4, 8} and any(c["pp"] == 2 for c in cases)
    models = {c["model"] for c in cases}
    assert {"llama-3.1-8b", "qwen3-235b-a22b", "gemma-3-27b", "mistral-7b", "deepseek-v3", "gpt-oss-120b"} <= models
    assert any(c["serving"].get("kv_cache_dtype") == "fp8" for c in cases)


def test_records_cover_the_hybrids_on_0_33():
    """Falcon-H1, Nemotron-H, Qwen3-Next and Jamba each at TP 1 and 2 under 0.33, with the states' both modes."""
    hybrids = {"falcon-h1-7b", "nemotron-h-8b", "qwen3-next-80b-a3b", "jamba-mini-1.5"}
    cases = [r.values[0]["case"] for r in _records() if r.values[0]["case"]["model"] in hybrids
             and r.values[0]["case"]["serving"]["engine_version"] == "0.33"]
    assert {(c["model"], c["tp"]) for c in cases} == {(m, tp) for m in hybrids for tp in (1, 2)}
    assert {c["serving"].get("prefix_caching", False) for c in cases} == {False, True}


def _weight_records():
    data = json.loads((DATA / "vllm-0.11.0-weights.json").read_text())
    for r in data["records"]:
        yield pytest.param(r, id=f"{r['format']}-{r['layer']}-tp{r['tp']}")


# gptq_marlin's process_weights_after_loading (kernels/mixed_precision/marlin.py, 0.11) replaces g_idx
# (no act-order) and the zero points (symmetric) with empty tensors: the loaded weight keeps neither
AFTER_LOAD_DROPPED = {"gptq_int4": ("g_idx", "qzeros")}


@pytest.mark.parametrize("record", list(_weight_records()))
def test_weight_bytes_match_vllm_create_weights(record):
    """Our bytes per linear weight, per format and TP rank, are those of the tensors vLLM 0.11's
    quantized linear methods create (recorded on CPU by validation/vllm/weight_records.py), less what
    marlin drops after loading."""
    tp, inp, out = record["tp"], record["input_size"], record["output_size"]
    in_part, out_part = (inp, out // tp) if record["split"] == "column" else (inp // tp, out)
    name = record["format"]
    fmt = WeightFormat("fp8", (128, 128)) if name == "fp8_block" else WeightFormat(name)
    theirs = sum(p["bytes"] for key, p in record["parameters"].items()
                 if key not in AFTER_LOAD_DROPPED.get(name, ()))
    assert matrix_bytes(fmt, out_part, in_part, expert=False) == theirs


# --- by hand ---------------------------------------------------------------------------------------

def test_weights_llama3_8b_match_public_vllm_logs():
    """vLLM PR #10511 (Meta-Llama-3-8B on H100): 'model weights take 14.96GiB' at TP 1, 7.48 at TP 2;
    PR #17122 (Llama-3.1-8B): 'Model loading took 14.9889 GiB'. By hand: 2 bytes x 8,030,261,248
    parameters (vocabulary 128,256 is already a multiple of 64) + the RoPE cache positions x 128 x 2."""
    arch = get_architecture("llama-3.1-8b")
    bf16 = WeightFormat("bf16")
    tp1 = stage_weights(arch, bf16, 1, 1, 1, 0, range(32), context=8192).bytes
    assert tp1 == 2 * LLAMA_8B_PARAMS + 8192 * 128 * 2
    assert round(tp1 / GiB, 2) == 14.96
    norms = 32 * 2 * 4096 + 4096  # replicated on both ranks
    tp2 = stage_weights(arch, bf16, 2, 1, 1, 0, range(32), context=8192).bytes
    assert tp2 == 2 * ((LLAMA_8B_PARAMS - norms) // 2 + norms) + 8192 * 128 * 2
    assert round(tp2 / GiB, 2) == 7.48
    # vLLM measures the allocator (2 MiB-rounded segments): 14.9889 GiB; ours 14.98878, 0.13 MB apart
    assert serve("llama-3.1-8b", max_model_len=32768).limiting.weights / GiB == pytest.approx(14.9889, abs=5e-4)


@pytest.mark.parametrize("fmt, expected", [
    (WeightFormat("bf16"), 2 * 4096 * 4096),
    (WeightFormat("fp8"), 4096 * 4096 + 4),  # one fp32 scale per matrix
    (WeightFormat("int8"), 4096 * 4096 + 4 * 4096),  # one fp32 scale per output row
    (WeightFormat("gptq_int4"), 4096 * 4096 // 2 + 2 * 4096 * 32),  # fp16 scales per 128 inputs
    (WeightFormat("awq_int4"), 4096 * 4096 // 2 + 2 * 4096 * 32 + 4096 * 32 // 2),  # + packed zero points
    (WeightFormat("nvfp4"), 4096 * 4096 // 2 + 4096 * 4096 // 16 + 8),  # fp8 scale per 16, fp32 globals
])
def test_linear_weight_bytes_per_format(fmt, expected):
    assert matrix_bytes(fmt, 4096, 4096, expert=False) == expected


def test_mxfp4_quantizes_experts_only_and_fp8_blocks():
    mx = WeightFormat("mxfp4")
    assert matrix_bytes(mx, 5760, 2880, expert=True) == 5760 * 2880 / 2 + 5760 * 2880 / 32
    assert matrix_bytes(mx, 5760, 2880, expert=False) == 2 * 5760 * 2880
    block = WeightFormat("fp8", block=(128, 128))  # DeepSeek-V3 weight_scale_inv
    assert matrix_bytes(block, 7168, 2048, expert=False) == 7168 * 2048 + 4 * 56 * 16


def test_checkpoint_format_is_read_from_quantization_config():
    assert serve("deepseek-v3", "h200", tp=8, max_model_len=4096).resolved.weights == WeightFormat("fp8", (128, 128))
    assert serve("gpt-oss-20b", max_model_len=4096).resolved.weight_format == "mxfp4"
    assert serve("llama-3.1-8b", max_model_len=4096).resolved.weight_format == "bf16"
    assert serve("llama-3.1-8b", max_model_len=4096, weight_format="awq_int4").resolved.weight_format == "awq_int4"


def test_kv_page_sizes_gqa_replication_and_mla():
    """Page of one layer = 2 x KV heads on the rank x head_dim x block x bytes; TP beyond the KV heads
    keeps one head per rank (Llama-3.1-70B has 8); MLA caches kv_lora_rank + rope dim = 576 per token,
    the same on every TP rank."""
    llama70 = get_architecture("llama-3.1-70b")
    assert kv_cache.layer_specs(llama70, 4, 16, 2)[0].page_bytes == 2 * 2 * 128 * 16 * 2
    assert kv_cache.layer_specs(llama70, 16, 16, 2)[0].page_bytes == 2 * 1 * 128 * 16 * 2
    ds = get_architecture("deepseek-v3")
    for tp in (1, 8):
        spec = kv_cache.layer_specs(ds, tp, 64, 2)[0]
        assert (spec.kind, spec.page_bytes) == ("mla", 64 * 576 * 2)
    assert serve("deepseek-v3", "h200", tp=8, max_model_len=4096).resolved.block_size == 64  # FlashMLA
    assert serve("deepseek-v3", "b200", tp=8, max_model_len=4096).resolved.block_size == 128  # CUTLASS MLA


def test_llama_8b_capacity_by_hand():
    """H100, utilization 0.9, vLLM 0.11: available = budget - weights - activation - non-torch; blocks =
    available // (32 layers x 16 tokens x 2 x 8 x 128 x 2 B = 2 MiB); tokens = blocks x 16;
    concurrency = blocks / (32768 / 16)."""
    e = serve("llama-3.1-8b", max_model_len=32768, engine_version="0.11")
    s = e.limiting
    assert e.budget_bytes == int(H100 * 0.9)
    assert s.available == e.budget_bytes - s.weights - s.activation - s.non_torch  # graphs on top in 0.11
    blocks = s.available // (2 * 2**20)
    assert e.capacity.num_blocks == blocks
    assert e.capacity.kv_cache_bytes == blocks * 2 * 2**20
    assert e.capacity.tokens == blocks * 16
    assert e.capacity.max_concurrency == blocks / 2048
    assert e.to_json()["max_concurrency"] == pytest.approx(e.capacity.tokens / 32768)
    assert e.max_model_len_that_fits == 131072 and e.starts


def test_qwen3_235b_fp8_tokens_from_a_public_log():
    """vLLM issue #21348: Qwen3-235B-A22B-FP8, TP 4 on H100: 'Available KV cache memory: 8.11 GiB',
    'GPU KV cache size: 178,880 tokens'. Given that memory our block count gives the tokens within 3%
    (94 layers x 1 KV head per rank x 128 x 2 x 2 B per token)."""
    arch = get_architecture("qwen3-235b-a22b")
    groups = kv_cache.kv_groups(kv_cache.layer_specs(arch, 4, 16, 2), (0, 11))
    cap = kv_cache.capacity(groups, (range(94),), (int(8.11 * GiB),), 40960, 8192, "blocks")
    assert cap.tokens == int(8.11 * GiB) // (94 * 16 * 2 * 128 * 2) * 16
    assert within(cap.tokens, 178_880)


def test_sliding_window_groups_by_hand():
    """Gemma-3-27B: 62 layers, every 6th global: 10 full, 52 sliding (window 1024). group_size = 10:
    the sliding layers make cdiv(52, 10) = 6 groups, the full ones 1 (7 groups); a block holds 10 pages.
    A request of L tokens takes cdiv(L, 16) full blocks and, per sliding group, cdiv(min(1023 + T, L), 16)
    + 1 blocks (T = in-flight tokens)."""
    arch = get_architecture("gemma-3-27b")
    groups = kv_cache.kv_groups(kv_cache.layer_specs(arch, 1, 16, 2), (0, 11))
    assert groups.count == 7 and groups.layers_per_group_on(range(62)) == 10
    cap = kv_cache.capacity(groups, (range(62),), (10 * GiB,), 32768, 8192, "blocks")
    page = 16 * 2 * 16 * 128 * 2
    assert cap.num_blocks == 10 * GiB // (10 * page)
    assert cap.blocks_per_request == 32768 // 16 + 6 * ((1023 + 8192) // 16 + 1 + 1)
    assert cap.tokens == cap.num_blocks // 7 * 16


# --- one test per version rule ---------------------------------------------------------------------

def test_rule_0_20_cuda_graphs_inside_the_budget():
    """0.20: VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS defaults to 1, so profile_cudagraph_memory's estimate (the
    larger first capture + each further capture's driver memory, serving/cuda_graphs.py) leaves the KV budget;
    0.19 captures the graphs after the KV cache is sized (and prints the pool, the executables' driver memory and
    the capture stream's cuBLAS workspace: serving/cuda_graphs.py, tests/test_serving_graph_driver.py)."""
    old, new = (serve("llama-3.1-8b", max_model_len=32768, engine_version=v) for v in ("0.19", "0.20"))
    assert old.resolved.rules.label == "0.19" and new.resolved.rules.label == "0.20"
    # the pool's segments: FA3's 256 MiB out_accum on top of the pieces' 64 MiB (tests/test_serving_cuda_graphs.py)
    fa3, pieces = 256 * 2**20, 64 * 2**20
    assert new.limiting.cuda_graphs == fa3 + 1_189_258 + 50 * (4_424_138 + 1_189_258)  # each capture's driver memory
    assert old.limiting.cuda_graphs == fa3 + pieces + 286_283_196 + (2 + 32) * 2**20  # + the stream's small segment
    assert old.limiting.available - new.limiting.available == new.limiting.cuda_graphs
    eager = serve("llama-3.1-8b", max_model_len=32768, engine_version="0.20", cuda_graphs=False)
    assert eager.limiting.cuda_graphs == 0 and eager.limiting.available == old.limiting.available


def test_rule_0_21_tokens_from_concurrency():
    """0.21: 'GPU KV cache size' = int(max_concurrency x max_model_len), not blocks // groups x block_size
    (they differ for hybrid models: Gemma-3's 7 groups)."""
    arch = get_architecture("gemma-3-27b")
    groups = kv_cache.kv_groups(kv_cache.layer_specs(arch, 1, 16, 2), (0, 21))
    args = (groups, (range(62),), (10 * GiB,), 32768, 8192)
    blocks, concurrency = kv_cache.capacity(*args, "blocks"), kv_cache.capacity(*args, "concurrency")
    assert blocks.tokens == blocks.num_blocks // 7 * 16
    assert concurrency.tokens == int(blocks.max_concurrency * 32768) != blocks.tokens
    assert rules_for("0.20").kv_tokens_rule == "blocks" and rules_for("0.21.1").kv_tokens_rule == "concurrency"


def test_rule_0_21_budget_rounds_up():
    """request_memory (0.21+) takes math.ceil of total x utilization; 0.11 keeps the float (int() at use)."""
    assert serve("llama-3.1-8b", max_model_len=4096, engine_version="0.11").budget_bytes == int(H100 * 0.9)
    assert serve("llama-3.1-8b", max_model_len=4096, engine_version="0.21").budget_bytes == math.ceil(H100 * 0.9)


def test_rule_0_33_large_gpu_batch_defaults():
    """0.33 gives GPUs of >= 160 GiB 16384 batched tokens (absent in 0.25); >= 70 GiB non-A100 get 8192 and
    1024 sequences; smaller GPUs and A100s 2048 and 256 (engine/arg_utils.py)."""
    r = lambda gpu, v: serve("llama-3.1-8b", gpu, max_model_len=4096, engine_version=v).resolved  # noqa: E731
    assert (r("b200", "0.33").max_num_batched_tokens, r("b200", "0.25").max_num_batched_tokens) == (16384, 8192)
    assert (r("h100-80", "0.33").max_num_batched_tokens, r("h100-80", "0.33").max_num_seqs) == (8192, 1024)
    assert (r("a100-80", "0.33").max_num_batched_tokens, r("a100-80", "0.33").max_num_seqs) == (2048, 256)


def test_rule_0_33_in_flight_tokens_and_group_size():
    """0.33 sizes a sliding window for 2 batches in flight (async scheduling) and, when the kinds' layer
    counts are within 1.5x, groups by the larger count (13 sliding + 12 full: 2 groups, not 3)."""
    assert kv_cache.in_flight_tokens(8192, 1, (0, 11)) == 8192
    assert kv_cache.in_flight_tokens(8192, 1, (0, 33)) == 2 * 8192
    assert kv_cache.in_flight_tokens(8192, 4, (0, 33)) == 4 * 8192
    arch = Architecture(hidden_size=1024, num_layers=25, num_attention_heads=8, num_kv_heads=8, vocab_size=1000,
                        intermediate_size=4096, sliding_window=128, sliding_window_pattern=2)
    specs = kv_cache.layer_specs(arch, 1, 16, 2)
    assert kv_cache.kv_groups(specs, (0, 11)).count == 3
    assert kv_cache.kv_groups(specs, (0, 33)).count == 2


def test_rule_0_33_hybrid_states_align_under_prefix_caching():
    """Qwen3-Next at TP 2: one Gated DeltaNet state = conv 3 x (2 x 16 x 128 + 32 x 128) / 2 + (32 / 2) x 128 x 128
    = 274,432 bf16 values = 548,864 B; one token's attention page 2 x 1 KV head x 256 x 2 B = 1,024 B. 0.11 (and 0.33
    without prefix caching): block 16 x cdiv(548,864, 16 x 1,024) = 544, one state page per GDN group. 0.33 with
    prefix caching (align mode) on an H200 (FlashInfer's GDN prefill, 64-token checkpoints): block
    64 x cdiv(548,864, 64 x 1,024) = 576, and 2 + 1 checkpoint state pages per GDN group. 12 attention + 36 GDN
    layers: 4 groups of 12, a block of 12 pages. At 131,072 tokens a request takes cdiv(131,072, 576) = 228
    attention blocks + 3 groups x 3 = 237 (244 = 241 + 3 with one page per state)."""
    run = lambda v, pc, gpu="h200": serve("qwen3-next-80b-a3b", gpu, tp=2, max_model_len=131072,  # noqa: E731
                                          engine_version=v, prefix_caching=pc)
    for version, caching, block, per_request in (("0.11", True, 544, 241 + 3), ("0.33", False, 544, 241 + 3),
                                                 ("0.33", True, 576, 228 + 9)):
        ours = run(version, caching)
        cap, available = ours.capacity, ours.stages[0].available
        assert (ours.resolved.block_size, cap.blocks_per_request) == (block, per_request)
        assert cap.num_blocks == available // (12 * block * 1024)
        assert cap.max_concurrency == cap.num_blocks / per_request
    assert run("0.33", True).capacity.tokens == int(run("0.33", True).capacity.num_blocks / 237 * 131072)
    # the note says which mode ran and why: set off, set on, and 0.11 turning it off for hybrids whatever is asked
    assert [next(n for n in run(v, pc).notes if n.startswith("Prefix caching"))
            for v, pc in (("0.33", False), ("0.33", True), ("0.11", True))] == [
        "Prefix caching off: set in the config (--no-enable-prefix-caching).",
        "Prefix caching on: set in the config (--enable-prefix-caching).",
        "Prefix caching off although the config sets it on (vLLM 0.11.0 engine/arg_utils.py _set_default_args: on "
        "for non-pooling models; model_executor/models/config.py MambaModelConfig: off for hybrid and Mamba models, "
        "whatever the flag)."]
    # an A100 runs Triton's GDN prefill: align mode without checkpoints, 16-token alignment, two pages per state; at
    # TP 4 a state is 274,432 B (conv 3 x 8,192 / 4, 8 x 128 x 128) and the single KV head 1,024 B a token:
    # block 16 x cdiv(274,432, 16,384) = 272, cdiv(32,768, 272) = 121 attention blocks + 3 groups x 2
    a100 = serve("qwen3-next-80b-a3b", "a100-80", tp=4, max_model_len=32768, engine_version="0.33", prefix_caching=True)
    assert (a100.resolved.block_size, a100.capacity.blocks_per_request) == (272, 121 + 3 * 2)
    # Nemotron-H 8B (Mamba-2, fp32 SSM state): 3 x (8,192 + 2 x 8 x 128) x 2 B + 128 x 64 x 128 x 4 B = 4,255,744 B,
    # token page 2 x 8 x 128 x 2 = 4,096 B: block 16 x cdiv(4,255,744, 65,536) = 1,040 either way; align mode holds
    # two pages and a prefill checkpoint (0.33.0 mamba_mixer2.py MambaMixer2.get_kv_cache_spec:
    # num_prefill_checkpoint_blocks=1) in each of the 6 Mamba groups (24 layers in groups of 4): cdiv(8,192, 1,040) = 8
    # + 6 x 3 blocks
    nemotron = serve("nemotron-h-8b", engine_version="0.33", prefix_caching=True)
    assert (nemotron.resolved.block_size, nemotron.capacity.blocks_per_request) == (1040, 8 + 18)
    # 0.33 aligns to the requested block itself (max(16, block_size)); 0.11 takes the larger of the two
    arch = get_architecture("qwen3-next-80b-a3b")
    assert recurrent_state.hybrid_block_size(arch, 2, 2, 2, 48, 1024, (0, 11)) == 544
    assert recurrent_state.hybrid_block_size(arch, 2, 2, 2, 48, 1024, (0, 33)) == 48 * 12


def test_pipeline_stages_follow_get_pp_indices():
    """61 layers over 2 stages: [31, 30]; 80 over 3: [27, 27, 26] (the remainder before the last stage)."""
    assert [len(r) for r in stage_layers(61, 2)] == [31, 30]
    assert [len(r) for r in stage_layers(80, 3)] == [27, 27, 26]


# --- what vLLM refuses ------------------------------------------------------------------------------

def test_too_long_a_request_does_not_start_and_says_the_longest():
    e = serve("llama-3.1-70b", tp=2, max_model_len=131072)
    assert not e.starts and 0 < e.max_model_len_that_fits < 131072
    longest = serve("llama-3.1-70b", tp=2, max_model_len=e.max_model_len_that_fits)
    assert longest.starts


@pytest.mark.parametrize("serving, field", [
    ({"engine_version": "0.10"}, "serving.engine_version"),
    ({"engine_version": "latest-ish"}, "serving.engine_version"),
    ({"max_model_len": 10**6}, "serving.max_model_len"),
    ({"gpu_memory_utilization": 0}, "serving.gpu_memory_utilization"),
    ({"kv_cache_dtype": "int4"}, "serving.kv_cache_dtype"),
])
def test_bad_serving_values_name_the_field(serving, field):
    with pytest.raises(ConfigError) as err:
        serve("llama-3.1-8b", **serving)
    assert err.value.field == field


def test_prefix_caching_effective_concurrency_by_hand():
    """Llama-3.1-8B, 32k sequences sharing a 4,000-token prefix: its 250 full blocks are stored once, so
    (blocks - 250) / (2048 - 250) sequences fit; the block count itself is unchanged."""
    plain = serve("llama-3.1-8b", max_model_len=32768)
    shared = serve("llama-3.1-8b", max_model_len=32768, prefix_caching=True, shared_prefix_tokens=4000)
    assert shared.capacity == plain.capacity and plain.effective_concurrency == plain.capacity.max_concurrency
    assert shared.effective_concurrency == (plain.capacity.num_blocks - 250) / (2048 - 250)
    # unset, prefix caching is vLLM's default, on for a decoder (config/model.py is_prefix_caching_supported)
    default = serve("llama-3.1-8b", max_model_len=32768, shared_prefix_tokens=4000)
    assert default.effective_concurrency == shared.effective_concurrency
    for off in ({"prefix_caching": False}, {"engine_version": "0.25"}):  # set off; a hybrid's default before 0.33
        model = "llama-3.1-8b" if off.get("prefix_caching") is False else "nemotron-h-8b"
        with pytest.raises(ConfigError) as err:
            serve(model, shared_prefix_tokens=4000, **off)
        assert err.value.field == "serving.shared_prefix_tokens"


def test_speculative_eagle_head_by_hand():
    """Llama-3.1-8B with EAGLE: one decoder layer (q, k, v, o: 4096 x (4096 + 1024 + 1024 + 4096), MLP 3 x
    4096 x 14336, two norms), a final norm and fc 4096 x 8192, in bf16, on top of the target; its KV layer
    makes a block 33 pages instead of 32."""
    plain = serve("llama-3.1-8b", max_model_len=32768)
    eagle = serve("llama-3.1-8b", max_model_len=32768, speculative={"method": "eagle"})
    head = 4096 * (4096 + 1024 + 1024 + 4096) + 3 * 4096 * 14336 + 2 * 4096 + 4096 + 4096 * 8192
    assert eagle.limiting.weights - plain.limiting.weights == 2 * head
    assert eagle.capacity.num_blocks == eagle.limiting.available // (33 * 16 * 2 * 8 * 128 * 2)


def test_speculative_mtp_adds_an_mla_layer_and_its_module():
    """DeepSeek-V3 MTP: one module (its layer, 2h -> h projection, norms, embedding and head) and one more
    MLA layer per block (62 pages of 64 x 576 x 2 B)."""
    ds = serve("deepseek-v3", "h200", tp=8, max_model_len=32768, speculative={"method": "mtp", "num_speculative_tokens": 1})
    assert ds.capacity.num_blocks == ds.limiting.available // (62 * 64 * 576 * 2)
    with pytest.raises(ConfigError) as err:
        serve("llama-3.1-8b", max_model_len=4096, speculative={"method": "mtp"})
    assert err.value.field == "serving.speculative.method"


def test_speculative_draft_model_mixes_page_sizes_in_one_group():
    """Llama-3.1-70B (TP 4: 2 KV heads x 128 per rank) drafted by Llama-3.2-1B (8 KV heads of 64 -> 2 per
    rank): one group of mixed pages (UniformTypeKVCacheSpecs), a block = 80 x 16,384 + 16 x 8,192 bytes; a
    32k sequence still takes 2048 blocks."""
    e = serve("llama-3.1-70b", tp=4, max_model_len=32768, speculative={"method": "draft_model", "draft_model": "llama-3.2-1b"})
    block = 80 * (2 * 2 * 128 * 16 * 2) + 16 * (2 * 2 * 64 * 16 * 2)
    assert e.capacity.num_blocks == e.limiting.available // block
    assert e.capacity.blocks_per_request == 2048 and e.capacity.tokens == int(e.capacity.num_blocks / 2048 * 32768)
    with pytest.raises(ConfigError) as err:
        serve("llama-3.1-8b", speculative={"method": "draft_model"})
    assert err.value.field == "serving.speculative.draft_model"


def test_an_eagle_draft_model_is_a_one_layer_dense_head():
    """EAGLE and EAGLE-3 read draft_model as the head's checkpoint, one dense decoder layer (models/llama_eagle.py,
    llama_eagle3.py). A whole model given there (found by fuzzing: an MoE crashed the head's MLP, a dense one was
    counted as its first layer alone) is refused, naming method 'draft_model'."""
    for draft, why in (("qwen3-235b-a22b", "it has 94 layers, experts"), ("llama-3.2-1b", "it has 16 layers")):
        with pytest.raises(ConfigError) as err:
            serve("llama-3.1-8b", max_model_len=4096,
                  speculative={"method": "eagle3", "num_speculative_tokens": 3, "draft_model": draft})
        assert err.value.field == "serving.speculative.draft_model"
        assert why in str(err.value) and "method 'draft_model'" in str(err.value)


def test_quantized_presets_load_in_their_formats():
    """The bundled quantized checkpoints: Llama-3.1-70B FP8 (compressed-tensors, an fp32 scale per output
    row), Qwen2.5-7B AWQ (int4, fp16), gpt-oss MXFP4 (experts only), DeepSeek-V3 FP8 (128 x 128 blocks)."""
    fp8 = serve("llama-3.1-70b-fp8", tp=2, max_model_len=32768)
    assert fp8.resolved.weights == WeightFormat("fp8", None, 2, per_channel=True) and fp8.starts
    bf16 = serve("llama-3.1-70b", tp=2, max_model_len=32768)
    h, i, kv, layers = 8192, 28672, 8 * 128, 80
    linear = layers * (h * (h + 2 * kv) + h * h + 2 * i * h + h * i) // 2  # per TP-2 rank
    # output rows per rank: column-parallel q, k, v, gate_up halve theirs; row-parallel o and down keep all
    rows = layers * ((h + 2 * kv + 2 * i) // 2 + h + h)
    assert bf16.limiting.weights - fp8.limiting.weights == 2 * linear - (linear + 4 * rows)
    awq = serve("qwen2.5-7b-awq", "l40s", max_model_len=32768)
    assert (awq.resolved.weight_format, awq.resolved.kv_cache_dtype) == ("awq_int4", "fp16")
    assert serve("gpt-oss-120b", max_model_len=32768).resolved.weight_format == "mxfp4"
    assert serve("deepseek-v3", "h200", tp=8, max_model_len=32768).resolved.weights.block == (128, 128)


# --- the profiling run's rules, by release (their evidence: tests/test_serving_published.py) ---------

def test_rule_sampler_tensors_by_release():
    """Llama-3.1-8B on an H100 (8192 batched tokens, 1024 sequences): the dummy sampler's peak is n x V bytes
    per logit by release, plus the runner's hidden states and the sampled rows with their random copy
    ((T + 2n) x h x 2 B): 0.11 and 0.15 sort (38 B: bf16 and fp32 logits, sorted values and int64 indices,
    the index input, cub's alternates), 0.19 Triton (14 B and the kernel's buffer of 132 rows, one per SM),
    0.21 FlashInfer (14 B: bf16 and fp32 logits, masked logits, probabilities). Every release also holds the
    32 MiB cuBLAS workspace (Hopper) the forward's first GEMM allocated. The sort's tensors are counted in
    their allocator blocks (serving/sort_sampler.py): the two fp32 ones of 501 MiB in 502 MiB blocks (a rest
    of 1 MiB is not split off), cub's 12 B a logit + 255 B (1,503 MiB + 255 B) in a 1,504 MiB block, the
    bf16 logits (250.5 MiB) and the int64 tensors (1,002 MiB) exactly; plus the dummy metadata's six rows
    (five fp32, top-k int64) and the greedy sample (int64): 36 KiB."""
    n, v, hidden = 1024, 128256, (8192 + 2 * 1024) * 4096 * 2 + CUBLAS_HOPPER
    sort_blocks = n * v * 2 + 2 * 502 * MiB + 2 * n * v * 8 + 1504 * MiB + (5 * 4 + 8 + 8) * n
    expected = {"0.11": sort_blocks + hidden, "0.15": sort_blocks + hidden,
                "0.19": n * v * 14 + 132 * v * 4 + hidden, "0.21": n * v * 14 + hidden}
    for version, peak in expected.items():
        assert serve("llama-3.1-8b", max_model_len=8192, engine_version=version).limiting.activation == peak, version


def test_rule_0_19_moe_workspaces_stay_allocated():
    """Qwen3-30B-A3B (h 2048, 8 of 128 experts of 768): from 0.15 fused_moe's workspace13 (T x k x max(I, h))
    and workspace2 (T x k x max(2I, h)) stay allocated under the sampler; 0.11 frees its caches. 0.11's sort
    tensors in their blocks: fp32 593.5 MiB in 594, int64 1,187 MiB in 1,188 (rests of 0.5 and 1 MiB kept),
    cub's 1,780.5 MiB + 255 B rounded to 512 B (its 1,782 MiB segment's 1.5 MiB rest split off)."""
    workspaces = (8192 * 8 * 2048 + 8192 * 8 * 2048) * 2
    new, old = (serve("qwen3-30b-a3b", max_model_len=8192, engine_version=v).limiting for v in ("0.19", "0.11"))
    sampler = 1024 * 151936 * 14 + 132 * 151936 * 4 + (8192 + 2048) * 2048 * 2 + CUBLAS_HOPPER
    assert new.activation == sampler + workspaces
    logits = 1024 * 151936
    sort_blocks = logits * 2 + 2 * 594 * MiB + 2 * 1188 * MiB + logits * 12 + 512 + (5 * 4 + 8 + 8) * 1024
    assert old.activation == sort_blocks + (8192 + 2048) * 2048 * 2 + CUBLAS_HOPPER


def test_moe_workspaces_under_expert_parallelism_take_the_full_width():
    """Mixtral-8x7B (h 4096, 2 of 8 experts of I = 14,336), vLLM 0.19, TP 2, T = 8,192 tokens. Without EP each rank
    holds I/TP of every expert: workspace13 T x k x max(I/2, h), workspace2 T x k x max(2I/2, h). With EP the MoE
    layers get tp_size 1 (fused_moe/config.py FusedMoEParallelConfig.make): whole experts, N = 2I, so
    T x k x max(I, h) and T x k x max(2I, h), over every token's top-k rows. The sampler part is the same
    (0.19's Triton rule: 14 B a logit, 132 rows of the kernel's buffer, (T + 2n) x h)."""
    t, k, inter, h = 8192, 2, 14336, 4096
    sampler = 1024 * 32000 * 14 + 132 * 32000 * 4 + (t + 2 * 1024) * h * 2 + CUBLAS_HOPPER
    hf = get_hf_config("mixtral-8x7b")

    def activation(ep: int) -> int:
        return estimate_vllm(get_architecture("mixtral-8x7b"), Serving(max_model_len=8192, engine_version="0.19"),
                             Parallel(tp=2, ep=ep), Hardware("h100-80"), hf).limiting.activation

    assert activation(1) == sampler + (t * k * max(inter // 2, h) + t * k * max(inter, h)) * 2
    assert activation(2) == sampler + (t * k * max(inter, h) + t * k * max(2 * inter, h)) * 2 == 2_002_374_656


def test_rule_mxfp4_marlin_padding():
    """gpt-oss-120b's experts (128 of 2880 x 2880, gated) under Marlin (0.11 from PyPI everywhere; from 0.15
    below sm90): the intermediate size rounded up to 128 (2944) and the hidden size to 256 (3072), biases too."""
    arch = get_architecture("gpt-oss-120b")
    padded = serve("gpt-oss-120b", "a100-80", max_model_len=8192, engine_version="0.19").limiting.weights
    plain = stage_weights(arch, WeightFormat("mxfp4"), 1, 1, 1, 0, range(36), context=131072, rope_dtype_bytes=4).bytes
    per_layer = lambda i, h: 128 * (2 * i * h * (0.5 + 1 / 32) + h * i * (0.5 + 1 / 32) + 2 * (2 * i + h))  # noqa: E731
    assert padded - plain == round(36 * (per_layer(2944, 3072) - per_layer(2880, 2880)))
    # 0.11 pads the same and its Marlin repack is replayed in the allocator's blocks (test_serving_marlin_blocks.py)
    h100 = serve("gpt-oss-120b", max_model_len=8192, engine_version="0.11").limiting.weights
    assert h100 > padded


def test_every_catalog_gpu_has_its_compute_units():
    """The Triton sampler's buffer needs each GPU's SM (CU) count: a GPU added to the catalog must bring it."""
    from estimator.serving.activations import COMPUTE_UNITS
    assert set(COMPUTE_UNITS) == set(GPUS)


def test_mxfp4_is_an_moes_experts_format():
    """vLLM's Mxfp4Config quantizes the fused experts and leaves linear layers unquantized: on a dense model MXFP4
    named nothing the estimate could load (a traceback in Marlin's repack of no experts, found by fuzzing); it is
    refused, and gpt-oss keeps it."""
    with pytest.raises(ConfigError) as err:
        serve("qwen3-32b", max_model_len=4096, weight_format="mxfp4")
    assert err.value.field == "serving.weight_format" and "experts only" in str(err.value)
    assert serve("gpt-oss-120b", max_model_len=4096, weight_format="mxfp4").resolved.weight_format == "mxfp4"
