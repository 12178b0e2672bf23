"""Speed of the estimator: one estimate of Llama-3.1-405B on PP=16 x VPP=4, and `import estimator`.

Run: python bench/bench_estimate.py
Targets: an estimate of 100 microseconds or less (issue 11), the import under 50 ms.

Three lines, from the most remembered to nothing remembered:
- the same estimate again on the same architecture object (a loop over one layout, an app rerun): it
  reads back what the architecture remembers, the checked and derived configuration (resolved.py),
  the stage split and ledger, the shared and static parts of the stages (memory._stage_memo, keyed
  by what they depend on: TP, SP, DP, CP, EP, ETP, the training setup, ...), and what remains is
  the per-stage pass (micro-batches in flight, activations, the three phases' totals), linear in
  the stages;
- the first estimate of each of 60 layouts (TP, PP, VPP, end stages, DP, micro-batch, recompute) on
  an architecture that has seen one other layout: what a layout search pays per layout it estimates;
- a new architecture object each call: nothing remembered (the parameter inventory too).
"""

from __future__ import annotations

import dataclasses
import gc
import itertools
import os
import statistics
import subprocess
import sys
import tempfile
import time
import timeit
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from estimator import Architecture, ConfigError, Parallel, Training, estimate  # noqa: E402

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
    """`import estimator` in a fresh interpreter (the import alone, not the interpreter's start-up),
    from bytecode as an installed package imports it: a first run compiles into an empty cache
    folder (PYTHONPYCACHEPREFIX; this project's machine sets PYTHONDONTWRITEBYTECODE, under which
    every run would compile every module again, ~60 ms), the timed runs read it."""
    env = dict(os.environ, PYTHONPYCACHEPREFIX=tempfile.mkdtemp(prefix="bench-pycache-"))
    env.pop("PYTHONDONTWRITEBYTECODE", None)

    def run() -> float:
        out = subprocess.run([sys.executable, "-c", "import time; t = time.perf_counter(); import estimator; "
                              "print(time.perf_counter() - t)"], capture_output=True, text=True, env=env,
                             cwd=Path(__file__).resolve().parents[1], check=True)
        return float(out.stdout)
    run()
    return min(run() for _ in range(runs)) * 1e3


def new_layouts() -> list[tuple[Training, Parallel]]:
    """Distinct valid layouts of the 405B model on 1,024 GPUs and fewer: TP, PP, VPP, the end stages, DP,
    the micro-batch and recompute (full recompute of 1 to 4 layers too), each estimated once."""
    out = []
    for tp, pp, vpp, ends, dp, micro, (recompute, layers) in itertools.product(
            (4, 8), (8, 16), (1, 2, 3), (None, 6, 7), (2, 8), (1, 2),
            (("none", None), ("selective", None), ("full", None), ("full", 1), ("full", 4))):
        par = dataclasses.replace(PARALLEL, tp=tp, pp=pp, vpp=vpp, dp=dp, pp_first_stage_layers=ends,
                                  pp_last_stage_layers=ends)
        tr = dataclasses.replace(TRAINING, micro_batch_size=micro, recompute=recompute, recompute_layers=layers)
        try:
            estimate(LLAMA_405B, tr, par)
        except ConfigError:
            continue
        out.append((tr, par))
    return out


def new_layout_timing(layouts: list[tuple[Training, Parallel]], repeat: int = 15) -> tuple[float, float]:
    """(minimum, median) over `repeat` passes of the mean seconds of the first estimate of each layout on
    an architecture that has seen one other layout (its parameter buckets remembered, nothing of these
    layouts): what a layout search pays per layout it estimates."""
    runs = []
    for _ in range(repeat):
        arch = dataclasses.replace(LLAMA_405B)
        estimate(arch, TRAINING, PARALLEL)
        gc_was = gc.isenabled()
        gc.disable()  # as timeit does
        start = time.perf_counter()
        for tr, par in layouts:
            estimate(arch, tr, par)
        runs.append((time.perf_counter() - start) / len(layouts))
        if gc_was:
            gc.enable()
    return min(runs), statistics.median(runs)


def main() -> None:
    warm = timing(lambda: estimate(LLAMA_405B, TRAINING, PARALLEL))
    layouts = new_layouts()
    first = new_layout_timing(layouts)
    # a fresh architecture object per estimate (nothing remembered), built outside the timed loop
    fresh = iter([dataclasses.replace(LLAMA_405B) for _ in range(15 * 200 + 10)])
    cold = timing(lambda: estimate(next(fresh), TRAINING, PARALLEL))
    full = timing(lambda: estimate(LLAMA_405B, TRAINING, PARALLEL).to_json())
    print("Llama-3.1-405B, TP 8 x PP 16 x VPP 4 x DP 8 (min / median of 15 runs of 200)")
    print(f"  the same estimate again (architecture reused):   {warm[0] * 1e6:7.1f} / {warm[1] * 1e6:7.1f} us")
    print(f"  estimate of a layout not seen before ({len(layouts)} layouts, each once): "
          f"{first[0] * 1e6:7.1f} / {first[1] * 1e6:7.1f} us")
    print(f"  estimate, new architecture object:               {cold[0] * 1e6:7.1f} / {cold[1] * 1e6:7.1f} us")
    print(f"  estimate + to_json() (formulas, every stage):    {full[0] * 1e6:7.1f} / {full[1] * 1e6:7.1f} us")
    print("  target: 100 us (issue: a fast core and a planner)")
    print(f"import estimator, from bytecode (min of 21 fresh interpreters): {import_time_ms():7.1f} ms   "
          "(target < 50 ms)")


if __name__ == "__main__":
    main()
