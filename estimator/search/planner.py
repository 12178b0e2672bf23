"""The planner: every valid parallel layout of a model on N GPUs, which of them fit, which are fastest.

Given a model, a training setup (sequence, global batch, precision, optimizer, framework), a GPU
and a number of GPUs, `plan` enumerates the layouts and the memory knobs around them that the
framework runs (`stacks.py`: its launch configuration names each one, and `plan --emit` writes it):

- TP within a node (divisors of the GPUs per node that divide the heads, KV heads and MLP width),
  always with sequence parallelism (Megatron, torchtitan);
- PP, with VPP (interleaving), and uneven first/last stages when the layer count needs them: the
  middle stages take ceil(L / PP) layers and the two end stages share the rest (Llama 3 405B's
  126 layers on PP 16 are 7 + 8 x 14 + 7, Grattafiori et al. 2024, section 3.3.2) (Megatron, torchtitan);
- CP (ring attention over flash kernels, at least 1,024 tokens per GPU), and DP = N / (TP PP CP);
- EP (dividing the experts) and expert TP (1 or TP) for MoE models (Megatron, torchtitan);
- the ZeRO stage each framework runs (`stacks.py`; `states.resolve_zero_stage`): Megatron and
  DeepSpeed 0-3, FSDP2 0/2/3, the HF Trainer 0; above 0 only where there is a group to shard over;
- recompute: none, selective (Megatron, torchtitan), full on every layer, or (Megatron) on n = 1 ...
  (the most layers of a stage) layers per stage;
- micro-batch: powers of two dividing the global batch per DP rank, at most 128k tokens each;
- loss: the framework's (standard; Megatron's fused cross-entropy; torchtune's chunked; the HF
  Trainer's Liger cross-entropy, fused, and fused linear cross-entropy, chunked).

It returns the `limit` fastest layouts that fit (utilization at most `margin`, the estimator's
"fits" verdict by default) and the memory-versus-throughput Pareto front of all fitting layouts,
each with its numbers from a full `estimate()` and `roofline()` (the estimate with the flat share of
allocator cache, `replay=False`: the replay of memory/reserved.py, which the reported estimate of an
HF Trainer run makes, is not monotone in what the rules below prune on); when none fits, the smallest power
of two of these GPUs, and of every catalog GPU, at which some layout fits.

Speed: a full estimate of a layout not seen before costs about 110 us (Llama-3.1-405B on 16
stages; bench/bench_estimate.py) and the roofline's step about as much (`roofline.expected_step`:
the roofline's numbers without its operation list, over operation tables shared by every layout
with the same TP, CP, EP and micro-batch), so the search judges most layouts without either, by
exact rules, each checked against brute force on random small cases (tests/test_planner.py). Memory, from the estimator's phases (memory.py):

1. states floor: a stage's peak is at least its optimizer-step phase (model states, gradients,
   optimizer temporaries), which no recompute, micro-batch or loss changes, so when it is over
   the budget no variant of the shape fits. It depends on the split only: cached by (TP, PP, VPP,
   split, EP, ETP, ZeRO, CP > 1) (DP x CP is N / (TP PP) for all of them); it falls with the ZeRO
   stage (but from stage 3 where Megatron-FSDP holds Adam's moments whole, memory/megatron_fsdp.py), and
   with EP from 2 up (experts spread wider, their sharded states over the same GPUs) but under DeepEP, whose
   buffers grow with EP.
2. recompute: selective keeps a subset of what none keeps (Megatron's modules; not torchtitan's
   operator-level policy under fsdp2, whose none is bounded on its own); full recompute of more
   layers keeps less; so the least memory of a mode is its most frugal setting.
3. micro-batch: no setting needs less memory with a larger micro-batch, but where one micro-batch
   and no pipeline leave gradients unallocated in forward (non-Megatron frameworks); that one is
   treated apart. With rule 2: full recompute of n layers over the budget at one micro-batch is
   over it, for every n' <= n, at every larger one (judged without an estimate).

Speed, from the roofline's step (roofline.py):

4. ceilings: one roofline without recompute bounds every recompute setting of its shape and
   micro-batch from above (`Speeds`), and with the smallest bubble every micro-batch.
5. dominance: ZeRO 0 under Megatron or DeepSpeed with DP x CP > 1 loses to ZeRO 1 on both counts;
   the standard loss to the fused one (it keeps more and moves more bytes; under Megatron the native
   fused cross-entropy holds 4 B per logit more than standard at backward's start, its compiled
   backward's fp32 copy of the softmax, so there standard is set aside for its speed alone, and a
   layout that fits only with it is not offered); fused and chunked
   losses run at the same speed, so the one that needs more memory loses (under the Trainer's
   frameworks the chunked loss is Liger's fused linear cross-entropy, timed on its own: the one that
   needs less memory still stands for both, at its own speed, and every ceiling takes the faster of
   the two); full recompute of more layers is never faster.

A set of layouts is skipped whole when its ceiling is below the current top list and a layout
already found needs no more memory than its floor at no less speed: nothing in it can enter the
answer. The ceilings of rule 4 are bounds over every stage and can be twice a layout's speed, so
the search tightens them with exact speeds where one roofline settles many layouts: at a shape
and micro-batch, the speed without recompute caps every recompute setting (rule 4), and, where the
ceilings are that loose (an MoE model's expert traffic), a range of full recompute settings
n = lo ... hi - 1 is capped by the exact speed of n = lo, its fastest (rule 5), found before the
range's memory is estimated. Before a shape's least memory is estimated (rules 2 and 3: four
estimates), each recompute mode's ceiling is tightened to the most over the micro-batches of their
ceilings capped by their exact speeds without recompute (for MoE models, whose ceilings are loose,
and for loose shapes), each micro-batch's roofline skipped where its ceilings with its own bubble
already leave every mode hopeless at the states floor; a mode hopeless at the states floor is not
estimated (DeepSeek-V3 on 2,048 GPUs: 17,624 -> 10,108 estimates). Every layout enumerated is
judged, by its own estimate (its device total, `memory.device_total`) or by these rules;
`Plan.searched` counts them, `Plan.estimates` and `Plan.rooflines` the full evaluations,
`Plan.pruned` the rules. A `Watch` (estimator/search/watch.py) follows a search and may halt it
between shapes: the plan then lists the best of what it searched.
"""

from __future__ import annotations

import dataclasses
import gc
import time
from contextlib import contextmanager

from ..spec.architecture import Architecture
from ..spec.errors import ConfigError
from ..spec.gpus import GPUS
from ..spec.hardware import Hardware
from ..memory.result import TIGHT_FRACTION
from ..spec.parallel import Parallel
from ..spec.training import Training
from .watch import Progress, Watch
from .layouts import FIXABLE, Layout, Plan, Request, Shape, Variant, shape_micro_batches, shapes
from .evaluate import _Evaluator
from .search import _Search
from .stacks import SPLITS, in_words, stack


# --- entry points --------------------------------------------------------------------------------------

def plan(arch: Architecture, training: Training, gpu: str | Hardware, gpus: int, gpus_per_node: int = 8,
         margin: float = TIGHT_FRACTION, *, comm_overlap: float = 1.0, limit: int = 50, pareto: bool = True,
         fixed: dict[str, int | None] | None = None, max_gpus: int = 16384, watch: Watch | None = None) -> Plan:
    """The layouts of `arch` trained as `training` on `gpus` GPUs that fit under `margin` of the
    GPU's memory: the `limit` fastest and (with `pareto`) the memory/throughput Pareto front,
    fastest first. `fixed` holds parallel fields (tp, pp, vpp, pp_first_stage_layers,
    pp_last_stage_layers, cp, dp, ep, etp, zero_stage) at the given values. `watch` follows the
    search and may halt it (estimator/search/watch.py)."""
    hardware = gpu if isinstance(gpu, Hardware) else Hardware(gpu=gpu)
    req = _request(arch, training, hardware, gpus, gpus_per_node, margin, comm_overlap, limit, pareto,
                   tuple(sorted((fixed or {}).items())), max_gpus)
    return search(req, watch)


def _request(arch, training, hardware, gpus, gpus_per_node, margin, comm_overlap, limit, pareto, fixed,
             max_gpus) -> Request:
    for name, value in fixed:
        if name not in FIXABLE:
            raise ConfigError(f"plan.fixed.{name}", value, "one of " + ", ".join(FIXABLE))
    checks = (("gpus", gpus, gpus >= 1), ("gpus_per_node", gpus_per_node, gpus_per_node >= 1),
              ("margin", margin, 0 < margin <= 1), ("limit", limit, limit >= 1))
    for name, value, ok in checks:
        if not ok:
            raise ConfigError(f"plan.{name}", value, "a positive integer" if name != "margin" else "0 < margin <= 1")
    if training.mode != "training":
        raise ConfigError("training.mode", training.mode, "'training'", "the planner lays out training runs")
    _check_fixed_splits(training, fixed)
    return Request(arch, training, hardware, gpus, gpus_per_node, margin, comm_overlap, limit, pareto, fixed,
                   max_gpus)


def _check_fixed_splits(training: Training, fixed) -> None:
    """A split held above 1 (or VPP above 1) that the framework does not run (stacks.py) is refused by name."""
    st = stack(training)
    for name, value in fixed:
        runs = st.interleaved if name == "vpp" else name not in SPLITS or name in st.splits
        if value is not None and value > 1 and not runs:
            raise ConfigError(f"plan.fixed.{name}", value, f"1 with framework {training.framework!r}",
                              f"the planner lists what {training.framework} runs: {st.source}",
                              related=("training.framework",))


def search(req: Request, watch: Watch | None = None) -> Plan:
    """The plan of `req`; `watch` follows the search and may halt it (a request to stop, a time
    budget), whereupon the plan holds the best layouts of those searched and says what was not."""
    watch = watch or Watch()
    with _cyclic_gc_paused():
        start = time.perf_counter()
        run = _Search(req, watch)
        run.run()
        layouts = run.layouts()
        seconds = time.perf_counter() - start  # the layout search; the no-fit answer below is a search of its own
        smallest = None if layouts or watch.halted() else smallest_fit(req, watch)
        answer = Plan(request=req, layouts=layouts, searched=run.judged, estimates=run.ev.estimates,
                      rooflines=run.ev.rooflines, seconds=seconds, pruned=dict(run.pruned), smallest_fit=smallest,
                      stopped=watch.describe() or None, not_searched=run.total - run.judged if watch.reason else 0,
                      not_searched_ceiling=run.ceiling_left)
        del run  # its memos freed before the collector is back: its first collection need not walk them
    return answer


@contextmanager
def _cyclic_gc_paused():
    """Python's cyclic garbage collector off for the search. The search makes millions of
    short-lived records without reference cycles (reference counting frees them) while its memos
    grow, and every collection walks all of them again: about 40% of a plan's time (Llama-3.1-70B on
    64 GPUs: 3.4 s -> 2.0 s of CPU). Switched back on only if it was on, so that nested or
    concurrent searches (the app's sessions run in threads) never leave it off."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


# --- when nothing fits: how many GPUs would -----------------------------------------------------------

class _Halted(Exception):
    """The watch halted the search for the fewest GPUs that fit."""


def least_memory(req: Request, watch: Watch | None = None) -> int | None:
    """The smallest device total of any layout on `req.gpus` GPUs (None: no valid layout). Each
    shape's least is at micro-batch 1 with full recompute of every layer or selective recompute,
    fused or chunked loss (rules 2 and 3, and memory never falls with the micro-batch but where
    the last micro-batch size leaves one micro-batch and no pipeline, so that one is tried too);
    shapes whose states floor is above the least found are skipped (rule 1). Raises `_Halted` when
    `watch` halts it."""
    ev, best = _Evaluator(req), None
    floors = []
    for s in shapes(req):
        _check(watch, req)
        floors.append((ev.floor(s), s))
    for floor, s in sorted((x for x in floors if x[0] is not None), key=lambda x: x[0]):
        if best is not None and floor >= best:
            break
        _check(watch, req)
        for v in _frugal_variants(req, s):
            total = ev.total(s, v)
            if total is not None and (best is None or total < best):
                best = total
    return best


def _frugal_variants(req: Request, s: Shape) -> list[Variant]:
    micro = shape_micro_batches(req.training, s)
    sizes = {min(micro)}
    if req.training.framework != "megatron" and s.pp == 1:
        sizes.add(max(micro))  # one micro-batch per step: no gradients alive in forward
    modes = [m for m in ("full", "selective") if m in req.stack.recompute]
    losses = req.stack.searched
    return [Variant(b, mode, None, loss) for b in sorted(sizes) for mode in modes for loss in losses]


def _check(watch: Watch | None, req: Request) -> None:
    if watch is None:
        return
    if watch.due():
        watch.report(Progress(req.gpus, req.max_gpus, watch.seconds(), phase="fewest GPUs"))
    if watch.halted():
        raise _Halted


def smallest_fit(req: Request, watch: Watch | None = None) -> dict:
    """For the request's GPU and every catalog GPU: the fewest GPUs, a power of two, on which some
    layout fits under the margin; None where none does up to `req.max_gpus`, or (other GPUs) up to
    4 x the request's GPU's answer, where the search stops. The memory of a layout does not depend
    on which catalog GPU runs it (memory.Estimate.fits; DeepEP's buffers aside, sized here for the
    request's GPU), so one search per GPU count answers every GPU. When `watch` halts it, the
    counts found so far (the others None)."""
    own = req.hardware.gpu
    answer: dict[str, int | None] = {own: None, **{g: None for g in GPUS if g != own}}
    n = 1
    while n <= req.max_gpus and None in answer.values() and (answer[own] is None or n <= 4 * answer[own]):
        try:
            least = least_memory(dataclasses.replace(req, gpus=n), watch)
        except _Halted:
            return answer
        for g in answer:
            if answer[g] is None and least is not None and least / GPUS[g].capacity_bytes <= req.margin:
                answer[g] = n  # the verdict rule of Request.within, on GPU g
        n *= 2
    return answer


# --- text ------------------------------------------------------------------------------------------------

def replay_rule_applies(req: Request) -> bool:
    """Whether the reported estimates of this request's layouts replay the allocator (memory/reserved.py)
    where the plan's numbers take the flat share: an HF Trainer run on one GPU's weights, default segments."""
    from ..memory.resolved import resolve
    try:
        from ..memory.replays import replay_rule
        return replay_rule(resolve(req.architecture, req.training, Parallel(dp=req.gpus), req.hardware)) is None
    except ConfigError:
        return False


GiB = 1024**3


def _pipeline(par: Parallel) -> str:
    text = str(par.pp)
    if par.pp_first_stage_layers is not None:
        text += f" ({par.pp_first_stage_layers}|..|{par.pp_last_stage_layers})"
    return text + (f" x{par.vpp}" if par.vpp > 1 else "")


def _recompute(tr: Training) -> str:
    if tr.recompute == "full":
        return f"full {tr.recompute_layers}" if tr.recompute_layers else "full all"
    return tr.recompute


def _row(rank: int, x: Layout) -> str:
    p, t = x.parallel, x.training
    expert = f"{p.ep}/{p.etp}" if p.ep > 1 or p.etp != p.tp else "-"
    return (f"{rank:>4} {'*' if x.pareto else ' '} {p.tp:>3} {_pipeline(p):>14} {p.cp:>3} {p.dp:>5} {expert:>7} "
            f"{p.zero_stage:>4} {t.micro_batch_size:>4} {_recompute(t):>10} {t.loss:>8} "
            f"{x.device_total_bytes / GiB:8.2f} {x.utilization:6.1%} {x.tokens_per_s_per_gpu:10,.0f} {x.mfu:6.1%} "
            f"{x.step_time_s:8.3f}")


def render_plan_text(result: Plan) -> str:
    req = result.request
    lines = [f"Plan for {req.architecture.name} on {req.gpus} x {req.hardware.gpu} ({req.gpus_per_node} per node): "
             f"layouts using at most {req.margin:.0%} of {req.hardware.device.capacity_bytes / GiB:.1f} GiB",
             f"Searched {result.searched:,} layouts in {result.seconds:.2f} s ({result.estimates:,} full estimates, "
             f"{result.rooflines:,} rooflines; the rest judged by exact rules: "
             + ", ".join(f"{k} {v:,}" for k, v in result.pruned.items()) + ")",
             f"What {req.training.framework} runs (searched): {in_words(req.training)}"]
    if result.stopped:
        lines.append(result.note())
    if not result.layouts:
        return "\n".join(lines + ["No fitting layout found." if result.not_searched else "No layout fits."])
    front = sum(x.pareto for x in result.layouts)
    lines += [f"Listed: the {min(req.limit, len(result.layouts))} fastest fitting layouts and the Pareto front "
              f"({front} layouts, marked *) of memory against throughput; {len(result.layouts)} in all.", "",
              f"{'rank':>4}   {'TP':>3} {'PP':>14} {'CP':>3} {'DP':>5} {'EP/ETP':>7} {'ZeRO':>4} {'mbs':>4} "
              f"{'recompute':>10} {'loss':>8} {'GiB':>8} {'util':>6} {'tok/s/GPU':>10} {'MFU':>6} {'step s':>8}"]
    lines += [_row(i, x) for i, x in enumerate(result.layouts, 1)]
    lines += ["", "PP a|..|b: uneven first and last stages; xV: interleaved virtual stages. Numbers are the "
              "estimator's (estimate, roofline) for each layout; speeds are the step-time model's expected figures "
              "(achieved kernel efficiency, measured NCCL bandwidth, each framework's overlap), as the app shows them."]
    if replay_rule_applies(req):
        lines.append("Memory with a flat 10% share of allocator cache, as the search judges it; a layout's own "
                     "estimate replays the caching allocator over its step instead (its reserved memory may differ).")
    return "\n".join(lines)


def no_fit_text(result: Plan) -> str:
    """One line: where no layout fits, the fewest GPUs that would fit, of this GPU and the others."""
    req, found = result.request, result.smallest_fit or {}
    if result.not_searched:
        return (f"no fitting layout found on {req.gpus} x {req.hardware.gpu} under {req.margin:.0%} in the "
                f"{result.searched:,} layouts searched before the search stopped at {result.stopped}")
    head = f"no layout fits on {req.gpus} x {req.hardware.gpu} under {req.margin:.0%}"
    own = found.get(req.hardware.gpu)
    head += (f"; the fewest that fit: {own} x {req.hardware.gpu}" if own
             else f"; none fits on up to {req.max_gpus:,} x {req.hardware.gpu}")
    others = [f"{n} x {g}" for g, n in found.items() if g != req.hardware.gpu and n]
    tail = ("; other GPUs: " + ", ".join(others) if others else "") + " (powers of two)"
    if req.training.framework == "hf":  # stacks.py: the Trainer's DDP splits nothing
        tail += ("; the HF Trainer over DDP keeps every model state whole on each GPU, so more GPUs split none of "
                 "them: DeepSpeed ZeRO (framework deepspeed) or FSDP (hf_fsdp2, fsdp1) shards them")
    return head + tail
