"""Work that does not grow with the sizes a configuration names.

An estimate reads the layer pattern as counts per kind over each pipeline chunk, in closed form,
never one entry per layer: a `num_layers` of 10**9 costs what 32 layers cost. The counts must equal
counting the layers one by one, which the property tests below do. The huge cases run in a
subprocess with a time limit, so a regression fails instead of hanging the suite.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from collections import Counter
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import given, settings, strategies as st

from estimator import Architecture, Parallel
from estimator.spec.architecture import congruent_in, congruent_in_both
from estimator.memory.sharding import chunk_kind_counts, stage_layer_chunks, stage_layer_indices, stage_parameters

ROOT = Path(__file__).resolve().parent.parent
LIMIT_S = 20

# h 64, 4 heads of 16, 2 KV heads, SwiGLU 128 wide; 4 experts (top-2) 32 wide, no bias, RMSNorm
BASE = Architecture(name="pattern", hidden_size=64, num_layers=8, num_attention_heads=4, num_kv_heads=2,
                    intermediate_size=128, vocab_size=1000, num_experts=4, num_experts_per_token=2,
                    moe_intermediate_size=32)


def is_moe(i: int, first: int, freq: int) -> bool:
    """The pattern as DeepSeek and Megatron state it: dense below first_k_dense_replace, then every
    freq-th layer."""
    return i >= first and (i - first) % freq == 0


def is_windowed(i: int, pattern: int) -> bool:
    """Gemma's sliding_window_pattern: every pattern-th layer is global, 0 = all slide."""
    return pattern == 0 or (i + 1) % pattern != 0


def run_bounded(code: str) -> dict:
    """Run `code` in a fresh interpreter within LIMIT_S seconds; it prints one JSON object."""
    try:
        done = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=ROOT, capture_output=True,
                              text=True, timeout=LIMIT_S)
    except subprocess.TimeoutExpired:
        pytest.fail(f"did not return within {LIMIT_S} s: the work grows with a size it should not")
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


# --- closed form = counting --------------------------------------------------------------------------

@given(start=st.integers(-50, 200), length=st.integers(-5, 200), residue=st.integers(-30, 30),
       modulus=st.integers(1, 25))
def test_congruent_in_counts_the_residue_class(start, length, residue, modulus):
    stop = start + length
    assert congruent_in(start, stop, residue, modulus) == sum(
        1 for i in range(start, stop) if i % modulus == residue % modulus)


@given(start=st.integers(0, 150), length=st.integers(0, 150), r1=st.integers(0, 30), m1=st.integers(1, 12),
       r2=st.integers(0, 30), m2=st.integers(1, 12))
def test_congruent_in_both_counts_the_intersection(start, length, r1, m1, r2, m2):
    stop = start + length
    assert congruent_in_both(start, stop, (r1, m1), (r2, m2)) == sum(
        1 for i in range(start, stop) if i % m1 == r1 % m1 and i % m2 == r2 % m2)


@given(first=st.integers(0, 40), freq=st.integers(1, 12), start=st.integers(0, 120), length=st.integers(0, 120))
def test_moe_layers_of_a_range_equal_counting_them(first, freq, start, length):
    stop = start + length
    arch = replace(BASE, num_layers=max(first, stop, 1), first_dense_layers=first, moe_layer_frequency=freq)
    moe = sum(1 for i in range(start, stop) if is_moe(i, first, freq))
    assert arch.moe_layers_in(start, stop) == moe
    expected = tuple((kind, n) for kind, n in (("dense", length - moe), ("moe", moe)) if n)
    assert arch.kind_counts(start, stop) == expected
    assert arch.num_moe_layers == sum(1 for i in range(arch.num_layers) if is_moe(i, first, freq))


@given(first=st.integers(0, 30), freq=st.integers(1, 8), window=st.sampled_from([None, 4]),
       pattern=st.integers(0, 9), start=st.integers(0, 100), length=st.integers(0, 100))
def test_layer_variants_of_a_range_equal_counting_them(first, freq, window, pattern, start, length):
    stop = start + length
    arch = replace(BASE, num_layers=max(first, stop, 1), first_dense_layers=first, moe_layer_frequency=freq,
                   sliding_window=window, sliding_window_pattern=pattern)
    variants = Counter(("moe" if is_moe(i, first, freq) else "dense", bool(window) and is_windowed(i, pattern))
                       for i in range(start, stop))
    assert arch.variant_counts(start, stop) == dict(variants)
    assert arch.global_attention_layers_in(start, stop) == sum(n for (_, windowed), n in variants.items()
                                                               if not windowed)


@settings(max_examples=200)
@given(pp=st.integers(1, 4), vpp=st.integers(1, 3), per_chunk=st.integers(1, 5), first=st.integers(0, 30),
       freq=st.integers(1, 6), skip=st.integers(0, 40))
def test_stage_kind_counts_equal_counting_the_stage_layers(pp, vpp, per_chunk, first, freq, skip):
    vpp = 1 if pp == 1 else vpp
    layers = pp * vpp * per_chunk
    arch = replace(BASE, num_layers=layers, first_dense_layers=min(first, layers), moe_layer_frequency=freq)
    par = Parallel(pp=pp, vpp=vpp)
    stages = stage_parameters(arch, par, "megatron")
    for stage, chunks, indices in zip(stages, stage_layer_chunks(arch, par), stage_layer_indices(arch, par)):
        # full recompute stores the layers after the first `skip` the rank runs
        kinds = ["moe" if is_moe(i, arch.first_dense_layers, freq) else "dense" for i in indices[skip:]]
        expected = tuple((kind, kinds.count(kind)) for kind in ("dense", "moe") if kinds.count(kind))
        assert chunk_kind_counts(arch, chunks, skip) == expected
        assert stage.chunks == chunks and chunk_kind_counts(arch, chunks) == stage.kind_counts


# --- a billion layers ---------------------------------------------------------------------------------

def test_a_billion_layers_are_sharded_instantly():
    # first_dense_layers 3, moe_layer_frequency 2: the MoE layers are the odd ones from 3 on.
    # pp 4 x vpp 5 = 20 chunks of 5 x 10**7 layers; rank r runs chunks r, r + 4, ..., r + 16.
    out = run_bounded("""
        import json
        from dataclasses import replace
        from estimator import Architecture, Parallel, parameter_counts
        from estimator.memory.sharding import chunk_kind_counts, stage_parameters
        small = Architecture(name="pattern", hidden_size=64, num_layers=8, num_attention_heads=4, num_kv_heads=2,
                             intermediate_size=128, vocab_size=1000, num_experts=4, num_experts_per_token=2,
                             moe_intermediate_size=32, first_dense_layers=3, moe_layer_frequency=2)
        arch = replace(small)
        object.__setattr__(arch, "num_layers", 10**9)  # past any bound the field checks put on it
        stages = stage_parameters(arch, Parallel(pp=4, vpp=5), "megatron")
        counts = parameter_counts(arch)
        print(json.dumps({
            "kinds": [dict(s.kind_counts) for s in stages],
            "stage_1_local": stages[1].local,
            "after_3": dict(chunk_kind_counts(arch, stages[0].chunks, skip=3)),
            "after_chunk_0": dict(chunk_kind_counts(arch, stages[0].chunks, skip=5 * 10**7 + 1)),
            "total": counts.total, "active": counts.active,
        }))
    """)
    # chunk [0, 5e7) holds the odd layers but layer 1: 25,000,000 - 1 MoE; any other chunk starts
    # on an even layer and holds 25,000,000 odd ones.
    assert out["kinds"][0] == {"dense": 125_000_001, "moe": 124_999_999}
    assert out["kinds"][1:] == [{"dense": 125_000_000, "moe": 125_000_000}] * 3
    # layers 0, 1, 2 are dense
    assert out["after_3"] == {"dense": 124_999_998, "moe": 124_999_999}
    # all of chunk 0, then layer 2 x 10**8 (even, dense), of the rank's chunks 0, 4, 8, 12, 16
    assert out["after_chunk_0"] == {"dense": 99_999_999, "moe": 100_000_000}
    # One layer by hand: q 64x64, k and v 32x64, o 64x64 = 12,288; two RMSNorms 128.
    # Dense: SwiGLU 3 x 64 x 128 = 24,576 -> 36,992. MoE: router 4 x 64 = 256, experts 4 x 3 x 64 x 32
    # = 24,576 -> 37,248.
    dense, moe = 12_288 + 128 + 24_576, 12_288 + 128 + 256 + 24_576
    assert (dense, moe) == (36_992, 37_248)
    assert out["stage_1_local"] == 125_000_000 * (dense + moe)
    # 10**9 layers: 499,999,999 odd ones from 3 on are MoE; embedding 1000 x 64, final norm 64, head
    assert out["total"] == 64_000 + 64 + 64_000 + 500_000_001 * dense + 499_999_999 * moe
    # each MoE layer leaves 2 of its 4 experts (3 x 64 x 32 each) idle per token
    assert out["active"] == out["total"] - 499_999_999 * 2 * 3 * 64 * 32


def test_a_billion_layer_kv_cache_is_counted_instantly():
    out = run_bounded("""
        import json
        from dataclasses import replace
        from estimator import Architecture, Parallel, Training
        from estimator.memory.inference import kv_cache_bytes
        from estimator.memory.sharding import stage_layer_chunks
        arch = Architecture(name="windows", hidden_size=64, num_layers=12, num_attention_heads=4, num_kv_heads=2,
                            intermediate_size=128, vocab_size=1000, sliding_window=4, sliding_window_pattern=6)
        object.__setattr__(arch, "num_layers", 10**9)
        par = Parallel(pp=2)
        chunks = stage_layer_chunks(arch, par)[0]
        kv, _ = kv_cache_bytes(arch, Training(mode="inference", seq_len=1024), par, chunks)
        print(json.dumps({"chunks": [[r.start, r.stop] for r in chunks], "kv": kv}))
    """)
    assert out["chunks"] == [[0, 500_000_000]]
    # layers i with (i + 1) % 6 == 0 attend to all 1024 tokens: 5e8 // 6 = 83,333,333 of them; the
    # other 416,666,667 keep a window of 4. Per layer: 2 (K, V) x 2 KV heads x 16 x tokens x 2 B.
    assert out["kv"] == 83_333_333 * (2 * 2 * 16 * 1024 * 2) + 416_666_667 * (2 * 2 * 16 * 4 * 2)


# --- divisors in an error message -------------------------------------------------------------------

def test_divisors_of_a_huge_size_are_named_not_listed():
    out = run_bounded("""
        import json
        from estimator.memory.validation import _divisors
        print(json.dumps({"huge": _divisors(10**12 + 39), "64": _divisors(64), "36": _divisors(36),
                          "720720": _divisors(720720), "prime": _divisors(999_983)}))
    """)
    assert out["huge"] == "a divisor of 1000000000039"
    assert out["64"] == "1, 2, 4, 8, 16, 32, 64"
    assert out["36"] == "1, 2, 3, 4, 6, 9, 12, 18, 36"
    assert out["720720"] == "a divisor of 720720"  # 240 divisors: more than a message lists
    assert out["prime"] == "1, 999983"


def test_the_memo_is_bounded_in_bytes_and_drops_the_least_recently_used():
    """What architectures remember (estimator/spec/memo.py) is bounded in bytes, not entries: values of
    very different sizes, the least recently used dropped first, a value read again kept."""
    from estimator.spec.memo import ENTRY_BYTES, Memo, deep_bytes

    memo = Memo(limit_bytes=100_000)
    small, large = [("small", i) for i in range(40)], [("large", i) for i in range(3)]
    for key in small:
        memo.put(key, key[1])  # ints: ENTRY_BYTES + 28 bytes each
    assert memo.bytes == 40 * (ENTRY_BYTES + 28) and len(memo) == 40
    memo.lookup(("small", 0))  # read: now the most recently used
    for key in large:
        memo.put(key, bytes(30_000), kind="blob")
    # three blobs and 40 small values are over 100,000 bytes: the small ones least recently used
    # went, as many as needed, and no more
    assert memo.bytes <= 100_000 and all(key in memo for key in large) and ("small", 0) in memo
    assert [i for i in range(40) if ("small", i) not in memo] == list(range(1, 17))
    # a blob's bytes as Python counts them (the first values of a kind are measured)
    assert deep_bytes(bytes(30_000)) == 30_033 and deep_bytes((bytes(10), bytes(10))) == 2 * 43 + 56
    calls = []
    assert memo.get(("small", 1), lambda: calls.append(1) or "again") == "again" and calls == [1]


def test_a_configurations_own_values_never_push_out_what_layouts_share(monkeypatch):
    """`per_layout` values (one whole configuration's, resolved.resolve) have a pool of their own,
    bounded alike: a layout search making hundreds of thousands of them keeps the ledgers and stage
    parts its layouts share."""
    import dataclasses

    from estimator.spec import memo
    from estimator.models.presets import get_architecture

    monkeypatch.setattr(memo, "PER_LAYOUT", memo.Memo(100_000))
    arch = dataclasses.replace(get_architecture("llama-3.1-8b"))
    arch.cached(("shared",), lambda: "kept")
    for i in range(5_000):
        arch.cached(("layout", i), lambda i=i: i, per_layout=True)
    assert arch.cached(("shared",), lambda: "computed again") == "kept"
    assert memo.PER_LAYOUT.bytes <= 100_000 < 5_000 * memo.ENTRY_BYTES
    assert arch.cached(("layout", 0), lambda: -1, per_layout=True) == -1  # the oldest was dropped
    assert arch.cached(("layout", 4_999), lambda: -1, per_layout=True) == 4_999


def test_memory_over_100_distinct_models_stays_within_the_memos_bound(monkeypatch):
    """Issue #26: 100 distinct Hub-like models (bench/bench_memory.py), each estimated on four
    layouts and its roofline drawn, every architecture kept alive as a server's caches keep them:
    the memo stays within its byte limit, its count of its bytes is close to what tracemalloc sees
    the heap gain (from 60% of it to 110%: it counts a shared object in each value holding it, and
    not the dict slots of its own bookkeeping exactly), the oldest models' values are dropped, and
    the heap grows by no more than the two pools' limits, and once they are full, hardly at all (a
    configuration's own values count the training setups and layouts their keys hold: memo.key_bytes)."""
    import gc
    import tracemalloc

    from estimator.spec import memo
    sys.path.insert(0, str(ROOT / "bench"))
    from bench_memory import hub_like, session

    limit = 3 * 2**20
    monkeypatch.setattr(memo, "SHARED", memo.Memo(limit))
    monkeypatch.setattr(memo, "PER_LAYOUT", memo.Memo(limit // 3, count_keys=True))
    # the remembered ids of the pools set aside: a dict as large as the earlier tests made it would resize
    # within the measurement (1.3 MB after tests/test_published_finetune.py's 72B models)
    monkeypatch.setattr(memo, "_HELD", {})
    kept = [hub_like(i) for i in range(100)]
    session(kept[0])  # what the first estimate sets up once (kernel tables, presets' records)
    gc.collect()
    tracemalloc.start()
    try:
        base, counted_before = tracemalloc.get_traced_memory()[0], memo.SHARED.bytes + memo.PER_LAYOUT.bytes
        for arch in kept[1:11]:  # below the limit: the count against what the heap holds
            session(arch)
        gc.collect()
        held = tracemalloc.get_traced_memory()[0] - base
        counted = memo.SHARED.bytes + memo.PER_LAYOUT.bytes - counted_before
        assert memo.SHARED.bytes < limit and 0.6 * counted <= held <= 1.1 * counted, (counted, held)
        for arch in kept[11:90]:
            session(arch)
        gc.collect()
        full = tracemalloc.get_traced_memory()[0] - base
        for arch in kept[90:]:  # both pools full: each model's values replace older ones
            session(arch)
        gc.collect()
        grown = tracemalloc.get_traced_memory()[0] - base
    finally:
        tracemalloc.stop()
    assert memo.SHARED.bytes <= limit and memo.PER_LAYOUT.bytes <= limit // 3
    assert memo.PER_LAYOUT.bytes > 0.95 * limit // 3  # full (its keys' configuration records counted)
    assert len({key[0] for key in memo.SHARED._entries}) < 60  # the oldest models' values are gone
    assert grown <= limit * 4 / 3, grown  # the memo's two pools
    assert grown - full <= limit / 20, (full, grown)  # ten more models: about 20 KB measured


def test_a_refused_configuration_is_checked_once_and_raises_a_new_error_each_time(monkeypatch):
    """A search of a model meets the same refused layouts again in every search (about 6,100 of DeepSeek-V3's
    on 2,048 GPUs): their refusal is remembered beside the resolved values (resolved._Refused), so the checks
    run once, and each `resolve` raises a new error with the same message (one error object raised again would
    lengthen its traceback with every raise)."""
    import dataclasses

    from estimator import Training
    from estimator.memory import resolved
    from estimator.models.presets import get_architecture
    from estimator.memory.validation import validate
    from estimator.spec.errors import ConfigError

    arch = dataclasses.replace(get_architecture("llama-3.1-8b"))  # an architecture of its own: nothing remembered
    checked = []
    monkeypatch.setattr(resolved, "validate", lambda *args: checked.append(args) or validate(*args))
    refused = Parallel(tp=3)  # 32 attention heads: TP must divide them
    errors = []
    for _ in range(3):
        with pytest.raises(ConfigError) as caught:
            resolved.resolve(arch, Training(), refused)
        errors.append(caught.value)
    assert len(checked) == 1
    assert len({id(e) for e in errors}) == 3 and len({str(e) for e in errors}) == 1
    assert errors[0].field == "parallel.tp" and "tp" in str(errors[0])
    assert all(len(list(_frames(e.__traceback__))) == len(list(_frames(errors[0].__traceback__))) for e in errors)


def _frames(tb):
    while tb is not None:
        yield tb
        tb = tb.tb_next


@pytest.mark.parametrize("model, framework, layout", [("llama-3.1-8b", "fsdp2", dict(dp=8)),
                                                     ("qwen3-30b-a3b", "megatron", dict(dp=8, ep=8))])
def test_a_parts_bytes_leave_out_the_parts_it_holds_which_count_once(monkeypatch, model, framework, layout):
    """The stage memos count each part's bytes as it is added (memory._StageMemo), and a part that holds another
    counts none of it: a static part holds its step part (static_stage.StepPart: model states and transients) and
    the MoE moments of its setup, a step part its workspaces, each a part of its own. So a part's bytes are its
    walk's with the parts it holds (Python's sizes, `memo.deep_bytes`) less theirs, and one part's bookkeeping."""
    import dataclasses

    from estimator import Hardware, Training
    from estimator.memory import memory
    from estimator.memory.static_stage import StepPart, _StaticStage
    from estimator.models.presets import get_architecture
    from estimator.spec import memo

    monkeypatch.setattr(memo, "SHARED", memo.Memo(2**30))  # measures the first parts of each kind exactly
    # nothing held by the memos of the tests before (their objects' ids may be reused by this one's)
    monkeypatch.setattr(memo, "_HELD", {})
    grown: dict[object, tuple] = {}  # part's key -> (the part, the bytes the memo grew by)
    add = memory._StageMemo.__setitem__

    def counted(self, part, value):
        before = memo.SHARED.bytes
        add(self, part, value)
        grown[part] = (value, memo.SHARED.bytes - before)

    monkeypatch.setattr(memory._StageMemo, "__setitem__", counted)
    arch = dataclasses.replace(get_architecture(model))
    memory.device_total(arch, Training(framework=framework), Parallel(**layout), Hardware("h100-80"))
    [(step, step_bytes)] = [v for v in grown.values() if type(v[0]) is StepPart]
    [(static, static_bytes)] = [v for v in grown.values() if type(v[0]) is _StaticStage]
    [moments] = [v for k, (v, _) in grown.items() if k[0] == "moments"]
    workspaces = [v for k, (v, _) in grown.items() if k[0] in ("workspaces", "wgrad cache")]
    assert static.step is step and all(any(w is c for c in step.tr.persistent) for w in workspaces)
    one_part = memo.PART_BYTES + memo.HELD_BYTES
    # both walks also meet a few constants Python shares (False, an int, an interned label, the empty tuple: 234
    # bytes in one run), which each counts; counting a held part again would add its bytes, more than this slack
    slack = 512
    for part, nbytes, holds in ((step, step_bytes, workspaces), (static, static_bytes, [step, moments])):
        together = _walk_with(monkeypatch, part, holds)
        own = together - sum(memo.deep_bytes(h) for h in holds)
        assert own + one_part <= nbytes <= own + one_part + slack, (type(part), nbytes, together, own)
    assert memo.deep_bytes(step) > 2 * slack and (framework != "megatron" or memo.deep_bytes(moments) > 2 * slack)


def _walk_with(monkeypatch, part, holds) -> int:
    """`memo.deep_bytes(part)` counting the parts `holds` too (as if they were not remembered)."""
    from estimator.spec import memo

    with monkeypatch.context() as m:
        for held in holds:
            m.delitem(memo._HELD, id(held))
        return memo.deep_bytes(part)


def _deep(framework: str, layers: int, parallel: dict, batch: int = 8) -> dict:
    return {"model": {"hidden_size": 256, "num_layers": layers, "num_attention_heads": 4, "intermediate_size": 512,
                      "vocab_size": 1024},
            "training": {"framework": framework, "seq_len": 128, "global_batch_size": batch}, "parallel": parallel}


@pytest.mark.parametrize("framework, parallel", [("hf", {"dp": 8}), ("deepspeed", {"dp": 8, "zero_stage": 3}),
                                                 ("megatron", {"dp": 8, "zero_stage": 1})])
def test_the_allocator_replays_walk_a_bounded_number_of_layers(framework, parallel):
    """Each replay walks every layer's requests in Python (a 4,096-layer stage: 10 s for the HF Trainer's, 15 s under
    ZeRO-3, 45 s over Megatron's eight optimizer ranks, found by fuzzing the CLI), and the public server answers an
    estimate inline: a stage deeper than reserved.MAX_REPLAYED_LAYERS takes the flat share and says why."""
    from estimator import estimate_config
    from estimator.memory.reserved import MAX_REPLAYED_LAYERS

    assert MAX_REPLAYED_LAYERS == 1024  # eight times the deepest published decoder (Llama 3.1 405B, 126 layers)
    deep = estimate_config(_deep(framework, MAX_REPLAYED_LAYERS + 1, parallel)).stages[0].component("fragmentation")
    assert deep.formula.endswith("a stage of 1,025 layers (the replay walks at most 1,024)")
    assert "replayed" in estimate_config(_deep(framework, 8, parallel)).stages[0].component("fragmentation").formula


def test_megatrons_replay_walks_fewer_ranks_of_a_deep_stage():
    """Under the distributed optimizer the replay walks each data-parallel rank's cut of the main parameters, up to
    8 ranks and 64 micro-batches over them, and at most MAX_LAYER_WALKS layers x micro-batches: 512 layers x 8
    micro-batches leave 2 ranks (the first and the last), 8 layers all 8."""
    from estimator.memory import megatron_replay
    from estimator.memory.resolved import resolve
    from estimator.models.loading import load_config

    def ranks(layers: int) -> list[int]:
        c = load_config(_deep("megatron", layers, {"dp": 8, "zero_stage": 1}, batch=64))
        cfg = resolve(c.architecture, c.training, c.parallel, c.hardware)
        assert cfg.microbatches == 8
        return megatron_replay._ranks(cfg)

    assert megatron_replay.MAX_LAYER_WALKS == 8192
    assert ranks(8) == list(range(8)) and ranks(512) == [0, 7] and ranks(1024) == [0]
