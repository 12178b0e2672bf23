"""How a caller follows and bounds a long search (the planner's): progress reports, a request to
stop, and a time budget.

The search stays plain Python with no notion of processes or pages: it asks its `Watch` between
units of work whether to go on (`halted`), and hands it a report when one is due (`due`, `report`).
Who runs the search decides what a report does (a worker process sends it to the app, the CLI
ignores it) and where a stop request comes from (a pipe, a flag).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable

STOPPED = "stopped"  # the caller asked the search to stop
OUT_OF_TIME = "time budget"  # the search ran for its time budget


@dataclass(frozen=True)
class Progress:
    """Where a search stands: layouts judged of those it will judge, and the best found so far."""

    judged: int
    total: int  # 0 while the layouts are still being counted
    seconds: float
    best: dict | None = None  # the fastest fitting layout so far (planner.Layout.to_json()), if any
    phase: str = "layouts"  # "layouts", or "fewest GPUs" while looking for the fewest GPUs that fit

    def to_json(self) -> dict:
        return {"judged": self.judged, "total": self.total, "seconds": round(self.seconds, 3), "best": self.best,
                "phase": self.phase}


class Watch:
    """A search's observer. `budget_s`: the most seconds the search may run (None: no limit);
    `stop`: called at most every `every_s` seconds, True asks the search to stop; `report`: receives
    a `Progress` at most every `every_s` seconds. Once halted a watch stays halted, with its reason."""

    def __init__(self, budget_s: float | None = None, stop: Callable[[], bool] | None = None,
                 report: Callable[[Progress], None] | None = None, every_s: float = 0.5,
                 clock: Callable[[], float] = time.monotonic):
        self.budget_s = budget_s
        self._stop = stop
        self._report = report
        self.every_s = every_s
        self._clock = clock
        self.started = clock()
        self._next_report = self._next_check = self.started  # when the next report, the next stop check are due
        self.reason: str | None = None

    def seconds(self) -> float:
        return self._clock() - self.started

    def halted(self) -> str | None:
        """Why the search must stop now (`STOPPED`, `OUT_OF_TIME`), or None to go on."""
        if self.reason is None:
            now = self._clock()
            if self.budget_s is not None and now - self.started >= self.budget_s:
                self.reason = OUT_OF_TIME
            elif self._stop is not None and now >= self._next_check:
                self._next_check = now + self.every_s
                if self._stop():
                    self.reason = STOPPED
        return self.reason

    def due(self) -> bool:
        """Whether a report is due (a report costs the search a little: build it only then)."""
        return self._report is not None and self._clock() >= self._next_report

    def report(self, progress: Progress) -> None:
        self._next_report = self._clock() + self.every_s
        if self._report is not None:
            self._report(progress)

    def describe(self) -> str:
        """The reason in words, for a note: "its time budget of 30 s", "a request to stop"."""
        if self.reason == OUT_OF_TIME:
            return f"its time budget of {self.budget_s:g} s"
        return "a request to stop" if self.reason == STOPPED else ""
