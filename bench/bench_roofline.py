"""Time `roofline_config` on every bundled preset (the app calls it on every rerun).

    python bench/bench_roofline.py
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from estimator.models.loading import load_config  # noqa: E402
from estimator.models.presets import list_presets  # noqa: E402
from estimator.speed.roofline import roofline_config  # noqa: E402


def main() -> None:
    for preset in list_presets():
        cfg = load_config({"model": preset.id, "training": {"seq_len": 4096}})
        runs = 20
        start = time.perf_counter()
        for _ in range(runs):
            result = roofline_config(cfg)
        elapsed = (time.perf_counter() - start) / runs
        print(f"{preset.id:<20} {elapsed * 1e3:7.2f} ms  {len(result.operations):3d} ops  "
              f"{result.step.tokens_per_s_per_gpu:10,.0f} tokens/s/GPU  MFU {result.step.mfu:.1%}")


if __name__ == "__main__":
    main()
