"""python -m validation.published_megatron {golden,simumax} --git-dir DIR | table [SOURCE]"""

from __future__ import annotations

import argparse
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m validation.published_megatron", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    for name, what in (("golden", "Megatron-LM's functional-test golden values"),
                       ("simumax", "SimuMax's B200 release table")):
        cmd = sub.add_parser(name, help=f"build the records of {what} from a git snapshot")
        cmd.add_argument("--git-dir", type=Path, required=True)
    show = sub.add_parser("table", help="replay the records through the importer and the estimate")
    show.add_argument("source", nargs="?", default="megatron_golden")
    args = parser.parse_args(argv)
    if args.command == "golden":
        from .golden import build, write

        records, excluded = build(args.git_dir)
        write(records, excluded)
        print(f"{len(records)} records, {len(excluded)} cases not representable")
    elif args.command == "simumax":
        from .simumax import build, write

        records = build(args.git_dir)
        write(records)
        print(f"{len(records)} records")
    else:
        from .replay import table

        print(table(args.source))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
