"""What to change when a run does not fit: single changes, each estimated, best first.

Every suggestion is one knob turned from the user's configuration — a memory saver (recompute,
a chunked loss, a smaller micro-batch, a higher ZeRO stage, expandable segments, 8-bit Adam) or a
wider split of the model (TP, PP, CP), which keeps the number of GPUs by halving DP where it can
and keeps the samples per optimizer step by raising the number of micro-batches. Each one is a
full estimate, so the numbers are the estimator's, not a rule of thumb.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from .activations import global_batch_size
from .architecture import Architecture
from .config import Config
from .errors import ConfigError
from .hardware import Hardware
from .memory import estimate
from .parallel import Parallel
from .training import Training


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


def _candidates(arch: Architecture, tr: Training, par: Parallel, hw: Hardware):
    """(description, training, parallel, hardware) for each single change worth trying."""
    gbs = global_batch_size(tr, par)
    same_batch = _replace(tr, global_batch_size=gbs)
    if tr.mode == "training":
        if tr.recompute != "full":
            yield "full activation recomputation (keep only each layer's input)", _replace(
                tr, recompute="full", recompute_layers=None, recompute_modules=("core_attn",)), par, hw
        if tr.recompute == "none":
            yield "selective recomputation of the attention core", _replace(tr, recompute="selective"), par, hw
        if tr.loss == "standard":
            yield "a chunked fused-linear cross-entropy loss (Liger/CCE)", _replace(tr, loss="chunked"), par, hw
        if tr.micro_batch_size > 1:
            yield (f"micro-batch {tr.micro_batch_size // 2} (same global batch, twice the micro-batches)",
                   _replace(same_batch, micro_batch_size=tr.micro_batch_size // 2), par, hw)
        zero = par.zero_stage
        if tr.framework in ("megatron", "deepspeed") and (zero or 0) < 3:
            yield f"ZeRO stage {(zero or 0) + 1}", tr, _replace(par, zero_stage=(zero or 0) + 1), hw
        if tr.framework == "fsdp2" and zero == 2:
            yield "FSDP2 full sharding (reshard after forward)", tr, _replace(par, zero_stage=3), hw
        if tr.optimizer == "adamw" and tr.framework in ("hf", "fsdp2", "deepspeed"):
            yield "8-bit Adam (bitsandbytes)", _replace(tr, optimizer="adam8bit"), par, hw
    if not hw.expandable_segments:
        yield "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True", tr, par, _replace(hw, expandable_segments=True)
    for knob, label in (("tp", "tensor parallel"), ("pp", "pipeline stages"), ("cp", "context parallel")):
        wider = {knob: getattr(par, knob) * 2}
        if knob == "tp":
            wider["sequence_parallel"] = True
            if par.etp == par.tp:
                wider["etp"] = par.tp * 2
        if par.dp % 2 == 0:
            yield (f"{label} {wider[knob]} (DP {par.dp // 2}: same GPUs, same global batch)", same_batch,
                   _replace(par, dp=par.dp // 2, world_size=None, **wider), hw)
        else:
            yield f"{label} {wider[knob]} (twice the GPUs)", same_batch, _replace(par, world_size=None, **wider), hw


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


def plan_to_fit(cfg: Config, max_steps: int = 5) -> list[Suggestion]:
    """Changes applied one after another, each the best single change from where the last left
    off, until the run fits on its GPU (or nothing lowers the total any more). Greedy, so a
    short plan rather than the shortest; every step is a full estimate."""
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
