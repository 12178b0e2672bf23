"""DeepSpeed ZeRO-3's gathered parameters (estimator/memory/zero3_replay.py, zero3_trace.py), by hand from
DeepSpeed v0.12.3's and v0.19.5's runtime/zero/partitioned_param_coordinator.py: every module hook gathers its own
parameters, then prefetches whole tensors of the recorded order until min(max_live - its count, bucket) elements
are under way; a module's parameters are released after it unless the prefetcher marked a later use or they come
back within the reuse window; the count restarts each micro-batch, so a parameter still gathered from the one
before (the embedding: no hook releases it after its backward) lowers it when released."""

from __future__ import annotations

import json
from pathlib import Path

from estimator import estimate_config
from estimator.memory.zero3_replay import Trace, replay
from estimator.memory.zero3_trace import build_trace
from estimator.models.loading import load_config


def forward_trace(*steps: tuple[tuple[int, int], ...]) -> Trace:
    return Trace(tuple(steps), tuple(f"s{i}" for i in range(len(steps))), len(steps), frozenset())


A, B, C, D = ((0, 10),), ((1, 10),), ((2, 10),), ((3, 10),)


def test_every_hook_prefetches_so_a_module_without_parameters_lets_it_run_ahead():
    """Bucket 5 under tensors of 10: each hook takes one whole tensor. s0 gathers a and prefetches b (20), releases a;
    s1 (no parameters) prefetches c (20); s2 (b, already under way) prefetches d: b, c, d = 30."""
    trace = forward_trace(A, (), B, (), C, D)
    assert replay(trace, 5, 100, 0).forward == 30 and replay(trace, 5, 100, 0).forward_at == "s2"
    # max_live 20 stops the prefetch at s2 (min(20 - 20, 5) = 0): never more than 20 gathered
    assert replay(trace, 5, 20, 0).forward == 20
    # max_live 15: s0 may still prefetch 5 elements and takes b whole: 20, over the bound
    assert replay(trace, 5, 15, 0).forward == 20
    # no prefetch (bucket 0): one module at a time
    assert replay(trace, 0, 100, 0).forward == 10


def test_the_reuse_window_is_counted_in_elements_of_the_modules_between():
    """No prefetch. After s0 the walk passes b (5 elements): with a window of 5 it stops before a's next use (5 >= 5)
    and a is released; with 6 it meets a, kept through s1 (a + b = 15)."""
    trace = forward_trace(A, ((1, 5),), A)
    assert replay(trace, 0, 100, 5).forward == 10
    assert replay(trace, 0, 100, 6).forward == 15


def test_a_parameter_held_from_the_micro_batch_before_lets_the_prefetch_pass_max_live_by_its_size():
    """e (10) is gathered at the start and not counted. s0: its own, prefetch b (count 10; e, b gathered); e released
    (count 0, gathered 10). s1 prefetches c (count 10), s2 d (count 20): b, c, d = 30 gathered for max_live 20.
    Without e held: s2's prefetch finds the count at 20 and stops: 20."""
    trace = forward_trace(((9, 10),), (), (), B, C, D)
    assert replay(trace, 5, 20, 0, held=frozenset({9})).forward == 30
    assert replay(trace, 5, 20, 0).forward == 20


TINY = {"hidden_size": 64, "num_layers": 2, "num_attention_heads": 4, "intermediate_size": 128, "vocab_size": 1000}


class WholeModel:  # one stage: the embedding, both layers, the head
    first = last = True
    chunks = (range(2),)


def names(config: dict) -> tuple[list[str], Trace]:
    cfg = load_config(config)
    trace = build_trace(cfg.architecture, cfg.training, WholeModel, 640)
    return list(trace.names), trace


def test_the_hooks_meet_a_llama_layer_as_transformers_runs_it():
    """q, k, v, o 64 x 64 = 4,096 elements, gate and up 64 x 128 = 8,192, down 8,192: over 10 h = 640, gathered; the
    norms (64) are persistent. Backward: a container's hook fires before its children, which run in reverse; under
    gradient checkpointing the layer's forward runs again first; the embedding's backward closes the trace."""
    config = {"model": TINY, "training": {"framework": "deepspeed", "recompute": "full"},
              "parallel": {"dp": 2, "zero_stage": 3}}
    got, trace = names(config)
    layer1 = ["layer 1", "layer 1 input norm", "layer 1 mixer", "layer 1 q_proj", "layer 1 k_proj", "layer 1 v_proj",
              "layer 1 o_proj", "layer 1 norm", "layer 1 mlp", "layer 1 fc1.gate", "layer 1 fc1.up", "layer 1 fc2"]
    start = got.index("layer 1")
    assert got[start:start + 12] == layer1
    assert got[start + 12:start + 16] == ["final norm", "lm_head", "model (backward)", "decoder (backward)"]
    assert got[start + 16:start + 18] == ["lm_head (backward)", "final norm (backward)"]
    assert got[start + 18:start + 30] == [n + " (recomputed)" for n in layer1]
    assert got[start + 30:start + 36] == [n + " (backward)" for n in (
        "layer 1", "layer 1 mlp", "layer 1 fc2", "layer 1 fc1.up", "layer 1 fc1.gate", "layer 1 norm")]
    assert got[-1] == "embedding (backward)" and trace.keeps == {len(got) - 1}
    sizes = {n: sum(e for _, e in s) for n, s in zip(got, trace.steps)}
    assert (sizes["layer 1 q_proj"], sizes["layer 1 fc1.gate"], sizes["layer 1 fc2"], sizes["lm_head"]) == \
        (64 * 64, 64 * 128, 128 * 64, 1000 * 64)
    assert sizes["layer 1 input norm"] == sizes["layer 1 mixer"] == 0


def test_a_lora_layer_runs_its_dropout_a_and_b_after_the_base():
    """PEFT's LoRA Linear: base, lora_dropout, lora_A (r x in = 16 x 64 = 1,024 elements, over 640: gathered) and
    lora_B (out x r); backward: base, B, A, dropout."""
    config = {"model": TINY, "training": {"framework": "deepspeed", "adapter": {"rank": 16, "target_modules": ["q"]}},
              "parallel": {"dp": 2, "zero_stage": 3}}
    got, trace = names(config)
    sizes = {n: sum(e for _, e in s) for n, s in zip(got, trace.steps)}
    start = got.index("layer 0 q_proj")
    assert got[start:start + 5] == ["layer 0 q_proj", "layer 0 q_proj lora_dropout", "layer 0 q_proj lora_A",
                                    "layer 0 q_proj lora_B", "layer 0 k_proj"]
    assert sizes["layer 0 q_proj lora_A"] == 16 * 64 and sizes["layer 0 q_proj lora_B"] == 64 * 16
    back = got.index("layer 0 q_proj (backward)")
    assert got[back:back + 4] == ["layer 0 q_proj (backward)", "layer 0 q_proj lora_B (backward)",
                                  "layer 0 q_proj lora_A (backward)", "layer 0 q_proj lora_dropout (backward)"]
    # no gradient checkpointing: the adapter run's embedding output needs no gradient, no backward hook
    assert "embedding (backward)" not in got and not trace.keeps


def test_qwen_72b_lora_on_4_gpus_gathers_past_max_live_by_the_embedding():
    """Qwen's 72B LoRA row (ZeRO-3, 4 GPUs, 8 micro-batches a step, gradient checkpointing): each micro-batch starts
    with the embedding (152,064 x 8,192 = 1,245,708,288 elements) gathered from the backward before, outside the
    coordinator's count, so the prefetcher holds at least stage3_max_live_parameters (1e9) beyond it, 2 B each: over
    4.49 GB where one layer and the bucket were counted (872,415,232 + int(0.9 x 8,192^2) elements, 1.87 GB)."""
    data = json.loads((Path(__file__).parent / "data/measured/published_finetune/qwen.json").read_text())
    row = next(r for r in data["rows"] if r["id"] == "qwen-72b-lora-zero3-s256")
    stage = estimate_config(row["config"]).stages[0]
    phases = {p.name: {c.label: c for q in p.components for c in (q.parts or (q,))} for p in stage.phases}
    label = "Gathered parameters (ZeRO-3 prefetch up to stage3_max_live_parameters)"
    embedding = 152_064 * 8_192
    layer = 4 * 8_192 * 8_192 + 3 * 8_192 * 24_576
    assert layer == 872_415_232
    for phase in ("forward", "backward"):
        gathered = phases[phase][label].bytes / 2
        assert 1_000_000_000 + embedding <= gathered <= 1_000_000_000 + 2 * embedding
        assert "held from the micro-batch before" in phases[phase][label].formula
    assert phases["backward"][label].bytes > 2 * (layer + int(0.9 * 8_192 ** 2)) + 2 * embedding


def test_with_one_micro_batch_a_step_the_embedding_is_held_only_before_deepspeed_0_15_4():
    """Through v0.15.3 reset_step ran at the end of the backward (stage3.py backward), before the optimizer step
    released the embedding, so the count starts an embedding (152,064 x 8,192) low in every micro-batch; from
    v0.15.4 it runs at the forward's start (parameter_offload.py _start_of_forward_hook), after that release."""
    data = json.loads((Path(__file__).parent / "data/measured/published_finetune/qwen.json").read_text())
    config = next(r for r in data["rows"] if r["id"] == "qwen-72b-lora-zero3-s256")["config"]
    config = json.loads(json.dumps(config))
    config["training"]["global_batch_size"] = 4  # one micro-batch a step on 4 GPUs
    label = "Gathered parameters (ZeRO-3 prefetch up to stage3_max_live_parameters)"

    def backward(version: str | None) -> tuple[int, str]:
        if version:
            config["training"]["framework_version"] = version
        stage = estimate_config(config).stages[0]
        part = next(c for p in stage.phases if p.name == "backward" for q in p.components for c in (q.parts or (q,))
                    if c.label == label)
        return part.bytes // 2, part.formula

    old, old_text = backward("0.12.3")
    new, new_text = backward("0.19.5")
    assert backward(None)[0] == new  # 0.19.5 is the default
    assert "1,245,708,288 elements, held" in old_text and "held" not in new_text
    assert old >= 1_000_000_000 + 152_064 * 8_192 > new


def test_from_deepspeed_0_19_3_the_embedding_is_not_held_between_micro_batches():
    """Qwen's 72B LoRA row (8 micro-batches a step on 4 GPUs) under 0.19.5: each backward's end releases the embedding
    (stage3.py backward_epilogue -> release_backward_leftovers, from v0.19.3), so no micro-batch starts with its
    152,064 x 8,192 = 1,245,708,288 elements (2 B each: 2,491,416,576 B) gathered outside the count, as under 0.12.3:
    the gathered parameters are those of one micro-batch a step."""
    data = json.loads((Path(__file__).parent / "data/measured/published_finetune/qwen.json").read_text())
    config = json.loads(json.dumps(next(r for r in data["rows"] if r["id"] == "qwen-72b-lora-zero3-s256")["config"]))
    label = "Gathered parameters (ZeRO-3 prefetch up to stage3_max_live_parameters)"

    def gathered(version: str, global_batch: int) -> dict[str, tuple[int, str]]:
        config["training"].update(framework_version=version, global_batch_size=global_batch)
        stage = estimate_config(config).stages[0]
        return {p.name: next((c.bytes, c.formula) for q in p.components for c in (q.parts or (q,)) if c.label == label)
                for p in stage.phases if p.name in ("forward", "backward")}

    assert 152_064 * 8_192 == 1_245_708_288 and 2 * 1_245_708_288 == 2_491_416_576
    old, new, one = gathered("0.12.3", 32), gathered("0.19.5", 32), gathered("0.19.5", 4)
    for phase in ("forward", "backward"):
        assert "the embedding, 1,245,708,288 elements, held" in old[phase][1]
        assert new[phase] == one[phase] and "held" not in new[phase][1]
        assert old[phase][0] >= 2 * (1_000_000_000 + 1_245_708_288) > new[phase][0]


def test_on_one_rank_zero_3_gathers_nothing():
    """partition_parameters.py all_gather_coalesced: with one partition _no_gather_coalesced points each parameter at
    its own partition, so there is no gathered copy; Qwen-1.8B's full fine-tuning on one GPU charges none."""
    data = json.loads((Path(__file__).parent / "data/measured/published_finetune/qwen.json").read_text())
    config = next(r for r in data["rows"] if r["id"] == "qwen-1.8b-full-s256")["config"]
    stage = estimate_config(config).stages[0]
    assert not [c for p in stage.phases for q in p.components for c in (q.parts or (q,))
                if c.label.startswith("Gathered parameters")]
    config = json.loads(json.dumps(config))
    config["parallel"]["dp"] = 2
    stage = estimate_config(config).stages[0]
    assert [c for p in stage.phases for q in p.components for c in (q.parts or (q,))
            if c.label.startswith("Gathered parameters")]
