"""ZeRO-3's gathered parameters as allocations (estimator/memory/deepspeed_gathers.py), by hand from DeepSpeed
v0.12.3's runtime/zero/partition_parameters.py (v0.19.5 reads the same where cited): all_gather_coalesced over one
parameter allocates a buffer of ceil(numel / ranks) x ranks elements that becomes the parameter (l. 1148-1169);
over several, one flat tensor of their partitions x ranks (_all_gather_dtype, l. 1064-1098), then each parameter's
wait makes `torch.cat` of its pieces (AllGatherCoalescedHandle.wait, l. 648), the flat tensor freed once the
coordinator's registry has let go of the handle for every parameter of the call; all on the all-gather stream."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from estimator import estimate_config
from estimator.memory.deepspeed_gathers import STREAM, Coordinator, Gathers, chunks
from estimator.memory.zero3_replay import Trace, replay
from estimator.memory.zero3_trace import MAX_REUSE_DISTANCE, build_trace


class Recorder:
    """A program that records its requests: ('alloc', bytes, stream) and ('free', bytes)."""

    def __init__(self):
        self.events, self.sizes, self.live = [], {}, 0
        self.peak = 0

    def alloc(self, nbytes, stream=0):
        block = len(self.sizes)
        self.sizes[block] = nbytes
        self.events.append(("alloc", nbytes, stream))
        self.live += nbytes
        self.peak = max(self.peak, self.live)
        return block

    def free(self, *blocks):
        for b in blocks:
            if b is not None:
                self.events.append(("free", self.sizes[b]))
                self.live -= self.sizes[b]

    def transient(self, sizes):  # the replay's layer hook (Gathers installs its own over it)
        pass


def trace(*steps) -> Trace:
    return Trace(tuple(steps), tuple(f"s{i}" for i in range(len(steps))), len(steps), frozenset())


def coordinator(t: Trace, bucket: int = 0, max_live: int = 1000, reuse: int = 0):
    program = Recorder()
    return program, Coordinator(program, t, 2, 4, bucket, max_live, reuse)


def test_one_parameter_is_gathered_into_a_padded_buffer_that_becomes_it():
    """10 elements over 4 ranks: ceil(10 / 4) x 4 = 12 elements, 24 B in bf16, on the all-gather stream; released
    after its module (no later use): freed."""
    program, c = coordinator(trace(((0, 10),)))
    c.run(0)
    assert program.events == [("alloc", 24, STREAM), ("free", 24)]


def test_several_parameters_make_a_flat_tensor_then_one_copy_each():
    """A module of 10 and 7 elements over 4 ranks: the flat tensor (3 + 2) x 4 = 20 elements (40 B), then each
    parameter's torch.cat, 20 B and 14 B, the flat tensor freed after the last wait; then both released."""
    program, c = coordinator(trace(((0, 10), (1, 7))))
    c.run(0)
    assert program.events == [("alloc", 40, STREAM), ("alloc", 20, STREAM), ("alloc", 14, STREAM), ("free", 40),
                              ("free", 20), ("free", 14)]


def test_a_prefetched_batch_keeps_its_flat_tensor_until_its_last_parameter_is_waited_on():
    """Trace a; b; c (10 elements each), bucket 20, recorded trace: s0 gathers a (a buffer of 12) and prefetches b
    and c in one call (flat 2 x 3 x 4 = 24 elements); b's wait at s1 makes its copy (10), c's at s2 its copy and
    frees the flat tensor (b released after s1). Peak: a's buffer beside the flat tensor at s0, 12 + 24 elements, 72 B;
    b's copy beside the flat tensor holds 44 B, b's and c's never together."""
    program, c = coordinator(trace(((0, 10),), ((1, 10),), ((2, 10),)), bucket=20)
    c.reset()
    c.complete = True
    for s in range(3):
        c.run(s)
    assert program.events == [("alloc", 24, STREAM), ("alloc", 48, STREAM), ("free", 24), ("alloc", 20, STREAM),
                              ("free", 20), ("alloc", 20, STREAM), ("free", 48), ("free", 20)]
    assert program.peak == 72


def test_before_the_trace_is_recorded_a_module_releases_all_its_parameters():
    """partitioned_param_coordinator.py release_sub_module (v0.12.3 l. 392-393, v0.19.5 l. 498-499): the reuse window
    applies once the trace is complete; before it, a is released after s0 though it comes back at s2 (as real
    DeepSpeed 0.19.5 did over 2 gloo ranks in the first micro-batch of a tiny Llama, every module's parameter
    gathered and released in turn). With the trace, the window (100 elements) keeps it."""
    t = trace(((0, 10),), ((1, 10),), ((0, 10),))
    program, c = coordinator(t, reuse=100)
    c.run(0)
    assert program.events == [("alloc", 24, STREAM), ("free", 24)]
    program, c = coordinator(t, reuse=100)
    c.reset()
    c.complete = True
    c.run(0)
    assert program.events == [("alloc", 24, STREAM)]


def test_the_first_micro_batch_prefetches_nothing_and_the_step_releases_what_is_held():
    """Before the trace is recorded each module gathers its own; a step in `keeps` (the embedding's backward) is
    not released until the step's _partition_all_parameters."""
    t = Trace((((0, 10),), ((1, 10),)), ("s0", "s1"), 1, frozenset({1}))
    program, c = coordinator(t, bucket=100)
    c.run(0)
    c.run(1)
    assert program.events == [("alloc", 24, STREAM), ("free", 24), ("alloc", 24, STREAM)]
    c.release_all()
    assert program.events[-1] == ("free", 24) and program.live == 0


def test_from_deepspeed_0_19_3_the_backward_end_releases_the_embedding_and_the_next_forward_gathers_it_again():
    """Two micro-batches of a step, a module (s0) and the embedding's backward (s1, in `keeps`: no hook releases it),
    10 elements each over 4 ranks in bf16: ceil(10 / 4) x 4 x 2 B = 24 B a gather. Through v0.19.2 the embedding
    stays gathered from the first micro-batch's backward to the step (its second backward gathers nothing); from
    v0.19.3 (release_backward_leftovers, stage3.py backward_epilogue) each backward's end frees its 24 B and the
    next micro-batch gathers it again; the step then has nothing left to release."""
    assert 24 == -(-10 // 4) * 4 * 2
    t = Trace((((0, 10),), ((1, 10),)), ("s0", "embedding (backward)"), 1, frozenset({1}))

    def run(leftovers: bool) -> tuple[list, list]:
        program, c = coordinator(t)
        g = Gathers(c, [range(0, 1)], [range(1, 2)], 0, True, leftovers)
        ends = []
        for _ in range(2):
            g.forward()
            g.backward()
            g.end_backward()
            ends.append(program.live)
        g.step()
        return program.events, ends + [program.live]

    a, f = ("alloc", 24, STREAM), ("free", 24)
    assert run(False) == ([a, f, a, a, f, f], [24, 24, 0])
    assert run(True) == ([a, f, a, f, a, f, a, f], [0, 0, 0])


QWEN_7B = {"model": {"name": "qwen-7b", "qkv_bias": True, "loss_in_logits_dtype": True, "fused_qkv": True,
                     "hidden_size": 4096, "num_layers": 32, "num_attention_heads": 32, "intermediate_size": 11008,
                     "vocab_size": 151936},
           "training": {"framework": "deepspeed", "seq_len": 256, "micro_batch_size": 1, "global_batch_size": 16,
                        "param_dtype": "bf16", "compute_dtype": "bf16", "recompute": "full", "attention": "flash",
                        "optimizer": "adamw", "torch_version": "2.0", "framework_version": "0.12.3",
                        "overlap_comm": True},
           "parallel": {"dp": 2, "zero_stage": 3}, "hardware": {"gpu": "a100-80"}}


def test_the_coordinator_holds_what_the_counting_replay_holds():
    """Qwen-7B on 2 GPUs (Qwen's table, 8 micro-batches a step): from the second micro-batch on (the trace
    recorded, the embedding held from the one before) the gathered parameters' elements peak where
    zero3_replay.replay's do: 2,241,331,200 (the estimate's gathered-parameters transient)."""
    est = estimate_config(QWEN_7B)
    from estimator.memory.deepspeed_step import deepspeed_settings
    from estimator.memory.sharding import stage_parameters
    from estimator.spec.parallel import Parallel
    ds = deepspeed_settings(est.architecture, est.training, 3)
    stage = stage_parameters(est.architecture, Parallel(dp=2), "deepspeed")[0]
    t = build_trace(est.architecture, est.training, stage, ds.persistence_threshold)
    held = frozenset(p for s in t.keeps for p, _ in t.steps[s])
    expected = replay(t, ds.prefetch_bucket_size, ds.max_live_parameters, MAX_REUSE_DISTANCE, held)
    program = Recorder()
    c = Coordinator(program, t, 1, 2, ds.prefetch_bucket_size, ds.max_live_parameters, MAX_REUSE_DISTANCE)
    for s in range(len(t.steps)):  # the first micro-batch: nothing prefetched
        c.run(s)
    c.reset()
    c.complete = True
    peak = 0
    for s in range(len(t.steps)):
        c.run(s)
        peak = max(peak, sum(c.numel[p] for p in c.storage))
    assert peak == max(expected.forward, expected.backward) == 2_241_331_200


def test_the_trace_is_cut_at_the_replays_layer_hooks():
    """Forward: the embedding with the first layer, the final norm and head with the last; backward: the head's
    steps first, then each layer's recomputation and backward, the embedding's with the first layer."""
    est = estimate_config(QWEN_7B)
    from estimator.memory.deepspeed_step import deepspeed_settings
    from estimator.memory.sharding import stage_parameters
    from estimator.spec.parallel import Parallel
    ds = deepspeed_settings(est.architecture, est.training, 3)
    stage = stage_parameters(est.architecture, Parallel(dp=2), "deepspeed")[0]
    t = build_trace(est.architecture, est.training, stage, ds.persistence_threshold)
    forward, backward = chunks(t, list(range(32)))
    assert len(forward) == 32 and len(backward) == 33
    assert [t.names[s] for s in forward[0]][:3] == ["model", "decoder", "embedding"]
    assert t.names[forward[-1][-1]] == "lm_head" and t.names[backward[0][-1]] == "final norm (backward)"
    assert t.names[backward[1][0]] == "layer 31 (recomputed)" and t.names[backward[-1][-1]] == "embedding (backward)"
    assert forward[-1].stop == backward[0].start and backward[-1].stop == len(t.steps)


def test_on_two_gpus_the_estimate_replays_the_gathers_instead_of_the_flat_share():
    stage = estimate_config(QWEN_7B).stages[0]
    fragmentation = next(c for c in stage.components if c.key == "fragmentation")
    assert fragmentation.formula.startswith("caching allocator replayed over DeepSpeed's initialisation")


ROOT = Path(__file__).resolve().parents[1]
GATHERS = json.loads((ROOT / "tests" / "data" / "measured" / "deepspeed_partitions" / "zero3-gathers-cpu-gloo.json")
                     .read_text())
DEEPSPEED_PYTHON = ROOT / ".venv" / "deepspeed" / "bin" / "python"  # validation/install_frameworks.sh


def test_the_coordinators_allocations_are_what_real_deepspeed_gathers():
    """Real DeepSpeed 0.19.5 over 2 gloo ranks (validation/gpu/deepspeed_gathers.py, odd numels: every partition
    padded): one parameter gathered into a buffer of ceil(n / 2) x 2 elements that is its storage; four at once
    into a flat tensor of their partitions x 2, each parameter then a storage of its own, n elements."""
    assert GATHERS["versions"]["deepspeed"] == "0.19.5" and len(GATHERS["ranks"]) == 2
    for rank in GATHERS["ranks"]:
        one, several = rank["one"], rank["several"]
        steps = (tuple(enumerate(one["numels"])), tuple((10 + i, n) for i, n in enumerate(several["numels"])))
        program = Recorder()
        c = Coordinator(program, trace(*steps), 2, 2, 0, 10**9, 0)
        c.run(0)
        c.run(1)
        made = [size for kind, size, *_ in program.events if kind == "alloc"]
        assert made == one["storage_bytes"] + [several["flat_bytes"]] + several["storage_bytes"]
        assert made[:2] == [90_092, 9_728] == [2 * 22_523 * 2, 2 * (1013 + 203 + 203 + 1013) * 2]
        assert not any(one["shares_flat"] + several["shares_flat"])


@pytest.mark.skipif(not DEEPSPEED_PYTHON.exists(), reason="no DeepSpeed environment (validation/install_frameworks.sh)")
def test_a_live_run_over_two_ranks_reproduces_the_gathers_record():
    code = "import json; from validation.gpu.deepspeed_gathers import measure_world; print(json.dumps(measure_world(2)))"
    done = subprocess.run([str(DEEPSPEED_PYTHON), "-c", code], cwd=ROOT, capture_output=True, text=True,
                          timeout=600, env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert done.returncode == 0, done.stderr[-4000:]
    assert json.loads(done.stdout.strip().splitlines()[-1]) == GATHERS["ranks"]
