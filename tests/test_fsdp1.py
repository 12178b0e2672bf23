"""PyTorch FSDP1 (training.framework "fsdp1", estimator/fsdp1.py) against hand computation and the
harness records (tests/data/measured/fsdp1, validation/fsdp1)."""

import json
from pathlib import Path

import pytest

from estimator import estimate_config
from estimator.spec.errors import ConfigError

RECORDS = Path(__file__).parent / "data" / "measured" / "fsdp1"
# Llama-3.1-8B: a decoder layer (q, o 4096 x 4096; k, v 1024 x 4096; gate, up, down 14336 x 4096; two norms)
LAYER = 2 * 4096 * 4096 + 2 * 1024 * 4096 + 3 * 14336 * 4096 + 2 * 4096
ROOT = 2 * 128_256 * 4096 + 4096  # embedding, head, final norm
ADAPTERS = 16 * ((4096 + 4096) + 2 * (4096 + 1024) + (4096 + 4096) + 3 * (4096 + 14336)) * 32


def record(name: str) -> dict:
    return json.loads((RECORDS / f"fsdp1-llama-3.1-8b-{name}.json").read_text())


def phase_component(cfg: dict, phase: str, label: str) -> int:
    result = estimate_config(cfg)
    stage = next(s for s in result.stages if s.stage == result.peak_stage)
    components = next(p for p in stage.phases if p.name == phase).components
    return sum(piece.bytes for c in components for piece in (c.parts or (c,)) if label in piece.label)


def test_the_root_unit_stays_gathered_and_the_next_layer_is_prefetched():
    """Forward holds the bf16 root unit; backward starts with it and the last layer's unit (BACKWARD_PRE):
    the two unsharded FlatParameters the harness saw at backward's peak (2,004 MiB and 416 MiB)."""
    assert LAYER == 218_112_000
    cfg = record("full-w8-recompute-s4096-b1")["config"]
    assert phase_component(cfg, "forward", "Unsharded root unit") == 2 * ROOT
    assert phase_component(cfg, "backward", "Unsharded root unit and the prefetched layer") == 2 * (ROOT + LAYER)


def test_no_sync_keeps_every_unsharded_gradient():
    """Two micro-batches, the first under no_sync(): 2 B (bf16) x every parameter more at the last
    micro-batch's peak, estimated and measured (to FSDP's padding)."""
    params = 32 * LAYER + ROOT
    cfg = record("full-w8-recompute-s4096-b1-ga2-nosync")["config"]
    assert phase_component(cfg, "forward", "no_sync") == 2 * params
    grown = record("full-w8-recompute-s4096-b1-ga2-nosync")["measured"]["peak_bytes"] - \
        record("full-w8-recompute-s4096-b1")["measured"]["peak_bytes"]
    assert grown == pytest.approx(2 * params, rel=1e-4)


def test_lora_units_give_their_frozen_weights_gradients():
    """With use_orig_params a layer's frozen weights share its FlatParameter with the adapters: each rank
    keeps the fp32 sharded gradient of whole layers; the frozen root unit has none (measured to the byte)."""
    rec = record("lora-r16-all7-w8-recompute-s4096-b1")
    by_hand = 4 * (32 * LAYER + ADAPTERS) // 8
    assert by_hand == rec["measured"]["phases"]["optimizer"]["gradients"] == 3_510_763_520
    result = estimate_config(rec["config"])
    step = next(p for p in result.stages[0].phases if p.name == "optimizer")
    assert next(c.bytes for c in step.components if c.key == "gradients") == by_hand


def test_rank_zero_holds_the_first_adapters_of_each_layer():
    """A rank's slice is contiguous in registration order: rank 0's first 1/8 of a layer (27.3M elements)
    covers q, k, v (25.2M) with their LoRA A and B, not o's adapters (after o's own 16.8M): its fused AdamW
    keeps two fp32 states of those and a step counter (a 512-byte block) for each of the six."""
    qkv = 16 * ((4096 + 4096) + 2 * (4096 + 1024))
    rank_slice = (LAYER + ADAPTERS // 32) // 8
    assert 4096 * 4096 + 2 * 1024 * 4096 + qkv < rank_slice < 2 * 4096 * 4096 + 2 * 1024 * 4096
    by_hand = 32 * (8 * qkv + 6 * 512)
    assert by_hand == record("lora-r16-all7-w8-recompute-s4096-b1")["measured"]["optimizer_states"] == 75_595_776


def test_eager_attention_holds_the_last_layers_gradients_and_its_own_unit_at_its_softmax_backward():
    """Llama-3.2-1B (tied), eager attention, no recompute, 4 ranks: the backward peaks in the last layer's softmax
    backward, beside what FSDP1's FlatParameter split holds (its backward node waits for every piece of a unit) in
    bf16: the tied embedding's gradient from the head and the final norm's, the last layer's o_proj, gate, up,
    down and post-attention norm gradients; and two layer units, the last layer's and the prefetched one
    (`python -m validation.fsdp1 explain` of the s8192 record: mm 128256 x 2048, 2 x mm 8192 x 2048, mm 2048 x
    8192, mm 2048 x 2048, 2 x sum 2048, 2 x 232.02 MiB units beside the root's). SHARD_GRAD_OP counts every unit
    already; at 4096 tokens the loss's moment is still the larger (as measured)."""
    V, h, f = 128_256, 2048, 8192
    held = 2 * (V * h + h + h * h + 3 * f * h + h)
    unit = 2 * (4 * h * h // 2 + 2 * 512 * h + 3 * f * h + 2 * h)  # q, o; k, v (8 KV heads of 64); MLP; norms
    assert unit == 2 * 60_821_504  # the unit the harness saw: 60,821,504 bf16 elements
    full = json.loads((RECORDS / "fsdp1-llama-3.2-1b-full-w4-norecompute-s8192-b1-eager.json").read_text())["config"]
    assert phase_component(full, "backward", "held by their FlatParameter's split") == held == 634_396_672
    assert phase_component(full, "backward", "The last layer's own unit") == unit
    grad_op = json.loads((RECORDS / "fsdp1-llama-3.2-1b-full-w4-norecompute-s8192-b1-shardgradop-eager.json")
                         .read_text())["config"]
    assert phase_component(grad_op, "backward", "held by their FlatParameter's split") == held
    assert phase_component(grad_op, "backward", "The last layer's own unit") == 0
    short = json.loads((RECORDS / "fsdp1-llama-3.2-1b-full-w4-norecompute-s4096-b1-eager.json").read_text())["config"]
    assert phase_component(short, "backward", "held by their FlatParameter's split") == 0
    assert phase_component(short, "backward", "fp32 gradients of the log-softmax") > 0


def test_every_record_within_half_a_percent():
    for path in sorted(RECORDS.glob("*.json")):
        rec = json.loads(path.read_text())
        result = estimate_config(rec["config"])
        stage = next(s for s in result.stages if s.stage == result.peak_stage)
        tensors = stage.allocated_peak_bytes - stage.component("workspace").bytes
        assert tensors == pytest.approx(rec["measured"]["peak_bytes"], rel=0.005), path.stem


@pytest.mark.parametrize("change, field", [
    ({"parallel": {"tp": 2, "dp": 4}}, "parallel.tp"),
    ({"parallel": {"dp": 8, "zero_stage": 2}}, "parallel.zero_stage"),
    ({"training": {"offload_optimizer": "cpu", "offload_parameters": "cpu"}}, "training.offload_optimizer"),
])
def test_what_is_not_modelled_is_refused(change, field):
    cfg = record("full-w8-recompute-s4096-b1")["config"]
    for section, values in change.items():
        cfg[section].update(values)
    with pytest.raises(ConfigError) as err:
        estimate_config(cfg)
    assert err.value.field == field


@pytest.mark.parametrize("adapter, field", [
    ({"method": "qlora", "rank": 16, "alpha": 32}, "training.adapter.method"),
    ({"method": "lora", "rank": 16, "alpha": 32, "base_dtype": "int8"}, "training.adapter.base_dtype"),
])
def test_a_quantized_base_is_refused_under_fsdp1(adapter, field):
    """FSDP1 flattens a unit into one FlatParameter of one dtype: QLoRA runs there with bf16-packed codes and PEFT's
    own wrap policy (a unit per LoRA module), which is not the Trainer's per-layer units modelled (fsdp1.py)."""
    cfg = {"model": "llama-3.1-8b", "parallel": {"dp": 2},
           "training": {"framework": "fsdp1", "seq_len": 2048, "recompute": "full", "adapter": adapter}}
    with pytest.raises(ConfigError) as error:
        estimate_config(cfg)
    assert error.value.field == field and "PEFT's own wrap policy" in str(error.value)
