"""A measured case as the JSON record under tests/data/measured/."""

from __future__ import annotations

import json
import platform
import sys
import time
from pathlib import Path

RECORDS = Path(__file__).resolve().parent.parent / "tests" / "data" / "measured"

METHOD = (
    "fake-tensor CPU emulation of CUDA: the real transformers model code runs one HF-Trainer "
    "training step under torch FakeTensorMode on CPU (no memory is allocated); a "
    "TorchDispatchMode registers every tensor storage when an op creates it and a weakref "
    "finalizer when it is freed, each rounded up to 512 bytes as the CUDA caching allocator "
    "does. CUDA behaviour is emulated: SDPA makes FlashAttention-2's allocations (native GQA; "
    "saves q, k, v, output and its fp32 log-sum-exp b x heads x s; backward dq/dk/dv, "
    "dq_accum, softmax_d and, for GQA, expanded dK/dV), foreach AdamW/SGD, host-resident "
    "scalars (AdamW step counters, torch.tensor constants) not counted, transformers' "
    "packed-sequence check answered as for real arange position ids. Step 2 is measured "
    "(optimizer states exist; grads set to None by zero_grad). The model outputs (logits) are "
    "dropped before backward, as Trainer.compute_loss returns the loss alone. Categories: "
    "parameters, gradients (param.grad), optimizer_states (optimizer.state tensors), "
    "activations (everything else alive: saved tensors, temporaries, autocast weight copies, "
    "the input batch and model buffers). Validated byte for byte against real CPU runs of "
    "tiny models (tests/test_harness.py)."
)


def package_versions(*distributions: str, optional: tuple[str, ...] = ()) -> dict:
    """The installed version of each distribution (None for an optional one that is absent), and
    Python's: what every harness records beside its measurements."""
    from importlib.metadata import PackageNotFoundError, version

    found = {name: version(name) for name in distributions}
    for name in optional:
        try:
            found[name] = version(name)
        except PackageNotFoundError:
            found[name] = None
    return {**found, "python": platform.python_version()}


def versions() -> dict:
    return package_versions("torch", "transformers")


def measure_cases(cases: list[str], known, write, package: str) -> int:
    """Measure and write each case (`write(case)`), timed; exit status 2 naming the unknown ones, or
    when none is asked for."""
    unknown = [c for c in cases if c not in known]
    if unknown or not cases:
        print(f"unknown or no case(s): {', '.join(unknown)}; see `python -m {package} list`", file=sys.stderr)
        return 2
    for case in cases:
        start = time.perf_counter()
        path = write(case)
        print(f"{case}: {time.perf_counter() - start:.1f}s -> {path}", flush=True)
    return 0


def write_record(record: dict, directory: Path) -> Path:
    """A record as tests/data/measured/.../<id>.json."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{record['id']}.json"
    path.write_text(json.dumps(record, indent=2) + "\n")
    return path


def record(case: str) -> dict:
    # imported here: `load_all` (the report) must work without torch or transformers installed
    from .cases import CASES, contract_config, describe
    from .step import measure

    run = CASES[case]
    return {
        "id": case,
        "description": describe(run),
        "config": contract_config(run),
        "measured": measure(run),
        "step_measured": 2,
        "method": METHOD,
        "versions": versions(),
        "command": f"python -m validation measure --case {case}",
    }


def write(case: str, directory: Path = RECORDS) -> Path:
    return write_record(record(case), directory)


def load_all(directory: Path = RECORDS) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted(directory.glob("*.json"))]
