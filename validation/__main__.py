"""python -m validation {list | measure --case ID | measure --all | report | summary | readme | explain --case ID}"""

from __future__ import annotations

import argparse
import sys


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m validation", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("list", help="list the cases")
    measure = sub.add_parser("measure", help="measure cases and write tests/data/measured/<id>.json")
    which = measure.add_mutually_exclusive_group(required=True)
    which.add_argument("--case", action="append", help="a case id (repeatable)")
    which.add_argument("--all", action="store_true")
    sub.add_parser("report", help="estimator accuracy against the records")
    sub.add_parser("summary", help="the README's accuracy table: each framework's cases within 5%")
    sub.add_parser("readme", help="write the README's count of measured steps and frameworks from the records")
    explain = sub.add_parser("explain", help="what is alive at each phase's peak")
    explain.add_argument("--case", required=True)
    args = parser.parse_args(argv)
    if args.command == "report":  # reads the recorded JSON only: no torch, no transformers
        from .report import report

        return report()
    if args.command == "summary":  # every framework's records, JSON only
        from .summary import summary

        return summary()
    if args.command == "readme":  # counts the records' files only
        from .summary import README, headline, write_readme

        print(f"{README.name}: {headline()}" + ("" if write_readme() else " (unchanged)"))
        return 0

    from .cases import CASES  # the cases name torch models (validation/step.py)

    if args.command == "list":
        for case, run in CASES.items():
            print(case)
        return 0
    if args.command == "explain":
        if args.case not in CASES:
            print(f"unknown case: {args.case}; see `python -m validation list`", file=sys.stderr)
            return 2
        from .explain import explain

        print(explain(CASES[args.case]))
        return 0
    from .record import measure_cases, write

    return measure_cases(list(CASES) if args.all else args.case, CASES, write, "validation")


if __name__ == "__main__":
    sys.exit(main())
