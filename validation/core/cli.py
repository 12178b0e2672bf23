"""Every harness's command line, made from its declaration (validation/core/harness.py):

    python -m validation.<name> list
    python -m validation.<name> measure CASE... | --all | --missing   (HF: measure --case ID ...)
    python -m validation.<name> report                                 (where it declares a report)
    python -m validation.<name> explain CASE                           (where it declares a trace; HF: --case)
    python -m validation.<name> <command> ...                          (its own commands)

`report` reads the records only: it runs before anything imports torch or the framework."""

from __future__ import annotations

import argparse
import importlib
import sys

from .explain import explain_trace
from .harness import Command, Harness
from .record import MEASURED, measure_cases, unknown_cases


def _parser(h: Harness, commands: tuple[Command, ...]) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=f"python -m {h.cli}", description=importlib.import_module(h.package).__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("list", help="list the cases")
    where = h.records.relative_to(MEASURED.parents[2])
    measure = sub.add_parser("measure", help=f"measure cases, write {where}/<id>.json")
    which = measure.add_mutually_exclusive_group(required=h.top_level)
    if h.top_level:
        which.add_argument("--case", action="append", dest="cases", metavar="ID", help="a case id (repeatable)")
    else:
        measure.add_argument("cases", nargs="*", help="case ids")
    which.add_argument("--all", action="store_true")
    which.add_argument("--missing", action="store_true", help="every case without a record")
    if h.report:
        sub.add_parser("report", help="the estimator against the records")
    if h.trace:
        explain = sub.add_parser("explain", help="what is alive at each phase's peak of a case")
        if h.top_level:
            explain.add_argument("--case", required=True)
        else:
            explain.add_argument("case")
    for command in commands:
        extra = sub.add_parser(command.name, help=command.help)
        for name in command.arguments:
            extra.add_argument(name, nargs="*")
    return parser


def _run(h: Harness, command: Command, args) -> int:
    module, function = command.run.split(":")
    package = "validation.core" if command in CORE_COMMANDS else h.package
    run = getattr(importlib.import_module(f"{package}.{module}"), function)
    return run(*(getattr(args, name) for name in command.arguments))


def _measure(h: Harness, cases: dict, args) -> int:
    which = list(cases) if args.all or args.missing else args.cases or []
    if args.missing:
        which = [c for c in which if not (h.records / f"{c}.json").exists()]
    return measure_cases(which, cases, h.write, h.cli)


def _explain(h: Harness, cases: dict, case: str) -> int:
    if unknown_cases([case], cases, h.cli):
        return 2
    tracker, category = h.load(h.trace)(cases[case])[:2]
    print(explain_trace(tracker, category, h.explain_top))
    return 0


# what `python -m validation` offers beside the HF harness: every harness's records at once
CORE_COMMANDS = (
    Command("summary", "the README's accuracy table: each framework's cases within 5%%", "summary:summary"),
    Command("readme", "write the README's count of measured steps and frameworks from the records",
            "summary:readme"),
)


def main(h: Harness, argv: list[str] | None = None, core: bool = False) -> int:
    """Run a harness's command line; `core`: with the commands over every harness's records."""
    argv = sys.argv[1:] if argv is None else argv
    commands = h.commands + (CORE_COMMANDS if core else ())
    args = _parser(h, commands).parse_args(argv)
    if args.command == "report":  # the recorded JSON only: no torch, no framework
        return h.load(h.report)(h.load_all())
    command = next((c for c in commands if c.name == args.command), None)
    if command in CORE_COMMANDS:
        return _run(h, command, args)
    prepared = h.load(h.prepare)(argv) if h.prepare else None
    if prepared is not None:
        return prepared
    if command is not None:
        return _run(h, command, args)
    cases = h.cases()
    if args.command == "list":
        print("\n".join(cases))
        return 0
    if args.command == "explain":
        return _explain(h, cases, args.case)
    return _measure(h, cases, args)
