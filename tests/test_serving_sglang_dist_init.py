"""What SGLang's process groups hold before its pre-load reading (estimator/serving/sglang_dist_init.py), by
hand from the sizes read in SGLang 0.4.9 / 0.5.5 / 0.5.23, and how it lowers the pools."""

from __future__ import annotations

import pytest

from estimator.models.presets import get_architecture, get_hf_config
from estimator.serving.sglang_dist_init import held_before_load
from estimator.serving.sglang_engine import estimate_sglang, pre_load_bytes
from estimator.spec.hardware import Hardware
from estimator.spec.parallel import Parallel
from estimator.spec.serving import Serving

MiB = 2**20
KiB = 2**10
# one NCCL communicator's ring, NCCL_CUMEM_ENABLE=0 and NVLS off: 24 channels x (receive: 4 KiB header + LL
# 512 KiB + LL128 4,800 KiB + SIMPLE 4 MiB, aligned to 2 MiB = 10 MiB; send: 4 KiB aligned to 2 MiB)
RING = 24 * (10 + 2) * MiB
# 0.4.9 / 0.5.5 custom all-reduce: cudaMalloc(meta_size + 8 MiB) in 2 MiB pages (10 MiB) + cudaMalloc(8 MiB) +
# torch.empty(8 MiB), a 20 MiB segment of torch's caching allocator
LEGACY_AR = 10 * MiB + 8 * MiB + 20 * MiB


def _round2(n):
    return -(-n // (2 * MiB)) * 2 * MiB


def _v2(tp, push):
    """0.5.23 CustomAllReduceV2: slab (2 x TP push slots + 16 MiB pull + 64 x 128 B + 9,216 B signal pad) in 2 MiB
    pages + graph_params (131,072 x TP x 8 B, a 20 MiB segment) + the push counter (a 2 MiB small segment)."""
    return _round2(2 * tp * push + 16 * MiB + 64 * 128 + 9216) + 20 * MiB + 2 * MiB


@pytest.mark.parametrize("release,tp,pp,expected", [
    ((0, 5, 23), 4, 1, RING + _v2(4, 896 * KiB)),      # 288 + 24 + 22 = 334 MiB
    ((0, 5, 23), 8, 1, RING + _v2(8, 128 * KiB)),      # 288 + 20 + 22 = 330 MiB
    ((0, 5, 23), 2, 1, RING + _v2(2, 16 * MiB)),       # push clipped to 16 MiB: 288 + 82 + 22 = 392 MiB
    ((0, 5, 23), 3, 1, RING + _v2(3, 3 * MiB)),        # v2 takes TP 3: 288 + 36 + 22 = 346 MiB
    ((0, 5, 5), 4, 1, RING + LEGACY_AR),                # 288 + 38 = 326 MiB
    ((0, 5, 5), 3, 1, RING),                            # the legacy custom all-reduce refuses TP 3
    ((0, 5, 23), 2, 2, 2 * RING + _v2(2, 16 * MiB)),   # the PP group's communicator too, no custom all-reduce
    ((0, 5, 23), 1, 2, RING),
])
def test_held_by_hand(release, tp, pp, expected):
    held = held_before_load(release, tp, pp, 1, "h100-80")
    assert held.bytes == expected
    assert held.component.bytes == expected and held.component.key == "dist_init"
    assert held.note is None


def test_values_by_hand_in_mib():
    assert held_before_load((0, 5, 23), 4, 1, 1, "h200").bytes == 334 * MiB
    assert held_before_load((0, 5, 5), 8, 1, 1, "h200").bytes == 326 * MiB


def test_nothing_on_one_gpu_and_a_note_where_not_modelled():
    assert held_before_load((0, 5, 23), 1, 1, 1, "h100-80").bytes == 0
    other = held_before_load((0, 5, 23), 4, 1, 1, "l40s")
    assert other.bytes == 0 and other.component is None and "not modelled on l40s" in other.note
    moe = held_before_load((0, 5, 23), 8, 1, 2, "h100-80")
    assert moe.bytes == RING + _v2(8, 128 * KiB) and "EP 2" in moe.note


def _sglang(model, gpu, tp, pp=1, **serving):
    return estimate_sglang(get_architecture(model), Serving(engine="sglang", **serving), Parallel(tp=tp, pp=pp),
                           Hardware(gpu), get_hf_config(model))


def test_the_term_lowers_the_pre_load_memory_and_shows_in_the_output():
    """Llama-3.1-70B on 4 H100s: pre = 81,559 MiB - the CUDA context (804,061,184 B) - 334 MiB; the static share
    is pre x mem_fraction_static and the pools get that less the weights."""
    e = _sglang("llama-3.1-70b", "h100-80", 4, mem_fraction_static=0.9, max_model_len=8192)
    pre = 81_559 * MiB - 804_061_184 - 334 * MiB
    assert pre_load_bytes(e) == pre
    assert e.budget_bytes == int(pre * 0.9)
    assert e.limiting.available == e.budget_bytes - e.limiting.weights
    term = next(c for c in e.limiting.components if c.key == "dist_init")
    assert term.bytes == 334 * MiB and "NCCL" in term.formula and "custom_all_reduce_v2.py" in term.source
    assert e.to_json()  # the term travels with the stage's components
    # at TP 1 nothing is held, and the release key changes the custom all-reduce (0.5.5: 326 MiB)
    assert pre_load_bytes(_sglang("llama-3.1-8b", "h100-80", 1, max_model_len=8192)) == 81_559 * MiB - 804_061_184
    old = _sglang("llama-3.1-70b", "h100-80", 4, mem_fraction_static=0.9, max_model_len=8192, engine_version="0.5.5")
    assert pre_load_bytes(old) == 81_559 * MiB - 804_061_184 - 326 * MiB


def test_the_serving_page_keeps_the_term_outside_the_budget():
    """The Serving page's split (ui/serving_view.py split_rows) counts a term inside the static share unless its
    label says it lies outside: the process groups come before the share is taken, so the budget left over after
    the weights and the pool stays under one token's cell (48,128 B for Qwen3-235B-A22B at TP 4)."""
    from ui.serving_view import split_rows
    e = _sglang("qwen3-235b-a22b", "h100-80", 4, weight_format="fp8", mem_fraction_static=0.93)
    rows = {r["term"]: r["GiB"] for r in split_rows(e)}
    assert rows["Process groups (outside the static share)"] * 2**30 == pytest.approx(334 * MiB)
    left = e.budget_bytes - e.limiting.weights - e.capacity.kv_cache_bytes
    assert 0 <= left < 48_128
    assert rows.get("Budget left over (less than a block)", 0) * 2**30 == pytest.approx(left)
