"""python -m validation.gpu {list | run --out DIR [--budget S] | records --from FILE | selftest}

`run` is the one prepared script a session lent a GPU runs (at most 10 minutes): a workspace probe,
then each case of validation/gpu/cases.py in a process of its own (one CUDA context each, the
allocator setting applied before CUDA starts), one JSON line per case appended to DIR/runs.jsonl as
it ends, so a run cut short still brings back what it measured. `records` turns those lines into
tests/data/measured/gpu/<id>.json, beside the fake-tensor records (the workspace probe's record keeps the
versions of packages the probe does not import where the run lacked them: records.probe_record). `selftest` runs the same
measuring code on the CPU with tiny models (what CI can run).

The GPU machine has torch, transformers, peft and accelerate but no bitsandbytes and no network: the
QLoRA cases need bitsandbytes carried in. What the recorded run did (bitsandbytes 0.48.2, its CUDA 13.0
library only, 19 MB):
    pip download --no-deps --only-binary=:all: --python-version 3.12 --platform manylinux_2_24_x86_64 \
        -d /tmp/whl bitsandbytes==0.48.2
    mkdir -p .whl/site && (cd .whl/site && unzip -q /tmp/whl/bitsandbytes-*.whl)   # .whl/ is git-ignored
    find .whl/site -name 'libbitsandbytes_*.so' ! -name '*cuda130*' ! -name '*cpu*' -delete
and on the GPU machine: PYTHONPATH=$PWD/.whl/site python3 -m validation.gpu run --out $OUT --budget 390
(a case whose package is missing fails alone and the others run). Megatron-Core and DeepSpeed, for the
framework-step cases (megatron_step.py, deepspeed_step.py), travel the same way: validation/README.md.

Experiments (validation/gpu/experiments.py: `cuda-graphs`, `cuda-context`) run only when named with
--case, after any case, within the same budget; `records` writes them to
tests/data/measured/gpu/experiments/<experiment>-<gpu>.json. `run --device cpu --case <experiment>`
runs them against the CPU stand-in (tests/test_gpu_experiments.py).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

CASE_TIMEOUT_S = 150


def run_one(args: list[str], env: dict, log) -> dict | None:
    start = time.perf_counter()
    try:
        done = subprocess.run([sys.executable, "-m", "validation.gpu.measure", *args], capture_output=True,
                              text=True, env=env, timeout=CASE_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        log.write(f"{args[0]}: timed out after {CASE_TIMEOUT_S}s\n")
        return None
    log.write(f"{args[0]}: exit {done.returncode} in {time.perf_counter() - start:.1f}s\n")
    if done.returncode != 0:
        log.write(done.stderr[-3000:] + "\n")
        return None
    return json.loads(done.stdout.strip().splitlines()[-1])


def unknown_ids(only: list[str] | None, device: str) -> str | None:
    """What is wrong with the asked ids (None when nothing): an unknown id, or a case asked on the CPU."""
    from .cases import CASES
    from .experiments import EXPERIMENTS

    unknown = [i for i in only or () if i not in CASES and i not in EXPERIMENTS]
    if unknown:
        return f"--case {', '.join(unknown)}: not a case or experiment (see `python -m validation.gpu list`)"
    if device == "cpu" and (not only or any(i in CASES for i in only)):
        return "--device cpu runs experiments only (their CPU stand-in); the cases need --device cuda"
    return None


def run(out: Path, budget_s: float, only: list[str] | None, device: str = "cuda") -> int:
    from .cases import CASES
    from .experiments import EXPERIMENTS, run_experiment

    problem = unknown_ids(only, device)
    if problem:
        print(problem, file=sys.stderr)
        return 2
    out.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    cases = [c for c in CASES if not only or c in only]
    with open(out / "log.txt", "a") as log, open(out / "runs.jsonl", "a") as runs:
        if cases:
            run_cases(cases, start, budget_s, log, runs)
        for experiment_id in [i for i in only or () if i in EXPERIMENTS]:
            run_experiment(EXPERIMENTS[experiment_id], device, start + budget_s, runs, log)
    return 0


def run_cases(case_ids: list[str], start: float, budget_s: float, log, runs) -> None:
    """The workspace probe, then each case in a process of its own while the budget allows."""
    from .cases import CASES

    probe = run_one(["probe"], dict(os.environ), log)
    if probe:
        runs.write(json.dumps(probe) + "\n")
        runs.flush()
    for case_id in case_ids:
        case = CASES[case_id]
        if time.perf_counter() - start > budget_s:
            log.write(f"{case_id}: not run (budget of {budget_s:.0f}s spent)\n")
            continue
        env = dict(os.environ)
        if case.allocator == "expandable":
            env["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"
        result = run_one([case_id, "cuda"], env, log)
        if result:
            runs.write(json.dumps(result) + "\n")
            runs.flush()
        log.flush()
        print(f"{case_id}: {'ok' if result else 'failed'} at {time.perf_counter() - start:.0f}s", flush=True)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m validation.gpu", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("list", help="list the cases")
    r = sub.add_parser("run", help="run the cases on the GPU")
    r.add_argument("--out", type=Path, required=True)
    r.add_argument("--budget", type=float, default=420.0, help="seconds after which no case is started")
    r.add_argument("--case", action="append", help="only this case or experiment (repeatable); experiments "
                   "(validation/gpu/experiments.py) run only when named")
    r.add_argument("--device", choices=("cuda", "cpu"), default="cuda",
                   help="cpu: the named experiments against their CPU stand-in (what the self-test runs)")
    rec = sub.add_parser("records", help="write tests/data/measured/gpu/<id>.json from a run's lines")
    rec.add_argument("--from", dest="source", type=Path, required=True)
    sub.add_parser("selftest", help="the measuring code on the CPU with tiny models")
    args = parser.parse_args(argv)
    if args.command == "list":
        from .cases import CASES
        from .experiments import EXPERIMENTS

        print("\n".join([*CASES, *(f"{e} (experiment)" for e in EXPERIMENTS)]))
        return 0
    if args.command == "run":
        return run(args.out, args.budget, args.case, args.device)
    if args.command == "records":
        from .records import write_records

        for path in write_records(args.source):
            print(path)
        return 0
    from .selftest import selftest

    print(json.dumps(selftest(), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
