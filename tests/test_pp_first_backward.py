"""torch pipelining's 1F1B over FSDP2: rank 0, running every forward first, never holds all its
micro-batches' layer inputs beside all its unsharded gradients (estimator/memory/pp_first_backward.py)."""

from __future__ import annotations

import inspect
from types import SimpleNamespace

import pytest

from estimator import estimate_config
from estimator.memory.pp_first_backward import fewer_at_first_backward
from estimator.memory.sharding import Bucket, StageParameters
from estimator.spec.parallel import Parallel
from estimator.spec.training import Training

MIB = 2**20
# a small Llama: h 1024, 8 heads (no GQA), MLP 4096, vocab 32,000; 4 layers on each of 2 stages
LAYER = 4 * 1024 * 1024 + 3 * 1024 * 4096 + 2 * 1024  # q, k, v, o + gate, up, down + two RMSNorms: 16,779,264
EMBEDDING = 32_000 * 1024


def config(m: int = 2, framework: str = "fsdp2", **parallel) -> dict:
    return {"model": {"name": "tiny", "hidden_size": 1024, "num_layers": 8, "num_attention_heads": 8,
                      "num_kv_heads": 8, "intermediate_size": 4096, "vocab_size": 32_000},
            "training": {"framework": framework, "seq_len": 2048, "micro_batch_size": 1, "global_batch_size": 2 * m,
                         "recompute": "full"},
            "parallel": {"pp": 2, "dp": 2, "pp_schedule": "1f1b", "pp_first_stage_layers": 4, **parallel}}


def backward(stage) -> dict:
    """The backward phase's components and their parts, by label (its top-level ones under "")."""
    phases, _ = stage.detail.built(stage)
    top = next(p for p in phases if p.name == "backward").components
    assert sum(c.bytes for c in top) == stage.phase_totals[1][1] and all(c.bytes >= 0 for c in top)
    assert all(sum(p.bytes for p in c.parts) == c.bytes for c in top if c.parts)
    return {"": top, **{c.label: c for c in top}, **{p.label: p for c in top for p in c.parts}}


def negative(stage) -> list:
    return [c for label, c in backward(stage).items() if label and c.bytes < 0]


def test_rank_zero_later_backwards_hold_one_microbatch_fewer_beside_every_gradient():
    est = estimate_config(config())
    first, second = est.stages
    held = backward(first)
    # full AC keeps each layer's bf16 input: 2 B x 2,048 tokens x 1,024 = 4 MiB, 4 layers, 2 micro-batches in
    # flight, and the embedding's 8 B per token of each micro-batch
    one = 4 * 4 * MIB + 8 * 2048
    assert held["4 recomputed layers keep their input"].bytes == 2 * 4 * 4 * MIB
    assert held["token ids"].bytes == 2 * 8 * 2048
    assert held["One micro-batch fewer once every gradient exists (all forwards ran first)"].bytes == -one
    # beside every unsharded gradient in fp32 and the running layer's in bf16: 4 B x (4 layers + embedding) + 2 B x one
    gradients = held["Unsharded gradients accumulated over the micro-batches"]
    assert gradients.bytes == 4 * (4 * LAYER + EMBEDDING) + 2 * LAYER == 433_098_752
    assert held["Activations"].bytes == one  # the parts: 2 micro-batches, less one
    assert [c.label for c in negative(first)] == ["One micro-batch fewer once every gradient exists (all forwards "
                                                  "ran first)"]
    # the last rank runs a forward after its first backward (warm-up 1 of 2): unchanged
    assert not negative(second)


@pytest.mark.parametrize("change", [{"m": 4}, {"framework": "megatron"}, {"vpp": 2, "m": 4}])
def test_only_a_warm_up_of_every_micro_batch_under_fsdp2(change):
    """m = 2 pp: rank 0 runs a forward after its first backward (2 in flight, every gradient made); Megatron
    keeps persistent gradient buffers; the interleaved schedule is not this rule's."""
    m = change.pop("m", 2)
    est = estimate_config(config(m, **({"framework": change.pop("framework")} if "framework" in change else {}),
                                 **change))
    assert not negative(est.stages[0])


def stage(layers: int, layer: float, root: float) -> StageParameters:
    local = layers * layer + root
    return StageParameters(0, (("dense", layers),), Bucket(dense=local), layer, root, (range(layers),), first=True)


def walk(k: int, layers: int, a: float, outside: float, g: float, root_g: float) -> float:
    """Rank 0's held activations + fp32 gradients at every backward step, layer by layer in the order
    Schedule1F1B runs them (all k forwards, then the k backwards; each walks the layers last to first, a
    layer's gradient made as its input is freed, the root unit's (embedding's) at the end)."""
    inputs = k * (layers * a + outside)
    grads, peak = 0.0, 0.0
    for mb in range(k):
        for i in range(layers):
            made = grads if mb else i * g  # the first micro-batch makes each layer's gradient
            peak = max(peak, inputs + made + (g if not mb else 0))  # the running layer's own, first time
            inputs -= a
        grads = layers * g + root_g
        inputs -= outside
    return peak


@pytest.mark.parametrize("k, layers, a, outside, g, root_g", [
    (8, 15, 128.0, 0.1, 1600.0, 1000.0),  # 405B-like: the later backwards' start (k - 1 micro-batches, all gradients)
    (4, 4, 900.0, 1.0, 50.0, 30.0),  # activations dominate: the first backward's start
    (4, 8, 10.0, 1.0, 50.0, 2.0),  # small root, layers' gradients over one layer's inputs: the first backward's end
])
def test_three_moments_bound_the_layer_walk(k, layers, a, outside, g, root_g):
    """Hand numbers (MiB, G = 4 B: `g` a layer's fp32 gradient): the credit makes the charged peak, k micro-batches
    beside every gradient, equal the walk's."""
    G = 4
    sp = stage(layers, g / G * MIB, root_g / G * MIB)
    training = Training(framework="fsdp2")
    par = Parallel(pp=k, dp=2)  # k micro-batches, k stages: rank 0 warms up with all of them

    def held(n: float) -> int:
        return int(round(n * (layers * a + outside) * MIB))

    recipe = SimpleNamespace(grad_dtype="fp32")  # all the rule reads of the recipe
    fewer = fewer_at_first_backward(training, recipe, par, sp, k, float(k), held, outside * MIB)
    charged = held(k) + (layers * g + root_g) * MIB
    assert (charged + sum(c.bytes for c in fewer)) / MIB == pytest.approx(walk(k, layers, a, outside, g, root_g),
                                                                         abs=1e-3)


def test_torch_schedule_1f1b_warms_rank_zero_up_with_every_micro_batch():
    """The premise, in the installed torch's own code (2.13 here; 2.6.0 reads the same):
    warmup_chunks = min(n_microbatches, num_stages - stage_index), then a backward before each forward."""
    schedules = pytest.importorskip("torch.distributed.pipelining.schedules")
    text = inspect.getsource(schedules.Schedule1F1B._step_microbatches)
    assert "self._num_stages - self._stage.stage_index" in text
    assert text.index("self._stage.backward_one_chunk(") < text.rindex("self._stage.forward_one_chunk(")


# --- the interleaved schedule, replayed (estimator/memory/pp_interleaved_moments.py) ----------------------

@pytest.mark.parametrize("p, v, m", [(2, 2, 2), (4, 2, 4), (4, 3, 4), (8, 2, 8), (4, 2, 8), (8, 4, 16)])
def test_the_replayed_order_is_torchs_own(p, v, m):
    """rank_operations against the installed torch's ScheduleInterleaved1F1B._calculate_single_rank_operations
    (its per-rank order, computed without a process group), and its most layers in flight against the
    estimate's in-flight count (pipeline.interleaved_in_flight, the micro-batch group = torch's round of p)."""
    from estimator.memory.pipeline import interleaved_in_flight
    from estimator.memory.pp_interleaved_moments import largest_moment, rank_operations

    schedules = pytest.importorskip("torch.distributed.pipelining.schedules")
    torch_schedule = schedules.ScheduleInterleaved1F1B.__new__(schedules.ScheduleInterleaved1F1B)
    torch_schedule.n_local_stages, torch_schedule.pp_group_size, torch_schedule._n_microbatches = v, p, m
    torch_schedule.number_of_rounds = max(1, m // p)
    torch_schedule.microbatches_per_round = m // torch_schedule.number_of_rounds
    for rank in range(p):
        theirs = [("F" if a.computation_type == schedules._ComputationType.FORWARD else "B", a.stage_index // p)
                  for a in torch_schedule._calculate_single_rank_operations(rank) if a is not None]
        assert rank_operations(rank, p, v, m) == theirs
        _, top = largest_moment(theirs, (1,) * v, lambda x: 0, 0.0, (0.0,) * v, 0.0)
        assert top == interleaved_in_flight(rank, p, v, m, p) * v


@pytest.mark.parametrize("a, g, largest, what", [
    (1.0, 3.0, 15.0, "chunk 0's first backward, at its first layer"),  # gradients dominate
    (3.0, 1.0, 25.0, "chunk 1's first backward, at its start"),  # inputs dominate
])
def test_an_interleaved_rank_zero_by_hand(a, g, largest, what):
    """PP 2, 2 chunks of 2 layers, 2 micro-batches: rank 0 warms up with all 4 chunk-forwards (min(1 x 2 + 2 x 1,
    4)), then backs chunk 1 twice and chunk 0 twice. With a layer's input `a` per micro-batch and its gradient
    `g`: 8a + g (chunk 1's first start), 7a + 2g (its first layer), 6a + 2g, 4a + 3g, 3a + 4g (chunk 0's first
    layer), 2a + 4g; the charge is 8a + 4g."""
    from estimator.memory.pp_interleaved_moments import largest_moment, rank_operations

    ops = rank_operations(0, 2, 2, 2)
    assert ops == [("F", 0), ("F", 0), ("F", 1), ("F", 1), ("B", 1), ("B", 1), ("B", 0), ("B", 0)]
    moment, top = largest_moment(ops, (2, 2), lambda stacks: stacks * 4 * a, g, (2 * g, 2 * g), 0.0)
    assert (moment.bytes, moment.what, top) == (largest, what, 8)


def test_an_interleaved_small_llama_by_hand():
    """The small Llama on PP 2 with 2 chunks each (2 layers a chunk), 2 micro-batches: rank 0's layers' fp32
    gradients (4 B x 16.8M each) outweigh a layer's input (4 MiB), so its largest moment is chunk 0's second
    backward: half a stack's inputs (2 layers of one micro-batch) and the embedding's 8 B per token beside every
    gradient, against the charged 2 stacks: 1.5 x 4 layers x 4 MiB + 8 x 2,048 less. On the last rank the loss's
    moment (its 32,000-word logits) is the charged one: the replay lowers nothing there (pp_last_rank.py)."""
    est = estimate_config(config(2, vpp=2, pp_first_stage_layers=None))
    first, last = est.stages
    fewer = {c.label: c for c in negative(first)}
    inputs = fewer["Layer inputs freed before the largest moment (interleaved schedule replayed)"]
    assert inputs.bytes == -(3 * 4 * MIB * 2 + 8 * 2048) and "chunk 0's backward" in inputs.formula
    assert len(fewer) == 1  # every gradient exists at that moment
    assert not negative(last)


# --- the interleaved last rank (estimator/memory/pp_last_rank.py) -----------------------------------------

def last_rank_walk(p: int, v: int, m: int, n: int, a: float, g: float, head: float, loss: float,
                   other: float) -> float:
    """The last rank's held inputs + fp32 gradients, layer by layer in the order the installed torch's
    ScheduleInterleaved1F1B._calculate_single_rank_operations gives rank p - 1 (`n` layers a chunk, `a` a layer's
    input per micro-batch, `g` its gradient, `head` the final norm's and head's): each loss moment (before the
    head's backward, in the last chunk's backwards) holds `loss` more, every other backward moment `other` more
    (a recomputed layer); a chunk's first backward makes the head's gradient first (last chunk), then each
    layer's as that layer's backward runs."""
    schedules = pytest.importorskip("torch.distributed.pipelining.schedules")
    torch_schedule = schedules.ScheduleInterleaved1F1B.__new__(schedules.ScheduleInterleaved1F1B)
    torch_schedule.n_local_stages, torch_schedule.pp_group_size, torch_schedule._n_microbatches = v, p, m
    torch_schedule.number_of_rounds = max(1, m // p)
    torch_schedule.microbatches_per_round = m // torch_schedule.number_of_rounds
    inputs, grads, begun, peak = 0.0, 0.0, set(), 0.0
    for action in torch_schedule._calculate_single_rank_operations(p - 1):
        if action is None:
            continue
        chunk = action.stage_index // p
        if action.computation_type == schedules._ComputationType.FORWARD:
            inputs += n * a
            continue
        first = chunk not in begun
        begun.add(chunk)
        if chunk == v - 1:
            peak = max(peak, inputs + grads + loss)
            grads += head if first else 0.0
        for j in range(n):  # the chunk's layers, last to first: this one's input held, its gradient made
            made = (j + 1) * g if first else 0.0
            peak = max(peak, inputs + grads + made + other)
            inputs -= a
        grads += n * g if first else 0.0
    return peak


@pytest.mark.parametrize("p, v, m, a, g, head, loss, other", [
    (2, 2, 2, 1.0, 3.0, 2.0, 1.0, 2.0),  # gradients dominate: chunk 0's first backward, at its first layer
    (4, 2, 4, 3.0, 1.0, 0.5, 2.0, 3.0),  # inputs dominate: the last chunk's backwards
    (4, 2, 4, 1.0, 1.0, 2.0, 5.0, 1.0),  # the loss's moment is charged (5 >= 1 + 2 unbegun): nothing changes
    (4, 2, 4, 1.0, 3.0, 2.0, 6.0, 1.0),  # the other moments charged (1 > 6 - 6), the loss's the peak under the replay
    (4, 2, 4, 1.0, 6.0, 2.0, 10.0, 1.0),  # gradients dominate on PP 4: chunk 0's first backward, at its first layer
    (4, 3, 4, 2.0, 2.0, 1.0, 3.0, 2.0),
])
def test_an_interleaved_last_rank_against_the_layer_walk(p, v, m, a, g, head, loss, other):
    """Hand numbers (MiB; G = 4 B): the estimate charges the last rank its in-flight inputs beside every gradient
    and the larger of the loss's moment less the earlier chunks' gradients (gradients_after_the_loss) and the
    other moments (`other`); with the replay's parts the charge is the layer walk's peak."""
    from estimator.memory.pipeline import interleaved_in_flight
    from estimator.memory.pp_last_rank import fewer_on_the_last_rank
    from estimator.memory.pp_unbegun import gradients_after_the_loss

    n, G = 2, 4
    layers = v * n
    local = (layers * g + head) / G * MIB
    chunks = tuple(range((c * p + p - 1) * n, (c * p + p) * n) for c in range(v))
    sp = StageParameters(p - 1, (("dense", layers),), Bucket(dense=local), g / G * MIB, head / G * MIB, chunks,
                         first=False, last=True)
    training, recipe = Training(framework="fsdp2"), SimpleNamespace(grad_dtype="fp32")
    par = Parallel(pp=p, vpp=v, dp=2, pp_schedule="interleaved")
    inflight = interleaved_in_flight(p - 1, p, v, m, p)

    def held(stacks: float) -> int:
        return int(round(stacks * layers * a * MIB))

    unbegun = gradients_after_the_loss(training, recipe, par, sp, m)
    assert unbegun == (v - 1) * n * g * MIB  # the earlier chunks' layers
    margin = int(round((loss - other) * MIB - unbegun))
    fewer = fewer_on_the_last_rank(recipe, par, sp, m, inflight, held, margin)
    charged = held(inflight) + G * local + max(loss * MIB - unbegun, other * MIB)
    assert (charged + sum(c.bytes for c in fewer)) / MIB == pytest.approx(
        last_rank_walk(p, v, m, n, a, g, head, loss, other), abs=1e-3)
    assert bool(fewer) == (margin < 0 and charged / MIB > last_rank_walk(p, v, m, n, a, g, head, loss, other) + 1e-6)
