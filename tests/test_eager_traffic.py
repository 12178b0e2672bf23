"""kernels.EAGER_TRAFFIC against its record (tests/data/measured/eager_traffic, validation/eager_traffic.py): each
entry is the record's measured chain, the harness re-run on a small shape gives the same ops and passes, and the
chains' bytes by hand."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from estimator.speed import kernels
from validation import eager_traffic as harness

RECORD = json.loads((Path(__file__).resolve().parent / "data" / "measured" / "eager_traffic" /
                     harness.RECORD_NAME).read_text())
SMALL = dict(harness.SHAPE, tokens=256, hidden=1024, ffn=2048)


def test_record_names_its_versions_and_shape():
    assert RECORD["versions"]["torch"].startswith("2.13.0") and RECORD["versions"]["transformers"] == "5.23.0"
    assert RECORD["versions"]["torchtitan"] == "0.3.0" and RECORD["versions"]["torchtune"] == "0.6.1"
    assert RECORD["shape"] == harness.SHAPE
    assert set(RECORD["chains"]) == set(harness.CHAINS)


@pytest.mark.parametrize("code", sorted(kernels.EAGER_TRAFFIC))
def test_eager_traffic_is_the_record(code):
    """Every entry: the record's passes (to 3 decimals) and kernel count of the chain EAGER_CHAINS names."""
    for kind, (forward, backward) in kernels.EAGER_TRAFFIC[code].items():
        chain = RECORD["chains"][kernels.EAGER_CHAINS[code][kind]]
        assert chain["kind"] == kind
        for phase, traffic in (("forward", forward), ("backward", backward)):
            assert traffic.passes == pytest.approx(chain[phase]["passes"], abs=5e-4), (code, kind, phase)
            assert traffic.kernels == chain[phase]["kernels"], (code, kind, phase)


def test_every_framework_runs_some_measured_code():
    assert set(kernels.EAGER_CODE.values()) <= set(kernels.EAGER_TRAFFIC)
    assert kernels.eager_code("fsdp2", "2024-12") == "torchtitan-2024-12"
    assert kernels.eager_code("fsdp2", None) == kernels.eager_code("fsdp2", "0.3.0") == "torchtitan"


@pytest.mark.parametrize("chain", sorted(harness.CHAINS))
def test_harness_on_a_small_shape_gives_the_record(chain):
    """256 tokens instead of 4096, hidden 1024, MLP 2048: the same aten ops and kernels, and passes within 1% (the
    per-row fp32 statistics and the weight, which do not scale with tokens x width, weigh more here)."""
    if chain.startswith("torchtune") and not harness.torchtune_available():
        pytest.skip("torchtune is not installed (python -m validation.torchtune re-runs in its venv)")
    small = harness.chain_record(chain, SMALL)
    recorded = RECORD["chains"][chain]
    for phase in ("forward", "backward"):
        assert [k["op"] for k in small[phase]["ops"]] == [k["op"] for k in recorded[phase]["ops"]], phase
        assert small[phase]["passes"] == pytest.approx(recorded[phase]["passes"], rel=0.01), phase


def test_llama_rms_norm_forward_bytes_by_hand():
    """LlamaRMSNorm, T x h bf16: to(fp32) reads 2 writes 4 bytes an element, pow 4 + 4, mean reads 4, the product
    with rsqrt 4 + 4, to(bf16) 4 + 2, the weight's product 2 + 2: 36 bytes against the fused kernel's 2 + 2. Per
    row: mean writes 4, add and rsqrt read and write 4 each, the product reads 4 (24 bytes); the weight 2 h."""
    T, h = RECORD["shape"]["tokens"], RECORD["shape"]["hidden"]
    forward = RECORD["chains"]["transformers-llama-rms-norm"]["forward"]
    assert forward["bytes"] == 36 * T * h + 24 * T + 2 * h
    assert forward["fused_bytes"] == 4 * T * h


def test_swiglu_bytes_by_hand():
    """silu(gate) * up over T x f bf16: forward silu 2 + 2, mul 4 + 2 = 10 bytes against the fused 6 (5/3);
    backward d_up = grad * silu(gate), d_silu = grad * up (4 + 2 each), silu_backward reads d_silu and gate and
    writes d_gate (4 + 2): 18 against the fused 10 (read dc, a, b, write da, db): 1.8."""
    T, f = RECORD["shape"]["tokens"], RECORD["shape"]["ffn"]
    chain = RECORD["chains"]["swiglu"]
    assert (chain["forward"]["bytes"], chain["backward"]["bytes"]) == (10 * T * f, 18 * T * f)
    assert (chain["forward"]["passes"], chain["backward"]["passes"]) == (round(5 / 3, 4), 1.8)


def test_torchtitan_complex_rope_forward_bytes_by_hand():
    """q.float() 2 + 4, the complex product 4 + 4 plus the complex64 cache (T x d/2 x 8 bytes, once per q and k),
    type_as 4 + 2: 20 bytes an element against the fused 4, for q and k's (32 + 8) x 128 per token."""
    s = RECORD["shape"]
    T, E = s["tokens"], s["tokens"] * (s["q_heads"] + s["kv_heads"]) * s["head_dim"]
    forward = RECORD["chains"]["torchtitan-complex-rope"]["forward"]
    assert forward["bytes"] == 20 * E + 2 * T * s["head_dim"] // 2 * 8
    assert forward["kernels"] == 6


def test_torch_fused_rms_norm_on_cuda_by_hand():
    """torch 2.13's CUDA kernel: forward reads x (2 h) and the weight, writes y (2 h) and one fp32 rstd a row;
    backward's grad-input kernel reads dY, X, rstd and the weight and writes dX, its GammaBeta kernel reads dY, X and
    rstd again and writes dW: 10 bytes an element against the fused 6 (5/3)."""
    T, h = RECORD["shape"]["tokens"], RECORD["shape"]["hidden"]
    chain = RECORD["chains"]["torch-rms-norm-cuda"]
    assert chain["forward"]["bytes"] == 4 * T * h + 2 * h + 4 * T
    assert chain["backward"]["bytes"] == 10 * T * h + 2 * 4 * T + 2 * h + 2 * h
    assert (chain["forward"]["kernels"], chain["backward"]["kernels"]) == (1, 2)


@pytest.mark.parametrize("framework, version, code", [
    ("hf", None, "transformers"), ("fsdp1", None, "transformers"), ("deepspeed", None, "transformers"),
    ("fsdp2", None, "torchtitan"), ("fsdp2", "2024-12", "torchtitan-2024-12"), ("torchtune", None, "torchtune")])
def test_the_roofline_prices_each_framework_with_its_model_code(framework, version, code):
    """Llama-3.1-8B's norm, rotary and SwiGLU, forward and backward, at the passes and kernels of the chain its
    framework's model code runs; a LayerNorm model with a GELU MLP at torch's LayerNorm kernel and one GELU."""
    import dataclasses
    from estimator.models.presets import get_architecture
    from estimator.spec.hardware import Hardware
    from estimator.spec.parallel import Parallel
    from estimator.spec.training import Training
    from estimator.speed.roofline import roofline

    def ops(arch):
        training = Training(framework=framework, framework_version=version, seq_len=2048, global_batch_size=2)
        result = roofline(arch, training, Parallel(dp=2), Hardware("h100-80"))
        return {(o.name, o.phase): (o.passes, o.kernels) for o in result.operations}

    llama = ops(get_architecture("llama-3.1-8b"))
    for name, kind in (("attention norm", "norm"), ("rotary embedding", "rope"), ("SwiGLU activation", "activation")):
        forward, backward = kernels.EAGER_TRAFFIC[code][kind]
        assert llama[name, "forward"] == (forward.passes, forward.kernels), name
        assert llama[f"{name} (backward)", "backward"] == (backward.passes, backward.kernels), name
    plain = ops(dataclasses.replace(get_architecture("llama-3.1-8b"), norm="layernorm", gated_mlp=False))
    assert plain["MLP norm", "forward"] == (1.0, 1) and plain["MLP norm (backward)", "backward"] == (1.667, 2)
    assert plain["GELU activation", "forward"] == plain["GELU activation (backward)", "backward"] == (1.0, 1)
