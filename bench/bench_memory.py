"""What the estimator remembers over many distinct models, measured (issue #26: "a bounded memory for
the architecture memos and caches over many distinct models, measured after 100 distinct Hub-like
models").

    python bench/bench_memory.py              # 100 models, the default memo (ESTIMATOR_MEMO_MIB=256)
    python bench/bench_memory.py --models 300 --mib 64

Each "Hub-like" model is a distinct architecture, as a Hub model fetched by the app is (a Llama-like
config with its width, depth, heads, vocabulary and MLP width varied); each gets what an app session
asks of it: the Memory page's estimate on 8 GPUs and four layouts (TP 1 to 8, full recompute), and
the Roofline page's roofline. The script keeps every Architecture alive, as a server's caches of
estimates keep them. It reports, every 10 models, the memo's own count of its bytes
(estimator/spec/memo.py), the Python heap that tracemalloc sees, and the process's RSS.
"""

from __future__ import annotations

import argparse
import gc
import os
import resource
import sys
import time
import tracemalloc
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def rss_mib() -> float:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * resource.getpagesize() / 2**20


def hub_like(i: int):
    """The i-th distinct Llama-like architecture."""
    from estimator import Architecture
    heads = (16, 32, 40, 64)[i % 4]
    return Architecture(hidden_size=128 * heads * (1 + i % 3),
                        num_layers=16 + 2 * (i % 24), num_attention_heads=heads, num_kv_heads=8,
                        vocab_size=32000 + 256 * i, intermediate_size=1024 * (8 + i % 16), name=f"hub-like-{i}")


def session(arch) -> None:
    from estimator import Hardware, Parallel, Training, estimate
    from estimator.speed.roofline import roofline
    hw = Hardware(gpu="h100-80")
    for tp in (1, 2, 4, 8):
        try:
            estimate(arch, Training(seq_len=4096, recompute="full"), Parallel(tp=tp, dp=8 // tp), hw)
        except ValueError:
            continue
    roofline(arch, Training(seq_len=4096), Parallel(tp=8), hw)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--models", type=int, default=100)
    parser.add_argument("--mib", type=int, default=None, help="ESTIMATOR_MEMO_MIB for this run")
    args = parser.parse_args()
    if args.mib is not None:
        os.environ["ESTIMATOR_MEMO_MIB"] = str(args.mib)
    from estimator.spec import memo
    tracemalloc.start()
    kept, start = [], time.perf_counter()
    base_heap, base_rss = tracemalloc.get_traced_memory()[0], rss_mib()
    print(f"memo limits: shared {memo.SHARED.limit_bytes / 2**20:.0f} MiB, per configuration "
          f"{memo.PER_LAYOUT.limit_bytes / 2**20:.0f} MiB")
    print(f"{'models':>6} {'memo MiB (counted)':>19} {'entries':>8} {'heap MiB (traced)':>18} {'RSS MiB':>8}")
    for i in range(args.models):
        arch = hub_like(i)
        session(arch)
        kept.append(arch)
        if (i + 1) % 10 == 0:
            gc.collect()
            heap = (tracemalloc.get_traced_memory()[0] - base_heap) / 2**20
            counted = (memo.SHARED.bytes + memo.PER_LAYOUT.bytes) / 2**20
            print(f"{i + 1:>6} {counted:>19.1f} {len(memo.SHARED) + len(memo.PER_LAYOUT):>8} {heap:>18.1f} "
                  f"{rss_mib() - base_rss:>8.1f}", flush=True)
    print(f"{time.perf_counter() - start:.0f} s")


if __name__ == "__main__":
    main()
