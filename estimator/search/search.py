"""The search over layouts: memory before speed, the bounds that prune, the watch that halts it."""

from __future__ import annotations

import json
import math

from ..memory.activations.recompute import op_level
from ..memory.megatron_fsdp import moments_at_global_shape
from ..spec.errors import ConfigError
from .watch import Progress, Watch
from .layouts import (Layout, Request, Shape, Variant, most_stage_layers, shape_micro_batches, shapes,
                      variants_per_micro_batch)
from .evaluate import Point, Speeds, _Answer, _Evaluator, _selective


MODES = ("none", "selective", "full")


# --- the search ------------------------------------------------------------------------------------

class _Search:
    """Branch and bound over shapes, micro-batches, recompute settings and losses (module docstring)."""

    def __init__(self, req: Request, watch: Watch | None = None):
        self.req = req
        self.ev = _Evaluator(req)
        self.answer = _Answer(req.limit, req.pareto)
        self.searched = 0
        self.pruned = {"states floor": 0, "least memory": 0, "dominated": 0, "bound": 0, "monotone recompute": 0}
        self.watch = watch or Watch()
        self.total = 0  # layouts to judge (less those the estimator refuses, as they are found)
        self.ceiling_left: float | None = None  # halted: a speed no layout left unjudged exceeds
        self._micro_of: dict[Shape, tuple[int, ...]] = {}
        # the framework's recompute modes and the losses estimated (stacks.py); its others are dominated (rule 5)
        self.modes = tuple(m for m in MODES if m in req.stack.recompute)
        self.losses = req.stack.searched
        self.dominated_losses = len(req.stack.losses) - len(self.losses)

    @property
    def judged(self) -> int:
        return self.searched + self.ev.judged_layouts

    def _go_on(self) -> bool:
        """Between two shapes: a progress report when one is due; False when the watch halts the search."""
        if self.watch.due():
            best = max(self.answer.top, default=None)
            self.watch.report(Progress(self.judged, self.total, self.watch.seconds(),
                                       self._layout(best[-1], False).to_json() if best else None))
        return self.watch.halted() is None

    def run(self) -> None:
        alive, over = [], {}
        # larger EP and ZeRO stages first: a states floor over the budget is over it for every
        # smaller EP (>= 2) and ZeRO stage of the same split too (rule 1)
        ordered = sorted(shapes(self.req), key=lambda s: (s._replace(ep=0, zero=0), -s.ep, -s.zero))
        self.total = sum(self._count(s) for s in ordered)
        for s in ordered:
            if not self._go_on():
                return
            count = self._count(s)
            if self._dominated_zero(s):  # its ZeRO 1 twin came first: judged unless the estimator refused it
                if self.ev.floors.get(self.ev.floor_key(s._replace(zero=1)), 0) is not None:
                    self._judge(count - self.ev.judged[s], "dominated")
                else:
                    self.total -= count
                continue
            group = over.setdefault(s._replace(ep=0, zero=0), [])
            if any(z >= s.zero and self._zero_floor_falls(z, s.zero)
                   and (e == s.ep or e >= s.ep >= 2 and self._floors_fall(s)) for e, z in group):
                self._judge(count - self.ev.judged[s], "states floor")
                continue
            floor = self.ev.floor(s)
            if floor is None:
                self.total -= count  # the estimator refuses the layout: not a layout
                continue
            if not self.req.within(floor):
                group.append((s.ep, s.zero))
                self._judge(count - self.ev.judged[s], "states floor")
                continue
            alive.append((s, floor, count))
        tops = {s: self.ev.shape_speeds(s) for s, _, _ in alive}
        for s, floor, count in sorted(alive, key=lambda x: -tops[x[0]].ceiling("none")):
            if not self._go_on():
                self.ceiling_left = tops[s].ceiling("none")  # the shapes left are in falling order of it
                return
            self._shape(s, floor, tops[s], count)

    def _floors_fall(self, s: Shape) -> bool:
        """The states floor falls (or stays) with EP from 2 up: experts split over more GPUs while
        their sharded states spread over the same TP x CP x DP. Not with DeepEP, whose buffers depend
        on EP (they do not on the ZeRO stage, with which the floor falls at every EP)."""
        return self.req.training.moe_dispatcher != "deepep"

    def _zero_floor_falls(self, over: int, zero: int) -> bool:
        """Whether ZeRO stage `over`'s floor over the budget puts stage `zero`'s over it too. Not from
        stage 3 down where Megatron-FSDP holds Adam's moments whole (memory/megatron_fsdp.py)."""
        return over == zero or over < 3 or not moments_at_global_shape(self.req.training, 3)

    def _micro(self, s: Shape) -> tuple[int, ...]:
        micro = self._micro_of.get(s)
        if micro is None:
            micro = self._micro_of[s] = shape_micro_batches(self.req.training, s)
        return micro

    def _count(self, s: Shape) -> int:
        return len(self._micro(s)) * variants_per_micro_batch(self.req.stack, self.req.architecture, s)

    def _out(self, floor: float, ceiling: float) -> bool:
        """No layout with at least `floor` memory and at most `ceiling` throughput can be in the
        answer: none fits, or each is hopeless (`_Answer.hopeless`)."""
        return not self.req.within(floor) or self.answer.hopeless(floor, ceiling)

    def _judge(self, count: int, rule: str | None = None) -> None:
        self.searched += count
        if rule:
            self.pruned[rule] += count

    def _dominated_zero(self, s: Shape) -> bool:
        """Rule 5: ZeRO 0 loses to ZeRO 1 on both counts where there is a DP x CP group."""
        return s.zero == 0 and self.req.training.framework in ("megatron", "deepspeed") and s.dp * s.cp > 1

    def _shape(self, s: Shape, floor: int, top: Speeds, count: int) -> None:
        if self.answer.hopeless(floor, top.ceiling("none")):
            self._judge(count - self.ev.judged[s], "bound")
            return
        # each mode's ceiling over the micro-batches from their exact speeds without recompute (rule 4):
        # a mode hopeless even at the states floor needs no estimate of its least memory (rule 1)
        ceilings = self._exact_ceilings(s) if self._loose(s) else {m: top.ceiling(m, 1) for m in self.modes}
        wanted = {m for m in ceilings if not self.answer.hopeless(floor, ceilings[m])}
        if not wanted:
            self._judge(count - self.ev.judged[s], "bound")
            return
        least = self._least(s, wanted)
        # none keeps all that selective keeps (rule 2, not for torchtitan's operator-level policy),
        # and no mode needs less with a larger micro-batch; the states floor bounds a mode not estimated
        modes = {"none": least.get("none", least.get("selective", floor)), "selective": least.get("selective", floor),
                 "full": least.get("full", floor)}
        modes = {m: lb for m, lb in modes.items() if m in self.modes}
        open_ = {m: m in wanted and self.req.within(lb) and not self.answer.hopeless(lb, ceilings[m])
                 for m, lb in modes.items()}
        if not any(open_.values()):
            fits = any(self.req.within(lb) for lb in modes.values())
            self._judge(count - self.ev.judged[s], "bound" if fits else "least memory")
            return
        below = dict(modes)  # the least memory of each mode at this micro-batch and above (rule 3)
        full_below: dict[int, float] = {}  # ... of full recompute of n layers, by n, where estimated
        for b in self._micro(s):
            if not self._gradients_alive(s, b) and self._gradients_alive(s, 1):
                below = dict(modes)  # one micro-batch, no pipeline: gradients not yet alive, memory may fall
                full_below = {}
            self._micro_batch(s, b, below, open_, full_below)

    def _gradients_alive(self, s: Shape, b: int) -> bool:
        """Whether gradients exist during forward and backward (memory.py): Megatron's buffer,
        accumulation over micro-batches, or a pipeline."""
        return (self.req.training.framework == "megatron" or s.pp > 1
                or self.ev.microbatches(s, b) > 1)

    def _loose(self, s: Shape) -> bool:
        """Whether the exact speeds of the shape's micro-batches pay their rooflines: for an MoE model
        (the ceilings scale expert traffic to the stage with the fewest MoE layers, and DeepSeek-V3's
        first stages have none: its least-memory estimates fall by 40%), or where the shape's ceilings
        are loose (`LOOSE` above the exact speed without recompute at its largest micro-batch, whose
        roofline they came from); a dense model's tight ceilings leave them nothing to prune
        (Llama-3.1-70B on 64 GPUs: 17% more rooflines, no estimate fewer). A choice of cost, never of
        the answer."""
        if self.req.architecture.is_moe:
            return True
        speed = self.ev.speeds(s, max(self._micro(s)))
        return speed._replace(cap=math.inf).ceiling("none") > LOOSE * speed.cap

    def _exact_ceilings(self, s: Shape) -> dict[str, float]:
        """Per recompute mode, a speed no variant of the shape exceeds: the most over its
        micro-batches of the micro-batch's ceiling (`Speeds`) capped by its exact speed without
        recompute (rule 4: recompute only adds work; the roofline runs every loss alike)."""
        floor = self.ev.floor(s)
        out = dict.fromkeys(self.modes, 0.0)
        for b in self._micro(s):
            # first the micro-batch's ceilings without a roofline: where they leave every mode
            # hopeless at the states floor, no roofline of this micro-batch is needed
            cheap = self.ev.micro_batch_ceilings(s, b)
            found = {m: cheap.ceiling(m, 1) for m in out}
            settled = all(not self.answer.hopeless(floor, out[m]) for m in out)  # every mode wanted already
            if not settled and not all(self.answer.hopeless(floor, c) for c in found.values()):
                speed = self.ev.speeds(s, b)
                found = {m: min(c, speed.ceiling(m, 1)) for m, c in found.items()}
            for m in out:
                out[m] = max(out[m], found[m])
        return out

    def _least(self, s: Shape, wanted: set[str]) -> dict[str, float]:
        """The least memory of the `wanted` modes (selective for none where none keeps all that
        selective keeps) over the shape's micro-batches and recompute layers: at micro-batch 1 (and
        where gradients vanish), recomputing every layer, the smaller of fused and chunked loss
        (rules 2, 3, 5)."""
        sizes = [1] + [b for b in self._micro(s) if not self._gradients_alive(s, b) and self._gradients_alive(s, 1)][:1]
        if self._selective_within_none() and "none" in wanted:
            wanted = (wanted - {"none"}) | {"selective"}
        modes = [m for m in ("none", "selective", "full") if m in wanted]
        return {mode: min(self._pair(s, Variant(b, mode, None, self.losses[0]))[0] for b in sizes) for mode in modes}

    def _selective_within_none(self) -> bool:
        """Rule 2's first half: Megatron's selective recompute drops tensors from what none keeps;
        torchtitan's operator-level policy (fsdp2) saves tensors of its own (a row-parallel matmul's
        whole output under TP), which can exceed what none keeps."""
        return "selective" in self.modes and not op_level(_selective(self.req.training))

    def _micro_batch(self, s: Shape, b: int, below: dict, open_: dict, full_below: dict[int, float]) -> None:
        most = most_stage_layers(self.req.architecture, s)
        each = {m: self.req.stack.settings(m, most) for m in self.modes}
        per_mode = {m: len(self.losses) * n for m, n in each.items()}  # the losses searched (standard: rule 5)
        alive = [m for m in open_ if open_[m]]
        self._judge(self.dominated_losses * sum(each.values()), "dominated")  # the standard loss (rule 5)
        # the shape's ceilings with this micro-batch's bubble (rule 4): no roofline of this one is needed
        top = self.ev.micro_batch_ceilings(s, b)
        if self._out(min(below[m] for m in alive), max(top.ceiling(m, 1) for m in alive)):
            alive = []
        if alive:
            speed = self.ev.speeds(s, b)  # recompute only adds work (rule 4)
            fastest = speed.cap
            ceilings = {"none": fastest, "selective": speed.ceiling("selective"), "full": speed.ceiling("full", 1)}
            if self._out(min(below[m] for m in alive), max(ceilings[m] for m in alive)):
                alive = []
        for mode in [m for m in per_mode if m not in alive]:
            self._judge(per_mode[mode] - self._estimated_mode(s, b, mode, most), "bound")
        if "selective" in alive:
            memory = self._candidate(s, Variant(b, "selective", None, self.losses[0]), below["selective"],
                                     ceilings["selective"])
            below["selective"] = max(below["selective"], memory or 0)
        if "none" in alive:
            lower = max(below["none"], below["selective"]) if self._selective_within_none() else below["none"]
            memory = self._candidate(s, Variant(b, "none", None, self.losses[0]), lower, fastest,
                                     exact=len(self.ev.ceiling_losses) == 1)
            below["none"] = max(lower, memory or 0)
        if "full" in alive:
            below["full"] = max(below["full"], self._full_family(s, b, below["full"], speed, full_below))

    def _estimated_mode(self, s: Shape, b: int, mode: str, most: int) -> int:
        if mode == "full":
            return self._estimated_full(s, b, range(1, most + 1), most)
        return sum(1 for loss in self.losses if (s, Variant(b, mode, None, loss)) in self.ev.memory)

    def _pair(self, s: Shape, v: Variant) -> tuple[float, Variant]:
        """Rule 5's pair: the fused and the chunked loss run alike; the one that needs less memory
        stands for both. (memory, variant); memory is inf when the estimator refuses both."""
        best = (math.inf, v)
        for loss in self.losses:
            key = (s, v._replace(loss=loss))
            total = self.ev.total(*key)
            if total is not None and total < best[0]:
                best = (total, key[1])
        return best

    def _candidate(self, s: Shape, v: Variant, lower: float, upper: float, exact: bool = False,
                   speeds: dict[int, float] | None = None) -> float | None:
        """Judges one recompute setting's pair: skipped when a memory it cannot go below is over the
        budget or (that memory, a speed it cannot exceed) is hopeless, else estimated; a fitting one
        gets its roofline and joins the answer unless hopeless on its own memory. `exact`: `upper`
        is its speed. Its memory, None when skipped; a roofline's speed is noted in `speeds` under
        the recompute layers (full recompute)."""
        if self._out(lower, upper):
            done = sum(1 for loss in self.losses if (s, v._replace(loss=loss)) in self.ev.memory)
            self._judge(len(self.losses) - done, "bound")
            return None
        memory, variant = self._pair(s, v)
        if self.req.within(memory) and not self.answer.hopeless(memory, upper):
            # `upper` is the ceiling loss's exact speed: the variant's own where the pair runs alike or it is that loss
            exact = exact and (not self.ev.losses_apart or (variant.loss,) == self.ev.ceiling_losses)
            speed = upper if exact else self.ev.roofline(s, variant).step.tokens_per_s_per_gpu
            if speeds is not None:  # a ceiling for more layers recomputed: under either loss
                speeds[v.layers or most_stage_layers(self.req.architecture, s)] = (
                    (self._speed(s, v) or speed) if self.ev.losses_apart else speed)
            self.answer.add((s, variant), Point(memory, speed))
            if self.ev.losses_apart:
                self._add_twin(s, variant)
        return memory

    def _add_twin(self, s: Shape, v: Variant) -> None:
        """Where the losses run apart, the pair's other loss joins the answer too, at its own speed, when it fits
        and is not hopeless: it needs more memory but may be faster."""
        twin = v._replace(loss=next(x for x in self.losses if x != v.loss))
        memory = self.ev.total(s, twin)
        if memory is not None and self.req.within(memory):
            speed = self.ev.roofline(s, twin).step.tokens_per_s_per_gpu
            if not self.answer.hopeless(memory, speed):
                self.answer.add((s, twin), Point(memory, speed))

    def _full_family(self, s: Shape, b: int, lower: float, speed: Speeds, known: dict[int, float]) -> float:
        """Full recompute of n = 1 ... most layers per stage (rules 2 and 5: memory and speed fall as
        n grows). `known`: n -> its memory at a smaller micro-batch (rule 3: a lower bound here),
        to which what is estimated here is added. Returns a lower bound on the memory of n = most (its
        memory when estimated)."""
        most = most_stage_layers(self.req.architecture, s)
        first = 1 if self.req.stack.partial else most  # n = 1 ... most, or every layer alone (stacks.py)
        n = len(self.losses)
        if self._out(lower, speed.ceiling("full", first)):
            self._judge(n * (most + 1 - first) - self._estimated_full(s, b, range(first, most + 1), most), "bound")
            return lower
        full = _FullSpeeds(speed)
        if first < most and full.loose:  # the family's fastest setting, exactly: a ceiling for every n (rule 5)
            one = self._speed(s, self._full(b, 1, most))
            if one is not None:
                full.exact[1] = one
                if self._out(lower, one):
                    self._judge(n * most - self._estimated_full(s, b, range(1, most + 1), most), "bound")
                    return lower
        top = self._candidate(s, self._full(b, most, most), lower, full.ceiling(most))
        if top is not None:
            known[most] = top
        if top is not None and not self.req.within(top):
            self._judge(n * (most - first) - self._estimated_full(s, b, range(first, most), most), "monotone recompute")
        else:
            self._interval(s, b, first, most, lower if top is None else top, full, known)
        return lower if top is None else top

    def _speed(self, s: Shape, v: Variant) -> float | None:
        """The expected tokens/s per GPU of a layout, the faster loss's where the losses run apart (a ceiling for
        both; None: the roofline refuses it)."""
        losses = self.ev.ceiling_losses if self.ev.losses_apart else (v.loss,)
        try:
            return max(self.ev.roofline(s, v._replace(loss=loss)).step.tokens_per_s_per_gpu for loss in losses)
        except ConfigError:
            return None

    def _full(self, b: int, n: int, most: int) -> Variant:
        return Variant(b, "full", None if n == most else n, self.losses[0])

    def _estimated_full(self, s: Shape, b: int, ns: range, most: int) -> int:
        """Fused and chunked full recompute settings with n in `ns` already estimated (or refused)."""
        return sum(1 for n in self.ev.full_layers.get((s, b), ()) if (most if n is None else n) in ns)

    def _interval(self, s: Shape, b: int, lo: int, hi: int, lower: float, speed: _FullSpeeds,
                  known: dict[int, float]) -> None:
        """n in [lo, hi - 1], none of them judged, all needing at least `lower` (the memory of n = hi
        or a bound on it) and, at each n, what any n' >= n needed at this or a smaller micro-batch
        (`known`; rules 2 and 3): those up to the largest n' over the budget are over it; the rest
        skipped when (their least bound, the speed ceiling at lo) is hopeless, else split at a
        middle n, estimated."""
        if lo >= hi:
            return
        most = most_stage_layers(self.req.architecture, s)
        over = max((n for n, memory in known.items() if n >= lo and not self.req.within(memory)), default=0)
        if over >= lo:
            last_over = min(over, hi - 1)
            self._judge(len(self.losses) * (last_over + 1 - lo)
                        - self._estimated_full(s, b, range(lo, last_over + 1), most),
                        "monotone recompute")
            lo = last_over + 1
            if lo >= hi:
                return
        floor = max(lower, _at_least(known, hi - 1))
        if speed.loose and not self._out(floor, speed.ceiling(lo)) and lo not in speed.exact:
            exact = self._speed(s, self._full(b, lo, most))  # the range's fastest, exactly (rule 5)
            if exact is not None:
                speed.exact[lo] = exact
        if self._out(floor, speed.ceiling(lo)):
            self._judge(len(self.losses) * (hi - lo) - self._estimated_full(s, b, range(lo, hi), most), "bound")
            return
        mid = (lo + hi - 1) // 2
        memory = self._candidate(s, self._full(b, mid, most), max(lower, _at_least(known, mid)),
                                 speed.ceiling(mid), speeds=speed.exact)
        if memory is not None:
            known[mid] = memory
        if memory is not None and not self.req.within(memory):  # nor does any n below it
            self._judge(len(self.losses) * (mid - lo) - self._estimated_full(s, b, range(lo, mid), most),
                        "monotone recompute")
        else:
            self._interval(s, b, lo, mid, lower if memory is None else memory, speed, known)
        self._interval(s, b, mid + 1, hi, lower, speed, known)

    def layouts(self) -> tuple[Layout, ...]:
        top, front = self.answer.keys()
        out = [self._layout(key, key in front) for key in top | front]
        # ties on speed and memory in the layout's own fields, so the order never depends on the
        # iteration order of a set (the CLI and the app rank alike)
        return tuple(sorted(out, key=lambda x: (-x.tokens_per_s_per_gpu, x.device_total_bytes,
                                                json.dumps(x.changes(), sort_keys=True))))

    def _layout(self, key: tuple, pareto: bool) -> Layout:
        s, v = key
        e, r = self.ev.estimate(s, v), self.ev.roofline(s, v)
        return Layout(parallel=e.parallel, training=e.training, device_total_bytes=e.device_total_bytes,
                      peak_stage=e.peak_stage, utilization=e.fit.utilization, step_time_s=r.step.time_s,
                      tokens_per_s_per_gpu=r.step.tokens_per_s_per_gpu, mfu=r.step.mfu, pareto=pareto)


LOOSE = 1.2  # a ceiling this far above the exact speed: exact speeds of full recompute pay (_FullSpeeds)


class _FullSpeeds:
    """Ceilings on the speed of full recompute of n layers at one shape and micro-batch: the
    shape's (`Speeds`), and the exact speed of any n' <= n found so far (`exact`, n' -> tokens/s
    per GPU): recomputing more layers is never faster (rule 5)."""

    def __init__(self, speeds: Speeds):
        self.speeds = speeds
        self.exact: dict[int, float] = {}
        # whether exact speeds are worth their rooflines: where the shape's ceiling without recompute
        # is well above the exact speed (an MoE model's expert traffic, which the ceiling scales to
        # the stage with the fewest MoE layers); a choice of cost, never of the answer
        self.loose = speeds._replace(cap=math.inf).ceiling("none") > LOOSE * speeds.cap

    def ceiling(self, n: int) -> float:
        return min([self.speeds.ceiling("full", n)] + [v for k, v in self.exact.items() if k <= n])


def _at_least(known: dict[int, float], n: int) -> float:
    """A lower bound on the memory of full recompute of n layers from `known` (n' -> memory at this
    or a smaller micro-batch): recomputing fewer layers never needs less (rule 2), nor does a larger
    micro-batch (rule 3)."""
    return max((memory for k, memory in known.items() if k >= n), default=0.0)
