"""A stage's step part (its model states and transients: estimator/memory/static_stage.step_part) is kept by
the setup it reads (estimator/memory/step_setup.py): the training setup with the fields it does not read sealed.
These tests prove the fields sealed are not read (the step part built from the user's setup is the same across
their values), that a read of a sealed field fails loudly, and that a search's micro-batch sizes, losses and
recompute settings share one step part per stage."""

from __future__ import annotations

import dataclasses
import itertools

import pytest

from estimator import Hardware, Parallel, Training
from estimator.memory import memory, static_stage
from estimator.memory.components import Component
from estimator.memory.resolved import resolve
from estimator.memory.step_setup import UnreadField, sealed_fields, step_setup
from estimator.models.presets import get_architecture
from estimator.spec.errors import ConfigError

# (model, training, layout): one per framework the step part reads differently
SETUPS = {
    "hf": ("llama-3.1-8b", dict(framework="hf"), dict(dp=4)),
    "hf-autocast": ("llama-3.1-8b", dict(framework="hf", param_dtype="fp32"), dict(dp=2)),
    "deepspeed-zero3": ("llama-3.1-8b", dict(framework="deepspeed"), dict(dp=8, zero_stage=3)),
    "torchtune": ("llama-3.1-8b", dict(framework="torchtune"), dict(dp=8)),
    "fsdp2": ("llama-3.1-8b", dict(framework="fsdp2"), dict(dp=8)),
    "megatron-tp1": ("qwen3-30b-a3b", dict(framework="megatron"), dict(pp=2, dp=4, ep=4)),
    "megatron-tp2-sp": ("llama-3.1-8b", dict(framework="megatron"), dict(tp=2, pp=2, dp=2)),
}
VALUES = {"micro_batch_size": (1, 2, 4), "loss": ("fused", "chunked"), "recompute": ("none", "selective", "full")}


def _rendered(value):
    """A step part as plain data: every number, and every formula written out (some are written on first read)."""
    if isinstance(value, Component):
        return (value.key, value.label, value.bytes, value.formula, value.source, _rendered(value.parts))
    if isinstance(value, dict):
        return {k: _rendered(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_rendered(v) for v in value]
    if callable(value):  # the model states' formulas
        return _rendered(value())
    return value


def _step_parts(name: str, **fields) -> list:
    """The rendered step parts of every stage of SETUPS[name] with `fields` set, built from the user's setup
    itself (not the sealed one): what they would be were nothing sealed."""
    model, training, layout = SETUPS[name]
    cfg = resolve(get_architecture(model), Training(**{**training, **fields}), Parallel(**layout), Hardware("h100-80"))
    shared = memory._shared_of(cfg, memory._stage_memo(cfg))
    inputs = static_stage.StepShared(shared.communication, shared.moe_communication, shared.runtime, shared.hardware)
    return [_rendered(static_stage.step_part(cfg.architecture, cfg.training, cfg.recipe, cfg.parallel, sp,
                                             cfg.zero_stage, inputs, {}))
            for sp in cfg.stages]


@pytest.mark.parametrize("name", SETUPS)
def test_a_step_part_is_the_same_for_every_value_of_a_field_its_setup_seals(name):
    model, training, layout = SETUPS[name]
    cfg = resolve(get_architecture(model), Training(**training), Parallel(**layout))
    sealed = [f for f in sealed_fields(cfg.training, cfg.parallel, cfg.recipe) if f in VALUES]
    first, compared = _step_parts(name), 0
    for values in itertools.product(*(VALUES[f] for f in sealed)):
        try:
            parts = _step_parts(name, **dict(zip(sealed, values)))
        except ConfigError:  # a combination the framework refuses (torchtune's selective recompute)
            continue
        assert parts == first, (name, sealed, values)
        compared += 1
    assert compared >= 2, (name, sealed)  # DeepSpeed ZeRO-3 seals the loss alone: its two values


def test_the_fields_read_are_kept_and_change_the_step_part():
    """Where a step part reads a field its setup keeps it: Megatron's global memory buffer with sequence
    parallelism holds s*b*h gathered over TP (activations/moe.global_memory_buffer), so the micro-batch size
    changes it; FSDP2 reads the loss and the recompute setting; autocast's weight copies read the recompute."""
    cases = {"megatron-tp2-sp": "micro_batch_size", "fsdp2": "loss", "hf-autocast": "recompute",
             "deepspeed-zero3": "recompute_layers"}  # ZeRO-3's hook order (zero3_trace.py)
    for name, field in cases.items():
        model, training, layout = SETUPS[name]
        cfg = resolve(get_architecture(model), Training(**training), Parallel(**layout))
        assert field not in sealed_fields(cfg.training, cfg.parallel, cfg.recipe)
    # the buffer: s*b*h gathered over TP, its 1/TP share per GPU (sequence parallel): 2 B (bf16) x 8,192 x b x 4,096,
    # 64 MiB more on every stage (StepPart.states, index 6) for b = 1 -> 2
    one, two = (_step_parts("megatron-tp2-sp", micro_batch_size=b, seq_len=8192) for b in (1, 2))
    assert [p[6] for p in two] == [p[6] + 2 * 8192 * 4096 for p in one]
    # fsdp2 ZeRO-3's last stage gathers the head unit alone under the chunked loss (transients._titan_gathered)
    assert _step_parts("fsdp2", loss="chunked") != _step_parts("fsdp2", loss="fused")
    assert _step_parts("hf-autocast", recompute="full") != _step_parts("hf-autocast", recompute="none")


def test_a_sealed_field_fails_loudly_when_read():
    arch = get_architecture("llama-3.1-8b")
    par = Parallel(dp=4)
    cfg = resolve(arch, Training(framework="hf"), par)
    setup = step_setup(arch, cfg.training, sealed_fields(cfg.training, par, cfg.recipe))
    uses = (lambda: setup.micro_batch_size * 2, lambda: setup.loss == "chunked", lambda: f"{setup.loss}",
            lambda: setup.recompute != "full", lambda: bool(setup.recompute_layers),
            lambda: setup.loss in ("fused",), lambda: setup.loss.startswith("f"), lambda: setup.micro_batch_size > 1)
    for use in uses:
        with pytest.raises(UnreadField, match="step part read training"):
            use()
    # setups differing in sealed fields alone are one key; the fields kept are the user's
    other = resolve(arch, Training(framework="hf", micro_batch_size=4, loss="chunked", recompute="full"), par)
    again = step_setup(arch, other.training, sealed_fields(other.training, par, other.recipe))
    assert again == setup and hash(again) == hash(setup)
    assert setup.framework == "hf" and setup.seq_len == cfg.training.seq_len


def test_a_future_read_of_a_sealed_field_fails_the_estimate(monkeypatch):
    """Were FSDP1's step part (which counts the micro-batches its no_sync accumulates: fsdp1.transients) keyed
    without the micro-batch size, the estimate raises rather than share one step part across sizes."""
    from estimator.memory import step_setup as module

    monkeypatch.setattr(module, "_reads_micro_batch", lambda training, par: False)
    arch = dataclasses.replace(get_architecture("llama-3.1-8b"))  # nothing remembered
    with pytest.raises(UnreadField, match="micro_batch_size"):
        memory.estimate(arch, Training(framework="fsdp1", global_batch_size=64), Parallel(dp=8))


def test_a_search_builds_one_step_part_per_stage_for_its_micro_batches_losses_and_recomputes(monkeypatch):
    built = []
    make = memory.step_part
    monkeypatch.setattr(memory, "step_part", lambda *args: built.append(args[4].stage) or make(*args))
    arch = dataclasses.replace(get_architecture("qwen3-30b-a3b"))  # nothing remembered
    par = Parallel(pp=2, dp=4, ep=4)
    for b, loss, recompute in itertools.product((1, 2, 4), ("fused", "chunked"), ("none", "selective", "full")):
        memory.device_total(arch, Training(framework="megatron", micro_batch_size=b, loss=loss, recompute=recompute,
                                           global_batch_size=64), par)
    assert sorted(built) == [0, 1]  # 18 setups, two stages: each stage's step part built once
