"""The FSDP1 measuring harness (validation/fsdp1/): fake-tensor measurements of torch's
FullyShardedDataParallel, wrapped as the HF Trainer with Accelerate wraps it, equal real CPU runs
of tiny models byte for byte, and the sharded states agree with hand computation."""

import pytest

pytest.importorskip("torch", reason="the FSDP1 harness needs torch (the [validate] extra)")
pytest.importorskip("transformers", reason="the FSDP1 harness needs transformers (the [validate] extra)")
pytest.importorskip("peft", reason="the FSDP1 LoRA case needs peft")

from validation.fsdp1.step import Run, measure  # noqa: E402
from validation.core.tracker import cuda_block_bytes as block  # noqa: E402

VARIANTS = [
    Run("tiny-llama", 8, 64, 2),
    Run("tiny-llama", 8, 64, 2, accumulation=2),
    Run("tiny-llama", 8, 64, 2, recompute="full", lora_rank=4),
]


@pytest.fixture(scope="module")
def fake():
    return {run: measure(run) for run in VARIANTS}


@pytest.mark.parametrize("run", VARIANTS, ids=lambda r: f"ga{r.accumulation}-{r.recompute}-lora{r.lora_rank}")
def test_fake_measurement_equals_real_cpu_run(run, fake):
    assert fake[run] == measure(run, fake=False)


# tiny-llama (validation/hf/models.py): hidden 64, vocab 1000, 2 layers of q 64x64, k and v 32x64, o 64x64,
# gate and up 160x64, down 64x160, two norms of 64; the root unit holds the embedding, the head and the
# final norm. FSDP1 pads each FlatParameter to a multiple of the world size (8).
LAYER = 64 * 64 + 2 * 32 * 64 + 64 * 64 + 3 * 160 * 64 + 2 * 64  # 43,136
ROOT = 2 * 1000 * 64 + 64  # 128,064


def shard(numel: int, world: int = 8) -> int:
    return -(-numel // world)


def test_sharded_fp32_parameters_and_gradients_by_hand(fake):
    """Each unit keeps its fp32 shard (the FlatParameter, the master copy); after backward the sharded
    fp32 gradient of each unit exists; fused AdamW keeps two fp32 states per shard and one step each."""
    m = fake[VARIANTS[0]]
    params = block(4 * shard(ROOT)) + 2 * block(4 * shard(LAYER))
    assert params == 64_512 + 2 * 22_016
    opt = m["phases"]["optimizer"]
    assert opt["parameters"] == params and opt["gradients"] == params


def test_no_sync_keeps_the_unsharded_gradients(fake):
    """Under no_sync() the first micro-batch's gradients stay unsharded, in the param dtype of the mixed
    precision (bf16), for every unit (torch 2.13 fsdp/_runtime_utils.py `_post_backward_hook` returns
    before the reduce-scatter): the second micro-batch's forward starts with them."""
    plain, accumulated = fake[VARIANTS[0]], fake[VARIANTS[1]]
    unsharded = block(2 * 8 * shard(ROOT)) + 2 * block(2 * 8 * shard(LAYER))
    grown = accumulated["phases"]["forward"]["total"] - plain["phases"]["forward"]["total"]
    assert grown == unsharded


def test_lora_gradients_cover_the_frozen_weights_of_a_unit(fake):
    """With use_orig_params a decoder layer's FlatParameter holds its frozen weights and its adapters: the
    layer units' sharded gradients are full-size (frozen weights included); the frozen root has none."""
    m = fake[VARIANTS[2]]
    adapters = 4 * ((64 + 64) + 2 * (64 + 32) + (64 + 64) + 3 * (64 + 160))  # r (in + out) per module
    assert m["phases"]["optimizer"]["gradients"] == 2 * block(4 * shard(LAYER + adapters))
