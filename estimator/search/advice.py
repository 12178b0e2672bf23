"""What to change when a run does not fit: single changes, each estimated, best first; and, when
no short chain of them fits, the nearest layout the planner finds.

Every suggestion is one knob turned from the user's configuration — a memory saver (recompute,
a chunked loss, Liger's kernels, a smaller micro-batch, a higher ZeRO stage, expandable segments, 8-bit Adam) or a
wider split of the model (TP, PP, CP), which keeps the number of GPUs by halving DP where it can
and keeps a global batch the user set by raising the number of micro-batches (one left open stays
open: the estimator's default fills the new pipeline). Each one is a full estimate, so the numbers
are the estimator's, not a rule of thumb.

Single changes only ever double one setting, so they miss layouts that move several at once
(Llama-3.1-70B at 8k tokens on 8 GPUs needs 32 GPUs with PP 4). `plan_to_fit` then asks the
planner (planner.py) for every fitting layout on the user's GPUs, or on the fewest GPUs that
fit, and takes the cheapest: the fewest and smallest moves from the user's layout, and then the
least step time.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from math import log2

from ..memory.pipeline import microbatches
from ..spec.architecture import Architecture
from ..spec.config import Config
from ..spec.errors import ConfigError
from ..spec.hardware import Hardware
from ..memory.memory import estimate
from ..spec.parallel import tp_following_defaults, Parallel
from ..memory.states import resolve_zero_stage
from ..spec.choices import FSDP_FRAMEWORKS
from ..spec.training import Training
from .stacks import stack


@dataclass(frozen=True)
class Suggestion:
    description: str
    config: Config  # the whole configuration with the change applied
    device_total_bytes: int
    utilization: float
    verdict: str  # on the user's GPU
    gpus: int  # GPUs the changed run uses


def _replace(obj, **changes):
    return dataclasses.replace(obj, **changes)


def _fine_tuning_candidates(tr: Training, par: Parallel, hw: Hardware):
    """An adapter run: a 4-bit base (QLoRA); an RL run: the trainer offloaded while the engine
    generates, and a smaller engine memory fraction (adapters.py, rl.py)."""
    adapter, rl = tr.adapter, tr.rl
    if adapter and adapter.method == "lora" and adapter.base_dtype in (None, "bf16", "fp16", "fp32"):
        yield ("QLoRA: the frozen base in NF4 (4-bit, double quantized)",
               _replace(tr, adapter=_replace(adapter, method="qlora", base_dtype=None)), par, hw)
    if rl and rl.algorithm != "dpo" and not rl.offload_during_rollout:
        yield ("offload the trainer's states to the host during the rollout",
               _replace(tr, rl=_replace(rl, offload_during_rollout=True)), par, hw)
    if rl and rl.algorithm != "dpo" and rl.engine_memory_fraction and rl.engine_memory_fraction > 0.3:
        fraction = round(rl.engine_memory_fraction - 0.2, 2)
        yield (f"engine memory fraction {fraction:g} (a smaller KV cache: fewer rollouts generated at once)",
               _replace(tr, rl=_replace(rl, engine_memory_fraction=fraction)), par, hw)


def _liger_candidate(arch: Architecture, tr: Training, par: Parallel, hw: Hardware):
    """Liger's kernels where the stack runs them and the estimator models the model's patch
    (memory/liger.py `check`: hf, deepspeed, fsdp1 and a dense RMSNorm/SwiGLU decoder Liger patches):
    liger_kernel and, as the Trainer's use_liger_kernel does with Liger's defaults (transformers 5.23
    integrations/liger.py; liger-kernel 0.8.5 fused_linear_cross_entropy=True), the chunked loss. An RL
    run keeps its loss: its trainers compute the log-probabilities from the logits (importers/openrlhf.py)."""
    from ..memory.liger import check
    if tr.liger_kernel:
        return
    liger = _replace(tr, liger_kernel=True, loss="chunked" if tr.rl is None else tr.loss)
    try:
        check(arch, liger)
    except ConfigError:
        return  # validation would refuse it: never offered
    yield "Liger kernels (use_liger_kernel)", liger, par, hw


def _sharded_trainer(tr: Training, par: Parallel, hw: Hardware):
    """The HF Trainer over plain DDP replicates every model state: with a group to shard over, the same run
    through DeepSpeed ZeRO-3 or Accelerate's FSDP2 (full shard), the HF Trainer's two sharded stacks."""
    if tr.framework != "hf" or par.dp < 2:
        return
    for framework, what in (("deepspeed", "DeepSpeed ZeRO-3 (framework deepspeed)"),
                            ("hf_fsdp2", "FSDP2 full shard through Accelerate (framework hf_fsdp2)")):
        yield (f"shard the model states over the {par.dp} GPUs: {what}", _replace(tr, framework=framework),
               _replace(par, zero_stage=3), hw)


def _batch_notes(tr: Training, par: Parallel) -> tuple[str, str]:
    """What a change that splits the batch differently says about it: a global batch the user set
    is kept (more micro-batches where DP halves); one left open stays open, so the estimator's
    default fills the new layout's pipeline (activations.global_batch_size) and no step writes a
    global batch the user did not choose. With a set batch, a pipeline wider than its micro-batches
    is said to be mostly bubble, as the Memory page says it."""
    if tr.global_batch_size is None:
        return "", ""
    m = microbatches(tr, par)
    bubble = (f"; {m} micro-batch{'es' if m != 1 else ''} for {par.pp} stages: mostly pipeline bubble"
              if tr.mode == "training" and m < par.pp else "")
    return ", same global batch", bubble


_LOSS_LABELS = {"chunked": "a chunked fused-linear cross-entropy loss (Liger/CCE; torchtune's chunked output)",
                "fused": "a fused cross-entropy loss (Megatron's --cross-entropy-loss-fusion; Liger's cross-entropy)"}


def _candidates(arch: Architecture, tr: Training, par: Parallel, hw: Hardware):
    """(description, training, parallel, hardware) for each single change worth trying: those the framework
    runs (stacks.py), so that the advice, like the planner, names only what its launch configuration can say."""
    st = stack(tr)
    if tr.mode == "training":
        if tr.recompute != "full":
            yield "full activation recomputation (keep only each layer's input)", _replace(
                tr, recompute="full", recompute_layers=None, recompute_modules=("core_attn",)), par, hw
        if tr.recompute == "none" and "selective" in st.recompute:
            yield "selective recomputation of the attention core", _replace(tr, recompute="selective"), par, hw
        for loss in (x for x in st.losses if x != "standard" and tr.loss == "standard"):
            yield _LOSS_LABELS[loss], _replace(tr, loss=loss), par, hw
        yield from _liger_candidate(arch, tr, par, hw)
        if tr.micro_batch_size > 1:
            smaller = _replace(tr, micro_batch_size=tr.micro_batch_size // 2)
            what = " (same global batch, twice the micro-batches)" if tr.global_batch_size else ""
            yield f"micro-batch {smaller.micro_batch_size}{what}", smaller, par, hw
        zero = par.zero_stage
        if tr.framework in ("megatron", "deepspeed") and (zero or 0) < 3:
            yield f"ZeRO stage {(zero or 0) + 1}", tr, _replace(par, zero_stage=(zero or 0) + 1), hw
        if tr.framework in FSDP_FRAMEWORKS and zero == 2:
            yield "FSDP2 full sharding (reshard after forward)", tr, _replace(par, zero_stage=3), hw
        if tr.optimizer == "adamw" and tr.framework in ("hf", "fsdp2", "deepspeed", "torchtune") and not tr.adapter:
            # DeepSpeed's AdamW kernel belongs to AdamW (spec/training.py): the 8-bit optimizer has none
            yield "8-bit Adam (bitsandbytes)", _replace(tr, optimizer="adam8bit", adamw_implementation=None), par, hw
        yield from _fine_tuning_candidates(tr, par, hw)
        yield from _sharded_trainer(tr, par, hw)
    if not hw.expandable_segments:
        yield "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True", tr, par, _replace(hw, expandable_segments=True)
    for knob, label in (("tp", "tensor parallel"), ("pp", "pipeline stages"), ("cp", "context parallel")):
        if knob not in st.splits and tr.mode == "training":
            continue
        wider = {knob: getattr(par, knob) * 2}
        if knob == "tp":  # what followed TP keeps following it
            following = tp_following_defaults(wider["tp"])
            wider.update({name: following[name] for name in following if par.follows_tp(name)})
        if par.dp % 2 == 0:
            changed, where = _replace(par, dp=par.dp // 2, world_size=None, **wider), f"DP {par.dp // 2}: same GPUs"
        else:
            changed, where = _replace(par, world_size=None, **wider), "twice the GPUs"
        same, bubble = _batch_notes(tr, changed)
        yield f"{label} {wider[knob]} ({where}{same}){bubble}", tr, changed, hw


def suggestions(cfg: Config, limit: int = 6) -> list[Suggestion]:
    """Single changes that lower the device total: those that fit first, those on the same GPUs
    before those on more, then by device total."""
    base = estimate(cfg.architecture, cfg.training, cfg.parallel, cfg.hardware)
    found = []
    for description, tr, par, hw in _candidates(cfg.architecture, cfg.training, cfg.parallel, cfg.hardware):
        try:
            result = estimate(cfg.architecture, tr, par, hw)
        except (ConfigError, ValueError):
            continue  # the change is not a valid layout for this model (heads, layers, sequence...)
        if result.device_total_bytes >= base.device_total_bytes:
            continue
        changed = dataclasses.replace(cfg, training=tr, parallel=par, hardware=hw)
        found.append(Suggestion(description, changed, result.device_total_bytes, result.fit.utilization,
                                result.fit.verdict, par.gpus))
    # what fits first; among equals, what keeps the user's GPUs before what asks for more
    order = {"fits": 0, "tight": 1, "oom": 2}
    found.sort(key=lambda s: (order[s.verdict], s.gpus > cfg.parallel.gpus, s.device_total_bytes))
    return found[:limit]


def plan_to_fit(cfg: Config, max_steps: int = 5, use_planner: bool = True, watch=None) -> list[Suggestion]:
    """A plan that fits: single changes applied one after another while each is the best from
    where the last left off (greedy: a short plan, each step a full estimate); when that ends
    without fitting, the planner's nearest fitting layout instead, on the user's GPUs or, if none
    fits there, on the fewest that do ("use more GPUs: at least N"). The planner's search takes
    seconds (a model of hundreds of billions of parameters on one GPU: tens): an interactive caller
    may leave it out (`use_planner=False`) and offer it apart, or bound it with `watch`
    (search/watch.py Watch; halted, the nearest layout found so far, else the greedy steps)."""
    steps = _greedy(cfg, max_steps)
    if (steps and steps[-1].verdict == "fits") or not use_planner:
        return steps
    nearest = nearest_fitting_layout(cfg, watch)
    return [nearest] if nearest else steps


def _greedy(cfg: Config, max_steps: int) -> list[Suggestion]:
    steps: list[Suggestion] = []
    current = cfg
    for _ in range(max_steps):
        options = suggestions(current, limit=1)
        if not options:
            break
        steps.append(options[0])
        current = options[0].config
        if options[0].verdict == "fits":
            break
    return steps


# How far a layout moves from the user's: each size (TP, PP, ...) costs log2 of its ratio (a
# doubling is one move), each other setting changed one; a layout slower than the fastest fitting
# one costs its relative slowdown in moves, so speed breaks ties between equally near layouts.
_SIZES = ("tp", "pp", "vpp", "cp", "dp", "ep", "etp", "micro_batch_size")


def _moves(cfg: Config, layout) -> list[tuple[str, object, object, float]]:
    """The planner's layout as moves from the user's: (field, before, after, cost). A field that
    follows TP (`parallel.tp_following_defaults`) and still does is no move of its own, and a
    default the user left open is no move when the layout keeps it."""
    changes = layout.changes()
    moves = []
    for section, given in (("parallel", cfg.parallel), ("training", cfg.training)):
        for name, value in changes[section].items():
            before = getattr(given, name)
            if isinstance(value, list):
                value = tuple(value)  # the JSON form of recompute_modules
            if value == before or (section == "parallel" and name in tp_following_defaults(given.tp)
                                   and layout.parallel.follows_tp(name) and given.follows_tp(name)):
                continue
            if name == "zero_stage" and before is None and value == resolve_zero_stage(cfg.training, cfg.parallel):
                continue  # the framework's default, now written out
            cost = abs(log2(value / before)) if name in _SIZES else 1.0
            moves.append((name, before, value, cost))
    return moves


def _distance(cfg: Config, layout, fastest_s: float) -> float:
    return sum(cost for *_, cost in _moves(cfg, layout)) + (layout.step_time_s / fastest_s - 1)


def nearest_fitting_layout(cfg: Config, watch=None) -> Suggestion | None:
    """The fitting layout nearest the user's (`_distance`), on their GPUs or on the fewest that fit.
    `watch` (estimator.watch.Watch) follows both searches and may halt them: then the nearest of
    the layouts found, or None."""
    from .planner import plan
    gpus = cfg.parallel.gpus
    found = plan(cfg.architecture, cfg.training, cfg.hardware, gpus, pareto=False, limit=200, watch=watch)
    if not found.layouts:
        fewest = (found.smallest_fit or {}).get(cfg.hardware.gpu)
        if not fewest or found.stopped:
            return None
        gpus = fewest
        found = plan(cfg.architecture, cfg.training, cfg.hardware, gpus, pareto=False, limit=200, watch=watch)
        if not found.layouts:
            return None
    fastest = min(x.step_time_s for x in found.layouts)
    best = min(found.layouts, key=lambda x: _distance(cfg, x, fastest))
    changed = dataclasses.replace(cfg, training=best.training, parallel=best.parallel)
    what = _describe(cfg, best)
    if gpus != cfg.parallel.gpus:
        what = f"use more GPUs: at least {gpus} (no layout fits on {cfg.parallel.gpus}); {what}"
    return Suggestion(what, changed, best.device_total_bytes, best.utilization, "fits", gpus)


def _describe(cfg: Config, layout) -> str:
    """The planner's layout as the moves from the user's: "TP 1 -> 8, PP 1 -> 4, recompute none -> full"."""
    moves = [f"{name} {'auto' if before is None else before} -> {', '.join(value) if isinstance(value, tuple) else value}"
             for name, before, value, _ in _moves(cfg, layout)]
    return "the planner's nearest fitting layout: " + ", ".join(moves) + \
        f" ({layout.tokens_per_s_per_gpu:,.0f} tokens/s per GPU expected)"
