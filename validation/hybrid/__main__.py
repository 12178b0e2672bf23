"""python -m validation.hybrid {list | measure CASE... | measure --all}"""

from __future__ import annotations

import argparse
import sys


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m validation.hybrid", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("list", help="list the cases")
    measure = sub.add_parser("measure", help="measure cases into tests/data/measured/hybrid/")
    measure.add_argument("cases", nargs="*", help="case ids")
    measure.add_argument("--all", action="store_true")
    args = parser.parse_args(argv)
    from .cases import CASES

    if args.command == "list":
        print("\n".join(CASES))
        return 0
    from ..record import measure_cases
    from .record import write

    return measure_cases(list(CASES) if args.all else args.cases, CASES, write, "validation.hybrid")


if __name__ == "__main__":
    sys.exit(main())
