"""Speed of `serve-plan` (estimator/serving/planner.py): the layouts a plan searches and its seconds.

    python bench/bench_serve_plan.py [--repeat 5]

Two plans, each the minimum over --repeat runs on a new architecture object (nothing remembered):
Llama-3.1-70B on H100s, 100 users at 32k tokens (96 layouts), and DeepSeek-V3 on H200s, 64 users at
64k tokens (64 layouts). tests/test_serving_plan.py holds, as a count, what bounds the work (one
estimate per layout searched); the times are this benchmark's to measure.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from estimator.models.presets import get_architecture, get_hf_config  # noqa: E402
from estimator.serving.planner import serve_plan  # noqa: E402
from estimator.spec.hardware import Hardware  # noqa: E402
from estimator.spec.serving import Serving  # noqa: E402

CASES = (("llama-3.1-70b", "h100-80", 100, 32768), ("deepseek-v3", "h200", 64, 65536))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    repeat = parser.parse_args().repeat
    for model, gpu, users, context in CASES:
        checkpoint, times = get_hf_config(model), []
        for _ in range(repeat):
            arch = dataclasses.replace(get_architecture(model))  # a new object: nothing remembered for it
            start = time.perf_counter()
            plan = serve_plan(arch, Serving(), Hardware(gpu), users, context, checkpoint)
            times.append(time.perf_counter() - start)
        print(f"{model} on {gpu}, {users} users at {context:,} tokens: {plan.searched} layouts in "
              f"{min(times) * 1e3:.0f} ms (min of {repeat}); fewest GPUs {plan.options[0].gpus}")


if __name__ == "__main__":
    main()
