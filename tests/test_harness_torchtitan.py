"""The torchtitan measuring harness (validation/torchtitan/): a fake-tensor run of torchtitan's own
code equals a real CPU run byte for byte, and every record is complete. Needs torchtitan 0.3.0
(and torchao for float8); the record checks need nothing."""

import pytest

from validation.torchtitan.record import RECORDS, load_all

CATEGORIES = ("parameters", "gradients", "optimizer_states", "activations")


def test_records_are_complete():
    records = load_all()
    if not records:
        pytest.skip(f"no torchtitan records in {RECORDS}")
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

    for r in load_all():
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
