"""The HF Trainer + Accelerate FSDP2 measuring harness (validation/hf_fsdp2/): fake-tensor measurements of
torch's fully_shard, applied by accelerate's own fsdp2_prepare_model, equal real CPU runs of tiny models byte
for byte; the sharded parameters and the unsharded gradients kept under no_sync agree with hand computation;
every record is complete (the record checks need nothing)."""

import pytest

from validation.hf_fsdp2.plugin import HARNESS

CATEGORIES = ("parameters", "gradients", "optimizer_states", "activations")


def test_records_are_complete():
    records = HARNESS.load_all()
    pytest.importorskip("torch", reason="the case list builds torch runs")
    from validation.hf_fsdp2.cases import CASES, contract_config

    assert sorted(r["id"] for r in records) == sorted(CASES)
    for r in records:
        assert r["step_measured"] == 2
        assert r["config"] == contract_config(CASES[r["id"]])
        assert r["config"]["training"]["framework"] == "hf_fsdp2"
        assert {"torch", "transformers", "accelerate", "peft"} <= set(r["versions"])
        m = r["measured"]
        assert m["peak_bytes"] == sum(m[c] for c in CATEGORIES)
        assert m["phases"][m["peak_phase"]]["total"] == m["peak_bytes"]
        accumulate = {"accumulate"} if CASES[r["id"]].accumulation > 1 else set()
        assert set(m["phases"]) == {"forward", "backward", "optimizer"} | accumulate
        assert all(isinstance(v, int) for p in m["phases"].values() for v in p.values())
        assert r["command"] == f"python -m validation.hf_fsdp2 measure {r['id']}"


# --- the harness itself: needs torch, transformers, accelerate, peft ---------------------------------

def _step():
    for name in ("torch", "transformers", "accelerate", "peft"):
        pytest.importorskip(name, reason=f"the hf_fsdp2 harness needs {name} (the [validate] extra)")
    from validation.hf_fsdp2 import step

    return step


def _variants():
    from validation.hf_fsdp2.step import Run

    return [
        Run("tiny-llama", 8, 64, 2),
        Run("tiny-llama", 8, 64, 2, accumulation=2),
        Run("tiny-llama", 8, 64, 2, recompute="full", lora_rank=4, accumulation=2),
        Run("tiny-llama", 8, 64, 2, reshard_after_forward=False),
        # tied embedding and head: one tail unit [final norm, embed, lm_head] (Gemma-2 runs eager attention only)
        Run("tiny-gemma2", 8, 64, 2, accumulation=2, attention="eager"),
    ]


IDS = ["full", "full-ga2", "lora-r4-recompute-ga2", "full-noreshard", "tied-eager-ga2"]


@pytest.fixture(scope="module")
def fake():
    step = _step()
    return {run: step.measure(run) for run in _variants()}


@pytest.mark.parametrize("index", range(len(IDS)), ids=IDS)
def test_fake_measurement_equals_real_cpu_run(index, fake):
    step = _step()
    run = _variants()[index]
    assert fake[run] == step.measure(run, fake=False)


# tiny-llama (validation/hf/models.py): hidden 64, vocab 1000, 2 layers of q 64x64, k and v 32x64, o 64x64,
# gate and up 160x64, down 64x160, two norms of 64; untied embedding and head, a final norm of 64.
WEIGHTS = [(1000, 64), (1000, 64), (64, 1)] + 2 * [(64, 64), (32, 64), (32, 64), (64, 64), (160, 64), (160, 64),
                                                   (64, 160), (64, 1), (64, 1)]


def _block(nbytes: int) -> int:
    return -(-nbytes // 512) * 512  # the caching allocator's 512-byte blocks


def test_sharded_fp32_parameters_by_hand(fake):
    """FSDP2 shards every parameter on its own along dim 0 (rank 0 holds ceil(rows / 8) rows), in fp32: the
    bf16 model's trainable parameters upcast by accelerate's fsdp2_prepare_model."""
    run = _variants()[0]
    assert sum(_block(4 * -(-rows // 8) * cols) for rows, cols in WEIGHTS) == 110_080
    assert fake[run]["phases"]["optimizer"]["parameters"] == 110_080


def test_no_sync_keeps_the_unsharded_bf16_gradients(fake):
    """Under set_requires_gradient_sync(False) every unit keeps each parameter's whole gradient in bf16 (the
    mixed precision's param dtype; reduce_dtype bf16 equals it, so FSDP2 makes no fp32 accumulation copy),
    one storage per parameter: 430,592 bytes, all of it counted as gradients when the last micro-batch starts
    and the whole difference between the two runs' forward peaks."""
    plain, accumulated = (fake[r] for r in _variants()[:2])
    held = sum(_block(2 * rows * cols) for rows, cols in WEIGHTS)
    assert held == 430_592
    assert accumulated["phases"]["forward"]["gradients"] == held
    assert accumulated["phases"]["forward"]["total"] - plain["phases"]["forward"]["total"] == held


def test_no_sync_with_lora_keeps_only_the_adapters_gradients(fake):
    """With LoRA only the adapters (fp32 shards, gathered in bf16) have gradients to keep: rank 4, A r x in and
    B out x r for q, k, v, o, gate, up, down of each layer, each a bf16 storage of its own."""
    run = _variants()[2]
    shapes = [(4, 64), (64, 4), (4, 64), (32, 4), (4, 64), (32, 4), (4, 64), (64, 4),
              (4, 64), (160, 4), (4, 64), (160, 4), (4, 160), (64, 4)]
    held = 2 * sum(_block(2 * rows * cols) for rows, cols in shapes)
    assert held == 20_480
    assert fake[run]["phases"]["forward"]["gradients"] == held


def test_no_sync_keeps_the_tied_weights_gradient_once(fake):
    """tiny-gemma2 (hidden 64, vocab 1000, 2 layers with four norms each, tied embedding): the shared weight is
    one parameter of the tail unit, so one bf16 gradient of it is kept."""
    run = _variants()[4]
    layer = [(64, 64), (32, 64), (32, 64), (64, 64), (160, 64), (160, 64), (64, 160)] + 4 * [(64, 1)]
    held = sum(_block(2 * rows * cols) for rows, cols in [(1000, 64), (64, 1)] + 2 * layer)
    assert held == 304_640
    assert fake[run]["phases"]["forward"]["gradients"] == held
