"""What a framework's harness declares, and the registry that finds every one.

A plug-in is a folder `validation/<name>/` whose `plugin.py` defines `HARNESS = Harness(...)`. The
declaration names the plug-in's own code as "module:attribute" references inside its folder, loaded
only when needed, so that reading the records (report, summary) never imports torch or the
framework. The core does the rest: the record, the command line, the explain trace, the summary.

By convention `cases.py` holds `CASES` (case id -> case), `describe(case)` and
`contract_config(case)`; the other references default to the names most plug-ins use.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from .record import MEASURED, load_all, package_versions, write_record

ROOT = Path(__file__).resolve().parent.parent  # validation/


@dataclass(frozen=True)
class Command:
    """A command of one harness beyond list, measure, report and explain."""

    name: str
    help: str
    run: str  # "module:function", called with the values of `arguments`; returns the exit status
    arguments: tuple[str, ...] = ()  # names of optional positional arguments (nargs="*"), in order


@dataclass(frozen=True)
class Harness:
    name: str  # its folder under validation/, and its records' folder under tests/data/measured/
    title: str  # the framework as the README names it
    order: tuple[int, int]  # its place in the README's accuracy table, and in its opening sentence
    method: str  # how it measures, as every record says
    distributions: tuple[str, ...]  # the packages whose versions every record names
    optional_distributions: tuple[str, ...] = ()  # named as None when absent
    top_level: bool = False  # the first harness (HF): records at the top, `python -m validation measure --case`
    measure: str = "step:measure"  # (case) -> the record's "measured"
    fields: str | None = None  # (case) -> fields the record carries between "config" and "measured"
    run_versions: str | None = None  # (case) -> the versions of what this case alone runs (a plug-in library)
    counts: tuple[tuple[str, int], ...] = (("step_measured", 2),)  # what of the run was measured
    report: str | None = None  # (records) -> exit status: the estimator against the records
    trace: str | None = None  # (case) -> (tracker, category, ...): offers `explain`
    explain_top: int = 30  # how many allocation sites `explain` lists per phase
    prepare: str | None = None  # (argv) -> exit status or None, before any command that imports the framework
    commands: tuple[Command, ...] = ()

    # --- where it lives -------------------------------------------------------------------------
    @property
    def package(self) -> str:
        return f"validation.{self.name}"

    @property
    def cli(self) -> str:
        """What follows `python -m` to run it."""
        return "validation" if self.top_level else self.package

    @property
    def records(self) -> Path:
        return MEASURED if self.top_level else MEASURED / self.name

    def load(self, reference: str):
        """A "module:attribute" of the plug-in, imported now."""
        module, attribute = reference.split(":")
        return getattr(importlib.import_module(f"{self.package}.{module}"), attribute)

    def cases(self) -> dict:
        return self.load("cases:CASES")

    # --- its records ----------------------------------------------------------------------------
    def versions(self) -> dict:
        return package_versions(*self.distributions, optional=self.optional_distributions)

    def command(self, case: str) -> str:
        return f"python -m {self.cli} measure {'--case ' if self.top_level else ''}{case}"

    def record(self, case: str) -> dict:
        run = self.cases()[case]
        return {
            "id": case,
            "description": self.load("cases:describe")(run),
            "config": self.load("cases:contract_config")(run),
            **(self.load(self.fields)(run) if self.fields else {}),
            "measured": self.load(self.measure)(run),
            **dict(self.counts),
            "method": self.method,
            "versions": {**self.versions(), **(self.load(self.run_versions)(run) if self.run_versions else {})},
            "command": self.command(case),
        }

    def write(self, case: str, directory: Path | None = None) -> Path:
        return write_record(self.record(case), directory or self.records)

    def load_all(self, directory: Path | None = None) -> list[dict]:
        return load_all(directory or self.records)


@cache
def harnesses() -> dict[str, Harness]:
    """Every plug-in (a folder of validation/ with a plugin.py), in the README's table order."""
    found = [importlib.import_module(f"validation.{folder.name}.plugin").HARNESS
             for folder in sorted(ROOT.iterdir()) if (folder / "plugin.py").is_file()]
    return {h.name: h for h in sorted(found, key=lambda h: h.order[0])}
