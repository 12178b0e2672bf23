"""Speed of the planner: layouts searched and seconds, on one core (one Python process).

    python bench/bench_planner.py            # all three cases (DeepSeek-V3's full plan takes 10-15 s)
    python bench/bench_planner.py 70b 405b   # some of them

Cases (the issue "A fast core and a planner"):
- Llama-3.1-70B on 64 H100s: NeMo's pre-training recipe's batch (estimator/models/presets/recipes.json
  "llama-3.1-70b-pretrain-64xh100": 8,192-token sequences, global batch 512);
- Llama-3.1-405B on 2,048 H100s: Llama 3's batch, 16M tokens of 8,192-token sequences
  (Grattafiori et al. 2024, section 3.3.2);
- DeepSeek-V3 on 2,048 H800s: the recipe "deepseek-v3-as-reported" (FP8, 4k sequences, batch
  15,360) on "h800", as the README's case (the figures below before that change were taken with h100-80
  standing in for the H800: the same 80 GB and compute, NVLink 450 GB/s one way against the H800's 200).

For each: the full answer (the 50 fastest fitting layouts and the Pareto front) and the fastest
layout alone (`pareto=False, limit=1`), with the layouts judged, the full estimates and rooflines
(`roofline.expected_step`) run, layouts per second, and the CPU seconds of the process (on a busy
machine the wall seconds of `Plan.seconds` overstate the work). Target: at least 100,000 layouts in
at most 2 s.

CPU seconds on one core (Python 3.11), top 50 + Pareto front / fastest only, the same answers:
Llama-3.1-70B (514,146 layouts) 15.3-15.9 / 6.2-6.6 before the roofline's shared operation tables
and `expected_step` (session 5), 2.99 / 0.94 at the start of session 6, 1.70 / 0.59 after its changes
(the cyclic garbage collector paused during the search; groups, ledgers and static stage parts shared
across layouts and recompute_layers; per-configuration values in a memo of their own);
Llama-3.1-405B (1,214,208) 5.42 / 1.98 -> 2.53 / 0.93; DeepSeek-V3 (2,964,357) 83.5 / 11.5 -> 28.6 / 6.7
(idle machine, one run each; the fastest-only run follows the full one in the same process).
After #26 (exact speeds capping the ceilings, layouts judged by `memory.device_total`, the states
floor from the static parts, stages without the head shared across losses), the same machine
loaded (2.4-2.9), the code before #26 the same minutes: DeepSeek-V3 13.0 / 5.1 against 32.7 / 9.3;
Llama-3.1-70B and 405B unchanged within the noise (2.35 / 0.51 against 2.23 / 0.88; 2.31 / 1.19
against 3.04 / 1.02).
With the step-time model of estimator/speed/ as it is now, the DeepSeek-V3 case has 2,194,641 layouts.
The search's exact micro-batch ceilings (each recompute mode's ceiling over a shape's micro-batches
from their exact speeds without recompute, before the shape's least memory is estimated; issue #26),
the same machine at load 5.3-5.9, the code before (fb081d9) the same minutes: DeepSeek-V3 12.3 / 3.0
(11,526 estimates, 12,193 rooflines) against 17.1 / 5.4 (18,810, 10,865); Llama-3.1-70B 3.3 / 1.0
against 4.0 / 1.2 and 405B 4.9 / 2.6 against 6.0 / 2.3 (load 5, the same estimates within 1%).
The interleaved schedule's in-flight micro-batches remembered (pipeline._interleaved_per_rank) and an
operation's times kept on it (#26, a later session), one run each at load 3.9, the code before
(3d74b67) right after: DeepSeek-V3 10.5 / 3.3 against 11.4 / 3.0 (the same 11,526 estimates and
12,193 rooflines; the fastest-only run is within the machine's noise).
The DeepSeek-V3 case on "h800" (the README's GPU) rather than h100-80, one run at load 7-8: 2,194,641
layouts, 11.8 / 5.1 s (10,136 estimates, 12,091 rooflines; the published layout 73% of the fastest).
The planner walking what each framework runs (search/stacks.py: Megatron's standard and fused losses, no chunked
one; torchtitan's own loss and no first-n-layers recompute), one run each at load 1, the code before right after:
Llama-3.1-70B 339,188 layouts, 6.3 / 0.65 s (4,958 estimates, 1,642 rooflines) against 508,782, 5.1 / 0.44;
405B 694,144, 6.4 / 0.73 against 1,041,216, 8.3 / 1.4; DeepSeek-V3 1,463,094, 21.8 / 7.3 (8,864 estimates,
12,049 rooflines) against 2,194,641, 24.9 / 7.3. The machine ran slower that day than for the figures above.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from estimator import Training, load_config  # noqa: E402
from estimator.search.planner import plan  # noqa: E402
from estimator.models.presets import get_architecture, get_recipe  # noqa: E402


def cases() -> dict:
    dsv3 = load_config(get_recipe("deepseek-v3-as-reported").config)
    return {
        "70b": ("Llama-3.1-70B on 64 H100", get_architecture("llama-3.1-70b"),
                Training(seq_len=8192, global_batch_size=512), "h100-80", 64, None),
        "405b": ("Llama-3.1-405B on 2048 H100", get_architecture("llama-3.1-405b"),
                 Training(seq_len=8192, global_batch_size=2048), "h100-80", 2048, None),
        "dsv3": ("DeepSeek-V3 on 2048 H800", dsv3.architecture, dsv3.training, "h800", 2048,
                 dict(tp=1, pp=16, cp=1, dp=128, ep=64, pp_first_stage_layers=4, pp_last_stage_layers=1)),
    }


def line(label: str, result, cpu_s: float) -> str:
    rate = result.searched / result.seconds
    return (f"  {label:<28} {result.searched:>10,} layouts in {result.seconds:7.2f} s = {rate:>9,.0f} /s "
            f"(cpu {cpu_s:.2f} s)   ({result.estimates:,} estimates, {result.rooflines:,} rooflines, "
            f"{len(result.layouts)} listed)")


def timed(*args, **kwargs):
    """(the plan, CPU seconds of this process while it ran)."""
    start = time.process_time()
    result = plan(*args, **kwargs)
    return result, time.process_time() - start


def run(name: str) -> None:
    title, arch, tr, gpu, n, published = cases()[name]
    print(title)
    print(line("top 50 + Pareto front", *timed(arch, tr, gpu, n)))
    fastest, cpu_s = timed(arch, tr, gpu, n, limit=1, pareto=False)
    print(line("fastest only", fastest, cpu_s))
    best = fastest.layouts[0]
    print(f"  fastest: {best.changes()} {best.tokens_per_s_per_gpu:,.0f} tokens/s/GPU, "
          f"{best.device_total_bytes / 2**30:.1f} GiB")
    if published:
        mine = plan(arch, tr, gpu, n, limit=1, pareto=False, fixed=published).layouts
        if mine:
            print(f"  published layout {published}: best variant {mine[0].changes()['training']} "
                  f"{mine[0].tokens_per_s_per_gpu:,.0f} tokens/s/GPU = "
                  f"{mine[0].tokens_per_s_per_gpu / best.tokens_per_s_per_gpu:.0%} of the fastest")
    print(flush=True)


def main() -> None:
    chosen = sys.argv[1:] or list(cases())
    start = time.perf_counter()
    for name in chosen:
        run(name)
    print(f"total {time.perf_counter() - start:.0f} s; target: >= 100,000 layouts in <= 2 s on one core")


if __name__ == "__main__":
    main()
