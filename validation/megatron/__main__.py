"""python -m validation.megatron {list | measure CASE... | measure --all | report | schedules}"""

from __future__ import annotations

import argparse
import sys
import warnings


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m validation.megatron", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("list", help="list the cases")
    measure = sub.add_parser("measure", help="measure cases into tests/data/measured/megatron/")
    measure.add_argument("cases", nargs="*")
    measure.add_argument("--all", action="store_true")
    sub.add_parser("report", help="measured versus today's estimate, per case")
    sub.add_parser("schedules", help="run each Megatron-Core release's interleaved-schedule code over every layout "
                                     "into tests/data/measured/schedules/")
    args = parser.parse_args(argv)
    if args.command == "schedules":  # each release's own schedules.py (validation/megatron/schedules.py)
        from .schedules import write as write_schedules

        return write_schedules()
    if args.command == "report":  # reads the records only: no megatron-core needed
        from .report import report

        return report()
    warnings.filterwarnings("ignore", message=".*(Apex|Transformer Engine).*")
    from .cases import CASES

    if args.command == "list":
        print("\n".join(CASES))
        return 0
    cases = list(CASES) if args.all else args.cases
    from ..record import measure_cases
    from .record import write

    return measure_cases(cases, CASES, write, "validation.megatron")


if __name__ == "__main__":
    sys.exit(main())
