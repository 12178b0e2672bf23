"""The Megatron-Core measuring harness (validation/megatron/): a rank measured under fake tensors
equals the same rank run on real CPU tensors byte for byte, and every record holds what the
estimator is compared on. Needs megatron-core 0.16.1 (the [megatron] extra) for the first part."""

import contextlib
import importlib.util
import json
import warnings

import pytest

from validation.megatron.plugin import HARNESS

HAVE_MEGATRON = importlib.util.find_spec("megatron") is not None and \
    importlib.util.find_spec("megatron.core") is not None
needs_megatron = pytest.mark.skipif(not HAVE_MEGATRON, reason="megatron-core is not installed "
                                    "(pip install -e .[megatron]); the fake-vs-real check needs it")


def _variants():
    from validation.megatron.harness import Arch, Setup

    # 4 layers (2 per stage), hidden 64, 4 query heads over 2 KV groups, vocab 1000
    dense = Arch(hidden_size=64, num_layers=4, num_attention_heads=4, num_query_groups=2,
                 kv_channels=16, ffn_hidden_size=160, vocab_size=1000)
    moe = Arch(hidden_size=64, num_layers=4, num_attention_heads=4, num_query_groups=2,
               kv_channels=16, ffn_hidden_size=160, vocab_size=1000, num_experts=4,
               moe_router_topk=2, moe_ffn_hidden_size=96)
    shared = Arch(hidden_size=64, num_layers=4, num_attention_heads=4, num_query_groups=2,
                  kv_channels=16, ffn_hidden_size=160, vocab_size=1000, num_experts=4,
                  moe_router_topk=2, moe_ffn_hidden_size=96, moe_shared_expert_intermediate_size=64)
    base = dict(seq_len=64, micro_batch_size=2, tp=2, pp=2, dp=2)
    return {
        "dense-first": Setup(dense, **base),
        "dense-last-lossfusion": Setup(dense, stage="last", loss_fusion=True, **base),
        "dense-last-lossfusion-te": Setup(dense, stage="last", loss_fusion=True, ce_impl="te", **base),
        "moe-alltoall-ep2-router-fp32": Setup(moe, ep=2, router_dtype="fp32", **base),
        "dense-last-full-recompute": Setup(dense, stage="last", recompute="full", **base),
        "dense-first-selective-mlp-layernorm": Setup(dense, recompute="selective",
                                                     recompute_modules=("mlp", "layernorm"), **base),
        "moe-alltoall-ep2": Setup(moe, ep=2, **base),
        # the legacy GroupedMLP (grouped_gemm emulated, kernels.gmm) with moe_act recomputed (the
        # activation's backward through fused._PointwiseGraph)
        "moe-gg-ep2-selective-moe_act": Setup(moe, ep=2, grouped_gemm=True, recompute="selective",
                                              recompute_modules=("moe_act",), **base),
        "moe-shared-ep2-selective-shared_experts": Setup(shared, ep=2, recompute="selective",
                                                         recompute_modules=("shared_experts",), **base),
        # --moe-token-dispatcher-type allgather: the fake run sizes the permutation from balanced routing
        # (shims.BalancedRouting); the real run's drop-and-pad routing is balanced by construction (every expert
        # gets its capacity, 64 x 2 / 4 = 32 of each rank's 64 tokens), so both must agree byte for byte
        "moe-allgather-ep2": Setup(moe, ep=2, dispatcher="allgather", **base),
        "moe-allgather-ep2-selective-moe": Setup(moe, ep=2, dispatcher="allgather", recompute="selective",
                                                 recompute_modules=("layernorm", "moe"), **base),
    }


VARIANTS = ["dense-first", "dense-last-lossfusion", "dense-last-lossfusion-te", "dense-last-full-recompute",
            "dense-first-selective-mlp-layernorm", "moe-alltoall-ep2", "moe-alltoall-ep2-router-fp32",
            "moe-gg-ep2-selective-moe_act", "moe-shared-ep2-selective-shared_experts", "moe-allgather-ep2",
            "moe-allgather-ep2-selective-moe"]


@needs_megatron
@pytest.mark.parametrize("name", VARIANTS)
def test_fake_rank_equals_real_cpu_rank(name):
    from validation.megatron.harness import measure

    warnings.filterwarnings("ignore", message=".*(Apex|Transformer Engine).*")
    setup = _variants()[name]
    fake, real = measure(setup, fake=True), measure(setup, fake=False)
    assert fake == real
    assert fake["peak_bytes"] == sum(fake[c] for c in ("parameters", "gradients", "optimizer_states", "activations"))


@needs_megatron
def test_states_by_hand():
    """The tiny dense first stage on TP2 DP2 with the distributed optimizer: bf16 parameters,
    fp32 main grads (twice the parameters), fp32 main params + two Adam moments sharded over
    DP 2 (three times the parameters' bytes, up to DDP's bucket padding)."""
    from validation.megatron.harness import measure

    m = measure(_variants()["dense-first"])
    # per TP rank: embedding 500 x 64; per layer qkv (4+2+2)*16/2 x 64, proj 64 x 32,
    # fc1 2*80 x 64, fc2 64 x 80, two norms 64; 2 layers
    numel = 500 * 64 + 2 * (64 * 64 + 64 * 32 + 160 * 64 + 64 * 80 + 2 * 64)
    assert m["parameters"] == pytest.approx(2 * numel, rel=0.01)
    assert m["gradients"] == pytest.approx(2 * m["parameters"], rel=0.01)
    assert m["optimizer_states"] == pytest.approx(3 * m["parameters"], rel=0.02)


REQUIRED = ("parameters", "gradients", "optimizer_states", "activations", "peak_bytes", "peak_phase",
            "phases", "activations_at_start", "activations_kept_by_forward", "layer_kept_bytes")


def test_records_are_complete():
    records = HARNESS.load_all()
    assert len(records) >= 20
    for r in records:
        m = r["measured"]
        assert all(k in m for k in REQUIRED), r["id"]
        assert m["peak_bytes"] == sum(m[c] for c in ("parameters", "gradients", "optimizer_states", "activations"))
        assert m["phases"][m["peak_phase"]]["total"] == m["peak_bytes"]
        assert len(m["layer_kept_bytes"]) == r["layers_built"]
        assert r["versions"]["megatron-core"] == "0.16.1" and r["versions"]["torch"]
        config = r["config"]
        assert config["training"]["framework"] == "megatron"
        assert {"tp", "pp", "dp"} <= set(config["parallel"])
        assert r["command"] == f"python -m validation.megatron measure {r['id']}"
        assert (HARNESS.records / f"{r['id']}.json").exists()


@needs_megatron
def test_records_match_their_cases():
    from validation.megatron.cases import CASES, contract_config

    for r in HARNESS.load_all():
        assert r["config"] == json.loads(json.dumps(contract_config(CASES[r["id"]])))


@needs_megatron
def test_fused_expressions_allocate_only_their_outputs():
    """A `@jit_fuser` function is one compiled kernel in production (megatron/core/jit.py:
    torch.compile): under the harness's stand-in (validation/megatron/fused.py) it allocates its
    outputs and nothing else, with the eager values. weighted_swiglu_back with fp64 routing weights
    (--moe-router-dtype fp64) returns the bf16 input gradient [n, 2f] and the fp64 weight gradient
    [n, 1]; run eagerly it also makes fp64 [n, f] products and their concatenation."""
    import torch

    from validation.megatron import kernels
    from validation.megatron.shims import megatron_shims
    from validation.core.tracker import StorageTracker

    warnings.filterwarnings("ignore", message=".*(Apex|Transformer Engine).*")
    n, f = 64, 96
    torch.manual_seed(0)
    g = torch.randn(n, f, dtype=torch.bfloat16)
    y = torch.randn(n, 2 * f, dtype=torch.bfloat16)
    w = torch.rand(n, 1, dtype=torch.float64)

    def allocated(run):
        tracker = StorageTracker()
        kernels.HIDDEN["context"] = tracker.hidden
        try:
            with tracker:
                out = run()
        finally:
            kernels.HIDDEN["context"] = contextlib.nullcontext
        return sum(d for _, d in tracker.events if d > 0), out

    with megatron_shims():
        from megatron.core.fusions import fused_bias_swiglu as swiglu

        fused_bytes, (dx, dw) = allocated(lambda: swiglu.weighted_swiglu_back(g, y, w))
        forward_bytes, out = allocated(lambda: swiglu.weighted_swiglu(y, w))  # calls swiglu inside
        eager_dx, eager_dw = swiglu.weighted_swiglu_back.fn(g, y, w)
        eager_bytes, _ = allocated(lambda: swiglu.weighted_swiglu_back.fn(g, y, w))
    assert fused_bytes == n * 2 * f * 2 + 512  # bf16 [64, 192] + fp64 [64, 1] in one 512-byte block
    assert forward_bytes == n * f * 2  # bf16 [64, 96]
    assert torch.equal(dx, eager_dx) and torch.equal(dw, eager_dw) and out.shape == (n, f)
    assert eager_bytes > fused_bytes + 3 * n * f * 8  # the eager fp64 [64, 96] temporaries


@needs_megatron
def test_balanced_routing_sizes_the_allgather_permutation():
    """The stand-in answers the dispatcher's data-dependent sizes from balanced routing: a fraction k*phi/E of
    the routing map (2 / 4 here) is set, and a size that is not whole is refused rather than rounded."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    from validation.megatron.shims import BalancedRouting

    with FakeTensorMode():
        mask = torch.empty(256, 2, dtype=torch.bool)
        tokens = torch.empty(256, 2, dtype=torch.float32)
        with BalancedRouting(0.5):
            assert tokens.masked_select(mask).shape == (256,)
        with BalancedRouting(0.3), pytest.raises(RuntimeError, match="not whole"):
            tokens[:3].masked_select(mask[:3])  # 6 x 0.3


CE_RECORD = json.loads((HARNESS.records.parent / "compile" / "megatron-fused-cross-entropy-bf16-s16-b2-v512.json").read_text())


@needs_megatron
def test_fused_cross_entropy_stand_ins_allocate_what_inductor_generates():
    """Megatron-Core's native fused cross-entropy (--cross-entropy-loss-fusion, fusions/
    fused_cross_entropy.py), its four compiled functions under the harness's stand-ins: each
    allocates the buffers as large as the logits that Inductor's generated code allocates for it
    (the record, `python -m validation.compile_saved megatron-cross-entropy`): calculate_logits_max
    the fp32 logits, calculate_gradients an fp32 copy of the softmax beside its bf16 output (it held
    none before), the other two nothing of that size (they work in place)."""
    import torch

    from validation.megatron import kernels
    from validation.megatron.shims import megatron_shims
    from validation.core.tracker import StorageTracker

    warnings.filterwarnings("ignore", message=".*(Apex|Transformer Engine).*")
    s, b, v = CE_RECORD["logits"]["shape"]
    logit_bytes = s * b * v

    def generated(name):  # the logits-sized buffers of the generated code, largest first
        return sorted((x["bytes_per_element"] * logit_bytes for x in CE_RECORD["functions"][name]["buffers"]
                       if x["bytes_per_element"] * _numel(x["shape"]) >= logit_bytes), reverse=True)

    def allocated(run):
        tracker = StorageTracker()
        kernels.HIDDEN["context"] = tracker.hidden
        try:
            with tracker:
                out = run()
        finally:
            kernels.HIDDEN["context"] = contextlib.nullcontext
        return sorted((d for _, d in tracker.events if d >= logit_bytes), reverse=True), out

    torch.manual_seed(0)
    logits, target = torch.randn(s, b, v, dtype=torch.bfloat16), torch.randint(0, v, (s, b))
    with megatron_shims(), torch.no_grad():
        from megatron.core.fusions import fused_cross_entropy as fce

        got, (fp32_logits, logits_max) = allocated(lambda: fce.calculate_logits_max(logits))
        assert got == generated("calculate_logits_max") == [4 * logit_bytes]
        got, (mask, masked, sums, exp_logits) = allocated(
            lambda: fce.calculate_predicted_logits(fp32_logits, target, logits_max, 0, v))
        assert got == generated("calculate_predicted_logits") == [] and exp_logits is fp32_logits
        got, (softmax, _) = allocated(lambda: fce.calculate_cross_entropy_loss(exp_logits, sums))
        assert got == generated("calculate_cross_entropy_loss") == [] and softmax is fp32_logits
        got, grad = allocated(lambda: fce.calculate_gradients(softmax, torch.ones(s, b), mask, masked))
        assert got == generated("calculate_gradients") == [4 * logit_bytes, 2 * logit_bytes]
        assert grad.dtype == torch.bfloat16 and grad.shape == (s, b, v)


def _numel(shape):
    n = 1
    for d in shape:
        n *= d
    return n


@needs_megatron
def test_te_cross_entropy_stand_in_keeps_the_logits_and_writes_their_gradient_in_place():
    """TE's cross-entropy at the TE the Megatron releases pin (2.12, 2.17.1: pytorch/triton/
    cross_entropy.py cross_entropy_forward): on one TP rank it allocates the fp32 loss and the fp32
    (max, sum, label logit) triple per token, saves the logits it overwrote with the gradient, and its
    backward scales them in place and returns them."""
    import torch

    from validation.megatron import kernels
    from validation.core.tracker import StorageTracker

    n_s, n_b, v = 64, 2, 512  # 128 tokens: the per-token buffers fill whole 512-byte blocks
    logits = torch.randn(n_s, n_b, v, dtype=torch.bfloat16, requires_grad=True)
    target = torch.randint(0, v, (n_s, n_b))
    tracker = StorageTracker()
    kernels.HIDDEN["context"] = tracker.hidden
    try:
        with tracker:
            x = logits * 1  # a non-leaf, as the output layer's logits are
            loss = kernels.te_parallel_cross_entropy(x, target, None)
            after_forward = [d for _, d in tracker.events if d > 0]
            (grad,) = torch.autograd.grad(loss.sum(), x)
    finally:
        kernels.HIDDEN["context"] = contextlib.nullcontext
    tokens = n_s * n_b
    assert after_forward == [2 * tokens * v, 4 * tokens, 12 * tokens]  # x, then the loss and the triple
    assert grad.untyped_storage().data_ptr() == x.untyped_storage().data_ptr()  # the logits' own storage
