"""bitsandbytes' paged optimizers (training.optimizer "paged_adamw", "paged_adamw8bit"; estimator/memory/paged.py):
states of tensors with >= 1e5 elements in cudaMallocManaged memory, outside PyTorch's allocator: on the
device (and so in its total and nvidia-smi) while it has room, in host memory when paged out. Hand counts."""

import json
from pathlib import Path

import pytest

from estimator import estimate_config
from estimator.spec.errors import ConfigError

GPU = Path(__file__).parent / "data" / "measured" / "gpu"
MiB = 2**20


def qlora(optimizer: str) -> dict:
    record = json.loads((GPU / "llama-3.1-8b-qlora-bnb-r16-all7-recompute-drop00-s4096-b1.json").read_text())
    cfg = record["config"]
    cfg["training"]["optimizer"] = optimizer
    return estimate_config(cfg).to_json()


# LoRA rank 16 on Llama-3.1-8B: of each layer's 14 adapter matrices only gate's and up's B (14336 x 16) and
# down's A (16 x 14336) reach 1e5 elements (229,376); q's, k's, v's, o's and down's B and every other A
# (16 x 4096 = 65,536 at most) stay ordinary tensors (get_state_buffer: `p.numel() < 1e5`)
PAGED_ELEMENTS = 3 * 14336 * 16 * 32


def test_large_states_leave_the_allocator_for_managed_memory():
    plain, paged = qlora("adamw"), qlora("paged_adamw")
    managed = 2 * 4 * PAGED_ELEMENTS  # two fp32 moments
    assert managed == 176_160_768
    stage = paged["stages"][0]
    assert stage["outside_allocator"]["managed"] == managed
    # not in max_memory_allocated nor max_memory_reserved; in the device total (nvidia-smi) while on the GPU
    # ... nor torch's fused AdamW's 512-byte step counter per trainable tensor (32 layers x 7 modules x A and B),
    # which bitsandbytes' paged optimizer keeps on the host
    counters = 512 * 32 * 7 * 2
    assert plain["allocated_peak_bytes"] - paged["allocated_peak_bytes"] == managed + counters
    assert stage["components"]["optimizer_states"] == \
        plain["stages"][0]["components"]["optimizer_states"] - managed - counters
    outside = sum(stage["outside_allocator"].values())
    assert paged["device_total_bytes"] - paged["reserved_peak_bytes"] == outside
    # and the host memory they need when the driver pages them out
    assert paged["host_memory"]["cpu"] == {"Paged optimizer states, when paged out to the host": managed}


def test_eight_bit_pages_one_byte_per_state():
    """PagedAdamW8bit: two uint8 states paged; the fp32 absmax per 256-element block stays in the allocator."""
    paged = qlora("paged_adamw8bit")
    assert paged["stages"][0]["outside_allocator"]["managed"] == 2 * PAGED_ELEMENTS == 44_040_192
    adapters = 16 * ((4096 + 4096) + 2 * (4096 + 1024) + (4096 + 4096) + 3 * (4096 + 14336)) * 32
    in_allocator = 2 * (1 + 4 / 256) * adapters - 2 * PAGED_ELEMENTS
    assert paged["stages"][0]["components"]["optimizer_states"] == pytest.approx(in_allocator, abs=1)


def test_full_fine_tuning_pages_every_matrix_but_not_the_norms():
    """Llama-3.2-1B, full fine-tuning: every weight matrix (the tied embedding once) has >= 1e5 elements, the
    2,048-element norm scales do not."""
    cfg = {"model": "llama-3.2-1b", "training": {"framework": "hf", "seq_len": 1024, "optimizer": "paged_adamw"},
           "parallel": {"dp": 1}}
    layer = 2 * 2048 * 2048 + 2 * 512 * 2048 + 3 * 8192 * 2048
    matrices = 16 * layer + 128_256 * 2048
    out = estimate_config(cfg).to_json()
    # fp32 states of the bf16 weights: bitsandbytes' 32-bit optimizers keep fp32 whatever the parameter's dtype
    assert out["stages"][0]["outside_allocator"]["managed"] == 2 * 4 * matrices


@pytest.mark.parametrize("framework", ["deepspeed", "megatron", "fsdp2"])
def test_refused_where_no_stack_builds_them(framework):
    cfg = {"model": "llama-3.2-1b", "training": {"framework": framework, "seq_len": 1024,
                                                  "optimizer": "paged_adamw8bit"}, "parallel": {"dp": 8}}
    with pytest.raises(ConfigError) as err:
        estimate_config(cfg)
    assert err.value.field == "training.optimizer"
