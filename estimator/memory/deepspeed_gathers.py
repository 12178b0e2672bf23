"""DeepSpeed ZeRO-3's gathered parameters at data parallel > 1 as the caching allocator sees them: the coordinator's
fetches and releases (zero3_replay.py's rules over zero3_trace.py's hook order) turned into the allocations of
`all_gather_coalesced`, made on the coordinator's all-gather stream, for the DeepSpeed replay (deepspeed_replay.py).

What a fetch allocates (runtime/zero/partition_parameters.py, the same in v0.12.3 and v0.19.5):
- one parameter (`len(params) == 1`, v0.12.3 l. 1148-1169, v0.19.5 l. 1343-1357): a buffer of ceil(numel / ranks) x
  ranks elements, all-gathered into, and the parameter a narrow() view of it: the buffer is its storage;
- several (`_all_gather_dtype`, v0.12.3 l. 1064-1098, v0.19.5 l. 1284-1327): one flat tensor of the sum of their
  partitions x ranks; each parameter's wait (AllGatherCoalescedHandle.wait, v0.12.3 l. 618-658, v0.19.5 l. 742-780)
  makes the parameter `torch.cat` of its pieces, a tensor of its own; the flat tensor lives while the handle does:
  the coordinator's registry holds it for every parameter of the call until that parameter is waited on
  (partitioned_param_coordinator.py fetch_sub_module: `self.__inflight_param_registry.pop(param).wait()`, v0.12.3
  l. 303, v0.19.5 l. 406; handle_dependency true outside fast_fetch, so nothing is kept in data_buffer).
Both are made inside `with get_accelerator().stream(self.__allgather_stream)` (v0.12.3 l. 297 and 443): blocks of
the all-gather stream's own pool, which the default stream's requests never reuse (CUDACachingAllocator.cpp: free
blocks are looked up by stream). A release (`free_param`, v0.12.3 l. 283-293) drops the parameter's storage. The
step releases every gathered parameter first (stage3.py step -> _partition_all_parameters, v0.12.3 l. 1945).

Measured on real DeepSpeed 0.19.5 over 2 gloo ranks on the CPU (validation/gpu/deepspeed_gathers.py,
tests/data/measured/deepspeed_partitions/zero3-gathers-cpu-gloo.json): the one parameter's padded buffer, the several
parameters' flat tensor and their storages of their own, byte for byte (tests/test_deepspeed_gathers.py); what the
caching allocator reserves for them over ranks is not measured on a GPU. The coordinator's calls and releases against
real DeepSpeed 0.19.5's over gloo (validation/gpu/deepspeed_gather_sequence.py, a tiny Llama under gradient
checkpointing): the same, the embedding's release at each backward's end included (from v0.19.3: stage3.py
backward_epilogue -> release_backward_leftovers, v0.19.5 l. 2772; commit a31eb316, #8148; versions.py
DEEPSPEED_RELEASE_LEFTOVERS: `Gathers.end_backward`; through v0.19.2 the step releases it), but for one MLP matrix
v0.19.5 gathers before the first micro-batch's recomputation.

The count the prefetcher works under (__n_available_params) restarts at 0 in reset_step: at the forward's start from
v0.15.4 on, at the backward's end before (zero3_trace.gathered_elements); the recorded trace exists from the second
micro-batch on (is_complete_trace): the first micro-batch of a run prefetches nothing.
"""

from __future__ import annotations

from collections import deque

from .zero3_replay import Trace, _reused
from .zero3_trace import MAX_REUSE_DISTANCE, build_trace, release_rules

SOURCE = ("DeepSpeed v0.12.3 and v0.19.5 runtime/zero/partition_parameters.py (all_gather_coalesced: one parameter's "
          "buffer, several parameters' flat tensor and each one's torch.cat in AllGatherCoalescedHandle.wait; "
          "free_param), partitioned_param_coordinator.py (fetch_sub_module and __all_gather_params_ on the all-gather "
          "stream), stage3.py step (_partition_all_parameters); from v0.19.3 stage3.py backward_epilogue "
          "(release_backward_leftovers, a31eb316, #8148) (estimator/memory/deepspeed_gathers.py)")

STREAM = 1  # the all-gather stream's pool (allocator.py: another stream's blocks are a pool of their own)


class Coordinator:
    """The coordinator's state across micro-batches, its gathers and releases made as allocations through
    `program` (deepspeed_replay's _Program) on the all-gather stream; `P` bytes an element, `ranks` the ZeRO-3
    world."""

    def __init__(self, program, trace: Trace, P: float, ranks: int, prefetch_bucket: int, max_live: int,
                 max_reuse: int):
        self.program, self.trace, self.P, self.ranks = program, trace, P, ranks
        self.prefetch_bucket, self.max_live, self.max_reuse = prefetch_bucket, max_live, max_reuse
        steps = trace.steps
        self.numel = {p: n for step in steps for p, n in step}
        self.uses: dict[int, list[int]] = {}
        for s, step in enumerate(steps):
            for p, _ in step:
                self.uses.setdefault(p, []).append(s)
        self.before = [0]
        for step in steps:
            self.before.append(self.before[-1] + sum(n for _, n in step))
        self.storage: dict[int, int | None] = {}  # gathered (or in flight) parameter -> its block once waited
        self.inflight: dict[int, int] = {}  # parameter -> its call
        self.calls: dict[int, list] = {}  # call -> [flat block, parameters not yet waited on]
        self.made = 0
        self.available = 0
        self.complete = False  # the trace is recorded: prefetching on
        self.queue: deque = deque()
        self.marked: dict[int, int] = {}

    def reset(self) -> None:
        """reset_step: the count from 0, the queue of the recorded trace again."""
        self.available = 0
        self.queue = deque((p, s) for s, step in enumerate(self.trace.steps) for p, _ in sorted(step))
        self.marked = {}

    def _call(self, params: list[int]) -> None:
        """all_gather_coalesced over `params` (sorted by id, as it sorts them)."""
        if not params:
            return
        alloc, d = self.program.alloc, self.ranks
        for p in params:
            self.available += self.numel[p]
        if len(params) == 1:
            p = params[0]
            self.storage[p] = alloc(self.P * -(-self.numel[p] // d) * d, STREAM)
            return
        call = self.made = self.made + 1
        flat = alloc(self.P * sum(-(-self.numel[p] // d) for p in params) * d, STREAM)
        self.calls[call] = [flat, set(params)]
        for p in params:
            self.storage[p] = None
            self.inflight[p] = call

    def _wait(self, p: int) -> None:
        call = self.inflight.pop(p, None)
        if call is None:
            return
        self.storage[p] = self.program.alloc(self.P * self.numel[p], STREAM)  # torch.cat of its pieces
        flat, pending = self.calls[call]
        pending.discard(p)
        if not pending:
            self.program.free(flat)
            del self.calls[call]

    def _release(self, p: int) -> None:
        self._wait(p)
        self.program.free(self.storage.pop(p))
        self.available -= self.numel[p]

    def run(self, s: int) -> None:
        """The hooks of trace step `s`: fetch_sub_module (the module's own gather and wait, then the prefetch),
        then release_sub_module: zero3_replay.replay's rules once the trace is recorded, before it every parameter
        of the module (partitioned_param_coordinator.py release_sub_module, v0.12.3 l. 392-393, v0.19.5 l. 498-499:
        `__params_to_release(...) if self.is_complete_trace() else set(p.ds_id for p in iter_params(submodule))`)."""
        step, queue, marked = self.trace.steps[s], self.queue, self.marked
        own = [p for p, _ in step]
        self._call(sorted(p for p in own if p not in self.storage))
        for p in own:
            self._wait(p)
        if self.complete:
            pending = {p for p in own if marked.get(p, -1) < s}
            while pending and queue:
                p, at = queue.popleft()
                marked[p] = at
                pending.discard(p)
            if self.prefetch_bucket > 0:
                limit, taken, batch = min(self.max_live - self.available, self.prefetch_bucket), 0, []
                while queue and taken < limit:
                    p, at = queue.popleft()
                    marked[p] = max(marked.get(p, -1), at)
                    if p not in self.storage and p not in batch:
                        batch.append(p)
                        taken += self.numel[p]
                self._call(sorted(batch))
        if s in self.trace.keeps:
            return
        for p in own:  # before the trace is recorded every parameter of the module goes (release_sub_module)
            if self.complete and (marked.get(p, -1) > s + 1 or _reused(self.uses[p], s, self.before, self.max_reuse)):
                continue
            self._release(p)

    def release_leftovers(self) -> None:
        """release_backward_leftovers (from v0.19.3, partitioned_param_coordinator.py, v0.19.5 l. 554-566): at the
        backward's end the parameters of the steps no hook releases (the trace's `keeps`: the embedding's backward)
        are released, off the count as any release."""
        for s in sorted(self.trace.keeps):
            for p, _ in self.trace.steps[s]:
                if p in self.storage:
                    self._release(p)

    def release_all(self) -> None:
        """The step's _partition_all_parameters: every gathered parameter released."""
        for p in list(self.storage):
            self._release(p)


def chunks(trace: Trace, layers: list[int]) -> tuple[list[range], list[range]]:
    """The trace's steps cut at the replay's layer hooks: forward, one range per layer (the first from the trace's
    start, the last to the forward's end: the final norm and head); backward, the head's steps, then one range
    per layer in reverse (recomputation and backward), the last to the end (the embedding's backward)."""
    names, split = trace.names, trace.backward_from

    def layer_of(name: str) -> int | None:
        return int(name.split()[1]) if name.startswith("layer ") else None

    def cut(lo: int, hi: int, order: list[int]) -> list[int]:
        last = {}
        for s in range(lo, hi):
            i = layer_of(names[s])
            if i is not None:
                last[i] = s
        return [last[i] + 1 for i in order]

    ends = cut(0, split, layers)
    forward = [range(a, b) for a, b in zip([0] + ends[:-1], ends[:-1] + [split])]
    back_layers = list(reversed(layers))
    ends = cut(split, len(names), back_layers)
    firsts = [min(s for s in range(split, len(names)) if layer_of(names[s]) == back_layers[0])]
    backward = [range(split, firsts[0])]
    backward += [range(a, b) for a, b in zip([firsts[0]] + ends[:-1], ends[:-1] + [len(names)])]
    return forward, backward


class Gathers:
    """The coordinator driven from the DeepSpeed replay's micro-batches: its hooks run at the replay's layer hooks
    (`program.transient`, called once a layer in forward and in backward, after the head's gradients in backward:
    `head_calls`), whole chunks of the trace at a time (`chunks`)."""

    def __init__(self, coordinator: Coordinator, forward: list[range], backward: list[range], head_calls: int,
                 reset_at_forward: bool, release_leftovers: bool = False):
        self.coordinator, self.head_calls, self.reset_at_forward = coordinator, head_calls, reset_at_forward
        self.release_leftovers = release_leftovers
        self.chunks = {"forward": forward, "backward": backward}
        self.done: set = set()

    def _run(self, phase: str, k: int) -> None:
        if (phase, k) in self.done:
            return
        self.done.add((phase, k))
        for s in self.chunks[phase][k]:
            self.coordinator.run(s)

    def _install(self, phase: str) -> None:
        program, chunks = self.coordinator.program, self.chunks[phase]
        transient, calls = program.transient, [0]
        head = self.head_calls if phase == "backward" else 0
        layers = len(chunks) - (1 if phase == "backward" else 0)

        def hook(sizes) -> None:
            c = calls[0]
            calls[0] += 1
            if phase == "backward":
                self._run(phase, 0)  # the head's backward, at the first call
            if head <= c < head + layers:
                self._run(phase, c - head + (1 if phase == "backward" else 0))
            transient(sizes)

        program.transient = hook

    def forward(self) -> None:
        if self.reset_at_forward:
            self.coordinator.reset()
        self.done = set()
        self._install("forward")

    def backward(self) -> None:
        program = self.coordinator.program
        program.__dict__.pop("transient", None)
        for k in range(len(self.chunks["forward"])):  # what the forward's hooks left (none: one call a layer)
            self._run("forward", k)
        self._install("backward")

    def end_backward(self) -> None:
        self.coordinator.program.__dict__.pop("transient", None)
        for k in range(len(self.chunks["backward"])):
            self._run("backward", k)
        if self.release_leftovers:  # the engine's backward epilogue, after the gradients' reduction
            self.coordinator.release_leftovers()
        if not self.reset_at_forward:
            self.coordinator.reset()
        self.coordinator.complete = True  # reset_step: the trace recorded from the first micro-batch

    def step(self) -> None:
        self.coordinator.release_all()


def gathers(cfg, sp, program, w) -> Gathers:
    """The stage's gathers under ZeRO-3 over `cfg.parallel.dp` ranks, for the replay's `program`; `w` its tensors
    (reserved_tensors.tensors: the head's with a gradient make the backward's first calls)."""
    from .deepspeed_step import deepspeed_settings
    from ..spec.dtypes import bytes_per_element

    arch, training = cfg.architecture, cfg.training
    ds = deepspeed_settings(arch, training, 3)
    trace = build_trace(arch, training, sp, ds.persistence_threshold)
    coordinator = Coordinator(program, trace, bytes_per_element(cfg.recipe.param_dtype), cfg.parallel.dp,
                              ds.prefetch_bucket_size, ds.max_live_parameters, MAX_REUSE_DISTANCE)
    forward, backward = chunks(trace, list(sp.layer_indices))
    head = sum(1 for t in w.head if t.grad) if sp.last else 0
    return Gathers(coordinator, forward, backward, head, *release_rules(training))
