"""FSDP1's other sharding strategies in the FSDP1 harness (validation/fsdp1/strategies.py): fake equals real
on tiny models, and what each strategy keeps, by hand (tiny-llama: tests/test_harness_fsdp1.py's counts)."""

import pytest

pytest.importorskip("torch", reason="the FSDP1 harness needs torch (the [validate] extra)")
pytest.importorskip("transformers", reason="the FSDP1 harness needs transformers (the [validate] extra)")

from validation.fsdp1.step import Run, measure, traced_step  # noqa: E402
from validation.core.tracker import cuda_block_bytes as block  # noqa: E402

LAYER = 64 * 64 + 2 * 32 * 64 + 64 * 64 + 3 * 160 * 64 + 2 * 64  # 43,136
ROOT = 2 * 1000 * 64 + 64  # 128,064

FULL = Run("tiny-llama", 8, 64, 2)
VARIANTS = [Run("tiny-llama", 8, 64, 2, strategy="SHARD_GRAD_OP"),
            Run("tiny-llama", 8, 64, 2, strategy="HYBRID_SHARD", shard_group=4),
            Run("tiny-llama", 8, 64, 2, strategy="NO_SHARD")]


def shard(numel: int, world: int = 8) -> int:
    return -(-numel // world)


@pytest.fixture(scope="module")
def fake():
    return {run: measure(run) for run in [FULL, *VARIANTS]}


@pytest.mark.parametrize("run", VARIANTS, ids=lambda r: r.strategy)
def test_fake_measurement_equals_real_cpu_run(run, fake):
    assert fake[run] == measure(run, fake=False)


def test_hybrid_shard_is_full_shard_over_its_shard_group(fake):
    """HYBRID_SHARD over 8 ranks in groups of 4: every byte as FULL_SHARD over 4 ranks (the replicas'
    all-reduce of the sharded gradient works in place, torch 2.13 fsdp/_runtime_utils.py `_reduce_grad`)."""
    assert fake[VARIANTS[1]] == measure(Run("tiny-llama", 4, 64, 2))


def live_at_backward(run) -> int:
    tracker, _ = traced_step(run)
    index = dict((name, i) for i, name in tracker.marks)["backward"]
    return sum(tracker.live_at(index).values())


def test_shard_grad_op_keeps_every_layer_unsharded_from_forward_to_backward():
    """SHARD_GRAD_OP does not free a unit's unsharded bf16 FlatParameter after its forward (torch 2.13
    fsdp/_runtime_utils.py `_post_forward_reshard`, NO_RESHARD_AFTER_FORWARD_HANDLE_STRATEGIES): the
    backward starts with both layer units gathered (padded to 8 shards), the root being gathered either way."""
    grown = live_at_backward(VARIANTS[0]) - live_at_backward(FULL)
    assert grown == 2 * block(2 * 8 * shard(LAYER)) == 2 * 86_528


def test_no_shard_keeps_full_fp32_parameters_gradients_and_states(fake):
    """NO_SHARD: each unit's FlatParameter whole, unpadded, in fp32; its gradient all-reduced and cast to
    fp32 (`_cast_grad_to_param_dtype`); fused AdamW's two fp32 states and a device step counter for each
    original parameter (use_orig_params: the optimizer holds the views, 21 of them)."""
    opt = fake[VARIANTS[2]]["phases"]["optimizer"]
    full = block(4 * ROOT) + 2 * block(4 * LAYER)
    assert opt["parameters"] == full == 857_600 and opt["gradients"] == full
    layer = [64 * 64, 32 * 64, 32 * 64, 64 * 64, 160 * 64, 160 * 64, 64 * 160, 64, 64]
    originals = [1000 * 64, 64, 1000 * 64] + 2 * layer
    assert len(originals) == 21
    assert opt["optimizer_states"] == sum(2 * block(4 * n) + 512 for n in originals) == 1_728_000


def test_no_shard_accumulation_with_tied_embeddings_fails_in_torch(monkeypatch):
    """A real tiny run: torch 2.13 FSDP1 NO_SHARD with bf16 MixedPrecision, use_orig_params and no_sync accumulation
    assigns a tied weight's bf16 gradient to its fp32 view (fsdp/_flat_param.py `_use_sharded_grad_views`) and
    raises; the estimator refuses that configuration (tests/test_fsdp1_strategies.py)."""
    from dataclasses import replace

    from validation.hf.models import MODELS

    tiny = MODELS["tiny-llama"]
    tied = replace(tiny, id="tiny-llama-tied", hf={**tiny.hf, "tie_word_embeddings": True})
    monkeypatch.setitem(MODELS, "tiny-llama-tied", tied)
    with pytest.raises(RuntimeError, match="grad_dtype"):
        measure(Run("tiny-llama-tied", 4, 64, 2, accumulation=2, strategy="NO_SHARD"), fake=False)
    measure(Run("tiny-llama-tied", 4, 64, 2, accumulation=2), fake=False)  # FULL_SHARD runs
