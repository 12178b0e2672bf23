"""python -m validation.torchtitan {list | measure CASE... | measure --all | report}"""

from __future__ import annotations

import argparse
import sys


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m validation.torchtitan", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("list", help="list the cases")
    measure = sub.add_parser("measure", help="measure cases into tests/data/measured/torchtitan/")
    measure.add_argument("cases", nargs="*", help="case ids")
    measure.add_argument("--all", action="store_true")
    measure.add_argument("--missing", action="store_true", help="only cases without a record")
    sub.add_parser("report", help="the estimator against the records")
    args = parser.parse_args(argv)
    if args.command == "report":  # the recorded JSON only: no torch, no torchtitan
        from .report import report

        return report()
    from .cases import CASES

    if args.command == "list":
        print("\n".join(CASES))
        return 0
    from .record import RECORDS, write

    cases = list(CASES) if args.all or args.missing else args.cases
    if args.missing:
        cases = [c for c in cases if not (RECORDS / f"{c}.json").exists()]
    from ..record import measure_cases

    return measure_cases(cases, CASES, write, "validation.torchtitan")


if __name__ == "__main__":
    sys.exit(main())
