"""Server-side rerun time of the app's pages (AppTest, in-process, no browser). Prints; not a test.

    python bench/bench_app.py [--repeat N]

For each page: the first run of a fresh session (imports, cold caches), then the median of N
reruns after a widget change (what a user waits for on the server after editing an input; the
estimate itself is cached with st.cache_data, keyed on the configuration's JSON).
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

from streamlit.testing.v1 import AppTest

APP = str(Path(__file__).resolve().parent.parent / "app.py")
PAGES = ["pages/memory.py", "pages/roofline.py", "pages/compare.py", "pages/presets.py", "pages/guide.py"]
QUERY = {"model": "llama-3.1-70b", "tp": "8", "pp": "4", "vpp": "5", "dp": "2", "seq_len": "8192",
         "recompute": "selective"}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=int, default=10)
    args = parser.parse_args()
    at = AppTest.from_file(APP, default_timeout=120)
    for k, v in QUERY.items():
        at.query_params[k] = v
    t = time.perf_counter()
    at.run()
    print(f"first run (fresh session, Memory page): {1000 * (time.perf_counter() - t):7.1f} ms")
    for page in PAGES:
        at.switch_page(page).run()
        same, changed = [], []
        for i in range(args.repeat):
            t = time.perf_counter()
            at.run()
            same.append(time.perf_counter() - t)
            # alternate the sequence length: a new config every time (cache miss), then back
            at.number_input(key="seq_len").set_value(8192 if i % 2 else 4096 + 1024 * (i + 1))
            t = time.perf_counter()
            at.run()
            changed.append(time.perf_counter() - t)
        assert not at.exception, at.exception
        print(f"{page:<20} rerun, same config: {1000 * statistics.median(same):7.1f} ms   "
              f"after a widget change: {1000 * statistics.median(changed):7.1f} ms   (median of {args.repeat})")


if __name__ == "__main__":
    main()
