"""What an importer hands back: our JSON config and an account of every setting it met.

Each setting of the launch configuration lands in exactly one list:

- ``read``: mapped to a field of our config (its note names the field);
- ``ignored``: understood, and it does not change memory or speed (data paths, learning rates,
  logging, checkpointing);
- ``unsupported``: understood, and it may change memory or speed, but the estimator has no field
  for it: the estimate assumes what the note says;
- ``unknown``: not a setting of that framework (a typo, or a newer version's flag).

The last two are warnings: the CLI prints each on stderr, the app shows them. Nothing is dropped
without a line.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import re

from ..spec.errors import shown_value

# settings whose values are credentials: their values are never printed (--api-key, hf_token, hub_token,
# --wandb-key, logger.wandb.key, ...); a name that only contains "key" or "token" (--input-key, a dataset's
# column; --max-tokens-per-gpu, a batch) is not one
_SECRET_NAME = re.compile(r"password|secret|(^|[-_.])(api|access|auth|private|hf|hub|wandb|swanlab|comet|ssh)[-_.]?"
                          r"(key|token)s?$|(^|[-_.])token$", re.IGNORECASE)


@dataclass(frozen=True)
class Setting:
    """One setting of the launch configuration: its name as the user wrote it, its value as text
    (empty for a switch) and a note (the field it set, why it is ignored, what is assumed)."""

    name: str
    value: str = ""
    note: str = ""

    def line(self, heading: str) -> str:
        hidden = _SECRET_NAME.search(self.name) is not None
        shown = " <hidden>" if hidden and self.value else f" {shown_value(self.value)}" if self.value != "" else ""
        return f"{heading}: {self.name}{shown}" + (f" ({self.note})" if self.note else "")


@dataclass(frozen=True)
class Imported:
    """A launch configuration read into our JSON config (the contract's format)."""

    kind: str
    config: dict
    read: tuple[Setting, ...] = ()
    ignored: tuple[Setting, ...] = ()
    unsupported: tuple[Setting, ...] = ()
    unknown: tuple[Setting, ...] = ()
    notes: tuple[str, ...] = ()  # assumptions that are not one setting's (the world size, a default)

    def warning_lines(self) -> list[str]:
        """What the CLI prints on stderr: the ignored, not modelled and unknown settings, one a line."""
        return ([s.line("ignored") for s in self.ignored] + [s.line("not modelled") for s in self.unsupported]
                + [s.line("unknown") for s in self.unknown] + [f"note: {n}" for n in self.notes])

    def to_json(self) -> dict:
        def rows(items):
            return [{"name": s.name, "value": "<hidden>" if _SECRET_NAME.search(s.name) and s.value else s.value,
                     "note": s.note} for s in items]
        return {"kind": self.kind, "config": self.config, "read": rows(self.read), "ignored": rows(self.ignored),
                "unsupported": rows(self.unsupported), "unknown": rows(self.unknown), "notes": list(self.notes)}


@dataclass
class Ledger:
    """The lists an importer fills while it reads (mutable while reading; `result` freezes them)."""

    read: list[Setting] = field(default_factory=list)
    ignored: list[Setting] = field(default_factory=list)
    unsupported: list[Setting] = field(default_factory=list)
    unknown: list[Setting] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def mapped(self, name: str, value: object, note: str) -> None:
        self.read.append(Setting(name, _text(value), note))

    def ignore(self, name: str, value: object, note: str) -> None:
        self.ignored.append(Setting(name, _text(value), note))

    def not_modelled(self, name: str, value: object, note: str) -> None:
        self.unsupported.append(Setting(name, _text(value), note))

    def strange(self, name: str, value: object, note: str) -> None:
        self.unknown.append(Setting(name, _text(value), note))

    def note(self, text: str) -> None:
        self.notes.append(text)

    def result(self, kind: str, config: dict) -> Imported:
        return Imported(kind, config, tuple(self.read), tuple(self.ignored), tuple(self.unsupported),
                        tuple(self.unknown), tuple(self.notes))


def _text(value: object) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (list, tuple)):
        return " ".join(_text(v) for v in value)
    return str(value)
