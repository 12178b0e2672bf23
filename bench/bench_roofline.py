"""Time `roofline_config` on every bundled preset (the app calls it on every rerun), and on
DeepSeek-V3 over 2,048 GPUs (TP 2, PP 8 with 5 and 8 layers on the end stages, EP 32, DP 32), the
first call on an architecture and a rerun of it. tests/test_roofline.py holds, as counts, what
keeps it cheap (one operation table per key, remembered on the architecture; one work per set of
alike ranks); the times are this benchmark's to measure.

    python bench/bench_roofline.py
"""

from __future__ import annotations

import dataclasses
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from estimator.models.loading import load_config  # noqa: E402
from estimator.models.presets import list_presets  # noqa: E402
from estimator.speed.roofline import roofline, roofline_config  # noqa: E402

DEEPSEEK_V3_2048 = {"model": "deepseek-v3", "training": {"seq_len": 4096, "global_batch_size": 512},
                    "parallel": {"tp": 2, "pp": 8, "ep": 32, "dp": 32, "pp_first_stage_layers": 5,
                                 "pp_last_stage_layers": 8}}


def presets() -> None:
    for preset in list_presets():
        cfg = load_config({"model": preset.id, "training": {"seq_len": 4096}})
        runs = 20
        start = time.perf_counter()
        for _ in range(runs):
            result = roofline_config(cfg)
        elapsed = (time.perf_counter() - start) / runs
        print(f"{preset.id:<20} {elapsed * 1e3:7.2f} ms  {len(result.operations):3d} ops  "
              f"{result.step.tokens_per_s_per_gpu:10,.0f} tokens/s/GPU  MFU {result.step.mfu:.1%}")


def deepseek_v3_first_and_rerun(runs: int = 20) -> None:
    cfg = load_config(DEEPSEEK_V3_2048)
    first, rerun = [], []
    for _ in range(runs):
        arch = dataclasses.replace(cfg.architecture)  # a new object: nothing remembered for it
        for times in (first, rerun):
            start = time.perf_counter()
            roofline(arch, cfg.training, cfg.parallel, cfg.hardware)
            times.append(time.perf_counter() - start)
    print(f"deepseek-v3 on 2,048 GPUs: first call {min(first) * 1e3:.2f} ms, rerun {min(rerun) * 1e3:.2f} ms "
          f"(min of {runs})")


if __name__ == "__main__":
    presets()
    deepseek_v3_first_and_rerun()
