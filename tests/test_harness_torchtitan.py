"""The torchtitan measuring harness (validation/torchtitan/): a fake-tensor run of torchtitan's own
code equals a real CPU run byte for byte, and every record is complete. Needs torchtitan 0.3.0
(and torchao for float8); the record checks need nothing."""

import pytest

from validation.torchtitan.plugin import HARNESS

CATEGORIES = ("parameters", "gradients", "optimizer_states", "activations")


def test_records_are_complete():
    records = HARNESS.load_all()
    if not records:
        pytest.skip(f"no torchtitan records in {HARNESS.records}")
    for r in records:
        assert r["step_measured"] == 2
        assert r["config"]["training"]["framework"] == "fsdp2"
        assert {"torch", "torchtitan", "torchao"} <= set(r["versions"])
        m = r["measured"]
        assert m["peak_bytes"] == sum(m[c] for c in CATEGORIES)
        assert m["phases"][m["peak_phase"]]["total"] == m["peak_bytes"]
        assert set(m["phases"]) == {"forward", "backward", "optimizer"}
        assert all(isinstance(v, int) for p in m["phases"].values() for v in p.values())
        assert r["command"] == f"python -m validation.torchtitan measure {r['id']}"


def test_records_match_the_cases():
    pytest.importorskip("torch", reason="the case list builds torch runs")
    from validation.torchtitan.cases import CASES, contract_config

    for r in HARNESS.load_all():
        assert r["id"] in CASES
        assert r["config"] == contract_config(CASES[r["id"]])


# --- the harness itself: needs torchtitan ---------------------------------------------------------

def _torchtitan():
    pytest.importorskip("torch", reason="the torchtitan harness needs torch")
    pytest.importorskip("torchtitan", reason="the torchtitan harness needs torchtitan==0.3.0 "
                                             "(pip install torchtitan==0.3.0 triton)")
    from validation.torchtitan import step

    return step


# torchtitan's debug models cut to 2 blocks (llama3: dim 256, 16 heads, vocab 2048), seq 256,
# local batch 2, rank 0 of 8: every saver and parallelism the cases use.
TINY = [
    dict(family="llama3", ac="none"),
    dict(family="llama3", ac="op"),
    dict(family="llama3", ac="full", reshard="never"),
    dict(family="llama3", ac="layer", ac_every=2, layers=4),
    dict(family="llama3", ac="op", tp=2),
    dict(family="llama3", ac="none", cp=2),  # flex on K/V all-gathered over CP; the per-rank block mask
    dict(family="llama3", ac="none", float8="rowwise"),
    dict(family="llama3", ac="none", float8="tensorwise", fp8_all_gather=True),
    dict(family="qwen3", ac="op"),
    dict(family="deepseek_v3", ac="op"),
]


def _tiny(step, spec):
    spec = dict(spec)
    return step.Run(spec.pop("family"), "debugmodel", 8, 256, 2, layers=spec.pop("layers", 2), **spec)


@pytest.mark.parametrize("spec", TINY, ids=lambda s: "-".join(str(v) for v in s.values()))
def test_fake_measurement_equals_real_cpu_run(spec):
    step = _torchtitan()
    if spec.get("float8", "none") != "none":
        pytest.importorskip("torchao", reason="float8 needs torchao")
    run = _tiny(step, spec)
    assert step.measure(run, fake=True) == step.measure(run, fake=False)


def test_model_states_by_hand():
    """llama3 debugmodel, 2 blocks, FSDP over 8: each fp32 parameter is its own 1/8 row shard
    (dim 0, padded to a multiple of 8 rows), rounded to 512 bytes; AdamW keeps two states of the
    same size and a step counter on the device (fused); the sharded gradients of one FSDP group
    (the embedding; norm + lm_head; each block) share the group's reduce-scatter output."""
    step = _torchtitan()
    dim, vocab, hidden = 256, 2048, 768  # compute_ffn_hidden_dim(256, multiple_of=256) = 768
    block = [(3 * dim, dim), (dim, dim), (hidden, dim), (dim, hidden), (hidden, dim), (dim,), (dim,)]
    groups = [[(vocab, dim)], [(dim,), (vocab, dim)], block, block]

    def shard_numel(shape):
        return -(-shape[0] // 8) * (shape[1] if len(shape) > 1 else 1)

    def block_bytes(numel):
        return -(-numel * 4 // 512) * 512

    params = sum(block_bytes(shard_numel(s)) for g in groups for s in g)
    grads = sum(block_bytes(sum(shard_numel(s) for s in g)) for g in groups)
    m = step.measure(_tiny(step, dict(family="llama3")))
    assert all(p["parameters"] == params for p in m["phases"].values())
    assert m["phases"]["optimizer"]["optimizer_states"] == 2 * params + 512 * sum(map(len, groups))
    assert m["phases"]["optimizer"]["gradients"] == grads
    # zero_grad(set_to_none) freed them; in the forward phase only lm_head's exists: the chunked
    # loss runs its backward and reduce-scatters it (alone: the norm has no gradient yet)
    assert m["phases"]["forward"]["gradients"] == block_bytes(shard_numel((vocab, dim)))


# --- what the estimator lists for torchtitan, by hand; each size is a storage of a record's breakdown --------

def _titan(model: str, seq: int, tp: int, dp: int, recompute: str = "full", batch: int = 1, **training):
    from estimator import estimate_config

    return estimate_config({"model": model, "parallel": {"tp": tp, "dp": dp, "zero_stage": 3},
                            "training": {"framework": "fsdp2", "seq_len": seq, "micro_batch_size": batch,
                                         "recompute": recompute, "loss": "chunked", "attention": "flash",
                                         **training}})


def _parts(result, phase: str) -> dict[str, int]:
    components = next(p for p in result.stages[0].phases if p.name == phase).components
    return {q.label: q.bytes for c in components for q in (c.parts or (c,))}


@pytest.mark.parametrize("model, seq, layers, per_position", [
    ("qwen3-32b", 8192, 64, 2 * 128 * 4),  # CosSinRoPE: (s, 2 x head_dim) fp32, 8 MiB a layer (measured: 64 of them)
    ("llama-3.1-70b", 8192, 80, 64 * 8),  # ComplexRoPE: (s, head_dim / 2) complex64, 4 MiB (measured: index of it)
])
def test_one_rope_cache_per_layer(model, seq, layers, per_position):
    caches = _parts(_titan(model, seq, 8, 8), "forward")["RoPE caches (torchtitan, one per layer)"]
    assert caches == layers * seq * per_position == {"qwen3-32b": 536_870_912, "llama-3.1-70b": 335_544_320}[model]


@pytest.mark.parametrize("family", ["llama3", "qwen3", "deepseek_v3"])
def test_rope_caches_are_the_models_buffers(family):
    """The harness's own model (torchtitan's debug models, 2 blocks, seq 256): its rope buffers are the
    formula's: 2 layers x 256 positions x (4 B x dim (ComplexRoPE) or 8 B x dim (CosSinRoPE))."""
    step = _torchtitan()
    run = _tiny(step, dict(family=family))
    _, _, model, _ = step.build(run, fake=True)
    caches = {n: b.numel() * b.element_size() for n, b in model.named_buffers() if n.endswith("rope.cache")}
    assert len(caches) == 2
    cfg = model.config.layers[0].attention.rope
    assert cfg.max_seq_len == 256
    per_position = 8 * cfg.dim if family == "qwen3" else 4 * cfg.dim
    assert sum(caches.values()) == 2 * 256 * per_position


def test_qwen3_32b_tp4_backward_end_by_hand():
    """The record's backward peak (titan-qwen3-32b-w64-tp4-fullac-s8192-b1), storage by storage: a block is
    121,907,456 parameters on a GPU (TP 4), the embedding 151,936 x 5120 / 4 = 194,478,080; the first block
    gathered (bf16, 232.5 MiB) and the embedding unit prefetched for its backward (370.9 MiB); the second
    block's reduce-scatter input (fp32, 465.0 MiB); the first block's input (2 B x 8192 x 5120 / 4); its
    output gradient and its all-gather over TP; the recomputation's end: the down projection's output
    (2 B x 8192 x 5120), its cat for the reduce-scatter, the reduce-scatter output and the MLP norm's output
    (sequence-parallel shards). Gradients: every unit's but the first block's and the embedding's."""
    block, emb = 121_907_456, 151_936 * 5120 // 4
    parts = _parts(_titan("qwen3-32b", 8192, 4, 16), "backward")
    assert parts["The first block and the embedding unit gathered"] == 2 * (block + emb) == 632_771_072
    assert parts["Reduce-scatter input of the block differentiated before"] == 4 * block == 487_629_824
    shard, full = 2 * 8192 * 5120 // 4, 2 * 8192 * 5120
    assert parts["Input of the block not yet differentiated (kept by the checkpoints)"] == shard == 20_971_520
    assert [parts["the block's output gradient (sequence-parallel shard)"], parts["its all-gather over TP"],
            parts["output projection's output (full sequence)"], parts["reduce-scatter's cat of it"],
            parts["reduce-scatter output"], parts["MLP norm output (sequence-parallel shard)"]] == \
        [shard, full, full, full, shard, shard]
    grads = next(c for c in next(p for p in _titan("qwen3-32b", 8192, 4, 16).stages[0].phases
                                 if p.name == "backward").components if c.key == "gradients")
    everything = 4 * 8_191_038_464 / 16  # 4 B x the 8,191,038,464 parameters of a TP rank / d
    assert grads.bytes == round(everything - 4 * (block + emb) / 16)


def test_chunked_loss_ends_with_the_heads_reduce_scatter():
    """Llama-3.1-70B, no TP, FSDP over 64, seq 4096 (titan-llama-3.1-70b-w64-fullac-s4096-b1, forward peak):
    after the 8th chunk FSDP2 allocates the head's fp32 reduce-scatter input (4 B x 128,256 x 8192) beside the
    fp32 gradient accumulated over the chunks (the same size), the last chunk's bf16 logits (512 x 128,256)
    and the head unit gathered (bf16); every block is resharded by then."""
    parts = _parts(_titan("llama-3.1-70b", 4096, 1, 64), "forward")
    head = 128_256 * 8192
    assert parts["LM head's unsharded fp32 gradient, accumulated over the chunks"] == 4 * head == 4_202_692_608
    assert parts["LM head's reduce-scatter input (fp32), after the last chunk"] == 4 * head
    assert parts["the last chunk's logits"] == 2 * 512 * 128_256
    assert parts["Unsharded parameters in flight"] == 2 * head


# --- context parallelism (torchtitan's flex path: K/V all-gathered over CP) ------------------------------------

def test_context_parallel_keeps_the_all_gathered_keys_and_values():
    """Llama-3.1-8B (32 layers, g x d_head = 8 x 128 = 1024), torchtitan fsdp2, no AC: with CP 2 at 16k a rank
    keeps its 8192 queries' tensors, as the layer at 8192 tokens without CP does, except K and V: flex
    attention saves them all-gathered over CP, the whole 16384 positions (CP_FLEX_SOURCE), 2 B x 2 x
    (16384 - 8192) x 1024 = 32 MiB more a layer."""
    from canonical import LLAMA_31_8B as arch
    from estimator import Parallel, Training
    from estimator.memory.activations.layer import layer_entries

    t16, t8 = Training(framework="fsdp2", seq_len=16384), Training(framework="fsdp2", seq_len=8192)
    cp2 = {e.name: e.bytes(Parallel(cp=2)) for e in layer_entries(arch, t16, Parallel(cp=2), "dense")}
    one = {e.name: e.bytes(Parallel()) for e in layer_entries(arch, t8, Parallel(), "dense")}
    assert cp2["k, v all-gathered over CP (the whole sequence), kept by flex attention"] == 2 * 2 * 16384 * 1024
    assert cp2["q kept by flex attention (this rank's s/cp queries)"] == 2 * 8192 * 4096
    assert sum(cp2.values()) - sum(one.values()) == 2 * 2 * (16384 - 8192) * 1024 == 33_554_432


def test_context_parallel_records_differ_by_the_gathered_keys_and_values():
    """The records (no AC, forward peak, the chunked loss's end): titan-llama-3.1-8b-w64-cp2-noac-s16384-b1
    (8192 tokens a rank) holds, beyond titan-llama-3.1-8b-w8-noac-s8192-b1 (8192 tokens, no CP), per layer
    the 32 MiB of K and V of the other 8192 positions and a RoPE cache twice as long (ComplexRoPE: 512 B a
    position, 8192 more: 4 MiB); what is left is under 1 MiB (the token ids' load-balancing copies and
    the per-rank block mask)."""
    import json

    def forward(case):
        return json.loads((HARNESS.records / f"{case}.json").read_text())["measured"]["phases"]["forward"]

    cp, one = forward("titan-llama-3.1-8b-w64-cp2-noac-s16384-b1"), forward("titan-llama-3.1-8b-w8-noac-s8192-b1")
    extra = cp["activations"] - one["activations"]
    per_layer = 2 * 2 * 8192 * 1024 + 512 * 8192
    assert 0 <= extra - 32 * per_layer < 2**20

