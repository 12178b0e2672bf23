"""python -m validation.torchtune {list | measure CASE... | measure --all | report | selftest | explain CASE}

list and measure need torchtune 0.6.1 with torchao 0.10.0; run from any Python, they re-run
themselves with /work/main/.venv/torchtune's when torchtune is not importable here. report reads
the records only."""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
from pathlib import Path

VENV_PYTHON = Path(__file__).resolve().parents[2] / ".venv" / "torchtune" / "bin" / "python"


def in_torchtune_env(argv: list[str]) -> int | None:
    """Re-run in the torchtune venv when torchtune is missing here; None when it is here."""
    if importlib.util.find_spec("torchtune") is not None:
        return None
    if not VENV_PYTHON.exists():
        print(f"torchtune is not installed here and {VENV_PYTHON} does not exist; create it: "
              "python -m venv --system-site-packages .venv/torchtune && .venv/torchtune/bin/pip "
              "install torchtune==0.6.1 torchao==0.10.0 -c <torch pin>", file=sys.stderr)
        return 2
    root = str(VENV_PYTHON.parents[3])
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")])))
    os.execve(str(VENV_PYTHON), [str(VENV_PYTHON), "-m", "validation.torchtune", *argv], env)


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(prog="python -m validation.torchtune", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("list", help="list the cases")
    measure = sub.add_parser("measure", help="measure cases, write tests/data/measured/torchtune/<id>.json")
    measure.add_argument("cases", nargs="*", help="case ids")
    measure.add_argument("--all", action="store_true")
    sub.add_parser("report", help="the estimator against the records")
    explain = sub.add_parser("explain", help="what is alive at each phase's peak of a case")
    explain.add_argument("case")
    selftest = sub.add_parser("selftest", help="tiny models measured fake and real, as JSON")
    selftest.add_argument("variants", nargs="*")
    args = parser.parse_args(argv)
    if args.command == "report":
        from ..peft.report import report
        from .record import load_all
        from .report import without_unsupported

        return report(load_all(), without_unsupported)
    switched = in_torchtune_env(argv)
    if switched is not None:
        return switched

    if args.command == "selftest":
        from .selftest import main as selftest_main

        return selftest_main(args.variants)
    from .cases import CASES

    if args.command == "list":
        print("\n".join(CASES))
        return 0
    if args.command == "explain" and args.case in CASES:
        from ..explain import explain_trace
        from .step import traced_step

        tracker, category, _, _ = traced_step(CASES[args.case])
        print(explain_trace(tracker, category, top=30))
        return 0
    cases = [args.case] if args.command == "explain" else list(CASES) if args.all else args.cases
    from ..record import measure_cases
    from .record import write

    return measure_cases(cases, CASES, write, "validation.torchtune")


if __name__ == "__main__":
    sys.exit(main())
