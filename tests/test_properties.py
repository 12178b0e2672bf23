"""Properties over random valid configurations (hypothesis)."""

import dataclasses
import json

from hypothesis import HealthCheck, assume, given, settings, strategies as st

from estimator import Architecture, Parallel, Training, estimate
from estimator.spec.errors import ConfigError
from estimator.memory.components import NON_ALLOCATOR
from estimator.memory.sharding import chunk_kind_counts, layers_key, stored_kind_counts
from estimator.memory.activations.attention import megatron_fused_softmax
from estimator.memory.megatron_fsdp import moments_at_global_shape

TENSOR_KEYS = ("parameters", "gradients", "master_weights", "optimizer_states")


@st.composite
def configs(draw):
    heads = draw(st.sampled_from([8, 16, 32]))
    kv = draw(st.sampled_from([h for h in (1, 2, 4, 8, 16, 32) if heads % h == 0]))
    head_dim = draw(st.sampled_from([64, 128]))
    layers = draw(st.sampled_from([4, 8, 12, 16]))
    moe = draw(st.booleans())
    arch = Architecture(
        hidden_size=heads * head_dim, num_layers=layers, num_attention_heads=heads, num_kv_heads=kv,
        intermediate_size=draw(st.sampled_from([1024, 2048, 4096])), vocab_size=draw(st.sampled_from([32000, 50257])),
        gated_mlp=draw(st.booleans()), norm=draw(st.sampled_from(["rmsnorm", "layernorm"])),
        tie_embeddings=draw(st.booleans()), qk_norm=draw(st.booleans()),
        num_experts=8 if moe else 0, num_experts_per_token=2 if moe else None,
        moe_intermediate_size=512 if moe else None)
    framework = draw(st.sampled_from(["megatron", "fsdp2", "deepspeed", "hf"]))
    training = Training(
        framework=framework, seq_len=draw(st.sampled_from([512, 1024, 2048])),
        micro_batch_size=draw(st.sampled_from([1, 2])),
        param_dtype=draw(st.sampled_from(["bf16", "fp32"])),
        optimizer=draw(st.sampled_from(["adamw", "sgd_momentum", "adafactor", "lion", "muon"])),
        recompute=draw(st.sampled_from(["none", "selective", "full"])),
        attention=draw(st.sampled_from(["flash", "eager"])), loss=draw(st.sampled_from(["standard", "fused", "chunked"])))
    tp = draw(st.sampled_from([t for t in (1, 2, 4) if kv % t == 0]))
    pp = draw(st.sampled_from([p for p in (1, 2, 4) if layers % p == 0]))
    zero = {"hf": 0, "fsdp2": draw(st.sampled_from([0, 2, 3]))}.get(framework, draw(st.integers(0, 3)))
    par = Parallel(tp=tp, pp=pp, dp=draw(st.sampled_from([1, 2, 4])), zero_stage=zero,
                   sequence_parallel=tp > 1 and (moe or draw(st.booleans())))
    return arch, training, par


def grow(training: Training, **changes) -> Training:
    fields = {k: getattr(training, k) for k in training.__dataclass_fields__}
    fields.update(changes)
    return Training(**fields)


def run(arch, training, par):
    try:
        return estimate(arch, training, par)
    except ConfigError:
        assume(False)


SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@SETTINGS
@given(configs())
def test_never_negative_and_components_add_up(config):
    result = run(*config)
    for stage in result.stages:
        tensors = sum(c.bytes for c in stage.components if c.key not in NON_ALLOCATOR)
        assert tensors == stage.allocated_peak_bytes
        assert sum(c.bytes for c in stage.components) == stage.device_total_bytes
        assert all(c.bytes >= 0 for c in stage.components)
        for part_owner in stage.components:
            if part_owner.parts:
                assert sum(p.bytes for p in part_owner.parts) == part_owner.bytes
        assert stage.allocated_peak_bytes == max(p.allocated_bytes for p in stage.phases)
        assert dict(stage.phase_totals) == {p.name: p.allocated_bytes for p in stage.phases}
    assert result.device_total_bytes == max(s.device_total_bytes for s in result.stages)
    json = result.to_json()
    for key in ("parameters", "gradients", "optimizer_states", "activations", "communication", "runtime",
                "fragmentation"):
        assert all(key in s["components"] for s in json["stages"])


@SETTINGS
@given(configs(), st.sampled_from(["seq_len", "micro_batch_size"]))
def test_more_tokens_never_lower_the_peak(config, field):
    arch, training, par = config
    grown = grow(training, **{field: getattr(training, field) * 2})
    # Megatron's eager attention: more tokens can make the fused softmax available (b x heads/t a multiple of 4:
    # FusedScaleMaskSoftmax.is_kernel_available), which keeps one 16-bit output where torch's softmax kept more
    assume(training.framework != "megatron"
           or megatron_fused_softmax(arch, training, par) == megatron_fused_softmax(arch, grown, par))
    base = run(arch, training, par)
    bigger = run(arch, grown, par)
    assert most_allocated(bigger) >= most_allocated(base)


@SETTINGS
@given(configs())
def test_more_layers_never_lower_the_peak(config):
    arch, training, par = config
    base = run(arch, training, par)
    fields = {k: getattr(arch, k) for k in arch.__dataclass_fields__}
    fields["num_layers"] = arch.num_layers * 2
    deeper = run(Architecture(**fields), training, par)
    assert most_allocated(deeper) >= most_allocated(base)


def most_allocated(result) -> int:
    """The largest allocated peak of any stage. The estimate's own `allocated_peak_bytes` is that of the stage with
    the largest device total, which more tokens can move to a stage whose allocated peak is lower (a pipelined
    FSDP2 stage 0 whose cache grows past the last stage's: its allocated peak is not the largest)."""
    return max(s.allocated_peak_bytes for s in result.stages)


def state_bytes(result):
    # per-GPU parameter, gradient and optimizer memory of the most loaded stage, as at the step
    return max(sum(c.bytes for c in s.phases[-1].components if c.key in TENSOR_KEYS) for s in result.stages)


def with_parallel(par: Parallel, **changes) -> Parallel:
    fields = {k: getattr(par, k) for k in ("tp", "pp", "dp", "cp", "ep", "zero_stage", "sequence_parallel")}
    fields.update(changes)
    fields["sequence_parallel"] = fields["tp"] > 1  # SP moves activations only, never model states
    return Parallel(**fields)


@SETTINGS
@given(configs(), st.sampled_from(["tp", "pp", "zero_stage"]))
def test_more_sharding_never_raises_model_states(config, knob):
    arch, training, par = config
    base = run(arch, training, par)
    if knob == "zero_stage":
        assume(par.zero_stage < 3)
        assume(not (training.framework == "fsdp2" and par.zero_stage == 0))  # 0 -> 1 is not an FSDP2 mode
        # Megatron-FSDP under Megatron-Core 0.16 (TE 2.10-2.11's FusedAdam) holds Adam's moments at the parameters'
        # whole shape: ZeRO 3 can hold more than 2 there (memory/megatron_fsdp.py, tests/test_megatron_fsdp.py)
        assume(not moments_at_global_shape(training, par.zero_stage + 1))
        changed = with_parallel(par, zero_stage=par.zero_stage + 1)
    else:
        changed = with_parallel(par, **{knob: getattr(par, knob) * 2})
    more = run(arch, training, changed)
    assert state_bytes(more) <= state_bytes(base)


@st.composite
def moe_configs(draw):
    """Random valid MoE layouts: EP and ETP inside the TP x CP x DP GPUs of a stage."""
    experts = draw(st.sampled_from([8, 16]))
    arch = Architecture(
        hidden_size=1024, num_layers=draw(st.sampled_from([4, 8])), num_attention_heads=16,
        num_kv_heads=draw(st.sampled_from([4, 8, 16])), vocab_size=32000, num_experts=experts,
        num_experts_per_token=draw(st.sampled_from([1, 2, 4])), moe_intermediate_size=512,
        num_shared_experts=draw(st.sampled_from([0, 1])), first_dense_layers=draw(st.sampled_from([0, 1])),
        intermediate_size=2048)
    training = Training(framework=draw(st.sampled_from(["megatron", "deepspeed"])),
                        seq_len=draw(st.sampled_from([1024, 2048])), micro_batch_size=draw(st.sampled_from([1, 2])),
                        recompute=draw(st.sampled_from(["none", "selective", "full"])),
                        moe_capacity_factor=draw(st.sampled_from([1.0, 1.25])))
    tp = draw(st.sampled_from([1, 2]))
    par = Parallel(tp=tp, dp=draw(st.sampled_from([4, 8])), pp=draw(st.sampled_from([1, 2])),
                   zero_stage=draw(st.sampled_from([0, 1, 2])), sequence_parallel=tp > 1)
    return arch, training, par


def with_ep(par: Parallel, ep: int) -> Parallel:
    return Parallel(tp=par.tp, dp=par.dp, pp=par.pp, zero_stage=par.zero_stage, sequence_parallel=par.sequence_parallel,
                    ep=ep)


@SETTINGS
@given(moe_configs())
def test_more_expert_parallelism_never_raises_model_states(config):
    arch, training, par = config
    # DeepSpeed ZeRO-1 under EP partitions the experts in groups of their own (stage_1_and_2.py
    # _configure_moe_settings), and grads_in_partition holds every tensor overlapping a rank's share whole
    # (copy_grads_in_partition): the rank whose dense share is one large tensor (the embedding) also gets its expert
    # share, so its step can hold more than with EP 1, where the experts were dense tensors of the Trainer's groups
    assume(not (training.framework == "deepspeed" and par.zero_stage == 1))
    base = run(arch, training, par)
    more = run(arch, training, with_ep(par, par.ep * 2))
    assert state_bytes(more) <= state_bytes(base)


@SETTINGS
@given(moe_configs())
def test_more_experts_per_token_never_lower_the_peak(config):
    arch, training, par = config
    assume(arch.num_experts_per_token * 2 <= arch.num_experts)
    fields = {k: getattr(arch, k) for k in arch.__dataclass_fields__}
    fields["num_experts_per_token"] = arch.num_experts_per_token * 2
    base = run(arch, training, par)
    more = run(Architecture(**fields), training, par)
    assert most_allocated(more) >= most_allocated(base)
    assert state_bytes(more) == state_bytes(base)  # top-k moves activations, never parameters


@SETTINGS
@given(configs(), st.sampled_from([(0, 1), (1, 1), (0, 2), (1, 2), (0, 3), (1, 3)]),
       st.lists(st.tuples(st.sampled_from([None, 1, 2, 3]), st.sampled_from([1, 2]), st.sampled_from([1, 2, 4]),
                          st.sampled_from([1, 2]), st.sampled_from([1, 2]), st.sampled_from([512, 2048]),
                          st.sampled_from(["fused", "chunked", "standard"])),
                min_size=2, max_size=6))
def test_what_an_architecture_remembers_never_changes_an_estimate(config, moe_pattern, steps):
    # a layout search and an app rerun read the checked configuration, the ledger, the stage split and
    # the stages' static parts and groups back from the architecture's memo (memory._stage_memo), keyed
    # by what each reads; every estimate of a sequence on one architecture object must equal the same
    # estimate made from nothing (a fresh copy of the architecture), formulas and sources included. MoE
    # models get dense first layers or MoE every 2nd or 3rd layer, so that where a stage's layers sit matters;
    # the loss varies too (stages without the head share their static parts across losses)
    arch, training, par = config
    if arch.is_moe:
        arch = dataclasses.replace(arch, first_dense_layers=moe_pattern[0], moe_layer_frequency=moe_pattern[1])
    checked = 0
    for layers, every, pp, vpp, micro, seq, loss in steps:
        try:
            tr = grow(training, recompute="full" if layers or every > 1 else training.recompute,
                      recompute_layers=None if every > 1 else layers, recompute_every=every,
                      micro_batch_size=micro, seq_len=seq, loss=loss)
            layout = Parallel(tp=par.tp, pp=pp, vpp=vpp if pp > 1 else 1, dp=par.dp, zero_stage=par.zero_stage,
                              sequence_parallel=par.sequence_parallel)
            remembered = estimate(arch, tr, layout)
        except ConfigError:
            continue
        fresh = estimate(dataclasses.replace(arch), tr, layout)
        assert json.dumps(remembered.to_json(), sort_keys=True) == json.dumps(fresh.to_json(), sort_keys=True)
        checked += 1
    assume(checked >= 2)


@SETTINGS
@given(st.integers(0, 3), st.integers(1, 3), st.booleans(),
       st.lists(st.tuples(st.integers(0, 40), st.integers(0, 40), st.integers(1, 6)), min_size=1, max_size=3))
def test_stages_grouped_by_their_layers_key_store_the_same_layers(first_dense, frequency, moe, chunk_specs):
    # memory._training_stages lets stages whose chunks have the same key (sharding.layers_key) share
    # what full recompute leaves stored: the kinds of the layers after the first n, or of those
    # every N-th layer checkpointing leaves, must then be the same wherever the chunks sit
    arch = Architecture(hidden_size=512, num_layers=64, num_attention_heads=8, intermediate_size=1024,
                        vocab_size=32000, num_experts=8 if moe else 0, num_experts_per_token=2 if moe else None,
                        moe_intermediate_size=256 if moe else None, first_dense_layers=first_dense if moe else 0,
                        moe_layer_frequency=frequency if moe else 1)
    one = tuple(range(a, a + n) for a, _, n in chunk_specs)
    other = tuple(range(b, b + n) for _, b, n in chunk_specs)
    if layers_key(arch, one) != layers_key(arch, other):
        return
    for skip in range(sum(len(r) for r in one) + 1):
        assert chunk_kind_counts(arch, one, skip) == chunk_kind_counts(arch, other, skip)
    for every in (2, 3):
        assert stored_kind_counts(arch, one, every) == stored_kind_counts(arch, other, every)
