"""python -m validation.peft {list | measure CASE... | measure --all | report | explain CASE}"""

from __future__ import annotations

import argparse
import sys
import time


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m validation.peft", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("list", help="list the cases")
    measure = sub.add_parser("measure", help="measure cases, write tests/data/measured/peft/<id>.json")
    measure.add_argument("cases", nargs="*", help="case ids")
    measure.add_argument("--all", action="store_true")
    sub.add_parser("report", help="the estimator against the records")
    explain = sub.add_parser("explain", help="what is alive at each phase's peak of a case")
    explain.add_argument("case")
    args = parser.parse_args(argv)
    if args.command == "report":  # reads the recorded JSON only
        from .record import load_all
        from .report import report

        return report(load_all())

    from .cases import CASES

    if args.command == "list":
        print("\n".join(CASES))
        return 0
    if args.command == "explain" and args.case in CASES:
        from .explain import explain

        print(explain(CASES[args.case]))
        return 0
    cases = [args.case] if args.command == "explain" else list(CASES) if args.all else args.cases
    unknown = [c for c in cases if c not in CASES]
    if unknown or not cases:
        print(f"unknown or no case(s): {', '.join(unknown)}; see `python -m validation.peft list`", file=sys.stderr)
        return 2
    from .record import write

    for case in cases:
        start = time.perf_counter()
        path = write(case)
        print(f"{case}: {time.perf_counter() - start:.1f}s -> {path}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
