"""The PEFT measuring harness (validation/peft/): fake-tensor measurements of LoRA and NF4 QLoRA
steps equal real CPU runs byte for byte, the bitsandbytes emulation equals real bitsandbytes on CPU,
and the states agree with hand computation. Needs torch, transformers and peft (skips, saying which
is missing); the check against real bitsandbytes needs bitsandbytes 0.49.2 (validation/install_frameworks.sh)."""

import json

import pytest

pytest.importorskip("torch", reason="the PEFT harness needs torch (the [validate] extra)")
pytest.importorskip("transformers", reason="the PEFT harness needs transformers (the [validate] extra)")
pytest.importorskip("peft", reason="the PEFT harness needs peft (pip install peft)")

from validation.peft.build import ALL_SEVEN, LoraRun  # noqa: E402
from validation.peft.cases import CASES, contract_config  # noqa: E402
from validation.peft.plugin import HARNESS  # noqa: E402
from validation.peft.step import measure  # noqa: E402
from validation.core.tracker import cuda_block_bytes as block  # noqa: E402

SEQ, BATCH = 64, 2

VARIANTS = [
    LoraRun("tiny-llama", SEQ, BATCH, rank=8, alpha=16),
    LoraRun("tiny-llama", SEQ, BATCH, rank=8, alpha=16, targets="all-linear", dropout=0.05, recompute="full"),
    LoraRun("tiny-llama", SEQ, BATCH, rank=4, alpha=8, targets=("q", "v"), save=("lm_head", "embed_tokens")),
    LoraRun("tiny-llama-256", SEQ, BATCH, rank=8, alpha=16, targets=ALL_SEVEN, base="nf4"),
    LoraRun("tiny-llama-256", SEQ, BATCH, rank=8, alpha=16, targets=("q", "v"), dropout=0.05,
            recompute="full", base="nf4"),
    LoraRun("tiny-mixtral", SEQ, BATCH, rank=8, alpha=16, targets="all-linear", recompute="full"),
    # peft prepare_model_for_kbit_training: fp32 stream, SDPA's math backend (grouped KV heads)
    # the one fused q, k, v linear under peft's default targets: GPT-2's c_attn, Falcon's query_key_value (eager)
    LoraRun("tiny-gpt2", SEQ, BATCH, rank=8, alpha=16),
    LoraRun("tiny-falcon", SEQ, BATCH, rank=8, alpha=16, attention="eager"),
    LoraRun("tiny-llama-256", SEQ, BATCH, rank=8, alpha=16, targets=ALL_SEVEN, recompute="full", base="nf4",
            prepare=True),
]


@pytest.fixture(scope="module")
def fake():
    return {run: measure(run) for run in VARIANTS}


@pytest.mark.parametrize("run", VARIANTS, ids=lambda r: f"{r.model}-{r.base}-{r.targets}-{r.recompute}-{r.dropout}-"
                         f"{r.save}{'-prepared' if r.prepare else ''}")
def test_fake_measurement_equals_real_cpu_run(run, fake):
    assert fake[run] == measure(run, fake=False)


# tiny-llama (validation/hf/models.py): hidden 64, q and o 64 -> 64, k and v 64 -> 32, 2 layers
def test_trainable_count_and_state_bytes_by_hand(fake):
    m = fake[VARIANTS[0]]
    # rank 8 on q (64 in, 64 out) and v (64 in, 32 out): r x (in + out) each, 2 layers
    assert m["parameter_counts"]["trainable"] == 2 * 8 * ((64 + 64) + (64 + 32)) == 3584
    # peft keeps the adapters of a bf16 base in fp32; one storage per A and per B
    adapters = 2 * (block(8 * 64 * 4) + block(64 * 8 * 4) + block(8 * 64 * 4) + block(32 * 8 * 4))
    assert m["parameter_bytes"]["trainable"] == adapters
    # frozen weights: no gradient, no optimizer state
    assert m["phases"]["optimizer"]["gradients"] == adapters
    # fused AdamW: exp_avg, exp_avg_sq in fp32 and an fp32 step counter per adapter on the GPU
    assert m["optimizer_states"] == 2 * adapters + 512 * 8


def test_issue_count_for_llama_8b_rank_16_all_seven():
    """Issue 14's figure: 16 x (sum of in + out features of the seven projections) x 32 layers."""
    record = json.loads((HARNESS.records / "llama-3.1-8b-qlora-r16-all7-recompute-drop00-s4096-b1.json").read_text())
    in_plus_out = (4096 + 4096) + (4096 + 1024) + (4096 + 1024) + (4096 + 4096) \
        + (4096 + 14336) + (4096 + 14336) + (14336 + 4096)
    assert record["measured"]["parameter_counts"]["trainable"] == 16 * in_plus_out * 32 == 41_943_040


def test_modules_to_save_keeps_a_trainable_copy(fake):
    """peft's ModulesToSaveWrapper keeps the frozen original and trains a copy (bf16, like the
    base): the embedding and the LM head are held twice."""
    m, lora = fake[VARIANTS[2]], fake[VARIANTS[0]]
    copies = 2 * block(1000 * 64 * 2)
    adapters = 2 * (block(4 * 64 * 4) + block(64 * 4 * 4) + block(4 * 64 * 4) + block(32 * 4 * 4))
    assert m["parameter_bytes"] == {"frozen": lora["parameter_bytes"]["frozen"], "trainable": copies + adapters}
    assert m["parameter_counts"]["trainable"] == 2 * 1000 * 64 + 2 * 4 * (128 + 96)


def nf4_bytes(n: int, double_quant: bool = True) -> int:
    """bitsandbytes NF4 of n weights (functional.quantize_4bit): codes two per byte and the 16-entry fp32
    NF4 code book; double-quantized, a uint8 absmax per 64, an fp32 absmax per 256 of those, the fp32
    offset and a copy of the 256-entry fp32 dynamic code; else an fp32 absmax per 64. One allocation each."""
    codes = block(n // 2) + block(16 * 4)
    if double_quant:
        return codes + block(n // 64) + block(-(-n // 64 // 256) * 4) + block(4) + block(256 * 4)
    return codes + block(n // 64 * 4)


TINY_256 = dict(h=256, kv=128, ffn=512, vocab=1000)


def frozen_by_hand(double_quant: bool) -> int:
    h, kv, ffn, vocab = TINY_256.values()
    linears = [h * h, kv * h, kv * h, h * h, ffn * h, ffn * h, h * ffn]
    norms = 2 * block(h * 2)
    return 2 * (sum(nf4_bytes(n, double_quant) for n in linears) + norms) + 2 * block(vocab * h * 2) + block(h * 2)


def test_nf4_storage_by_hand(fake):
    assert fake[VARIANTS[3]]["parameter_bytes"]["frozen"] == frozen_by_hand(True)
    plain = measure(LoraRun("tiny-llama-256", SEQ, BATCH, rank=8, alpha=16, targets=ALL_SEVEN, base="nf4",
                            double_quant=False))
    assert plain["parameter_bytes"]["frozen"] == frozen_by_hand(False)


BNB_VARIANTS = [
    LoraRun("tiny-llama-256", SEQ, BATCH, rank=8, alpha=16, targets=ALL_SEVEN, base="nf4"),
    LoraRun("tiny-llama-256", SEQ, BATCH, rank=8, alpha=16, targets=ALL_SEVEN, base="nf4", double_quant=False),
    LoraRun("tiny-llama-256", SEQ, BATCH, rank=8, alpha=16, targets=("q", "v"), dropout=0.05, recompute="full",
            base="nf4"),
    LoraRun("tiny-llama-256", SEQ, BATCH, rank=8, alpha=16, targets="all-linear", base="nf4"),
]


@pytest.mark.parametrize("run", BNB_VARIANTS, ids=lambda r: f"{r.targets}-{r.recompute}-dq{r.double_quant}")
def test_the_bitsandbytes_emulation_equals_real_bitsandbytes(run):
    """The emulated Linear4bit, MatMul4Bit and peft wrapper (validation/peft/bnb.py) against real
    bitsandbytes 0.49.2 (its CPU kernels allocate what its CUDA ones do: backends/cpu/ops.py and
    backends/cuda/ops.py dequantize into one new tensor each) and peft's own lora.bnb.Linear4bit, on a
    real CPU run: the same storages, byte for byte, at every moment."""
    bnb = pytest.importorskip("bitsandbytes", reason="the check needs bitsandbytes (validation/install_frameworks.sh)")
    if bnb.__version__ != "0.49.2":
        pytest.skip(f"the emulation was checked against bitsandbytes 0.49.2, this is {bnb.__version__}")
    from validation.peft.bnb import real_peft_model
    assert measure(run, fake=False) == measure(run, fake=False, make_model=real_peft_model)


def test_bitsandbytes_through_0_43_1_keeps_the_4bit_linears_inputs():
    """MatMul4Bit's ``ctx.tensors = (A, B)`` (bitsandbytes <= 0.43.1): each 4-bit linear keeps its bf16
    input. Per layer: the attention norm's output (q, k, v), the MLP norm's (gate, up), the gated
    product (down); the attention output (o) is kept by SDPA anyway. The first layer's q, k, v input
    needs no gradient (frozen embeddings, no checkpointing): kept nowhere. With checkpointing the inputs
    outlive the checkpoint (an attribute of the autograd node, not a saved tensor): o's too."""
    h, ffn, tokens = 256, 512, SEQ * BATCH
    for recompute, extra in (("none", 2 * (h + h + ffn) - h), ("full", 2 * (h + h + h + ffn))):
        args = dict(rank=8, alpha=16, targets=ALL_SEVEN, base="nf4", recompute=recompute)
        new = measure(LoraRun("tiny-llama-256", SEQ, BATCH, **args))
        old = measure(LoraRun("tiny-llama-256", SEQ, BATCH, bnb_version="0.43.1", **args))
        assert old["phases"]["forward"]["total"] - new["phases"]["forward"]["total"] == 2 * tokens * extra, recompute


def test_records_are_complete():
    records = [json.loads(p.read_text()) for p in sorted(HARNESS.records.glob("*.json"))]
    assert len(records) >= 15 and {r["id"] for r in records} == set(CASES)
    for r in records:
        assert r["config"] == contract_config(CASES[r["id"]])
        m = r["measured"]
        assert m["peak_bytes"] == sum(m[c] for c in ("parameters", "gradients", "optimizer_states", "activations"))
        assert m["phases"][m["peak_phase"]]["total"] == m["peak_bytes"]
        assert sum(m["parameter_bytes"].values()) == m["parameters"]
        assert r["command"] == f"python -m validation.peft measure {r['id']}"


def test_lora_dropout_keeps_a_bool_mask(fake):
    """On CUDA dropout is the fused native_dropout, which keeps a bool mask of its input's shape
    (what the adapter's A saves, the dropped input instead of the input, is the same size). The
    mask is kept only where the input requires grad: without gradient checkpointing the Trainer
    leaves the embedding output without grad, so layer 0's q and v keep none; layer 1's do."""
    with_dropout = measure(LoraRun("tiny-llama", SEQ, BATCH, rank=8, alpha=16, dropout=0.05))
    base = fake[VARIANTS[0]]
    masks = 2 * block(BATCH * SEQ * 64)
    for phase in ("forward", "backward"):
        assert with_dropout["phases"][phase]["total"] - base["phases"][phase]["total"] == masks


def test_a_record_reproduces():
    case = "qwen3-8b-lora-r8-qv-norecompute-drop00-s2048-b1"
    stored = json.loads((HARNESS.records / f"{case}.json").read_text())
    keys = ("torch", "transformers", "peft")
    if {k: stored["versions"][k] for k in keys} != {k: HARNESS.versions()[k] for k in keys}:
        pytest.skip(f"records were measured with {stored['versions']}, this is {HARNESS.versions()}")
    assert measure(CASES[case]) == stored["measured"]


def test_prepare_kbit_casts_the_rest_to_fp32():
    """tiny-llama-256 (vocab 1000, hidden 256, 2 layers): the embedding, the LM head and the five RMSNorm
    scales go from bf16 to fp32; the NF4 weights and the (fp32) adapters stay as they were."""
    plain = measure(LoraRun("tiny-llama-256", SEQ, BATCH, rank=8, alpha=16, targets=ALL_SEVEN, recompute="full",
                            base="nf4"))
    prepared = measure(VARIANTS[-1])
    grown = 2 * (block(1000 * 256 * 4) - block(1000 * 256 * 2)) + 5 * (block(256 * 4) - block(256 * 2))
    assert prepared["parameter_bytes"]["frozen"] - plain["parameter_bytes"]["frozen"] == grown == 1_026_560
    assert prepared["parameter_bytes"]["trainable"] == plain["parameter_bytes"]["trainable"]


def test_a_fused_qkv_linear_gets_one_adapter(fake):
    """tiny-gpt2 (hidden 64, 2 layers): c_attn 64 -> 192; tiny-falcon (hidden 64, 4 heads of 16, multi-query):
    query_key_value 64 -> 64 + 2 x 16. ("q", "v") adapts the one module once: r x (in + out) a layer."""
    gpt2, falcon = fake[VARIANTS[-3]], fake[VARIANTS[-2]]
    assert gpt2["parameter_counts"]["trainable"] == 2 * 8 * (64 + 192) == 4096
    assert falcon["parameter_counts"]["trainable"] == 2 * 8 * (64 + 96) == 2560
