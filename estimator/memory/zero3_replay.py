"""DeepSpeed ZeRO-3's gathered parameters, by replaying its parameter coordinator over the run's trace.

ZeRO-3 gathers a module's parameters when the module runs and releases them after it
(runtime/zero/partitioned_param_coordinator.py, the same rules in DeepSpeed v0.12.3 and v0.19.5):

- ``fetch_sub_module``: gathers the module's own parameters, then, once the trace is recorded (from the
  second step on), prefetches the next parameters of the recorded order that are not gathered, taking
  whole tensors until ``min(stage3_max_live_parameters - gathered, stage3_prefetch_bucket_size)``
  elements are under way (the last tensor may cross it). A later use of a parameter that is already
  gathered is passed over and marked (``__most_recent_step_id_param_fetched_for``).
- ``release_sub_module`` / ``__params_to_release``: releases the module's parameters unless the
  prefetcher marked a later use, or the parameter comes back within ``stage3_max_reuse_distance``
  elements of the trace after this module, or it is persistent (at most
  ``stage3_param_persistence_threshold`` elements: counted apart, never released).

Under activation checkpointing a layer runs forward twice; its recomputation comes right before its
backward, so its parameters are kept from the one to the other, and a backward step of a kept
parameter gathers nothing while the prefetcher still takes a bucket: the prefetched frontier runs
ahead until ``stage3_max_live_parameters`` elements are gathered (the bound only stops prefetching;
a module's own gather ignores it). Without recomputation each step gathers what it uses and the
frontier stays at one bucket ahead unless a module is smaller than the bucket.

The replay works on the stage's weights as Hugging Face modules hold them (a gated MLP's gate and up
are two modules; transformers 5 fuses a MoE layer's routed experts into one tensor), in the order the
hooks see them: the embedding, each layer, the final norm and head forward; the head's backward; each
layer's recomputation (when recomputed) and backward; the embedding's backward when its output needs
a gradient (it trains, or an adapter run under gradient checkpointing: ``enable_input_require_grads``).
It counts elements; the caller multiplies by the parameters' dtype.
"""

from __future__ import annotations

import bisect
from collections import deque
from typing import NamedTuple

SOURCE = ("DeepSpeed v0.12.3 and v0.19.5 runtime/zero/partitioned_param_coordinator.py (fetch_sub_module's "
          "prefetch under min(max_live - available, prefetch_bucket), __params_to_release's reuse window and "
          "prefetch marks), parameter_offload.py (a hook per module: gather before its forward and before its "
          "backward, release after each)")

Step = tuple[tuple[int, int], ...]  # one module's hook: (parameter id, elements) of its gathered parameters


class Gathered(NamedTuple):
    """The most elements gathered at once in forward and in backward (recomputation included), and
    the module each was reached at."""

    forward: int
    backward: int
    forward_at: str
    backward_at: str
    held: int = 0  # elements gathered from the micro-batch before, outside the count


class Trace(NamedTuple):
    steps: tuple[Step, ...]
    names: tuple[str, ...]
    backward_from: int  # index of the first backward step
    keeps: frozenset[int]  # steps no hook releases (the embedding's backward: ids need no gradient; from DeepSpeed
    # v0.19.3 the backward's end does, deepspeed_gathers.Coordinator.release_leftovers)


def replay(trace: Trace, prefetch_bucket: int, max_live: int, max_reuse: int,
           held: frozenset[int] = frozenset()) -> Gathered:
    """Run the coordinator's fetch and release rules over the recorded trace (a complete trace: the
    steady state from the second step on) and return the peaks of the gathered elements.

    `held`: parameters still gathered from the micro-batch before (a release that never came) and
    left out of the coordinator's count, which restarts at 0 every micro-batch (reset_step); releasing
    one later takes its elements off that count all the same (__release_param), so the prefetcher
    may then gather that much beyond max_live."""
    steps = trace.steps
    numel = {p: n for step in steps for p, n in step}
    queue = deque((p, s) for s, step in enumerate(steps) for p, _ in sorted(step))
    uses: dict[int, list[int]] = {}
    for s, step in enumerate(steps):
        for p, _ in step:
            uses.setdefault(p, []).append(s)
    before = [0]  # elements of the steps before each step (the reuse window is counted in elements)
    for step in steps:
        before.append(before[-1] + sum(n for _, n in step))
    marked: dict[int, int] = {}
    gathered = set(held)
    available = 0  # the coordinator's count (__n_available_params)
    resident = sum(numel[p] for p in held)  # what is gathered in fact
    peaks = [(0, ""), (0, "")]
    for s, step in enumerate(steps):
        own = [p for p, _ in step]
        for p in own:
            if p not in gathered:
                gathered.add(p)
                available += numel[p]
                resident += numel[p]
        # the module's own entries leave the queue (those a prefetch has not already taken)
        pending = {p for p in own if marked.get(p, -1) < s}
        while pending and queue:
            p, at = queue.popleft()
            marked[p] = at
            pending.discard(p)
        if prefetch_bucket > 0:
            limit, taken, batch = min(max_live - available, prefetch_bucket), 0, set()
            while queue and taken < limit:
                p, at = queue.popleft()
                marked[p] = max(marked.get(p, -1), at)
                if p not in gathered and p not in batch:
                    batch.add(p)
                    taken += numel[p]
            gathered |= batch
            available += taken
            resident += taken
        phase = 1 if s >= trace.backward_from else 0
        if resident > peaks[phase][0]:
            peaks[phase] = (resident, trace.names[s])
        if s in trace.keeps:
            continue
        for p in own:
            if marked.get(p, -1) > s + 1 or _reused(uses[p], s, before, max_reuse):
                continue
            gathered.discard(p)
            available -= numel[p]
            resident -= numel[p]
    return Gathered(peaks[0][0], peaks[1][0], peaks[0][1], peaks[1][1], sum(numel[p] for p in held))


def _reused(at: list[int], s: int, before: list[int], max_reuse: int) -> bool:
    """__params_to_release: the modules after step s are walked until max_reuse elements have been
    passed; a parameter met on the way stays gathered."""
    i = bisect.bisect_right(at, s)
    return i < len(at) and before[at[i]] - before[s + 1] < max_reuse

