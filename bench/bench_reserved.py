"""What the allocator's replay (estimator/memory/reserved.py) adds to an estimate, and to a plan.

Run: python bench/bench_reserved.py
Target: well under 50 ms added to the first estimate of an HF Trainer run of the common presets (the
replay is remembered per configuration: an app rerun of the same configuration pays nothing again).
Measured (CPU time, Python 3.11, a shared 2-core machine, over runs): 3-31 ms for the 1-8B presets,
19-64 ms for Llama-3.1-70B; the plan unchanged (it judges with the flat share).

Each line: an HF Trainer run (one GPU, 4,096 tokens, micro-batch 1; one micro-batch per step, then 8
with gradient accumulation), the first estimate on a new architecture object (nothing remembered)
with the replay and with the flat share in its place (the replay's rule switched off), best of 5.
Last, a plan of an HF run on one GPU, which judges and lists its layouts with the flat share
(`estimate(..., replay=False)`): the replay must cost it nothing.
"""

from __future__ import annotations

import dataclasses
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from estimator import Hardware, Parallel, Training, estimate  # noqa: E402
from estimator.memory import memory  # noqa: E402
from estimator.models.presets import get_architecture  # noqa: E402
from estimator.search.planner import plan  # noqa: E402

PRESETS = ("llama-3.2-1b", "qwen2.5-7b", "llama-3.1-8b", "qwen3-8b", "mistral-7b", "llama-3.1-70b")
HARDWARE = Hardware(gpu="h200")


def _best(run, repeats: int = 5) -> float:
    """The least CPU time of this process over `repeats` runs: on a shared machine the wall clock
    counts other processes' turns too (an idle server's wall time is this)."""
    best = float("inf")
    for _ in range(repeats):
        start = time.process_time()
        run()
        best = min(best, time.process_time() - start)
    return best


def _first_estimate(name: str, training: Training) -> float:
    arch = get_architecture(name)
    return _best(lambda: estimate(dataclasses.replace(arch), training, Parallel(), HARDWARE))


class _flat_share:
    """The replay's rule switched off: every configuration takes the flat share."""

    def __enter__(self):
        self.rule = memory.replay_rule
        memory.replay_rule = lambda cfg: "switched off (bench)"

    def __exit__(self, *exc):
        memory.replay_rule = self.rule


def main() -> None:
    print(f"{'preset':<16}{'steps of':>9}{'replayed ms':>13}{'flat ms':>9}{'added ms':>10}")
    for name in PRESETS:
        for batch in (None, 8):
            training = Training(framework="hf", seq_len=4096, global_batch_size=batch)
            replayed = _first_estimate(name, training)
            with _flat_share():
                flat = _first_estimate(name, training)
            print(f"{name:<16}{batch or 1:>9}{replayed * 1e3:>13.1f}{flat * 1e3:>9.1f}{(replayed - flat) * 1e3:>10.1f}")
    arch = get_architecture("llama-3.2-1b")
    training = Training(framework="hf", seq_len=4096, global_batch_size=8)
    replayed = _best(lambda: plan(dataclasses.replace(arch), training, "h100-80", 1, limit=8), 3)
    with _flat_share():
        flat = _best(lambda: plan(dataclasses.replace(arch), training, "h100-80", 1, limit=8), 3)
    layouts = len(plan(arch, training, "h100-80", 1, limit=8).layouts)
    print(f"plan llama-3.2-1b hf on 1 x h100-80 ({layouts} layouts listed): {replayed:.2f} s replayed, "
          f"{flat:.2f} s flat share")


if __name__ == "__main__":
    main()
