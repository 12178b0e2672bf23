"""python -m validation.peft {list | measure CASE... | measure --all | report | explain CASE}"""

from __future__ import annotations

import argparse
import sys


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
    from ..record import measure_cases
    from .record import write

    return measure_cases(cases, CASES, write, "validation.peft")


if __name__ == "__main__":
    sys.exit(main())
