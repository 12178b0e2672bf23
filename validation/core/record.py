"""The JSON record of a measured case, as every harness writes it under tests/data/measured/.

A record is, in this order: its id, description and configuration (the contract's JSON), any
fields the harness adds about what was built, the measurement, which step (and how many
micro-batches) it measured, the method, the package versions and the command that made it."""

from __future__ import annotations

import json
import platform
import sys
import time
from pathlib import Path

MEASURED = Path(__file__).resolve().parents[2] / "tests" / "data" / "measured"


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


def write_record(record: dict, directory: Path) -> Path:
    """A record as <directory>/<id>.json."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{record['id']}.json"
    path.write_text(json.dumps(record, indent=2) + "\n")
    return path


def write_json(path, document: dict) -> None:
    """An engine recorder's file (validation/vllm, validation/sglang: tests/data/serving/) or a gloo-world measurer's
    (validation/gpu/deepspeed_partitions.py, deepspeed_accumulation.py): `document` indented by one, with a final
    newline, its folder made when missing."""
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as fh:
        json.dump(document, fh, indent=1)
        fh.write("\n")


def load_all(directory: Path) -> list[dict]:
    """The records of one folder (not its sub-folders), by file name."""
    return [json.loads(p.read_text()) for p in sorted(directory.glob("*.json"))]


def unknown_cases(cases: list[str], known, cli: str) -> bool:
    """Say so (exit status 2 for the caller) when a case is not known, or none is asked for."""
    unknown = [c for c in cases if c not in known]
    if unknown or not cases:
        print(f"unknown or no case(s): {', '.join(unknown)}; see `python -m {cli} list`", file=sys.stderr)
        return True
    return False


def measure_cases(cases: list[str], known, write, cli: str) -> int:
    """Measure and write each case (`write(case)`), timed; exit status 2 naming the unknown ones, or
    when none is asked for."""
    if unknown_cases(cases, known, cli):
        return 2
    for case in cases:
        start = time.perf_counter()
        path = write(case)
        print(f"{case}: {time.perf_counter() - start:.1f}s -> {path}", flush=True)
    return 0
