"""The caching allocator's replay (estimator/allocator.py): its rules by hand, then whole training
steps' allocation sequences (recorded by the fake-tensor harness, validation/allocator_trace.py)
replayed against the reserved memory a real H200 reported for the same runs."""

import dataclasses
import gzip
import json
from pathlib import Path

import pytest

from estimator.memory.allocator import CachingAllocator, allocation_size, replay, round_size

MiB = 1 << 20
TRACES = sorted((Path(__file__).parent / "data" / "measured" / "allocator").glob("*.json.gz"))


def test_requests_are_rounded_to_512_bytes():
    assert [round_size(n) for n in (1, 512, 513, 4096 + 1)] == [512, 512, 1024, 4608]


def test_segment_sizes():
    """kSmallBuffer for requests up to 1 MiB, kLargeBuffer under 10 MiB, else rounded to 2 MiB."""
    assert allocation_size(MiB) == 2 * MiB
    assert allocation_size(MiB + 512) == 20 * MiB
    assert allocation_size(10 * MiB - 512) == 20 * MiB
    assert allocation_size(10 * MiB) == 10 * MiB
    assert allocation_size(11 * MiB + 1) == 12 * MiB


def test_small_requests_share_a_two_mib_segment():
    a = CachingAllocator()
    for _ in range(4096):  # 4096 x 512 B = 2 MiB: one segment
        a.malloc(100)
    assert (a.reserved, a.segments) == (2 * MiB, 1)
    a.malloc(100)
    assert (a.reserved, a.segments) == (4 * MiB, 2)


def test_a_large_block_is_split_only_when_more_than_1_mib_is_left():
    a = CachingAllocator()
    x = a.malloc(4 * MiB)  # a 20 MiB segment: 4 MiB used, 16 MiB cached
    a.malloc(15 * MiB)  # fits the 16 MiB block; 1 MiB left is not more than kSmallSize: no split
    assert a.reserved == 20 * MiB and a.allocated == 20 * MiB
    a.free(x)
    a.malloc(2 * MiB)  # the freed 4 MiB block, split: 2 MiB left over 1 MiB
    assert a.allocated == (16 + 2) * MiB and a.reserved == 20 * MiB  # the 15 MiB request holds all 16


def test_best_fit_and_merging():
    a = CachingAllocator()
    blocks = [a.malloc(12 * MiB) for _ in range(3)]  # three 12 MiB segments
    a.free(blocks[0])
    a.free(blocks[2])
    a.malloc(12 * MiB)  # a cached 12 MiB block: no new segment
    assert a.reserved == 36 * MiB
    a.malloc(14 * MiB)  # none holds 14 MiB: a new segment
    assert a.reserved == 50 * MiB and a.reserved_peak == 50 * MiB


def test_freed_neighbours_merge_into_one_block():
    a = CachingAllocator()
    x, y = a.malloc(5 * MiB), a.malloc(5 * MiB)  # both in one 20 MiB segment (10 MiB left)
    assert a.reserved == 20 * MiB
    a.free(x)
    a.free(y)
    a.malloc(19 * MiB)  # the whole segment again, merged
    assert a.reserved == 20 * MiB


def test_each_stream_keeps_its_own_blocks():
    """A block freed by one stream's tensor serves only that stream (CUDACachingAllocator.cpp get_free_block: the
    pool's blocks ordered by (stream, size), a block of another stream never taken)."""
    a = CachingAllocator()
    first = a.malloc(30 * MiB)  # stream 0: a 30 MiB segment
    a.free(first)
    side = a.malloc(30 * MiB, stream=1)  # the cached 30 MiB are stream 0's: a segment of its own
    assert (a.reserved, a.segments, a.allocated) == (60 * MiB, 2, 30 * MiB)
    a.free(side)
    assert a.malloc(20 * MiB, stream=1) == side  # its own stream's block, split (10 MiB left, more than 1 MiB)
    assert a.malloc(30 * MiB) == first  # and stream 0 takes its own back
    assert (a.reserved, a.segments) == (60 * MiB, 2)
    a.malloc(100, stream=1)  # a small request of stream 1: its own 2 MiB segment
    assert (a.reserved, a.segments) == (62 * MiB, 3)


def test_expandable_segments_grow_in_20_mib_pages():
    a = CachingAllocator(expandable=True)
    x = a.malloc(30 * MiB)
    assert a.reserved == 40 * MiB
    a.free(x)
    a.malloc(50 * MiB)  # the free end block grows by one page
    assert a.reserved == 60 * MiB and a.segments == 1


def test_expandable_segments_split_a_large_block_down_to_512_bytes():
    """should_split with expandable segments: `is_small || expandable_segments()` -> at least kMinBlockSize left
    (CUDACachingAllocator.cpp), where default segments hand out the whole block unless more than 1 MiB is left."""
    a = CachingAllocator(expandable=True)
    a.malloc(30 * MiB)  # two 20 MiB pages: 10 MiB free at the end
    a.malloc(9 * MiB + 512 * 1023)  # 512 KiB + 512 B left: split
    assert (a.allocated, a.reserved) == (39 * MiB + 512 * 1023, 40 * MiB)
    a.malloc(MiB + 512)  # the 511.5 KiB left do not hold it: one more page
    assert a.reserved == 60 * MiB
    default = CachingAllocator()
    default.malloc(19 * MiB)  # a 20 MiB segment, 1 MiB left: not split
    assert default.allocated == 20 * MiB


def test_expandable_best_fit_passes_over_the_free_end_of_the_segment():
    """get_free_block with expandable segments: the free block at the segment's end counts as its size plus the
    unmapped rest (`expandable_size`), so a request it holds takes the next larger free block. Here the 2 MiB
    request splits the freed 8 MiB block, not the 2 MiB end, and the 8 MiB request that follows finds no block:
    the end grows by a page (plain best fit would have kept the segment at 20 MiB)."""
    a = CachingAllocator(expandable=True)
    first = a.malloc(8 * MiB)  # one 20 MiB page: 8 MiB used, 12 free at the end
    a.malloc(4 * MiB)
    a.malloc(6 * MiB)  # 2 MiB free at the end
    a.free(first)  # 8 MiB free at the start, 2 MiB at the end
    a.malloc(2 * MiB)  # from the 8 MiB block: 6 MiB free at the start
    assert a.reserved == 20 * MiB
    a.malloc(8 * MiB)  # neither 6 nor 2 MiB holds it: the 2 MiB end plus one page
    assert (a.reserved, a.segments) == (40 * MiB, 1)


def test_a_resized_storage_is_freed_and_allocated_again():
    a = replay([(1, 12 * MiB), (1, 2 * MiB), (1, -14 * MiB)])
    assert a.reserved_peak == 26 * MiB and a.allocated == 0


# The replay of the CPU run's sequence misses the GPU's reserved memory by more than 1% on these runs (their
# allocated peaks equal the GPU's to the byte): what differs is the sequence, not the rules (the order in which the
# backward frees tensors, a CUDA kernel's temporaries the CPU run does not take, the model's initialisation on the
# GPU). Before autograd's cuBLAS workspace was put at its thread's first matrix product (validation/allocator_trace.py)
# three more were here: Qwen3-8B SGD with recompute -7.7%, Qwen3-8B with recompute at s8192 -5.1%, Llama-3.1-8B
# with recompute at s4096 b1 -4.9%, now +0.00% each; Llama-3.2-1B under autocast was +0.6%. Of the small models StarCoder2-3B's at s4096 b2
# (recorded with Pythia-1.4B's, within 0.2%, to find the two runs' reserved misses) is far under.
KNOWN_REPLAY_GAPS = {
    "gemma-2-9b-bf16-adamw-recompute-eager-s4096-b1": "replay -1.9%",
    "llama-3.1-8b-amp-sgd-recompute-sdpa-s4096-b2": "replay +6.1%",
    "llama-3.1-8b-bf16-adamw-norecompute-eager-s2048-b1": "replay +2.6% (+1.9% with autograd's workspace after the build)",
    "llama-3.1-8b-bf16-adamw-norecompute-sdpa-s2048-b2": "replay -2.4%",
    "llama-3.1-8b-bf16-adamw-norecompute-sdpa-s4096-b1": "replay -2.4%",
    "llama-3.1-8b-bf16-adamw-recompute-sdpa-s2048-b2-liger": "replay -1.3%",
    "llama-3.2-1b-amp-adamw-norecompute-sdpa-s2048-b1": "replay +3.5% (+0.6% with autograd's workspace after the build)",
    "qwen2.5-0.5b-amp-adamw-norecompute-sdpa-s8192-b2-liger": "replay -2.1%",
    "qwen3-8b-bf16-adamw-norecompute-eager-s2048-b1": "replay +5.3%",
    # the harness's own sequence short of the GPU's: one 768 MiB (bf16 logits) segment more on the GPU by step 2's
    # forward end and one 1,536 MiB (fp32 logits) in step 2's backward (REPLAY_MISSES below)
    "starcoder2-3b-8layers-bf16-adamw-norecompute-sdpa-s4096-b2": "replay -12.6%",
}


def load(path: Path) -> dict:
    with gzip.open(path, "rt") as f:
        return json.load(f)


GPT2_AMP = ("gpt2-medium-8layers-amp-adamw-norecompute-sdpa-s1024-b4", "gpt2-medium-8layers-amp-adamw-norecompute-eager-s1024-b4")


def test_the_traces_are_there():
    """Every HF case run on the GPU with a fake-tensor twin (paged optimizers aside) of the first H200 runs, GPT-2
    medium's two under autocast and Pythia-1.4B's and StarCoder2-3B's bf16 at s4096 b2 of the third (recorded to find
    their reserved misses), the five Liger runs (liger-kernel 0.8.5 with its Triton launches stubbed,
    validation/hf/liger.py), and Falcon-H1-0.5B's four runs of transformers' Mamba-2 torch fallback (5.17 and 5.23;
    validation/allocator_trace.py --fallback), all recorded with autograd's cuBLAS workspace at its thread's first
    matrix product (validation/allocator_trace.py)."""
    assert len(TRACES) == 42
    ids = {p.name.removesuffix(".json.gz") for p in TRACES}
    assert {"llama-3.2-1b-bf16-adamw-recompute-sdpa-s4096-b2-expandable", *GPT2_AMP} <= ids
    assert set(KNOWN_REPLAY_GAPS) <= ids
    assert all("workspaces" in load(p) for p in TRACES)


def test_the_backward_threads_workspace_at_the_heads_backward():
    """GPT-2 medium (tied embedding, fp32 weights) under bf16 autocast with SDPA, b 4, s 1024: the recorded sequence
    replays to the H200's max_memory_reserved to the byte (8,495,562,752 B, 98 segments, as the GPU's record lists
    them) with autograd's backward thread's cuBLAS workspace (32 MiB) made at its first matrix product, the head's
    weight gradient in bf16 (50,257 x 1,024 x 2 B = 102,926,336 B; aten/src/ATen/cuda/CublasHandlePool.cpp: one
    workspace per handle and stream, a handle per thread). Made after the model's build instead, beside the forward
    thread's, as the first 29 traces have it, the same sequence replays to 7,713,325,056 B (-9.2%, 99 segments):
    there the workspace sits in
    the segment the embedding-sized transient of the build left (nn.Linear's own lm_head weight, dropped when
    transformers ties it), so in step 2 the head's bf16 copy of the tied weight (autocast's cast, 102,926,336 B,
    kept from the logits to the head's backward) finds no free block but a whole fp32-logits segment
    (4 x 1,024 x 50,257 x 4 B), which it pins through the loss's backward: the GPU maps a fifth such segment
    (824,180,736 B) and the replay so made does too."""
    record = load(next(p for p in TRACES if p.name.startswith(GPT2_AMP[0])))
    events = record["events"]
    gpu = json.loads((GPU / f"{GPT2_AMP[0]}.json").read_text())["measured"]
    backward = events.index([-2, 32 * MiB])
    assert events[backward - 1][1] == 50_257 * 1_024 * 2
    placed = replay(events)
    assert (placed.reserved_peak, placed.segments) == (gpu["reserved_peak_bytes"], len(gpu["segments"])) \
        == (8_495_562_752, 98)
    assert sorted(s[0] for s in gpu["segments"]).count(824_180_736) == 5
    built = events.index([-1, 32 * MiB])  # the forward thread's, after the build: before the token ids
    assert events[built + 1][1] == 4 * 1_024 * 8
    at_build = replay(events[:built + 1] + [[-2, 32 * MiB]] + [e for e in events[built + 1:] if e[0] != -2])
    assert (at_build.reserved_peak, at_build.segments) == (7_713_325_056, 99)


def test_median_replay_error():
    errors = sorted(abs(load(p)["simulated_reserved_bytes"] / load(p)["gpu_reserved_bytes"] - 1) for p in TRACES)
    assert errors[len(errors) // 2] <= 0.005


@pytest.mark.parametrize("path", TRACES, ids=lambda p: p.name.removesuffix(".json.gz"))
def test_replay_of_a_training_run_reserves_what_the_gpu_reserved(path):
    record = load(path)
    allocator = replay(record["events"], record["expandable_segments"])
    assert allocator.reserved_peak == record["simulated_reserved_bytes"]
    error = allocator.reserved_peak / record["gpu_reserved_bytes"] - 1
    if record["expandable_segments"]:  # the three H200 runs, to the byte (allocator.py's expandable rules)
        assert allocator.reserved_peak == record["gpu_reserved_bytes"]
    if record["id"] in KNOWN_REPLAY_GAPS:
        assert abs(error) > 0.01, f"{record['id']} now within 1%: take it off KNOWN_REPLAY_GAPS"
    else:
        assert abs(error) <= 0.01


# --- the estimate's reserved memory: its own ledger replayed (estimator/memory/reserved.py) ----------
GPU = Path(__file__).parent / "data" / "measured" / "gpu"


def _full_fine_tuning_records() -> list[Path]:
    """The HF full fine-tuning runs measured on an H200 (adapter runs aside; the four Falcon-H1 runs of transformers'
    Mamba torch fallback, training.ssm_kernels "torch_5.17" and "torch", among them since the replay takes a Mamba-2
    hybrid on the fallback: reserved_mamba.py)."""
    out = []
    for path in sorted(GPU.glob("*.json")):
        record = json.loads(path.read_text())
        if "probe" not in record and not record["config"]["training"].get("adapter"):
            out.append(path)
    return out


FULL = _full_fine_tuning_records()

# Where the replay misses max_memory_reserved by more than 7% (the earlier sequences missed by 13-34% until the
# mechanisms above were modelled: each such run is listed here, with its cause, as a strict xfail). The last below
# is of the H200 run of 2026-11-27 (its second), first measured then (Falcon-7B's eager run with dropout, +8.0%, was
# the other, until reserved_falcon.py: -0.2%); each record has its segments at the step's end and no allocator
# history, so the order that differs is not yet known. (Pythia-1.4B bf16 was a third, -10.7%,
# until the replay took a fused q, k, v linear as one parameter, reserved_tensors.py: -0.5%, its five fp32-logits
# segments now the GPU's five.) Pythia-1.4B bf16 at s4096 b2 (the third run) was one too, -11.2%, until the replay
# made the partial rotary embedding's temporaries (reserved_layers.py `rotation`, Architecture.partial_rotary_factor):
# its recorded sequence (tests/data/measured/allocator) replays within 0.2% of the GPU and without those 8 and 4 MiB
# requests -11.35%: their fragments hold the smaller tensors that otherwise, at the last layer's end, split a block
# of the fp32 logits' size, and step 2's loss maps a fifth such segment (the GPU's five); now -0.2%.
REPLAY_MISSES: dict[str, str] = {
    # The third H200 run of 2026-11-27 (the HF cases that had fake records only; allocated peaks within 0.31%):
    # six more beyond 7%, their segments at the step's end recorded, their allocator history not
    "starcoder2-3b-8layers-bf16-adamw-norecompute-sdpa-s4096-b2": (
        "-12.7%: not the ledger's: the fake-tensor harness's own sequence (tests/data/measured/allocator) replays "
        "-12.6% and maps the same segments of 1 GiB and more as the ledger's (five of 1,536 MiB; one of 768 MiB each); "
        "the GPU maps one 768 MiB (bf16 logits) segment more by step 2's forward end (its forward's reserved peak, "
        "17,397,972,992 B, is 780,140,544 B over the harness's whole replay: 768 MiB and three 24 MiB segments, "
        "rotate_half's -x2 of q, less two of 48 MiB) and one of 1,536 MiB in step 2's backward (its backward's "
        "reserved peak over its forward's: 1,610,612,736 B exactly), so the GPU's step makes requests the CPU run "
        "does not, or in another order; CUDA's embedding backward's fp32 partial sums (8,192 x 3,072 x 4 B, "
        "EmbeddingBackwardKernel.cu grad_weight_per_segment) put into the recorded sequence change nothing; the "
        "GPU's allocator history is needed (validation/gpu/hf_history.py; validation/README.md, the next GPU session's "
        "item 5)"),
    "gpt2-medium-8layers-amp-adamw-norecompute-sdpa-s1024-b4": (
        "-10.4%: fp32 weights under bf16 autocast (its eager twin -6.9%). The recorded sequence replays to the GPU's "
        "bytes (test_the_backward_threads_workspace_at_the_heads_backward); the ledger's lacks the build's "
        "embedding-sized transient (nn.Linear's own lm_head weight, dropped when tied) and makes both cuBLAS "
        "workspaces after the parameters, not the backward thread's at the head's backward: with both as recorded "
        "the ledger's replay is -1.3%, but the workspace's place alone takes LoRA runs to +10-16% "
        "(validation/README.md, item 5)"),
    # (Falcon-7B's eager and SDPA runs were here, +7.3%, +8.0% with its dropout, +13.9% on SDPA's math backend, until
    # the replay made Falcon's layer request by request as transformers and torch make it: reserved_falcon.py, -0.6%,
    # -0.2%, +3.9%; at s1024 b2 +5.5% -> -0.7%.)
    "falcon-7b-8layers-bf16-adamw-recompute-eager-s4096-b1-drop10": (
        "+7.9% -> +9.3% with Falcon's layer request by request (reserved_falcon.py): its segments are the GPU's but "
        "for one 2,272 MiB (the scores) more and one 564 MiB (the embedding's size) fewer; the fake harness's sequence "
        "(validation/allocator_trace.py, 0.0% against the GPU) has a transient the size of the embedding after the "
        "model's build, the tied LM head's own nn.Linear weight made at FalconForCausalLM.__init__ and dropped when "
        "post_init ties it (in every recorded sequence of a tied model, tests/data/measured/allocator), which the "
        "replay does not make: with it -0.05% (and SDPA's s2048 run +3.9% -> -0.05%). The harnesses build the model "
        "by from_config on the GPU (validation/hf/step.py build_model); from_pretrained, a user's load, builds it on "
        "the meta device (transformers 5.23 modeling_utils get_init_context), where that weight takes no GPU memory"),
    "starcoder2-3b-8layers-bf16-adamw-norecompute-sdpa-s4096-b2-drop10": (
        "-8.8%: six segments of the fp32 logits' size (1,610,612,736 B) against the replay's five, one holding "
        "905,969,664 B (three tensors of the embedding's size) at the step's end: a logits-sized request the replay "
        "serves from a cached block that the GPU could not; as in its twin without dropout (above), step 2's "
        "backward maps it (the backward's reserved peak over the forward's: 1,610,612,736 B)"),
    "qwen2.5-0.5b-amp-adamw-norecompute-sdpa-s8192-b2-liger": (
        "-7.6% (the flat share -0.7%; the fake harness's recorded sequence -2.1%, tests/data/measured/allocator): "
        "under autocast the ledger requests each layer's 16-bit casts of a norm's output as one block (three for "
        "q, k, v, two for gate and up: activations/entries.py _norm_output) and q, k, v as one, where the Trainer "
        "makes one tensor each; requested one by one (a trial) the replay is -3.4% with the casts apart (520 segments, "
        "the recorded sequence's 520), -3.0% with q, k, v apart too (531; the GPU's 530), where it is -7.6% with "
        "425. The loss's own sequence (reserved_liger.py) moves it by 0.1%"),
}


def _replay_off():
    """The estimate with the flat share in the replay's place (the rule switched off)."""
    from contextlib import contextmanager

    from estimator.memory import memory

    @contextmanager
    def off():
        rule = memory.replay_rule
        memory.replay_rule = lambda cfg: "switched off (test)"
        try:
            yield
        finally:
            memory.replay_rule = rule
    return off()


def _errors(paths=None) -> tuple[dict, dict, set]:
    """(replayed error, flat-share error, runs the replay applies to) of each GPU record in `paths` (FULL)."""
    from estimator import estimate_config
    replayed, flat, applies = {}, {}, set()
    for path in FULL if paths is None else paths:
        record = json.loads(path.read_text())
        measured = record["measured"]["reserved_peak_bytes"]
        estimate = estimate_config(record["config"])
        replayed[path.stem] = estimate.reserved_peak_bytes / measured - 1
        if estimate.stages[0].cache is not None:
            applies.add(path.stem)
        with _replay_off():
            flat[path.stem] = estimate_config(record["config"]).reserved_peak_bytes / measured - 1
    return replayed, flat, applies


def test_the_estimates_reserved_memory_against_the_gpu_and_the_flat_share():
    """The 62 HF full fine-tuning runs: the estimate's reserved peak (the allocator replayed on 52, the three with
    expandable segments among them; the flat share on the 2 with a paged optimizer, the 3 with Liger's fused loss and
    the 5 of DeepSeek-V3.2, -7.0% to +3.7%; on the 78 of today, the replay on 71, the five Liger runs among them since
    the replay builds Liger's fused linear cross-entropy, reserved_liger.py) against max_memory_reserved, beside the flat share everywhere (10%, 5% with expandable segments): the
    median error falls from 3.6% to 0.8% (3.5% to 0.7% where it replays), and the runs under by more than 5% from
    13 to 4 (10 to 1 where it replays). Out of sample, measured after the replay was built: Llama-3.1-8B at 256 and
    1,024 tokens (-0.09% and +0.19%), and the six vision-language runs of 2026-11-27 (Qwen2.5-VL-7B and Gemma-3-4B,
    -0.8% to +1.6%; the flat share -15.8% to +1.2%). The three expandable-segment runs, replayed since the
    allocator's expandable rules were checked against CUDACachingAllocator.cpp (allocator.py): -0.10%, -0.14% and
    -0.01% (the flat 5%: +3.5%, +1.0% and -11.6%). The ten of 2026-11-27's second H200 run (Phi-3, Pythia, GPT-2,
    StarCoder2 and Falcon-7B with their configs' dropouts; Liger on Llama, on the flat share) and the four of its
    third (Phi-3 with recompute and eager attention -4.1%, GPT-2 medium eager with dropout +1.2%, Falcon-7B under
    autocast +0.8%; Liger on Qwen2.5-0.5B, on the flat share, -0.7%): -8.8% to +8.0%, two beyond 7% (REPLAY_MISSES);
    the median 1.0% (0.8% where it replays). The five Liger runs (reserved_liger.py: Liger's loss in its order), the
    flat share's +6.9%, +7.85%, +5.6%, -0.7% and +6.6% -> -0.4%, -1.3%, +0.02%, -7.6% (REPLAY_MISSES) and +0.5%.
    Falcon-7B's layer made request by request as transformers and torch make it (reserved_falcon.py) takes its bf16
    eager runs from +7.3% and +8.0% (with its dropout) to -0.6% and -0.2%, on SDPA's math backend from +13.9% and
    +5.5% to +3.9% and -0.7%, with recompute from +7.9% to +9.3% (REPLAY_MISSES).
    The four Falcon-H1-0.5B runs of transformers' Mamba-2 torch fallback (5.17's broadcast products and 5.23's
    einsums, at s4096 b2 and s16384 b1 with recompute), replayed since the scan's products are put in the ledger's
    sequence in the source's order (reserved_mamba.py): -0.4%, +0.1%, -1.8% and -0.4% (the flat 10%: -5.7%, -20.1%,
    +6.2%, -12.4%)."""
    import statistics
    replayed, flat, applies = _errors()
    assert len(replayed) == 83 and len(applies) == 76  # 78 and 66 before the five Liger runs and the four Falcon-H1 ones
    dsa = {p for p in replayed if p.startswith("deepseek-v3.2-")}
    assert len(dsa) == 5 and {p for p in replayed if p not in applies} == dsa | {
        "llama-3.2-1b-bf16-paged_adamw-norecompute-sdpa-s2048-b1",
        "llama-3.2-1b-bf16-paged_adamw8bit-norecompute-sdpa-s2048-b1"}
    liger = {p: (round(replayed[p], 4), round(flat[p], 4)) for p in replayed if p.endswith("-liger")}
    assert liger == {  # (replayed, flat share)
        "llama-3.1-8b-bf16-adamw-norecompute-sdpa-s4096-b1-liger": (-0.0038, 0.0688),
        "llama-3.1-8b-bf16-adamw-recompute-sdpa-s2048-b2-liger": (-0.0132, 0.0785),
        "llama-3.1-8b-bf16-adamw-norecompute-sdpa-s8192-b2-liger": (-0.0228, 0.0156),  # the fourth H200 session
        "llama-3.2-1b-bf16-adamw-norecompute-sdpa-s8192-b2-liger": (0.0002, 0.056),
        "qwen2.5-0.5b-amp-adamw-norecompute-sdpa-s8192-b2-liger": (-0.0763, -0.0068),
        "qwen3-8b-bf16-adamw-norecompute-sdpa-s4096-b1-liger": (0.0049, 0.066)}
    expandable = {p: replayed[p] for p in replayed if p.endswith("-expandable")}
    assert {p: round(e, 4) for p, e in expandable.items()} == {
        "llama-3.1-8b-bf16-adamw-norecompute-sdpa-s4096-b1-expandable": -0.0010,
        "llama-3.2-1b-bf16-adamw-norecompute-sdpa-s2048-b1-expandable": -0.0014,
        "llama-3.2-1b-bf16-adamw-recompute-sdpa-s4096-b2-expandable": -0.0001}
    assert [round(flat[p], 3) for p in sorted(expandable)] == [0.035, 0.010, -0.116]
    # 0.012 (0.008 where it replays) while the three expandable-segment runs took the flat 5%; the 41 before the
    # runs of 2026-11-27: 0.012 and 0.037; 0.008 and 0.036 where it replays; under by 5%: 5 and 11, 1 and 7 where
    # it replays; the flat share over 7% on 8 of the 32
    # 0.011 before transformers' masked SDPA path (memory/activations/sdpa_mask.py) raised the Gemma 3 and
    # Qwen2.5-VL estimates of the same day's runs
    # 0.008, 0.036 and 0.007 on the 48 before the ten full fine-tuning runs of 2026-11-27's second H200 run (Phi-3,
    # Pythia, GPT-2, StarCoder2 and Falcon-7B with dropout; two with Liger, on the flat share, +6.9% and +5.6%)
    # 0.012 on the 58 before the four of the third run and the fused q, k, v parameter (reserved_tensors.py), with
    # 0.036, 0.008 and 0.033 below, 8 and 15, 5 and 12 under by 5%, 13 of the flat share over 7%
    # 0.010 on the 62 before the sixteen of the third H200 run (2026-11-27), the rest below unchanged
    # 0.015 (0.010 where it replays) while the five Liger runs took the flat share, 0.012 (0.009) before Falcon-7B's
    # layer request by request (reserved_falcon.py); 0.036 on the flat share before the four Falcon-H1 fallback runs;
    # 0.008 (0.007) before the partial rotary embedding's temporaries (reserved_layers.py `rotation`: Pythia-1.4B bf16
    # at s4096 b2 -11.2% -> -0.2%)
    assert round(statistics.median(map(abs, replayed.values())), 3) == 0.008
    assert round(statistics.median(map(abs, flat.values())), 3) == 0.037
    on_replayed = [replayed[p] for p in applies]
    assert round(statistics.median(map(abs, on_replayed)), 3) == 0.007  # 0.008 before the third run's sixteen
    # 0.032 on the 38 replayed before the expandable-segment runs were (0.034 before backward's last moments were
    # modelled, trainer_backward_end.py: Llama-3.1-8B AMP SGD's allocated peak rose to its measured backward end,
    # -0.29% -> +0.03%, and the flat share over it from +6.4% to +6.7%)
    # (0.035, 4 and 13, 1 and 10, 11 before 2026-11-27's second run)
    assert round(statistics.median(abs(flat[p]) for p in applies), 3) == 0.036  # 0.032 before Liger and Falcon-H1, 0.038 before Llama-3.1-8B with Liger at s8192
    # (6 and 16, 3 and 13, 14 below, on the 62 before the third H200 run's sixteen; 10 and 21, 7 and 18, 16 before
    # the five Liger runs were replayed: Qwen2.5-0.5B's under autocast, -7.6%, is the one more under; the four
    # Falcon-H1 fallback runs add three under by 5% on the flat share)
    assert sum(e < -0.05 for e in replayed.values()) == 10 and sum(e < -0.05 for e in flat.values()) == 24
    assert sum(replayed[p] < -0.05 for p in applies) == 7 and sum(flat[p] < -0.05 for p in applies) == 21
    assert {p for p in applies if abs(replayed[p]) > 0.07} == set(REPLAY_MISSES)
    assert sum(abs(flat[p]) > 0.07 for p in applies) == 19  # the flat share's misses on the same runs
    falcon_h1 = {p: round(replayed[p], 3) for p in applies if p.startswith("falcon-h1-")}
    assert falcon_h1 == {  # the flat share: -5.7%, -20.1%, +6.2%, -12.4%
        "falcon-h1-0.5b-bf16-adamw-norecompute-sdpa-s4096-b2": -0.004,
        "falcon-h1-0.5b-bf16-adamw-recompute-sdpa-s16384-b1": 0.001,
        "falcon-h1-0.5b-bf16-adamw-norecompute-sdpa-s4096-b2-transformers-5.23": -0.018,
        "falcon-h1-0.5b-bf16-adamw-recompute-sdpa-s16384-b1-transformers-5.23": -0.004}


@pytest.mark.parametrize("path", [pytest.param(p, marks=pytest.mark.xfail(reason=REPLAY_MISSES[p.stem], strict=True))
                                  if p.stem in REPLAY_MISSES else p for p in FULL], ids=lambda p: p.stem)
def test_the_replayed_reserved_peak_within_seven_percent(path):
    from estimator import estimate_config
    record = json.loads(path.read_text())
    estimate = estimate_config(record["config"])
    if estimate.stages[0].cache is None:
        pytest.skip("the flat share: " + estimate.stages[0].component("fragmentation").formula)
    assert estimate.reserved_peak_bytes == pytest.approx(record["measured"]["reserved_peak_bytes"], rel=0.07)


def _adapter_records() -> list[Path]:
    """The HF adapter runs (peft LoRA, DoRA, QLoRA over bitsandbytes) measured on an H200."""
    out = []
    for path in sorted(GPU.glob("*.json")):
        record = json.loads(path.read_text())
        if "probe" not in record and record["config"]["training"].get("adapter"):
            out.append(path)
    return out


ADAPTERS = _adapter_records()


def test_the_replay_of_adapter_runs_against_the_gpu_and_the_flat_share():
    """The 29 HF adapter runs (three of them MoE): the replay (frozen weights allocated without a gradient or a
    state, each layer's adapters after its weights; reserved_tensors.py) took the median error of the first 23
    against max_memory_reserved from 4.8% to 1.6%, the runs more than 5% under from 2 to 0 and more than 5% over
    from 9 to 2, the largest error from 13.8% (QLoRA with recompute, under) to 10.0% (trainable embedding and head
    copies, over: tests/test_accuracy.py KNOWN_RESERVED_OVER). On all 29: 4.8% to 1.3%, under by 5% 4 to 0, over by 5%
    10 to 2 (1.4% and one under, Llama-3.2-1B with recompute and eager attention's dropout at -12.8%, until the replay
    ran eager attention's backward through the recomputed softmax as autograd does: reserved_layers.py, -0.7%)."""
    import statistics
    replayed, flat, applies = _errors(ADAPTERS)
    # 2026-11-27's second H200 run added four (LoRA on GPT-2 medium -0.5%, Falcon-7B -4.0%, Llama-3.2-1B -1.4% and
    # -0.5%): 23 runs, median 0.016 and 0.048, over by 5% 2 and 9, before. Its third added two (LoRA with recompute:
    # GPT-2 medium -1.2%, the flat share -11.8%; Llama-3.2-1B with eager attention and its dropout -12.8%, the flat
    # share -18.4%, tests/test_accuracy.py KNOWN_RESERVED_GAPS): 27 runs, median 0.014 and 0.045, under by 5% 0
    # and 2, the largest 0.100 and 0.138, before; on the 29, 0.014, one under by 5% and the largest 0.128 before
    # eager attention's backward (reserved_layers.py: that run -12.8% -> -0.7%, its norecompute twin -0.5% -> -0.2%)
    # The third H200 run (2026-11-27) added eight LoRA runs on Llama-3.2-1B (targets o, down, q k v o, gate up down;
    # eager attention, its dropout, recompute): 29 runs, median 0.013 and 0.048, under by 5% 0 and 4, over 2 and 10,
    # the largest 0.100 and 0.184, before; of the eight, LoRA on q and v with recompute and eager attention without
    # its dropout -12.5% (tests/test_accuracy.py KNOWN_RESERVED_GAPS; with the dropout -0.7%), the others within 1.5%;
    # the GPU's segment addresses, descending, take that run's recorded sequence to the byte (test_segment_order.py)
    assert len(replayed) == 37 and applies == set(replayed)
    assert round(statistics.median(map(abs, replayed.values())), 3) == 0.012
    assert round(statistics.median(map(abs, flat.values())), 3) == 0.050
    assert sum(e < -0.05 for e in replayed.values()) == 1 and sum(e < -0.05 for e in flat.values()) == 6
    assert sum(e > 0.05 for e in replayed.values()) == 2 and sum(e > 0.05 for e in flat.values()) == 12
    assert round(max(map(abs, replayed.values())), 3) == 0.125
    assert round(max(map(abs, flat.values())), 3) == 0.281  # 0.184 before the eight


def test_an_adapter_runs_replay_allocates_gradients_and_states_for_the_trainable_tensors_only():
    """Llama-3.1-8B, LoRA rank 16 on q and v (peft 0.21: fp32 adapters of a bf16 base): the replay's tensors
    are the 8,030,261,248 frozen elements in bf16 and, per layer, A (16 x 4096) and B (4096 x 16, 1024 x 16
    for v) of each target in fp32, with fp32 gradients of those alone."""
    from estimator import estimate_config
    from estimator.memory.reserved_tensors import tensors
    record = json.loads((GPU / "llama-3.1-8b-lora-r16-qv-norecompute-drop00-s4096-b1.json").read_text())
    estimate = estimate_config(record["config"])
    order = tensors(estimate.config, estimate.config.stages[0]).order()
    frozen = [t for t in order if not t.grad]
    trained = [t for t in order if t.grad]
    assert sum(t.elements for t in frozen) == 8_030_261_248
    assert sum(t.stored for t in frozen) == 2 * 8_030_261_248
    assert len(trained) == 32 * 4
    assert sum(t.elements for t in trained) == 32 * 16 * (4096 + 4096 + 4096 + 1024)
    assert all(t.stored == t.grad == 4 * t.elements for t in trained)
    assert estimate.stages[0].cache is not None


GiB = 1 << 30


@pytest.mark.parametrize("case, core, residual, gradients", [
    # LoRA on q and v of Llama-3.2-1B (b 1, s 4096, a 32, d_head 64, h 2048): the fp32 softmax 4 a s^2 b = 2 GiB,
    # the bf16 scores 1 GiB, dropout 0.1, CUDA's tmp 2 GiB, the expanded v, q and k 2 s b a d_head = 16 MiB each
    # (LoRA on q and v: no gradient before the core)
    ("llama-3.2-1b-lora-r16-qv-recompute-drop00-s4096-b1-eager-attndrop10",
     (4, False, 2 * GiB, GiB, True, 2 * GiB, 16 * MiB, (16 * MiB, 16 * MiB)), 2 * 4096 * 2048, 0),
    # Phi-3-mini's layer, full fine-tuning (a 32, d_head 96, h 3072, f 8192), no attention dropout: q, k, v 24 MiB;
    # before the core the bf16 gradients of the MLP's three matrices, o_proj and the two norms (the input norm's
    # 3,072 among them: the replay's parameter order lists the norms after o_proj)
    ("phi-3-mini-8layers-bf16-adamw-recompute-eager-s4096-b1-drop10",
     (6, False, 2 * GiB, GiB, False, 2 * GiB, 24 * MiB, (24 * MiB, 24 * MiB)), 2 * 4096 * 3072,
     2 * (3 * 3072 * 8192 + 3072 * 3072 + 2 * 3072)),
])
def test_eager_attentions_backward_holds_the_ledgers_moment(case, core, residual, gradients):
    """A recomputed eager layer's backward in the replay (reserved_layers.py): its allocated peak, at the softmax's
    backward (the softmax, the fp32 gradient of the probabilities, _softmax_backward_data's output and CUDA's tmp,
    4 x 2 GiB, beside the tensors not yet freed), is the ledger's recompute moment (the recomputed layer and its
    softmax backward, static_stage.py) less the residual stream's gradient (B*s*b*h, which the replay, making no
    activation's gradient, leaves out), plus the layer's gradients made before the core (the MLP's, o_proj's and
    the norms', under full fine-tuning; the ledger counts them with the gradients). The replay of the LoRA run
    stood 20.9% under the ledger's peak before, its reserved peak -12.8% (tests/test_accuracy.py)."""
    from estimator import estimate_config
    from estimator.memory.reserved import _Program
    from estimator.memory.reserved_layers import Core, backward, layer, made
    from estimator.memory.reserved_tensors import tensors
    estimate = estimate_config(json.loads((GPU / f"{case}.json").read_text())["config"])
    cfg, sp = estimate.config, estimate.config.stages[0]
    dense = layer(cfg, estimate._shared, "dense")
    assert dense.core == Core(*core)
    weights = tensors(cfg, sp).layers[0]
    prog, grads = _Program(), {}
    backward(prog, dense, made(prog, dense), [], weights, len(weights), grads)
    phase = next(p for p in estimate.stages[0].phases if p.name == "backward")
    moment = next(c for c in phase.components if c.key == "transient").bytes
    assert prog.allocator.allocated_peak == moment - residual + gradients
    assert prog.allocator.allocated == sum(t.grad for t in weights)  # all freed but the gradients


def _sizes_seen(run, method: str) -> list[int]:
    """The sizes in bytes, in order, that `run` hands the caching allocator's `method` (`malloc`: the requests;
    `_new_segment`: the segments it maps)."""
    from estimator.memory import allocator
    sizes, original = [], getattr(allocator.CachingAllocator, method)

    def recording(self, size, *args, **kwargs):
        sizes.append(size)
        return original(self, size, *args, **kwargs)
    setattr(allocator.CachingAllocator, method, recording)
    try:
        run()
    finally:
        setattr(allocator.CachingAllocator, method, original)
    return sizes


def _large_segments(run) -> list[int]:
    """The sizes in MiB of the segments of 1 GiB and more that `run` makes the caching allocator map, in order."""
    return [size // MiB for size in _sizes_seen(run, "_new_segment") if size >= 1 << 30]


def _ledger_replay(record: dict):
    """The estimate's replay (reserved._replayed) of the run of a recorded sequence, its configuration's peak stage."""
    from estimator import estimate_config
    from estimator.memory import reserved
    from estimator.memory.memory import _stage_memo, static_key
    estimate = estimate_config(json.loads((TRACES[0].parents[1] / record["gpu_record"]).read_text())["config"])
    cfg, sp = estimate.config, estimate.config.stages[0]
    static = _stage_memo(cfg).get(static_key(sp, cfg.training))
    return lambda: reserved._replayed(cfg, estimate._shared, sp, static)


# The recorded sequences whose large segments the ledger's sequence does not map alike: a transient the size of
# the embedding after the model is built (in every recorded sequence; one segment more where it is 1 GiB or larger,
# Gemma-2's), step 2's loss finding the blocks step 1's loss left cut by smaller requests, or not (one 2 or 4 GiB
# segment more or fewer), and eager attention's backward (reserved_layers.py), which holds CUDA's softmax temporary
# (the recorded sequences do not): Gemma-2's recomputed run maps three 1 GiB score segments in backward where the
# recorded one maps two (in forward four alike, since the replay makes its soft-capped scores: three before), and
# Qwen3-8B's eager run leaves a fp32-logits-sized block (1,188 MiB) whole to step 2's last optimizer
# temporary of the embedding's size, where the recorded sequence maps a 14th segment (its reserved error +0.7% ->
# -0.8%). Falcon-H1-0.5B with recompute at s16384 on transformers 5.23's Mamba-2 fallback: the recorded sequence maps
# two segments of the bf16 logits' size (1,026 MiB), as the GPU did (its segments at the step's end), the ledger's one
# (the replay -0.4% against the GPU, the recorded sequence +0.5%).
# (The two Qwen3-8B runs with recompute were here until autograd's cuBLAS workspace was put at its first matrix
# product in the recorded sequences: validation/allocator_trace.py.)
SEGMENTS_DIFFER = {
    "gemma-2-9b-bf16-adamw-norecompute-eager-s2048-b1", "gemma-2-9b-bf16-adamw-recompute-eager-s4096-b1",
    "llama-3.1-8b-bf16-adamw-recompute-sdpa-s4096-b1", "qwen3-8b-bf16-adamw-norecompute-eager-s2048-b1",
    "falcon-h1-0.5b-bf16-adamw-recompute-sdpa-s16384-b1-transformers-5.23",
}


def test_the_ledgers_sequence_maps_the_recorded_large_segments():
    """Segments of 1 GiB and more (the loss's logits, their fp32 copies and gradients, the embedding's
    gradient and states; a Mamba-2 scan's products on transformers 5.17's fallback), in the order mapped over two
    steps: the ledger's sequence (reserved.py) and the fake harness's recorded one alike on 34 of the 39 runs the
    estimate replays with default segments (20 of 26 before the five Liger runs, of which only Qwen3-8B maps any: its
    eleven 1,188 MiB blocks, the embedding's and head's size, and the four Falcon-H1 fallback runs; Pythia-1.4B's and StarCoder2-3B's of the third H200 run among them,
    the latter's 12.6% under the GPU alike; GPT-2 medium's two autocast runs map none: their fp32 logits are 786 MiB),
    among them the
    three where the ledger's earlier sequence missed by 13-34% (the loss's two fp32 gradients requested
    as one block, freed out of autograd's order; a later micro-batch's gradient never freed) and the
    three recompute runs it left 10-16% under (a layer's tensors freed only at its backward's end)."""
    same = set()
    for path in TRACES:
        record = load(path)
        if record["expandable_segments"]:
            continue
        ledger = _large_segments(_ledger_replay(record))
        recorded = _large_segments(lambda: replay(record["events"]))
        if ledger == recorded:
            same.add(record["id"])
        if record["id"] == "llama-3.2-1b-bf16-adamw-recompute-sdpa-s4096-b2":
            # 2 x 4096 x 128,256 logits: bf16 2,004 MiB, fp32 4,008 MiB; step 1 maps the logits, the fp32
            # copy, the log-softmax and a second fp32 gradient; step 2 one more fp32 block
            assert ledger == [2004, 4008, 4008, 4008, 4008]
    # 20 of 26 before the two GPT-2 autocast traces and autograd's workspace at its first product (Qwen3-8B's two)
    assert len(same) == 34 and not same & SEGMENTS_DIFFER
    # Falcon-H1-0.5B on transformers 5.17's fallback: the scan's products' segments (reserved_mamba.py), as the GPU
    # kept them (tests/data/measured/gpu: seven of 12 GiB; 24 GiB, 12,482 MiB twice, 24 GiB)
    assert {"falcon-h1-0.5b-bf16-adamw-norecompute-sdpa-s4096-b2", "falcon-h1-0.5b-bf16-adamw-recompute-sdpa-s16384-b1",
            "falcon-h1-0.5b-bf16-adamw-norecompute-sdpa-s4096-b2-transformers-5.23"} <= same
    assert {"llama-3.1-8b-bf16-adamw-norecompute-eager-s2048-b1", "llama-3.2-1b-bf16-adamw-recompute-sdpa-s4096-b2",
            "qwen2.5-0.5b-amp-adamw-recompute-sdpa-s4096-b1", "llama-3.1-8b-bf16-adamw-recompute-sdpa-s4096-b2",
            "llama-3.1-8b-bf16-adamw-recompute-sdpa-s8192-b1", "llama-3.1-8b-amp-sgd-recompute-sdpa-s4096-b2",
            "pythia-1.4b-8layers-bf16-adamw-norecompute-sdpa-s4096-b2",
            "starcoder2-3b-8layers-bf16-adamw-norecompute-sdpa-s4096-b2"} <= same


def test_liger_loss_requests_as_the_recorded_sequence_makes_them():
    """Liger's fused linear cross-entropy in the ledger's replay (reserved_liger.py) against the fake harness's
    recorded sequence (liger-kernel 0.8.5, Triton launches stubbed), over two steps. Qwen2.5-0.5B under autocast
    (fp32 weights; s 8192, b 2: BT 16,384, V 151,936, h 896): chunks of next_power_of_2(cdiv(16,384, cdiv(151,936,
    896) = 170)) = 128 tokens, 128 of them; per chunk the bf16 cast of the weight's transpose (V h 2 =
    272,269,312 B) made and freed around the chunk's bf16 logits (128 V 2 = 38,895,616 B), and one cached cast of the
    weight kept from the first chunk to the forward's end: per step 129 casts and 128 logits made and freed, the same
    sequence in both. The fp32 blocks of the weight's size (V h 4): the weight A; grad_weight B, made in the forward
    and held through the backward as the head's gradient (no new block at the head's backward), then the lookup's
    gradient C and their sum D (reserved._tied_sum), AdamW's states and its temporary: the recorded sequence's, but
    for the transient after its model's build and the frees at its end. Llama-3.1-8B in bf16 (s 4096, b 1): one
    [128, V] bf16 logits buffer per step (32,833,536 B) for every chunk."""
    V, h = 151_936, 896
    amp = load(TRACES[0].parent / "qwen2.5-0.5b-amp-adamw-norecompute-sdpa-s8192-b2-liger.json.gz")
    for size, count in ((V * h * 2, 2 * 2 * (128 + 1)), (128 * V * 2, 2 * 2 * 128)):  # steps, made and freed
        ledger = _sized_events(_ledger_replay(amp), size)
        assert len(ledger) == count and ledger == _sized_events(lambda: replay(amp["events"]), size)
    assert _sized_events(lambda: replay(amp["events"]), V * h * 4) == [
        "+A", "+B", "-B",  # the model's embedding, a transient after the build
        "+C", "+D", "+E", "-C", "-D", "+F", "+G", "+H", "-H", "-E",  # step 1: states F, G; a temporary H
        "+I", "+J", "+K", "-I", "-J", "+L", "-L", "-K"]  # step 2 (the states F, G kept past the run's end)
    assert _sized_events(_ledger_replay(amp), V * h * 4) == [
        "+A",
        "+B", "+C", "+D", "-B", "-C", "+E", "+F", "+G", "-G", "-D",
        "+H", "+I", "+J", "-H", "-I", "+K", "-K", "-J"]
    bf16 = load(TRACES[0].parent / "llama-3.1-8b-bf16-adamw-norecompute-sdpa-s4096-b1-liger.json.gz")
    logits = 128 * 128_256 * 2
    assert _sized_events(_ledger_replay(bf16), logits) == _sized_events(lambda: replay(bf16["events"]), logits) == [
        "+A", "-A", "+B", "-B"]


def test_later_micro_batches_skipped_only_once_they_repeat():
    """Gradient accumulation over 8 micro-batches: the replay stops a step's accumulation once a
    micro-batch leaves the allocator as it found it; replaying all 8 gives the same cache to the byte."""
    from estimator import Hardware, Parallel, Training, estimate
    from estimator.memory import reserved
    from estimator.models.presets import get_architecture
    arch = get_architecture("llama-3.2-1b")
    training = Training(framework="hf", seq_len=2048, global_batch_size=8, recompute="full")
    assert estimate(arch, training, Parallel(), Hardware(gpu="h200")).microbatches == 8
    skipped = estimate(dataclasses.replace(arch), training, Parallel(), Hardware(gpu="h200"))
    state = reserved._Program.state
    reserved._Program.state = lambda self: object()  # never equal: every micro-batch replayed
    try:
        every = estimate(dataclasses.replace(arch), training, Parallel(), Hardware(gpu="h200"))
    finally:
        reserved._Program.state = state
    assert skipped.stages[0].cache.bytes == every.stages[0].cache.bytes > 0
    assert skipped.reserved_peak_bytes == every.reserved_peak_bytes


def test_an_entry_of_two_tensors_is_two_requests():
    """The loss's fp32 gradients of the log-softmax output and input are two tensors of 4 x s x b x V
    bytes each (autograd makes one, then the other), as the recorded sequences request them."""
    from estimator import Training
    from estimator.memory.reserved import _sizes
    from estimator.models.presets import get_architecture
    from estimator.memory.stage_shared import _shared
    from estimator import Hardware, Parallel
    arch = get_architecture("llama-3.2-1b")
    shared = _shared(arch, Training(framework="hf", seq_len=4096, micro_batch_size=2), Parallel(), Hardware(), 0,
                     arch.vocab_size)
    assert _sizes(shared.loss.backward, shared.parallel) == [4 * 4096 * 2 * 128256] * 2


def test_the_rule_is_named_in_the_component():
    """The replay where the ledger gives the HF Trainer's order of allocations; the flat share, saying
    why, elsewhere."""
    from estimator import Hardware, Parallel, Training, estimate
    from estimator.models.presets import get_architecture
    arch = get_architecture("llama-3.2-1b")
    hf = estimate(arch, Training(framework="hf", seq_len=2048), Parallel(), Hardware(gpu="h200"))
    cache = hf.stages[0].component("fragmentation")
    assert hf.stages[0].cache is cache and cache.formula.startswith("caching allocator replayed over two HF Trainer")
    assert "CUDACachingAllocator.cpp" in cache.source
    assert hf.reserved_peak_bytes == hf.allocated_peak_bytes + cache.bytes
    assert hf.device_total_bytes == hf.reserved_peak_bytes + sum(c.bytes for c in hf.stages[0].outside_allocator)
    megatron = estimate(arch, Training(framework="megatron", seq_len=2048), Parallel(), Hardware(gpu="h200"))
    replayed = megatron.stages[0].component("fragmentation")  # Megatron-Core's own order (megatron_replay.py)
    assert replayed.formula.startswith("caching allocator replayed over Megatron-Core's initialisation")
    ring = estimate(arch, Training(framework="megatron", seq_len=2048), Parallel(cp=2), Hardware(gpu="h200"))
    flat = ring.stages[0].component("fragmentation")
    assert flat.bytes == round(ring.stages[0].allocated_peak_bytes * 0.10)
    assert flat.formula == ("10% of the allocated peak (default segments); flat share, no allocator replay: "
                            "context parallelism by p2p (only the all-to-all's order is replayed: the ring's and the "
                            "gathers' buffers are not)")
    fsdp2 = estimate(arch, Training(framework="fsdp2", seq_len=2048), Parallel(), Hardware(gpu="h200"))
    assert "no allocator replay: fsdp2's order of allocations is not modelled" in \
        fsdp2.stages[0].component("fragmentation").formula
    expandable = estimate(arch, Training(framework="hf", seq_len=2048), Parallel(),
                          Hardware(gpu="h200", expandable_segments=True))
    cache = expandable.stages[0].component("fragmentation")
    assert expandable.stages[0].cache is cache and cache.formula == (
        "caching allocator replayed over two HF Trainer steps: reserved (2 expandable segments, their mapped pages) "
        "less allocated, at their peaks")
    assert "ExpandableSegment" in cache.source
    deepspeed = estimate(arch, Training(framework="deepspeed", seq_len=2048), Parallel(zero_stage=2),
                         Hardware(gpu="h200", expandable_segments=True))
    assert "no allocator replay: expandable segments (DeepSpeed's empty_cache" in \
        deepspeed.stages[0].component("fragmentation").formula


def test_a_search_judges_by_the_flat_share():
    """`device_total` and a plan's layouts (what the planner judges and lists) keep the flat share where
    the reported estimate replays: monotone in the micro-batch and the recompute setting, as the
    planner's pruning rules need (the replayed cache is not); the plan's text says so."""
    from estimator import Hardware, Parallel, Training, estimate
    from estimator.memory.memory import device_total
    from estimator.models.presets import get_architecture
    from estimator.search.planner import plan, render_plan_text
    arch = get_architecture("llama-3.2-1b")
    hw = Hardware(gpu="h100-80")
    one = Training(framework="hf", seq_len=4096, micro_batch_size=2)
    reported, judged = estimate(arch, one, Parallel(), hw), estimate(arch, one, Parallel(), hw, replay=False)
    outside = sum(c.bytes for c in reported.stages[0].outside_allocator)
    assert reported.allocated_peak_bytes == judged.allocated_peak_bytes
    assert reported.device_total_bytes == reported.allocated_peak_bytes + outside + reported.stages[0].cache.bytes
    flat = round(judged.allocated_peak_bytes * 0.1)
    assert device_total(arch, one, Parallel(), hw) == judged.device_total_bytes
    assert judged.device_total_bytes == judged.allocated_peak_bytes + outside + flat
    assert judged.stages[0].cache is None
    assert judged.stages[0].component("fragmentation").formula.endswith("no allocator replay: a layout search's total "
                                                                        "(monotone in the micro-batch and recompute; "
                                                                        "the replay is the reported estimate's)")
    result = plan(arch, Training(framework="hf", seq_len=4096, global_batch_size=8), "h100-80", 1, limit=8)
    assert len(result.layouts) >= 8
    for x in result.layouts:
        assert x.device_total_bytes == estimate(arch, x.training, x.parallel, hw, replay=False).device_total_bytes
        assert x.device_total_bytes == device_total(arch, x.training, x.parallel, hw)
    assert "a layout's own estimate replays the caching allocator" in render_plan_text(result)
    megatron = plan(arch, Training(seq_len=4096, global_batch_size=8), "h100-80", 1, limit=3)
    assert "a layout's own estimate replays the caching allocator" in render_plan_text(megatron)  # megatron_replay
    for x in megatron.layouts:  # judged by the flat share (FLAT_FOR_SEARCH), reported by Megatron's replay
        judged = estimate(arch, x.training, x.parallel, hw, replay=False)
        assert x.device_total_bytes == judged.device_total_bytes == device_total(arch, x.training, x.parallel, hw)
        assert judged.stages[0].component("fragmentation").formula.endswith("the replay is the reported estimate's)")
        reported = estimate(arch, x.training, x.parallel, hw).stages[0].component("fragmentation")
        assert reported.formula.startswith("caching allocator replayed over Megatron-Core's initialisation")
    fsdp2 = plan(arch, Training(framework="fsdp2", seq_len=4096, global_batch_size=8), "h100-80", 1, limit=3)
    assert "replays the caching allocator" not in render_plan_text(fsdp2)
    # with expandable segments the reported estimate replays them; a search keeps their flat 5%
    expandable = Hardware(gpu="h100-80", expandable_segments=True)
    judged = estimate(arch, one, Parallel(), expandable, replay=False)
    assert estimate(arch, one, Parallel(), expandable).stages[0].cache is not None and judged.stages[0].cache is None
    assert device_total(arch, one, Parallel(), expandable) == judged.device_total_bytes == \
        judged.allocated_peak_bytes + outside + round(judged.allocated_peak_bytes * 0.05)


def _sized_events(run, nbytes: int) -> list[str]:
    """The requests and frees of exactly `nbytes` that `run` makes the caching allocator see, each block named by
    a letter in order of first request ('+A' made, '-A' freed)."""
    from estimator.memory import allocator
    malloc, free = allocator.CachingAllocator.malloc, allocator.CachingAllocator.free
    names, events = {}, []

    def recording_malloc(self, size, stream=0):
        block = malloc(self, size, stream)
        names.pop(block, None)
        if size == nbytes:
            names[block] = chr(ord("A") + sum(e[0] == "+" for e in events))
            events.append("+" + names[block])
        return block

    def recording_free(self, block):
        if block in names:
            events.append("-" + names.pop(block))
        return free(self, block)
    allocator.CachingAllocator.malloc, allocator.CachingAllocator.free = recording_malloc, recording_free
    try:
        run()
    finally:
        allocator.CachingAllocator.malloc, allocator.CachingAllocator.free = malloc, free
    return events


def test_a_tied_embeddings_gradients_as_autograd_makes_them():
    """Qwen2.5-0.5B (tied), bf16, AdamW: the embedding-sized blocks (151,936 x 896 x 2 B) in the recorded sequence
    and in the ledger's, over two steps. The head's gradient waits in autograd's input buffer through the whole
    backward (B); at its end the lookup's (C) and their sum (D) are made, the head's and the lookup's freed, and
    the sum is the .grad (reserved._tied_sum); AdamW's two states (E, F), one foreach temporary (G), zero_grad
    frees the sum. The recorded sequence also has a transient after the model's build;
    the ledger's earlier sequence kept the head's block as the .grad and made the lookup's as one transient."""
    record = load(next(p for p in TRACES if p.name.startswith("qwen2.5-0.5b-bf16-adamw-norecompute-sdpa-s2048-b2")))
    size = 151_936 * 896 * 2
    assert _sized_events(lambda: replay(record["events"]), size) == [
        "+A", "+B", "-B",  # the model's embedding, a transient after the build
        "+C", "+D", "+E", "-C", "-D", "+F", "+G", "+H", "-H", "-E",  # step 1: states F, G; a temporary H
        "+I", "+J", "+K", "-I", "-J", "+L", "-L", "-K"]  # step 2 (the run's end, recorded before, is not now)
    assert _sized_events(_ledger_replay(record), size) == [
        "+A",
        "+B", "+C", "+D", "-B", "-C", "+E", "+F", "+G", "-G", "-D",
        "+H", "+I", "+J", "-H", "-I", "+K", "-K", "-J"]


def _most_live(events: list[str]) -> int:
    live = most = 0
    for e in events:
        live += 1 if e[0] == "+" else -1
        most = max(most, live)
    return most


def test_a_tied_embeddings_sum_counts_each_gradient_once():
    """The tied sum (reserved._tied_sum) by hand, Qwen2.5-0.5B (tied): at the lookup's backward the embedding-sized
    blocks are the weight, the head's gradient (held in autograd's input buffer), the lookup's and their sum
    (torch 2.13 input_buffer.cpp accumulate, out of place): 4, never 5 (a head gradient counted both as a head
    tensor and as the held one would make 5). With two micro-batches the second's sum is added into the .grad
    in place and freed (accumulate_grad.h accumulateGrad, `variable_grad += new_grad`): 5 then, the .grad one of
    them. Under AMP (fp32 weights and gradients) the recorded sequence is the bf16 one: the head's gradient
    reaches the buffer through the cast's backward and is still summed out of place, as the ledger has it."""
    from estimator import estimate_config
    from estimator.memory import reserved
    from estimator.memory.memory import _stage_memo, static_key
    V, h = 151_936, 896
    amp = load(next(p for p in TRACES if p.name.startswith("qwen2.5-0.5b-amp-adamw-recompute-sdpa-s4096-b1")))
    recorded = _sized_events(lambda: replay(amp["events"]), V * h * 4)
    assert recorded[3:13] == ["+C", "+D", "+E", "-C", "-D", "+F", "+G", "+H", "-H", "-E"]  # step 1, as in bf16
    ledger = _sized_events(_ledger_replay(amp), V * h * 4)
    assert ledger[:11] == ["+A", "+B", "+C", "+D", "-B", "-C", "+E", "+F", "+G", "-G", "-D"]
    # at the sum: the weight A (made before the recorded slice), the head's, the lookup's and the sum
    assert _most_live(recorded[3:8]) + 1 == _most_live(ledger[:6]) == 4

    config = json.loads((TRACES[0].parents[1] / "gpu" / "qwen2.5-0.5b-bf16-adamw-norecompute-sdpa-s2048-b2.json")
                        .read_text())["config"]
    config["training"]["global_batch_size"] = 4  # two micro-batches of 2
    estimate = estimate_config(config)
    cfg, sp = estimate.config, estimate.config.stages[0]
    static = _stage_memo(cfg).get(static_key(sp, cfg.training))
    # a tied model's head tensors hold no head matrix: its gradient is the held one alone
    assert [t.role for t in cfg.architecture.head_tensors()] == ["vector"]
    events = _sized_events(lambda: reserved._replayed(cfg, estimate._shared, sp, static), V * h * 2)
    assert events[:12] == ["+A",
                           "+B", "+C", "+D", "-B", "-C",  # micro-batch 1: the sum D becomes the .grad
                           "+E", "+F", "+G", "-E", "-F", "-G"]  # micro-batch 2: G added into D, then freed
    assert _most_live(events[:12]) == 5  # the weight, the .grad, the head's, the lookup's, the sum


def _segment_counts(run) -> dict[int, int]:
    """How many segments of each size in MiB `run` makes the caching allocator map."""
    from collections import Counter
    return dict(Counter(size // MiB for size in _sizes_seen(run, "_new_segment")))


@pytest.mark.parametrize("case, scores_mib, replayed, ledger_alone", [
    # eager: the bf16 scores 71 x 2048^2 x 2 B = 568 MiB; the GPU's segments at the step's end hold 22 of them
    ("falcon-7b-8layers-bf16-adamw-norecompute-eager-s2048-b1", 568, 22, 15),
    # SDPA's math backend: the fp32 scores 1,136 MiB; the GPU's 19
    ("falcon-7b-8layers-bf16-adamw-norecompute-sdpa-s2048-b1", 1136, 20, 16),
])
def test_falcons_layer_maps_the_gpus_score_segments(case, scores_mib, replayed, ledger_alone):
    """Falcon-7B's layer request by request (reserved_falcon.py): its sizes by hand (s 2048, b 1, h 4,544, 71 query
    heads and one key/value head of 64, f 18,176, bf16), and the score-sized segments the replay maps beside the
    GPU's (measured.segments) and beside what the ledger's kept tensors alone mapped (15 and 16: every hidden-sized
    tensor then took a segment of its own, 26 of 18 MiB and 16 of 72 MiB on the eager run, where the GPU has none:
    its hidden-sized tensors are cut from the score-sized blocks the layer's transients leave cached)."""
    from estimator import estimate_config
    from estimator.memory import reserved
    from estimator.memory.memory import _stage_memo, static_key
    from estimator.memory.reserved_falcon import program
    record = json.loads((GPU / f"{case}.json").read_text())
    gpu = sum(s[0] == scores_mib * MiB for s in record["measured"]["segments"])
    estimate = estimate_config(record["config"])
    cfg, sp = estimate.config, estimate.config.stages[0]
    z = program(cfg)
    assert (z.hidden, z.fused, z.q, z.kv) == (2048 * 4544 * 2, 2048 * 73 * 64 * 2, 2048 * 71 * 64 * 2, 2048 * 64 * 2)
    assert (z.scores, z.ffn, z.mask, z.sdpa) == (71 * 2048 ** 2 * 2, 2048 * 18176 * 2, 0, case.endswith("sdpa-s2048-b1"))
    static = _stage_memo(cfg).get(static_key(sp, cfg.training))
    counts = _segment_counts(lambda: reserved._replayed(cfg, estimate._shared, sp, static))
    assert (counts[scores_mib], gpu) == (replayed, replayed if scores_mib == 568 else 19)
    assert ledger_alone < gpu
    if scores_mib == 568:
        assert counts.get(18, 0) == 4 and counts.get(72, 0) == 0  # 26 and 16 before; the GPU's 0 and 0


@pytest.mark.parametrize("case, allocated, reserved", [
    ("falcon-7b-8layers-bf16-adamw-norecompute-eager-s2048-b1", 0.0002, -0.0044),
    ("falcon-7b-8layers-bf16-adamw-norecompute-eager-s2048-b1-drop10", 0.0001, -0.0011),
    ("falcon-7b-8layers-bf16-adamw-norecompute-sdpa-s2048-b1", 0.0001, 0.0393),
    ("falcon-7b-8layers-bf16-adamw-norecompute-sdpa-s1024-b2", 0.0002, -0.0071),
    ("falcon-7b-8layers-bf16-adamw-recompute-eager-s4096-b1-drop10", -0.0012, 0.0924),
])
def test_falcons_layer_replays_the_gpus_allocated_peak(case, allocated, reserved):
    """The replay's own peaks against the H200's (reserved_falcon.py): with the gradients of the layer's activations
    made as autograd makes them, the replay's allocated peak is max_memory_allocated's to 0.02% without recompute
    (0.12% under with it), where the ledger's kept tensors alone, with no activation's gradient, stood 4.6% under on
    the eager s2048 run, 9.9% on SDPA's and 22.7% with recompute; its
    reserved peak the GPU's within 0.8% but on SDPA's s2048 run and the recompute run (REPLAY_MISSES: the tied head's
    build transient)."""
    from estimator import estimate_config
    from estimator.memory import reserved as replay
    from estimator.memory.memory import _stage_memo, static_key
    record = json.loads((GPU / f"{case}.json").read_text())
    estimate = estimate_config(record["config"])
    cfg, sp = estimate.config, estimate.config.stages[0]
    static = _stage_memo(cfg).get(static_key(sp, cfg.training))
    made = []
    init = replay._Program.__init__

    def recording(self, *args):
        init(self, *args)
        made.append(self)
    replay._Program.__init__ = recording
    try:
        replay._replayed(cfg, estimate._shared, sp, static)
    finally:
        replay._Program.__init__ = init
    allocator, measured = made[0].allocator, record["measured"]
    assert round(allocator.allocated_peak / measured["peak_bytes"] - 1, 4) == allocated
    assert round(allocator.reserved_peak / measured["reserved_peak_bytes"] - 1, 4) == reserved


def _large_requests(run, least: int = 4 << 30) -> list[int]:
    """The sizes in MiB of the requests of `least` bytes or more that `run` makes the caching allocator see, in
    order."""
    return [size // MiB for size in _sizes_seen(run, "malloc") if size >= least]


FALLBACK_517 = ["falcon-h1-0.5b-bf16-adamw-norecompute-sdpa-s4096-b2", "falcon-h1-0.5b-bf16-adamw-recompute-sdpa-s16384-b1"]


@pytest.mark.parametrize("case", FALLBACK_517)
def test_the_mamba_scans_products_as_recorded(case):
    """Falcon-H1-0.5B on transformers 5.17's torch fallback (ssm_kernels 'torch_5.17'): the requests of 4 GiB and
    more over two steps, in order, in the fake-tensor harness's recorded sequence (validation/allocator_trace.py
    --fallback) and in the ledger's (reserved_mamba.py), request for request: per layer's forward the products of G,
    Y_diag, states, new_states and C_times_states (at s16384 b1, chunks of 128, 24 heads of 64, state 128: 24,576,
    12,288, 12,288, 12,480 and 12,288 MiB; with recompute again in backward), then per layer's backward each
    product's two operand gradients, the last product's first."""
    record = load(TRACES[0].parent / f"{case}.json.gz")
    recorded = _large_requests(lambda: replay(record["events"]))
    ledger = _large_requests(_ledger_replay(record))
    if case.endswith("s16384-b1"):
        G, Y, S, N = 24576, 12288, 12288, 12480
        layer = [G, Y, S, N, S]
        assert recorded[:5] == layer and recorded[36 * 5:36 * 5 + 15] == layer + [S, S, N, N, S, S, Y, Y, G, G]
        assert len(recorded) == 2 * 36 * (5 + 5 + 10)
    else:  # s4096 b2: 12,288, 6,144 and 6,144 MiB (new_states, 433 MiB, below 4 GiB)
        assert recorded[:4] == [12288, 6144, 6144, 6144] and len(recorded) == 2 * 36 * (4 + 8)
    assert ledger == recorded


def test_a_hybrid_replays_only_on_the_mamba2_torch_fallback():
    """The replay takes a Mamba-2 hybrid on transformers' torch fallback (reserved.py torch_mamba2); on the fused
    kernels (whose temporaries the replay does not model) and for Jamba's Mamba-1 mixers it keeps the flat share."""
    from estimator import estimate_config
    record = json.loads((GPU / "falcon-h1-0.5b-bf16-adamw-norecompute-sdpa-s4096-b2.json").read_text())
    config = record["config"]
    assert config["training"]["ssm_kernels"] == "torch_5.17"
    replayed = estimate_config(config).stages[0].component("fragmentation")
    assert replayed.formula.startswith("caching allocator replayed over two HF Trainer steps")
    config["training"]["ssm_kernels"] = "fused"
    fused = estimate_config(config)
    assert fused.stages[0].cache is None and fused.stages[0].component("fragmentation").formula.endswith(
        "a hybrid model on its fused kernels, or a Mamba-1 or Gated DeltaNet mixer (the replay is measured on "
        "Mamba-2 hybrids on transformers' torch fallback)")
    jamba = {"model": "jamba-mini-1.5", "training": {"framework": "hf", "seq_len": 1024, "ssm_kernels": "torch"},
             "hardware": {"gpu": "h200"}}
    assert estimate_config(jamba).stages[0].cache is None
    assert "models/falcon_h1/modeling_falcon_h1.py" in replayed.source and "reserved_mamba.py" in replayed.source


def test_a_partial_rotary_embeddings_temporaries_as_recorded():
    """Pythia-1.4B (GPT-NeoX, rotary_pct 0.25: 32 of each head's 128 dims turn), bf16, s 4096, b 2: the ledger's
    layer makes the rotation's temporaries (reserved_layers.py `rotation`) of 8,192 tokens x 16 heads x 32 dims x 2 B
    = 8 MiB (x * cos, rotate_half's cat, times sin, their sum) and 4 MiB (rotate_half's -x2), for q, then k, each sum
    freed as its cat with the unrotated rest (the kept q and k) exists. In step 1's forward the 8 MiB and 4 MiB
    blocks come and go event for event as in the recorded sequence (the eight 2,048 x 2,048 weights first; the
    backward's, which the ledger does not make, after). Without them the replay was -11.2% (REPLAY_MISSES' note)."""
    from estimator.memory.reserved_layers import layer
    record = load(next(p for p in TRACES if p.name.startswith("pythia-1.4b-8layers-bf16-adamw-norecompute-sdpa-s4096-b2")))
    estimate = __import__("estimator").estimate_config(json.loads((GPU / f"{record['id']}.json").read_text())["config"])
    dense = layer(estimate.config, estimate._shared, "dense")
    assert dense.rotary == (8 * MiB, 8 * MiB) and dense.rotary_requests == 1
    assert dense.sizes[dense.rotary_at] == 64 * MiB  # q and k after the rotation, one request of the ledger's
    one = 7  # x * cos, rotate_half's cat, that times sin (the cat freed), the sum (the products freed)
    recorded = _sized_events(lambda: replay(record["events"]), 8 * MiB)
    ledger = _sized_events(_ledger_replay(record), 8 * MiB)
    forward = 8 + 8 * 2 * (one + 1)  # the weights, then per layer q's and k's rotation and their sums freed
    assert ledger[:forward] == recorded[:forward] and len(ledger) < len(recorded)
    assert ledger[8:24] == ["+I", "+J", "+K", "-J", "+L", "-I", "-K",  # layer 1: q's rotation (`one`),
                            "+M", "+N", "+O", "-N", "+P", "-M", "-O",  # k's,
                            "-L", "-P"]  # each sum freed as its cat with the rest exists
    halves = _sized_events(_ledger_replay(record), 4 * MiB)  # made and freed at once: q's and k's, 8 layers, 2 steps
    assert halves == [e for i in range(2 * 8 * 2) for e in ("+" + chr(65 + i), "-" + chr(65 + i))]
    assert _sized_events(lambda: replay(record["events"]), 4 * MiB)[:32] == halves[:32]


def test_falcons_own_layer_is_falcons_gelu_mlp_only():
    """reserved_falcon.program's layer has Falcon's two MLP matrices (dense_h_to_4h, GELU, dense_4h_to_h): a Falcon
    configuration edited to a gated MLP (three matrices; found by fuzzing, a traceback unpacking them) takes the
    ledger's general sequence, and so does an MoE one."""
    import dataclasses

    from estimator import estimate_config
    from estimator.memory.reserved_falcon import program
    record = json.loads((GPU / "falcon-7b-8layers-bf16-adamw-norecompute-eager-s2048-b1-drop10.json").read_text())
    cfg = estimate_config(record["config"]).config
    assert program(cfg) is not None
    gated = dict(record["config"], model=dict(record["config"]["model"], gated_mlp=True))
    assert program(estimate_config(gated).config) is None
    assert estimate_config(gated).reserved_peak_bytes > estimate_config(gated).allocated_peak_bytes
    assert program(dataclasses.replace(cfg, architecture=dataclasses.replace(
        cfg.architecture, num_experts=8, num_experts_per_token=2, moe_intermediate_size=1024))) is None


def test_empty_cache_gives_back_the_whole_free_segments_only():
    """torch.cuda.empty_cache (CUDACachingAllocator.cpp release_cached_blocks -> release_blocks): a free block that is
    a whole segment goes back to the driver; a segment holding a live block stays, its free rest cached. By hand:
    two 30 MiB requests (a segment each: over 10 MiB, rounded to 2 MiB), a 4 MiB one (a 20 MiB segment, split), the
    first and the 4 MiB freed: empty_cache gives back the first 30 MiB segment and the 20 MiB one."""
    from estimator.memory.allocator import EMPTY_CACHE, CachingAllocator, replay
    a = CachingAllocator()
    first, second, small = a.malloc(30 * MiB), a.malloc(30 * MiB), a.malloc(4 * MiB)
    assert (a.reserved, a.segments) == (80 * MiB, 3)
    a.free(first)
    a.free(small)
    a.empty_cache()
    assert (a.reserved, a.segments, a.reserved_peak) == (30 * MiB, 1, 80 * MiB)
    again = a.malloc(4 * MiB)  # no cached block left: a new 20 MiB segment
    assert (a.reserved, a.segments) == (50 * MiB, 2) and again not in (first, small)
    # replay's EMPTY_CACHE event: a 30 MiB segment freed and given back before a 40 MiB request, 40 MiB reserved at
    # the peak; cached instead, 70
    events = [(1, 30 * MiB), (1, -30 * MiB), (EMPTY_CACHE, 0), (2, 40 * MiB)]
    assert replay(events).reserved_peak == 40 * MiB
    assert replay([e for e in events if e[0] is not EMPTY_CACHE]).reserved_peak == 70 * MiB
