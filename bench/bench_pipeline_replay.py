"""The first estimate of a long pipeline: Llama-3.1-405B on 8 to 16 stages with 64 or 128 micro-batches, where
Megatron-Core's caching-allocator replay (estimator/memory/megatron_replay.py) walks every stage's micro-batches.

    python bench/bench_pipeline_replay.py            # every case, best of 5
    python bench/bench_pipeline_replay.py --repeat 3 pp9

Each line: the CPU seconds of one estimate (`estimate(...)` and its `to_json()`) on a new architecture object with
nothing remembered (the replay's remembered group effects emptied too: allocator._EFFECTS), best of `--repeat`;
and the same with the replay switched off (the flat share in its place, `replay=False`: what a layout search pays),
and their difference, the replay's own cost. The cases: Megatron-Core TP 8 x PP 9 (126 layers, 14 per stage),
and PP 8 with 15 layers on the end stages, with 64 micro-batches (global batch 64, DP 1), no recompute and full
recompute, with and without the distributed optimizer; PP 16 (7 layers on the end stages) with 128 micro-batches;
and, not replayed, the interleaved schedule (VPP 2) and torchtitan's (FSDP2) 1F1B, interleaved, zero-bubble and
DualPipeV schedules.
Target: the first estimate of each under 0.15 s (a public server is shared: no request may hold it).

Measured (CPU seconds, best of 5, Python 3.11, the shared 2-core machine under load 6-8; the code before the
replay's records and short cuts (b243b0f) in the same minutes), before -> after:
  pp9 none                    0.329 -> 0.090
  pp9 none zero1              0.353 -> 0.119
  pp9 full                    0.394 -> 0.186
  pp9 full zero1              0.379 -> 0.176
  pp9 selective               0.002 -> 0.001
  pp8 15|..|15 none           0.572 -> 0.095
  pp8 15|..|15 full zero1     0.406 -> 0.152
  pp16 7|..|7 full, 128 mb    0.619 -> 0.170
  pp9 vpp2, 72 mb             0.002 -> 0.002
  titan pp9 1f1b              0.002 -> 0.002
  titan pp9 interleaved       0.018 -> 0.018
  titan pp9 zero_bubble       0.001 -> 0.002
  titan pp9 dualpipev         0.001 -> 0.002
Runs a few minutes apart on this machine differ by up to 30% (pp9 full: 0.13 to 0.19 s after).
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from estimator import Parallel, Training, estimate  # noqa: E402
from estimator.memory import allocator  # noqa: E402
from estimator.models.presets import get_architecture  # noqa: E402

MEGATRON = dict(framework="megatron", seq_len=8192, global_batch_size=64)
PP9 = dict(tp=8, pp=9)
PP8 = dict(tp=8, pp=8, pp_first_stage_layers=15, pp_last_stage_layers=15)
CASES = {
    "pp9 none": (MEGATRON | dict(recompute="none"), PP9),
    "pp9 none zero1": (MEGATRON | dict(recompute="none"), PP9 | dict(zero_stage=1)),
    "pp9 full": (MEGATRON | dict(recompute="full"), PP9),
    "pp9 full zero1": (MEGATRON | dict(recompute="full"), PP9 | dict(zero_stage=1)),
    "pp9 selective": (MEGATRON | dict(recompute="selective"), PP9),
    "pp8 15|..|15 none": (MEGATRON | dict(recompute="none"), PP8),
    "pp8 15|..|15 full zero1": (MEGATRON | dict(recompute="full"), PP8 | dict(zero_stage=1)),
    "pp16 7|..|7 full, 128 mb": (MEGATRON | dict(recompute="full", global_batch_size=128),
                                 dict(tp=8, pp=16, pp_first_stage_layers=7, pp_last_stage_layers=7)),
    "pp9 vpp2, 72 mb": (MEGATRON | dict(recompute="full", global_batch_size=72), PP9 | dict(vpp=2)),
    "titan pp9 1f1b": (dict(framework="fsdp2", seq_len=8192, global_batch_size=64), PP9),
    "titan pp9 interleaved": (dict(framework="fsdp2", seq_len=8192, global_batch_size=64), PP9 | dict(vpp=2)),
    "titan pp9 zero_bubble": (dict(framework="fsdp2", seq_len=8192, global_batch_size=64),
                              PP9 | dict(pp_schedule="zero_bubble")),
    "titan pp9 dualpipev": (dict(framework="fsdp2", seq_len=8192, global_batch_size=64),
                            PP9 | dict(pp_schedule="dualpipev")),
}


def first_estimate(training: Training, parallel: Parallel, replay: bool, repeat: int) -> float:
    """The least CPU seconds of an estimate with nothing remembered, over `repeat` runs (on a shared machine the
    wall clock counts other processes' turns too)."""
    arch = get_architecture("llama-3.1-405b")
    best = float("inf")
    for _ in range(repeat):
        fresh = dataclasses.replace(arch)
        allocator._EFFECTS.clear()
        start = time.process_time()
        estimate(fresh, training, parallel, replay=replay).to_json()
        best = min(best, time.process_time() - start)
    return best


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("cases", nargs="*", help="the cases whose names start so (all by default)")
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    estimate(get_architecture("llama-3.2-1b"), Training(), Parallel())  # the imports, outside the timings
    print(f"{'Llama-3.1-405B, first estimate':<34}{'seconds':>9}{'flat share':>12}{'replay':>9}")
    for name, (training, parallel) in CASES.items():
        if args.cases and not any(name.startswith(c) for c in args.cases):
            continue
        tr, par = Training(**training), Parallel(**parallel)
        replayed = first_estimate(tr, par, True, args.repeat)
        flat = first_estimate(tr, par, False, args.repeat)
        print(f"{name:<34}{replayed:>9.3f}{flat:>12.3f}{replayed - flat:>9.3f}", flush=True)


if __name__ == "__main__":
    main()
