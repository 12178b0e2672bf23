"""Speed of the estimator: one estimate of Llama-3.1-405B on PP=16 x VPP=4, and `import estimator`.

Run: python bench/bench_estimate.py
Targets: an estimate of 100 microseconds or less (issue 11), the import under 50 ms.

The first line reuses the architecture object, so it reads back what the architecture remembers:
the checked and derived configuration (resolved.py), the stage split and ledger, and the shared
and static parts of the stages (memory._stage_memo, keyed by what they depend on: TP, SP, DP, CP,
EP, ETP, the training setup, ...). What remains is the per-stage pass (micro-batches in flight,
activations, the three phases' totals), linear in the stages. The second line remembers nothing.
"""

from __future__ import annotations

import dataclasses
import statistics
import subprocess
import sys
import timeit
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from estimator import Architecture, Parallel, Training, estimate  # noqa: E402

LLAMA_405B = Architecture(name="llama-3.1-405b", hidden_size=16384, num_layers=126, num_attention_heads=128,
                          num_kv_heads=8, intermediate_size=53248, vocab_size=128256)
# Llama 3's layout (Grattafiori et al. 2024, section 3.3.2): TP 8, PP 16 with 7 layers on the end stages
TRAINING = Training(seq_len=8192, global_batch_size=1024, recompute="selective")
PARALLEL = Parallel(tp=8, pp=16, vpp=4, dp=8, pp_first_stage_layers=7, pp_last_stage_layers=7)


def timing(fn, repeat: int = 15, number: int = 200) -> tuple[float, float]:
    """(minimum, median) over `repeat` runs, each the mean of `number` calls, in seconds. The
    minimum is the cost without interference from the rest of the machine; the median shows the
    noise (on a shared 2-core VM it is large)."""
    runs = [t / number for t in timeit.repeat(fn, repeat=repeat, number=number)]
    return min(runs), statistics.median(runs)


def import_time_ms(runs: int = 21) -> float:
    """`import estimator` in a fresh interpreter, minus the interpreter's own start-up."""
    def run(code: str) -> float:
        out = subprocess.run([sys.executable, "-c", f"import time; t = time.perf_counter(); {code}; "
                              "print(time.perf_counter() - t)"], capture_output=True, text=True,
                             cwd=Path(__file__).resolve().parents[1], check=True)
        return float(out.stdout)
    return min(run("import estimator") for _ in range(runs)) * 1e3


def main() -> None:
    warm = timing(lambda: estimate(LLAMA_405B, TRAINING, PARALLEL))
    # a fresh architecture object per estimate (nothing remembered), built outside the timed loop
    fresh = iter([dataclasses.replace(LLAMA_405B) for _ in range(15 * 200 + 10)])
    cold = timing(lambda: estimate(next(fresh), TRAINING, PARALLEL))
    full = timing(lambda: estimate(LLAMA_405B, TRAINING, PARALLEL).to_json())
    print("Llama-3.1-405B, TP 8 x PP 16 x VPP 4 x DP 8 (min / median of 15 runs of 200)")
    print(f"  estimate, architecture reused (a layout search):  {warm[0] * 1e6:7.1f} / {warm[1] * 1e6:7.1f} us")
    print(f"  estimate, new architecture object:               {cold[0] * 1e6:7.1f} / {cold[1] * 1e6:7.1f} us")
    print(f"  estimate + to_json() (formulas, every stage):    {full[0] * 1e6:7.1f} / {full[1] * 1e6:7.1f} us")
    print("  target: 100 us (issue: a fast core and a planner)")
    print(f"import estimator (min of 21 fresh interpreters):  {import_time_ms():7.1f} ms   (target < 50 ms)")


if __name__ == "__main__":
    main()
