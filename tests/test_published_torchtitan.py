"""The estimator against torchtitan's published peak memory (issue #22: "torchtitan published runs:
median <= 8%, none under by more than 10%").

Every row of a table torchtitan (or torchao, for torchtitan runs) publishes with a peak memory is a
record in tests/data/measured/published/torchtitan (validation/published_torchtitan.py writes them):
its source and commit, the run's versions, what the row states, what was taken from the run's
config at its commit, the figure and which number it is, and our configuration of the run. Every
figure is torchtitan's "memory:" line, ``max_reserved`` (components/metrics.py), so each is held
against ``reserved_peak_bytes``. A row the model misses by more than the issue allows is listed in
MISSES with the mechanism it lacks, as a strict expected failure: a miss that closes fails the test
until it leaves the list.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest

from estimator import estimate_config

RECORDS = sorted((Path(__file__).parent / "data" / "measured" / "published" / "torchtitan").glob("*.json"))
GIB = 2**30
MEDIAN_BOUND = 0.08  # the goal: median |error|
UNDER_BOUND = 0.10  # the goal: no under-estimate beyond it

# record id -> the mechanism the estimate lacks (the next modelling step)
_PIPELINE = ("Llama 3.1 405B on torch.distributed.pipelining of Dec 2024 over FSDP2 (no reshard under PP), TP 8 with "
             "float8 and async TP: the stage's gathered parameters, its fp32 unsharded gradients accumulated over the "
             "8 micro-batches, the in-flight layer inputs, the gradient receive buffers and the stage outputs kept "
             "for the step (pipelining/stage.py, estimator/memory/pp_buffers.py: 2 GiB on the peak's stage 1), the "
             "activation receive buffers of the micro-batches not in flight with the input gradients torch 2.6 keeps "
             "on their .grad (memory/pp_receive.py: 2 x 128 MiB on stage 1) and the reduce-scatter and all-gather "
             "streams' idle segments (3.0 and 0.7 GiB there) are modelled, and so is "
             "stage 0's Schedule1F1B warm-up of all 8 micro-batches: its later backwards hold 7 micro-batches' inputs "
             "beside every gradient (memory/pp_first_backward.py: 1.9 GiB under stage 0's former peak, which moves "
             "the peak to stage 1, 0.4 GiB lower). Read too, and no schedule-dependent memory in it (torch 2.6.0's own "
             "sources, the release branch of 1963fc83): Schedule1F1B waits for its sends after the next forward or "
             "backward (schedules.py 700-787; PipelineScheduleMulti waits at once, 1355), but what it sends is held "
             "anyway (output_chunks, the receive buffers' .grad); _maybe_compute_loss keeps scalar losses whose graphs "
             "backward_one_chunk frees (259); the last stage's merged output (507, a cat of the 8 logits) comes after "
             "the last backward and train.py at 9dec370 drops it; the runtime shape inference is one no_grad forward "
             "at the first step (stage.py 1359); the receive buffers are made once per micro-batch and kept (1433, "
             "modelled); async TP's symmetric-memory workspace is "
             "one per TP group, allocated outside the caching allocator (_symmetric_memory/__init__.py 99-129), and "
             "its pipelined consumers write into outputs made on the current stream (149-290, 534-541); "
             "pytorch/torchtitan#773 logs each of Table 5's rows as one run (82.46 and 72.69 GiB)%s; under by %s")
_UNEXPLAINED_1F1B = (": 7.2 GiB that this row (82.5 GiB) holds above Table 6's FSDP 8, CP 1 row (75.3 GiB, within "
                     "the goal) is in no source read: the rows differ only in the micro-batch's shape (Table 5: "
                     "local batch 32 x 8,192 tokens, Table 6: 8 x 32,768; 8 micro-batches each, the PP degree, "
                     "pipelining_utils.py at 9dec370, and the published 1F1B/interleaved throughput ratio 0.78 is "
                     "the bubble ratio of 8, (8/15)/(16/23) = 0.77): 4 x 8,192 against 1 x 32,768 tokens. What "
                     "reads the batch dimension apart from the tokens adds at most a transient copy of one matmul input "
                     "(0.13 GiB) in torch 2.6: "
                     "Schedule1F1B (stage 0 warms up all 8 micro-batches in both), stage.py (output_chunks, "
                     "fwd_cache, one gradient receive buffer per micro-batch: the same bytes), funcol's sequence-dim "
                     "all-gather/reduce-scatter (chunk + cat at any batch), async TP's fused matmuls on dim 1 "
                     "(micro_pipeline_tp.py force_stride_order restrides the shard and wo's input; _symmetric_memory's "
                     "outputs are strided views), flash attention (lse, dq_accum per token), freqs_cis (8,192 "
                     "positions, smaller). At the interleaved row's ratio of the measured peak to our allocated one "
                     "(72.7 / 61.6 GiB = 1.18) this row needs 70.0 GiB "
                     "allocated, 10.6 GiB above stage 1's modelled 59.4 (Table 6's CP 1 row: 4.4 GiB above), so "
                     "unless the allocator's cache is a larger share under 1F1B the gap is allocated memory")
_CP = ("; torch 2.6's ring attention is (memory/cp_ring.py: its backward's all-gathered K/V, fp32 accumulators, the "
       "dK/dV exchange with the received copy beside _partial_update's, the rotater's K/V cat: +1.2, +1.7 and +2.9 "
       "GiB over CP 1 at CP 2, 4 and 8 against the measured +0.6, +1.8 and +9.6 GiB). At a constant 32,768 tokens "
       "per GPU only the all-gathered K/V grow with CP in torch 2.6's _attention.py (forward and backward, "
       "cp x 2 x s*b*a*d_head/t: +1 GiB from CP 4 to CP 8; the dK/dV all-to-all, the merger's fp32 out/lse and "
       "_partial_update's copies are the rank's size); context_parallel's buffers are small (input_ids and "
       "labels sharded in place, resize_ keeping their 16 MiB storage; under PP 9dec370 hands it the meta "
       "model's freqs_cis, the stage's own stays whole: 128 MiB, modelled); not the rise of the measured peak "
       "from CP 4 to CP 8 (%.1f GiB)")
MISSES: dict[str, str] = {
    "titan-h100-2412-llama3.1-405b-fsdp8-tp8-pp8-1f1b": _PIPELINE % (_UNEXPLAINED_1F1B, "16.3%"),
    "titan-h100-2412-llama3.1-405b-fsdp1-cp8-tp8-pp8-s262144": _PIPELINE % (_CP % 7.8, "15.2%"),
}


def load(path: Path) -> dict:
    return json.loads(path.read_text())


def error(record: dict) -> float:
    return estimate_config(record["config"]).reserved_peak_bytes / record["measured"]["bytes"] - 1


def test_the_published_rows_are_there():
    ids = [load(p)["id"] for p in RECORDS]
    assert len(ids) == 29 and len(set(ids)) == 29
    tables = {(load(p)["source"]["path"], load(p)["source"]["table"]) for p in RECORDS}
    assert len(tables) == 10  # six Dec 2024 tables, Trainy's, torchao's, nvfp4.md's two


@pytest.mark.parametrize("path", RECORDS, ids=lambda p: p.stem)
def test_each_record_states_its_source_and_number(path):
    r = load(path)
    assert r["id"] == path.stem
    assert len(r["source"]["commit"]) == 40 and r["source"]["repo"] in ("pytorch/torchtitan", "pytorch/ao")
    assert r["measured"]["metric"] == "max_reserved"
    assert r["measured"]["bytes"] == round(r["measured"]["gib"] * GIB)
    assert r["config"]["training"]["framework"] == "fsdp2"
    assert r["config"]["training"]["framework_version"] == r["run"]["torchtitan_version"]


# --- the goals ------------------------------------------------------------------------------------

def test_median_error_within_the_goal():
    errors = [abs(error(load(p))) for p in RECORDS]
    assert statistics.median(errors) <= MEDIAN_BOUND


OVER_BOUND = 0.05  # over-estimates cost GPUs; the issue bounds the median, these rows each
# record id -> why the estimate is over by more than OVER_BOUND
_B200_2508 = ("torchao's B200 run (torchtitan 6fc499f6, torch 2.9.0.dev20250815, run_train.sh: expandable segments): "
              "the reduce-scatter stream's idle segments (the sharded gradients, 3.7 GiB at FSDP 8; "
              "pp_buffers.reduce_scatter_pool) are reserved beside the default stream's pool, so the measured %.2f GiB "
              "leaves that pool at most %.1f GiB, under the %.1f GiB we allocate: the allocated peak of 0.2.0's "
              "compiled op-level SAC on that torch is over (our harness measures 0.3.0 on torch 2.13), or the "
              "expandable segments' flat 5%% share is; over by %s")
OVERS: dict[str, str] = {
    "titan-b200-2508-llama3-8b-w8-sac-compile-bf16": _B200_2508 % (33.71, 30.0, 30.9, "7.3%"),
    "titan-b200-2508-llama3-8b-w8-sac-compile-float8-rowwise": _B200_2508 % (33.72, 30.0, 30.9, "7.3%"),
    "titan-b200-2508-llama3-8b-w8-sac-compile-float8-tensorwise": _B200_2508 % (33.38, 29.6, 30.5, "7.1%"),
    "titan-b200-2508-llama3-8b-w8-sac-compile-mxfp8-cublas": _B200_2508 % (33.88, 30.1, 30.9, "6.8%"),
    "titan-b200-2508-llama3-8b-w8-sac-compile-mxfp8-cublas-rceil": _B200_2508 % (33.88, 30.1, 30.9, "6.8%"),
}


@pytest.mark.parametrize("path", [pytest.param(p, marks=pytest.mark.xfail(reason=OVERS[p.stem], strict=True))
                                  if p.stem in OVERS else p for p in RECORDS], ids=lambda p: p.stem)
def test_no_estimate_over_by_more_than_the_bound(path):
    assert error(load(path)) <= OVER_BOUND


@pytest.mark.parametrize("path", [pytest.param(p, marks=pytest.mark.xfail(reason=MISSES[p.stem], strict=True))
                                  if p.stem in MISSES else p for p in RECORDS], ids=lambda p: p.stem)
def test_no_estimate_under_by_more_than_the_goal(path):
    assert error(load(path)) >= -UNDER_BOUND


def test_the_misses_are_records():
    assert set(MISSES) <= {p.stem for p in RECORDS} and set(OVERS) <= {p.stem for p in RECORDS}


# --- each mechanism, by hand ------------------------------------------------------------------------------

L8, H8, F8, V = 32, 4096, 14336, 128256  # Llama-3.1-8B: layers, hidden, FFN, vocabulary
LAYER8 = 2 * H8 * H8 + 2 * H8 * 1024 + 3 * H8 * F8 + 2 * H8  # a block's parameters (q, o; k, v; MLP; 2 norms)


def titan(version: str, tp: int = 1, **training) -> dict:
    base = {"framework": "fsdp2", "framework_version": version, "seq_len": 8192, "micro_batch_size": 2,
            "recompute": "selective", "compile": True, "loss": "standard"}
    return {"model": "llama-3.1-8b", "training": {**base, **training},
            "parallel": {"dp": 8, "tp": tp, "zero_stage": 3}, "hardware": {"gpu": "h100-80"}}


def part(estimate, label: str, stage: int | None = None) -> int:
    stage = estimate.stages[estimate.peak_stage if stage is None else stage]
    return sum(p.bytes for c in stage.components for p in (c.parts or (c,)) if p.label.startswith(label))


@pytest.mark.parametrize("version", ["2024-12", "0.1.0", "0.2.0", "0.3.0", "main"])
def test_compiled_op_sac_drops_each_blocks_last_matmul_output(version):
    """Eager op-level SAC caches w2's output (T x h, bf16) in every block; the compiled block does not
    (tests/test_compile_sac.py): 32 x 2 x (2 x 8192) x 4096 bytes."""
    eager = estimate_config(titan(version, compile=False)).stages[0].component("activations").bytes
    compiled = estimate_config(titan(version)).stages[0].component("activations").bytes
    assert eager - compiled == L8 * 2 * 16384 * H8


def test_under_tp_the_reduce_scatter_of_the_last_matmul_goes_too():
    """TP 2: w2's partial sums (whole) and its reduce-scatter's output (sequence-sharded)."""
    eager = estimate_config(titan("0.3.0", tp=2, compile=False)).stages[0].component("activations").bytes
    compiled = estimate_config(titan("0.3.0", tp=2)).stages[0].component("activations").bytes
    assert eager - compiled == L8 * (2 * 16384 * H8 + 2 * 16384 * H8 // 2)


def test_the_december_2024_main_never_compiles_the_loss():
    """9dec370's train.py: the loss stays eager under compile, keeping the fp32 log-softmax (4 B per
    logit) where the compiled loss keeps the bf16 logits and 8 B per token (0.1.0 on)."""
    T = 16384
    old = estimate_config(titan("2024-12")).stages[0].component("logits").bytes
    new = estimate_config(titan("0.1.0")).stages[0].component("logits").bytes
    assert old - new == 4 * T * V - (2 * T * V + 8 * T)


@pytest.mark.parametrize("version,value", [("2024-12", True), ("0.1.0", False)])
def test_compile_loss_is_refused_where_the_release_has_no_choice(version, value):
    from estimator import ConfigError

    with pytest.raises(ConfigError, match=r"compile_loss"):
        estimate_config(titan(version, compile_loss=value))


def test_compile_loss_false_keeps_the_eager_loss_from_0_2_0():
    eager = estimate_config(titan("main", compile_loss=False)).stages[0].component("logits").bytes
    assert eager == estimate_config(titan("2024-12")).stages[0].component("logits").bytes


def test_loss_parallel_holds_one_fp32_logits_tensor_more_each_way():
    """torch's loss_parallel() (2024-12 to 0.2.0 under TP): x - max beside exp and the result in
    forward, three fp32 tensors beside the kept log-softmax in backward; 0.3.0 has no loss_parallel()."""
    from estimator.memory.activations.loss import loss_memory
    from estimator.models.loading import load_config

    T, t = 16384, 2
    for version, extra in (("0.2.0", 1), ("0.3.0", 0)):
        cfg = load_config(titan(version, tp=t, compile=False))
        loss = loss_memory(cfg.architecture, cfg.training, cfg.parallel, V)
        forward = sum(e.bytes(cfg.parallel) for e in loss.forward)
        backward = sum(e.bytes(cfg.parallel) for e in loss.backward)
        assert forward == 2 * T * V / t + 4 * T * V / t + extra * 4 * T * V / t
        assert backward == 2 * 4 * T * V / t + extra * 4 * T * V / t


@pytest.mark.parametrize("version,temporary", [("2024-12", 4 * 8_030_261_248 // 8), ("0.1.0", 0)])
def test_the_december_2024_adamw_steps_foreach(version, temporary):
    """9dec370's optimizer.py builds AdamW with foreach = not fused and --optimizer.fused is off by default:
    torch's _multi_tensor_adam materialises sqrt(v) for the group, 4 B x the GPU's fp32 shard (8B over FSDP 8);
    fused is the default from 6e498855 (#881, 2025-02-24), before 0.1.0."""
    stage = estimate_config(titan(version)).stages[0]
    step = next(p for p in stage.phases if p.name == "optimizer")
    sqrt = [p for c in step.components for p in (c.parts or (c,)) if p.label.startswith("foreach AdamW")]
    assert sum(p.bytes for p in sqrt) == temporary
    # the states are FSDP-sharded, and so is sqrt(v): the formula names the divisor its bytes divide by
    assert [p.formula for p in sqrt] == (["4 B x parameters on this GPU / d (8)"] if temporary else [])


def test_the_root_unit_of_0_1_0_holds_embedding_and_head_all_step():
    """0.1.0: blocks + root (embedding, norm, head): in backward a block and the prefetched one, the
    embedding and the head gathered, and the head's bf16 gradient until the root's reduce-scatter."""
    est = estimate_config(titan("0.1.0", compile=False, recompute="full"))
    assert part(est, "Unsharded parameters in flight, and the head's gradient") == \
        2 * 2 * LAYER8 + 2 * 2 * H8 * V + 2 * H8 * V


def test_a_pipeline_stage_accumulates_unsharded_fp32_gradients():
    """Llama-3.1-405B, 1F1B on PP 8, TP 8, stage 0 (15 layers and the embedding): every local
    parameter's unsharded fp32 gradient, and one bf16 block's before its upcast."""
    rec = load(next(p for p in RECORDS if p.stem.endswith("405b-fsdp8-tp8-pp8-1f1b")))
    est = estimate_config(rec["config"])
    h, f, kv, v, t = 16384, 53248, 1024, 128256, 8
    layer = (2 * h * h + 2 * h * kv + 3 * h * f) // t + 2 * h
    stage0 = 15 * layer + h * v // t
    assert est.stages[0].parameters_per_gpu == stage0
    assert part(est, "Unsharded gradients accumulated", 0) == 4 * stage0 + 2 * layer
    assert est.stages[0].component("gradients").bytes == 0  # no sharded gradient before the last backward
    # stage 0 runs its 8 forwards first: beside every gradient it holds 7 micro-batches' layer inputs, each
    # 2 B x (4 x 8192 / TP 8) x 16384 per layer (full AC) for 15 layers, and 8 B per token of the embedding's
    # (pp_first_backward.py); stage 1 (7 in flight, then a forward after each backward) has the peak
    assert part(est, "One micro-batch fewer once every gradient exists", 0) == -(15 * 2 * 4 * 8192 // 8 * h
                                                                                  + 8 * 4 * 8192)
    assert est.peak_stage == 1


def _table4(async_tp: bool) -> dict:
    rec = load(next(p for p in RECORDS if p.stem == "titan-h100-2412-llama3.1-70b-fsdp32-tp8-fullac-2d"))
    return {**rec["config"], "training": {**rec["config"]["training"], "async_tp": async_tp}}


def test_plain_tp_keeps_its_reduce_scatter_cat_reserved():
    """Table 4's Llama 3.1 70B 2D row (TP 8 with sequence parallelism, 16 x 8192 tokens): plain TP cats the
    row-parallel linear's partial sums (bf16, the full sequence) into one buffer before the reduce-scatter;
    the segment it took stays reserved: 2 B x (16 x 8192) x 8192 more than async TP reserves, nothing more
    allocated (the peak is at the loss, outside the blocks). The rows measure 71.9 and 67.6 GiB."""
    plain, fused = estimate_config(_table4(False)), estimate_config(_table4(True))
    assert plain.allocated_peak_bytes == fused.allocated_peak_bytes
    assert plain.reserved_peak_bytes - fused.reserved_peak_bytes == 2 * (16 * 8192) * 8192
    frag = plain.stages[0].component("fragmentation")
    assert [p.bytes for p in frag.parts][1] == 2 * 2**30 and "B*s*b*h" in frag.formula
    # async TP keeps the flat share and the reduce-scatter stream's pool alone
    labels = [p.label for p in fused.stages[0].component("fragmentation").parts]
    assert len(labels) == 2 and labels[1].startswith("The reduce-scatter stream's cached segments")


def test_the_reduce_scatter_streams_gradient_segments_wait_through_the_forward():
    """FSDP2 without PP: foreach_reduce allocates each group's reduce-scatter output, which becomes the
    sharded gradient, on the reduce-scatter stream; zero_grad(set_to_none) frees them before the next
    forward, and the caching allocator serves a stream's blocks to that stream alone: 4 B x 8B / 8 stay
    reserved, unused, through the forward and the loss. With two micro-batches a step the gradients
    exist (allocated) from the first backward on: no idle pool."""
    frag = estimate_config(titan("0.3.0")).stages[0].component("fragmentation")
    pool = [p for p in frag.parts if p.label.startswith("The reduce-scatter stream's cached segments")]
    assert [p.bytes for p in pool] == [4 * 8_030_261_248 // 8]
    accumulated = estimate_config(titan("0.3.0", global_batch_size=32)).stages[0].component("fragmentation")
    assert not any(p.label.startswith("The reduce-scatter stream") for p in (accumulated.parts or (accumulated,)))


def test_no_reduce_scatter_cat_without_sequence_parallel_tp():
    """Without TP the block has no reduce-scatter; the Llama-3.1-8B TP 2 setup holds the same cat (2 B x
    16,384 x 4096), reserved in every estimate of it, the planner's step floor included."""
    from estimator.memory.memory import step_floors
    from estimator.models.loading import load_config

    assert not any(p.label.startswith("Plain TP") for p in
                   estimate_config(titan("0.3.0")).stages[0].component("fragmentation").parts)
    est = estimate_config(titan("0.3.0", tp=2))
    assert est.stages[0].component("fragmentation").parts[1].bytes == 2 * 16384 * H8
    cfg = load_config(titan("0.3.0", tp=2))
    floor = step_floors(cfg.architecture, cfg.training, cfg.parallel, cfg.hardware)[0].device_bytes
    fused = load_config(titan("0.3.0", tp=2, async_tp=True))
    assert floor - step_floors(fused.architecture, fused.training, fused.parallel, fused.hardware)[0].device_bytes \
        == 2 * 16384 * H8


M405, T405, H405, TP405 = 8, 4 * 8192, 16384, 8  # the 1F1B row: micro-batches, tokens per micro-batch, hidden, TP


def _row_1f1b(version: str = "2024-12") -> dict:
    rec = load(next(p for p in RECORDS if p.stem.endswith("405b-fsdp8-tp8-pp8-1f1b")))
    return {**rec["config"], "training": {**rec["config"]["training"], "framework_version": version}}


def _buffers(est, stage: int) -> dict[str, int]:
    return {c.label: c.bytes for c in est.stages[stage].components if c.label.startswith(("Pipeline", "The last"))}


def test_pipelining_keeps_a_gradient_buffer_and_the_output_of_every_micro_batch():
    """Dec 2024 pipelining, 1F1B, stage 0: one gradient receive buffer per micro-batch and, before
    pytorch#153383, every micro-batch's output in output_chunks: each 2 B x (4 x 8192 / TP 8) x 16384 (the
    sequence-parallel shard); the last stage keeps every micro-batch's logits, 2 B x 4 x 8192 x 128256 / 8."""
    est = estimate_config(_row_1f1b())
    hidden = 2 * T405 // TP405 * H405
    assert _buffers(est, 0) == {"Pipeline gradient receive buffers (one per micro-batch)": M405 * hidden,
                                "Pipeline stage outputs kept for the step (output_chunks)": M405 * hidden}
    logits = M405 * 2 * T405 * V // TP405
    assert _buffers(est, 7) == {"The last stage's logits kept for the step (output_chunks)": logits,
                                "Pipeline activation receive buffers of the micro-batches not in flight": 7 * hidden}
    assert part(est, "Input gradients kept on the receive buffers", 7) == 7 * hidden


def test_a_pipelined_fsdp2_stage_keeps_its_side_streams_pools_reserved():
    """torch 2.6 pipelining reduce-scatters after the last micro-batch; FSDP2 makes the sharded gradients on
    the reduce-scatter stream, whose segments only that stream reuses: at stage 0's backward peak they sit
    unused, 4 B x 6,240,043,008 / FSDP 8 (Table 6's CP 1 row: 15 layers + the embedding). So do the
    all-gather copy-in stream's: the first forward gathered the embedding (2 B x V*h/t) beside the first
    block's flat output (1 B x its float8 weights + 2 B x its two norms), once per step (no reshard under PP)."""
    rec = load(next(p for p in RECORDS if p.stem.endswith("405b-fsdp8-cp1-tp8-pp8-s32768")))
    est = estimate_config(rec["config"])
    h, f, kv, v, t = 16384, 53248, 1024, 128256, 8
    linears = (2 * h * h + 2 * h * kv + 3 * h * f) // t
    stage0 = 15 * (linears + 2 * h) + h * v // t
    assert stage0 == 6_240_043_008 and est.stages[0].peak_phase == "backward"
    share, scatter, gather = est.stages[0].component("fragmentation").parts
    assert scatter.bytes == 4 * stage0 // 8 == 3_120_021_504 and "reduce-scatter stream" in scatter.label
    assert gather.bytes == linears + 2 * 2 * h + 2 * h * v // t == 923_860_992 and "all-gather" in gather.label
    stage = est.stages[0]
    assert stage.reserved_peak_bytes - stage.allocated_peak_bytes == share.bytes + scatter.bytes + gather.bytes


def _interleaved() -> dict:
    return load(next(p for p in RECORDS if p.stem.endswith("405b-fsdp8-tp8-pp8-interleaved")))["config"]


def _interleaved_at(version: str) -> dict:
    return {**_interleaved(), "training": {**_interleaved()["training"], "framework_version": version}}


def test_each_chunk_of_an_interleaved_rank_has_its_own_all_gather_pool():
    """Interleaved, rank 7 runs stage 7 (8 blocks) and the last stage 15 (7 blocks, final norm and head): two
    FSDP roots, two copy-in streams: 2 blocks, and a block beside the [norm, head] root unit."""
    h, f, kv, v, t = 16384, 53248, 1024, 128256, 8
    block = (2 * h * h + 2 * h * kv + 3 * h * f) // t + 2 * 2 * h
    gather = estimate_config(_interleaved()).stages[7].component("fragmentation").parts[2]
    assert gather.bytes == 2 * block + block + 2 * (h * v // t + h)


def test_an_interleaved_last_rank_has_no_earlier_chunk_gradients_at_the_loss():
    """One round of 8 micro-batches on PP 8: rank 7 runs every backward of stage 15 (the loss) before stage
    7's first, so at the loss's moments stage 7's 8 blocks have no unsharded fp32 gradient yet (4 B x 8
    blocks less at that moment); its peak is then the recomputed layer beside every gradient (its inputs
    replayed: test_an_interleaved_last_rank_is_replayed_outside_the_loss)."""
    from estimator.memory.resolved import resolve
    from estimator.models.loading import load_config
    from estimator.memory.pp_unbegun import gradients_after_the_loss

    h, f, kv, t = 16384, 53248, 1024, 8
    cfg = load_config(_interleaved())
    res = resolve(cfg.architecture, cfg.training, cfg.parallel, cfg.hardware)
    last = res.stages[7]
    assert [len(c) for c in last.chunks] == [8, 7]
    layer = (2 * h * h + 2 * h * kv + 3 * h * f) // t + 2 * h
    assert gradients_after_the_loss(res.training, res.recipe, res.parallel, last, res.microbatches) == 4 * 8 * layer
    est = estimate_config(_interleaved())
    transients = [p.label for p in est.stages[7].component("transient").parts]
    assert "One recomputed layer's activations" in transients
    assert "Unsharded gradients accumulated over the micro-batches" in transients
    two_rounds = {**_interleaved(), "training": {**_interleaved()["training"], "global_batch_size": 512}}
    res = resolve(*(lambda c: (c.architecture, c.training, c.parallel, c.hardware))(load_config(two_rounds)))
    assert res.microbatches == 16  # two rounds: stage 7's first backward comes before stage 15's ninth
    assert gradients_after_the_loss(res.training, res.recipe, res.parallel, res.stages[7], res.microbatches) == 0


def test_an_interleaved_rank_holds_its_inputs_and_gradients_apart():
    """One round of 8 micro-batches on PP 8, 2 chunks of 8 blocks on rank 1: torch's interleaved schedule runs
    all 16 chunk-forwards first (warm-up min(1 x 8 + 2 x 6, 16)), then chunk 1's 8 backwards, then chunk 0's
    (pp_interleaved_moments.py). Its largest moment is chunk 0's second backward's start: chunk 0's inputs of 7
    micro-batches (56 of 128 blocks' inputs; full AC: 2 B x (4 x 8192 / TP 8) x 16384 = 128 MiB each) beside every
    gradient and 18 receive buffers and .grad of as much (pp_receive.py: chunk 1's 8 idle buffers and 8 .grad,
    chunk 0's 1 and 1), 72 blocks' inputs fewer than the in-flight charge; its first backward at its first block
    holds one input more (57) but two receive parts fewer (16). The last rank holds the peak
    (test_an_interleaved_last_rank_is_replayed_outside_the_loss)."""
    est = estimate_config(_interleaved())
    fewer = [p for c in est.stages[1].components for p in (c.parts or (c,)) if p.bytes < 0]
    assert [p.bytes for p in fewer] == [-72 * 2 * (4 * 8192 // 8) * 16384]
    assert _phase_parts(est, 1, "backward") == {RECV: 9 * 2**27, RECV_GRAD: 9 * 2**27}
    assert est.peak_stage == 7


def test_an_interleaved_last_rank_is_replayed_outside_the_loss():
    """Rank 7 (chunks of 8 and 7 blocks, the head on the last): warm-up (2 - 1) x 8 chunk-0 forwards (64 blocks'
    inputs), then a forward and a backward of chunk 1 each step (71 at most), then chunk 0's backwards
    (pp_last_rank.py). The loss's moments (its saved tensors and gradients beside 71 inputs and chunk 1's
    gradients) are below the recomputed block beside every gradient; the largest of those moments under the
    replay is chunk 0's second backward's start: 64 - 8 = 56 inputs beside every gradient, 15 blocks' inputs
    fewer than the charge (every gradient exists then), and the receive buffers (pp_receive.py; 128 MiB each):
    chunk 1 (stage 15) past all 8 backwards, 8 idle buffers and 8 .grad (torch 2.6), chunk 0 (stage 7) 1 and 1.
    Chunk 0's first backward at its first block holds one input more (57) and two receive parts fewer (16); the
    loss's last moment 7 + 7 (chunk 1's eighth backward, chunk 0's 8 micro-batches in flight)."""
    est = estimate_config(_interleaved())
    fewer = [p for c in est.stages[7].components for p in (c.parts or (c,)) if p.bytes < 0]
    assert [(p.label, p.bytes) for p in fewer] == [
        ("Layer inputs freed before the largest moment (interleaved schedule replayed)",
         -15 * 2 * (4 * 8192 // 8) * 16384)]
    assert "chunk 0's backward" in fewer[0].formula
    assert _phase_parts(est, 7, "backward") == {RECV: 9 * 2**27, RECV_GRAD: 9 * 2**27}
    assert est.peak_stage == 7


def test_the_static_parts_of_a_rank_with_two_chunks_are_its_own():
    """A rank's static part (memory.py's memo, kept on the architecture) reads how many pipeline stages it
    runs (pipelining's buffers per stage): the interleaved row's rank 0 holds two stages' receive buffers
    after the 1F1B row of the same model, whose rank 0 holds as many layers (15) in one stage, and the
    1F1B row's rank 0 one stage's after the interleaved row."""
    rec = load(next(p for p in RECORDS if p.stem.endswith("405b-fsdp8-tp8-pp8-interleaved")))
    label, hidden = "Pipeline gradient receive buffers (one per micro-batch)", 2 * T405 // TP405 * H405
    estimate_config(_row_1f1b())
    assert _buffers(estimate_config(rec["config"]), 0)[label] == 2 * M405 * hidden
    assert _buffers(estimate_config(_row_1f1b()), 0)[label] == M405 * hidden


def test_the_1f1b_row_and_table_6s_cp_1_row_differ_only_in_freqs_cis():
    """Table 5's 1F1B row (8 micro-batches of 4 x 8,192 tokens) and Table 6's FSDP 8, CP 1 row (8 of 1 x
    32,768) hold the same bytes in every mechanism read (MISSES' reason): on every stage the allocated
    peaks differ by the RoPE table's extra positions alone, (32,768 - 8,192) x 64 complex64, yet the
    published peaks differ by 7.2 GiB (82.5 against 75.3)."""
    one = estimate_config(_row_1f1b())
    table6 = estimate_config(load(next(p for p in RECORDS if p.stem.endswith("fsdp8-cp1-tp8-pp8-s32768")))["config"])
    assert [b.allocated_peak_bytes - a.allocated_peak_bytes for a, b in zip(one.stages, table6.stages)] \
        == [(32768 - 8192) * 64 * 8] * 8


def _cp_row(cp: int) -> dict:
    seq = {1: 32768, 2: 65536, 4: 131072, 8: 262144}[cp]
    return load(next(p for p in RECORDS if p.stem.endswith(f"cp{cp}-tp8-pp8-s{seq}")))["config"]


def test_december_2024_keeps_one_freqs_cis_per_model_chunk():
    """9dec370's Transformer.freqs_cis: seq_len x 64 complex64 per model chunk (head dim 128), not v0.3.0's
    per-layer RoPE modules; without PP, context_parallel also keeps a clone of it to restore after the step
    (under PP 9dec370 hands it the meta-device whole model's buffer)."""
    rope = next(c for c in estimate_config(_cp_row(8)).stages[0].components if c.label.startswith("RoPE"))
    assert rope.bytes == 262144 * 64 * 8 == 2**27
    config = load(next(p for p in RECORDS if p.stem.endswith("8b-fsdp1-cp8-fullac-s262144")))["config"]
    rope = next(c for c in estimate_config(config).stages[0].components if c.label.startswith("RoPE"))
    assert rope.bytes == 2 * 262144 * 64 * 8 and "context_parallel" in rope.formula


def test_ring_attention_backward_by_hand():
    """CP 4 (131,072 tokens, 32,768 per GPU), TP 8: 16 query heads of 128 and k, v repeated to them: each
    of q, k, v is 32,768 x 2,048 elements here. The ring's backward holds every rank's K and V (bf16), fp32
    dQ, dK, dV, dK and dV in fp32 twice (cat, all-to-all output), and the step's dQ with dK and dV of half
    the chunk and the output's gradient (bf16), beside the attention's saved tensors: larger than the
    recomputed layer, so it stands for it.
    On ranks past 0 the received fp32 dK and dV stay beside _partial_update's new copies of them, and the
    latest K/V cat for the rotater (bf16) is alive (torch 2.6.0 _attention.py lines 653, 724-747)."""
    est = estimate_config(_cp_row(4))
    ring = {p.label.split(": ", 1)[1]: p.bytes for p in est.stages[0].component("transient").parts
            if p.label.startswith("Ring attention's backward (CP 4)")}
    n = 32768 * 2048
    assert ring["K and V of every CP rank, all-gathered"] == 2 * 4 * 2 * n
    assert ring["fp32 accumulators of dQ, dK and dV"] == 4 * 3 * n
    assert ring["dK and dV around the ring in fp32 (their cat and the all-to-all's output)"] == 16 * n
    assert ring["the step's dQ, half-length dK and dV and the attention output's gradient"] == 3 * 2 * n
    assert ring["the received dK and dV (fp32) beside _partial_update's new copies"] == 4 * 2 * n
    assert ring["K and V concatenated for the rotater"] == 2 * 2 * n
    labels = [p.label for p in est.stages[0].component("transient").parts]
    assert "One recomputed layer's activations" not in labels
    assert not any(label.startswith("Ring") for label in
                   (p.label for p in estimate_config(_cp_row(1)).stages[0].component("transient").parts))


def test_the_ring_keeps_no_whole_sequence_k_v_in_december_2024():
    """torch 2.6's ring attention saves the SDPA op's tensors only; v0.3.0's flex attention keeps the
    all-gathered K and V (activations/attention.py cp_flex_all_gather)."""
    from estimator.memory.activations.attention import cp_flex_all_gather
    from estimator.models.loading import load_config

    cfg = load_config(_cp_row(4))
    assert not cp_flex_all_gather(cfg.training, cfg.parallel)
    cfg = load_config({**_cp_row(4), "training": {**_cp_row(4)["training"], "framework_version": "0.3.0"}})
    assert cp_flex_all_gather(cfg.training, cfg.parallel)


def test_from_pytorch_153383_only_the_last_stage_keeps_its_outputs():
    """0.1.0 (2025-06-17) runs a torch with #153383: stage 0 keeps its gradient receive buffers only."""
    est = estimate_config(_row_1f1b("0.1.0"))
    hidden = 2 * T405 // TP405 * H405
    assert _buffers(est, 0) == {"Pipeline gradient receive buffers (one per micro-batch)": M405 * hidden}
    assert "The last stage's logits kept for the step (output_chunks)" in _buffers(est, 7)


RECV = "Pipeline activation receive buffers of the micro-batches not in flight"
RECV_GRAD = "Input gradients kept on the receive buffers (.grad) until the next step"


def _phase_parts(est, stage: int, name: str) -> dict[str, int]:
    phase = next(p for p in est.stages[stage].phases if p.name == name)
    return {c.label: c.bytes for c in phase.components if c.label in (RECV, RECV_GRAD)}


@pytest.mark.parametrize("version,grads_kept", [("2024-12", True), ("0.1.0", True), ("0.2.0", True),
                                                ("0.3.0", False), ("main", False)])
def test_a_1f1b_stage_keeps_a_receive_buffer_per_micro_batch(version, grads_kept):
    """torch pipelining makes one activation receive buffer per micro-batch and keeps it (stage.py
    _prepare_forward_infra): stage s of 1F1B on PP 8 with 8 micro-batches holds min(8, 8 - s) in flight, their
    buffers counted as the first layer's inputs, the other s beside them; each ran its backward, whose input
    gradient stays on the buffer's .grad until the next step in torch 2.6, 2.8 and 2.9 (2024-12, 0.1.0, 0.2.0)
    and is dropped once read from torch 2.10 (pytorch#164329; 0.3.0 and main). Each: 2 B x (4 x 8192 / TP 8)
    x 16384 = 128 MiB. Stage 0 receives nothing (its input is the token ids). The optimizer step holds all 8."""
    est = estimate_config(_row_1f1b(version))
    hidden = 2 * T405 // TP405 * H405
    assert hidden == 128 * 2**20
    for s in (1, 2, 7):
        want = {RECV: s * hidden} | ({RECV_GRAD: s * hidden} if grads_kept else {})
        assert _phase_parts(est, s, "backward") == want == _phase_parts(est, s, "forward")
        assert _phase_parts(est, s, "optimizer") == {RECV: 8 * hidden} | ({RECV_GRAD: 8 * hidden} if grads_kept else {})
    assert _phase_parts(est, 0, "backward") == {} == _phase_parts(est, 0, "optimizer")


def test_the_receive_buffers_add_to_the_stage_peak():
    """The 1F1B row's stage 1 (the peak) holds 1 receive buffer and 1 .grad (2 x 128 MiB) more than when
    none is modelled: its backward total is its components' sum, and the two parts are in it."""
    est = estimate_config(_row_1f1b())
    stage = est.stages[1]
    backward = next(p for p in stage.phases if p.name == "backward")
    assert stage.peak_phase == "backward" and stage.allocated_peak_bytes == backward.allocated_bytes
    assert sum(_phase_parts(est, 1, "backward").values()) == 2 * 128 * 2**20


def test_an_interleaved_rank_receives_on_each_chunk_but_stage_0():
    """Interleaved, one round of 8 on PP 8 (rank r runs stages r and r + 8): rank 0's chunk 0 is stage 0 (no
    buffers). Rank 0 runs 8 + 14 forwards first (all 16), chunk 1's 8 backwards, then chunk 0's: at chunk 0's
    second backward (its largest moment) chunk 1 holds 8 idle buffers and 8 .grad. At its forward peak (every
    forward run) no buffer is idle. Once every backward ran each receiving chunk holds 8 and 8; 0.3.0 keeps no
    .grad (pytorch#164329)."""
    est = estimate_config(_interleaved())
    one = 2**27
    assert _phase_parts(est, 0, "backward") == {RECV: 8 * one, RECV_GRAD: 8 * one}
    assert _phase_parts(est, 0, "forward") == {}
    assert _phase_parts(est, 0, "optimizer") == {RECV: 8 * one, RECV_GRAD: 8 * one}
    assert _phase_parts(est, 3, "optimizer") == {RECV: 16 * one, RECV_GRAD: 16 * one}
    newer = estimate_config(_interleaved_at("0.3.0"))
    assert _phase_parts(newer, 3, "optimizer") == {RECV: 16 * one}


def test_the_interleaved_last_rank_forward_peak_holds_idle_buffers():
    """Rank 7 holds its most inputs (71 blocks') at each of chunk 1's forwards, after its 8 chunk-0 forwards (the
    loss's stage runs a forward and a backward each step): at the last of them chunk 1's 7 backwards ran, their
    buffers idle with their .grad; in 0.3.0 the buffers alone."""
    est = estimate_config(_interleaved())
    assert _phase_parts(est, 7, "forward") == {RECV: 7 * 2**27, RECV_GRAD: 7 * 2**27}
    newer = estimate_config(_interleaved_at("0.3.0"))
    assert _phase_parts(newer, 7, "forward") == {RECV: 7 * 2**27}
