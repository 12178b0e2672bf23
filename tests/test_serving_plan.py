"""`serve-plan --users N --context L` (estimator/serving/planner.py): fewest GPUs first, one estimate per layout
searched (its time: bench/bench_serve_plan.py)."""

from __future__ import annotations

import json
import math

import pytest

from estimator.cli import main
from estimator.spec.hardware import Hardware
from estimator.spec.parallel import Parallel
from estimator.models.presets import get_architecture, get_hf_config
from estimator.serving.planner import serve_plan
from estimator.spec.serving import Serving
from estimator.serving.vllm_engine import estimate_vllm


def plan(model="llama-3.1-70b", gpu="h100-80", users=100, context=32768, **serving):
    return serve_plan(get_architecture(model), Serving(**serving), Hardware(gpu), users, context, get_hf_config(model))


def test_each_option_is_its_replica_estimate_times_replicas():
    p = plan()
    assert p.options
    for o in p.options:
        again = estimate_vllm(get_architecture("llama-3.1-70b"), o.serving, o.parallel, Hardware("h100-80"),
                              get_hf_config("llama-3.1-70b"))
        per = min(int(again.capacity.max_concurrency), again.resolved.max_num_seqs)
        assert o.sequences_per_replica == per >= 1 and again.starts
        assert o.replicas == math.ceil(100 / per)
        assert o.gpus == o.parallel.tp * o.parallel.pp * o.replicas
        assert o.serving.max_model_len == 32768


def test_fewest_gpus_first_and_none_missed():
    """Options come fewest GPUs first. With the checkpoint as given (bf16 weights and KV), a TP-8 replica of
    Llama-3.1-70B holds blocks // 2048 sequences of 32k (one KV head per rank: 80 layers x 16 tokens x 2 x
    128 x 2 B a block), so 100 users need ceil(100 / that) replicas."""
    p = plan()
    assert [o.gpus for o in p.options] == sorted(o.gpus for o in p.options)
    unchanged = serve_plan(get_architecture("llama-3.1-70b"), Serving(kv_cache_dtype="auto"), Hardware("h100-80"),
                           100, 32768, get_hf_config("llama-3.1-70b"), limit=500)
    bf16 = [o for o in unchanged.options if not o.changes]
    tp8 = next(o for o in bf16 if (o.parallel.tp, o.parallel.pp) == (8, 1))
    stage = tp8.result.limiting
    blocks = stage.available // (80 * 16 * 2 * 1 * 128 * 2)
    assert tp8.result.capacity.num_blocks == blocks
    # the budget from CUDA's 79.19 GiB total (vllm_engine.py); 41 since the CUDA graphs taken from it are vLLM's
    # estimate as modelled: FA3's 64 MiB pool + its FULL graph's driver memory, then 50 further captures of each mode
    # at their graphs' driver memory (10.8 and 3.1 MiB: 80 layers; serving/cuda_graphs.py), 0.74 GiB
    assert tp8.sequences_per_replica == blocks // 2048 == 41
    assert tp8.gpus == 8 * math.ceil(100 / 41) == 24
    # no 16-GPU layout holds 100: two 8-GPU replicas hold 2 x 41 (or 40) < 100
    assert bf16[0].gpus == min(o.gpus for o in bf16) == 24


def test_one_estimate_per_layout_searched(monkeypatch):
    """What bounds a serve plan's work (its time: bench/bench_serve_plan.py): each replica layout is
    estimated once, and the layouts are TP 1, 2, 4, 8 (within the node of 8) x PP 1, 2, 4, 8 x the serving
    variants: the model's KV dtype or fp8, and the checkpoint's weight format or another
    (ALTERNATIVE_FORMATS less the checkpoint's own)."""
    from estimator.serving import planner
    estimated = []
    real = planner.estimate_serving
    monkeypatch.setattr(planner, "estimate_serving",
                        lambda arch, serving, par, *a: estimated.append((par.tp, par.pp)) or real(arch, serving, par, *a))
    p = serve_plan(get_architecture("deepseek-v3"), Serving(), Hardware("h200"), 64, 65536, get_hf_config("deepseek-v3"))
    assert p.options[0].gpus == 8
    # an fp8 checkpoint: as loaded or AWQ int4, each with its KV dtype or fp8
    assert len(estimated) == p.searched == 4 * 4 * 2 * 2
    assert len(set(estimated)) == 4 * 4 and all(estimated.count(layout) == 4 for layout in set(estimated))
    estimated.clear()
    p = plan()  # Llama-3.1-70B, a bf16 checkpoint: as loaded, fp8 or AWQ int4
    assert len(estimated) == p.searched == 4 * 4 * 3 * 2


def test_cli_json_and_bad_input(capsys, tmp_path):
    path = tmp_path / "c.json"
    path.write_text(json.dumps({"model": "llama-3.1-8b"}))
    assert main(["serve-plan", "--config", str(path), "--users", "10", "--context", "8192", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    first = data["options"][0]
    assert first["gpus"] == 1 and first["parallel"] == {"tp": 1, "pp": 1, "dp": 1} and first["serving_changes"] == {}
    assert first["serving"]["max_model_len"] == 8192
    assert main(["serve-plan", "--config", str(path), "--users", "10", "--context", "999999999"]) == 2
    assert "serving.max_model_len" in capsys.readouterr().err
